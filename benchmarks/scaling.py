"""Cost against the number of replications and of requests (a script, not a test).

    python benchmarks/scaling.py [--workload reference|sharegpt] [--rounds 5] [--threads 1]

The issue's target: a cost linear in replications and in requests. Two
sweeps, each in ``--rounds`` rounds with the sizes in a new random order
per round (the VM's speed drifts; interleaving spreads the drift over
all sizes):

* replications: 250 ... 8,000 replications of 1,000 requests (the time of
  the whole run scales with the replications);
* requests: 250 ... 256,000 requests a replication, with about 2,000,000
  requests in all at every size (2,000,000 / size replications; the time of
  one replication scales with its requests).

For each size it prints the median time per request (ns) and its range
over the rounds. For each sweep it fits ``time ~ size ** b`` in each round
(least squares on the logs) and prints the mean exponent b with a 95%
t interval over the rounds (b = 1: a linear cost), and the exponent between
neighbouring sizes (median over the rounds), which a single slope over
the whole range would average away. Meant for one thread: with more, small
runs are simulated in the calling thread and larger ones on a pool
(`fastsim._replicate._POOL_MIN_REQUESTS`), two code paths in one fit.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks.common import WORKLOADS, cost_exponent, scaling_points, timed_replicate, warm_up  # noqa: E402
from fastsim._stats import mean_interval  # noqa: E402

SIZES = {"replications": (250, 500, 1000, 2000, 4000, 8000),
         "requests": (250, 500, 1000, 2000, 4000, 8000, 16000, 64000, 256000)}
BUDGET = 2_000_000   # requests per point of the requests sweep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(set(WORKLOADS) - {"full"}), default="reference")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    for name, low in (("rounds", 2), ("threads", 1)):
        if getattr(args, name) < low:
            ap.error(f"--{name} must be an integer >= {low}, got {getattr(args, name)}")
    warm_up()
    rng = np.random.default_rng(0)
    for axis, axis_sizes in SIZES.items():
        points = scaling_points(WORKLOADS[args.workload], axis, axis_sizes, BUDGET)
        for _, scenario, _, _ in points:   # draw any tables and warm the caches outside the timing
            timed_replicate(scenario, 2, args.threads)
        run_s = np.empty((args.rounds, len(points)))   # seconds of each run
        for r in range(args.rounds):
            for i in rng.permutation(len(points)):
                _, scenario, reps, _ = points[i]
                run_s[r, i] = timed_replicate(scenario, reps, args.threads)
        size = np.array([p[0] for p in points], float)
        scaled = run_s / np.array([p[3] for p in points])   # the time that scales with the size
        b, low, high, _, _ = mean_interval([cost_exponent(size, scaled[r]) for r in range(args.rounds)])
        local = np.median(np.diff(np.log(scaled), axis=1) / np.diff(np.log(size)), axis=0)
        ns = run_s / np.array([reps * scenario.workload.num_requests for _, scenario, reps, _ in points]) * 1e9
        print(f"{args.workload} workload, {axis} ({args.threads} thread(s), {args.rounds} rounds):")
        print(f"  {axis:>12s} | replications | ns/request (median) | range     | b from the previous size")
        for i, (sz, _, reps, _) in enumerate(points):
            step = f"{local[i - 1]:.3f}" if i else ""
            print(f"  {sz:>12,} | {reps:>12,} | {np.median(ns[:, i]):>19.0f} | {ns[:, i].min():>4.0f}-"
                  f"{ns[:, i].max():<4.0f} | {step}")
        print(f"  cost ~ {axis} ** b: b = {b:.3f} (95% CI {low:.3f} to {high:.3f})")


if __name__ == "__main__":
    main()
