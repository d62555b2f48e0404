"""A fleet's compiled replication driver (`kernel.cluster._run_fleet_chunk`)
on and off, alternately, in one process (so both share one copy of the
compiled kernels: trees loaded from separate caches differ by where the
code lands, `benchmarks/HISTORY.md`, stop 64): requests/s of `replicate`
calls of ``--replications`` replications, CPU time, one thread.

    python benchmarks/fleet_driver_speed.py [--replications 200] [--rounds 6] [--router jsq] [--horizon S]

``--horizon S``: the stream cut at ``horizon_s=S`` (its size varies from
one replication to the next, which the driver hands back to Python).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks.bench_fleet import fleet_scenario  # noqa: E402


def main():
    import fastsim
    from fastsim import _fleet

    ap = argparse.ArgumentParser()
    ap.add_argument("--replications", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--router", default="jsq")
    ap.add_argument("--requests", type=int, default=250, help="requests per replica per replication")
    ap.add_argument("--horizon", type=float, default=None, help="workload.horizon_s (stream sizes that vary)")
    args = ap.parse_args()
    sc = fleet_scenario(8, args.router, args.requests)
    if args.horizon is not None:
        sc = sc.replace(**{"workload.horizon_s": args.horizon})
    on = _fleet.compiled_fleet
    fastsim.replicate(sc, n_replications=args.replications, seed=0, n_threads=1, progress=False)
    rates = {True: [], False: []}
    for k in range(args.rounds):
        for driver in ((True, False) if k % 2 == 0 else (False, True)):
            _fleet.compiled_fleet = on if driver else (lambda members: False)
            t = time.process_time()
            fastsim.replicate(sc, n_replications=args.replications, seed=k, n_threads=1, progress=False)
            rates[driver].append(args.replications * sc.workload.num_requests / (time.process_time() - t))
    _fleet.compiled_fleet = on
    for driver in (True, False):
        r = rates[driver]
        print(f"driver {'on ' if driver else 'off'}: median {statistics.median(r) / 1e6:.3f} M req/s "
              f"(range {min(r) / 1e6:.3f}-{max(r) / 1e6:.3f})")


if __name__ == "__main__":
    main()
