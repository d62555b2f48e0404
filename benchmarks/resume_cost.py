"""The fixed cost of a resumed call of the engine (a script): CPU time of a
call of `kernel.replica._simulate` with ``STEP_ADVANCE`` that finds its step
in flight beyond ``t_stop`` and returns at once, on a replica of the
JSQ-over-8 fleet's workload (`bench_fleet.fleet_scenario`) handed its first
20 requests. A fleet makes about one such call a fleet arrival (JSQ over 8
replicas: 0.93; `benchmarks/HISTORY.md`, stop 56), each paying what this
one pays (checking the workspace's size, carving its views, loading and
storing the loop's scalars) before any work.

    python benchmarks/resume_cost.py [--calls 3000000] [--repeat 5]

Runs on any tree that has the resumable replica (``PYTHONPATH=/tmp/base
python benchmarks/resume_cost.py``). The timing loop is compiled afresh
each run (no disk cache: a cached caller would keep an old tree's engine).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks.bench_fleet import fleet_scenario  # noqa: E402


def main():
    from fastsim import kernel as K
    from fastsim._numba_options import njit
    from fastsim._replicate import pack_scenario
    from fastsim.kernel import cluster, replica
    from fastsim.kernel.workspace import N_RI, RI_MODE

    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=5, help="timed loops (the fastest is reported)")
    args = ap.parse_args()

    p = pack_scenario(fleet_scenario(8, "jsq", 250))
    ipar = p["ipar"]
    full = K.engine_variant(ipar)
    stream = K.draw_workload(1, 5, 6, *K.scenario_arrays(p, lat=False))
    n = np.int64(stream[0].size)
    lat, fpar = K.run_records(p["lat"], p["fpar"], 5, 6, 1)
    need = K._ws_need_handed(n, stream[1], stream[2], stream[5], stream[6], ipar)
    fb = cluster.fleet_buffers(int(n), 1, int(need[0]), int(need[1]), 0)
    fb.size[0, 0], fb.size[0, 1] = int(need[0]), int(need[1])

    @njit(cache=False, _nrt=False)
    def set_up(fb, n, stream, ipar, fpar, lat, full, handed):
        # replica 0 set up empty (as a fleet's), handed the stream's first requests at an eighth of their times
        rc = cluster._set_up_uniform(n, stream, ipar, fpar, lat, 1, fb, full, ipar)
        wi, wf = cluster._rows(fb, 0)
        arrival, prompt, output, prio, sjfk, pgrp, plen = stream
        ri = fb.rs_i
        for i in range(handed):
            if rc >= 0:
                rc = replica._hand(n, fb.rs_a[0], ri[0, 0], ri[1, 0], ri[2, 0], ri[3, 0], ri[4, 0], ri[5, 0],
                                   fb.rip[0], fpar, wi, wf, full, arrival[i] / 8, prompt[i], output[i], prio[i],
                                   sjfk[i], pgrp[i], plen[i])
        return rc

    @njit(cache=False, _nrt=False)
    def resume(fb, n, fpar, lat, full, t, calls):
        s = 0
        for _ in range(calls):
            s += cluster._call(fb, 0, n, fpar, lat, full, t, replica.STEP_ADVANCE)
        return s

    handed = 20
    assert set_up(fb, n, stream, ipar, fpar, lat, full, handed) >= 0
    t = stream[0][handed - 1] / 8
    resume(fb, n, fpar, lat, full, t, 1)   # (to the first step in flight that ends after t)
    mode = fb.wi[0, fb.size[0, 0] - N_RI + RI_MODE]
    if mode not in (replica.MODE_FAST_STEP, replica.MODE_SLOW_STEP):
        raise SystemExit(f"the replica is not paused with a step in flight (mode {mode}): nothing measured")
    best = np.inf
    for _ in range(args.repeat):
        c = time.process_time()
        resume(fb, n, fpar, lat, full, t, args.calls)
        best = min(best, time.process_time() - c)
    print(f"a resumed call that does nothing: {best / args.calls * 1e9:.1f} ns (best of {args.repeat} x "
          f"{args.calls:,} calls)")


if __name__ == "__main__":
    main()
