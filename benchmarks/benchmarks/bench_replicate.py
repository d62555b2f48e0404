"""asv benchmarks of `fastsim.replicate` (times and throughput figures)."""

import time

import fastsim

from .common import (alternating_seconds, cost_exponent, floor_args, median_ratio, numpy_floor, reference_workload,
                     scaling_points, seconds, sharegpt_80pct, timed_replicate, warm_up)


class Replicate:
    """By backend: ``cuda`` is skipped (NotImplementedError in setup) without a usable GPU."""
    params = (["numba", "cuda"], [100, 1000, 10000], [200, 1000])
    param_names = ["backend", "n_replications", "num_requests"]
    timeout = 300

    def setup(self, backend, n_replications, num_requests):
        if backend == "cuda":
            from fastsim._cuda import cuda_unavailable_reason

            reason = cuda_unavailable_reason()
            if reason is not None:
                raise NotImplementedError(reason)
        elif n_replications * num_requests > 10 ** 6:
            raise NotImplementedError("large sizes are timed on the GPU only (see throughput.py for the CPU)")
        warm_up()
        self.scenario = reference_workload(num_requests)
        # compile (GPU: the kernels' first launch) outside the timing
        fastsim.replicate(self.scenario, n_replications=2, seed=1, backend=backend, progress=False)

    def time_replicate(self, backend, n_replications, num_requests):
        fastsim.replicate(self.scenario, n_replications=n_replications, seed=1, backend=backend, progress=False)

    def track_requests_per_second(self, backend, n_replications, num_requests):
        start = time.perf_counter()
        fastsim.replicate(self.scenario, n_replications=n_replications, seed=1, backend=backend, progress=False)
        return n_replications * num_requests / (time.perf_counter() - start)

    track_requests_per_second.unit = "requests/s"


class Features:
    params = ["fcfs", "priority", "sjf", "static", "no-chunking", "tight-kv"]
    param_names = ["feature"]

    def setup(self, feature):
        warm_up()
        sc = sharegpt_80pct(1000)
        changes = {"priority": {"engine.policy": "priority"}, "sjf": {"engine.policy": "sjf"},
                   "static": {"engine.scheduler": "static"},
                   "no-chunking": {"engine.enable_chunked_prefill": False},
                   "tight-kv": {"engine.num_gpu_blocks": 600}}.get(feature, {})
        self.scenario = sc.replace(**changes)

    def time_replicate_200(self, feature):
        fastsim.replicate(self.scenario, n_replications=200, seed=1, progress=False)


class Precision:
    """CI half-width reached at a fixed budget of 500 x 1,000 requests (a
    statistical, not a time, figure). The blocking probability's is taken
    with 384 KV blocks instead of 1,024, where KV-reservation admission
    blocks about 3.5% of requests: the reference workload blocks none, and
    a half-width of 0 would track nothing."""

    def setup(self):
        warm_up()
        self.result = fastsim.replicate(reference_workload(1000), n_replications=500, seed=2, progress=False)
        self.blocking = fastsim.replicate(reference_workload(1000).replace(**{"engine.num_gpu_blocks": 384}),
                                          n_replications=500, seed=2, progress=False)

    def track_ttft_p99_relative_half_width(self):
        return self.result.relative_half_width("ttft_p99")

    def track_blocking_half_width(self):
        return self.blocking.confidence_interval("blocking_probability").half_width


class SimPyRatio:
    """fastsim (one thread) vs a plain SimPy simulator of the same model, side
    by side: the median ratio of three rounds (`interleaved_ratios`)."""

    timeout = 600

    def setup(self):
        warm_up()

    def track_ratio_vs_simpy(self):
        from .simpy_model import simpy_run

        def simpy_rate():
            return 5000 / seconds(simpy_run, 5000, 0, fastsim.LatencyModel.default())

        def fastsim_rate():
            return 500 * 1000 / timed_replicate(reference_workload(1000), 500)

        return median_ratio(fastsim_rate, simpy_rate)

    track_ratio_vs_simpy.unit = "x"


class FloorRatio:
    """A replication's time over the issue's drawing floor (Numba's ``np.random``
    drawing the same requests' gaps and lengths, nothing else), one thread,
    reference workload: the median of three rounds of 500 replications
    (`interleaved_ratios`), and the ratio of the fastest of 100 alternating
    calls of 100 replications (`alternating_seconds`), the steadier of the two.
    The issue's target is about 2x."""

    timeout = 300

    def setup(self):
        import numpy as np

        warm_up()
        self.scenario = reference_workload(1000)
        self.out = np.empty(500)
        numpy_floor(0, 2, *floor_args(self.scenario), self.out)   # compile outside the timing

    def track_ratio_to_drawing_floor(self):
        return median_ratio(lambda: timed_replicate(self.scenario, 500),
                            lambda: seconds(numpy_floor, 0, 500, *floor_args(self.scenario), self.out))

    track_ratio_to_drawing_floor.unit = "x"

    def track_fastest_ratio_to_drawing_floor(self):
        full, floor = alternating_seconds(lambda: timed_replicate(self.scenario, 100),
                                          lambda: numpy_floor(0, 100, *floor_args(self.scenario), self.out), 100)
        return min(full) / min(floor)

    track_fastest_ratio_to_drawing_floor.unit = "x"


class Scaling:
    """The exponent b of cost ~ size ** b along replications (of 500 requests)
    and requests (a replication, about 1,500,000 requests per point), one
    thread: the issue's target is a linear cost, b = 1. One pass over three
    sizes 4x apart (requests from 4,000 to 64,000 a replication, where the
    cost per request rose by 27-37% until the buffers were kept across
    chunks, README); ``benchmarks/scaling.py`` measures it in interleaved
    rounds with an interval and the exponent between neighbouring sizes,
    and with ``--paired`` long replications against short ones."""

    params = ["replications", "requests"]
    param_names = ["axis"]
    timeout = 300
    sizes = {"replications": (125, 500, 2000), "requests": (4000, 16000, 64000)}

    def setup(self, axis):
        warm_up()
        self.points = scaling_points(reference_workload, axis, self.sizes[axis], 1_500_000, n_requests=500)
        for _, scenario, _, _ in self.points:
            timed_replicate(scenario, 2)

    def track_cost_exponent(self, axis):
        return cost_exponent([size for size, _, _, _ in self.points],
                             [timed_replicate(scenario, reps) / per for _, scenario, reps, per in self.points])

    track_cost_exponent.unit = "exponent"
