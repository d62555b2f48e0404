"""The fleet kernel alone (`kernel.cluster._simulate_fleet` on one drawn
stream, its buffers reused, so no page is faulted in the timed calls): CPU
time per fleet request, the best of ``--repeat`` calls. It isolates the
routing loop (advancing, observing, handing) from `replicate`'s drawing,
reduction and fresh buffers (`benchmarks/fleet_throughput.py`). Runs on any
tree that has `_simulate_fleet` (compare a parent with
``PYTHONPATH=/tmp/base python benchmarks/fleet_kernel.py``).

    python benchmarks/fleet_kernel.py [--replicas 8 64] [--routers jsq round_robin] [--requests 250]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks.bench_fleet import fleet_scenario  # noqa: E402


def main():
    import fastsim  # noqa: F401  (the tree on PYTHONPATH)
    from fastsim import kernel as K
    from fastsim._replicate import pack_scenario
    from fastsim.kernel import cluster

    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--routers", nargs="+", default=["jsq", "round_robin"])
    ap.add_argument("--requests", type=int, default=250, help="requests per replica")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    for nrep in args.replicas:
        for router in args.routers:
            p = pack_scenario(fleet_scenario(nrep, router, args.requests))
            stream = K.draw_workload(1, 5, 6, *K.scenario_arrays(p, lat=False))
            n = stream[0].size
            ipar = p["ipar"]
            lat, fpar = K.run_records(p["lat"], p["fpar"], 5, 6, 1)
            need_i, need_f = K._ws_need(np.int64(n), stream[1], stream[2], stream[5], stream[6], ipar)
            fb = cluster.fleet_buffers(n, nrep, need_i, need_f, 0)
            call = (np.int64(n), *stream, ipar, fpar, lat, p["fleet"], np.int64(p["router"]), np.int64(nrep),
                    np.uint64(5), np.uint64(6), np.int64(1), fb, K.engine_variant(ipar))
            assert cluster._simulate_fleet(*call) == 0
            best = float("inf")
            for _ in range(args.repeat):
                t = time.process_time()
                cluster._simulate_fleet(*call)
                best = min(best, time.process_time() - t)
            print(f"{nrep} replicas, {router}: {best * 1e3:.2f} ms for {n} requests, {best / n * 1e9:,.0f} ns each")


if __name__ == "__main__":
    main()
