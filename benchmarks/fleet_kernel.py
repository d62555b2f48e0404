"""The fleet kernel alone (`kernel.cluster._simulate_fleet` on drawn
streams, its buffers reused, so no page is faulted in the timed calls): CPU
time per fleet request. It isolates the routing loop (advancing, observing,
handing) from `replicate`'s drawing, reduction and fresh buffers
(`benchmarks/fleet_throughput.py`). Runs on any tree that has
`_simulate_fleet` (compare a parent with ``PYTHONPATH=/tmp/base python
benchmarks/fleet_kernel.py``).

Two figures a fleet: ``repeated``, the best of ``--repeat`` calls on one
stream (what this script printed alone before ``--streams``), and ``fresh``,
the median over ``--streams`` streams each simulated once, one after the
other through the same buffers, as `replicate` runs its replications. A
call repeated on the stream it just simulated runs faster than one on a
stream it has not seen (the processor's predictors learn the stream), so
``repeated`` understates what a replication costs; ``fresh`` still runs
the calls back to back, without the Python between them that `replicate`
runs (and the other processes of a shared machine), which costs more again
(`benchmarks/HISTORY.md`).

    python benchmarks/fleet_kernel.py [--replicas 8 64] [--routers jsq round_robin] [--requests 250]
                                      [--repeat 15] [--streams 16]
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
    ap.add_argument("--repeat", type=int, default=15, help="calls on one stream (the best is reported)")
    ap.add_argument("--streams", type=int, default=16,
                    help="streams each simulated once (the median is reported; 0: not run)")
    args = ap.parse_args()
    for nrep in args.replicas:
        for router in args.routers:
            p = pack_scenario(fleet_scenario(nrep, router, args.requests))
            ipar = p["ipar"]
            full = K.engine_variant(ipar)
            calls = []
            for rep in range(1, 2 + args.streams):   # (stream 1 is the repeated one, as before)
                stream = K.draw_workload(rep, 5, 6, *K.scenario_arrays(p, lat=False))
                n = stream[0].size
                lat, fpar = K.run_records(p["lat"], p["fpar"], 5, 6, rep)
                need = K._ws_need_handed(np.int64(n), stream[1], stream[2], stream[5], stream[6], ipar)
                calls.append(((np.int64(n), *stream, ipar, fpar, lat, p["fleet"], np.int64(p["router"]),
                               np.int64(nrep), np.uint64(5), np.uint64(6), np.int64(rep)), need))
            n_max = max(c[0][0] for c in calls)
            need_max = np.max([c[1] for c in calls], axis=0)
            fb_all = cluster.fleet_buffers(n_max, nrep, int(need_max[0]), int(need_max[1]), 0)

            def buffers(call, need):
                # one set of rows for every stream (as `replicate`'s worker), each call's views its sizes
                n = int(call[0])
                ni, nf = int(need[0]), int(need[1])
                fb = fb_all._replace(rs_a=fb_all.rs_a.reshape(-1)[:nrep * n].reshape(nrep, n),
                                     rs_i=fb_all.rs_i.reshape(-1)[:6 * nrep * n].reshape(6, nrep, n),
                                     wi=fb_all.wi.reshape(-1)[:nrep * ni].reshape(nrep, ni),
                                     wf=fb_all.wf.reshape(-1)[:nrep * nf].reshape(nrep, nf),
                                     owner=fb_all.owner[:n], local=fb_all.local[:n])
                fb.size[:nrep, 0], fb.size[:nrep, 1] = ni, nf
                return fb

            def timed(k):
                call, need = calls[k]
                fb = buffers(call, need)
                t = time.process_time()
                rc = cluster._simulate_fleet(*call, fb, full)
                dt = time.process_time() - t
                assert rc == 0, rc
                return dt, int(call[0])

            for k in range(len(calls)):   # (every page of the rows the streams reach faulted in)
                timed(k)
            best, n = min(timed(0) for _ in range(args.repeat))
            line = (f"{nrep} replicas, {router}: repeated {best * 1e3:.2f} ms for {n} requests, "
                    f"{best / n * 1e9:,.0f} ns each")
            if args.streams > 0:
                fresh = np.median([dt / m for dt, m in (timed(k) for k in range(1, len(calls)))])
                line += f"; fresh streams {fresh * 1e9:,.0f} ns each"
            print(line)


if __name__ == "__main__":
    main()
