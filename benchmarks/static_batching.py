"""Static batching against the common engine (issue 43, "Performance cliffs").

    python benchmarks/static_batching.py [--replications 100] [--requests 1000] [--calls 40]

The ShareGPT workload at 80% of continuous batching's capacity
(`benchmarks/benchmarks/common.py`: ``sharegpt_80pct``), once with the
common engine and once with ``scheduler="static"`` (the full engine), on one
thread: ``replicate`` calls of each alternated (`common.alternating_seconds`),
after a warm-up that compiles both. Prints the fastest call of each, their
ratio (static / common), the steps a replication takes in each (static
batching takes more steps for the same requests: a batch decodes padding
until its longest member is done) and the time per step.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replications", type=int, default=100)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    scenarios = {"common": common.sharegpt_80pct(args.requests), "static": common.sharegpt_static(args.requests)}
    steps = {}
    for name, sc in scenarios.items():
        res = fastsim.replicate(sc, n_replications=args.replications, seed=0, n_threads=1, progress=False)
        steps[name] = float(res.per_replication["n_steps"].mean())

    def call(sc):
        return lambda: fastsim.replicate(sc, n_replications=args.replications, seed=0, n_threads=1, progress=False)

    times = common.alternating_seconds(call(scenarios["common"]), call(scenarios["static"]), args.calls)
    best = {name: min(t) for name, t in zip(scenarios, times)}
    for name in scenarios:
        print(f"{name}: fastest call {best[name]:.4f} s ({args.replications} x {args.requests} requests), "
              f"{steps[name]:.0f} steps a replication, {1e9 * best[name] / args.replications / steps[name]:.0f} ns "
              f"a step; decile {common.decile(times[list(scenarios).index(name)]):.4f} s")
    print(f"static / common: {best['static'] / best['common']:.2f}x the time (fastest calls), "
          f"{common.decile(times[1]) / common.decile(times[0]):.2f}x (10th percentiles)")


if __name__ == "__main__":
    main()
