"""Actual coverage of ``replicate``'s 95% confidence intervals where the truth is known.

    python experiments/ci_coverage.py [--quick] [--trials K] [--replications N] [--seed S]

Each trial is one complete ``fastsim.replicate(scenario, N, seed=child_k)``
call (children of ``numpy.random.SeedSequence(S)``, so the K calls are
independent); a trial *covers* when ``result.confidence_interval(metric)``
contains the true value. The script prints, per case, the fraction of the K
intervals that cover with a 95% Clopper-Pearson interval on that fraction
(results in docs/coverage.md).

Cases (server = one seat, constant step ``d``, 1-token prompts: an M/G/1
queue in which a request of ``O`` output tokens is served in ``O d`` seconds
and TTFT = queueing delay + d):

(a) mean TTFT vs Pollaczek-Khinchine, O ~ Fixed(10) and Uniform(1, 19) at
    rho = 0.5 and 0.8;
(b) blocking of the single-seat loss system (``admission="queue_limit",
    max_waiting=0``) vs Erlang-B ``a / (1 + a)``;
(c) TTFT p50/p90/p99 in M/D/1 (O = 10, rho = 0.8) against two truths:
    the steady-state quantile (Erlang's / Crommelin's closed form for the
    M/D/1 waiting time) at run lengths 500, 2000 and 8000 requests, and the
    quantity the interval actually estimates, the *expected per-run
    percentile* of a run of that length, computed by a long independent pilot
    (many more replications than all trials together).

``--quick`` (K=60, N=20, shorter runs, small pilot) finishes in well under a
minute and is only a smoke test of the script.
"""

from __future__ import annotations

import argparse
import decimal
import math
import time

import numpy as np
import pandas as pd
from scipy import optimize, stats

import fastsim
from fastsim.testing import erlang_b, mg1_mean_wait

STEP = 0.01


# ------------------------------------------------------------------------------
# Exact values

def pollaczek_khinchine_ttft(lam, law, step=STEP):
    """Mean TTFT of the one-seat server: E[Wq] + d (Pollaczek-Khinchine)."""
    return mg1_mean_wait(lam, law.mean() * step, law.second_moment() * step**2) + step


def md1_wait_cdf(x, lam, service):
    """P(W <= x) for the M/D/1 queueing delay W (Erlang 1909 / Crommelin 1932).

    ``P(W <= x) = (1 - rho) sum_{k=0}^{floor(x/D)} (lam (k D - x))^k / k! exp(-lam (k D - x))``
    with ``rho = lam D < 1``. The terms alternate in sign and grow like
    ``e^{lam x}``, so they are summed in 60-digit decimal arithmetic (exact to
    double precision for any x used here).
    """
    if x < 0:
        return 0.0
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        lam_, d_, x_ = decimal.Decimal(lam), decimal.Decimal(service), decimal.Decimal(x)
        total, fact = decimal.Decimal(0), decimal.Decimal(1)
        for k in range(int(math.floor(x / service)) + 1):
            if k > 0:
                fact *= k
            u = lam_ * (k * d_ - x_)  # <= 0
            total += (u**k if k > 0 else 1) / fact * (-u).exp()
        return float((1 - lam_ * d_) * total)


def md1_wait_quantile(p, lam, service):
    """The p-quantile of the M/D/1 queueing delay (0 when p <= 1 - rho: the atom at 0)."""
    rho = lam * service
    if p <= 1 - rho:
        return 0.0
    hi = service
    while md1_wait_cdf(hi, lam, service) < p:
        hi *= 2
    return optimize.brentq(lambda x: md1_wait_cdf(x, lam, service) - p, 0.0, hi, xtol=1e-14, rtol=1e-13)


def lindley_check(lam, service, n, seed):
    """Empirical M/D/1 waiting-time quantiles from a Lindley recursion (a check of the closed form)."""
    rng = np.random.default_rng(seed)
    inc = service - rng.exponential(1 / lam, n)  # D - (gap to the next arrival)
    # W_{k+1} = max(W_k + D - A_{k+1}, 0) from W_0 = 0 is the reflected walk S_k - min_{j<=k} S_j.
    s = np.concatenate([[0.0], np.cumsum(inc[1:])])
    w = s - np.minimum.accumulate(s)
    return w[n // 10:]


def clopper_pearson(k, n, level=0.95):
    a = 1 - level
    lo = stats.beta.ppf(a / 2, k, n - k + 1) if k > 0 else 0.0
    hi = stats.beta.ppf(1 - a / 2, k + 1, n - k) if k < n else 1.0
    return lo, hi


# ------------------------------------------------------------------------------
# Scenarios and trials

def one_seat(lam, law, num_requests, warmup, **engine):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig.synchronous(max_num_seqs=1, **engine),
        workload=fastsim.Workload(arrival_rate=lam, num_requests=num_requests, prompt_len=1, output_len=law,
                                  warmup_requests=warmup),
        latency=fastsim.LatencyModel.constant(STEP))


def trials(sc, metrics, k, n, seed):
    """K independent ``replicate`` calls; returns {metric: (estimates, lows, highs)}."""
    children = np.random.SeedSequence(seed).spawn(k)
    out = {m: np.empty((k, 3)) for m in metrics}
    for i, child in enumerate(children):
        res = fastsim.replicate(sc, n, seed=child, n_threads=1, progress=False)
        for m in metrics:
            ci = res.confidence_interval(m)
            out[m][i] = res.estimate(m), ci.low, ci.high
    return out


