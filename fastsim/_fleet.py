"""Fleets: several replicas of one server behind a router (`Fleet`), run by
`replicate`/`compare`/`sweep`/`capacity` like one replica (`run_fleet`,
the compiled `kernel.cluster`), and `fleet_capacity`: the fewest replicas
that meet latency SLOs at a rate, with stated confidence, on common random
numbers across probes.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import kernel as K
from .kernel import cluster
from ._validation import check_float, check_int

__all__ = ["Fleet", "FleetCapacityResult", "fleet_capacity"]

ROUTERS = tuple(K.ROUTER_CODES)


@dataclass(frozen=True)
class Fleet:
    """Identical replicas of the scenario's server behind a router.

    Parameters
    ----------
    replicas : int
        How many replicas (>= 1); each has the scenario's ``engine`` and
        ``latency``, and the scenario's ``workload`` is the fleet's (its
        ``arrival_rate`` the fleet's rate).
    router : str
        ``"random"``, ``"round_robin"``, ``"least_outstanding"`` (fewest
        requests the router sent that have not come back; never stale),
        ``"vllm_dp"`` (vLLM's data-parallel score ``4 * waiting + running``),
        ``"jsq"`` (join the shortest queue: fewest waiting + running, as
        the replica reports), ``"power_of_two"`` (the shorter of two drawn
        at random), ``"least_kv"`` (least KV cache in use),
        ``"prefix_affinity"`` (a prefix group's requests to the replica
        that had it last, unless its load exceeds the least loaded's by more
        than ``prefix_load_cap``) or ``"session_affinity"`` (a prefix group,
        one conversation, stays on one replica). Ties: the lowest replica.
    router_staleness_s : float
        The router sees the replicas' state as of its last scrape, every
        ``router_staleness_s`` seconds (0: live state). ``least_outstanding``
        counts itself and is never stale.
    routing_latency_s : float
        Added to every request's arrival at its replica (and so to its TTFT
        and end-to-end latency, measured from the fleet's arrival).
    prefix_load_cap : int
        ``prefix_affinity``'s load cap (requests above the least loaded).
    gpu_hour_price : float, optional
        Price of one replica-hour (per-GPU-hour times GPUs per replica), a
        user input: `fleet_capacity` reports the cost of its answer.
    """

    replicas: int = 1
    router: str = "jsq"
    router_staleness_s: float = 0.0
    routing_latency_s: float = 0.0
    prefix_load_cap: int = 4
    gpu_hour_price: float | None = None

    def __post_init__(self):
        if isinstance(self.replicas, (list, tuple)):
            raise ValueError("replicas must be an int >= 1 (identical replicas); a list of deployments "
                             "(a mixed fleet) is not supported yet")
        object.__setattr__(self, "replicas", check_int("replicas", self.replicas, low=1))
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        object.__setattr__(self, "router_staleness_s",
                           check_float("router_staleness_s", self.router_staleness_s, low=0))
        object.__setattr__(self, "routing_latency_s", check_float("routing_latency_s", self.routing_latency_s,
                                                                  low=0))
        object.__setattr__(self, "prefix_load_cap", check_int("prefix_load_cap", self.prefix_load_cap, low=0))
        object.__setattr__(self, "gpu_hour_price", check_float("gpu_hour_price", self.gpu_hour_price, low=0,
                                                               optional=True))



class _FleetWorker:
    """One thread's buffers: the fleet stream and the replicas' rows, grown
    when a replication needs more (rows are views of exactly `_ws_need`'s size)."""

    def __init__(self, num_requests, nrep, ngroups):
        self.buf = K.ChunkBuffers(num_requests)
        self.nrep, self.ngroups = nrep, ngroups
        self.size = (-1, -1, -1)
        self.fb = None
        self.wm = None

    def buffers(self, n, need_i, need_f):
        if self.fb is None or self.size[0] < n or self.size[1] < need_i or self.size[2] < need_f:
            # room to spare (as `kernel.ChunkBuffers.grow`): replications differ in size, and
            # each regrowth faults in the pages of fresh replica rows
            self.size = tuple(max(x + x // 4, s + s // 2) for x, s in zip((n, need_i, need_f), self.size))
            self._wi = np.empty(self.nrep * self.size[1], np.int64)
            self._wf = np.empty(self.nrep * self.size[2])
            self.fb = cluster.fleet_buffers(self.size[0], self.nrep, 0, 0, self.ngroups)
            self.wm = (np.empty(self.size[1], np.int64), np.empty(self.size[2]))
        rs_a = self.fb.rs_a.reshape(-1)[:self.nrep * n].reshape(self.nrep, n)
        rs_i = self.fb.rs_i.reshape(-1)[:6 * self.nrep * n].reshape(6, self.nrep, n)
        wi = self._wi[:self.nrep * need_i].reshape(self.nrep, need_i)
        wf = self._wf[:self.nrep * need_f].reshape(self.nrep, need_f)
        fb = self.fb._replace(rs_a=rs_a, rs_i=rs_i, wi=wi, wf=wf, owner=self.fb.owner[:n], local=self.fb.local[:n])
        return fb, self.wm[0][:need_i], self.wm[1][:need_f]


def _one(worker, rep, k0, k1, packed, fleet, full, out_row, bal_row):
    arrays = K.scenario_arrays(packed, lat=False)
    buf = worker.buf
    n = K._draw_workload(np.int64(rep), np.uint64(k0), np.uint64(k1), *arrays, buf.state, *buf.requests)
    stream = tuple(c[:n] for c in buf.requests)
    ipar, fpar, lat = packed["ipar"], packed["fpar"], packed["lat"]
    need_i, need_f = K._ws_need(np.int64(n), stream[2], stream[5], stream[6], ipar)
    fb, wm_i, wm_f = worker.buffers(n, need_i, need_f)
    rc = cluster._simulate_fleet(np.int64(n), *stream, ipar, fpar, lat, packed["fleet"],
                                   np.int64(packed["router"]), np.int64(fleet.replicas),
                                   np.uint64(k0), np.uint64(k1), np.int64(rep), fb, full)
    if rc < 0:
        raise RuntimeError(f"the fleet could not be simulated (code {rc})")
    cluster._reduce_fleet(np.int64(n), stream[0], stream[2], ipar, fpar, np.int64(fleet.replicas), fb, wm_i, wm_f,
                            out_row, bal_row)


def run_fleet(scenario, packed, k0, k1, rep0, nrep, n_threads=None):
    """Rows (``nrep`` x (`COLUMNS` + `FLEET_COLUMNS`)) of replications
    ``rep0 ..`` of a fleet scenario, on threads (the kernels release the GIL);
    each replication keyed by its index alone."""
    from ._replicate import _thread_count

    fleet = scenario.fleet
    full = K.engine_variant(packed["ipar"])
    out = np.empty((nrep, K.N_COLUMNS + K.N_FLEET_COLUMNS))
    ngroups = int(scenario.workload.prefix_groups or 0)
    threads = max(1, min(_thread_count(n_threads), nrep))
    local = threading.local()

    def work(lo, hi):
        worker = getattr(local, "worker", None)
        if worker is None:
            worker = local.worker = _FleetWorker(scenario.workload.num_requests, fleet.replicas, ngroups)
        for j in range(lo, hi):
            _one(worker, rep0 + j, k0, k1, packed, fleet, full, out[j, :K.N_COLUMNS], out[j, K.N_COLUMNS:])

    if threads == 1:
        work(0, nrep)
    else:
        size = -(-nrep // (4 * threads))
        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(work, lo, min(nrep, lo + size)) for lo in range(0, nrep, size)]:
                f.result()
    return out


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
    from ._config import Scenario

    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    if scenario.fleet is None:
        raise ValueError("scenario.fleet must be a fastsim.Fleet (its router; its replicas are searched), got None")
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
    import dataclasses

    from ._capacity import PROBE_COLUMNS, _check_slo, _Prober

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
            decisions[m] = prober.probe(rate)
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
