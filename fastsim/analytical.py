"""Analytical (queueing-theory) estimates of a fastsim scenario, without simulation.

``predict(scenario, model=...)`` returns a DataFrame indexed by the metric names
of ``replicate(...).summary()`` with one column, ``estimate`` (NaN where a
model does not estimate a metric). Models (assumptions in ``docs/analytical.md``):

* ``"birth_death"``: a birth-death chain on the number of requests in the
  system ``n`` with the admission cap ``N_max = floor(K / E[P+O])`` (``K`` the
  KV capacity in tokens) and the batch-size-dependent service rate
  ``min(n, c) / (E[O] step(min(n, c)) + min(n, c) E[P] prefill_per_token)``.
  Exact stationary law; blocking by PASTA; TTFT as a PASTA-weighted mixture
  of (gamma) waiting times, convolved with the own-prefill step, inverted
  numerically for the percentiles.
* ``"knapsack"`` (recommended): the same chain, but with *distribution-aware*
  admission: given ``n`` in system, the reserved tokens are the sum of ``n``
  sizes drawn from the holding-time-biased size law, conditioned on fitting
  (the lumped form of the stochastic-knapsack / Kaufman–Roberts product form,
  exact for the pure loss system), an arrival is accepted with probability
  ``P(S_new + T_n <= K) / P(T_n <= K)``. While requests queue for a batch
  slot (share ``1 - theta`` of the holding time) the admitted-size law comes
  from a saturated Markov chain on the free KV tokens (arrivals take the
  freed tokens if they fit, so admitted requests are short); the mean wait,
  the admitted-size law and theta are a damped fixed point.

Lower-level, exact functions: :func:`birth_death_stationary`,
:func:`mm1_stationary`, :func:`mmc_stationary`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import signal, stats

from ._config import Scenario
from ._distributions import (KIND_EMPIRICAL, KIND_FIXED, KIND_LOGNORMAL, KIND_REPLAY, KIND_UNIFORM,
                             LengthDistribution)
from ._replicate import METRIC_DESCRIPTIONS

MODELS = ("birth_death", "knapsack")

__all__ = ["MODELS", "birth_death_stationary", "mm1_stationary", "mmc_stationary", "predict",
           "length_pmf"]


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
    if w.arrival_times is not None:
        bad.append("arrival_times (the models need Poisson arrivals)")
    elif w.burstiness != 1.0:
        bad.append(f"burstiness={w.burstiness:g} (the models need Poisson arrivals, burstiness=1)")
    if w.horizon_s is not None:
        bad.append("horizon_s (the models are steady-state; use drained runs)")
    if w.lengths is not None:
        bad.append("lengths=LengthTrace (paired lengths; give independent prompt_len/output_len laws)")
    if len(set(w.priorities)) > 1:
        bad.append("several priority classes")
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
        fits = (s - 1 + e.block_size - 1) // e.block_size <= e.num_gpu_blocks
        if e.max_model_len is not None:
            fits &= s <= e.max_model_len
        if not e.enable_chunked_prefill:
            fits &= s - 1 <= e.max_num_batched_tokens
        self.fits = fits
        self.admission = e.admission
        self.max_waiting = e.max_waiting
        self.K = e.num_gpu_blocks * e.block_size
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
    return dict(lam_n=lam_n, mu_n=mu_n, pi=pi, w_arr=w_arr, N=N, wait=wait, eo_acc=eo_acc,
                scv_acc=max(eo2_acc / new_eo ** 2 - 1.0, 0.0))


def _ttft_distribution(inp: _Inputs, sol):
    """TTFT law (as the client sees it) on a grid: returns (t, cdf, mean)."""
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
            cdf = stats.gamma.cdf(np.maximum(grid - sh, 0.0), shape, scale=scale)
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


def _quantile(t, cdf, q):
    i = int(np.searchsorted(cdf, q))
    if i <= 0:
        return float(t[0])
    if i >= t.size:
        return float(t[-1])
    c0, c1 = cdf[i - 1], cdf[i]
    f = 0.0 if c1 <= c0 else (q - c0) / (c1 - c0)
    return float(t[i - 1] + f * (t[i] - t[i - 1]))


def predict(scenario: Scenario, model: str = "knapsack", *, finite_run: bool = True) -> pd.DataFrame:
    """Analytical estimates of a scenario's metrics.

    Parameters
    ----------
    scenario : Scenario
        FCFS, continuous batching, Poisson arrivals, independent prompt and
        output laws, drained runs; any admission mode (``"none"`` ignores
        preemptions). Other features raise ``ValueError``.
    model : {"knapsack", "birth_death"}
    finite_run : bool
        Correct the throughputs/goodput for the per-run window of
        ``num_requests - warmup_requests`` measured requests (the run's tail
        drains after the last arrival), as ``replicate`` measures them.
        ``False`` gives the steady-state rates.

    Returns
    -------
    pandas.DataFrame
        Indexed by metric (the names of ``replicate(...).summary()``),
        columns ``estimate`` and ``description``; NaN where not modelled.
    """
    _check_supported(scenario, model)
    inp = _Inputs(scenario)
    sol = _solve(inp, model)
    pi, N, c = sol["pi"], sol["N"], inp.c
    if inp.admission == "none" and pi[-1] > 1e-6:
        raise ValueError("the load exceeds the service capacity (admission='none' gives an unstable queue); "
                         "no steady state to predict")
    lam_eff = float(np.concatenate([sol["lam_n"], [0.0]]) @ pi)
    blocking = 1.0 - lam_eff / inp.lam
    n = np.arange(N + 1)
    b = np.minimum(n, c)
    t, cdf, ttft_mean, _ = _ttft_distribution(inp, sol)
    # TPOT: decode step at the batch size a running request sees, plus the prefills
    # of the requests that join (one per admission)
    wb = pi * b
    if wb.sum() > 0:
        step_seen = float(np.sum(wb[1:] * np.array([inp.step(x) for x in b[1:]])) / wb.sum())
    else:
        step_seen = inp.step(1)
    tpot = step_seen * (1.0 + lam_eff * inp.EP * inp.pf)
    e2e = ttft_mean + (inp.EO - 1.0) * tpot
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
        "itl_mean": tpot,
        "e2e_mean": e2e,
        "request_throughput": thr,
        "output_throughput": thr * inp.EO,
        "goodput": thr if scenario.ttft_slo_s is None and scenario.tpot_slo_s is None else np.nan,
        "blocking_probability": blocking,
        "drop_probability": 0.0,
        "batch_occupancy_mean": float(pi @ b) / c,
        "queue_depth_mean": float(pi @ np.maximum(n - c, 0)),
    }
    if scenario.ttft_slo_s is not None and scenario.tpot_slo_s is None:
        est["goodput"] = thr * float(np.interp(scenario.ttft_slo_s, t, cdf))
    rows = {m: est.get(m, np.nan) for m in METRIC_DESCRIPTIONS}
    frame = pd.DataFrame({"estimate": pd.Series(rows, dtype=float)})
    frame.index.name = "metric"
    frame["description"] = [METRIC_DESCRIPTIONS[m] for m in frame.index]
    frame.attrs["model"] = model
    return frame
