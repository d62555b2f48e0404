"""The step-time model: the duration of an engine step from its batch
composition (docs/engine-model.md, "Step time"). The one statement of it:
the fast step, the slow step and the stretch all take their durations from
here, and the stretch asks `_constant_in_step` and `_context_slope` whether,
and how, its closed forms apply.

The latency record ``lat`` (written by ``fastsim/_pack.py``) holds the
coefficients at the ``L_*`` slots of `layout`: a step of ``n_dec`` decoders,
``n_pf`` prefill tokens and ``n_ctx`` context tokens (moving ``n_swap`` blocks
to or from CPU swap space) lasts::

    base + scale * (n_dec - 1) ** alpha [n_dec > 1] + c_prefill * n_pf + c_ctx * n_ctx + c_swap * n_swap

added in that order (the reference simulator adds the same terms in the
same order, so the two agree to the last bit).

With ``lat[L_ROOF]`` 1.0 (``fastsim.RooflineLatency``) the step is a roofline
of its composition instead (`_roofline_time`: weight GEMMs at the step's token
count, MoE experts touched, attention, LM head, all-reduces, overheads), plus
the same context and swap terms; it also reads the prefill chunks' causal
pairs and count (``pairs2``, ``n_pfs``). A pure decode step's part before the
context term depends on ``n_dec`` alone and is tabulated in ``dec_cost``
(`_fill_decode_costs`), so `_decode_step_time` and `_context_slope` give the
stretch the same linear form as the regression model's.

A stochastic model (``lat[L_NOISE]`` or ``lat[L_RUN]`` not 0.0;
``fastsim._latency.StepNoise``) adds two kinds of noise:

* **per run**, drawn once per replication by `_draw_run_latency` into the
  replication's own copy of the records: the coefficients from the
  calibration's covariance, a speed factor (every term), a prefill factor
  (the prefill term) and the client overhead. A run's steps are then a
  deterministic function of its batches again, so the stretch's closed forms
  still apply.
* **per step**: step k (the k-th step of the run, from 0) lasts
  ``d * exp(sd * z_k - sd^2 / 2)``, plus, with probability ``p``, a stall of
  exponential duration; ``z_k`` and the stall's draws come from the run's
  step-noise key and k alone (`_noisy_duration`: z by a counter-based
  ziggurat, `rng._normal_at`), so the draws do not depend on how the steps
  were reached, and common random numbers hold. Steps no longer share a
  duration: `_closed_forms` says no, and a stretch takes its steps one by
  one (`stretch._stretch_steps_noisy`).
"""

from __future__ import annotations

import math

import numpy as np

from .._numba_options import njit_noalloc
from .layout import (F_TTFT_OVERHEAD, L_BASE, L_CHOL, L_CTX, L_DECODE_ALPHA, L_DECODE_SCALE, L_JITTER_SD,
                     L_JITTER_SHIFT, L_KEY_HI, L_KEY_LO, L_NOISE, L_OVERHEAD_SD, L_PREFILL, L_PREFILL_MU,
                     L_PREFILL_SD, L_R_AR_T0, L_R_AR_TOK, L_R_CA_PAIR, L_R_CA_T0, L_R_GA_SEQ, L_R_GA_T0, L_R_GEMM,
                     L_R_LM, L_R_MOE_E, L_R_MOE_GEMM, L_R_MOE_K, L_R_MOE_Q, L_R_NGEMM, L_R_OVER, L_R_PER_SEQ,
                     L_ROOF, L_RUN, L_SPEED_MU, L_SPEED_SD, L_STALL_MEAN, L_STALL_PROB, L_SWAP, N_CAL,
                     S_RUN_EFFECTS, S_STEP_NOISE)
from .rng import _GOLDEN, _mix64, _normal_at, _uniform


@njit_noalloc
def _fill_decode_costs(lat, dec_cost, extras):
    """The decode term by decoder count, ``dec_cost[b]`` for b = 0 .. size - 1
    (0.0 for b < 2), computed once per replication: a power per step would
    cost more than the rest of the step. ``extras``: None where ``lat`` is
    the regression model without per-step noise (`_step_time`)."""
    if extras is not None and lat[L_ROOF] != 0.0:
        # the roofline: the whole duration of a pure decode step less its
        # context term (`_step_time` takes it from here: the same bits)
        for b in range(dec_cost.size):
            dec_cost[b] = _roofline_time(lat, b, 0, 0, 0)
        return
    dec_cost[0] = 0.0
    if dec_cost.size > 1:
        dec_cost[1] = 0.0
    scale = lat[L_DECODE_SCALE]
    alpha = lat[L_DECODE_ALPHA]
    for b in range(2, dec_cost.size):
        dec_cost[b] = scale * (b - 1.0) ** alpha


