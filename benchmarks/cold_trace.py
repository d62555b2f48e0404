"""A cold start's timeline in the user's process (a script, not a test).

    python benchmarks/cold_trace.py [--workload reference_workload|full_engine_workload]

With an empty Numba cache, times (seconds since the script started) the
import, the compile helper's start, each callee of the engine the engine's
compilation asks the helper for (and how long it waited for it), the end of
this process's own work (the engine and the entries it took from the
helper's list) and the helper's end, then the first ``replicate``,
``sample_requests`` and ``simulate_requests`` calls. It prints which
callees the engine loaded from the cache and which it compiled itself.
``startup_memory.py`` and ``ab_interleaved.py --cold`` give the figures to
compare; this says where one cold start went.

    python benchmarks/cold_trace.py --serial

prints instead the CPU time (and the wall time) of a serial cold start, the
compile helper off (``FASTSIM_COMPILE_HELPER=0``): ``replicate`` (one thread),
``sample_requests`` and ``simulate_requests``, the import left out; the
figure the cold-compile target against 108cbbe is stated in. Run it with
``PYTHONPATH=TREE`` for each tree, in alternation (`benchmarks/HISTORY.md`).
"""

import argparse
import os
import sys
import tempfile
import time

T0 = time.perf_counter()


def stamp(what):
    print(f"{time.perf_counter() - T0:6.2f} s  {what}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="reference_workload", choices=["reference_workload", "full_engine_workload"])
    ap.add_argument("--serial", action="store_true", help="CPU time of a serial cold start (no helper)")
    args = ap.parse_args()
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastsim_cold_")   # before numba is imported
    if args.serial:
        return serial(args.workload)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fastsim
    from fastsim import kernel as K
    from fastsim import _numba_options as O
    from benchmarks import common

    stamp("imported fastsim")
    start, stop, ready = O._start_helper, O._Helper.stop, O._Helper.ready

    def traced_start(*a):
        stamp("helper started")
        return start(*a)

    def traced_stop(self, timeout):
        stamp(f"this process done (took jobs {sorted(self.mine)} of {len(self.jobs)}); waiting for the helper")
        rc = stop(self, timeout)
        stamp("helper done")
        return rc

    def traced_ready(self, cache, argtypes):
        t = time.perf_counter()
        ok = ready(self, cache, argtypes)
        stamp(f"  callee {cache._py_func.__name__}: {'loaded' if ok else 'compiled here'}, "
              f"waited {time.perf_counter() - t:.2f} s")
        return ok

    O._start_helper, O._Helper.stop, O._Helper.ready = traced_start, traced_stop, traced_ready
    scenario = getattr(common, args.workload)(20)
    fastsim.replicate(scenario, n_replications=2, seed=0, progress=False)
    stamp("replicate done")
    fastsim.simulate_requests(scenario, fastsim.sample_requests(scenario, seed=0))
    stamp("sample_requests and simulate_requests done")
    full = K.engine_variant(fastsim._replicate.pack_scenario(scenario)["ipar"])
    loaded = [d.py_func.__name__ for d, _ in K.drivers._callee_types(full) if sum(d.stats.cache_hits.values())]
    here = [d.py_func.__name__ for d, _ in K.drivers._callee_types(full) if sum(d.stats.cache_misses.values())]
    print(f"engine callees loaded from the cache: {len(loaded)}; compiled here: {len(here)} {here}")


def serial(workload):
    """CPU and wall seconds of a serial cold start of ``workload`` (20 requests)."""
    import shutil

    os.environ["FASTSIM_COMPILE_HELPER"] = "0"
    import fastsim

    # the workload as the tree's own benchmarks define it (an older tree's options), else this checkout's
    tree = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(fastsim.__file__))), "benchmarks")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, tree if os.path.exists(os.path.join(tree, "benchmarks", "common.py")) else here)
    from benchmarks import common

    scenario = getattr(common, workload)(20)
    cpu, wall = time.process_time(), time.perf_counter()
    fastsim.replicate(scenario, n_replications=2, seed=0, n_threads=1, progress=False)
    fastsim.simulate_requests(scenario, fastsim.sample_requests(scenario, seed=0))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{fastsim.__file__}: serial cold start {cpu:.2f} s CPU, {wall:.2f} s wall")
    shutil.rmtree(os.environ["NUMBA_CACHE_DIR"], ignore_errors=True)


if __name__ == "__main__":
    main()
