"""Cost against the number of replications and of requests (a script, not a test).

    python benchmarks/scaling.py [--workload reference|sharegpt] [--rounds 5] [--threads 1]

The issue's target: a cost linear in replications and in requests. Two
sweeps, each in ``--rounds`` rounds with the sizes in a new random order
per round (the VM's speed drifts; interleaving spreads the drift over
all sizes):

* replications: 250 ... 8,000 replications of 1,000 requests;
* requests: 250 ... 16,000 requests a replication, with 2,000,000 requests in
  all at every size (2,000,000 / size replications), so that a linear cost
  gives the same time at every size.

For each size it prints the median time per request (ns) and its range
over the rounds. For each sweep it fits ``time ~ size ** b`` in each round
(least squares on the logs) and prints the mean exponent b with a 95%
t interval over the rounds; b = 1 is a linear cost (for the requests sweep,
b is that of the time per replication against its requests, computed from
the same runs). An exponent below 1 means a cost per request that falls
with the size: the fixed cost of a call and of a replication (a few
microseconds each) spread over more requests.
"""

import argparse
import os
import sys

import numpy as np
from scipy import stats

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks.common import WORKLOADS, cost_exponent, scaling_points, timed_replicate, warm_up  # noqa: E402

SIZES = {"replications": (250, 500, 1000, 2000, 4000, 8000),
         "requests": (250, 500, 1000, 2000, 4000, 8000, 16000)}
BUDGET = 2_000_000   # requests per point of the requests sweep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(set(WORKLOADS) - {"full"}), default="reference")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    warm_up()
    rng = np.random.default_rng(0)
    for axis, sizes in SIZES.items():
        points = scaling_points(WORKLOADS[args.workload], axis, sizes, BUDGET)
        for _, scenario, reps in points:   # draw any tables and warm the caches outside the timing
            timed_replicate(scenario, 2, args.threads)
        per_request = np.empty((args.rounds, len(points)))   # seconds per request
        for r in range(args.rounds):
            for i in rng.permutation(len(points)):
                size, scenario, reps = points[i]
                per_request[r, i] = timed_replicate(scenario, reps, args.threads) / (
                    reps * scenario.workload.num_requests)
        sizes = np.array([p[0] for p in points], float)
        # time of the whole run (replications sweep) or of one replication (requests sweep)
        unit = np.array([p[0] * p[1].workload.num_requests if axis == "replications" else p[0]
                         for p in points], float)
        b = np.array([cost_exponent(sizes, per_request[r] * unit) for r in range(args.rounds)])
        half = stats.t.ppf(0.975, args.rounds - 1) * b.std(ddof=1) / np.sqrt(args.rounds) if args.rounds > 1 \
            else np.nan
        print(f"{args.workload} workload, {axis} ({args.threads} thread(s), {args.rounds} rounds):")
        print(f"  {axis:>12s} | replications | ns/request (median) | range")
        for i, (size, scenario, reps) in enumerate(points):
            col = per_request[:, i] * 1e9
            print(f"  {size:>12,} | {reps:>12,} | {np.median(col):>19.0f} | {col.min():.0f}-{col.max():.0f}")
        print(f"  cost ~ {axis} ** b: b = {b.mean():.3f} (95% CI {b.mean() - half:.3f} to {b.mean() + half:.3f})")


if __name__ == "__main__":
    main()
