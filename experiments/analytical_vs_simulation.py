"""Analytical models (fastsim.analytical) vs the simulator on the EE384S grid.

48 configurations: arrival rate 0.5, 1, 2, 3 req/s x max_num_seqs 1, 4, 8 x KV
budget 2048, 4096, 8192, 16384 tokens (block_size 16); prompt LogNormal(256, 0.55),
output LogNormal(128, 0.70); admission="kv_reservation"; the A10G-calibrated
latency model (LatencyModel.default(), preset "a10g-qwen2.5-1.5b").

    python experiments/analytical_vs_simulation.py            # full: 100 reps x 2000 requests, 48 configs
    python experiments/analytical_vs_simulation.py --quick    # 12 configs, 20 reps x 1000 requests

Writes (full mode; --quick adds the suffix _quick):
    experiments/output/analytical_vs_simulation.csv   one row per configuration x metric
                                                      (simulated estimate and 95% CI, each model's
                                                      estimate, relative and absolute errors)
    experiments/output/analytical_errors.csv          the error table (per metric and model)
    docs/img/analytical_errors.png                    model vs simulation, per metric
                                                      (--quick: experiments/output/analytical_errors_quick.png)
"""
import os

# The models' dense level solves are small; threaded BLAS only adds contention on a shared machine.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import fastsim  # noqa: E402
from fastsim.analytical import MODELS, predict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METRICS = ["ttft_mean", "ttft_p50", "ttft_p95", "ttft_p99", "tpot_mean", "tpot_p50", "tpot_p99",
           "itl_mean", "itl_p50", "itl_p99", "e2e_mean", "e2e_p50", "e2e_p99", "goodput",
           "blocking_probability"]
# EE384S: mean relative error of its best model per metric; the targets
EE384S = {"ttft_mean": 0.17, "ttft_p95": 0.41, "ttft_p99": 0.49, "goodput": 0.07, "blocking_probability": 0.86}
TARGET_REL = {"ttft_mean": 0.10, "ttft_p99": 0.20, "goodput": 0.03}
TARGET_BLOCKING_ABS = 0.02


def scenario(lam, c, kv, n, warm):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig.synchronous(max_num_seqs=c, num_gpu_blocks=kv // 16, block_size=16,
                                                admission="kv_reservation"),
        workload=fastsim.Workload(arrival_rate=lam, num_requests=n, warmup_requests=warm,
                                  prompt_len=fastsim.LogNormal(median=256, sigma=0.55),
                                  output_len=fastsim.LogNormal(median=128, sigma=0.70)),
        latency=fastsim.LatencyModel.default())


def error_table(df, models):
    """Per metric and model: mean / median / max relative error; blocking: absolute errors too."""
    rows = []
    for metric in METRICS:
        d = df[df.metric == metric]
        for m in models:
            rel = d[f"relerr_{m}"]
            row = {"metric": metric, "model": m, "n_configs": len(d),
                   "mean_rel": rel.mean(), "median_rel": rel.median(), "max_rel": rel.max(),
                   "n_rel": int(rel.notna().sum()),
                   "mean_abs": d[f"abserr_{m}"].mean(), "max_abs": d[f"abserr_{m}"].max(),
                   "share_in_sim_ci": float(((d[m] >= d.ci_low) & (d[m] <= d.ci_high)).mean()),
                   "ee384s_mean_rel": EE384S.get(metric, np.nan)}
            if metric in TARGET_REL:
                row["target"] = f"mean rel <= {TARGET_REL[metric]}"
                row["target_met"] = bool(row["mean_rel"] <= TARGET_REL[metric])
            if metric == "blocking_probability":
                within = int((d[f"abserr_{m}"] <= TARGET_BLOCKING_ABS).sum())
                row["n_within_target"] = within
                row["target"] = f"abs <= {TARGET_BLOCKING_ABS} in every config"
                row["target_met"] = within == len(d)
            rows.append(row)
    return pd.DataFrame(rows)


