"""Where the kernel's time goes, relative to the workload-drawing floor (a script).

    python benchmarks/profile_breakdown.py [--replications 1000] [--requests 1000] [--threads 1]

For each benchmark workload, times three nested pipelines over the same
replications (after compilation): drawing the request stream only (the floor:
no simulator can be faster), drawing + simulating, and the full replication
(+ the per-replication reduction to metrics, percentiles included).
"""

import argparse
import os
import sys
import time

import numba
import numpy as np
from numba import prange

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from fastsim import _kernel as K  # noqa: E402
from fastsim._numba_options import pnjit  # noqa: E402
from fastsim._replicate import pack_scenario  # noqa: E402
from benchmarks.common import reference_workload, sharegpt_80pct  # noqa: E402


@pnjit
def draw_only(nrep, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange, trace, prio_val, prio_cdf, pred_edges,
              out):
    for j in prange(nrep):
        arrival, prompt, output, prio, sjfk, pgrp, plen, n = K._new_workload(
            j, 1, 2, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange, trace, prio_val, prio_cdf, pred_edges)
        out[j] = n + arrival[n - 1] + prompt[n - 1] + output[n - 1]


@pnjit
def draw_and_simulate(nrep, ipar, fpar, lat, arr_times, lcomp, lpar, ltab, lrange, trace, prio_val, prio_cdf,
                      pred_edges, out):
    for j in prange(nrep):
        arrival, prompt, output, prio, sjfk, pgrp, plen, n = K._new_workload(
            j, 1, 2, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange, trace, prio_val, prio_cdf, pred_edges)
        res = K._simulate_new(n, arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat)
        out[j] = res[10]   # the gap-sample count: keeps the work observable


def timed(fn, *args):
    fn(*args)  # compile / warm
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replications", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    nrep = args.replications
    for name, factory in (("reference workload", reference_workload), ("ShareGPT 80%", sharegpt_80pct)):
        sc = factory(args.requests)
        p = pack_scenario(sc)
        tabs = (p["arr_times"], p["lcomp"], p["lpar"], p["ltab"], p["lrange"], p["trace"], p["prio_val"],
                p["prio_cdf"], p["pred_edges"])
        out = np.empty(nrep)
        t_draw = timed(draw_only, nrep, p["ipar"], p["fpar"], *tabs, out)
        t_sim = timed(draw_and_simulate, nrep, p["ipar"], p["fpar"], p["lat"], *tabs, out)
        fastsim.replicate(sc, n_replications=2, seed=0, progress=False)
        t = time.perf_counter()
        fastsim.replicate(sc, n_replications=nrep, seed=0, n_threads=args.threads, progress=False)
        t_full = time.perf_counter() - t
        work = nrep * args.requests
        print(f"{name} ({args.threads} thread(s)): draw only {work / t_draw:,.0f} req/s; "
              f"draw + simulate {work / t_sim:,.0f} req/s; full replicate {work / t_full:,.0f} req/s. "
              f"Time shares: drawing {t_draw / t_full:.0%}, simulating {(t_sim - t_draw) / t_full:.0%}, "
              f"reduction and Python {(t_full - t_sim) / t_full:.0%}")


if __name__ == "__main__":
    main()
