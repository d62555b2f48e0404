"""One replication of an autoscaled fleet over time: `simulate_autoscaled`
and its result, `AutoscaleRun` (the evaluations' table, `to_frame()`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import kernel as K
from ._autoscale import _one_run, _per_request, _violation_minutes, _Worker
from ._fleet import trace_block_size
from ._replicate import _seed_keys, pack_scenario
from ._validation import check_int
from .kernel import autoscale as A

__all__ = ["AutoscaleRun", "simulate_autoscaled"]


@dataclass(frozen=True)
class AutoscaleRun:
    """One replication of an autoscaled fleet, over time.

    Attributes
    ----------
    windows : pandas.DataFrame
        One row per evaluation (`kernel.layout.WINDOW_COLUMNS`: its time,
        the replicas serving, provisioning and draining, the metric and the
        replicas the rule asked for, requests waiting and in the system,
        the window's arrivals and how many of them met the SLOs) and
        ``slo_attainment`` (``slo_met / arrivals``).
    gpu_hours : float
        GPU-hours held (provisioning and draining included).
    slo_violation_minutes : float
        Minutes of windows whose attainment is below the policy's
        ``window_attainment``.
    end_s : float
        The run's end (the last departure, or the horizon).
    requests : pandas.DataFrame
        Per request: arrival, replica row, status code, first token and
        finish times, preemptions.
    """

    windows: pd.DataFrame
    gpu_hours: float
    slo_violation_minutes: float
    end_s: float
    requests: pd.DataFrame

    def to_frame(self) -> pd.DataFrame:
        """The evaluations' table."""
        return self.windows.copy()

    def summary(self) -> pd.Series:
        """GPU-hours, SLO-violation minutes, the run's end, the most replicas
        serving and the lowest window attainment."""
        w = self.windows
        return pd.Series({"gpu_hours": self.gpu_hours, "slo_violation_minutes": self.slo_violation_minutes,
                          "end_s": self.end_s, "replicas_serving_max": w["replicas_serving"].max(),
                          "slo_attainment_min": w["slo_attainment"].min()})


def simulate_autoscaled(scenario, seed=None, replication: int = 0) -> AutoscaleRun:
    """One replication of an autoscaled fleet, with its evaluations over time.

    Parameters
    ----------
    scenario : Scenario
        With ``fleet=Fleet(autoscaler=Autoscaler(...))``.
    seed : int, optional
        As `replicate`'s: replication ``replication`` here is that of
        ``replicate(scenario, seed=seed)`` (the same requests, the same
        per-replication metrics).
    replication : int
        Which replication (>= 0).

    Returns
    -------
    AutoscaleRun
        The evaluations' table, GPU-hours, SLO-violation minutes, the run's
        end and the per-request results.

    Examples
    --------
    >>> import fastsim
    >>> sc = fastsim.Scenario(
    ...     workload=fastsim.Workload(rate_schedule=fastsim.RateSchedule([0, 60], [2.0, 10.0]),
    ...                               num_requests=2000, horizon_s=180.0),
    ...     ttft_slo_s=1.0,
    ...     fleet=fastsim.Fleet(autoscaler=fastsim.Autoscaler(metric="rate", target=4.0, interval_s=15.0)))
    >>> run = fastsim.simulate_autoscaled(sc, seed=0)
    >>> run.to_frame()[["t_s", "replicas_serving", "slo_attainment"]]   # doctest: +SKIP
    """
    if scenario.fleet is None or scenario.fleet.autoscaler is None:
        raise ValueError("scenario must have a fleet with an autoscaler (Fleet(autoscaler=Autoscaler(...))), "
                         f"got fleet={scenario.fleet!r}")
    from ._replicate import check_runnable

    check_runnable(scenario, "numba")   # (`check_autoscaled`, the engine's options: as `replicate`)
    replication = check_int("replication", replication, low=0)
    scaler = scenario.fleet.autoscaler
    packed = pack_scenario(scenario)
    k0, k1, _ = _seed_keys(seed)
    worker = _Worker(scenario.workload.num_requests, scaler.max_replicas, trace_block_size(scenario))
    n, stream, fb, ab, _, _, fpar = _one_run(worker, replication, k0, k1, packed, K.engine_variant(packed["ipar"]))
    nw = int(ab.out[A.O_NWIN])
    w = pd.DataFrame(ab.windows[:nw].copy(), columns=list(K.WINDOW_COLUMNS))
    for c in ("replicas_serving", "replicas_provisioning", "replicas_draining", "desired", "arrivals", "slo_met"):
        w[c] = w[c].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        w["slo_attainment"] = np.where(w["arrivals"] > 0, w["slo_met"] / w["arrivals"].where(w["arrivals"] > 0), np.nan)
    status, first, finish, npre = _per_request(n, fb)
    req = pd.DataFrame({"arrival_s": stream[0].copy(), "replica": fb.owner[:n].copy(), "status": status,
                        "first_token_s": first, "finish_s": finish, "num_preemptions": npre})
    held_s = sum(ab.life.tolist())
    return AutoscaleRun(windows=w, gpu_hours=held_s * scaler.gpus_per_replica / 3600.0,
                        slo_violation_minutes=_violation_minutes(ab.windows, nw, scaler.interval_s,
                                                                 scaler.window_attainment),
                        end_s=float(ab.out[A.O_END]), requests=req)
