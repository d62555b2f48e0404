"""Fleet throughput, one thread: requests/s of a fleet of N replicas behind
a router (the reference workload's server at N times its rate) against one
replica over as many requests a replication (a script; the asv suite's
`bench_fleet.Fleet` tracks the same ratio).

    python benchmarks/fleet_throughput.py [--replicas 8 64] [--routers jsq round_robin] [--requests 500]
                                          [--cpu-time] [--per-replication] [--closed-seats S]

``--cpu-time`` times the process's CPU time, not the wall clock: on a
machine whose cores other processes share, the wall clock counts their
turns too (one thread either way). ``--per-replication`` reports the
requests a second that one more replication adds (calls of ``R`` and ``4R``
replications, the slope between them): a `replicate` call's fixed cost
(validation, packing, the result's frame: about 0.7 ms, a fleet's and one
replica's alike) weighs on one replica's short calls more than on the
fleet's, so the ratio of whole calls is the larger of the two.
``--closed-seats S``: a pure closed loop instead of the Poisson stream, ``S``
seats a replica (one replica's ``max_concurrency=S``, the fleet's ``N S``:
the fleet's client, `fastsim.kernel.fleet_client`).
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
    ap.add_argument("--routers", nargs="+", default=["jsq", "round_robin", "power_of_two", "least_kv", "weighted"])
    ap.add_argument("--requests", type=int, default=500, help="requests per replica per replication")
    ap.add_argument("--replications", type=int, default=4)
    ap.add_argument("--cpu-time", action="store_true", help="time the process's CPU time, not the wall clock")
    ap.add_argument("--per-replication", action="store_true",
                    help="the slope between calls of R and 4R replications (without a call's fixed cost)")
    ap.add_argument("--closed-seats", type=int, default=None,
                    help="a pure closed loop of this many seats per replica instead of the Poisson stream")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter

    def rate(sc):
        r = args.replications
        if not args.per_replication:
            return requests_per_second(sc, r, clock=clock)
        # (best of calls: requests / time, so a call's time is requests / rate)
        t1, t4 = (r * k * sc.workload.num_requests / requests_per_second(sc, r * k, clock=clock) for k in (1, 4))
        return 3 * r * sc.workload.num_requests / (t4 - t1)

    def closed(sc, seats):
        if args.closed_seats is None:
            return sc
        return sc.replace(**{"workload.arrival_rate": None, "workload.max_concurrency": seats})

    for n in args.replicas:
        one = rate(closed(reference_workload(args.requests * n), args.closed_seats))
        print(f"one replica, {args.requests * n} requests: {one:,.0f} req/s")
        for router in args.routers:
            fleet = rate(closed(fleet_scenario(n, router, args.requests), (args.closed_seats or 0) * n))
            print(f"  {n} replicas, {router}: {fleet:,.0f} req/s = {fleet / one:.2f}x")


if __name__ == "__main__":
    main()
