"""fastsim: fast, statistically rigorous simulation of LLM inference serving.

The engine model is specified in ``docs/engine-model.md``. Start with
:func:`replicate`::

    import fastsim
    scenario = fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=6822),
        workload=fastsim.Workload(arrival_rate=4.0, num_requests=1000,
                                  prompt_len=fastsim.LogNormal(median=256, sigma=0.55),
                                  output_len=128),
    )
    result = fastsim.replicate(scenario, n_replications=1000, seed=0)
    print(result.summary())
"""

from ._config import BucketPredictor, EngineConfig, LogNormalPredictor, Scenario, Workload
from ._sessions import Sessions
from ._distributions import (Empirical, Exponential, Fixed, Gamma, Geometric, Histogram, LengthDistribution,
                             LengthTrace, LogNormal, Mixture, Truncated, Uniform, sharegpt_lengths)
from ._classes import RequestClasses
from ._latency import LatencyModel, StepNoise
from ._traces import RequestTrace
from ._hardware import GPU
from ._deployment import Deployment
from ._roofline import Roofline, RooflineLatency
from ._replicate import (METRIC_DESCRIPTIONS, Interrupted, ReplicateResult, compile_kernels, replicate, sample_requests,
                         simulate_requests)
from ._stats import ConfidenceInterval
from ._sweep import SweepResult, sweep
from ._compare import CompareResult, compare
from ._capacity import CapacityResult, capacity
from ._fleet import Fleet
from ._rate_schedule import RateSchedule
from ._autoscaler import Autoscaler
from ._autoscale_run import AutoscaleRun, simulate_autoscaled
from ._disagg import Disaggregated
from ._disagg_search import DisaggregationSearchResult, disaggregation_search
from ._fleet_capacity import FleetCapacityResult, fleet_capacity
from ._plot import plot_sweep
from . import analytical, testing  # noqa: E402  (fastsim.analytical.predict, fastsim.testing...)

__version__ = "0.1.0"

__all__ = [
    "RateSchedule", "Autoscaler", "AutoscaleRun", "simulate_autoscaled", "Disaggregated", "DisaggregationSearchResult", "disaggregation_search",
    "BucketPredictor", "CapacityResult", "Fleet", "FleetCapacityResult", "fleet_capacity", "CompareResult", "ConfidenceInterval", "Deployment", "Empirical",
    "EngineConfig", "Exponential", "Fixed", "GPU", "Gamma", "Geometric", "Histogram", "Interrupted", "LatencyModel", "StepNoise", "LengthDistribution", "LengthTrace", "LogNormal",
    "LogNormalPredictor", "Roofline", "RooflineLatency",
    "METRIC_DESCRIPTIONS", "Mixture", "ReplicateResult", "RequestClasses", "RequestTrace", "Scenario", "Sessions", "SweepResult", "Truncated", "Uniform", "Workload",
    "capacity", "compare", "compile_kernels", "plot_sweep", "replicate", "sample_requests", "sharegpt_lengths",
    "simulate_requests", "sweep", "testing", "analytical",
]