def coverage_row(case, truth_kind, truth, arr, extra=None):
    est, lo, hi = arr[:, 0], arr[:, 1], arr[:, 2]
    k, n = int(np.sum((lo <= truth) & (truth <= hi))), len(est)
    cp_lo, cp_hi = clopper_pearson(k, n)
    row = {"case": case, "truth": truth_kind, "true value": truth, "mean estimate": est.mean(),
           "bias / half-width": (est.mean() - truth) / np.mean((hi - lo) / 2),
           "covered": f"{k}/{n}", "coverage": k / n, "CP 95% low": cp_lo, "CP 95% high": cp_hi,
           "CI below truth": int(np.sum(hi < truth)), "CI above truth": int(np.sum(lo > truth))}
    row.update(extra or {})
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small smoke-test version (< 1 minute)")
    ap.add_argument("--trials", type=int, default=None, help="K, replicate calls per case (default 300)")
    ap.add_argument("--replications", type=int, default=None, help="N per replicate call (default 40)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the table as CSV")
    args = ap.parse_args(argv)
    k = args.trials or (60 if args.quick else 300)
    n = args.replications or (20 if args.quick else 40)
    pilot_reps = 400 if args.quick else 8000
    run_lengths = (500, 2000) if args.quick else (500, 2000, 8000)
    mg1_requests = 1000 if args.quick else 2000
    seeds = iter(np.random.SeedSequence(args.seed).generate_state(64))
    start = time.perf_counter()
    rows = []

    # (a) M/G/1 mean TTFT vs Pollaczek-Khinchine.
    for law in (fastsim.Fixed(10), fastsim.Uniform(1, 19)):
        for rho in (0.5, 0.8):
            lam = rho / (law.mean() * STEP)
            sc = one_seat(lam, law, mg1_requests, mg1_requests // 10)
            res = trials(sc, ["ttft_mean"], k, n, int(next(seeds)))
            rows.append(coverage_row(f"(a) M/G/1 ttft_mean, O~{law}, rho={rho}, {mg1_requests} req",
                                     "Pollaczek-Khinchine", pollaczek_khinchine_ttft(lam, law), res["ttft_mean"]))
            print(f"[{time.perf_counter() - start:6.1f}s] {rows[-1]['case']}: {rows[-1]['covered']}", flush=True)

    # (b) Single-seat loss system vs Erlang-B (insensitive to the service law).
    a = 0.9
    for law in (fastsim.Fixed(12), fastsim.LogNormal(8, 0.9)):
        lam = a / (law.mean() * STEP)
        sc = one_seat(lam, law, mg1_requests, 100, admission="queue_limit", max_waiting=0)
        res = trials(sc, ["blocking_probability"], k, n, int(next(seeds)))
        rows.append(coverage_row(f"(b) M/G/1/1 blocking, O~{law}, a={a}, {mg1_requests} req", "Erlang-B",
                                 erlang_b(1, a), res["blocking_probability"]))
        print(f"[{time.perf_counter() - start:6.1f}s] {rows[-1]['case']}: {rows[-1]['covered']}", flush=True)

    # (c) M/D/1 TTFT quantiles: steady-state truth and the per-run-percentile estimand.
    rho, o = 0.8, 10
    service = o * STEP
    lam = rho / service
    qs = {"ttft_p50": 0.50, "ttft_p90": 0.90, "ttft_p99": 0.99}
    steady = {m: md1_wait_quantile(p, lam, service) + STEP for m, p in qs.items()}
    check = lindley_check(lam, service, 2_000_000 if args.quick else 20_000_000, int(next(seeds)))
    lindley = {m: float(np.quantile(check, p)) + STEP for m, p in qs.items()}
    for num in run_lengths:
        warm = max(100, num // 10)
        sc = one_seat(lam, fastsim.Fixed(o), num, warm)
        pilot = fastsim.replicate(sc, pilot_reps, seed=int(next(seeds)), n_threads=1, progress=False)
        res = trials(sc, list(qs), k, n, int(next(seeds)))
        for m in qs:
            pr = pilot.summary().loc[m]
            extra = {"pilot": f"{pr.estimate:.5f} +- {pr.std_error:.5f} (n={pilot_reps})"}
            case = f"(c) M/D/1 {m}, rho={rho}, {num} req ({warm} warm-up)"
            rows.append(coverage_row(case, "steady state", steady[m], res[m], extra))
            rows.append(coverage_row(case, "per-run percentile (pilot)", pr.estimate, res[m], extra))
        print(f"[{time.perf_counter() - start:6.1f}s] (c) {num} requests done", flush=True)

    wall = time.perf_counter() - start
    table = pd.DataFrame(rows)
    print()
    print(f"M/D/1 steady-state TTFT quantiles (closed form vs Lindley recursion, {check.size} waits):")
    for m in qs:
        print(f"  {m}: {steady[m]:.6f} s  (Lindley {lindley[m]:.6f} s)")
    print()
    print(f"coverage of the 95% intervals: K={k} replicate calls x N={n} replications, seed={args.seed}")
    cols = ["case", "truth", "true value", "mean estimate", "bias / half-width", "covered", "coverage",
            "CP 95% low", "CP 95% high", "CI below truth", "CI above truth"]
    print(to_markdown(table[cols]))
    print(f"\nwall time {wall:.0f} s")
    if args.out:
        table.to_csv(args.out, index=False)
    return table


def to_markdown(frame):
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) >= 0.1 or v == 0 else f"{v:.5f}"
        return str(v)
    head = "| " + " | ".join(frame.columns) + " |"
    sep = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, sep, *body])


if __name__ == "__main__":
    main()
