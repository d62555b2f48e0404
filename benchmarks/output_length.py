"""Cost per request as a function of output length (a script, not a test).

    python benchmarks/output_length.py [--replications 200] [--requests 1000] [--threads 1]

The issue-7 workload with the output median scaled by 1/4 ... 16x and the
arrival rate scaled by the inverse (so the offered decode load stays the
same) and the KV budget scaled with the lengths. The engine steps per
request grow in proportion to the output length; the issue's target is a
cost per *request* nearly flat (the README gives the measured ratio).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks.common import output_length_scenario  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replications", type=int, default=200)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    fastsim.replicate(output_length_scenario(128, 20), n_replications=2, seed=0)   # compile / load
    print("output median | steps/request | requests/s | us/request | ns/step")
    for scale in (0.25, 1.0, 4.0, 16.0):
        sc = output_length_scenario(128 * scale, args.requests)
        t = time.perf_counter()
        res = fastsim.replicate(sc, n_replications=args.replications, seed=0, n_threads=args.threads,
                                progress=False)
        dt = time.perf_counter() - t
        reqs = args.replications * args.requests
        steps = res.per_replication["n_steps"].sum()
        print(f"{128 * scale:>13,.0f} | {steps / reqs:>13,.1f} | {reqs / dt:>10,.0f} | {dt / reqs * 1e6:>10.2f} | "
              f"{dt / steps * 1e9:>7.1f}")


if __name__ == "__main__":
    main()
