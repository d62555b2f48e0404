"""Analytical (queueing-theory) estimates of a fastsim scenario, without simulation.

``predict(scenario, model=...)`` returns a DataFrame indexed by the metric names
of ``replicate(...).summary()`` with two columns, ``estimate`` (NaN where a
model does not estimate a metric) and ``description``. Models (assumptions in ``docs/analytical.md``):

* ``"birth_death"``: a birth-death chain on the number of requests in the
  system ``n`` with the admission cap ``N_max = floor(K / E[P+O])`` (``K`` the
  KV capacity in tokens) and the batch-size-dependent service rate
  ``min(n, c) / (E[O] step(min(n, c)) + min(n, c) E[P] prefill_per_token)``.
  Exact stationary law; blocking by PASTA; TTFT as a PASTA-weighted mixture
  of (gamma) waiting times, convolved with the own-prefill step, inverted
  numerically for the percentiles.
* ``"knapsack"``: the same chain, but with *distribution-aware*
  admission: given ``n`` in system, the reserved tokens are the sum of ``n``
  sizes drawn from the holding-time-biased size law, conditioned on fitting
  (the lumped form of the stochastic-knapsack / Kaufman–Roberts product form,
  exact for the pure loss system), an arrival is accepted with probability
  ``P(S_new + T_n <= K) / P(T_n <= K)``. While requests queue for a batch
  slot (share ``1 - theta`` of the holding time) the admitted-size law comes
  from a saturated Markov chain on the free KV tokens (arrivals take the
  freed tokens if they fit, so admitted requests are short); the mean wait,
  the admitted-size law and theta are a damped fixed point. Any admission mode.
* ``"ctmc"`` (recommended for ``admission="kv_reservation"``): a CTMC on
  ``(n, T, k)``: requests in system, reserved KV units (blocks, or groups of
  blocks so that at most ``max_kv_levels`` units), and the Erlang phase of
  the departure clock while every slot is busy (see :func:`kv_ctmc`). It is
  the multi-class chain (one class per size) lumped on the KV used, with the
  product-form class mix given ``(n, T)``; exact for the loss system
  (Kaufman–Roberts) and for one size (M/M/c/N, Erlang-B). Admission is exact
  given ``T``; the phases give the within-class service SCV. Solved on the
  sparse generator by linear level reduction (or ``scipy.sparse`` spsolve).
  Waits from the state an arrival finds (the work ahead of it).

For every model, the decode-side laws (ITL, TPOT, E2E percentiles) follow from
the chain's law of ``n``: step durations by batch size, joiners' prefill steps
as a Poisson stream, E2E as TTFT plus the decode time taken independent
(:func:`_decode_laws`).

Lower-level, exact functions: :func:`birth_death_stationary`,
:func:`mm1_stationary`, :func:`mmc_stationary`, :func:`kv_ctmc`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
# scipy.stats, .signal, .sparse and .optimize are imported inside the functions that use them:
# at module level they were about 1 s of `import fastsim` (tests/test_import.py).

from ._config import Scenario
from ._distributions import (KIND_EMPIRICAL, KIND_FIXED, KIND_LOGNORMAL, KIND_REPLAY, KIND_UNIFORM,
                             LengthDistribution)
from ._replicate import METRIC_DESCRIPTIONS

MODELS = ("birth_death", "knapsack", "ctmc")

__all__ = ["MODELS", "KVChain", "birth_death_stationary", "kv_ctmc", "length_pmf", "mm1_stationary",
           "mmc_stationary", "predict"]


# ----------------------------------------------------------------------------
# Exact building blocks

def birth_death_stationary(lambdas, mus) -> np.ndarray:
    """Stationary law of a finite birth-death chain on ``0..N``.

    Parameters
    ----------
    lambdas : array_like, length N
        ``lambdas[n]`` is the birth rate from state ``n`` to ``n+1`` (>= 0).
    mus : array_like, length N
        ``mus[n]`` is the death rate from state ``n+1`` to ``n`` (> 0).

    Returns
    -------
    numpy.ndarray, length N+1
        ``pi[n] ∝ prod_{k<n} lambdas[k] / mus[k]``, normalised (computed in
        logs, so long chains do not overflow).
    """
    lam = np.asarray(lambdas, dtype=float)
    mu = np.asarray(mus, dtype=float)
    if lam.ndim != 1 or lam.shape != mu.shape:
        raise ValueError(f"lambdas and mus must be 1-d of equal length, got {lam.shape} and {mu.shape}")
    if np.any(lam < 0) or np.any(~np.isfinite(lam)):
        raise ValueError("lambdas must be finite and >= 0")
    if np.any(mu <= 0) or np.any(~np.isfinite(mu)):
        raise ValueError("mus must be finite and > 0")
    with np.errstate(divide="ignore"):
        logr = np.log(lam) - np.log(mu)
    logp = np.concatenate([[0.0], np.cumsum(logr)])
    logp -= np.max(logp)
    p = np.exp(logp)
    return p / p.sum()


def mm1_stationary(arrival_rate: float, service_rate: float, capacity: int) -> np.ndarray:
    """Stationary law of M/M/1/N (``capacity = N`` places in system)."""
    n = int(capacity)
    return birth_death_stationary(np.full(n, float(arrival_rate)), np.full(n, float(service_rate)))


def mmc_stationary(arrival_rate: float, service_rate: float, servers: int, capacity: int) -> np.ndarray:
    """Stationary law of M/M/c/N (``N >= c``; ``N = c`` is the Erlang loss system)."""
    k = np.arange(1, int(capacity) + 1)
    return birth_death_stationary(np.full(k.size, float(arrival_rate)),
                                  np.minimum(k, int(servers)) * float(service_rate))


# ----------------------------------------------------------------------------
# Length laws as probability vectors

def length_pmf(dist: LengthDistribution, tail: float = 1e-9) -> np.ndarray:
    """``pmf[k] = P(L = k)`` for ``k = 0..kmax`` (``pmf[0] = 0``), up to a tail mass ``tail``."""
    from scipy import stats
    parts = []
    for w, kind, p0, p1, values, cdf in dist._components():
        if kind == KIND_FIXED:
            v = np.zeros(int(p0) + 1)
            v[int(p0)] = 1.0
        elif kind == KIND_UNIFORM:
            v = np.zeros(int(p1) + 1)
            v[int(p0):int(p1) + 1] = 1.0 / (int(p1) - int(p0) + 1)
        elif kind in (KIND_EMPIRICAL, KIND_REPLAY):
            probs = np.diff(np.concatenate([[0.0], cdf]))
            vals = np.asarray(values, dtype=int)
            v = np.zeros(int(vals.max()) + 1)
            np.add.at(v, vals, probs)
        elif kind == KIND_LOGNORMAL:
            if p1 == 0:
                v = np.zeros(int(math.ceil(p0)) + 1)
                v[int(math.ceil(p0))] = 1.0
            else:
                law = stats.lognorm(s=p1, scale=p0)
                hi = int(math.ceil(law.ppf(1.0 - tail))) + 1
                v = np.diff(law.cdf(np.arange(0, hi + 1, dtype=float)))
                v = np.concatenate([[0.0], v])[: hi + 1]
                v[0] = 0.0
                v[1] += law.cdf(0.0)
        else:  # pragma: no cover
            raise ValueError(f"unsupported length law kind {kind}")
        parts.append(w * v)
    out = np.zeros(max(len(v) for v in parts))
    for v in parts:
        out[: len(v)] += v
    return out / out.sum()


def _conv(a, b):
    from scipy import signal
    return np.maximum(signal.fftconvolve(a, b), 0.0)


# ----------------------------------------------------------------------------
# Scenario checks

def _check_supported(scenario: Scenario, model: str):
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, got {model!r}")
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {scenario!r}")
    e, w = scenario.engine, scenario.workload
    bad = []
    if e.scheduler != "continuous":
        bad.append(f"scheduler={e.scheduler!r} (only 'continuous' batching is modelled)")
    if e.policy != "fcfs":
        bad.append(f"policy={e.policy!r} (the chain is order-blind; waiting times assume FCFS)")
    if e.max_queue_delay_s is not None:
        bad.append("max_queue_delay_s (abandonment is not modelled)")
    if e.async_scheduling:
        bad.append("async_scheduling=True (the models are of the synchronous loop; set "
                   "engine.async_scheduling=False)")
    if w.users is not None:
        bad.append("a multi-user workload (the models need Poisson arrivals)")
    elif w.arrival_times is not None:
        bad.append("arrival_times (the models need Poisson arrivals)")
    elif w.burstiness != 1.0:
        bad.append(f"burstiness={w.burstiness:g} (the models need Poisson arrivals, burstiness=1)")
    if w.horizon_s is not None:
        bad.append("horizon_s (the models are steady-state; use drained runs)")
    if w.lengths is not None:
        bad.append("lengths=LengthTrace (paired lengths; give independent prompt_len/output_len laws)")
    if len(set(w.priorities)) > 1:
        bad.append("several priority classes")
    if model == "ctmc" and e.admission != "kv_reservation":
        bad.append(f"admission={e.admission!r} with model='ctmc' (the chain tracks KV reservations; "
                   "use model='knapsack' or 'birth_death')")
    if bad:
        raise ValueError("fastsim.analytical.predict cannot represent: " + "; ".join(bad))


# ----------------------------------------------------------------------------
# The chain

class _Inputs:
    def __init__(self, scenario: Scenario):
        e, w, lat = scenario.engine, scenario.workload, scenario.latency
        self.lam = float(w.arrival_rate)
        self.c = int(e.max_num_seqs)
        self.lat = lat
        self.pf = lat.prefill_per_token_s
        self.ctx = lat.ctx_per_token_s
        self.ovh = lat.ttft_overhead_s
        self.pP = length_pmf(w.prompt_len)
        self.pO = length_pmf(w.output_len)
        kP, kO = np.arange(self.pP.size), np.arange(self.pO.size)
        self.EP, self.EO = float(self.pP @ kP), float(self.pO @ kO)
        self.EO2 = float(self.pO @ kO.astype(float) ** 2)
        # S = P + O, and the partial sums needed for E[O | S = s], E[P | S = s]
        self.pS = _conv(self.pP, self.pO)
        self.oS = _conv(self.pP, self.pO * kO)   # sum_o o P(O=o) P(P=s-o)
        self.pSpP = _conv(self.pP * kP, self.pO)
        self.o2S = _conv(self.pP, self.pO * kO.astype(float) ** 2)
        # never-fits / max_model_len: a request of size s can ever be admitted
        s = np.arange(self.pS.size)
        fits = (s - 1 + e.block_size - 1) // e.block_size <= e.usable_gpu_blocks
        if e.max_model_len is not None:
            fits &= s <= e.max_model_len
        if not e.enable_chunked_prefill:
            fits &= s - 1 <= e.max_num_batched_tokens
        self.fits = fits
        self.admission = e.admission
        self.engine = e
        self.max_waiting = e.max_waiting
        self.K = e.usable_gpu_blocks * e.block_size
        self.n_meas = w.num_requests - w.warmup_requests

    def step(self, b):
        """Decode step with b sequences, context cost at the mean context."""
        return float(self.lat.step_time(b, 0, b * (self.EP + self.EO / 2.0)))

    def service_mean(self, b):
        """Mean time a request spends running in a batch of b (O steps + prefill interference)."""
        return self.EO * self.step(b) + b * self.EP * self.pf


def _iid_fill(K, pa, cdf_new, nmax_hard):
    """cdfs on [0, K] of the (unconditioned) sum of n iid sizes from the accepted-size law pa."""
    R = np.zeros(K + 1)
    R[0] = 1.0
    out = []
    for n in range(nmax_hard):
        out.append(np.cumsum(R))
        if float(R @ cdf_new[::-1]) < 1e-10:
            break
        R = _conv(R, pa)[: K + 1]
    return out


def _admission(inp: _Inputs, model: str, wait_mean: float, pa=None, nmax_hard: int = 2000):
    """Birth rates and per-state quantities of the chain.

    Returns dict with lam_n (acceptance-weighted birth rates, states 0..N-1), kappa
    (departure-rate correction for the composition of the requests in the system,
    states 1..N), eo/ep (mean O and P of the requests accepted in state n), theta, N.
    """
    p_fit = float(inp.pS[inp.fits].sum())
    base = dict(theta=1.0)
    if inp.admission in ("queue_limit", "none") or model == "birth_death":
        if inp.admission == "queue_limit":
            N = inp.c + int(inp.max_waiting)
        elif inp.admission == "none":
            N = nmax_hard
        else:
            s_mean = float(np.arange(inp.pS.size) @ inp.pS)
            N = max(1, int(inp.K // s_mean))
        return dict(base, lam_n=np.full(N, inp.lam * p_fit), kappa=np.ones(N), N=N,
                    eo=np.full(N, inp.EO), ep=np.full(N, inp.EP), eo2=np.full(N, inp.EO2))
    K = inp.K
    pS = inp.pS.copy()
    pS[~inp.fits] = 0.0
    m = min(K + 1, pS.size)
    pSK, oSK, pPK, o2SK = np.zeros(K + 1), np.zeros(K + 1), np.zeros(K + 1), np.zeros(K + 1)
    o2SK[:m] = np.where(inp.fits, inp.o2S[:pS.size], 0)[:m]
    pSK[:m], oSK[:m], pPK[:m] = pS[:m], np.where(inp.fits, inp.oS[:pS.size], 0)[:m], \
        np.where(inp.fits, inp.pSpP[:pS.size], 0)[:m]
    d = inp.step(max(1, inp.c // 2))
    # knapsack product form: in-system sizes biased by their holding time E[H | s] = W + service(s)
    hold = wait_mean * inp.pS + d * inp.oS + inp.pf * inp.pSpP
    q = np.zeros(K + 1)
    q[:m] = np.where(inp.fits[:m], hold[:m], 0.0)
    q /= q.sum()
    cdf_new = np.cumsum(pSK)               # P(S_new <= x, fits)
    pa = pSK if pa is None else pa
    seq = _iid_fill(K, pa / pa.sum(), cdf_new, nmax_hard)
    serv = inp.service_mean(max(1, inp.c // 2))
    theta = serv / (serv + wait_mean)      # share of the holding time spent running
    T = np.zeros(K + 1)
    T[0] = 1.0                             # T_n restricted to [0, K]
    F, G, acc, eo, ep, xs, eo2 = [1.0], [], [], [], [], [], []
    for n in range(nmax_hard):
        cT = np.cumsum(T)
        G.append(float(pSK @ cT[::-1]))    # P(S_new + T_n <= K)
        cR = seq[n] if n < len(seq) else np.zeros(K + 1)
        X = theta * cT / F[-1] + (1 - theta) * cR    # blended P(free tokens >= K - x)
        Xr = X[::-1]
        a = float(pSK @ Xr)
        acc.append(a)
        xs.append(Xr)
        eo.append(float(oSK @ Xr) / a if a > 0 else inp.EO)
        ep.append(float(pPK @ Xr) / a if a > 0 else inp.EP)
        eo2.append(float(o2SK @ Xr) / a if a > 0 else inp.EO2)
        if a < 1e-10 or F[-1] < 1e-300:
            break
        T = _conv(T, q)[: K + 1]
        F.append(float(T.sum()))
    F, G = np.array(F), np.array(G)
    N = len(G)                              # states 0..N; from N nothing is accepted (approx.)
    lam_n = inp.lam * np.array(acc)
    kappa = np.ones(N)
    # departure-rate correction (exact in the pure loss system): mu_{n+1} ∝ G_n / F_{n+1}
    with np.errstate(divide="ignore", invalid="ignore"):
        kap = G[: N - 1] / F[1:N]
    kappa[: N - 1] = np.where(np.isfinite(kap) & (kap > 0), kap, 1.0)
    kappa[N - 1] = kappa[N - 2] if N > 1 else 1.0
    return dict(lam_n=lam_n, kappa=kappa, N=N, eo=np.array(eo), ep=np.array(ep), theta=theta,
                xs=xs, pSK=pSK, eo2=np.array(eo2))


def _free_space_chain(K, pSK, pa, lam, mu, scv_dep, levels=1024):
    """Saturated regime (a full batch and a queue): a Markov chain on the free KV tokens,
    embedded just after departures. A departure frees an accepted size (law ``pa``); until
    the next departure (a gamma time, mean 1/mu, SCV ``scv_dep``) Poisson(lam) arrivals each
    take their size if it fits. Returns ``fit(s)``: the share of arrival attempts that find
    at least ``s`` free tokens (token-indexed, length K+1)."""
    from scipy import stats
    g = max(1, -(-K // levels))
    L = K // g
    units = -(-np.arange(K + 1) // g)                 # ceil(s / g): a size needs that many units
    pSu = np.bincount(units, weights=pSK, minlength=L + 2)[: L + 1]
    pau = np.bincount(units, weights=pa, minlength=L + 2)[: L + 1]
    pSu[0] = pau[0] = 0.0
    A = np.zeros((L + 1, L + 1))
    for f in range(L + 1):
        A[f, : f + 1] = pSu[: f + 1][::-1]
        A[f, f] += 1.0 - pSu[: f + 1].sum()
    ks = max(1, int(round(1.0 / max(scv_dep, 1e-3))))
    x = lam / (mu * ks)
    B = np.eye(L + 1) * (1 + x) - x * A               # M = B^{-ks}: attempts between departures
    M = np.eye(L + 1)
    for _ in range(min(ks, 20)):
        M = np.linalg.solve(B, M)
    D = np.zeros((L + 1, L + 1))
    cpa = np.cumsum(pau)
    for f in range(L + 1):
        D[f, f: L + 1] = pau[: L + 1 - f]
        D[f, L] += 1.0 - cpa[L - f]
    P = M @ D
    Q = (P - np.eye(L + 1)).T
    Q[-1, :] = 1.0
    rhs = np.zeros(L + 1)
    rhs[-1] = 1.0
    v = np.clip(np.linalg.solve(Q, rhs), 0.0, None)
    v /= v.sum()
    # expected attempts in each free-space state per cycle: sum_k P(#attempts > k) v A^k
    p_nb = 1.0 / (1.0 + x)                            # negative binomial(ks, p_nb) attempts
    k = np.arange(0, 2000)
    surv = stats.nbinom.sf(k, ks, p_nb)
    visits, vec = np.zeros(L + 1), v.copy()
    for kk in range(k.size):
        if surv[kk] < 1e-9:
            break
        visits += surv[kk] * vec
        vec = vec @ A
    visits /= visits.sum()
    tail_units = np.cumsum(visits[::-1])[::-1]        # P(free >= u units)
    return tail_units[np.minimum(units, L)]


# ----------------------------------------------------------------------------
# The KV chain: a CTMC on (requests in system, reserved KV units[, service phase])

@dataclass(frozen=True, eq=False)
class KVChain:
    """Stationary solution of :func:`kv_ctmc` (one entry per state unless noted).

    Attributes
    ----------
    n, used, phase : numpy.ndarray of int
        Requests in the system, reserved KV units, Erlang phase (0-based) of
        the request in service (always 0 unless ``phases > 1``).
    pi : numpy.ndarray
        Stationary probabilities (sum to 1).
    generator : scipy.sparse.csr_matrix
        The generator ``Q`` (rows sum to 0); ``pi @ Q = 0``.
    accept : numpy.ndarray
        Probability that an arrival in the state is admitted.
    blocking : float
        Share of arrivals rejected (PASTA): ``1 - pi @ accept``.
    class_blocking : numpy.ndarray
        ``class_blocking[u]``: rejection probability of a request of ``u`` units
        (index 0 unused; 1 beyond the capacity).
    accepted_pmf : numpy.ndarray
        Size law of the admitted requests.
    throughput : float
        Admitted (= completed) requests per unit time.
    level_pi, level_up, level_down : numpy.ndarray, length ``max_in_system + 1``
        ``P(n)`` and the lumped rates ``n -> n+1`` and ``n -> n-1`` (flows over
        ``P(n)``); the lumped birth-death chain has exactly ``level_pi`` as its
        stationary law.
    max_in_system : int
        Truncation level ``N`` (arrivals finding ``N`` requests are rejected).
    departure_rate : numpy.ndarray
        Total departure rate ``mu(n, T)`` of each state (with phases, the
        departure clock advances at ``m mu(n, T)`` per phase).
    """

    n: np.ndarray
    used: np.ndarray
    phase: np.ndarray
    pi: np.ndarray
    generator: object
    accept: np.ndarray
    blocking: float
    class_blocking: np.ndarray
    accepted_pmf: np.ndarray
    throughput: float
    level_pi: np.ndarray
    level_up: np.ndarray
    level_down: np.ndarray
    max_in_system: int
    departure_rate: np.ndarray


def _scaled_powers(base, k, L):
    """``base^{*j}`` restricted to ``[0, L]`` for ``j = 0..k``, as (vector / max, log max)."""
    out = []
    v = np.zeros(L + 1)
    v[0] = 1.0
    ls = 0.0
    out.append((v, ls))
    for _ in range(k):
        v = np.convolve(v, base)[: L + 1]
        m = float(v.max())
        if m > 0:
            v, ls = v / m, ls + math.log(m)
        out.append((v, ls))
    return out


def _scaled_conv(a, b, L):
    v = np.convolve(a[0], b[0])[: L + 1]
    m = float(v.max())
    return (v / m, a[1] + b[1] + math.log(m)) if m > 0 else (v, a[1] + b[1])


def _kv_generator(lam, p, L, c, tau, phases, N):
    """States and generator of the KV chain truncated at N (see :func:`kv_ctmc`)."""
    from scipy import sparse
    sup = np.nonzero(p > 0)[0]
    w = p / p.sum()
    Z = (p[None, :] * tau).sum(axis=1)                 # Z_b = sum_u p(u) tau_b(u)
    Wp = _scaled_powers(w, N, L)
    R = [_scaled_powers(p * tau[b - 1] / Z[b - 1], min(b, N), L) for b in range(1, c + 1)]
    C, Cb = [None] * (N + 1), [None] * (N + 1)
    for n in range(1, N + 1):
        b = min(n, c)
        C[n] = _scaled_conv(R[b - 1][b], Wp[n - b], L)       # law of the total given n (unnormalised)
        Cb[n] = _scaled_conv(R[b - 1][b - 1], Wp[n - b], L)  # ... without one request in service
    feas = [np.array([0])] + [np.nonzero(C[n][0] > 1e-250)[0] for n in range(1, N + 1)]
    empty = [n for n in range(1, N + 1) if feas[n].size == 0]
    if empty:                                            # no total fits n requests: stop below
        N = empty[0] - 1
        feas = feas[: N + 1]
    # Erlang phases of the departure clock while every slot is busy (levels n >= c)
    mp = [1] + [phases if n >= c else 1 for n in range(1, N + 1)]
    sizes = [f.size * mp[n] for n, f in enumerate(feas)]
    offs = np.cumsum([0] + sizes)
    idx = []
    for n in range(N + 1):
        a = -np.ones((L + 1, mp[n]), dtype=np.int64)
        a[feas[n], :] = offs[n] + np.arange(sizes[n]).reshape(feas[n].size, mp[n])
        idx.append(a)
    rows, cols, vals = [], [], []
    dep_rate = np.zeros(int(offs[-1]))
    for n in range(N + 1):
        T = feas[n]
        if n < N:                                        # admissions: (n, T) -> (n+1, T+u)
            TT, UU = np.meshgrid(T, sup, indexing="ij")
            ok = TT + UU <= L
            TT, UU = TT[ok], UU[ok]
            for k in range(mp[n]):
                # the clock keeps its phase; it starts in phase 0 when the last slot fills
                k2 = k if mp[n] == mp[n + 1] else 0
                src, tgt = idx[n][TT, k], idx[n + 1][TT + UU, k2]
                good = tgt >= 0
                rows.append(src[good]); cols.append(tgt[good]); vals.append(lam * p[UU[good]])
        if n >= 1:                                       # departures: (n, T) -> (n-1, T-u)
            b, m = min(n, c), mp[n]
            TT, UU = np.meshgrid(T, sup, indexing="ij")
            ok = TT - UU >= 0
            TT, UU = TT[ok], UU[ok]
            rate = (b * p[UU] / Z[b - 1] * Cb[n][0][TT - UU] / C[n][0][TT] * math.exp(Cb[n][1] - C[n][1]))
            tgt = idx[n - 1][TT - UU, 0]
            good = (rate > 0) & (tgt >= 0)
            TT, rate, tgt = TT[good], rate[good], tgt[good]
            tot = np.bincount(TT, weights=rate, minlength=L + 1)[T]
            dep_rate[offs[n]:offs[n + 1]] = np.repeat(tot, m)
            if m > 1:                                    # Erlang-m: phases advance at m * total rate
                for k in range(m - 1):
                    rows.append(idx[n][T, k]); cols.append(idx[n][T, k + 1]); vals.append(m * tot)
            rows.append(idx[n][TT, m - 1]); cols.append(tgt); vals.append(m * rate)
    S = int(offs[-1])
    rows, cols, vals = np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)
    Q = sparse.coo_matrix((vals, (rows, cols)), shape=(S, S)).tocsr()
    Q = (Q - sparse.diags(np.asarray(Q.sum(axis=1)).ravel())).tocsr()
    nn = np.concatenate([np.full(sizes[n], n) for n in range(N + 1)]).astype(np.int64)
    used = np.concatenate([np.repeat(feas[n], mp[n]) for n in range(N + 1)]).astype(np.int64)
    phase = np.concatenate([np.tile(np.arange(mp[n]), feas[n].size) for n in range(N + 1)]).astype(np.int64)
    return Q, offs, nn, used, phase, dep_rate


def _solve_levels(Q, offs):
    """``pi Q = 0`` by linear level reduction (Q block-tridiagonal in the levels ``n``)."""
    N = len(offs) - 2
    blk = lambda i, j: Q[offs[i]:offs[i + 1], offs[j]:offs[j + 1]].toarray()
    Rs = [None] * (N + 1)
    Rnext = None
    for n in range(N, 0, -1):
        M = blk(n, n)
        if Rnext is not None:
            M = M + Rnext @ blk(n + 1, n)
        Rs[n] = np.linalg.solve(-M.T, blk(n - 1, n).T).T     # U_{n-1} (-M)^{-1}
        Rnext = Rs[n]
    x = [np.ones(1)]
    for n in range(1, N + 1):
        x.append(np.maximum(x[-1] @ Rs[n], 0.0))
    pi = np.concatenate(x)
    return pi / pi.sum()


def kv_ctmc(arrival_rate, size_pmf, capacity, servers, mean_service, *, phases: int = 1,
            max_in_system=None, method: str = "levels", tol: float = 1e-10) -> KVChain:
    """Stationary law of the KV-reservation chain (a multi-class CTMC lumped on the KV used).

    Requests arrive as a Poisson stream; a request of ``u`` KV units (law
    ``size_pmf``) is admitted iff ``u`` fits beside the units reserved by the
    requests in the system, holds them until it leaves, and is served by one of
    ``servers`` slots in FCFS order. The state is ``(n, T[, k])``: requests in
    the system, reserved units, Erlang phase of the request in service. The
    class mix given ``(n, T)`` is the product-form one: the ``min(n, c)``
    requests in service are iid with law ``∝ p(u) tau(u)`` and the waiting ones
    iid with law ``p``, all conditioned on their total being ``T``; a
    departure of size ``u`` happens at rate
    ``b p(u) / Z_b * C'_n(T - u) / C_n(T)``. For a pure loss system (``servers``
    >= every count that fits) this is exactly the Kaufman–Roberts stochastic
    knapsack, insensitive to the service law; with one size it is exactly
    M/M/c/N (Erlang-B when ``c = N``).

    Parameters
    ----------
    arrival_rate : float
        Poisson arrival rate ``lambda > 0``.
    size_pmf : array_like
        ``size_pmf[u]``: probability that a request needs ``u`` units
        (``size_pmf[0]`` must be 0). It may sum to less than 1: the missing mass
        never fits (rejected), as does mass beyond ``capacity``.
    capacity : int
        KV units ``L >= 1``.
    servers : int
        Batch slots ``c >= 1`` (``max_num_seqs``).
    mean_service : array_like
        Mean time in service of a request of ``u`` units, shape ``(len(size_pmf),)``
        or ``(servers, len(size_pmf))`` (row ``b-1``: with ``b`` requests in
        service); > 0 where ``size_pmf > 0``.
    phases : int
        Erlang phases of the departure clock while every slot is busy
        (``n >= servers``; below, departures are exponential): ``m`` phases of
        rate ``m x`` the departure rate give intervals of SCV ``1/m`` per
        size class (for one server, the service-time SCV). 1: exponential.
    max_in_system : int, optional
        Truncation ``N`` of the number in system (arrivals finding ``N`` are
        rejected). Default: grown until ``P(n = N) <= tol``.
    method : {"levels", "spsolve"}
        Linear level reduction on the dense level blocks (fast), or
        ``scipy.sparse.linalg.spsolve`` on the whole generator.
    tol : float
        Truncation tolerance of the default ``max_in_system``.

    Returns
    -------
    KVChain
    """
    from scipy.sparse import linalg as splinalg
    lam = float(arrival_rate)
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"arrival_rate must be finite and > 0, got {arrival_rate!r}")
    L = int(capacity)
    if L < 1 or L != capacity:
        raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
    c = int(servers)
    if c < 1 or c != servers:
        raise ValueError(f"servers must be an integer >= 1, got {servers!r}")
    m = int(phases)
    if m < 1 or m != phases:
        raise ValueError(f"phases must be an integer >= 1, got {phases!r}")
    if method not in ("levels", "spsolve"):
        raise ValueError(f"method must be 'levels' or 'spsolve', got {method!r}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        # (NaN fails too; the loop that grows the truncation is bounded by capacity either way)
        raise ValueError(f"tol must be a number in (0, 1), got {tol!r}")
    p_in = np.asarray(size_pmf, dtype=float)
    if p_in.ndim != 1 or p_in.size < 2 or np.any(~np.isfinite(p_in)) or np.any(p_in < 0):
        raise ValueError("size_pmf must be a 1-d array of finite probabilities >= 0 (index = size in units)")
    if p_in[0] != 0:
        raise ValueError(f"size_pmf[0] must be 0 (every request reserves >= 1 unit), got {p_in[0]!r}")
    if p_in.sum() > 1 + 1e-9:
        raise ValueError(f"size_pmf must sum to <= 1, got {p_in.sum()!r}")
    tau_in = np.asarray(mean_service, dtype=float)
    if tau_in.ndim == 1:
        tau_in = np.broadcast_to(tau_in, (c, tau_in.size))
    if tau_in.shape != (c, p_in.size):
        raise ValueError(f"mean_service must have shape ({p_in.size},) or ({c}, {p_in.size}), "
                         f"got {np.shape(mean_service)}")
    p = np.zeros(L + 1)
    p[: min(L + 1, p_in.size)] = p_in[: L + 1]
    tau = np.zeros((c, L + 1))
    tau[:, : min(L + 1, p_in.size)] = tau_in[:, : L + 1]
    pos = p > 0
    if not pos.any():
        raise ValueError("no request size fits the capacity (size_pmf is 0 on 1..capacity)")
    if np.any(~np.isfinite(tau[:, pos])) or np.any(tau[:, pos] <= 0):
        raise ValueError("mean_service must be finite and > 0 where size_pmf > 0")
    tau[:, ~pos] = 0.0
    umin = int(np.nonzero(pos)[0].min())
    n_hard = L // umin
    if max_in_system is not None:
        N = int(max_in_system)
        if N < 1 or N != max_in_system:
            raise ValueError(f"max_in_system must be an integer >= 1, got {max_in_system!r}")
        grow = False
    else:
        cdf = np.cumsum(p) / p.sum()
        u_med = max(int(np.searchsorted(cdf, 0.5)), umin)
        N = min(n_hard, max(L // u_med + 4, c + 8))      # grown below until P(n = N) <= tol
        grow = True
    while True:
        N_req = N
        Q, offs, nn, used, phase, dep_rate = _kv_generator(lam, p, L, c, tau, m, N_req)
        N = int(nn.max())                                # (lowered where no total fits N requests)
        if method == "spsolve":
            A = Q.T.tolil()
            A[0, :] = 1.0
            rhs = np.zeros(Q.shape[0])
            rhs[0] = 1.0
            pi = np.clip(splinalg.spsolve(A.tocsc(), rhs), 0.0, None)
            pi /= pi.sum()
        else:
            pi = _solve_levels(Q, offs)
        level_pi = np.bincount(nn, weights=pi, minlength=N + 1)
        if not grow or level_pi[N] <= tol or N >= n_hard or N < N_req:
            break
        N = min(n_hard, int(math.ceil(N * 1.5)) + 1)
    cp = np.cumsum(p)
    accept = np.where(nn < N, cp[L - used], 0.0)
    blocking = float(min(max(1.0 - pi @ accept, 0.0), 1.0))
    free_mass = np.bincount(used, weights=pi * (nn < N), minlength=L + 1)  # P(T = t, n < N)
    fit_u = np.cumsum(free_mass)[L - np.arange(L + 1)]                   # P(T <= L - u, n < N), u = 0..L
    class_blocking = np.ones(max(p_in.size, L + 1))
    class_blocking[1:L + 1] = 1.0 - fit_u[1:]
    acc_pmf = p * fit_u
    acc_pmf = acc_pmf / acc_pmf.sum() if acc_pmf.sum() > 0 else acc_pmf
    # lumped level rates (flows over P(n))
    Qc = Q.tocoo()
    dn = nn[Qc.col] - nn[Qc.row]
    up = np.bincount(nn[Qc.row[dn == 1]], weights=pi[Qc.row[dn == 1]] * Qc.data[dn == 1], minlength=N + 1)
    down = np.bincount(nn[Qc.row[dn == -1]], weights=pi[Qc.row[dn == -1]] * Qc.data[dn == -1], minlength=N + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        level_up = np.where(level_pi > 0, up / level_pi, 0.0)
        level_down = np.where(level_pi > 0, down / level_pi, 0.0)
    return KVChain(n=nn, used=used, phase=phase, pi=pi, generator=Q, accept=accept, blocking=blocking,
                   class_blocking=class_blocking, accepted_pmf=acc_pmf, throughput=lam * (1.0 - blocking),
                   level_pi=level_pi, level_up=level_up, level_down=level_down, max_in_system=N,
                   departure_rate=dep_rate)


def _solve(inp: _Inputs, model: str):
    wait, eo_acc, ep_acc, pa = 0.0, inp.EO, inp.EP, None
    iters = 1 if model == "birth_death" else 40
    for it in range(iters):
        ad = _admission(inp, model, wait, pa)
        lam_n, kappa, N, theta = ad["lam_n"], ad["kappa"], ad["N"], ad["theta"]
        n = np.arange(1, N + 1)
        b = np.minimum(n, inp.c)
        bb = np.arange(1, inp.c + 1)
        steps = np.array([inp.step(x) for x in bb])
        rate_unb = bb / (inp.EO * steps + bb * inp.EP * inp.pf)
        rate_acc = bb / (eo_acc * steps + bb * ep_acc * inp.pf)
        if model == "knapsack":
            mu_n = theta * rate_unb[b - 1] * kappa + (1 - theta) * rate_acc[b - 1]
        else:
            mu_n = rate_unb[b - 1]
        pi = birth_death_stationary(lam_n, mu_n)
        acc = np.concatenate([lam_n, [0.0]]) * pi
        w_arr = acc / acc.sum()                       # states seen by accepted arrivals (PASTA)
        # mean queue wait (n >= c at arrival): n - c + 1 departures at the full-batch rate
        mu_full = np.concatenate([mu_n, [mu_n[-1]]])  # mu_full[k] = rate out of state k+1
        cum = np.concatenate([[0.0], np.cumsum(1.0 / mu_full), np.zeros(inp.c + 1)])
        states = np.arange(N + 1)
        sel = (states >= inp.c) & (states <= N)
        new_wait = float(np.sum(w_arr[sel] * (cum[states[sel] + 1] - cum[inp.c])))
        new_eo = float(w_arr[:N] @ ad["eo"][:N]) / max(float(w_arr[:N].sum()), 1e-300)
        new_ep = float(w_arr[:N] @ ad["ep"][:N]) / max(float(w_arr[:N].sum()), 1e-300)
        eo2_acc = float(w_arr[:N] @ ad["eo2"][:N]) / max(float(w_arr[:N].sum()), 1e-300)
        damp = 0.5 if it > 0 else 1.0
        eo_acc_prev, ep_acc_prev, wait_prev = eo_acc, ep_acc, wait
        wait = (1 - damp) * wait + damp * new_wait
        eo_acc = (1 - damp) * eo_acc + damp * new_eo
        ep_acc = (1 - damp) * ep_acc + damp * new_ep
        if model == "knapsack" and "xs" in ad:
            # accepted-size law: pS(s) * sum_n w(n) P(free >= s | n) ...
            wts = w_arr[:len(ad["xs"])]
            new_pa = ad["pSK"] * (wts @ np.array(ad["xs"])) if len(wts) else ad["pSK"]
            new_pa /= new_pa.sum()
            if theta < 0.999:
                # ... mixed with the saturated free-space chain for the queueing share
                scv_o = max(eo2_acc / max(new_eo, 1e-9) ** 2 - 1.0, 0.0)
                fit = _free_space_chain(inp.K, ad["pSK"], new_pa if pa is None else pa, inp.lam,
                                        float(rate_acc[-1]), 1.0 + (scv_o - 1.0) / inp.c)
                K1 = inp.K + 1
                sat = ad["pSK"] * fit
                asat = sat.sum()
                m = min(K1, inp.oS.size)
                eo_sat = float(np.where(inp.fits[:m], inp.oS[:m], 0) @ fit[:m]) / asat
                ep_sat = float(np.where(inp.fits[:m], inp.pSpP[:m], 0) @ fit[:m]) / asat
                eo2_sat = float(np.where(inp.fits[:m], inp.o2S[:m], 0) @ fit[:m]) / asat
                new_pa = theta * new_pa + (1 - theta) * sat / asat
                new_eo = theta * new_eo + (1 - theta) * eo_sat
                new_ep = theta * new_ep + (1 - theta) * ep_sat
                eo2_acc = theta * eo2_acc + (1 - theta) * eo2_sat
                eo_acc = (1 - damp) * eo_acc_prev + damp * new_eo
                ep_acc = (1 - damp) * ep_acc_prev + damp * new_ep
            pa = new_pa if pa is None else 0.5 * pa + 0.5 * new_pa
        done = (abs(wait - wait_prev) <= 1e-3 * max(wait, 1e-2)
                and abs(eo_acc - eo_acc_prev) <= 1e-4 * eo_acc)
        if done and it > 0:
            break
    out = dict(lam_n=lam_n, mu_n=mu_n, pi=pi, w_arr=w_arr, N=N, wait=wait, eo_acc=eo_acc,
               scv_acc=max(eo2_acc / new_eo ** 2 - 1.0, 0.0))
    if model == "knapsack" and pa is not None and "pSK" in ad:
        out["accept_by_size"] = np.where(ad["pSK"] > 0, pa / np.where(ad["pSK"] > 0, ad["pSK"], 1.0), 0.0)
    return out


def _ctmc_inputs(inp: _Inputs, max_levels: int):
    """Size law of the scenario in KV units of ``g = m * block_size`` tokens (``L <= max_levels``
    units), per-unit mean service times by batch size, and the Erlang phase count."""
    e = inp.engine
    mblk = max(1, -(-e.usable_gpu_blocks // int(max_levels)))
    g = mblk * e.block_size
    L = e.usable_gpu_blocks // mblk
    s = np.arange(inp.pS.size)
    fits = inp.fits & (s <= inp.K)
    # mean-preserving rounding: s/g tokens split between floor and ceil (>= 1 unit, <= L)
    lo = np.floor(s / g).astype(np.int64)
    fr = s / g - lo

    def to_units(x):
        out = np.zeros(L + 1)
        xx = np.where(fits, x[: s.size], 0.0)
        np.add.at(out, np.clip(lo, 1, L), xx * (1 - fr))
        np.add.at(out, np.clip(lo + 1, 1, L), xx * fr)
        return out

    pU = to_units(inp.pS)
    pos = pU > 0
    safe = np.where(pos, pU, 1.0)
    eo = np.where(pos, to_units(inp.oS) / safe, 0.0)
    ep = np.where(pos, to_units(inp.pSpP) / safe, 0.0)
    eo2 = np.where(pos, to_units(inp.o2S) / safe, 0.0)
    tau = np.array([eo * inp.step(b) + inp.pf * (ep + (b - 1) * inp.EP) for b in range(1, inp.c + 1)])
    tau[:, ~pos] = 0.0
    # SCV of the service time within a size class (full batch): given S, tau = S pf + O (d - pf) + const
    d = inp.step(inp.c)
    ps = np.where(fits, inp.pS, 0.0)
    safe_s = np.where(ps > 0, inp.pS, 1.0)
    eo_s = np.where(ps > 0, inp.oS / safe_s, 0.0)
    var_s = np.maximum(np.where(ps > 0, inp.o2S / safe_s, 0.0) - eo_s ** 2, 0.0)
    tau_s = s * inp.pf + eo_s * (d - inp.pf) + (inp.c - 1) * inp.EP * inp.pf
    scv_within = float(ps @ (var_s * (d - inp.pf) ** 2)) / max(float(ps @ tau_s ** 2), 1e-300)
    phases = int(min(4, max(1, round(1.0 / max(scv_within, 1e-9)))))
    return dict(p=pU, L=L, g=g, tau=tau, eo=eo, ep=ep, eo2=eo2, phases=phases, lo=lo, fr=fr, fits=fits)


def _solve_ctmc(inp: _Inputs, max_levels: int):
    ci = _ctmc_inputs(inp, max_levels)
    ch = kv_ctmc(inp.lam, ci["p"], ci["L"], inp.c, ci["tau"], phases=ci["phases"])
    N = ch.max_in_system
    lam_n = ch.level_up[:N].copy()
    mu_n = ch.level_down[1:N + 1].copy()
    # levels never visited (probability 0): keep the chain well defined
    mu_n[mu_n <= 0] = max(float(mu_n[mu_n > 0].min()) if np.any(mu_n > 0) else 1.0, 1e-12)
    pi = ch.level_pi
    acc = np.concatenate([lam_n, [0.0]]) * pi
    w_arr = acc / acc.sum()
    a = ch.accepted_pmf
    eo_acc = float(a @ ci["eo"])
    eo2_acc = float(a @ ci["eo2"])
    ep_acc = float(a @ ci["ep"])
    sol = dict(lam_n=lam_n, mu_n=mu_n, pi=pi, w_arr=w_arr, N=N, eo_acc=eo_acc, ep_acc=ep_acc,
               scv_acc=max(eo2_acc / eo_acc ** 2 - 1.0, 0.0), chain=ch, ctmc=ci,
               blocking=ch.blocking)
    sol["wait_comps"] = _ctmc_waits(ch, ci)
    # admission probability by size in tokens (the unit split of each size, as in the chain)
    A = 1.0 - ch.class_blocking[: ci["L"] + 1]
    lo, fr, L = ci["lo"], ci["fr"], ci["L"]
    sol["accept_by_size"] = np.where(ci["fits"], (1 - fr) * A[np.clip(lo, 1, L)] + fr * A[np.clip(lo + 1, 1, L)], 0.0)
    return sol


def _ctmc_waits(ch: KVChain, ci, groups: int = 160):
    """Queueing delay of an admitted arrival that finds every batch slot busy, from the
    joint state ``(n, T, k)`` it finds (model ``"ctmc"``).

    It waits for ``n - c + 1`` departures. ``c = 1``: the rest of the service in
    progress (``(m - k)/m`` of the in-service request's class mean, classes
    weighted by the chain's in-service law given ``(n, T)``) plus the services of
    the ``n - 1`` waiting requests (iid given their total, as in the chain).
    ``c > 1``: the rest of the departure clock (``m - k`` phases at rate
    ``m mu(n, T)``) plus ``n - c`` inter-departure times of a full batch, each
    ``E[tau_c | waiting, n, T] / c``. Within a class a service is Erlang-``m``;
    between classes only the part of ``tau(u)`` that is not linear in ``u``
    adds variance (the total of the sizes, hence the linear part, is fixed by
    ``T``). Returns gamma components ``(weight, mean, var)`` (weights: share of
    admitted arrivals), the states pooled into ``groups`` groups of similar
    mean (moments matched).
    """
    p, L, m, c = ci["p"], ci["L"], ci["phases"], ci["tau"].shape[0]
    tau = ci["tau"][c - 1]                             # service with a full batch
    pos = p > 0
    Z = float(p @ tau)
    w = p / p.sum()
    r = p * tau / Z
    v_in = 1.0 / m                                     # within-class SCV of a service
    u = np.arange(L + 1, dtype=float)
    X = np.stack([np.ones(pos.sum()), u[pos]], axis=1) * np.sqrt(w[pos])[:, None]
    coef = np.linalg.lstsq(X, tau[pos] * np.sqrt(w[pos]), rcond=None)[0]
    eps = np.where(pos, tau - coef[0] - coef[1] * u, 0.0)   # tau(u) minus its linear fit in u
    N = ch.max_in_system
    Wp = _scaled_powers(w, N, L)
    Rp = _scaled_powers(r, c, L)
    wt = ch.pi * ch.accept
    mean = np.zeros(ch.pi.size)
    var = np.zeros(ch.pi.size)
    conv_at = lambda f, C, T: np.convolve(f, C[0])[: L + 1][T]
    for n in range(c, N):
        sel = np.nonzero((ch.n == n) & (wt > 0))[0]
        if sel.size == 0:
            continue
        T, k = ch.used[sel], ch.phase[sel]
        Cn = _scaled_conv(Rp[c], Wp[n - c], L)          # total of c in service + (n - c) waiting
        den = Cn[0][T]
        frac = (m - k) / m                             # phases left
        if c == 1:
            Cb = Wp[n - 1]                             # ... without the one in service
            sc = math.exp(Cb[1] - Cn[1]) / den
            e_in = conv_at(r * tau, Cb, T) * sc
            e2_in = conv_at(r * tau ** 2, Cb, T) * sc
            m_in = frac * e_in
            v_r = frac ** 2 * np.maximum(e2_in - e_in ** 2, 0.0) + (m - k) / m ** 2 * e2_in
        else:
            mu = ch.departure_rate[sel]
            m_in = frac / mu
            v_r = (m - k) / (m * mu) ** 2
        mw = np.zeros(sel.size)
        vw = np.zeros(sel.size)
        if n > c:
            Cw = _scaled_conv(Rp[c], Wp[n - c - 1], L)  # one waiting request removed
            sc = math.exp(Cw[1] - Cn[1]) / den
            e1 = conv_at(w * tau, Cw, T) * sc
            e2 = conv_at(w * tau ** 2, Cw, T) * sc
            r1 = conv_at(w * eps, Cw, T) * sc
            r2 = conv_at(w * eps ** 2, Cw, T) * sc
            mw = (n - c) * e1 / c
            vw = (n - c) * (e2 * v_in + np.maximum(r2 - r1 ** 2, 0.0)) / c ** 2
        mean[sel] = m_in + mw
        var[sel] = np.maximum(v_r + vw, 1e-18)
    keep = (wt > 0) & (ch.n >= c) & (mean > 0)
    wt, mean, var = wt[keep], mean[keep], var[keep]
    out = []
    if wt.size == 0:
        return out
    wt = wt / (ch.pi @ ch.accept)
    order = np.argsort(mean)
    wt, mean, var = wt[order], mean[order], var[order]
    cw = np.cumsum(wt)
    gid = np.minimum((cw / cw[-1] * groups).astype(int), groups - 1)
    for g in np.unique(gid):
        s = gid == g
        W = wt[s].sum()
        mu = float(wt[s] @ mean[s]) / W
        v = float(wt[s] @ (var[s] + mean[s] ** 2)) / W - mu ** 2
        out.append((float(W), mu, max(v, 1e-18)))
    return out


def _ttft_distribution(inp: _Inputs, sol):
    """TTFT law (as the client sees it) on a grid: returns (t, cdf, mean)."""
    from scipy import stats
    c, pi, w_arr, mu_n, N = inp.c, sol["pi"], sol["w_arr"], sol["mu_n"], sol["N"]
    lam_eff = float(np.concatenate([sol["lam_n"], [0.0]]) @ pi)
    # service-time SCV (O steps) -> SCV of the inter-departure times of a full batch
    scv_s = sol["scv_acc"]                  # SCV of the output length of accepted requests
    scv_dep = 1.0 + (scv_s - 1.0) / c
    mu_full = np.concatenate([mu_n, [mu_n[-1]]])
    comps = []  # (weight, kind, shift, a, b): kind 0 atom at shift, 1 uniform [shift, shift+a], 2 gamma
    for k in range(N + 1):
        wk = w_arr[k]
        if wk < 1e-14:
            continue
        if k == 0:
            comps.append((wk, 0, inp.step(1) - inp.step(1), 0.0, 0.0))  # idle: step starts now
            continue
        b_dec = min(k, c - 1) if k >= c else k
        first = inp.step(max(b_dec, 1)) if b_dec >= 1 else inp.lat.base_s
        first_extra = first - inp.lat.base_s
        if k >= c and "wait_comps" in sol:
            continue
        if k < c:
            d = inp.step(k)
            phi = min(1.0, lam_eff * d)          # share of steps that carry a prefill
            dp = d + inp.EP * inp.pf
            wa, wb = (1 - phi) * d, phi * dp
            comps.append((wk * wa / (wa + wb), 1, first_extra, d, 0.0))
            comps.append((wk * wb / (wa + wb), 1, first_extra, dp, 0.0))
        else:
            rates = mu_full[c:k + 1]             # departures from states k+1 .. c+1
            means = 1.0 / rates[::-1]            # first departure from state k+1
            m1 = means[0] * (1.0 + scv_s) / 2.0     # Allen-Cunneen residual factor
            mean = m1 + means[1:].sum()
            var = scv_dep * (m1 ** 2 + np.sum(means[1:] ** 2))
            comps.append((wk, 2, first_extra, mean, var))
    if "wait_comps" in sol:                      # waits from the joint chain (model "ctmc", c = 1)
        first_extra = (inp.step(c - 1) if c > 1 else inp.lat.base_s) - inp.lat.base_s
        comps.extend((wk, 2, first_extra, mean, var) for wk, mean, var in sol["wait_comps"])
    # grid
    p_hi = np.nonzero(inp.pP > 0)[0].max()
    tmax = inp.lat.base_s * 2 + p_hi * inp.pf + inp.step(c) * 2
    for w, kind, sh, a, v in comps:
        tmax = max(tmax, sh + (a if kind == 1 else (a + 12 * math.sqrt(v) if kind == 2 else 0.0))
                   + p_hi * inp.pf + 2 * inp.lat.base_s)
    M = 1 << 16
    dt = tmax / M
    grid = np.arange(M + 1) * dt
    dens = np.zeros(M + 1)                      # probability mass of D (delay + extra step) per cell
    mean_D = 0.0
    for w, kind, sh, a, v in comps:
        if kind == 2 and not v > 1e-12 * a * a:
            # (no variability: one server and fixed outputs make the departures deterministic, scv 0; a gamma
            # of infinite shape is an atom at its mean, where its CDF would be NaN)
            kind, sh = 0, sh + a
        if kind == 0 or (kind == 1 and a <= 0):
            i = min(int(round(sh / dt)), M)
            dens[i] += w
            mean_D += w * sh
        elif kind == 1:
            cdf = np.clip((grid - sh) / a, 0.0, 1.0)
            dens[1:] += w * np.diff(cdf)
            mean_D += w * (sh + a / 2)
        else:
            shape, scale = a * a / v, v / a
            sd = math.sqrt(v)
            lo = sh + (max(0.0, a - 12.0 * sd) if shape > 4 else 0.0)
            i0 = max(int(lo / dt) - 1, 0)
            i1 = min(int((sh + a + 16.0 * sd) / dt) + 2, M)
            cdf = np.ones(M + 1)
            cdf[:i0] = 0.0
            stride = max(1, int(sd / dt / 64))          # smooth on the grid: evaluate sparsely, interpolate
            ii = np.arange(i0, i1 + stride, stride)
            ii[-1] = min(ii[-1], M)
            vals = stats.gamma.cdf(np.maximum(grid[ii] - sh, 0.0), shape, scale=scale)
            cdf[i0:i1 + 1] = np.interp(grid[i0:i1 + 1], grid[ii], vals)
            dens[1:] += w * np.diff(cdf)
            dens[-1] += w * (1 - cdf[-1])
            mean_D += w * (sh + a)
    # own prefill step: base + P * prefill_per_token (+ context cost of the prompt)
    kP = np.arange(inp.pP.size)
    x = inp.lat.base_s + kP * (inp.pf + inp.ctx)
    px = np.zeros(M + 1)
    np.add.at(px, np.minimum(np.round(x / dt).astype(int), M), inp.pP)
    tot = _conv(dens, px)[: M + 1]
    cdf = np.cumsum(tot)
    cdf /= max(cdf[-1], 1e-300)
    mean = inp.ovh + mean_D + float(inp.pP @ x)
    return grid + inp.ovh, cdf, mean, mean_D


def _decode_laws(inp: _Inputs, sol, pO=None):
    """Laws of the inter-token latency (ITL), TPOT and the decode time ``D`` (first
    token to completion) from the chain's law of the number in system.

    A running request emits one token per step, so the pooled ITL sample is the
    step durations, each counted once per request decoding in it. In state ``n``
    (``b = min(n, c)`` running) pure decode steps last ``d(b)`` and come at rate
    ``1/d(b)`` (over the time not spent in prefill steps); a request entering the
    batch (an admitted arrival while ``n < c``, or the head of the queue after a
    departure while ``n > c``) adds one step with its prompt, of duration
    ``step_time(j, P)``, seen by the ``j`` requests decoding beside it (``j = n``,
    resp. ``c - 1``). TPOT of a request with ``O`` tokens: ``(O - 1)`` gaps, of
    which a Poisson number ``M`` (mean ``(O - 1) phi``, ``phi`` the share of
    prefill gaps among all gaps) carry a joiner's prompt; the extra durations are
    iid, their sum given ``M`` gamma-approximated. ``D = (O - 1) TPOT``.
    Returns ``dict(itl=(t, cdf, mean), tpot=(t, cdf, mean), D=(values, probs))``;
    the latter is a discrete law on a grid for the E2E convolution.
    """
    from scipy import stats
    c, pi, N = inp.c, sol["pi"], sol["N"]
    lam_n = np.concatenate([sol["lam_n"], [0.0]])            # rate n -> n+1
    dep = np.concatenate([[0.0], sol["mu_n"]])               # rate n -> n-1
    lat = inp.lat
    ctx_seq = inp.EP + inp.EO / 2.0
    d = np.array([inp.step(max(b, 1)) for b in range(c + 1)])
    # prompt law of the joiners (chunked prefill caps a step's prompt tokens at the budget)
    kP = np.arange(inp.pP.size)
    pP = inp.pP
    budget = inp.engine.max_num_batched_tokens
    pre_w = np.zeros(c + 1)                                   # prefill-step rate by decoders beside it (j)
    for n in range(1, min(c, N + 1)):
        pre_w[n] += pi[n] * lam_n[n]
    if c >= 2 and N > c:
        pre_w[c - 1] += float(pi[c + 1:] @ dep[c + 1:])
    pre_mean = np.zeros(c + 1)
    for j in range(1, c + 1):
        if pre_w[j] > 0:
            x = np.minimum(kP, max(budget - j, 1)) if inp.engine.enable_chunked_prefill else kP
            pre_mean[j] = float(pP @ lat.step_time(j, x, (j + 1) * ctx_seq))
    # decode gaps: time in state n outside prefill steps, b(n) gaps per step of d(b)
    occ = np.zeros(c + 1)
    for n in range(1, N + 1):
        occ[min(n, c)] += pi[n]
    pre_share = np.zeros(c + 1)                               # time share of prefill steps, by b
    for j in range(1, c + 1):
        b_after = min(j + 1, c)
        pre_share[b_after] += pre_w[j] * pre_mean[j]
    dec_rate = np.array([max(occ[b] - pre_share[b], 0.0) * b / d[b] if b else 0.0 for b in range(c + 1)])
    pre_rate = pre_w * np.arange(c + 1)                      # gaps per unit time
    tot = dec_rate.sum() + pre_rate.sum()
    if tot <= 0:                                              # nothing decodes (degenerate)
        dec_rate[1], tot = 1.0, 1.0
    # ITL law: atoms at d(b) and, per j, step_time(j, P) with P ~ prompt law
    vals, probs = [d[1:], ], [dec_rate[1:] / tot]
    extra_m, extra_m2 = 0.0, 0.0
    for j in range(1, c + 1):
        if pre_rate[j] <= 0:
            continue
        x = np.minimum(kP, max(budget - j, 1)) if inp.engine.enable_chunked_prefill else kP
        v = lat.step_time(j, x, (j + 1) * ctx_seq)
        vals.append(np.asarray(v, dtype=float))
        probs.append(pre_rate[j] / tot * pP)
        ex = np.asarray(v, dtype=float) - d[min(j + 1, c)]   # extra over the decode step it replaces
        extra_m += pre_rate[j] * float(pP @ ex)
        extra_m2 += pre_rate[j] * float(pP @ ex ** 2)
    vals, probs = np.concatenate(vals), np.concatenate(probs)
    order = np.argsort(vals)
    vals, probs = vals[order], probs[order]
    itl_cdf = np.cumsum(probs)
    itl_cdf /= itl_cdf[-1]
    itl_mean = float(vals @ probs) / float(probs.sum())
    # TPOT: d_bar + (sum of M extras)/(O - 1), M ~ Poisson((O - 1) phi)
    d_bar = float(dec_rate @ d) / max(dec_rate.sum(), 1e-300)
    phi = pre_rate.sum() / tot
    if pre_rate.sum() > 0:
        mu_e, m2_e = extra_m / pre_rate.sum(), extra_m2 / pre_rate.sum()
    else:
        mu_e, m2_e = 0.0, 0.0
    var_e = max(m2_e - mu_e ** 2, 0.0)
    pO = inp.pO if pO is None else pO
    o = np.arange(2, pO.size)
    po = pO[2:]
    if po.sum() <= 0:                                         # every request has one output token
        nanlaw = (np.array([d_bar]), np.array([1.0]), np.nan)
        return dict(itl=(vals, itl_cdf, itl_mean), tpot=nanlaw, D=(np.array([0.0]), np.array([1.0])),
                    p_single=1.0)
    p_single = float(pO[1] / pO.sum()) if pO.size > 1 else 0.0
    po = po / po.sum()
    # pool output lengths into quantile groups for the joiners' term (smooth in O); the
    # deterministic part (O - 1) d_bar of D keeps the exact O law within each group
    keep = po > 1e-13
    o, po = o[keep], po[keep]
    cpo = np.cumsum(po)
    gid = np.minimum((cpo / cpo[-1] * 80).astype(int), 79)
    groups = np.unique(gid)
    hi_t = d_bar + (mu_e * phi + 10 * math.sqrt(max(phi * (var_e + mu_e ** 2), 1e-30))) + 1e-9
    hi_t = max(hi_t, d_bar + mu_e * 3 + 1e-9)
    tg = np.linspace(d_bar, hi_t, 2001)
    tp_cdf = np.zeros(tg.size)
    k_max = float(o.max() - 1)
    x_max = k_max * phi * mu_e + 12 * math.sqrt(max(k_max * phi * (var_e + mu_e ** 2), 1e-30))
    MD = 1 << 13
    dmax = k_max * d_bar + x_max + 1e-9
    Dg = np.linspace(0.0, dmax, MD + 1)
    dtD = Dg[1]
    D_pdf = np.zeros(MD + 1)
    for g in groups:
        sel = gid == g
        pw = float(po[sel].sum())
        k = float(po[sel] @ o[sel]) / pw - 1.0
        lam_m = k * phi
        # TPOT = d_bar + X / k,  X | M ~ gamma(mean M mu_e, var M var_e) (atom at 0 for M = 0);
        # for many joiners (lam_m > 20) X itself is gamma with the compound-Poisson moments
        if lam_m > 20:
            pm = np.array([0.0, 1.0])
            moments = [(0.0, 0.0), (lam_m * mu_e, lam_m * (var_e + mu_e ** 2))]
        else:
            mmax = int(lam_m + 10 * math.sqrt(lam_m) + 10) if lam_m > 0 else 0
            ms = np.arange(0, mmax + 1)
            pm = stats.poisson.pmf(ms, lam_m) if lam_m > 0 else np.array([1.0])
            moments = [(mm * mu_e, mm * var_e) for mm in ms]
        x_t = (tg - d_bar) * k
        cdf_t = np.full(tg.size, pm[0])
        cdf_X = np.full(MD + 1, pm[0])
        for (mean_x, var_x), pr in zip(moments[1:], pm[1:]):
            if pr < 1e-10:
                continue
            if mean_x <= 0:                           # joiners' prompts cost nothing: an atom at 0
                cdf_t += pr
                cdf_X += pr
                continue
            var_x = max(var_x, (1e-6 * mean_x) ** 2 + 1e-30)
            shape, scale = mean_x ** 2 / var_x, var_x / mean_x
            cdf_t += pr * stats.gamma.cdf(np.maximum(x_t, 0.0), shape, scale=scale)
            cdf_X += pr * stats.gamma.cdf(Dg, shape, scale=scale)
        tp_cdf += pw * cdf_t
        fX = np.diff(np.concatenate([[0.0], cdf_X]))
        atoms = np.zeros(MD + 1)
        np.add.at(atoms, np.minimum(np.round((o[sel] - 1) * d_bar / dtD).astype(int), MD), po[sel])
        D_pdf += _conv(atoms, fX)[: MD + 1]
    tp_cdf = np.minimum(tp_cdf / tp_cdf[-1], 1.0)
    tpot_mean = d_bar + phi * mu_e
    # D of single-token requests is 0
    D_pdf = (1.0 - p_single) * D_pdf / max(D_pdf.sum(), 1e-300)
    D_pdf[0] += p_single
    return dict(itl=(vals, itl_cdf, itl_mean), tpot=(tg, tp_cdf, tpot_mean), D=(Dg, D_pdf),
                p_single=p_single)


def _e2e_law(t, cdf, ovh_free_D):
    """E2E = TTFT + D, the two taken independent: CDF on a grid."""
    Dg, D_pdf = ovh_free_D
    t_hi = _quantile(t, cdf, 0.99999) + Dg[-1]
    M = 1 << 14
    grid = np.linspace(0.0, t_hi, M + 1)
    dt = grid[1]
    F = np.interp(grid, t, cdf, left=0.0, right=1.0)
    f = np.diff(np.concatenate([[0.0], F]))
    g = np.zeros(M + 1)
    np.add.at(g, np.minimum(np.round(Dg / dt).astype(int), M), D_pdf)
    h = _conv(f, g)[: M + 1]
    out = np.cumsum(h)
    return grid, np.minimum(out / max(out[-1], 1e-300), 1.0)


def _quantile_step(vals, cdf, q):
    """Quantile (generalised inverse) of a discrete law: values sorted, cdf cumulative."""
    return float(vals[min(int(np.searchsorted(cdf, q - 1e-12)), vals.size - 1)])


def _accepted_output_law(inp: _Inputs, sol):
    """Output-length law of the admitted requests: ``P(O = o) E_P[P(admit | P + o)]``."""
    from scipy import signal
    acc = sol.get("accept_by_size")
    if acc is None:
        return inp.pO
    n = inp.pO.size
    acc = np.asarray(acc, dtype=float)
    need = inp.pP.size + n
    if acc.size < need:
        acc = np.concatenate([acc, np.zeros(need - acc.size)])
    # h(o) = sum_P pP(P) acc(P + o)
    h = signal.fftconvolve(acc[: need], inp.pP[::-1])[inp.pP.size - 1: inp.pP.size - 1 + n]
    out = inp.pO * np.clip(h, 0.0, None)
    return out / out.sum() if out.sum() > 0 else inp.pO


def _quantile(t, cdf, q):
    i = int(np.searchsorted(cdf, q))
    if i <= 0:
        return float(t[0])
    if i >= t.size:
        return float(t[-1])
    c0, c1 = cdf[i - 1], cdf[i]
    f = 0.0 if c1 <= c0 else (q - c0) / (c1 - c0)
    return float(t[i - 1] + f * (t[i] - t[i - 1]))


def predict(scenario: Scenario, model: str = "auto", *, finite_run: bool = True,
            max_kv_levels: int = 128) -> pd.DataFrame:
    """Analytical estimates of a scenario's metrics.

    Parameters
    ----------
    scenario : Scenario
        FCFS, continuous batching, Poisson arrivals, independent prompt and
        output laws, drained runs; any admission mode (``"none"`` ignores
        preemptions). Other features raise ``ValueError``.
    model : {"auto", "knapsack", "birth_death", "ctmc"}
        ``"auto"`` (default): ``"ctmc"`` for ``admission="kv_reservation"``,
        else ``"knapsack"``.
        ``"ctmc"`` (the most accurate, ``admission="kv_reservation"`` only)
        solves the joint chain on requests in system and KV reserved;
        ``"knapsack"`` and ``"birth_death"`` are chains on the number in system
        (any admission mode). See ``docs/analytical.md``.
    finite_run : bool
        Correct the throughputs/goodput for the per-run window of
        ``num_requests - warmup_requests`` measured requests (the run's tail
        drains after the last arrival), as ``replicate`` measures them.
        ``False`` gives the steady-state rates.
    max_kv_levels : int
        ``"ctmc"`` only: at most this many KV units; a unit is
        ``ceil(num_gpu_blocks / max_kv_levels)`` blocks (sizes are split between
        the two nearest units, preserving the mean). Larger is finer and slower
        (the level solve grows as its cube).

    Returns
    -------
    pandas.DataFrame
        Indexed by metric (the names of ``replicate(...).summary()``),
        columns ``estimate`` and ``description``; NaN where not modelled
        (``preemptions_per_request``, ``kv_utilization_mean``).

    Raises
    ------
    ValueError
        For an unknown model, a scenario feature the model cannot represent
        (the message names it), or ``admission="none"`` beyond capacity.
    """
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    if model == "auto":
        model = "ctmc" if scenario.engine.admission == "kv_reservation" else "knapsack"
    _check_supported(scenario, model)
    if model == "ctmc" and (int(max_kv_levels) != max_kv_levels or max_kv_levels < 1):
        raise ValueError(f"max_kv_levels must be an integer >= 1, got {max_kv_levels!r}")
    inp = _Inputs(scenario)
    sol = _solve_ctmc(inp, max_kv_levels) if model == "ctmc" else _solve(inp, model)
    pi, N, c = sol["pi"], sol["N"], inp.c
    if inp.admission == "none" and pi[-1] > 1e-6:
        raise ValueError("the load exceeds the service capacity (admission='none' gives an unstable queue); "
                         "no steady state to predict")
    lam_acc = np.concatenate([sol["lam_n"], [0.0]])
    lam_eff = float(lam_acc @ pi)
    # A sum of non-negative terms (1 - lam_eff / lam can round below 0, and
    # an acceptance probability above 1). Without admission control the
    # chain's top state only truncates it: there, only requests that never
    # fit are refused, as in every other state.
    refused = np.maximum(inp.lam - lam_acc, 0.0) * pi
    if inp.admission == "none":
        refused[-1] = max(inp.lam - float(lam_acc[-2]), 0.0) * pi[-1] if N > 0 else 0.0
    blocking = float(refused.sum()) / inp.lam
    n = np.arange(N + 1)
    b = np.minimum(n, c)
    t, cdf, ttft_mean, _ = _ttft_distribution(inp, sol)
    pO_acc = _accepted_output_law(inp, sol)
    eo_acc = float(pO_acc @ np.arange(pO_acc.size))
    dl = _decode_laws(inp, sol, pO_acc)
    tg, tp_cdf, tpot = dl["tpot"]
    iv, icdf, itl_mean = dl["itl"]
    Dg, D_pdf = dl["D"]
    e2e = ttft_mean + float(Dg @ D_pdf)
    eg, ecdf = _e2e_law(t, cdf, dl["D"])
    thr = lam_eff
    if finite_run:
        window = max(inp.n_meas - 1, 1) / inp.lam + e2e
        thr = inp.n_meas * (1.0 - blocking) / window
    est = {
        "ttft_mean": ttft_mean,
        "ttft_p50": _quantile(t, cdf, 0.50),
        "ttft_p90": _quantile(t, cdf, 0.90),
        "ttft_p95": _quantile(t, cdf, 0.95),
        "ttft_p99": _quantile(t, cdf, 0.99),
        "tpot_mean": tpot,
        "tpot_p50": _quantile(tg, tp_cdf, 0.50) if np.isfinite(tpot) else np.nan,
        "tpot_p99": _quantile(tg, tp_cdf, 0.99) if np.isfinite(tpot) else np.nan,
        "itl_mean": itl_mean,
        "itl_p50": _quantile_step(iv, icdf, 0.50),
        "itl_p99": _quantile_step(iv, icdf, 0.99),
        "e2e_mean": e2e,
        "e2e_p50": _quantile(eg, ecdf, 0.50),
        "e2e_p99": _quantile(eg, ecdf, 0.99),
        "request_throughput": thr,
        "output_throughput": thr * eo_acc,
        "goodput": thr if scenario.ttft_slo_s is None and scenario.tpot_slo_s is None else np.nan,
        "blocking_probability": blocking,
        "drop_probability": 0.0,
        "batch_occupancy_mean": float(pi @ b) / c,
        "queue_depth_mean": float(pi @ np.maximum(n - c, 0)),
    }
    if scenario.ttft_slo_s is not None or scenario.tpot_slo_s is not None:
        # TTFT and TPOT taken independent; single-token requests meet any TPOT SLO
        f_ttft = float(np.interp(scenario.ttft_slo_s, t, cdf)) if scenario.ttft_slo_s is not None else 1.0
        f_tpot = 1.0
        if scenario.tpot_slo_s is not None and np.isfinite(tpot):
            f_tpot = dl["p_single"] + (1 - dl["p_single"]) * float(
                np.interp(scenario.tpot_slo_s, tg, tp_cdf, left=0.0, right=1.0))
        est["goodput"] = thr * f_ttft * f_tpot
    rows = {m: est.get(m, np.nan) for m in METRIC_DESCRIPTIONS}
    frame = pd.DataFrame({"estimate": pd.Series(rows, dtype=float)})
    frame.index.name = "metric"
    frame["description"] = [METRIC_DESCRIPTIONS[m] for m in frame.index]
    frame.attrs["model"] = model
    return frame
