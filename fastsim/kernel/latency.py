"""The step-time model: the duration of an engine step from its batch
composition (docs/engine-model.md, "Step time"). The one statement of it:
the fast step, the slow step and the stretch all take their durations from
here, and the stretch asks `_constant_in_step` and `_context_slope` whether,
and how, its closed forms apply.

The latency record ``lat`` (written by ``fastsim/_replicate.py``) holds the
coefficients at the ``L_*`` slots of `layout`: a step of ``n_dec`` decoders,
``n_pf`` prefill tokens and ``n_ctx`` context tokens (moving ``n_swap`` blocks
to or from CPU swap space) lasts::

    base + scale * (n_dec - 1) ** alpha [n_dec > 1] + c_prefill * n_pf + c_ctx * n_ctx + c_swap * n_swap

added in that order (the reference simulator adds the same terms in the
same order, so the two agree to the last bit).
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .layout import L_BASE, L_CTX, L_DECODE_ALPHA, L_DECODE_SCALE, L_PREFILL, L_SWAP


@njit_noalloc
def _fill_decode_costs(lat, dec_cost):
    """The decode term by decoder count, ``dec_cost[b]`` for b = 0 .. size - 1
    (0.0 for b < 2), computed once per replication: a power per step would
    cost more than the rest of the step."""
    dec_cost[0] = 0.0
    if dec_cost.size > 1:
        dec_cost[1] = 0.0
    scale = lat[L_DECODE_SCALE]
    alpha = lat[L_DECODE_ALPHA]
    for b in range(2, dec_cost.size):
        dec_cost[b] = scale * (b - 1.0) ** alpha


@njit_noalloc(inline="llvm")
def _step_time(lat, dec_cost, n_dec, n_pf, n_ctx, n_swap):
    """Duration of a step of ``n_dec`` decoders, ``n_pf`` prefill tokens and
    ``n_ctx`` context tokens that moves ``n_swap`` blocks to or from swap space."""
    d = lat[L_BASE]
    if n_dec > 1:
        d += dec_cost[n_dec]
    d += lat[L_PREFILL] * n_pf
    d += lat[L_CTX] * n_ctx
    if n_swap > 0:
        d += lat[L_SWAP] * n_swap   # the swap term last (docs/engine-model.md)
    return d


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
    """Whether a stretch's decode steps all last the same (no context term):
    then its clock may take many steps at once, and its KV integral needs no
    second moment."""
    return lat[L_CTX] == 0.0
