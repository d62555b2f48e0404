"""Fleets: several replicas of one server behind a router (`Fleet`), run by
`replicate`/`compare`/`sweep`/`capacity` like one replica (`run_fleet`,
the compiled `kernel.cluster`). Fleet sizing: `fastsim._fleet_capacity`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from . import kernel as K
from ._numba_options import KERNEL_DEBUG
from ._pages import Spares, huge_pages, small_pages
from .kernel import cluster, fleet_client
from ._validation import MAX_CLOCK_S, check_float, check_int

__all__ = ["Fleet", "run_fleet"]

ROUTERS = tuple(K.ROUTER_CODES)


#: The shortest scrape interval of a stale router's view (`Fleet.router_staleness_s`): the router reads every
#: replica at each scrape, so a run of T seconds costs T / staleness looks (1e-12 s hung a run).
MIN_SCRAPE_S = 1e-3


@dataclass(frozen=True)
class Fleet:
    """Identical replicas of the scenario's server behind a router.

    Parameters
    ----------
    replicas : int or sequence
        How many replicas (>= 1), each with the scenario's ``engine`` and
        ``latency``; or a *mixed fleet*, one entry per replica: a
        :class:`fastsim.Deployment` (its ``engine`` and ``latency``) or an
        ``(EngineConfig, LatencyModel)`` pair (kept as such pairs). The
        scenario's ``workload`` is the fleet's (its ``arrival_rate`` the
        fleet's rate; its SJF keys drawn with the scenario's ``engine``'s
        ``length_predictor``), and its SLOs and horizon the fleet's. In a
        mixed fleet every latency model must have the same
        ``ttft_overhead_s`` (the fleet's TTFT adds one).
    router : str
        ``"random"``, ``"round_robin"``, ``"least_outstanding"`` (fewest
        requests the router sent that have not come back; never stale),
        ``"vllm_dp"`` (vLLM's data-parallel score ``4 * waiting + running``),
        ``"jsq"`` (join the shortest queue: fewest waiting + running, as
        the replica reports), ``"power_of_two"`` (the shorter of two drawn
        at random), ``"least_kv"`` (least KV cache in use),
        ``"prefix_affinity"`` (a prefix group's requests to the replica
        that had it last; over a replayed trace's block hashes, to the
        replica handed the most leading blocks of the prompt; unless its load
        exceeds the least loaded's by more than ``prefix_load_cap``) or
        ``"session_affinity"`` (a prefix group, one conversation, stays on
        one replica; refused over a trace's hashes, which name no sessions)
        or ``"weighted"`` (llm-d's inference scheduler: scorers summed with
        ``scorer_weights``, the highest score picked, ties drawn at random).
        Ties otherwise: the lowest replica.
    router_staleness_s : float
        The router sees the replicas' state as of its last scrape, every
        ``router_staleness_s`` seconds (0: live state; else >= 1 ms). ``least_outstanding``
        counts itself and is never stale.
    routing_latency_s : float
        Added to every request's arrival at its replica (and so to its TTFT
        and end-to-end latency, measured from the fleet's arrival).
    prefix_load_cap : int
        ``prefix_affinity``'s load cap (requests above the least loaded).
    scorer_weights : tuple of 3 floats
        ``weighted``'s weights of its prefix-cache, queue and
        KV-cache-utilisation scorers (``docs/engine-model.md``, "Fleets"):
        the fraction of the prompt's full blocks the replica has been
        routed, ``(max - q) / (max - min)`` of the requests waiting, and 1
        less the fraction of KV blocks in use. Default ``(3, 2, 2)``, the
        weights of llm-d's inference-scheduling profile.
    gpu_hour_price : float, optional
        Price of one replica-hour (per-GPU-hour times GPUs per replica), a
        user input: `fleet_capacity` reports the cost of its answer.
    autoscaler : Autoscaler, optional
        A policy that sets the replicas over time (`fastsim.Autoscaler`);
        ``replicas`` must then be left at 1 (the policy's
        ``initial_replicas`` serve at time 0). ``replicate`` then reports
        ``gpu_hours``, ``slo_violation_minutes``, ``replicas_mean``,
        ``replicas_peak`` and ``scale_events`` too.
    """

    replicas: int = 1
    router: str = "jsq"
    router_staleness_s: float = 0.0
    routing_latency_s: float = 0.0
    prefix_load_cap: int = 4
    gpu_hour_price: float | None = None
    autoscaler: object = None
    scorer_weights: tuple = (3.0, 2.0, 2.0)

    def __post_init__(self):
        if isinstance(self.replicas, (list, tuple)):
            object.__setattr__(self, "replicas", _members(self.replicas))
        else:
            object.__setattr__(self, "replicas", check_int("replicas", self.replicas, low=1))
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        object.__setattr__(self, "router_staleness_s",
                           check_float("router_staleness_s", self.router_staleness_s, low=0, high=MAX_CLOCK_S))
        if 0.0 < self.router_staleness_s < MIN_SCRAPE_S:
            # (the router looks at the replicas at every scrape: a run of T seconds makes T / staleness looks)
            raise ValueError(f"router_staleness_s must be 0 (live state) or >= {MIN_SCRAPE_S:g} s (a scrape "
                             f"interval: the router reads every replica at each scrape), got "
                             f"{self.router_staleness_s!r}")
        object.__setattr__(self, "routing_latency_s", check_float("routing_latency_s", self.routing_latency_s,
                                                                  low=0, high=MAX_CLOCK_S))
        object.__setattr__(self, "prefix_load_cap", check_int("prefix_load_cap", self.prefix_load_cap, low=0))
        object.__setattr__(self, "scorer_weights", _scorer_weights(self.scorer_weights))
        object.__setattr__(self, "gpu_hour_price", check_float("gpu_hour_price", self.gpu_hour_price, low=0,
                                                               optional=True))
        if self.autoscaler is not None:
            from ._autoscaler import Autoscaler
            if not isinstance(self.autoscaler, Autoscaler):
                raise ValueError(f"autoscaler must be None or a fastsim.Autoscaler, got {self.autoscaler!r}")
            if self.replicas != 1:
                raise ValueError(f"replicas must be 1 (its default) with an autoscaler (its initial_replicas "
                                 f"serve at time 0), got {self.replicas!r}")

    @property
    def n_replicas(self) -> int:
        """The number of replicas."""
        return self.replicas if isinstance(self.replicas, int) else len(self.replicas)

    @property
    def mixed(self) -> bool:
        """Whether the replicas are listed one by one (a mixed fleet)."""
        return not isinstance(self.replicas, int)


def _scorer_weights(weights) -> tuple:
    """``scorer_weights`` as three floats (prefix cache, queue, KV cache), >= 0 and not all 0."""
    if not isinstance(weights, (list, tuple, np.ndarray)) or len(weights) != 3:
        raise ValueError(f"scorer_weights must be three numbers (the prefix-cache, queue and KV-cache-utilisation "
                         f"scorers' weights), got {weights!r}")
    w = tuple(check_float(f"scorer_weights[{k}]", x, low=0, high=1e6) for k, x in enumerate(weights))
    if not any(w):
        raise ValueError(f"scorer_weights must have a weight > 0 (all 0: every replica would tie, a random router; "
                         f"use router='random'), got {weights!r}")
    return w


def running_engines(scenario) -> list:
    """The engines that serve a scenario's requests, as ``(name, EngineConfig)``
    pairs named by the parameter that sets each: the scenario's ``engine``
    (one replica, a fleet of identical replicas, an autoscaled fleet), each
    listed replica's (``fleet.replicas``), or a disaggregated server's
    pools' (``prefill_server``, ``decode_server``; the scenario's engine for
    a pool without one). The scenario's engine draws the stream either way."""
    fleet = scenario.fleet
    if fleet is None:
        return [("engine", scenario.engine)]
    if _is(fleet, "Disaggregated"):
        ep, ed = fleet.pool_engines(scenario.engine)
        return [("prefill_server" if fleet.prefill_server is not None else "engine (the prefill pool's)", ep),
                ("decode_server" if fleet.decode_server is not None else "engine (the decode pool's)", ed)]
    if fleet.mixed:
        return [("fleet.replicas", e) for e, _ in fleet.replicas]
    return [("engine", scenario.engine)]


def serves_scenario_engine(scenario) -> bool:
    """Whether the scenario's own engine serves requests (not where a fleet
    lists its replicas, or a disaggregated server gives both pools their
    servers: it only draws the stream then)."""
    return any(e is scenario.engine for _, e in running_engines(scenario))


def trace_hashing(scenario) -> bool:
    """Whether a replayed trace's block identities key a prefix cache: a
    trace that has them, no prefix groups, and an engine that serves the
    requests caching by block hash (`running_engines`; the stream then
    carries each request's parent, `kernel.workload._trace_parents`)."""
    w = scenario.workload
    tr = w.request_trace
    if tr is None or tr.block_offsets is None or w.prefix_groups != 0:
        return False
    return any(e.enable_prefix_caching and e.block_hash_caching for _, e in running_engines(scenario))


def trace_block_size(scenario):
    """The block size a replayed trace's parents count in (the scenario
    engine's, which draws them) where its block identities key caching by
    block hash (`trace_hashing`: its servers map them, `kernel.trace_blocks`);
    None otherwise."""
    return scenario.engine.block_size if trace_hashing(scenario) else None


def check_trace_identities(scenario) -> None:
    """Refuse, with a ValueError naming the parameters, a replayed trace's
    block identities (its hash ids keying prefix caching by block hash,
    `trace_hashing`) in an engine of another block size than the
    scenario's (whose engine draws the parents at its block size), and
    session affinity over them (a trace names no sessions). The kernel
    names each request's parent, the earlier request whose prefix it
    shares, by its index in the stream (`kernel.workload._trace_parents`,
    followed by `kernel.block_pool._block_id`); every replica of a fleet,
    an autoscaled fleet or a disaggregated server's pools is handed parents
    of its own (`kernel.trace_blocks`; until stop 67 such runs were refused:
    a replica read another request's entries, and they hung or crashed)."""
    if not trace_hashing(scenario):
        return
    fleet = scenario.fleet
    if fleet is not None:
        # (a pool that does not cache by block hash routes as without the identities: a disaggregated pool's)
        pools = [("fleet", fleet, True)] if not _is(fleet, "Disaggregated") else [
            (name, pool, e.enable_prefix_caching and e.block_hash_caching) for name, pool, e in
            zip(("fleet.prefill", "fleet.decode"), (fleet.prefill, fleet.decode), fleet.pool_engines(scenario.engine))]
        for name, pool, hashes in pools:
            if hashes and pool.router == "session_affinity" and (pool.n_replicas > 1 or pool.autoscaler is not None):
                raise ValueError(f"{name}.router: 'session_affinity' needs sessions (prefix groups), which a "
                                 f"replayed trace's block hashes do not name (keying prefix caching by block hash, "
                                 f"it would send every request sharing a system prompt to one replica); use "
                                 f"'prefix_affinity' (the replica handed the most leading blocks of the prompt, under "
                                 f"prefix_load_cap)")
    bs = scenario.engine.block_size
    for name, e in running_engines(scenario):
        if e.enable_prefix_caching and e.block_hash_caching and e.block_size != bs:
            raise ValueError(f"{name}: block_size must be the scenario engine's ({bs}: it draws the trace's "
                             f"block parents) where a replayed trace's block hashes key prefix caching by block "
                             f"hash, got block_size={e.block_size}")


def check_sjf_keys(scenario) -> None:
    """Refuse, with a ValueError naming the parameters, a serving engine
    that schedules shortest job first (``policy="sjf"``) on other keys than
    the scenario's engine: that engine draws each request's SJF key once
    for the whole stream (``sjf_key``, ``length_predictor``:
    `kernel.workload._draw_workload`), and a listed replica or a pool's
    server would have sorted on keys it does not name."""
    e0 = scenario.engine
    for name, e in running_engines(scenario):
        if e.policy == "sjf" and (e.sjf_key, e.length_predictor) != (e0.sjf_key, e0.length_predictor):
            raise ValueError(f"{name}: sjf_key and length_predictor must be the scenario engine's "
                             f"({e0.sjf_key!r}, {e0.length_predictor!r}: it draws each request's SJF key once "
                             f"for the stream) with policy='sjf', got ({e.sjf_key!r}, {e.length_predictor!r}); "
                             f"give the scenario's engine policy='sjf' and the same sjf_key and length_predictor")


def check_closed_loop(scenario) -> None:
    """Refuse, with a ValueError naming the parameter, a closed loop
    (``workload.max_concurrency``) in an autoscaled fleet. A plain fleet
    takes one: its client's seats span the fleet, each send routed as a
    departure from any replica frees a seat (`kernel.fleet_client`). An
    autoscaler's fleet and a disaggregated server (which refuses it in
    its own words) take open-loop load only."""
    if scenario.workload.max_concurrency is None or _is(scenario.fleet, "Disaggregated"):
        return
    if getattr(scenario.fleet, "autoscaler", None) is not None:
        raise ValueError(f"workload.max_concurrency must be None with an autoscaler (an open-loop stream; a "
                         f"closed loop is modelled in a fleet of fixed size), got "
                         f"{scenario.workload.max_concurrency!r}")


def _is(x, name):
    """Whether ``x`` is a fastsim ``name`` (by class name: the modules that
    define them import this one, and an import back would close a circle)."""
    return any(c.__name__ == name and c.__module__.startswith("fastsim") for c in type(x).__mro__)


def _members(entries):
    """A mixed fleet's entries as (EngineConfig, LatencyModel) pairs, or a
    ValueError naming the entry."""
    if len(entries) == 0:
        raise ValueError("replicas must be an int >= 1 or a non-empty list of Deployment or (EngineConfig, "
                         "LatencyModel) entries, got an empty list")
    out = []
    for k, x in enumerate(entries):
        if _is(x, "Deployment"):
            x = (x.engine, x.latency)
        if not (isinstance(x, tuple) and len(x) == 2 and _is(x[0], "EngineConfig") and _is(x[1], "LatencyModel")):
            raise ValueError(f"replicas[{k}] must be a fastsim.Deployment or an (EngineConfig, LatencyModel) pair, "
                             f"got {x!r}")
        out.append(x)
    overheads = {lat.ttft_overhead_s for _, lat in out}
    if len(overheads) > 1:
        raise ValueError(f"the latency models of a mixed fleet must have one ttft_overhead_s (the fleet's TTFT "
                         f"adds one), got {sorted(overheads)}")
    return tuple(out)


#: Fleet buffers of finished runs, kept for the next run of as many replicas
#: (`_FleetWorker.give_back`), as one replica's workspaces are
#: (`kernel.drivers.SPARES`): a fresh set faults in its rows' pages at every
#: `replicate` call. At most 4 sets, whose rows reserve at most 4 GiB of
#: address space in all (rows of the whole stream's layout reserve far more
#: than they write).
SPARES = Spares(max_bytes=2 ** 32, max_items=4)


#: The largest allocation of compact replica rows (bytes, each of ``wi`` and
#: ``wf``) put on huge pages (`huge_rows`).
HUGE_ROWS_MAX = 2 ** 27


def huge_rows(entries, compact):
    """Whether a fleet's replica rows of ``entries`` (int64 or float64) go on
    huge pages: compact rows (`cluster.compact_capacity`) are dense, and on
    huge pages the processor's TLB misses fewer as the router turns from one
    replica to the next (`benchmarks/HISTORY.md`); but their gap samples'
    room, mostly never written, then becomes resident too: up to
    `HUGE_ROWS_MAX` bytes. Rows for the whole stream are sparse (each
    segment's first entries written): on ordinary pages, where a huge page
    a segment would be gigabytes."""
    return compact and 8 * entries <= HUGE_ROWS_MAX


class _FleetWorker:
    """One thread's buffers: the fleet stream and the replicas' rows, grown
    when a replication needs more. The rows are as wide as the allocation,
    each replica's workspace their first ``fb.size[r]`` entries
    (`cluster._rows`): a row stays where it was whatever a replication's
    size, so that the pages a replica wrote in one replication are written
    again in the next, not faulted in afresh (with the layout's rounded gap
    room, `kernel.workspace._gap_room`, its segments stay in place too)."""

    def __init__(self, num_requests, nrep, ngroups, trace_block_size=None):
        self.buf = K.ChunkBuffers(num_requests)
        self.nrep, self.ngroups = nrep, ngroups
        # (a replayed trace's block identities keying caching by block hash, `trace_hashing`: the block
        # size its parents count in, and a map of them into each replica, `kernel.trace_blocks`)
        self.trace_bs = trace_block_size
        self.compact = True   # (compact rows, `cluster.compact_capacity`, until one overfills)
        self._capacity = {}   # (by stream size)
        self.size = (-1, -1, -1, -1, -1, -1)
        self.fb = None
        self.wm = None
        self.dense = False
        self._arrays = self._records = self._red = self._views = self._stream = self._closed = None
        spare = SPARES.take(self._spare_key())   # (an earlier run's of as many replicas, `give_back`)
        if spare is not None:
            self.size, self.fb, self._wi, self._wf, self.wm, self.dense = spare

    def arrays(self, packed):
        """The scenario's arrays `_draw_workload` takes (the run's: stated once)."""
        if self._arrays is None or self._arrays[0] is not packed:
            self._arrays = (packed, K.scenario_arrays(packed, lat=False))
        return self._arrays[1]

    def stream(self, n):
        """The stream's arrays (`_draw_workload`'s, its first ``n`` requests)."""
        if self._stream is None or self._stream[0] != n:
            self._stream = (n, tuple(c[:n] for c in self.buf.requests))
        return self._stream[1]

    def records(self):
        """A replication's scratch: its replicas' float and latency records,
        their workspaces' sizes, and `kernel.workspace._fleet_sizes`' output."""
        if self._records is None:
            self._records = (np.empty((self.nrep, K.N_FPAR)), np.empty((self.nrep, K.N_LAT)),
                             np.empty((self.nrep, 2), np.int64), np.empty(4, np.int64))
        return self._records

    def reduction_record(self, ipars):
        """The fleet's integer record for the reduction: row 0's, swap on
        if any replica swaps (the run's ``ipars``: stated once)."""
        if self._red is None or self._red[0] is not ipars:
            red_i = ipars[0].copy()
            red_i[K.I_SWAP] = ipars[:, K.I_SWAP].max()
            self._red = (ipars, red_i)
        return self._red[1]

    def closed_scratch(self, n):
        """A closed loop's scratch for ``n`` requests (`kernel.fleet_client.closed_scratch`)."""
        if self._closed is None or self._closed[0].size < n:
            self._closed = fleet_client.closed_scratch(n + n // 4, self.nrep)
        wanted, keys, last, link = self._closed
        return wanted[:max(n, 1)], keys, last, link[:n + self.nrep]

    def views(self):
        """The buffers as the last replication left them: ``((n, m), fb,
        views)`` (`buffers`)."""
        return self._views

    def give_back(self):
        """Hand the buffers on to a later worker for as many replicas
        (`SPARES`); call it only once no kernel uses them."""
        if self.fb is not None:
            SPARES.give_back(self._spare_key(), (self._wi, self._wf, self.fb.tmap),
                             (self.size, self.fb, self._wi, self._wf, self.wm, self.dense))
            self.size, self.fb, self.wm, self._views = (-1,) * 6, None, None, None

    def _spare_key(self):
        return self.nrep, self.ngroups, self.trace_bs is not None

    def capacity(self, n, ipars):
        """The replicas' row capacity for a stream of ``n`` requests: compact
        (`cluster.compact_capacity`) until a row overfills in this worker's
        run, then ``n`` (the same bits either way)."""
        if not self.compact:
            return n
        m = self._capacity.get(n)
        if m is None:   # (the records are the run's: one rule's reading a stream size)
            m = self._capacity[n] = cluster.compact_capacity(n, self.nrep, ipars)
        return m

    def buffers(self, n, sizes, m=None, merged=None, largest=None, prompt=None):
        """The buffers for ``n`` requests, replica ``r``'s workspace of
        ``sizes[r]`` (int, float) entries for a capacity of ``m`` requests
        (default ``n``; its rows as wide as the allocation), and the fleet's
        workspace for the reduction, ``merged`` (int, float) entries
        (default: the largest of ``sizes``, ``largest`` if the caller has it).
        With a trace's block identities, its map has room for the blocks of
        the stream's prompts, ``prompt`` (`trace_blocks`)."""
        m = n if m is None else m
        need_i, need_f = (int(x) for x in (sizes.max(axis=0) if largest is None else largest))
        wm_i, wm_f = (need_i, need_f) if merged is None else (int(x) for x in merged)
        blocks = 0 if self.trace_bs is None else int((prompt // self.trace_bs).sum())
        want = (n, need_i, need_f, wm_i, wm_f, blocks)
        dense = m < n
        if self.fb is None or any(s < x for s, x in zip(self.size, want)) or self.dense != dense:
            # room to spare (as `kernel.ChunkBuffers.grow`): replications differ in size, and
            # each regrowth faults in the pages of fresh replica rows
            self.size = tuple(max(x + x // 4, s + s // 2) if s < x else s for x, s in zip(want, self.size))
            pages = huge_pages if huge_rows(self.nrep * max(self.size[1], self.size[2]), dense) else small_pages
            self.dense = dense
            self._wi = pages(self.nrep * self.size[1], np.int64)
            self._wf = pages(self.nrep * self.size[2], np.float64)
            self.fb = cluster.fleet_buffers(self.size[0], self.nrep, 0, 0, self.ngroups,
                                            trace_blocks=None if self.trace_bs is None else self.size[5])
            self.wm = (np.empty(self.size[3], np.int64), np.empty(self.size[4]))
        if self._views is None or self._views[0] != (n, m) or self._views[1] is not self.fb:
            rs_a = self.fb.rs_a.reshape(-1)[:self.nrep * m].reshape(self.nrep, m)
            rs_i = self.fb.rs_i.reshape(-1)[:6 * self.nrep * m].reshape(6, self.nrep, m)
            wi = self._wi.reshape(self.nrep, self.size[1])
            wf = self._wf.reshape(self.nrep, self.size[2])
            self._views = ((n, m), self.fb, self.fb._replace(rs_a=rs_a, rs_i=rs_i, wi=wi, wf=wf,
                                                             owner=self.fb.owner[:n], local=self.fb.local[:n]))
        return self._views[2], self.wm[0][:wm_i], self.wm[1][:wm_f]

    def uniform_buffers(self, n, need_i, need_f, m=None, merged=None, prompt=None):
        """`buffers` for identical replicas, each workspace ``need_i``/``need_f``
        entries, stated in the buffers' sizes (as `cluster.fill_records` does)."""
        sizes = np.empty((self.nrep, 2), np.int64)
        sizes[:, 0], sizes[:, 1] = need_i, need_f
        fb, wm_i, wm_f = self.buffers(n, sizes, m, merged, (need_i, need_f), prompt)
        fb.size[:self.nrep] = sizes
        return fb, wm_i, wm_f


def set_replica_noise_keys(lats):
    """Give each replica's latency record (a row of ``lats``, the
    replication's, its step-noise key in place) its own step-noise key
    (`kernel.cluster._noise_keys`: replica 0 keeps the replication's, replica
    r >= 1 a key mixed from it); with no per-step noise, nothing changes."""
    cluster._noise_keys(lats, np.int64(lats.shape[0]), np.int64(0))


def _one(worker, rep, k0, k1, packed, members, full, out_row, bal_row):
    """Replication ``rep`` of a fleet into ``out_row`` and ``bal_row``, on
    ``worker``'s buffers. (Its Python is a share of a small replication's
    time: the records and the sizes' arrays are the worker's, one scan of
    the stream gives both sizes, `kernel.workspace._fleet_sizes`.)"""
    buf = worker.buf
    n = K._draw_workload(np.int64(rep), np.uint64(k0), np.uint64(k1), *worker.arrays(packed), buf.state,
                         *buf.requests)
    stream = worker.stream(n)
    ipars, kinds = members   # (a row per replica; the distinct records, each with its replicas)
    nrep = ipars.shape[0]
    fpars, lats, sizes, scan = worker.records()
    closed = ipars[0, K.I_MAX_CONCURRENCY] > 0   # (a closed loop: the client's sends, `kernel.fleet_client`)
    drawn = stream[0].copy() if closed else None
    uniform = len(kinds) == 1
    for ipar, fpar0, lat0, rows in kinds:
        # the replication's latency records: its per-run effects, shared by the replicas of a kind
        r0 = rows[0]
        K.drivers._run_records(lat0, fpar0, np.uint64(k0), np.uint64(k1), np.int64(rep), buf.state, lats[r0],
                               fpars[r0])
        if uniform:
            lats[1:], fpars[1:] = lats[0], fpars[0]
        else:
            lats[rows], fpars[rows] = lats[r0], fpars[r0]
    if any(lat0[K.L_NOISE] != 0.0 for _, _, lat0, _ in kinds):
        set_replica_noise_keys(lats)   # (per-step noise: each replica its own stream)

    def attempt(compact):
        if not compact:
            worker.compact = False   # (a row overfilled: this replication again, and the run's others, on whole rows)
        m = worker.capacity(n, ipars)
        need = [0, 0, 0, 0]   # (the rows' largest; the reduction's: the whole stream's, the largest of the kinds')
        for ipar, _, _, rows in kinds:
            K._fleet_sizes(np.int64(m), np.int64(n), stream[1], stream[2], stream[5], stream[6], ipar, scan)
            if uniform:
                sizes[:] = scan[:2]
            else:
                sizes[rows] = scan[:2]
            need = [max(a, int(b)) for a, b in zip(need, scan)]
        fb, wm_i, wm_f = worker.buffers(n, sizes, m, need[2:], need[:2], stream[1])
        cluster.fill_records(fb, ipars, fpars, lats, sizes)
        args = (np.int64(n), *stream, packed["fleet"], np.int64(packed["router"]), np.int64(nrep), np.uint64(k0),
                np.uint64(k1), np.int64(rep), fb, full)
        if closed:
            stream[0][:] = drawn   # (the kernel writes each request's send time over what was drawn)
            return fleet_client._simulate_fleet_closed(*args, *worker.closed_scratch(n)), fb, wm_i, wm_f
        return cluster._simulate_fleet_rows(*args), fb, wm_i, wm_f

    rc, fb, wm_i, wm_f = cluster.until_rows_fit(attempt)
    if rc < 0:
        raise RuntimeError(f"the fleet could not be simulated (code {rc})")
    cluster._reduce_fleet(np.int64(n), stream[0], stream[2], worker.reduction_record(ipars), fpars[0],
                          np.int64(nrep), packed["fleet"][K.FL_LATENCY], fb, wm_i, wm_f, out_row, bal_row)


def fleet_members(scenario, packed):
    """A fleet's records: an integer record per replica (rows), and each
    distinct kind of replica as (integer, float, latency records, its
    replicas' rows); one kind for identical replicas. A mixed fleet's
    replicas are packed in ``packed["members"]`` (`_pack.pack_scenario`)."""
    fleet = scenario.fleet
    nrep = fleet.n_replicas
    if not fleet.mixed:
        return np.tile(packed["ipar"], (nrep, 1)), [(packed["ipar"], packed["fpar"], packed["lat"],
                                                       np.arange(nrep))]
    # (kinds by their records: a latency model may hold arrays, and equal entries may be distinct objects)
    kinds, rows = {}, np.empty((nrep, K.N_IPAR), np.int64)
    for r, p in enumerate(packed["members"]):
        kinds.setdefault((p["ipar"].tobytes(), p["fpar"].tobytes(), p["lat"].tobytes()), (p, []))[1].append(r)
        rows[r] = p["ipar"]
    return rows, [(p["ipar"], p["fpar"], p["lat"], np.array(rs)) for p, rs in kinds.values()]


def run_fleet(scenario, packed, k0, k1, rep0, nrep, threads=1):
    """Rows (``nrep`` x (`COLUMNS` + `FLEET_COLUMNS`)) of replications
    ``rep0 ..`` of a fleet scenario, on ``threads`` threads (the kernels
    release the GIL); each replication keyed by its index alone."""
    fleet = scenario.fleet
    members = fleet_members(scenario, packed)
    full = max((K.engine_variant(row) or 0) for row in members[0]) or None   # (the full engine if any needs it)
    out = np.empty((nrep, K.N_COLUMNS + K.N_FLEET_COLUMNS))
    ngroups = int(scenario.workload.prefix_groups or 0)
    trace_bs = trace_block_size(scenario)

    def one(w, j):
        _one(w, rep0 + j, k0, k1, packed, members, full, out[j, :K.N_COLUMNS], out[j, K.N_COLUMNS:])

    def chunk(w, lo, hi, done):
        # The first replication (and any the compiled driver stops at) by `_one`, the others by the driver;
        # if it stops at once, right after `_one` sized the buffers, the streams' sizes vary (a horizon, a
        # resampled trace): it would draw each stream twice, and `_one` runs the rest of the chunk.
        j = lo
        driver = True
        while j < hi:
            if j > lo and driver:
                # (in calls of at most DRIVER_CALL: a Ctrl-C lands between them, losing one call's rows at most)
                want = min(hi - j, DRIVER_CALL)
                k = _compiled(w, rep0 + j, want, k0, k1, packed, members, full, out[j:hi])
                done[j:j + k] = True
                j += k
                driver = k > 0
                if j == hi:
                    break
                if k == want:
                    continue   # (the call's limit, not a stop: the driver goes on)
            one(w, j)
            done[j] = True
            j += 1

    run_replications(nrep, threads,
                     lambda: _FleetWorker(scenario.workload.num_requests, fleet.n_replicas,
                                          cluster.table_size(ngroups, fleet.n_replicas, packed["router"]), trace_bs),
                     one, chunk if compiled_fleet(members) and not scenario.workload.closed_loop else None, out)
    return out


#: Replications of one compiled driver call at most (`run_fleet`'s chunks): a compiled call cannot be
#: interrupted, and an interrupt raised as it returns loses its rows (64: the calls' own cost stays within
#: the noise of `benchmarks/fleet_driver_speed.py`, 16 cost about a point of the driver's 2-4 %).
DRIVER_CALL = 64


def compiled_fleet(members):
    """Whether a fleet's replications run in the compiled driver
    (`kernel.cluster._run_fleet_chunk`): identical replicas (with per-step
    noise too: the driver keys each replica's stream as `_one` does,
    `kernel.cluster._noise_keys`), outside the debug mode (whose kernels are
    called from Python, for their bounds checks)."""
    kinds = members[1]
    return len(kinds) == 1 and not KERNEL_DEBUG


def _compiled(worker, rep, count, k0, k1, packed, members, full, out):
    """Replications ``rep ..`` (at most ``count``) of a fleet that
    `compiled_fleet` takes, by the compiled driver on ``worker``'s buffers
    as its last replication (by `_one`) left them, into ``out``'s rows;
    returns how many it did (it stops before one they do not fit, for
    `_one`)."""
    (n, _), _, fb = worker.views()
    buf = worker.buf
    fpars, lats, _, scan = worker.records()
    ipars = members[0]
    nrep = ipars.shape[0]
    red_ipar = worker.reduction_record(ipars)
    wm_i, wm_f = worker.wm
    lag = packed["fleet"][K.FL_LATENCY]
    main, bal = np.empty((count, K.N_COLUMNS)), np.empty((count, K.N_FLEET_COLUMNS))
    stream = worker.stream(n)
    keys = (np.uint64(k0), np.uint64(k1))
    arrays = K.scenario_arrays(packed)
    pointers = cluster.fleet_pointers(
        arrays, full, (np.int64(rep), *keys, *worker.arrays(packed), buf.state, *buf.requests),
        (np.int64(n), *stream, packed["fleet"], np.int64(packed["router"]), np.int64(nrep), *keys, np.int64(rep),
         fb, full),
        (np.int64(n), stream[0], stream[2], red_ipar, fpars[0], np.int64(nrep), lag, fb, wm_i, wm_f, main[0], bal[0]))
    kind = members[1][0][:3]   # (the replicas' records: a listed fleet's may not be the scenario's)
    done = cluster._run_fleet_chunk(np.int64(rep), np.int64(count), *keys, *arrays,
                                      packed["fleet"], np.int64(packed["router"]), kind, red_ipar, main, bal,
                                      buf.state, *buf.requests, fpars, lats, scan, fb, wm_i, wm_f, full, *pointers)
    out[:done, :K.N_COLUMNS] = main[:done]
    out[:done, K.N_COLUMNS:] = bal[:done]
    return done


class ReplicationsInterrupted(KeyboardInterrupt):
    """`run_replications` interrupted (Ctrl-C): the replications ``done``
    (indices j) that finished, and their ``rows`` of the caller's table."""

    def __init__(self, done, rows):
        super().__init__()
        self.done, self.rows = done, rows


def run_replications(nrep, threads, make_worker, one, chunk=None, out=None):
    """``one(worker, j)`` for the replications j = 0 .. nrep-1 on ``threads``
    threads (the kernels release the GIL), in chunks of a quarter of a
    thread's share; each thread with a worker of its own (``make_worker()``:
    its buffers). ``chunk(worker, lo, hi, done)``, if given, runs the
    replications ``lo .. hi-1`` of a chunk instead, marking each that
    finishes in the boolean array ``done``. Fleets, autoscaled fleets and
    disaggregated servers run so. Interrupted, it raises
    `ReplicationsInterrupted` with the finished replications' rows of
    ``out`` (the chunks not started are skipped: nothing finished is lost)."""
    threads = max(1, min(threads, nrep))
    local = threading.local()
    made = []   # (each thread's worker: its buffers handed on at the end, ``give_back``)
    done = np.zeros(nrep, bool)
    stop = threading.Event()
    settled = [threads == 1]   # (no thread can still use a worker's buffers: they may be handed on)

    def work(lo, hi):
        if stop.is_set():
            return
        worker = getattr(local, "worker", None)
        if worker is None:
            worker = local.worker = make_worker()
            made.append(worker)
        if chunk is not None:
            chunk(worker, lo, hi, done)
            return
        for j in range(lo, hi):
            one(worker, j)
            done[j] = True

    try:
        if threads == 1:
            work(0, nrep)
        else:
            size = -(-nrep // (4 * threads))
            pool = ThreadPoolExecutor(threads)
            try:
                for f in [pool.submit(work, lo, min(nrep, lo + size)) for lo in range(0, nrep, size)]:
                    f.result()
            except KeyboardInterrupt:
                stop.set()   # (the chunks not started return at once: the wait below is for the running ones)
                raise
            finally:
                pool.shutdown(wait=True)   # (a second Ctrl-C here leaves `settled` False: nothing handed on)
                settled[0] = True
    except KeyboardInterrupt:
        idx = np.flatnonzero(done)
        raise ReplicationsInterrupted(idx, None if out is None else out[idx]) from None
    finally:
        if settled[0]:
            for worker in made:
                worker.give_back()


def stream_columns(requests):
    """The kernel's stream arrays (arrival, prompt, output, priority, SJF
    key, prefix group, prefix length) of a frame of requests with the
    columns `fastsim.sample_requests` gives (the optional ones defaulted)."""
    a = np.asarray(requests["arrival_s"], np.float64)
    o = np.asarray(requests["output_len"], np.int64)

    def col(name, default):
        return np.asarray(requests[name], np.int64) if name in requests else default

    return (a, np.asarray(requests["prompt_len"], np.int64), o, col("priority", np.zeros(a.size, np.int64)),
            col("sjf_key", o), col("prefix_group", np.full(a.size, -1, np.int64)),
            col("prefix_len", np.zeros(a.size, np.int64)))


def served_stream(scenario, requests):
    """`stream_columns`, with a replayed trace's block identities (the
    ``block_hashes`` column, where they key caching by block hash,
    `trace_hashing`) as each request's parent, as `_draw_workload` draws
    them (mapped into each replica by the kernel, `kernel.trace_blocks`)."""
    stream = stream_columns(requests)
    if trace_hashing(scenario) and "block_hashes" in requests and "prefix_group" not in requests:
        from ._traces import stream_parents

        grp, plen = stream_parents(list(requests["block_hashes"]), stream[1],
                                   scenario.workload.request_trace.block_size, scenario.engine.block_size)
        stream = stream[:5] + (np.asarray(grp, np.int64), np.asarray(plen, np.int64))
    return stream


def simulate_fleet_requests(scenario, packed, requests, k0=0, k1=0, rep=0):
    """Status codes (`kernel.layout.ST_*`), first-token and finish times and
    preemptions of each request, the run's TTFT overhead, and each request's
    arrival (a closed loop's send: `kernel.fleet_client`), of one given stream (columns as
    `fastsim.sample_requests` gives them) served by the scenario's fleet
    (``packed``: its `_pack.pack_scenario`), as replication ``rep`` of the
    seed keys ``k0``, ``k1`` serves it (its run records, replica noise keys
    and router stream, as `_one`): the per-class table's and the stability
    check's requests. Not for an autoscaled fleet (its replicas come and
    go: `run_autoscaled`)."""
    stream = served_stream(scenario, requests)
    w = scenario.workload
    if w.closed_loop and w.arrival_rate is None:
        # (a pure closed loop: the kernel's stream holds, past the first seats' sends, each departure's think
        # time, as `sample_requests` gives it: `kernel.fleet_client`)
        if "think_s" not in requests:
            raise ValueError("requests must have a 'think_s' column (sample_requests draws it) in a pure closed "
                             "loop (max_concurrency without arrival_rate)")
        a = np.asarray(requests["think_s"], np.float64).copy()
        a[:w.max_concurrency] = np.asarray(requests["arrival_s"], np.float64)[:w.max_concurrency]
        stream = (a,) + stream[1:]
    rows, kinds = fleet_members(scenario, packed)
    nrep = rows.shape[0]
    fpars, lats = np.empty((nrep, K.N_FPAR)), np.empty((nrep, K.N_LAT))
    for _, fpar0, lat0, rs in kinds:
        lats[rs], fpars[rs] = K.run_records(lat0, fpar0, k0, k1, rep)
    if any(lat0[K.L_NOISE] != 0.0 for _, _, lat0, _ in kinds):
        set_replica_noise_keys(lats)
    sent = np.empty(stream[0].size)
    st, first, finish, npre = fleet_client.simulate_closed_fleet_stream(*stream, rows, fpars, lats, packed["fleet"],
                                                                        packed["router"], nrep, k0, k1, rep,
                                                                        sent=sent)[:4]
    # (the client's TTFT overhead: replica 0's run record, as the reduction's, `_reduce_fleet`)
    return np.asarray(st), first, finish, npre, float(fpars[0][K.F_TTFT_OVERHEAD]), sent
