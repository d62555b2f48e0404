"""The xPyD search (`disaggregation_search`): the best split of a GPU budget
between a prefill and a decode pool (`fastsim.Disaggregated`), beside
co-located serving on the same GPUs, on common random numbers.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._capacity import _check_slo
from ._config import Scenario
from ._disagg import Disaggregated, _tp
from ._fleet import Fleet
from ._replicate import _check_replicate_memory, replicate
from ._stats import check_confidence_level, mean_interval
from ._validation import check_int

__all__ = ["DisaggregationSearchResult", "disaggregation_search"]


@dataclass(eq=False)
class DisaggregationSearchResult:
    """Result of :func:`disaggregation_search`.

    Attributes
    ----------
    best : str or None
        The configuration (``"xPyD"`` or ``"co-located"``) that meets every
        SLO with the most room (smallest largest ratio of a metric's upper
        confidence bound to its limit); None when none is proven to meet them.
    table : pandas.DataFrame
        One row per configuration: ``config``, ``prefill``, ``decode``,
        ``replicas`` (co-located), ``gpus``; for each SLO metric its mean and
        interval, and its paired difference from co-located serving (same
        replications, common random numbers) with an interval; ``meets``;
        ``cost_per_hour`` when a GPU-hour price is given.
    results : dict of str to ReplicateResult
        Each configuration's replications.
    slo : dict
    confidence : float
    seed : object
    elapsed_s : float
    """

    best: str | None
    table: pd.DataFrame
    results: dict
    slo: dict
    confidence: float
    seed: object
    elapsed_s: float = 0.0

    def summary(self) -> pd.DataFrame:
        return self.table

    to_frame = summary

    def confidence_interval(self, config: str, metric: str):
        """The interval of one configuration's metric."""
        if config not in self.results:
            raise ValueError(f"config must be one of {', '.join(self.results)}, got {config!r}")
        return self.results[config].confidence_interval(metric, self.confidence)

    def __repr__(self):
        return f"DisaggregationSearchResult(best={self.best!r}, configurations={len(self.results)})"


def _splits(gpus, tp_p, tp_d):
    """Every (P, D) >= 1 whose GPUs fit ``gpus``, each P with the most decode replicas left."""
    out = []
    p = 1
    while p * tp_p + tp_d <= gpus:
        out.append((p, (gpus - p * tp_p) // tp_d))
        p += 1
    return out


def disaggregation_search(scenario: Scenario, gpus: int, slo: dict, *, confidence: float = 0.95,
                          n_replications: int = 100, seed=0, router: str = "jsq",
                          n_threads: int | None = None) -> DisaggregationSearchResult:
    """The best split of ``gpus`` GPUs between a prefill and a decode pool
    (xPyD), beside co-located serving on the same GPUs, on common random numbers.

    Parameters
    ----------
    scenario : Scenario
        The traffic (its workload), the co-located server (its engine and
        latency) and, as ``scenario.fleet``, a `Disaggregated` template (its
        link, servers and routers; its pool sizes are what is searched), or
        None: both pools the scenario's server, an instant link.
    gpus : int
        The GPU budget (>= 2); a replica takes its server's tensor-parallel size.
    slo : dict
        ``{metric: upper limit}`` (as `capacity`'s), e.g. ``{"ttft_p99": 1.0}``.
    confidence : float
        Level of the intervals; a configuration meets the SLOs when every
        metric's interval lies below its limit.
    n_replications : int
        Replications per configuration (the same for all: paired).
    seed : int or SeedSequence
        The seed every configuration runs with.
    router : str
        The co-located fleet's router (and both pools', without a template).
    n_threads : int, optional
        Threads for each `replicate`.

    Returns
    -------
    DisaggregationSearchResult
    """
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    gpus = check_int("gpus", gpus, low=2)
    slo = _check_slo(slo)
    confidence = check_confidence_level(confidence)
    n_replications = check_int("n_replications", n_replications, low=2)
    template = scenario.fleet
    if template is None:
        template = Disaggregated(prefill=Fleet(1, router=router), decode=Fleet(1, router=router))
    elif not isinstance(template, Disaggregated):
        raise ValueError(f"scenario.fleet must be None or a fastsim.Disaggregated (the template), got {template!r}")
    t0 = time.perf_counter()
    # (a replica takes its server's tensor-parallel size in GPUs: the scenario's own server too)
    tp = _tp(None, scenario.latency)
    if gpus < tp:
        raise ValueError(f"gpus must be at least the scenario's tensor-parallel size ({tp}), got {gpus!r}")
    configs = {"co-located": dataclasses.replace(scenario, fleet=Fleet(replicas=gpus // tp, router=router))}
    try:   # (the largest fleet of the search, before the splits are built: 1e6 GPUs took 73 s to fail)
        _check_replicate_memory(configs["co-located"], n_replications, "numba", n_threads, "disaggregation_search")
    except ValueError as exc:
        raise ValueError(f"gpus={gpus!r}: {exc}".replace("reduce replicas", "reduce gpus")) from None
    shape = {"co-located": (0, 0, (gpus // tp) * tp)}
    for p, d in _splits(gpus, _tp(template.prefill_server, scenario.latency),
                        _tp(template.decode_server, scenario.latency)):
        dis = dataclasses.replace(template, prefill=dataclasses.replace(template.prefill, replicas=p),
                                  decode=dataclasses.replace(template.decode, replicas=d))
        configs[dis.label()] = dataclasses.replace(scenario, fleet=dis)
        shape[dis.label()] = (p, d, dis.gpus(scenario.latency))
    if len(configs) == 1:
        raise ValueError(f"gpus must leave room for one prefill and one decode replica, got {gpus!r}")
    results = {k: replicate(sc, n_replications, seed=seed, confidence_level=confidence, n_threads=n_threads,
                            progress=False) for k, sc in configs.items()}
    base = results["co-located"].per_replication
    rows = []
    for k, res in results.items():
        p, d, g = shape[k]
        row = {"config": k, "prefill": p, "decode": d, "replicas": g // tp if k == "co-located" else 0, "gpus": g}
        ok, room = True, 0.0
        for m, limit in slo.items():
            x = res.per_replication[m].to_numpy()
            est, lo, hi, _, _ = mean_interval(x, confidence)
            dd = mean_interval(x - base[m].to_numpy(), confidence)
            row.update({m: est, f"{m}_low": lo, f"{m}_high": hi, f"{m}_vs_colocated": dd[0],
                        f"{m}_vs_colocated_low": dd[1], f"{m}_vs_colocated_high": dd[2]})
            ok = ok and bool(hi <= limit)
            room = max(room, hi / limit) if np.isfinite(hi) else math.inf
        row["meets"] = ok
        row["slo_ratio"] = room
        price = template.gpu_hour_price
        row["cost_per_hour"] = g * price if price is not None else np.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    feasible = table[table["meets"]]
    best = None if feasible.empty else str(feasible.sort_values(["slo_ratio", "gpus"], kind="stable")
                                           ["config"].iloc[0])
    return DisaggregationSearchResult(best=best, table=table, results=results, slo=slo, confidence=confidence,
                                      seed=seed, elapsed_s=time.perf_counter() - t0)
