"""Autoscaling fleets: `Autoscaler`, the policy that sets a fleet's replicas
over time (`Fleet(autoscaler=...)`), run by `replicate`/`compare` like a
static fleet (`run_autoscaled`, the compiled `kernel.autoscale`), and
`simulate_autoscaled`, one replication's evaluations over time
(`AutoscaleRun.to_frame()`).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import kernel as K
from .kernel import autoscale as A
from .kernel import cluster
from ._validation import check_choice, check_float, check_int

__all__ = ["Autoscaler", "AutoscaleRun", "simulate_autoscaled", "run_autoscaled"]

METRICS = tuple(K.AS_METRIC_CODES)
#: Routers an autoscaled fleet takes (the affinity routers' tables would
#: name replicas that come and go).
ROUTERS = ("random", "round_robin", "least_outstanding", "vllm_dp", "jsq", "power_of_two", "least_kv")


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
        Seconds between evaluations (> 0), at ``interval_s``, ``2 interval_s``, ...
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
        s(self, "interval_s", check_float("interval_s", self.interval_s, low=0, low_open=True))
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


def check_autoscaled(scenario) -> None:
    """What an autoscaled fleet refuses, before any kernel runs."""
    f = scenario.fleet
    if f.router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)} with an autoscaler (an affinity router's "
                         f"table would name replicas that come and go), got {f.router!r}")
    if f.router_staleness_s != 0.0:
        raise ValueError(f"router_staleness_s must be 0 with an autoscaler (live state), got {f.router_staleness_s!r}")
    if scenario.engine.enable_prefix_caching:
        raise ValueError("enable_prefix_caching must be False with an autoscaler (a replica that starts again "
                         "would keep the cache of the one that left), got True")
    if scenario.workload.closed_loop:
        raise ValueError("max_concurrency must be None with an autoscaler (an open-loop stream), got "
                         f"{scenario.workload.max_concurrency!r}")


def _violation_minutes(windows, nwin, interval, attainment):
    arr = windows[:nwin, K.W_ARRIVALS]
    met = windows[:nwin, K.W_SLO_MET]
    bad = (arr > 0) & (met < attainment * arr)
    return float(bad.sum()) * interval / 60.0


class _Worker:
    """One thread's buffers (as `_fleet._FleetWorker`, and the policy's)."""

    def __init__(self, num_requests, nrep):
        from ._fleet import _FleetWorker
        self.fleet = _FleetWorker(num_requests, nrep, 0)
        self.nrep = nrep
        self.ab = None

    def policy_buffers(self, nwin):
        if self.ab is None or self.ab.windows.shape[0] < nwin:
            self.ab = A.autoscale_buffers(self.nrep, nwin)
        return self.ab


def _one_run(worker, rep, k0, k1, packed, full):
    """One replication; returns (stream, fleet buffers, policy buffers, wm_i, wm_f, lat, fpar)."""
    arrays = K.scenario_arrays(packed, lat=False)
    buf = worker.fleet.buf
    n = K._draw_workload(np.int64(rep), np.uint64(k0), np.uint64(k1), *arrays, buf.state, *buf.requests)
    stream = tuple(c[:n] for c in buf.requests)
    ipar = packed["ipar"]
    lat, fpar = K.run_records(packed["lat"], packed["fpar"], k0, k1, rep)
    need_i, need_f = K._ws_need(np.int64(n), stream[1], stream[2], stream[5], stream[6], ipar)
    fb, wm_i, wm_f = worker.fleet.buffers(n, need_i, need_f)
    apar = packed["apar"]
    nwin = A._window_guess(stream[0], apar)
    while True:
        ab = worker.policy_buffers(nwin)
        rc = A._simulate_autoscaled(np.int64(n), *stream, ipar, fpar, lat, packed["fleet"],
                                    np.int64(packed["router"]), apar, np.uint64(k0), np.uint64(k1),
                                    np.int64(rep), fb, ab, full)
        if rc != K.AS_WINDOWS_FULL:
            break
        nwin = 2 * ab.windows.shape[0]
    if rc < 0:
        raise RuntimeError(f"the autoscaled fleet could not be simulated (code {rc})")
    nw = int(ab.out[A.O_NWIN])
    A._window_slo(np.int64(n), stream[0], stream[2], ipar, fpar, float(apar[K.AS_INTERVAL]), fb, ab.windows, nw)
    return n, stream, fb, ab, wm_i, wm_f, fpar


def _one(worker, rep, k0, k1, packed, scaler, full, out_row):
    n, stream, fb, ab, wm_i, wm_f, fpar = _one_run(worker, rep, k0, k1, packed, full)
    m = scaler.max_replicas
    c0, c1 = K.N_COLUMNS, K.N_COLUMNS + K.N_FLEET_COLUMNS
    cluster._reduce_fleet(np.int64(n), stream[0], stream[2], packed["ipar"], fpar, np.int64(m),
                          packed["fleet"][K.FL_LATENCY], fb, wm_i, wm_f, out_row[:c0], out_row[c0:c1])
    nw = int(ab.out[A.O_NWIN])
    held_s = sum(ab.life.tolist())
    end = float(ab.out[A.O_END])
    out_row[c1:] = (held_s * scaler.gpus_per_replica / 3600.0,
                    _violation_minutes(ab.windows, nw, scaler.interval_s, scaler.window_attainment),
                    held_s / end if end > 0 else np.nan, ab.out[A.O_PEAK], ab.out[A.O_EVENTS])


def run_autoscaled(scenario, packed, k0, k1, rep0, nrep, threads=1):
    """Rows (``nrep`` x (`COLUMNS` + `FLEET_COLUMNS` + `AUTOSCALE_COLUMNS`))
    of replications ``rep0 ..`` of an autoscaled fleet, on ``threads``
    threads; each replication keyed by its index alone. The fleet's means
    over replicas (batch occupancy, KV use) and its load balance are over
    the ``max_replicas`` rows."""
    scaler = scenario.fleet.autoscaler
    full = K.engine_variant(packed["ipar"])
    out = np.empty((nrep, K.N_COLUMNS + K.N_FLEET_COLUMNS + K.N_AUTOSCALE_COLUMNS))
    threads = max(1, min(threads, nrep))
    local = threading.local()

    def work(lo, hi):
        worker = getattr(local, "worker", None)
        if worker is None:
            worker = local.worker = _Worker(scenario.workload.num_requests, scaler.max_replicas)
        for j in range(lo, hi):
            _one(worker, rep0 + j, k0, k1, packed, scaler, full, out[j])

    if threads == 1:
        work(0, nrep)
    else:
        size = -(-nrep // (4 * threads))
        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(work, lo, min(nrep, lo + size)) for lo in range(0, nrep, size)]:
                f.result()
    return out


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
        Per request: arrival, replica row, status code, first token and finish times.
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
    from ._replicate import _seed_keys, pack_scenario
    if scenario.fleet is None or scenario.fleet.autoscaler is None:
        raise ValueError("scenario must have a fleet with an autoscaler (Fleet(autoscaler=Autoscaler(...))), "
                         f"got fleet={scenario.fleet!r}")
    check_autoscaled(scenario)
    replication = check_int("replication", replication, low=0)
    scaler = scenario.fleet.autoscaler
    packed = pack_scenario(scenario)
    k0, k1, _ = _seed_keys(seed)
    worker = _Worker(scenario.workload.num_requests, scaler.max_replicas)
    n, stream, fb, ab, _, _, fpar = _one_run(worker, replication, k0, k1, packed, K.engine_variant(packed["ipar"]))
    nw = int(ab.out[A.O_NWIN])
    w = pd.DataFrame(ab.windows[:nw].copy(), columns=list(K.WINDOW_COLUMNS))
    for c in ("replicas_serving", "replicas_provisioning", "replicas_draining", "desired", "arrivals", "slo_met"):
        w[c] = w[c].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        w["slo_attainment"] = np.where(w["arrivals"] > 0, w["slo_met"] / w["arrivals"].where(w["arrivals"] > 0), np.nan)
    owner, local = fb.owner[:n], fb.local[:n]
    req = pd.DataFrame({
        "arrival_s": stream[0].copy(), "replica": owner.copy(),
        "status": np.array([fb.wi[r][K.WI_STATUS * n + j] for r, j in zip(owner, local)], np.int64),
        "first_token_s": np.array([fb.wf[r][K.WF_FIRST * n + j] for r, j in zip(owner, local)]),
        "finish_s": np.array([fb.wf[r][K.WF_FINISH * n + j] for r, j in zip(owner, local)])})
    held_s = sum(ab.life.tolist())
    return AutoscaleRun(windows=w, gpu_hours=held_s * scaler.gpus_per_replica / 3600.0,
                        slo_violation_minutes=_violation_minutes(ab.windows, nw, scaler.interval_s,
                                                                 scaler.window_attainment),
                        end_s=float(ab.out[A.O_END]), requests=req)
