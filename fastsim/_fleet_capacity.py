"""`fleet_capacity`: the fewest replicas behind a router that meet latency
SLOs at a rate, with stated confidence: `capacity`'s sequential test
(`_capacity._Prober`) at each fleet size, on common random numbers.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._capacity import PROBE_COLUMNS, _check_slo, _Prober, _refuse_capped_stream
from ._config import Scenario
from ._validation import check_float, check_int

__all__ = ["FleetCapacityResult", "fleet_capacity"]


# ------------------------------------------------------------------------------
# Fleet sizing

@dataclass(eq=False)
class FleetCapacityResult:
    """Result of :func:`fleet_capacity`.

    Attributes
    ----------
    replicas : int or None
        The fewest replicas proven to meet every SLO at the scenario's rate
        (None when no probe up to ``max_replicas`` was).
    replicas_interval : tuple of int
        ``(one more than the most replicas proven to violate, replicas)``:
        the smallest fleet whose SLO metrics' means meet the limits lies in
        it when each probe's decision is right.
    probes : pandas.DataFrame
        One row per (probe, SLO metric), as `CapacityResult.probes`, with
        the probe's ``replicas``.
    cost_per_hour : float or None
        ``replicas * Fleet.gpu_hour_price`` when a price is given.
    total_replications : int
    slo : dict
    confidence : float
    seed : object
    elapsed_s : float
    """

    replicas: int | None
    replicas_interval: tuple
    probes: pd.DataFrame
    cost_per_hour: float | None
    total_replications: int
    slo: dict
    confidence: float
    seed: object
    elapsed_s: float = 0.0

    def summary(self) -> pd.DataFrame:
        """One row per probe, sorted by replicas: decision, replications, and
        each SLO metric's estimate and bounds."""
        wide = self.probes.pivot_table(index=["probe", "replicas", "decision", "replications"],
                                       columns="metric", values=["estimate", "ci_low", "ci_high"], sort=False)
        wide.columns = [f"{m}_{stat}" for stat, m in wide.columns]
        return wide.reset_index().sort_values("replicas").reset_index(drop=True)

    def to_frame(self) -> pd.DataFrame:
        """The probes table (`probes`)."""
        return self.probes.copy()

    def __repr__(self):
        return (f"FleetCapacityResult(replicas={self.replicas}, replicas_interval={self.replicas_interval}, "
                f"probes={self.probes['probe'].nunique() if len(self.probes) else 0}, "
                f"cost_per_hour={self.cost_per_hour})")


def _fleet_capacity_iv(scenario, max_replicas):
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    if scenario.fleet is None or not hasattr(scenario.fleet, "mixed"):
        # (a disaggregated server's split: `fastsim.disaggregation_search`)
        raise ValueError(f"scenario.fleet must be a fastsim.Fleet (its router; its replicas are searched), got "
                         f"{scenario.fleet!r}; for a disaggregated server's split use fastsim.disaggregation_search")
    if scenario.fleet.mixed:
        raise ValueError(f"fleet_capacity searches a number of identical replicas; scenario.fleet.replicas is a "
                         f"mixed fleet of {scenario.fleet.n_replicas} listed replicas (which kind to add is not "
                         f"defined): give Fleet(replicas=N) with the scenario's engine and latency, or call "
                         f"fastsim.capacity on the mixed fleet for the largest rate it sustains")
    if scenario.fleet.autoscaler is not None:
        # (a probe of N replicas would be the autoscaled fleet, whatever N: `Fleet` takes replicas=1 with one)
        raise ValueError(f"fleet_capacity searches a static number of replicas; scenario.fleet has an autoscaler "
                         f"({scenario.fleet.autoscaler!r}): give Fleet(replicas=N) without one")
    if scenario.workload.arrival_rate is None:
        raise ValueError("fleet_capacity needs workload.arrival_rate (the rate the replicas must sustain), got None "
                         "(a rate schedule, a trace, users, given arrival times or a pure closed loop, max_concurrency "
                         "without arrival_rate, set no single rate)")
    _refuse_capped_stream("fleet_capacity searches the fewest replicas that meet the SLOs at the arrival_rate",
                          scenario.workload)
    return check_int("max_replicas", max_replicas, low=1)


