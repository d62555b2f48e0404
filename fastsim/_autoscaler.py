"""The autoscaling policy, `Autoscaler` (`Fleet(autoscaler=...)`): its
settings, validated, and the kernel's record of them (`kernel.layout.AS_*`).
The fleet that runs it: `fastsim._autoscale`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernel as K
from ._validation import MAX_CLOCK_S, check_choice, check_float, check_int

__all__ = ["Autoscaler"]

METRICS = tuple(K.AS_METRIC_CODES)


@dataclass(frozen=True)
class Autoscaler:
    """A policy that sets how many replicas a fleet holds, over time.

    Every ``interval_s`` seconds it reads the serving replicas' state and
    asks for ``ceil(total / target)`` replicas, as Kubernetes' Horizontal Pod
    Autoscaler does (``total``: the metric summed over the serving replicas;
    no change while ``|total / (serving x target) - 1| <= tolerance``), plus
    ``spare_replicas``, within ``[min_replicas, max_replicas]``.
    ``docs/engine-model.md``, "Autoscaling fleets", states the rule in full.

    Parameters
    ----------
    metric : {"queue_depth", "kv_utilisation", "rate"}
        ``"queue_depth"``: requests waiting (vLLM's ``num_requests_waiting``);
        ``"kv_utilisation"``: the fraction of KV blocks in use (vLLM's
        ``kv_cache_usage_perc``); ``"rate"``: the fleet's arrivals per second
        over the last interval.
    target : float
        The metric's target per replica (> 0; at most 1 for ``kv_utilisation``).
    interval_s : float
        Seconds between evaluations (>= 0.01), at ``interval_s``, ``2 interval_s``, ...
    min_replicas, max_replicas : int
        Bounds on the replicas asked for (1 <= min <= max). ``max_replicas``
        also bounds the replicas held at once, draining ones included.
    provisioning_delay_s : float
        Seconds from a scale-out decision until the new replica serves (>= 0).
    scale_in_cooldown_s : float
        No scale-in within this many seconds of the start or of the last
        scaling action (>= 0).
    initial_replicas : int, optional
        Replicas serving at time 0 (default ``min_replicas``), within the bounds.
    tolerance : float
        HPA's tolerance (>= 0; Kubernetes' default 0.1).
    spare_replicas : int
        Replicas kept beyond the rule's (>= 0): ``1`` keeps one idle replica
        ready for a burst.
    gpus_per_replica : int
        GPUs each replica holds (its tensor-parallel size), for the GPU-hours.
    window_attainment : float
        A window (the interval before an evaluation) counts as violating the
        SLO when fewer than this fraction of its arrivals complete within the
        scenario's ``ttft_slo_s``/``tpot_slo_s``; ``slo_violation_minutes``
        sums those windows.

    Notes
    -----
    A draining replica gets no new request and leaves at the first
    evaluation that finds it empty; a replica counts toward the GPU-hours
    from its scale-out decision (provisioning included) until it leaves, or
    the run ends (the last departure, or the horizon).
    """

    metric: str = "queue_depth"
    target: float = 4.0
    interval_s: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 8
    provisioning_delay_s: float = 0.0
    scale_in_cooldown_s: float = 300.0
    initial_replicas: int | None = None
    tolerance: float = 0.1
    spare_replicas: int = 0
    gpus_per_replica: int = 1
    window_attainment: float = 0.95

    def __post_init__(self):
        s = object.__setattr__
        check_choice("metric", self.metric, METRICS)
        s(self, "target", check_float("target", self.target, low=0, low_open=True,
                                      high=1.0 if self.metric == "kv_utilisation" else None))
        # (each evaluation a row of the run's table, and a look at every replica held: at least 10 ms apart)
        s(self, "interval_s", check_float("interval_s", self.interval_s, low=0.01, high=MAX_CLOCK_S))
        s(self, "min_replicas", check_int("min_replicas", self.min_replicas, low=1, high=4096))
        s(self, "max_replicas", check_int("max_replicas", self.max_replicas, low=self.min_replicas, high=4096))
        s(self, "provisioning_delay_s", check_float("provisioning_delay_s", self.provisioning_delay_s, low=0))
        s(self, "scale_in_cooldown_s", check_float("scale_in_cooldown_s", self.scale_in_cooldown_s, low=0))
        init = self.min_replicas if self.initial_replicas is None else self.initial_replicas
        s(self, "initial_replicas", check_int("initial_replicas", init, low=self.min_replicas,
                                              high=self.max_replicas))
        s(self, "tolerance", check_float("tolerance", self.tolerance, low=0))
        s(self, "spare_replicas", check_int("spare_replicas", self.spare_replicas, low=0, high=4096))
        s(self, "gpus_per_replica", check_int("gpus_per_replica", self.gpus_per_replica, low=1, high=4096))
        s(self, "window_attainment", check_float("window_attainment", self.window_attainment, low=0, high=1))

    def _record(self) -> np.ndarray:
        """The kernel's policy record (`kernel.layout.AS_*`)."""
        a = np.zeros(K.N_APAR)
        a[K.AS_METRIC] = K.AS_METRIC_CODES[self.metric]
        a[K.AS_TARGET], a[K.AS_INTERVAL] = self.target, self.interval_s
        a[K.AS_MIN], a[K.AS_MAX], a[K.AS_INITIAL] = self.min_replicas, self.max_replicas, self.initial_replicas
        a[K.AS_DELAY], a[K.AS_COOLDOWN] = self.provisioning_delay_s, self.scale_in_cooldown_s
        a[K.AS_TOLERANCE], a[K.AS_SPARE], a[K.AS_GPUS] = self.tolerance, self.spare_replicas, self.gpus_per_replica
        return a