@njit_noalloc(inline="llvm")
def _step_time(lat, dec_cost, n_dec, n_pf, n_ctx, n_swap, k, pairs2, n_pfs, extras):
    """Duration of step ``k`` of a run (counted from 0, a float), a step of
    ``n_dec`` decoders, ``n_pf`` prefill tokens and ``n_ctx`` context tokens
    that moves ``n_swap`` blocks to or from swap space. ``pairs2`` (twice
    the causal query-key pairs of the prefill chunks) and ``n_pfs`` (the
    prefilling sequences) are read by the roofline only (0 for the
    regression model, and in steps without prefill). ``extras``: None
    where ``lat`` is known to be the regression model without per-step
    noise (the common engine, `replica.engine_variant`): then neither the
    roofline nor the noise is compiled in (Numba prunes the branches)."""
    if extras is not None and lat[L_ROOF] != 0.0:
        if n_pf == 0:
            d = dec_cost[n_dec]   # (`_fill_decode_costs`: the same function, once per replication)
        else:
            d = _roofline_time(lat, n_dec, n_pf, pairs2, n_pfs)
    else:
        d = lat[L_BASE]
        if n_dec > 1:
            d += dec_cost[n_dec]
        d += lat[L_PREFILL] * n_pf
    d += lat[L_CTX] * n_ctx
    if n_swap > 0:
        d += lat[L_SWAP] * n_swap   # the swap term last (docs/engine-model.md)
    if extras is not None and lat[L_NOISE] != 0.0:
        d = _step_noise(lat, d, k)   # (a call: the rare case stays out of the loop's registers)
    return d


@njit_noalloc(inline="llvm")
def _gemm_entry(lat, o, rows):
    """A GEMM entry of the roofline record at slot ``o`` for ``rows`` rows:
    its fixed time plus the larger of its compute and memory times."""
    return lat[o] + max(lat[o + 1] * rows, lat[o + 2] + lat[o + 3] * rows)


@njit_noalloc(inline="never")
def _roofline_time(lat, n_dec, n_pf, pairs2, n_pfs):
    """The roofline's duration of a step less its context term (which
    `_step_time` adds, as for the regression model): the per-step and
    per-sequence overheads, the weight GEMMs at the step's token count, the
    MoE experts the tokens touch (expected distinct experts of E for t tokens
    with k each, E (1 - (1 - k/E)^t), each running t k / touched rows), the
    decode attention's fixed time and time per decoder, the prefill
    attention's fixed time and its causal pairs, the LM head over the scheduled sequences, the all-reduces; added
    in this order (the reference simulator adds the same terms in the same
    order, `fastsim._reference._roofline_step_time`)."""
    t = float(n_dec + n_pf)
    rows = float(n_dec + n_pfs)
    d = lat[L_R_OVER] + lat[L_R_PER_SEQ] * rows
    for g in range(int(lat[L_R_NGEMM])):
        d += _gemm_entry(lat, L_R_GEMM + 4 * g, t)
    e = lat[L_R_MOE_E]
    if e > 0.0 and t > 0.0:
        touched = e * (1.0 - lat[L_R_MOE_Q] ** t)
        m = t * lat[L_R_MOE_K] / touched
        d += touched * (_gemm_entry(lat, L_R_MOE_GEMM, m) + _gemm_entry(lat, L_R_MOE_GEMM + 4, m))
    if n_dec > 0:
        d += lat[L_R_GA_T0] + lat[L_R_GA_SEQ] * n_dec
    if n_pf > 0:
        d += lat[L_R_CA_T0] + lat[L_R_CA_PAIR] * pairs2
    if rows > 0.0:
        d += _gemm_entry(lat, L_R_LM, rows)
    d += lat[L_R_AR_T0] + lat[L_R_AR_TOK] * t
    return d


def _unit(z):
    """A double in (0, 1) from 64 random bits (as `rng._uniform`)."""
    return (float(z >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)


_unit_jit = njit_noalloc(inline="llvm")(_unit)


@njit_noalloc(inline="never")
def _step_noise(lat, d, k):
    """The noisy duration of step ``k`` whose deterministic duration is
    ``d`` (`_noisy_duration` with the run's key; a call, for the engine's
    steps taken one by one)."""
    return _noisy_duration(lat, _noise_key(lat), d, k)


@njit_noalloc(inline="llvm")
def _noise_key(lat):
    """The run's step-noise key, kept in ``lat`` as two 32-bit halves."""
    return (np.uint64(lat[L_KEY_HI]) << np.uint64(32)) | np.uint64(lat[L_KEY_LO])


@njit_noalloc(inline="llvm")
def _noisy_duration(lat, key, d, k):
    """The noisy duration of step ``k`` whose deterministic duration is
    ``d``: ``d * exp(sd * z + shift)`` (z standard normal, so the jitter's
    mean is 1), plus, with probability ``lat[L_STALL_PROB]``, a stall of
    exponential duration with mean ``lat[L_STALL_MEAN]``. Step k owns the
    counters c + j * golden, j = 1 .. 4, c = key + 4 k golden (counter-based:
    its draws are the same however the engine reached it): z is the
    counter-based ziggurat `rng._normal_at` of counters 1 and 2 (one output
    almost always), the stall's two uniforms are counters 3 and 4. Inlined
    where it is called (`stretch._stretch_steps_noisy`: the key computed
    once per stretch)."""
    c = key + np.uint64(k) * np.uint64(4) * _GOLDEN
    z = _normal_at(c + _GOLDEN, c + np.uint64(2) * _GOLDEN)
    d = d * math.exp(lat[L_JITTER_SD] * z + lat[L_JITTER_SHIFT])
    if lat[L_STALL_PROB] > 0.0:
        u3 = _unit_jit(_mix64(c + np.uint64(3) * _GOLDEN))
        if u3 < lat[L_STALL_PROB]:
            u4 = _unit_jit(_mix64(c + np.uint64(4) * _GOLDEN))
            d = d + lat[L_STALL_MEAN] * -math.log(u4)
    return d


@njit_noalloc
def _run_normal(state):
    """A standard normal variate from the per-run stream (Box-Muller, one
    variate per pair of uniforms: simple to state again in plain Python)."""
    u1 = _uniform(state, S_RUN_EFFECTS)
    u2 = _uniform(state, S_RUN_EFFECTS)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)


