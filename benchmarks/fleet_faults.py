"""Page faults of a fleet's `replicate` calls (a script): the pages a call
faults in with 2 and with ``--replications`` replications, and so the
pages each replication after the first faults in afresh (its buffers are
the thread's, `_fleet._FleetWorker`, so none should be), against one
replica over as many requests a replication (whose buffers come from the
C heap and are reused from one call to the next: its later calls may fault
in fewer pages than its first, hence a negative count a replication). Minor
faults of the whole process (`resource.getrusage`), one thread.

    python benchmarks/fleet_faults.py [--replicas 8 64] [--routers jsq round_robin] [--requests 250]
                                      [--replications 8]
"""

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks.bench_fleet import fleet_scenario  # noqa: E402
from benchmarks.common import reference_workload  # noqa: E402


def faults(sc, reps):
    """(minor page faults, CPU ns a request) of one `replicate` call of ``reps`` replications."""
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.process_time()
    fastsim.replicate(sc, n_replications=reps, seed=1, n_threads=1)
    dt = time.process_time() - t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, dt / (reps * sc.workload.num_requests) * 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--routers", nargs="+", default=["jsq", "round_robin"])
    ap.add_argument("--requests", type=int, default=250, help="requests per replica per replication")
    ap.add_argument("--replications", type=int, default=8)
    args = ap.parse_args()
    if args.replications < 3:
        ap.error("--replications must be at least 3")
    for n in args.replicas:
        cases = [("one replica", reference_workload(args.requests * n))]
        cases += [(f"{n} replicas, {r}", fleet_scenario(n, r, args.requests)) for r in args.routers]
        for name, sc in cases:
            fastsim.replicate(sc, n_replications=2, seed=0, n_threads=1)   # (compiled, or loaded from the cache)
            f2, _ = faults(sc, 2)
            fk, ns = faults(sc, args.replications)
            per = (fk - f2) / (args.replications - 2)
            print(f"{name:>22}, {args.requests * n} requests: {f2:6d} faults with 2 replications, {fk:6d} with "
                  f"{args.replications} ({per:,.0f} a replication after the first); {ns:,.0f} ns a request")


if __name__ == "__main__":
    main()
