"""asv benchmarks of the study tools, the analytical models, the calibration,
and the kernel's scaling (output length, cold compilation)."""

import os
import subprocess
import sys
import tempfile
import time

import fastsim
from fastsim import _calibration

from .common import output_length_scenario, reference_workload, warm_up


class Sweep:
    """A 3 x 2 grid of 100 replications each, through the joblib wrapper."""
    params = [1, 2]
    param_names = ["n_jobs"]
    timeout = 300

    def setup(self, n_jobs):
        warm_up()
        self.scenario = reference_workload(1000)
        self.grid = {"workload.arrival_rate": [2.0, 4.0, 6.0], "engine.max_num_seqs": [16, 32]}

    def time_sweep(self, n_jobs):
        fastsim.sweep(self.scenario, self.grid, n_replications=100, seed=1, n_jobs=n_jobs, progress=False)


class Analytical:
    """`fastsim.analytical.predict` on the issue-7 workload, by model."""
    params = ["knapsack", "birth_death", "ctmc"]
    param_names = ["model"]
    timeout = 120

    def setup(self, model):
        self.scenario = reference_workload(1000)

    def time_predict(self, model):
        fastsim.analytical.predict(self.scenario, model=model)


class Calibration:
    """Fitting the step-time model to the packaged A10G TPOT traces."""

    def time_fit_tpot_traces(self):
        _calibration.fit_tpot_traces()


def _us_per_request(median, n_replications=200):
    start = time.perf_counter()
    fastsim.replicate(output_length_scenario(median), n_replications=n_replications, seed=0, n_threads=1,
                      progress=False)
    return (time.perf_counter() - start) / (n_replications * 1000) * 1e6


class OutputLength:
    """Cost per request against output length (event skipping should keep it
    nearly flat although the engine steps grow with the length); one thread."""
    params = [32, 128, 512, 2048]
    param_names = ["output_median"]
    timeout = 300

    def setup(self, output_median):
        warm_up()

    def track_us_per_request(self, output_median):
        return _us_per_request(output_median)

    track_us_per_request.unit = "us/request"


class OutputLengthRatio:
    def setup(self):
        warm_up()

    def track_cost_ratio_2048_vs_32(self):
        """Cost per request at output median 2048 over that at 32 (94x the engine steps)."""
        return _us_per_request(2048) / _us_per_request(32)

    track_cost_ratio_2048_vs_32.unit = "x"


class ColdCompile:
    """Every kernel a workload needs JIT-compiled from an empty Numba cache, in
    a fresh process: the reference workload ("common": the engine without
    static batching, priority/swap preemption and prefix caching) or the same
    with prefix caching ("full": the engine with every option); with the
    compile helper (a second process compiles the engine's callees and the
    entries other than the engine, ``_numba_options.compile_entries``) or
    without it
    (``FASTSIM_COMPILE_HELPER=0``: one process compiles everything)."""
    timeout = 600
    params = (["common", "full"], ["on", "off"])
    param_names = ["engine", "helper"]

    def track_cold_compile_seconds(self, engine, helper):
        workload = {"common": "reference_workload", "full": "full_engine_workload"}[engine]
        with tempfile.TemporaryDirectory() as cache:
            return _first_run_seconds(workload, NUMBA_CACHE_DIR=cache,
                                      FASTSIM_COMPILE_HELPER="1" if helper == "on" else "0")

    track_cold_compile_seconds.unit = "s"


def _first_run_seconds(workload, **env):
    """Seconds from a fresh interpreter's start to the end of its first
    `replicate`, `sample_requests` and `simulate_requests` calls on 20
    requests of ``workload`` (a function of `common`), the import included,
    with ``env`` added to the environment."""
    code = ("import time; t = time.perf_counter(); import fastsim; "
            f"from benchmarks.common import {workload} as w; "
            "fastsim.replicate(w(20), n_replications=2, seed=0); "
            "s = fastsim.sample_requests(w(20), seed=0); fastsim.simulate_requests(w(20), s); "
            "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, **env}, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return float(out.stdout.split()[-1])


class Startup:
    """A fresh interpreter with a warm Numba cache: ``import fastsim`` alone
    (it compiles nothing and leaves SciPy out), and the
    import with the first calls (the performance issue's warm start)."""
    timeout = 300

    def setup(self):
        warm_up()   # compiled into the cache the child processes load from

    def timeraw_import_fastsim(self):
        return "import fastsim"

    def track_warm_start_seconds(self):
        return _first_run_seconds("reference_workload")

    track_warm_start_seconds.unit = "s"
