"""Cost against the number of replications and of requests (a script, not a test).

    python benchmarks/scaling.py [--workload reference|sharegpt] [--rounds 5] [--threads 1]
    python benchmarks/scaling.py --paired [--workload ...] [--rounds 5]

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

``--paired`` measures the cost of long replications against short ones
more finely than the sweep's medians, which the VM's drift spreads: for
each long size (``PAIRED``, replications of about 2,000,000 requests in
all, and the longest in 8 replications too), the time per request relative
to 2,000 replications of 1,000 requests, in ``--rounds`` rounds of long,
short, short, long (`interleaved_ratios`). A call's buffers are faulted in
once per thread (`fastsim.kernel.ChunkBuffers`), a cost that a call of few
long replications shares among few of them.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks.common import (WORKLOADS, cost_exponent, interleaved_ratios, scaling_points,  # noqa: E402
                               timed_replicate, warm_up)
from fastsim._stats import mean_interval  # noqa: E402

SIZES = {"replications": (250, 500, 1000, 2000, 4000, 8000),
         "requests": (250, 500, 1000, 2000, 4000, 8000, 16000, 64000, 256000)}
BUDGET = 2_000_000   # requests per point of the requests sweep
PAIRED = ((16_000, 125), (64_000, 31), (256_000, 8), (1_024_000, 2), (1_024_000, 8))   # (requests, replications)


def paired(factory, rounds, threads):
    """`--paired`: each long size's time per request relative to 1,000-request replications."""
    short, short_reps = factory(1000), BUDGET // 1000
    timed_replicate(short, 2, threads)
    print(f"time per request relative to {short_reps:,} x 1,000 requests ({threads} thread(s), {rounds} rounds "
          f"of long, short, short, long):")
    print("      requests | replications | ratio (median) | range")
    for size, reps in PAIRED:
        long = factory(size)
        timed_replicate(long, 2, threads)
        ratios = interleaved_ratios(lambda: timed_replicate(long, reps, threads) / (reps * size),
                                    lambda: timed_replicate(short, short_reps, threads) / BUDGET, rounds)
        print(f"  {size:>12,} | {reps:>12,} | {np.median(ratios):>14.3f} | {min(ratios):.3f}-{max(ratios):.3f}",
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(set(WORKLOADS) - {"full"}), default="reference")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--paired", action="store_true", help="long replications against short ones, A B B A")
    args = ap.parse_args()
    for name, low in (("rounds", 2), ("threads", 1)):
        if getattr(args, name) < low:
            ap.error(f"--{name} must be an integer >= {low}, got {getattr(args, name)}")
    warm_up()
    if args.paired:
        paired(WORKLOADS[args.workload], args.rounds, args.threads)
        return
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
