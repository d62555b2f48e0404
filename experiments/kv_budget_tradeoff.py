"""KV budget vs blocking and tail latency under KV-reservation admission.

The claim: with KV-reservation admission (each request reserves its
``prompt + output`` tokens at arrival and is rejected if they do not fit), a
larger KV budget lowers blocking but can raise p99 TTFT, because it admits more
load than the batch can serve; so the budget trades blocking against tail
latency and goodput has an interior optimum.

Setting (the EE384S study's configuration family): ``max_num_seqs=8``,
``admission="kv_reservation"``, prompt ``LogNormal(median=256, sigma=0.55)``,
output ``LogNormal(median=128, sigma=0.70)``, Poisson arrivals,
``LatencyModel.default()`` (A10G), goodput SLOs TTFT <= 0.5 s and TPOT <= 50 ms.
The KV budget (``num_gpu_blocks * 16`` tokens) runs from 1,024 to 32,768 tokens
at several arrival rates, below and above the server's capacity.

All budgets at one rate are run by ``fastsim.compare`` with one seed (common
random numbers: replication ``r`` sees the same requests at every budget, and,
rescaled, at every rate), so the change between neighbouring budgets has a
paired interval (``delta_<metric>`` rows) that is far tighter than the
per-budget intervals: that is what makes the *shape* (where goodput peaks)
certain. Estimates are means over replications of per-run metrics (each run
``num_requests`` arrivals after ``warmup_requests``) with 95 % Student-t
intervals.

Outputs (``--out``, default ``experiments/output/kv_budget_tradeoff``):
``kv_budget_tradeoff.csv`` (tidy: one row per rate x budget x metric with
``estimate``, ``ci_low``, ``ci_high``, ``n``; ``delta_*`` metrics are paired
differences budget minus the next smaller budget) and ``kv_budget_tradeoff.png``;
the full mode copies the figure to ``docs/img/exp_kv_budget_tradeoff.png``.

    python experiments/kv_budget_tradeoff.py            # full, ~3.5 min on 2 busy cores (85 s of CPU)
    python experiments/kv_budget_tradeoff.py --quick    # seconds (tests/test_experiments.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root: fastsim
sys.path.insert(0, str(HERE))  # experiments/: _common

import fastsim  # noqa: E402
from _common import fmt, paired_diff_ci, run_experiment, save_figure  # noqa: E402

NAME = "kv_budget_tradeoff"
MAX_NUM_SEQS = 8
BLOCK = 16
METRICS = ["blocking_probability", "ttft_mean", "ttft_p50", "ttft_p99", "goodput", "request_throughput",
           "tpot_mean", "queue_depth_mean", "kv_utilization_mean", "preemptions_per_request"]
DELTA_METRICS = ["blocking_probability", "ttft_p99", "goodput"]

FULL = dict(rates=[1, 2, 3, 4, 5, 6, 8], budgets=[1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768],
            requests=2000, warmup=200, replications=150)
QUICK = dict(rates=[2, 8], budgets=[1024, 4096, 32768], requests=500, warmup=50, replications=80)


def scenario(rate: float, budget_tokens: int, cfg: dict) -> fastsim.Scenario:
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=2048, block_size=BLOCK,
                                    num_gpu_blocks=budget_tokens // BLOCK, admission="kv_reservation"),
        workload=fastsim.Workload(arrival_rate=rate, num_requests=cfg["requests"],
                                  warmup_requests=cfg["warmup"],
                                  prompt_len=fastsim.LogNormal(median=256, sigma=0.55),
                                  output_len=fastsim.LogNormal(median=128, sigma=0.70)),
        latency=fastsim.LatencyModel.default(), ttft_slo_s=0.5, tpot_slo_s=0.05)


def run(cfg: dict, seed: int) -> pd.DataFrame:
    rows = []
    for rate in cfg["rates"]:
        scs = {str(b): scenario(rate, b, cfg) for b in cfg["budgets"]}
        res = fastsim.compare(scs, cfg["replications"], seed=seed, metrics=DELTA_METRICS)
        prev = None
        for b in cfg["budgets"]:
            per = res.results[str(b)].per_replication
            summ = res.results[str(b)].summary()
            for m in METRICS:
                r = summ.loc[m]
                rows.append(dict(arrival_rate=rate, kv_budget_tokens=b, metric=m, estimate=r.estimate,
                                 ci_low=r.ci_low, ci_high=r.ci_high, n=int(r.n)))
            if prev is not None:
                for m in DELTA_METRICS:
                    est, lo, hi, n = paired_diff_ci(per[m], prev[m])
                    rows.append(dict(arrival_rate=rate, kv_budget_tokens=b, metric=f"delta_{m}", estimate=est,
                                     ci_low=lo, ci_high=hi, n=n))
            prev = per
        # paired difference of goodput: best budget minus each other budget (the optimum's certainty)
        gp = {b: res.results[str(b)].per_replication["goodput"].to_numpy() for b in cfg["budgets"]}
        best = max(gp, key=lambda b: gp[b].mean())
        for b in cfg["budgets"]:
            if b == best:
                continue
            est, lo, hi, n = paired_diff_ci(gp[best], gp[b])
            rows.append(dict(arrival_rate=rate, kv_budget_tokens=b, metric="goodput_best_minus_this",
                             estimate=est, ci_low=lo, ci_high=hi, n=n))
    return pd.DataFrame(rows)


def get(table, rate, budget, metric) -> pd.Series:
    t = table[(table.arrival_rate == rate) & (table.kv_budget_tokens == budget) & (table.metric == metric)]
    if len(t) != 1:
        raise KeyError((rate, budget, metric, len(t)))
    return t.iloc[0]


def goodput_optimum(table: pd.DataFrame, rate: float) -> dict:
    """The goodput-maximising budget at ``rate`` and whether it is significantly interior:
    its goodput exceeds both the smallest and the largest budget's (paired intervals)."""
    budgets = sorted(table.kv_budget_tokens.unique())
    est = {b: get(table, rate, b, "goodput").estimate for b in budgets}
    best = max(est, key=est.get)
    lo_end = hi_end = None
    if best != budgets[0]:
        lo_end = get(table, rate, budgets[0], "goodput_best_minus_this")
    if best != budgets[-1]:
        hi_end = get(table, rate, budgets[-1], "goodput_best_minus_this")
    interior = (lo_end is not None and hi_end is not None and lo_end.ci_low > 0 and hi_end.ci_low > 0)
    return dict(best=best, interior=interior, vs_smallest=lo_end, vs_largest=hi_end)