@njit_noalloc
def _draw_run_latency(lat, fpar, state, rlat, rfpar):
    """The records of one replication, ``rlat`` and ``rfpar``: copies of
    ``lat`` and ``fpar`` with the per-run effects drawn (stream
    `S_RUN_EFFECTS` of ``state``, seeded for the replication) and the
    step-noise key (stream `S_STEP_NOISE`) in place. With a deterministic
    model, plain copies.

    The draws, always all of them and in this order (a parameter set to 0
    leaves the others' draws where they were): five normals z, the
    coefficients theta_i + sum_j chol[i, j] * z_j of (base_s, decode_scale_s,
    decode_alpha, prefill_per_token_s, ttft_overhead_s), each summed from j = 0
    up; then the log speed, the log prefill factor and the overhead, each
    mu + sd * z. The coefficients are kept in their domain (base_s, alpha > 0,
    the costs and the overhead >= 0)."""
    for j in range(rlat.size):
        rlat[j] = lat[j]
    for j in range(rfpar.size):
        rfpar[j] = fpar[j]
    key = state[S_STEP_NOISE]
    rlat[L_KEY_HI] = float(key >> np.uint64(32))
    rlat[L_KEY_LO] = float(key & np.uint64(0xFFFFFFFF))
    if lat[L_RUN] == 0.0:
        return
    over = fpar[F_TTFT_OVERHEAD]
    for j in range(N_CAL):
        z = _run_normal(state)
        for i in range(j, N_CAL):
            c = lat[L_CHOL + i * N_CAL + j]
            if i == 0:
                rlat[L_BASE] += c * z
            elif i == 1:
                rlat[L_DECODE_SCALE] += c * z
            elif i == 2:
                rlat[L_DECODE_ALPHA] += c * z
            elif i == 3:
                rlat[L_PREFILL] += c * z
            else:
                over += c * z
    speed = math.exp(lat[L_SPEED_MU] + lat[L_SPEED_SD] * _run_normal(state))
    pf = math.exp(lat[L_PREFILL_MU] + lat[L_PREFILL_SD] * _run_normal(state))
    over += lat[L_OVERHEAD_SD] * _run_normal(state)
    rlat[L_BASE] = max(rlat[L_BASE], 1e-9) * speed
    rlat[L_DECODE_SCALE] = max(rlat[L_DECODE_SCALE], 0.0) * speed
    rlat[L_DECODE_ALPHA] = max(rlat[L_DECODE_ALPHA], 1e-3)
    rlat[L_PREFILL] = max(rlat[L_PREFILL], 0.0) * speed * pf
    rlat[L_CTX] = rlat[L_CTX] * speed
    rlat[L_SWAP] = rlat[L_SWAP] * speed
    rfpar[F_TTFT_OVERHEAD] = max(over, 0.0)


@njit_noalloc
def _decode_step_time(lat, dec_cost, b):
    """Duration of a step of ``b`` decoders and nothing else, less its context
    term: the bits of `_step_time` with no prefill (dec_cost[0] and
    dec_cost[1] are 0.0, and a 0.0 term adds nothing)."""
    return lat[L_BASE] + dec_cost[b]


@njit_noalloc(inline="llvm")
def _context_slope(lat):
    """What one more context token adds to a step's duration: in a stretch
    of decode steps, step j lasts d0 + j * (slope * decoders)."""
    return lat[L_CTX]


@njit_noalloc(inline="llvm")
def _constant_in_step(lat):
    """Whether a stretch's decode steps all last the same (no context term,
    no per-step noise): then its clock may take many steps at once, its KV
    integral needs no second moment, and the inter-token gaps of pure decode
    steps are recorded by batch size."""
    return lat[L_CTX] == 0.0 and lat[L_NOISE] == 0.0


@njit_noalloc(inline="llvm")
def _closed_forms(lat):
    """Whether a run of pure decode steps has closed forms (the stretch, in
    `stretch`): yes for a deterministic model and for per-run effects (a
    run's steps are then a deterministic function of its batches); no with
    per-step noise, where each step has a duration of its own and the
    stretch sums them one by one (`stretch._stretch_steps_noisy`)."""
    return lat[L_NOISE] == 0.0
