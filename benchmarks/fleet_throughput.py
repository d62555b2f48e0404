"""Fleet throughput, one thread: requests/s of a fleet of N replicas behind
a router (the reference workload's server at N times its rate) against one
replica over as many requests a replication (a script; the asv suite's
`bench_fleet.Fleet` tracks the same ratio).

    python benchmarks/fleet_throughput.py [--replicas 8 64] [--routers jsq round_robin] [--requests 500]
                                          [--cpu-time]

``--cpu-time`` times the process's CPU time, not the wall clock: on a
machine whose cores other processes share, the wall clock counts their
turns too (one thread either way).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks.bench_fleet import fleet_scenario, requests_per_second  # noqa: E402
from benchmarks.common import reference_workload  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--routers", nargs="+", default=["jsq", "round_robin", "power_of_two", "least_kv"])
    ap.add_argument("--requests", type=int, default=500, help="requests per replica per replication")
    ap.add_argument("--replications", type=int, default=4)
    ap.add_argument("--cpu-time", action="store_true", help="time the process's CPU time, not the wall clock")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    for n in args.replicas:
        one = requests_per_second(reference_workload(args.requests * n), args.replications, clock=clock)
        print(f"one replica, {args.requests * n} requests: {one:,.0f} req/s")
        for router in args.routers:
            rate = requests_per_second(fleet_scenario(n, router, args.requests), args.replications, clock=clock)
            print(f"  {n} replicas, {router}: {rate:,.0f} req/s = {rate / one:.2f}x")


if __name__ == "__main__":
    main()