def findings(table: pd.DataFrame) -> list[str]:
    lines = []
    rates = sorted(table.arrival_rate.unique())
    budgets = sorted(table.kv_budget_tokens.unique())
    b0, b1 = budgets[0], budgets[-1]
    for rate in rates:
        blk0, blk1 = get(table, rate, b0, "blocking_probability"), get(table, rate, b1, "blocking_probability")
        p0, p1 = get(table, rate, b0, "ttft_p99"), get(table, rate, b1, "ttft_p99")
        opt = goodput_optimum(table, rate)
        g = get(table, rate, opt["best"], "goodput")
        shape = ("interior optimum (paired CIs: above both ends)" if opt["interior"] else
                 "no significant interior optimum")
        ends = []
        for key, b in (("vs_smallest", b0), ("vs_largest", b1)):
            if opt[key] is not None:
                ends.append(f"+{fmt(opt[key])} req/s over {b} tokens")
        lines.append(f"{rate:g} req/s: blocking {fmt(blk0)} at {b0} -> {fmt(blk1)} at {b1} tokens; "
                     f"p99 TTFT {fmt(p0, 1e3)} -> {fmt(p1, 1e3)} ms; goodput best at {opt['best']} tokens "
                     f"{fmt(g)} req/s, {shape}" + (f" ({'; '.join(ends)})" if ends else ""))
    return lines


def plot(table: pd.DataFrame, path: Path, title: str) -> None:
    rates = sorted(table.arrival_rate.unique())
    fig, axes = plt.subplots(2, 3, figsize=(17, 10))
    panels = [("blocking_probability", "blocking probability", 1.0, False),
              ("ttft_p99", "p99 TTFT (ms)", 1e3, True),
              ("goodput", "goodput (req/s, TTFT <= 0.5 s, TPOT <= 50 ms)", 1.0, False),
              ("delta_goodput", "goodput change vs next smaller budget (paired, req/s)", 1.0, False),
              ("queue_depth_mean", "mean queue depth (waiting requests)", 1.0, True)]
    for ax, (metric, label, scale, logy) in zip(axes.flat, panels):
        for j, rate in enumerate(rates):
            t = table[(table.arrival_rate == rate) & (table.metric == metric)].sort_values("kv_budget_tokens")
            x = t.kv_budget_tokens.to_numpy()
            ax.plot(x, t.estimate * scale, "o-", ms=4, color=f"C{j}", label=f"{rate:g} req/s")
            if metric.startswith("delta"):
                ax.errorbar(x, t.estimate * scale, yerr=[(t.estimate - t.ci_low) * scale,
                                                         (t.ci_high - t.estimate) * scale],
                            fmt="none", ecolor=f"C{j}", capsize=3)
            else:
                ax.fill_between(x, t.ci_low * scale, t.ci_high * scale, color=f"C{j}", alpha=0.25, lw=0)
            if metric == "goodput":
                opt = goodput_optimum(table, rate)
                e = get(table, rate, opt["best"], "goodput").estimate
                ax.plot([opt["best"]], [e], marker="*", ms=14, color=f"C{j}",
                        mec="k" if opt["interior"] else f"C{j}")
        if metric.startswith("delta"):
            ax.axhline(0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("KV budget (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    ax = axes.flat[5]
    for j, rate in enumerate(rates):
        b = table[(table.arrival_rate == rate) & (table.metric == "blocking_probability")].sort_values(
            "kv_budget_tokens")
        p = table[(table.arrival_rate == rate) & (table.metric == "ttft_p99")].sort_values("kv_budget_tokens")
        ax.errorbar(b.estimate, p.estimate * 1e3, xerr=[b.estimate - b.ci_low, b.ci_high - b.estimate],
                    yerr=[(p.estimate - p.ci_low) * 1e3, (p.ci_high - p.estimate) * 1e3], fmt="o-", ms=3,
                    color=f"C{j}", capsize=2, label=f"{rate:g} req/s")
    ax.set_yscale("log")
    ax.set_xlabel("blocking probability")
    ax.set_ylabel("p99 TTFT (ms)")
    ax.set_title("the trade-off: each point one KV budget (right: small)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    axes.flat[2].set_title("star: goodput-optimal budget (black edge: above both ends, paired CI)", fontsize=9)
    save_figure(fig, path, title)


def title(cfg: dict, mode: str, seed: int) -> str:
    return (f"KV budget vs blocking and tail latency (kv_reservation, max_num_seqs={MAX_NUM_SEQS}, "
            f"A10G model; {mode}: {cfg['replications']} replications x {cfg['requests']} requests, "
            f"{cfg['warmup']} warm-up, seed {seed}); bands and bars: 95% CIs")


def main(argv=None) -> dict:
    return run_experiment(NAME, __doc__, argv, full=FULL, quick=QUICK, run=run, plot=plot, findings=findings,
                          title=title)


if __name__ == "__main__":
    main()