def plot(df, models, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    shown = ["ttft_mean", "ttft_p99", "goodput", "blocking_probability", "tpot_p99", "itl_p99",
             "e2e_p50", "e2e_p99"]
    fig, axes = plt.subplots(2, 4, figsize=(17, 8))
    for ax, metric in zip(axes.ravel(), shown):
        d = df[df.metric == metric]
        for m, mk in zip(models, "o^s"):
            ax.scatter(d["sim"], d[m], marker=mk, s=18, label=m, alpha=0.65)
        lo = max(1e-4, min(d["sim"].min(), *(d[m].min() for m in models)))
        hi = max(d["sim"].max(), *(d[m].max() for m in models))
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        if metric in ("ttft_mean", "ttft_p99", "e2e_p99", "e2e_p50"):
            ax.set_xscale("log"); ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        elif metric == "blocking_probability":
            ax.set_xscale("symlog", linthresh=1e-3); ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_title(metric); ax.set_xlabel("simulation (100 reps)"); ax.set_ylabel("model")
    axes[0, 0].legend()
    fig.suptitle("fastsim.analytical vs simulation, EE384S grid (48 configs, A10G latency model)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown_table(frame: pd.DataFrame, index: bool = True) -> str:
    """A Markdown (pipe) table of ``frame``, as pandas' ``to_markdown`` prints it, without its
    optional dependency ``tabulate`` (not installed with fastsim)."""
    if index:
        frame = frame.reset_index()

    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "" if np.isnan(v) else f"{v:g}"
        return str(v)

    rows = [[str(c) for c in frame.columns]] + [[cell(v) for v in row] for row in frame.itertuples(index=False)]
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"   # noqa: E731
    return "\n".join([line(rows[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows[1:]])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="12 configurations, 20 reps x 1000 requests")
    ap.add_argument("--replications", type=int, default=100)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: all)")
    ap.add_argument("--out-dir", default=str(ROOT / "experiments" / "output"))
    ap.add_argument("--plot", default=None, help="figure path (default: see above)")
    a = ap.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    rates, seqs, kvs = [0.5, 1, 2, 3], [1, 4, 8], [2048, 4096, 8192, 16384]
    suffix = ""
    if a.quick:
        a.replications, a.requests, a.warmup = 20, 1000, 100
        rates, kvs = [0.5, 3], [2048, 16384]
        suffix = "_quick"
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plot_path = Path(a.plot) if a.plot else (out / "analytical_errors_quick.png" if a.quick
                                             else ROOT / "docs" / "img" / "analytical_errors.png")
    t0 = time.time()
    rows, t_model, t_sim = [], {m: [] for m in models}, 0.0
    for lam, c, kv in itertools.product(rates, seqs, kvs):
        sc = scenario(lam, c, kv, a.requests, a.warmup)
        t1 = time.time()
        s = fastsim.replicate(sc, n_replications=a.replications, seed=a.seed).summary()
        t_sim += time.time() - t1
        block = [dict(rate=lam, max_num_seqs=c, kv_tokens=kv, metric=metric, sim=s.loc[metric, "estimate"],
                      ci_low=s.loc[metric, "ci_low"], ci_high=s.loc[metric, "ci_high"]) for metric in METRICS]
        for m in models:
            t1 = time.time()
            p = predict(sc, model=m)["estimate"]
            t_model[m].append(time.time() - t1)
            for r in block:
                r[m] = p[r["metric"]]
        rows.extend(block)
    df = pd.DataFrame(rows)
    for m in models:
        df[f"relerr_{m}"] = ((df[m] - df["sim"]).abs() / df["sim"].abs()).replace(np.inf, np.nan)
        df[f"abserr_{m}"] = (df[m] - df["sim"]).abs()
    df.to_csv(out / f"analytical_vs_simulation{suffix}.csv", index=False)
    tab = error_table(df, models)
    tab.to_csv(out / f"analytical_errors{suffix}.csv", index=False)
    wall = time.time() - t0
    n_cfg = len(df) // len(METRICS)
    print(f"{n_cfg} configurations, {a.replications} reps x {a.requests} requests ({a.warmup} warm-up), "
          f"seed {a.seed}; wall {wall:.0f} s (simulation {t_sim:.0f} s); model time per scenario " +
          ", ".join(f"{m}: mean {np.mean(t):.2f} s, max {np.max(t):.2f} s" for m, t in t_model.items()))
    print("\nRelative error |model - sim| / sim, mean (median) over the configurations "
          "(blocking: configurations with simulated blocking 0 excluded from the relative error)")
    wide = tab.pivot(index="metric", columns="model", values="mean_rel").loc[METRICS, models]
    med = tab.pivot(index="metric", columns="model", values="median_rel").loc[METRICS, models]
    show = pd.DataFrame({m: [f"{x:.3f} ({y:.3f})" for x, y in zip(wide[m], med[m])] for m in models},
                        index=METRICS)
    show.insert(0, "EE384S", [f"{EE384S[k]:.2f}" if k in EE384S else "" for k in METRICS])
    print(markdown_table(show))
    blk = tab[tab.metric == "blocking_probability"].set_index("model")
    print("\nBlocking absolute error: " + "; ".join(
        f"{m}: mean {blk.loc[m, 'mean_abs']:.4f}, max {blk.loc[m, 'max_abs']:.4f}, "
        f"within {TARGET_BLOCKING_ABS}: {int(blk.loc[m, 'n_within_target'])}/{n_cfg}" for m in models))
    print("\nBy max_num_seqs: mean relative error (TTFT mean, TTFT p99, goodput) and blocking max abs error")
    by_c = []
    for c in sorted(df.max_num_seqs.unique()):
        d = df[df.max_num_seqs == c]
        for m in models:
            g = d.groupby("metric")
            by_c.append({"max_num_seqs": c, "model": m,
                         "ttft_mean": g[f"relerr_{m}"].mean()["ttft_mean"],
                         "ttft_p99": g[f"relerr_{m}"].mean()["ttft_p99"],
                         "goodput": g[f"relerr_{m}"].mean()["goodput"],
                         "blocking max abs": g[f"abserr_{m}"].max()["blocking_probability"]})
    print(markdown_table(pd.DataFrame(by_c).round(4), index=False))
    print("Targets (mean rel TTFT <= 0.10, p99 TTFT <= 0.20, goodput <= 0.03; blocking abs <= 0.02 everywhere):")
    for m in models:
        t = tab[(tab.model == m) & tab.target_met.notna()]
        print(f"  {m}: " + ", ".join(f"{r.metric} {'met' if r.target_met else 'MISSED'}" for r in t.itertuples()))
    for m in models:
        print(f"\nWorst cases, {m} (relative error):")
        w = df[df.metric != "blocking_probability"].sort_values(f"relerr_{m}", ascending=False).head(8)
        print(markdown_table(w[["rate", "max_num_seqs", "kv_tokens", "metric", "sim", m, f"relerr_{m}"]]
                             .round(4), index=False))
        w = df[df.metric == "blocking_probability"].sort_values(f"abserr_{m}", ascending=False).head(4)
        print(markdown_table(w[["rate", "max_num_seqs", "kv_tokens", "sim", m, f"abserr_{m}"]].round(4),
                             index=False))
    try:
        plot(df, models, plot_path)
        print(f"\nplot: {plot_path}")
    except Exception as exc:  # pragma: no cover
        print("no plot:", exc)
    print(f"tables: {out / f'analytical_vs_simulation{suffix}.csv'}, {out / f'analytical_errors{suffix}.csv'}")


if __name__ == "__main__":
    main()
