"""Disaggregated prefill and decode against co-located serving, same GPUs.

Llama-3.1-8B on H100s (`fastsim.Deployment`: the roofline step times, the
KV blocks, 128 KiB of KV a token), 4 GPUs either as 4 co-located replicas
behind JSQ or split into a prefill pool and a decode pool (1P3D, 2P2D,
3P1D) joined by 100 Gb/s links, on two workloads:

* *prefill-heavy*: long prompts (1,500-6,000 tokens), short answers (~64);
* *decode-heavy*: short prompts (~256), long answers (~700).

Every configuration runs with one seed (`fastsim.disaggregation_search`):
replication *r* replays the same requests everywhere, so each difference
from co-located serving is paired (a Student-t interval on the mean
difference). TTFT is the client's first token from the prefill side, TPOT
the decode side's.

    python experiments/disaggregation.py [--quick] [--seed S] [--out DIR]

Output: ``disaggregation.csv`` (workload, config, metric, estimate,
interval, paired difference from co-located and its interval).
"""

import argparse
import os
import sys
import time

import pandas as pd

import fastsim
from fastsim._stats import mean_interval

METRICS = ("ttft_p99", "tpot_p99", "e2e_mean")
SLO = {"ttft_p99": 0.5, "tpot_p99": 0.01}
LINK_GBPS = 100.0


def deployment():
    return fastsim.Deployment("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", max_num_seqs=128,
                              enable_prefix_caching=False)   # (the decode side runs without it)


def workloads(num_requests):
    warm = num_requests // 10
    return {
        "prefill-heavy": fastsim.Workload(arrival_rate=9.0, num_requests=num_requests,
                                          prompt_len=fastsim.Uniform(1500, 6000),
                                          output_len=fastsim.LogNormal(64, 0.5), warmup_requests=warm),
        "decode-heavy": fastsim.Workload(arrival_rate=14.0, num_requests=num_requests,
                                         prompt_len=fastsim.LogNormal(256, 0.5),
                                         output_len=fastsim.LogNormal(700, 0.4), warmup_requests=warm),
    }


def run(num_requests, n_replications, seed=0, gpus=4):
    dep = deployment()
    template = fastsim.Disaggregated(prefill_server=dep, decode_server=dep, link_bandwidth_gbps=LINK_GBPS,
                                     link_latency_s=0.0005)
    rows, best = [], {}
    for name, wl in workloads(num_requests).items():
        sc = fastsim.Scenario(engine=dep.engine, workload=wl, latency=dep.latency, fleet=template,
                              ttft_slo_s=SLO["ttft_p99"], tpot_slo_s=SLO["tpot_p99"])
        res = fastsim.disaggregation_search(sc, gpus=gpus, slo=SLO, n_replications=n_replications, seed=seed)
        best[name] = res.best
        for _, r in res.table.iterrows():
            for m in METRICS:
                ci = res.confidence_interval(r["config"], m)
                base = res.results["co-located"].per_replication[m].to_numpy()
                x = res.results[r["config"]].per_replication[m].to_numpy()
                d = mean_interval(x - base, 0.95)
                rows.append(dict(workload=name, config=r["config"], metric=m,
                                 estimate=x.mean(), ci_low=ci.low, ci_high=ci.high, n=len(x),
                                 diff_vs_colocated=d[0], diff_ci_low=d[1], diff_ci_high=d[2],
                                 meets_slo=bool(r["meets"])))
    return pd.DataFrame(rows), best


def findings(table, best):
    out = []
    for name, part in table.groupby("workload", sort=False):
        for m in ("ttft_p99", "tpot_p99"):
            sub = part[(part["metric"] == m) & (part["config"] != "co-located")]
            better = sub[sub["diff_ci_high"] < 0]["config"].tolist()
            worse = sub[sub["diff_ci_low"] > 0]["config"].tolist()
            out.append(f"{name}: {m} lower than co-located (interval below 0) for {better or 'none'}, "
                       f"higher for {worse or 'none'}")
        out.append(f"{name}: best configuration meeting {SLO}: {best[name]}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (seconds) for the test suite")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "output", "disaggregation"))
    args = ap.parse_args(argv)
    t = time.perf_counter()
    table, best = run(*((150, 5) if args.quick else (2000, 60)), seed=args.seed)
    os.makedirs(args.out, exist_ok=True)
    table.to_csv(os.path.join(args.out, "disaggregation.csv"), index=False)
    pd.set_option("display.width", 200)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for line in findings(table, best):
        print(line)
    print(f"({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    return table, best


if __name__ == "__main__":
    main()
