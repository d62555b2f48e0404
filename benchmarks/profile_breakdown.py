"""Where the kernel's time goes, relative to the workload-drawing floor (a script).

    python benchmarks/profile_breakdown.py [--replications 1000] [--requests 1000] [--threads 1] [--rounds 9]
        [--short-calls 150] [--short-replications 100]

(All three pipelines run ``replicate``'s driver, `kernel.drivers._run_chunk`, on its
buffers; the two shorter ones with no-op stand-ins, compiled here without
Numba's disk cache, for the entries they leave out.)

For each benchmark workload, times three nested pipelines over the same
replications (after compilation): drawing the request stream only (the floor:
no simulator can be faster), drawing + simulating, and the full replication
(+ the per-replication reduction to metrics, percentiles included).

For the reference workload it also times the performance issue's floor as
the issue words it: each request's arrival gap and two lognormal lengths
drawn with Numba's ``np.random`` (Mersenne Twister, seeded per replication),
nothing else; the issue's target is a simulator within about 2x of it.
Timings are the best of three runs. The VM's speed drifts between those
timings, so the ratio to the floor is then measured again in ``--rounds``
rounds, each running the full replication, the floor twice and the full
replication again (`interleaved_ratios`), and by ``--short-calls``
alternating short calls of each (``--short-replications`` replications): the
ratio of the fastest short calls, the steadiest figure on a noisy VM, and
the median of the rounds' ratios are the figures to quote.
"""

import argparse
import os
import sys
import time

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from fastsim import kernel as K  # noqa: E402
from fastsim._numba_options import function_pointer, njit  # noqa: E402
from fastsim._replicate import pack_scenario  # noqa: E402
from benchmarks.common import (alternating_seconds, decile, floor_args, interleaved_ratios,  # noqa: E402
                               numpy_floor, reference_workload, seconds, sharegpt_80pct)


# The two shorter pipelines are the driver itself, `kernel.drivers._run_chunk`, with
# stand-ins for the entries they leave out, passed as pointers of the same types
# (so `_run_chunk` is not compiled again).

@njit(cache=False)
def no_ws_need(n, prompt, output, pgrp, plen, ipar):
    return np.int64(0), np.int64(0)


@njit(cache=False)
def no_simulate(n, arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, wi, wf, full, t_stop, what):
    return np.int64(0)


@njit(cache=False)
def no_reduce(n, arrival, output, ipar, fpar, wi, wf, row):
    pass


def pipelines(arrays, full):
    """The pointers of the three pipelines: drawing only, drawing and
    simulating, the full replication (`kernel.drivers.engine_pointers`, replicate's code)."""
    draw, ws_need, simulate, reduce = K.engine_pointers(arrays, full)
    types = K.drivers._driver_types(tuple(numba.typeof(a) for a in arrays), full)
    stand_in = {d: function_pointer(f, types[d])
                for d, f in ((K._ws_need, no_ws_need), (K._simulate, no_simulate), (K._reduce, no_reduce))}
    return ((draw, stand_in[K._ws_need], stand_in[K._simulate], stand_in[K._reduce]),
            (draw, ws_need, simulate, stand_in[K._reduce]), (draw, ws_need, simulate, reduce))


def chunks(threads, nrep):
    """``threads`` chunks of ``nrep`` replications, as (first, end) pairs."""
    size = -(-nrep // threads)
    return [(lo, min(nrep, lo + size)) for lo in range(0, nrep, size)]


def threaded(fn, threads, nrep, *args):
    """Run ``fn(rep0, m, *args, out[rep0:rep0 + m])`` over ``threads`` chunks,
    as replicate does; on one thread, in this one (the floor pays no pool:
    starting one took 0.5 ms, 4% of a floor run of 100 replications)."""
    out = np.empty(nrep)
    if threads == 1:
        fn(0, nrep, *args, out)
        return out
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda c: fn(c[0], c[1] - c[0], *args, out[c[0]:c[1]]), chunks(threads, nrep)))
    return out