def fleet_capacity(scenario, slo: dict, confidence: float = 0.95, *, n_replications: int = 100, seed=None,
                   max_replications: int = 3200, max_replicas: int = 1024) -> FleetCapacityResult:
    """The fewest replicas behind the scenario's router that meet every SLO
    at the scenario's arrival rate, with stated confidence.

    Each probe (a fleet size) is `capacity`'s sequential test: replications
    until every SLO metric's one-sided bound on its mean decides *ok* or
    *violates* (Bonferroni over metrics and looks), *inconclusive* after
    ``max_replications`` (treated as not ok). Sizes double from 1 until one
    is ok, then bisect. Every probe uses the same seed: common random
    numbers (the same fleet streams; the router's draws from one stream).
    For the other way round, the largest rate N replicas sustain, call
    `fastsim.capacity` on a scenario with ``Fleet(replicas=N)``.

    Parameters
    ----------
    scenario : Scenario
        With a `Fleet` (its ``replicas`` is ignored).
    slo : dict
        ``{metric: upper limit}``, as `capacity`'s.
    confidence : float
        Each probe's decision holds at this level.
    n_replications, max_replications, seed :
        As `capacity`'s.
    max_replicas : int
        The largest fleet probed.

    Returns
    -------
    FleetCapacityResult
    """
    start = time.perf_counter()
    max_replicas = _fleet_capacity_iv(scenario, max_replicas)
    slo = _check_slo(slo)
    confidence = check_float("confidence", confidence, low=0, high=1, low_open=True, high_open=True)
    n_replications = check_int("n_replications", n_replications, low=2)
    max_replications = check_int("max_replications", max_replications, low=n_replications)
    prober = _Prober(scenario, slo, confidence, n_replications, max_replications, seed)
    rate = float(scenario.workload.arrival_rate)
    sizes, decisions = [], {}

    def probe(m):
        if m not in decisions:
            prober.scenario = scenario.replace(fleet=dataclasses.replace(scenario.fleet, replicas=m))
            prober.cache = {}
            before = len(prober.rows)
            try:
                decisions[m] = prober.probe(rate)
            except ValueError as exc:
                if "reduce replicas" not in str(exc):
                    raise
                # (the search doubles the replicas: name the bound that let it go this far)
                raise ValueError(f"fleet_capacity: no fleet of fewer than {m} replicas met the SLOs, and {m} do "
                                 f"not fit in memory: {exc}; reduce max_replicas (got {max_replicas}) or "
                                 f"num_requests") from None
            sizes.extend([m] * (len(prober.rows) - before))
        return decisions[m]

    bad, good = 0, None     # most replicas not proven ok below the answer; fewest proven ok
    m = 1
    while m <= max_replicas:
        if probe(m) == "ok":
            good = m
            break
        bad = m
        m = min(2 * m, max_replicas) if m < max_replicas else max_replicas + 1
    if good is not None:
        while good - bad > 1:
            mid = (good + bad) // 2
            if probe(mid) == "ok":
                good = mid
            else:
                bad = mid
    probes = pd.DataFrame(prober.rows, columns=list(PROBE_COLUMNS))
    probes.insert(1, "replicas", np.array(sizes, np.int64))
    probes["probe"] = np.repeat(np.arange(len(decisions)), len(slo)) if len(probes) else probes["probe"]
    violating = probes.loc[probes["decision"] == "violates", "replicas"]
    low = int(violating.max()) + 1 if len(violating) else 1
    price = scenario.fleet.gpu_hour_price
    return FleetCapacityResult(
        replicas=good, replicas_interval=(low, good), probes=probes,
        cost_per_hour=None if price is None or good is None else good * price,
        total_replications=int(prober.total), slo=dict(slo), confidence=confidence, seed=prober.seed,
        elapsed_s=time.perf_counter() - start)
