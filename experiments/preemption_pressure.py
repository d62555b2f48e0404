"""Preemption under memory pressure: shrink the A10G server's KV cache until requests are preempted.

The measured vLLM runs of the A10G server (``experiments/data/``: 0.5-8 req/s,
6,822-27,000 KV blocks) never preempted a request. This experiment takes the
same server (``max_num_seqs=64``, ``max_num_batched_tokens=2048``,
``max_model_len=2048``, blocks of 16 tokens, ``admission="none"`` as in vLLM)
under ShareGPT requests (paired rows of the packaged trace, sampled) at 2, 4
and 8 req/s with ``LatencyModel.default()``, and shrinks ``num_gpu_blocks``
from 6,822 (``gpu_memory_utilization=0.3``) down to 128 blocks (2,048 tokens:
one request of ``max_model_len`` still fits, so nothing is rejected for size).
When a running request cannot get a block the engine preempts the most
recently admitted one by *recompute* (``docs/engine-model.md``): its KV blocks
are freed and its prompt plus the tokens it had generated are prefilled again.

Reported per rate and KV size (every KV size at one rate is run by
``fastsim.compare`` with one seed: common random numbers, so the paired
``diff_*`` rows against the 6,822-block server are tight):

* preemptions per request, TTFT and TPOT (mean and p99), request throughput,
  KV utilisation, batch occupancy;
* ``diff_<metric>``: paired difference vs 6,822 blocks (the cost of memory
  pressure);
* the per-request price of being preempted, from ``fastsim.sample_requests`` +
  ``fastsim.simulate_requests`` on the streams of the first replications: the
  fraction of requests preempted at least once and the mean TPOT of preempted
  minus non-preempted requests *in the same run* (``tpot_gap_preempted``);
* a no-preemption alternative with the same memory: reserve ``max_model_len``
  tokens per running sequence (``max_num_seqs = blocks * 16 // 2048``, so a
  running request can always grow and nothing is ever preempted);
  ``conservative`` rows, and ``diff_vs_conservative_*`` = recompute paging
  minus conservative reservation (paired).

Estimates are means over replications of per-run metrics (1,000-request runs
like one ``vllm bench serve`` run, no warm-up) with 95 % Student-t intervals.

Outputs (``--out``, default ``experiments/output/preemption_pressure``):
``preemption_pressure.csv`` (tidy: one row per rate x KV size x server x metric
with ``estimate``, ``ci_low``, ``ci_high``, ``n``) and ``preemption_pressure.png``;
the full mode copies the figure to ``docs/img/exp_preemption_pressure.png``.

    python experiments/preemption_pressure.py            # full, ~3.5 min on 2 busy cores (2 min of CPU)
    python experiments/preemption_pressure.py --quick    # seconds (tests/test_experiments.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root: fastsim
sys.path.insert(0, str(HERE))  # experiments/: _common

import fastsim  # noqa: E402
from _common import MEASURED_ENGINE, fmt, mean_ci, paired_diff_ci, run_experiment, save_figure  # noqa: E402

NAME = "preemption_pressure"
ENGINE = fastsim.EngineConfig(**MEASURED_ENGINE)
BASE_BLOCKS = ENGINE.num_gpu_blocks
METRICS = ["preemptions_per_request", "ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99", "e2e_mean",
           "request_throughput", "output_throughput", "kv_utilization_mean", "batch_occupancy_mean",
           "blocking_probability"]
DIFF_METRICS = ["preemptions_per_request", "ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99",
                "request_throughput"]

FULL = dict(rates=[2, 4, 8], blocks=[6822, 2048, 1024, 768, 512, 384, 320, 256, 192, 160, 128],
            requests=1000, replications=150, detail_replications=30)
QUICK = dict(rates=[4], blocks=[6822, 320, 192], requests=300, replications=30, detail_replications=8)


def scenario(rate: float, n: int) -> fastsim.Scenario:
    wl = fastsim.Workload(arrival_rate=rate, num_requests=n, lengths=fastsim.sharegpt_lengths("sample"))
    return fastsim.Scenario(engine=ENGINE, workload=wl, latency=fastsim.LatencyModel.default())


def conservative_seqs(blocks: int) -> int:
    """Sequences that fit if each reserves max_model_len tokens (never preempts)."""
    return max(1, min(ENGINE.max_num_seqs, blocks * ENGINE.block_size // ENGINE.max_model_len))


def per_request_detail(sc: fastsim.Scenario, seed: int, n_rep: int) -> dict:
    """Per-replication: fraction of requests preempted, mean TPOT of preempted minus not preempted."""
    frac, gap, extra_pre = [], [], []
    for r in range(n_rep):
        req = fastsim.sample_requests(sc, seed=seed, replication=r)
        sim = fastsim.simulate_requests(sc, req)
        done = (sim["status"] == "completed").to_numpy() & (sim["output_len"].to_numpy() >= 2)
        out = sim["output_len"].to_numpy()
        tpot = np.full(out.size, np.nan)
        tpot[done] = (sim["e2e_s"] - sim["ttft_s"]).to_numpy()[done] / (out[done] - 1)
        pre = sim["num_preemptions"].to_numpy() > 0
        frac.append(pre.mean())
        a, b = tpot[done & pre], tpot[done & ~pre]
        gap.append(a.mean() - b.mean() if a.size and b.size else np.nan)
        extra_pre.append(sim["num_preemptions"].to_numpy()[pre].mean() if pre.any() else np.nan)
    return {"fraction_preempted": np.array(frac), "tpot_gap_preempted": np.array(gap),
            "preemptions_per_preempted_request": np.array(extra_pre)}


def run(cfg: dict, seed: int) -> pd.DataFrame:
    rows = []
    for rate in cfg["rates"]:
        base = scenario(rate, cfg["requests"])
        scs = {}
        for b in cfg["blocks"]:
            scs[f"paged_{b}"] = base.replace(**{"engine.num_gpu_blocks": b})
            scs[f"conservative_{b}"] = base.replace(**{"engine.num_gpu_blocks": b,
                                                       "engine.max_num_seqs": conservative_seqs(b)})
        res = fastsim.compare(scs, cfg["replications"], seed=seed, metrics=DIFF_METRICS)
        ref = res.results[f"paged_{BASE_BLOCKS}"].per_replication
        for b in cfg["blocks"]:
            for server in ("paged", "conservative"):
                r = res.results[f"{server}_{b}"]
                cfgrow = dict(arrival_rate=rate, num_gpu_blocks=b, server=server,
                              max_num_seqs=r.scenario.engine.max_num_seqs)
                summ = r.summary()
                for m in METRICS:
                    s = summ.loc[m]
                    rows.append({**cfgrow, "metric": m, "estimate": s.estimate, "ci_low": s.ci_low,
                                 "ci_high": s.ci_high, "n": int(s.n)})
                per = r.per_replication
                for m in DIFF_METRICS:
                    est, lo, hi, n = paired_diff_ci(per[m], ref[m])
                    rows.append({**cfgrow, "metric": f"diff_{m}", "estimate": est, "ci_low": lo,
                                 "ci_high": hi, "n": n})
            paged = res.results[f"paged_{b}"].per_replication
            cons = res.results[f"conservative_{b}"].per_replication
            for m in DIFF_METRICS:
                est, lo, hi, n = paired_diff_ci(paged[m], cons[m])
                rows.append(dict(arrival_rate=rate, num_gpu_blocks=b, server="paged-conservative",
                                 max_num_seqs=ENGINE.max_num_seqs, metric=f"diff_vs_conservative_{m}",
                                 estimate=est, ci_low=lo, ci_high=hi, n=n))
            if b != BASE_BLOCKS and cfg["detail_replications"]:
                detail = per_request_detail(scs[f"paged_{b}"], seed, cfg["detail_replications"])
                for m, x in detail.items():
                    est, lo, hi, n = mean_ci(x)
                    rows.append(dict(arrival_rate=rate, num_gpu_blocks=b, server="paged",
                                     max_num_seqs=ENGINE.max_num_seqs, metric=m, estimate=est, ci_low=lo,
                                     ci_high=hi, n=n))
    return pd.DataFrame(rows)


def get(table, rate, blocks, metric, server="paged") -> pd.Series:
    t = table[(table.arrival_rate == rate) & (table.num_gpu_blocks == blocks) & (table.metric == metric)
              & (table.server == server)]
    if len(t) != 1:
        raise KeyError((rate, blocks, metric, server, len(t)))
    return t.iloc[0]


def onset(table, rate) -> int | None:
    """The largest KV size whose preemptions per request are significantly above 0."""
    blocks = sorted(table.num_gpu_blocks.unique(), reverse=True)
    hit = [b for b in blocks if get(table, rate, b, "preemptions_per_request").ci_low > 0]
    return hit[0] if hit else None


def findings(table: pd.DataFrame) -> list[str]:
    lines = []
    blocks = sorted(table.num_gpu_blocks.unique())
    small = blocks[0]
    for rate in sorted(table.arrival_rate.unique()):
        on = onset(table, rate)
        first = f"first significant at {on} blocks ({on * 16} tokens)" if on else "never significant"
        on = None if on is None else int(on)
        pre = get(table, rate, small, "preemptions_per_request")
        thr = get(table, rate, small, "diff_request_throughput")
        ttft = get(table, rate, small, "diff_ttft_mean")
        tpot = get(table, rate, small, "diff_tpot_mean")
        lines.append(f"{rate:g} req/s: preemptions {first}; at {small} blocks {fmt(pre)} per request, vs "
                     f"{BASE_BLOCKS} blocks: throughput {fmt(thr)} req/s, mean TTFT +{fmt(ttft)} s, "
                     f"mean TPOT +{fmt(tpot, 1e3)} ms")
        measured = [b for b in blocks[::-1] if b != BASE_BLOCKS
                    and np.isfinite(get(table, rate, b, "tpot_gap_preempted").ci_low)
                    and get(table, rate, b, "fraction_preempted").ci_low > 0]
        if measured:
            b = measured[0]
            gap = get(table, rate, b, "tpot_gap_preempted")
            fr = get(table, rate, b, "fraction_preempted")
            lines.append(f"  at {b} blocks: {fmt(fr)} of requests preempted at least once; their mean TPOT is "
                         f"{fmt(gap, 1e3)} ms above the other requests' in the same run")
        better = [int(b) for b in blocks if get(table, rate, b, "diff_vs_conservative_request_throughput",
                                                 "paged-conservative").ci_low > 0]
        worse = [int(b) for b in blocks if get(table, rate, b, "diff_vs_conservative_request_throughput",
                                                "paged-conservative").ci_high < 0]
        lines.append(f"  recompute paging vs conservative max_model_len reservation (throughput, paired): "
                     f"higher at {better or 'no'} blocks, lower at {worse or 'no'} blocks")
    return lines


def plot(table: pd.DataFrame, path: Path, title: str) -> None:
    rates = sorted(table.arrival_rate.unique())
    fig, axes = plt.subplots(2, 3, figsize=(17, 10))
    panels = [("preemptions_per_request", "preemptions per request", 1.0, False, ("paged",)),
              ("ttft_mean", "TTFT (s): mean (solid), p99 (dashed)", 1.0, True, ("paged",)),
              ("tpot_mean", "TPOT (ms): mean (solid), p99 (dashed)", 1e3, True, ("paged",)),
              ("request_throughput", "request throughput (req/s): paged (solid), conservative (dotted)", 1.0,
               False, ("paged", "conservative")),
              ("tpot_gap_preempted", "TPOT of preempted minus other requests, same run (ms)", 1e3, False,
               ("paged",)),
              ("kv_utilization_mean", "KV utilisation (solid), batch occupancy (dashed)", 1.0, False,
               ("paged",))]
    second = {"ttft_mean": "ttft_p99", "tpot_mean": "tpot_p99", "kv_utilization_mean": "batch_occupancy_mean"}
    for ax, (metric, label, scale, logy, servers) in zip(axes.flat, panels):
        for j, rate in enumerate(rates):
            for server in servers:
                for m, ls in ((metric, "-" if server == "paged" else ":"), (second.get(metric), "--")):
                    if m is None:
                        continue
                    t = table[(table.arrival_rate == rate) & (table.metric == m) & (table.server == server)]
                    t = t.sort_values("num_gpu_blocks")
                    if t.empty:
                        continue
                    x = t.num_gpu_blocks.to_numpy()
                    lab = f"{rate:g} req/s" if (ls == "-") else None
                    ax.plot(x, t.estimate * scale, ls=ls, marker="o", ms=3, color=f"C{j}", label=lab)
                    ax.fill_between(x, t.ci_low * scale, t.ci_high * scale, color=f"C{j}", alpha=0.2, lw=0)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.axvline(BASE_BLOCKS, color="0.5", lw=0.8, ls=":")
        ax.set_xlabel("num_gpu_blocks (x 16 tokens)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    save_figure(fig, path, title)


def title(cfg: dict, mode: str, seed: int) -> str:
    return (f"Preemption under memory pressure: A10G server (max_num_seqs=64), ShareGPT, "
            f"shrinking KV cache ({mode}: {cfg['replications']} replications x {cfg['requests']} "
            f"requests, seed {seed}); bands: 95% CIs")


def main(argv=None) -> dict:
    return run_experiment(NAME, __doc__, argv, full=FULL, quick=QUICK, run=run, plot=plot, findings=findings,
                          title=title)


if __name__ == "__main__":
    main()
