"""Throughput of the replication kernel on this machine (a script, not a test).

    python benchmarks/throughput.py [--replications N] [--requests M] [--threads T]

Prints requests simulated per second for the benchmark workloads, after
compilation. The asv suite (``benchmarks/benchmarks``) tracks the same figures
over the project's history.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks.common import reference_workload, sharegpt_80pct, warm_up  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replications", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    t = time.perf_counter()
    warm_up()
    print(f"compile or cache load: {time.perf_counter() - t:.2f} s")
    for name, factory in (("reference workload (KV reservation, batch 32)", reference_workload),
                          ("ShareGPT, max_num_seqs 64, ~80% load", sharegpt_80pct)):
        sc = factory(args.requests)
        t = time.perf_counter()
        res = fastsim.replicate(sc, n_replications=args.replications, seed=1, n_threads=args.threads,
                                progress=False)
        dt = time.perf_counter() - t
        steps = res.per_replication["n_steps"].sum()
        print(f"{name}: {args.replications} x {args.requests} requests in {dt:.2f} s = "
              f"{args.replications * args.requests / dt:,.0f} requests/s, {steps / dt:,.0f} steps/s")


if __name__ == "__main__":
    main()
