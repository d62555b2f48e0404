"""Disaggregated prefill and decode (`Disaggregated`): a prefill pool and a
decode pool behind their routers, the KV crossing a link between them, run
by `replicate`/`compare` like one replica (`run_disagg`, the compiled
`kernel.disagg`). The xPyD search: `fastsim._disagg_search`.
Semantics: ``docs/engine-model.md``, "Disaggregated prefill and decode".

This module imports neither `_config` nor `_deployment` (which import it
back, `Scenario` checking its ``fleet``): a server is recognised by what it
has, and `_replicate` packs the pools' records.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from . import kernel as K
from ._fleet import Fleet, _FleetWorker, run_replications, served_stream, trace_block_size
from ._latency import LatencyModel
from ._validation import MAX_CLOCK_S, check_float, check_int
from .kernel import cluster, disagg

__all__ = ["Disaggregated", "run_disagg"]


def _as_fleet(name, pool):
    if isinstance(pool, Fleet):
        if pool.mixed or pool.autoscaler is not None:
            raise ValueError(f"{name} must be a fleet of identical replicas without an autoscaler (a pool's server "
                             f"is set by {name}_server), got {pool!r}")
        return pool
    if isinstance(pool, (int, np.integer)) and not isinstance(pool, bool):
        return Fleet(replicas=check_int(name, pool, low=1))
    raise ValueError(f"{name} must be an int >= 1 (replicas behind a 'jsq' router) or a fastsim.Fleet, got {pool!r}")


def _server(name, server):
    """``(engine, latency, deployment)`` of a pool's server, or None for the scenario's."""
    if server is None:
        return None
    if type(server).__name__ == "Deployment" and hasattr(server, "spec"):   # (`fastsim.Deployment`)
        return server.engine, server.latency, server
    if (isinstance(server, tuple) and len(server) == 2 and type(server[0]).__name__ == "EngineConfig"
            and isinstance(server[1], LatencyModel)):
        return server[0], server[1], None
    raise ValueError(f"{name} must be None (the scenario's engine and latency), a fastsim.Deployment or an "
                     f"(EngineConfig, LatencyModel) pair, got {server!r}")


@dataclass(frozen=True)
class Disaggregated:
    """A prefill pool and a decode pool, the KV of each prompt crossing a link.

    Parameters
    ----------
    prefill, decode : int or Fleet
        Each pool's replicas and router (an int: that many behind ``"jsq"``).
        The prefill pool's router may be stale and add a routing latency
        (`Fleet`); the decode router sees live state at each hand-off and adds
        none (the link's latency is the decode side's).
    link_bandwidth_gbps : float
        Bandwidth of each decode replica's inbound link, in gigabits per
        second (a NIC's figure, e.g. 400 for 400G InfiniBand); ``inf``: an
        instant transfer. Transfers into one replica go one at a time.
    link_latency_s : float
        A fixed latency added to every transfer.
    kv_bytes_per_token : float, optional
        KV bytes one prompt token moves (all layers and ranks). Default: the
        model's, from a `Deployment` given as ``prefill_server`` or
        ``decode_server``; required otherwise unless the link is instant.
    prefill_server, decode_server : None, Deployment or (EngineConfig, LatencyModel)
        Each pool's server (another GPU or TP); None: the scenario's engine
        and latency.
    gpu_hour_price : float, optional
        Price of one GPU-hour, a user input (the search reports costs).

    Notes
    -----
    Either pool's engine may follow vLLM V1's rules (``async_scheduling``,
    ``scheduler_reserve_full_isl``, ``null_block``, prefix caching by block
    hash); the decode pool's may not cache by prefix-group entries
    (``block_hash_caching=False`` with ``enable_prefix_caching=True``).
    Semantics: ``docs/engine-model.md``, "Disaggregated prefill and decode".
    """

    prefill: object = 1
    decode: object = 1
    link_bandwidth_gbps: float = math.inf
    link_latency_s: float = 0.0
    kv_bytes_per_token: float | None = None
    prefill_server: object = None
    decode_server: object = None
    gpu_hour_price: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "prefill", _as_fleet("prefill", self.prefill))
        object.__setattr__(self, "decode", _as_fleet("decode", self.decode))
        if self.decode.router_staleness_s != 0.0:
            raise ValueError(f"decode.router_staleness_s must be 0 (the decode router sees live state at each "
                             f"hand-off), got {self.decode.router_staleness_s!r}")
        if self.decode.routing_latency_s != 0.0:
            raise ValueError(f"decode.routing_latency_s must be 0 (use link_latency_s), got "
                             f"{self.decode.routing_latency_s!r}")
        bw = self.link_bandwidth_gbps
        if not (isinstance(bw, (int, float, np.integer, np.floating)) and not isinstance(bw, bool) and bw > 0
                and not math.isnan(bw)):
            raise ValueError(f"link_bandwidth_gbps must be a number > 0 (inf: an instant link), got {bw!r}")
        object.__setattr__(self, "link_bandwidth_gbps", float(bw))
        object.__setattr__(self, "link_latency_s", check_float("link_latency_s", self.link_latency_s, low=0,
                                                                          high=MAX_CLOCK_S))
        object.__setattr__(self, "kv_bytes_per_token", check_float("kv_bytes_per_token", self.kv_bytes_per_token,
                                                                   low=0, low_open=True, optional=True))
        p, d = _server("prefill_server", self.prefill_server), _server("decode_server", self.decode_server)
        if self.kv_bytes_per_token is None and math.isfinite(bw):
            if not any(s is not None and s[2] is not None for s in (p, d)):
                raise ValueError("kv_bytes_per_token is needed for a finite link_bandwidth_gbps when neither "
                                 "prefill_server nor decode_server is a fastsim.Deployment (got None)")
        object.__setattr__(self, "gpu_hour_price", check_float("gpu_hour_price", self.gpu_hour_price, low=0,
                                                               optional=True))

    # ---- derived -----------------------------------------------------------------------------------

    def kv_bytes(self) -> float:
        """KV bytes per prompt token the link carries: given, or the model's (one copy, all layers:
        tensor parallelism splits it across ranks, it does not add to it)."""
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token
        for s in (self.prefill_server, self.decode_server):
            srv = _server("server", s)
            if srv is not None and srv[2] is not None:
                dep = srv[2]
                tp = dep.tensor_parallel_size
                kb = dep.kv_bytes_per_token // dep.spec.kv_bytes_per_token(tp, 1)   # (bytes an element)
                return float(dep.spec.kv_bytes_per_token(1, kb))
        return 0.0   # (an instant link: the bytes do not matter)

    def gpus(self, latency=None) -> int:
        """GPUs of both pools (replicas times each server's tensor-parallel
        size; ``latency``: the scenario's, for a pool without a server)."""
        return (self.prefill.replicas * _tp(self.prefill_server, latency)
                + self.decode.replicas * _tp(self.decode_server, latency))

    def label(self) -> str:
        return f"{self.prefill.replicas}P{self.decode.replicas}D"

    def pool_engines(self, engine) -> tuple:
        """The prefill and the decode pool's EngineConfig (``engine``, the
        scenario's, for a pool without a server of its own)."""
        return tuple(srv[0] if srv is not None else engine for srv in
                     (_server("prefill_server", self.prefill_server), _server("decode_server", self.decode_server)))

    def pool_scenarios(self, scenario) -> tuple:
        """The prefill and the decode pool as fleet scenarios of their own (the workload and SLOs the
        scenario's)."""
        out = []
        for fleet, server in ((self.prefill, self.prefill_server), (self.decode, self.decode_server)):
            srv = _server("server", server)
            e, lat = (srv[0], srv[1]) if srv is not None else (scenario.engine, scenario.latency)
            out.append(dataclasses.replace(scenario, engine=e, latency=lat, fleet=fleet))
        return tuple(out)


def _tp(server, latency=None) -> int:
    """GPUs a replica of a pool's ``server`` takes (its tensor-parallel size):
    a `Deployment`'s, else its latency model's roofline's (``latency``,
    the scenario's, for a pool without a server), else 1."""
    srv = _server("server", server)
    if srv is not None and srv[2] is not None:
        return int(srv[2].tensor_parallel_size)
    roof = getattr(srv[1] if srv is not None else latency, "roofline", None)
    return int(getattr(roof, "tensor_parallel_size", 1) or 1)


def check_disagg_scenario(scenario) -> None:
    """What a disaggregated scenario cannot be yet: ValueError naming the parameter."""
    dis = scenario.fleet
    w = scenario.workload
    if w.horizon_s is not None:
        raise ValueError(f"workload.horizon_s must be None for a disaggregated server (it runs every request to "
                         f"its end), got {w.horizon_s!r}")
    if w.max_concurrency is not None:
        raise ValueError(f"workload.max_concurrency must be None for a disaggregated server (a closed loop "
                         f"across two pools is not modelled), got {w.max_concurrency!r}")
    sp, sd = dis.pool_scenarios(scenario)
    e = sd.engine
    # the longest transfer (the longest prompt the prefill side takes) within the clock's range, as a step's
    # duration (`Scenario._check_step_durations`): a link of 1e-300 Gb/s gave an e2e of 1e299 s and a TPOT of 0
    tokens = sp.engine.max_model_len or sp.engine.kv_capacity_tokens
    longest = tokens * dis.kv_bytes() / (dis.link_bandwidth_gbps * 1e9 / 8.0) + dis.link_latency_s
    if not longest <= MAX_CLOCK_S:
        raise ValueError(f"link_bandwidth_gbps={dis.link_bandwidth_gbps!r} with kv_bytes_per_token="
                         f"{dis.kv_bytes()!r} makes the longest KV transfer (a prompt of {tokens} tokens, the "
                         f"longest the prefill side takes) {longest:.3g} s, more than {MAX_CLOCK_S:g} s, beyond "
                         f"which the clock loses its resolution")
    if e.enable_prefix_caching and not e.block_hash_caching:
        raise ValueError("decode engine: enable_prefix_caching=True needs block_hash_caching=True (caching by "
                         "block hash: the transferred prompt's blocks are cached there; synthetic prefix-group "
                         "entries are not modelled on the decode side), got block_hash_caching=False")
    if e.priority_preemption:
        raise ValueError("decode engine: priority_preemption must be False (a request whose KV arrived from the "
                         "prefill side is admitted at its computed tokens only without it), got True")
    if e.scheduler == "static":
        raise ValueError("decode engine: scheduler must be 'continuous' for a disaggregated server, got 'static'")


# ------------------------------------------------------------------------------
# Running replications

def _link_record(dis: Disaggregated) -> np.ndarray:
    link = np.zeros(K.N_DLINK)
    link[K.DL_BANDWIDTH] = dis.link_bandwidth_gbps * 1e9 / 8.0   # (bytes per second)
    link[K.DL_LATENCY] = dis.link_latency_s
    link[K.DL_KV_BYTES] = dis.kv_bytes()
    link[K.DL_LOAD_CAP] = dis.decode.prefix_load_cap
    link[K.DL_SCORERS:K.DL_SCORERS + K.N_SCORERS] = dis.decode.scorer_weights
    return link


def _trace_block_sizes(scenario):
    """Each pool's block size where a replayed trace's block identities key
    its caching by block hash (`_fleet.trace_hashing`; its parents drawn at
    the scenario engine's block size, which a hashing pool shares), else None."""
    bs = trace_block_size(scenario)
    return tuple(bs if bs is not None and e.enable_prefix_caching and e.block_hash_caching else None
                 for e in scenario.fleet.pool_engines(scenario.engine))


class _DisaggWorker:
    """One thread's buffers: each pool's (`_fleet._FleetWorker`) and the hand-off's."""

    def __init__(self, num_requests, dis, ngroups, trace_bs=(None, None)):
        # (``trace_bs``: each pool's block size where a replayed trace's block identities key its caching
        # by block hash, `_trace_block_sizes`)
        self.p, self.d = (_FleetWorker(num_requests, pool.replicas,
                                       cluster.table_size(ngroups, pool.replicas, K.ROUTER_CODES[pool.router]), bs)
                          for pool, bs in ((dis.prefill, trace_bs[0]), (dis.decode, trace_bs[1])))
        self.db = None
        self.nrep_d = dis.decode.replicas
        self._run = None
        self._ones = np.ones(0, np.int64)
        self._scan = np.empty(4, np.int64)

    def give_back(self):
        """Hand each pool's buffers on to a later run (`_fleet._FleetWorker.give_back`)."""
        self.p.give_back()
        self.d.give_back()

    def run_records(self, pk_p, pk_d, n):
        """The run's records, stated once: each pool's integer record, the
        decode pool's layout record (`disagg.dims_record`), each pool's
        engine, the reduction's record; ``n`` ones (the prefill side's
        outputs) and `kernel.workspace._fleet_sizes`' output. Each
        replication's latency and float records go to ``self.rec``."""
        if self._run is None or self._run[0] is not pk_p or self._run[1] is not pk_d:
            ipar_p, ipar_d = pk_p["ipar"], pk_d["ipar"]
            self._run = (pk_p, pk_d, (ipar_p, ipar_d, disagg.dims_record(ipar_d), K.engine_variant(ipar_p),
                                      K.engine_variant(ipar_d), disagg.reduction_record(ipar_p, ipar_d)))
            self.rec = (np.empty(K.N_LAT), np.empty(K.N_FPAR), np.empty(K.N_LAT), np.empty(K.N_FPAR))
        if self._ones.size < n:
            self._ones = np.ones(n + n // 4, np.int64)
        return self._run[2] + (self._ones[:n], self._scan)

    def hand_off(self, n):
        if self.db is None or self.db.t1.size < n:
            self.db = disagg.disagg_buffers(n + n // 4, self.nrep_d)
        db = self.db
        return db._replace(t1=db.t1[:n], ready=db.ready[:n], order=db.order[:n], scratch=db.scratch[:n])


def _one(worker, rep, k0, k1, packed, pk_p, pk_d, link, dis, out_row, extra_row):
    """Replication ``rep`` of a disaggregated server into ``out_row`` and
    ``extra_row``, on ``worker``'s buffers (the run's records stated once,
    `_DisaggWorker.run_records`)."""
    buf = worker.p.buf
    n = K._draw_workload(np.int64(rep), np.uint64(k0), np.uint64(k1), *worker.p.arrays(packed), buf.state,
                         *buf.requests)
    arrival, prompt, output, prio, sjfk, pgrp, plen = (c[:n] for c in buf.requests)
    ipar_p, ipar_d, dims_d, full_p, full_d, red_i, ones, scan = worker.run_records(pk_p, pk_d, n)
    lat_p, fpar_p, lat_d, fpar_d = worker.rec
    K.drivers._run_records(pk_p["lat"], pk_p["fpar"], np.uint64(k0), np.uint64(k1), np.int64(rep), buf.state,
                           lat_p, fpar_p)
    K.drivers._run_records(pk_d["lat"], pk_d["fpar"], np.uint64(k0), np.uint64(k1), np.int64(rep), buf.state,
                           lat_d, fpar_d)

    def attempt(compact):
        # each pool on compact rows (`cluster.compact_capacity`) until one overfills
        if not compact:   # (a row overfilled: this replication again, and the run's others, on whole rows)
            worker.p.compact = worker.d.compact = False
        mp, md = worker.p.capacity(n, ipar_p[None]), worker.d.capacity(n, ipar_d[None])
        need_p = K._ws_need_compact(np.int64(mp), np.int64(n), prompt, ones, pgrp, plen, ipar_p)
        # the decode pool's rows and the reduction's workspace (which hold every request's gap samples,
        # `disagg.dims_record`) from one scan
        K._fleet_sizes(np.int64(md), np.int64(n), prompt, output, pgrp, plen, dims_d, scan)
        fbp, _, _ = worker.p.uniform_buffers(n, *need_p, mp, prompt=prompt)
        fbd, wm_i, wm_f = worker.d.uniform_buffers(n, scan[0], scan[1], md, scan[2:], prompt)
        db = worker.hand_off(n)
        rc = disagg._simulate_disagg(np.int64(n), arrival, prompt, ones, output, prio, sjfk, pgrp, plen,
                                     ipar_p, fpar_p, lat_p, pk_p["fleet"], np.int64(pk_p["router"]),
                                     np.int64(dis.prefill.replicas), fbp, full_p,
                                     ipar_d, dims_d, fpar_d, lat_d, np.int64(pk_d["router"]),
                                     np.int64(dis.decode.replicas),
                                     fbd, full_d, link, np.uint64(k0), np.uint64(k1),
                                     np.int64(rep), db)
        return rc, fbp, fbd, db, wm_i, wm_f

    rc, fbp, fbd, db, wm_i, wm_f = cluster.until_rows_fit(attempt)
    if rc < 0:
        raise RuntimeError(f"the disaggregated server could not be simulated (code {rc})")
    disagg._reduce_disagg(np.int64(n), arrival, output, red_i, fpar_d, np.int64(dis.prefill.replicas),
                          np.int64(dis.decode.replicas), np.float64(pk_p["fleet"][K.FL_LATENCY]), fbp, fbd, db,
                          wm_i, wm_f, out_row, extra_row)


def run_disagg(scenario, packed, pools, k0, k1, rep0, nrep, threads=1):
    """Rows (``nrep`` x (`COLUMNS` + `DISAGG_COLUMNS`)) of replications
    ``rep0 ..`` of a disaggregated scenario, on ``threads`` threads; each
    replication keyed by its index alone. ``packed``: the scenario's records
    (its workload); ``pools``: the prefill and the decode pool's
    (`pool_scenarios`, packed)."""
    dis = scenario.fleet
    check_disagg_scenario(scenario)
    pk_p, pk_d = pools
    link = _link_record(dis)
    out = np.empty((nrep, K.N_COLUMNS + K.N_DISAGG_COLUMNS))
    ngroups = int(scenario.workload.prefix_groups or 0)
    trace_bs = _trace_block_sizes(scenario)
    run_replications(nrep, threads, lambda: _DisaggWorker(scenario.workload.num_requests, dis, ngroups, trace_bs),
                     lambda w, j: _one(w, rep0 + j, k0, k1, packed, pk_p, pk_d, link, dis, out[j, :K.N_COLUMNS],
                                       out[j, K.N_COLUMNS:]), out=out)
    return out


def simulate_disagg_requests(scenario, pools, requests, k0=0, k1=0, rep=0):
    """Status codes (`kernel.layout.ST_*`), the client's first-token and the
    decode side's finish times, and the preemptions, of each request of one
    given stream (columns as `fastsim.sample_requests` gives them) served by
    the scenario's disaggregated server (``pools``: its `pool_scenarios`,
    packed), as replication ``rep`` of the seed keys ``k0``, ``k1`` serves
    it (run records and routers' streams, as `_one`): the per-class table's
    and the stability check's requests; then the run's TTFT overhead and
    each request's first token on the decode side (TPOT's start)."""
    dis = scenario.fleet
    stream = served_stream(scenario, requests)
    pk_p, pk_d = pools
    lat_p, fpar_p = K.run_records(pk_p["lat"], pk_p["fpar"], k0, k1, rep)
    lat_d, fpar_d = K.run_records(pk_d["lat"], pk_d["fpar"], k0, k1, rep)
    per = disagg.simulate_disagg_stream(
        *stream, (pk_p["ipar"], fpar_p, lat_p, pk_p["fleet"], pk_p["router"], dis.prefill.replicas),
        (pk_d["ipar"], fpar_d, lat_d, pk_d["router"], dis.decode.replicas), _link_record(dis), k0, k1, rep)[0]
    # (the client's TTFT overhead: the decode pool's run record, as the reduction's, `disagg._reduce_disagg`)
    return (per["status"].astype(np.int64), per["first_token_s"], per["finish_s"], per["num_preemptions"],
            float(fpar_d[K.F_TTFT_OVERHEAD]), per["decode_first_token_s"])
