"""The fixed cost of a replication (a script): CPU time `replicate` adds for
each replication beyond its requests' simulation, for one replica, a fleet of
8 replicas behind JSQ and a disaggregated 2P4D server. Each is timed on
replications of a few requests, as the slope between calls of 2 and of
``--replications`` replications (the best of ``--repeat`` calls each): what
is left is what every replication pays whatever its size, its drawing and
reduction set-up, the replicas' set-up and, for fleets, the Python that
states a replication's records and buffers (`_fleet._one`, `_disagg._one`).

    python benchmarks/replication_overhead.py [--replications 8] [--repeat 40] [--requests 2]

Runs on any tree (``PYTHONPATH=TREE python benchmarks/replication_overhead.py``).
One replica runs its replications in compiled code (`kernel.drivers._run_chunk`);
a fleet's and a disaggregated server's run from Python, one kernel call each.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks.bench_fleet import fleet_scenario, requests_per_second  # noqa: E402
from benchmarks.common import disagg_jsq_2p4d, reference_workload  # noqa: E402


def best_ms(sc, replications, repeat):
    """The best CPU time of at least ``repeat`` `replicate` calls (ms), after an untimed one
    (`bench_fleet.requests_per_second`)."""
    rate = requests_per_second(sc, replications, repeat=repeat, clock=time.process_time)
    return replications * sc.workload.num_requests / rate * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replications", type=int, default=8, help="the larger call's replications (>= 3)")
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--requests", type=int, default=2, help="requests per replica per replication")
    args = ap.parse_args()
    if args.replications < 3:
        ap.error(f"--replications must be >= 3, got {args.replications}")
    k = args.requests
    cases = (("one replica", reference_workload(8 * k)), ("8 replicas, jsq", fleet_scenario(8, "jsq", k)),
             ("2P4D, jsq", disagg_jsq_2p4d(6 * k)))
    for name, sc in cases:
        small = best_ms(sc, 2, args.repeat)
        large = best_ms(sc, args.replications, args.repeat)
        per = (large - small) / (args.replications - 2) * 1e3
        print(f"{name} ({sc.workload.num_requests} requests a replication): {per:.1f} us a replication")


if __name__ == "__main__":
    main()
