"""Analytical models (fastsim.analytical) vs the simulator on the EE384S grid.

48 configurations: arrival rate 0.5, 1, 2, 3 req/s x max_num_seqs 1, 4, 8 x KV
budget 2048, 4096, 8192, 16384 tokens (block_size 16); prompt LogNormal(256, 0.55),
output LogNormal(128, 0.70); admission="kv_reservation"; LatencyModel.default().

    python experiments/analytical_vs_simulation.py            # full (100 reps x 2000 requests)
    python experiments/analytical_vs_simulation.py --quick    # < 1 min
"""
import argparse
import itertools
import time

import numpy as np
import pandas as pd

import fastsim
from fastsim.analytical import MODELS, predict

METRICS = ["ttft_mean", "ttft_p50", "ttft_p95", "ttft_p99", "goodput", "blocking_probability"]
EE384S = {"ttft_mean": 0.17, "ttft_p95": 0.41, "ttft_p99": 0.49, "goodput": 0.07, "blocking_probability": 0.86}


def scenario(lam, c, kv, n, warm):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=c, num_gpu_blocks=kv // 16, block_size=16,
                                    admission="kv_reservation"),
        workload=fastsim.Workload(arrival_rate=lam, num_requests=n, warmup_requests=warm,
                                  prompt_len=fastsim.LogNormal(median=256, sigma=0.55),
                                  output_len=fastsim.LogNormal(median=128, sigma=0.70)),
        latency=fastsim.LatencyModel.default())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--replications", type=int, default=100)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/analytical_vs_simulation.csv")
    ap.add_argument("--plot", default="docs/img/analytical_errors.png")
    a = ap.parse_args()
    rates, seqs, kvs = [0.5, 1, 2, 3], [1, 4, 8], [2048, 4096, 8192, 16384]
    if a.quick:
        a.replications, a.requests, a.warmup = 20, 1000, 100
        rates, kvs = [0.5, 3], [2048, 16384]
    t0 = time.time()
    rows, t_model = [], {m: 0.0 for m in MODELS}
    for lam, c, kv in itertools.product(rates, seqs, kvs):
        sc = scenario(lam, c, kv, a.requests, a.warmup)
        s = fastsim.replicate(sc, n_replications=a.replications, seed=a.seed).summary()
        for metric in METRICS:
            row = dict(rate=lam, max_num_seqs=c, kv_tokens=kv, metric=metric,
                       sim=s.loc[metric, "estimate"], ci_low=s.loc[metric, "ci_low"],
                       ci_high=s.loc[metric, "ci_high"])
            rows.append(row)
        for m in MODELS:
            t1 = time.time()
            p = predict(sc, model=m)
            t_model[m] += time.time() - t1
            for r in rows[-len(METRICS):]:
                r[m] = p.loc[r["metric"], "estimate"]
    df = pd.DataFrame(rows)
    for m in MODELS:
        df[f"relerr_{m}"] = ((df[m] - df["sim"]).abs() / df["sim"].abs()).replace(np.inf, np.nan)
        df[f"abserr_{m}"] = (df[m] - df["sim"]).abs()
    df.to_csv(a.out, index=False)
    wall = time.time() - t0
    print(f"{len(df) // len(METRICS)} configurations, {a.replications} reps x {a.requests} requests "
          f"({a.warmup} warm-up); wall {wall:.0f} s; model time " +
          ", ".join(f"{m} {t:.1f} s" for m, t in t_model.items()))
    tab = []
    for metric in METRICS:
        d = df[df.metric == metric]
        row = {"metric": metric, "EE384S mean": EE384S.get(metric, np.nan)}
        for m in MODELS:
            e = d[f"relerr_{m}"]
            row[f"{m} mean"] = e.mean()
            row[f"{m} median"] = e.median()
            if metric == "blocking_probability":
                row[f"{m} mean abs"] = d[f"abserr_{m}"].mean()
                row[f"{m} max abs"] = d[f"abserr_{m}"].max()
                row[f"{m} share within 0.02 abs"] = (d[f"abserr_{m}"] <= 0.02).mean()
        tab.append(row)
    tab = pd.DataFrame(tab).set_index("metric")
    print("\nRelative error |model - sim| / sim (blocking: rows with sim = 0 excluded from relative)")
    print(tab.round(3).to_markdown())
    for m in MODELS:
        print(f"\nWorst cases, {m}:")
        w = df[df.metric != "blocking_probability"].sort_values(f"relerr_{m}", ascending=False).head(8)
        print(w[["rate", "max_num_seqs", "kv_tokens", "metric", "sim", m, f"relerr_{m}"]].round(4).to_markdown(index=False))
        w = df[df.metric == "blocking_probability"].sort_values(f"abserr_{m}", ascending=False).head(5)
        print(w[["rate", "max_num_seqs", "kv_tokens", "sim", m, f"abserr_{m}"]].round(4).to_markdown(index=False))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.6))
        for ax, metric in zip(axes, METRICS):
            d = df[df.metric == metric]
            for m, mk in zip(MODELS, "os"):
                ax.scatter(d["sim"], d[m], marker=mk, s=14, label=m, alpha=0.7)
            lo = max(1e-4, min(d["sim"].min(), *(d[m].min() for m in MODELS)))
            hi = max(d["sim"].max(), *(d[m].max() for m in MODELS))
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            if metric != "goodput":
                ax.set_xscale("symlog", linthresh=1e-3); ax.set_yscale("symlog", linthresh=1e-3)
            ax.set_title(metric); ax.set_xlabel("simulation"); ax.set_ylabel("model")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
        print(f"\nplot: {a.plot}")
    except Exception as exc:  # pragma: no cover
        print("no plot:", exc)


if __name__ == "__main__":
    main()