def threaded_driver(threads, nrep, arrays, full, pointers):
    """Run `kernel.drivers._run_chunk` with ``pointers`` over ``threads`` chunks by
    `kernel.drivers.run_on`, on fresh buffers per chunk, as one replicate call does."""
    out = np.empty((nrep, K.N_COLUMNS))
    num_requests = int(arrays[0][K.I_NUM_REQUESTS])

    def one(c):
        K.run_on(K._run_chunk, K.ChunkBuffers(num_requests), c[0], c[1] - c[0], 1, 2, arrays, out[c[0]:c[1]], full,
                 pointers)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, chunks(threads, nrep)))
    return out


def timed(fn, *args, repeat=3):
    """Best of ``repeat`` runs, after one to compile and warm up."""
    fn(*args)
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


def short_call_times(sc, threads, nrep, calls):
    """Seconds of ``calls`` full replications of ``nrep`` replications and of
    as many floor runs, alternated (`alternating_seconds`)."""
    floor = (numpy_floor, threads, nrep, *floor_args(sc))
    return alternating_seconds(
        lambda: fastsim.replicate(sc, n_replications=nrep, seed=0, n_threads=threads, progress=False),
        lambda: threaded(*floor), calls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replications", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds for the ratio to the floor")
    ap.add_argument("--short-calls", type=int, default=150,
                    help="alternating short calls for the ratio of the fastest to the floor (0: none)")
    ap.add_argument("--short-replications", type=int, default=100, help="replications a short call")
    args = ap.parse_args()
    if args.short_calls < 0:
        ap.error(f"--short-calls must be an integer >= 0, got {args.short_calls}")
    for name in ("replications", "requests", "threads", "rounds", "short_replications"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(args, name)}")
    nrep = args.replications
    for name, factory in (("reference workload", reference_workload), ("ShareGPT 80%", sharegpt_80pct)):
        sc = factory(args.requests)
        p = pack_scenario(sc)
        arrays = K.scenario_arrays(p)
        full = K.engine_variant(p["ipar"])
        draw_only, draw_and_simulate, _ = pipelines(arrays, full)
        t_draw = timed(threaded_driver, args.threads, nrep, arrays, full, draw_only)
        t_sim = timed(threaded_driver, args.threads, nrep, arrays, full, draw_and_simulate)

        def full_run():
            fastsim.replicate(sc, n_replications=nrep, seed=0, n_threads=args.threads, progress=False)

        t_full = timed(full_run)
        work = nrep * args.requests
        print(f"{name} ({args.threads} thread(s)): draw only {work / t_draw:,.0f} req/s; "
              f"draw + simulate {work / t_sim:,.0f} req/s; full replicate {work / t_full:,.0f} req/s. "
              f"Time shares: drawing {t_draw / t_full:.0%}, simulating {(t_sim - t_draw) / t_full:.0%}, "
              f"reduction and Python {(t_full - t_sim) / t_full:.0%}")
        if factory is reference_workload:
            floor = (threaded, numpy_floor, args.threads, nrep, *floor_args(sc))
            t_floor = timed(*floor)
            print(f"  the issue's floor (gap + two lognormal lengths from Numba's np.random): "
                  f"{work / t_floor:,.0f} req/s; fastsim's own drawing takes {t_draw / t_floor:.2f}x its time, "
                  f"the full replication {t_full / t_floor:.1f}x (the issue's target: about 2x)")
            ratios = interleaved_ratios(lambda: seconds(full_run), lambda: seconds(*floor), args.rounds)
            print(f"  full replication / floor in {args.rounds} interleaved rounds: median "
                  f"{np.median(ratios):.2f}x, range {min(ratios):.2f}-{max(ratios):.2f}x")
            if args.short_calls:
                t_full, t_floor = short_call_times(sc, args.threads, args.short_replications, args.short_calls)
                print(f"  by {args.short_calls} alternating short calls of {args.short_replications} x "
                      f"{args.requests} requests each: fastest full replication / fastest floor "
                      f"{min(t_full) / min(t_floor):.2f}x, of the 10th percentiles "
                      f"{decile(t_full) / decile(t_floor):.2f}x")


if __name__ == "__main__":
    main()
