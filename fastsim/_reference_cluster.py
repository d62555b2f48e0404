"""A slow, plain-Python reference of a fleet: replicas behind a router.

It checks the compiled fleet (``fastsim/kernel/cluster.py``,
``kernel/router.py``) bit for bit per request, and shares no simulation code
with the kernel: each replica is the reference simulator's state
(`fastsim._reference._Reference`, its operations of the spec reused as
they are) driven by a loop of its own that can pause at any time and be
handed requests, and the routers and the router's random numbers
(SplitMix64) are written again here from ``docs/engine-model.md``,
"Fleets".
"""

from __future__ import annotations

import math

import numpy as np

from ._config import EngineConfig
from ._latency import LatencyModel
from ._reference import UNFINISHED, _Reference, _Request, prompt_block_identities, queue_key
from ._reference_noise import StepNoiseDraws, run_latency

ROUTERS = ("random", "round_robin", "least_outstanding", "vllm_dp", "jsq", "power_of_two", "least_kv",
           "prefix_affinity", "session_affinity")

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _replica_key(key: int, r: int) -> int:
    """Replica r's step-noise key: the replication's for replica 0, else
    SplitMix64's finaliser of ``key + r * 0xD1B54A32D192ED03``."""
    return key if r == 0 else _mix64((key + r * 0xD1B54A32D192ED03) & _M64)


class _RouterStream:
    """The router's SplitMix64 stream: purpose ``purpose`` of the keys (key0,
    key1, replication), a double in (0, 1) per draw."""

    def __init__(self, key0: int, key1: int, rep: int, purpose: int):
        base = _mix64(key0 ^ _mix64((rep * _GOLDEN + key1) & _M64))
        self.state = _mix64((base + (purpose + 1) * 0xD1B54A32D192ED03) & _M64)

    def uniform(self) -> float:
        self.state = (self.state + _GOLDEN) & _M64
        return ((_mix64(self.state) >> 11) + 0.5) * 2.0 ** -53

    def index(self, m: int) -> int:
        return min(int(self.uniform() * m), m - 1)


class _PausedReplica(_Reference):
    """One replica that runs to a time, pauses, and is handed requests
    (spec: a step is applied only when its end is reached; one that ends
    later stays in flight)."""

    def __init__(self, engine: EngineConfig, latency: LatencyModel, horizon_s, step_noise=None):
        super().__init__([], engine, latency, horizon_s, step_noise)
        self.in_flight = None       # (scheduled, t_end) of the step in flight
        self.done = False           # the horizon is reached
        self.handed = 0
        # async scheduling (`_Reference.run_async`'s loop, resumable): the batches in
        # flight, oldest first, as (end, [(request, emits)]); when the GPU is free; and
        # whether the loop is to schedule a batch next (else to wait for the oldest)
        self.batches_in_flight: list = []
        self.gpu_free = 0.0
        self.to_schedule = True

    def hand(self, r: _Request) -> None:
        self.requests.append(r)
        self.handed += 1
        if self.horizon is None or r.arrival < self.horizon:
            self.arrivals.append(r)

    def idle(self) -> bool:
        return not self.running and len(self.waiting) == 0 and len(self.swapped) == 0

    def advance_until(self, t_stop: float) -> None:
        """Every step that ends at or before t_stop; a step starts only before t_stop."""
        if self.e.async_scheduling:
            self.advance_async_until(t_stop)
            return
        static = self.e.scheduler == "static"
        while not self.done:
            if self.in_flight is not None:
                scheduled, t_end = self.in_flight
                if t_end > t_stop:
                    return
                self.in_flight = None
                self.end_step(scheduled, t_end, static)
                if self.horizon is not None and self.t >= self.horizon:
                    self.done = True
                continue
            if self.idle():
                if self.next_arrival >= len(self.arrivals):
                    return                      # nothing to do until a request is handed
                a = self.arrivals[self.next_arrival].arrival
                if a > self.t:
                    if a >= t_stop:
                        return
                    self.t = a                  # idle: time jumps to the next arrival
            if self.t >= t_stop:
                return
            self.ingest_until(self.t, inclusive=True)   # (requests handed at this very instant)
            self.abandon()
            if self.idle():
                continue
            scheduled = self.schedule_static() if static else self.schedule_continuous()
            self.check_invariants()
            if not scheduled:
                continue
            d = self.step_time(scheduled)   # (its pending swap transfers charged)
            self.num_steps += 1
            self.max_blocks_used = max(self.max_blocks_used, self.blocks_used)
            self.in_flight = (scheduled, self.t + d)

    def advance_async_until(self, t_stop: float) -> None:
        """`_Reference.run_async` up to ``t_stop`` (spec, "Fleets", async
        scheduling): a batch's output is applied only if it ends at or before
        t_stop, and a batch is scheduled only if it would start before t_stop
        (its scheduling waits for the next call otherwise, which changes
        nothing: it sees arrivals up to the clock, before t_stop, and the
        requests handed meanwhile arrive at or after t_stop)."""
        q = self.batches_in_flight
        while not self.done:
            if self.to_schedule:
                if max(self.t, self.gpu_free) >= t_stop:
                    return
                self.ingest_until(self.t, inclusive=True)
                self.abandon()
                if self.running or len(self.waiting) > 0:
                    scheduled, end, self.gpu_free, outputs = self.form_batch(self.gpu_free)
                    q.append((end, outputs))
                    if scheduled and len(q) < 2:
                        continue      # the only batch in flight: schedule the next one now
                elif not q:
                    if self.next_arrival >= len(self.arrivals):
                        return        # nothing to do until a request is handed
                    a = self.arrivals[self.next_arrival].arrival
                    if a >= t_stop:
                        return
                    self.t = max(self.t, a)
                    continue
                self.to_schedule = False
            end, outputs = q[0]
            if max(self.t, end) > t_stop:
                return
            q.pop(0)
            self.t = max(self.t, end)
            self.apply_batch(outputs)
            self.to_schedule = True
            if self.horizon is not None and self.t >= self.horizon:
                self.done = True

    def finish(self) -> None:
        for q in (self.running, self.waiting, self.swapped):
            for r in q:
                r.status = UNFINISHED
        if self.e.async_scheduling and self.done:
            self.unseen_unfinished()   # (as `run_async` stops)
        for r in self.swapped:
            r.swapped_s += self.t - r.swapped_since

    def view(self):
        """(in the system, waiting, running, KV blocks not free), as the router sees them."""
        waiting = len(self.waiting) + len(self.swapped) + self.handed - self.next_arrival
        running = len(self.running)
        # (KV in use: caching by block hash counts cached free blocks as free, as vLLM's usage does,
        # and of the usable blocks: vLLM's usage leaves the null block out, so that replicas with and
        # without it compare alike in a mixed fleet)
        free = self.pool.num_free() if self.hashing else self.plain_free()
        return waiting + running, waiting, running, self.usable_blocks - free


def _choose(router, i, grp, views, table, rng, cap):
    """The replica the router sends request i (prefix group grp) to; ties to the lowest index."""
    n = len(views)
    insys = [v[0] for v in views]

    def least(values):
        return min(range(n), key=lambda r: (values[r], r))

    if router == "random":
        return rng.index(n)
    if router == "round_robin":
        return i % n
    if router in ("least_outstanding", "jsq"):
        return least(insys)
    if router == "vllm_dp":
        return least([4 * v[1] + v[2] for v in views])
    if router == "power_of_two":
        a = rng.index(n)
        if n == 1:
            return a
        b = rng.index(n - 1)
        b += b >= a
        return b if insys[b] < insys[a] else a
    if router == "least_kv":
        return min(range(n), key=lambda r: (views[r][3], insys[r], r))
    lo = least(insys)
    if grp < 0 or grp >= len(table):
        return lo
    if router == "prefix_affinity":
        r = table[grp]
        if r < 0 or insys[r] > insys[lo] + cap:
            table[grp] = lo
            return lo
        return r
    if table[grp] < 0:          # session_affinity
        table[grp] = lo
    return table[grp]


def _leading_shared(a, b) -> int:
    """Leading full blocks two prompts' identity lists share (None: a block of one request alone)."""
    k = 0
    while k < min(len(a), len(b)) and a[k] is not None and a[k] == b[k]:
        k += 1
    return k


def _choose_by_prefix(idents, handed, insys, cap):
    """Prefix affinity over a trace's hashes (spec, "Fleets"): the replica
    handed the most leading blocks of the request (the longest run it shares
    with a request handed to that replica), ties to the fewest in the system,
    then the lowest index; the least loaded instead where that replica's
    requests exceed the least loaded's by more than ``cap``."""
    n = len(insys)
    match = [max((_leading_shared(idents, h) for h in handed[r]), default=0) for r in range(n)]
    best = min(range(n), key=lambda r: (-match[r], insys[r], r))
    least = min(range(n), key=lambda r: (insys[r], r))
    return least if insys[best] > insys[least] + cap else best


class _TraceRouter:
    """A router's memory over a replayed trace's hashes (spec, "Fleets"):
    each request's identity list, and each replica's requests' lists, which
    prefix affinity counts. A trace names no groups: the other routers,
    session affinity's too, route as without them."""

    def __init__(self, block_hashes, prompt, hash_block_size, block_size, replicas):
        self.idents = [prompt_block_identities(i, int(prompt[i]), block_size, block_hashes=block_hashes[i],
                                               hash_block_size=hash_block_size) for i in range(len(prompt))]
        self.handed = [[] for _ in range(replicas)]

    def choose(self, router, i, views, rng, cap):
        if router == "prefix_affinity":
            return _choose_by_prefix(self.idents[i], self.handed, [v[0] for v in views], cap)
        return _choose(router, i, -1, views, [], rng, cap)

    def hand(self, i, r):
        self.handed[r].append(self.idents[i])


def simulate_fleet_reference(arrival, prompt, output, prio, sjfk, pgrp, plen, engine: EngineConfig | list,
                             latency: LatencyModel | list, replicas: int, router: str, *, horizon_s=None,
                             staleness_s=0.0, routing_latency_s=0.0, load_cap=4, seed_keys=(0, 0, 0),
                             n_groups=None, block_hashes=None, hash_block_size=512):
    """Simulate a fleet of ``replicas`` replicas behind ``router`` over one
    request stream, slowly and literally: identical replicas, or (a mixed
    fleet) replica ``r`` with ``engine[r]`` and ``latency[r]`` when they are
    lists.

    With ``block_hashes`` (a replayed trace's hash list per request, each
    hash ``hash_block_size`` tokens), the replicas that cache by block hash
    key prompt blocks by those hashes (`prompt_block_identities`; ``pgrp``
    and ``plen`` are then ignored); prefix affinity picks the replica
    handed the most leading blocks of the request (`_choose_by_prefix`),
    and the trace names no groups for session affinity (`_TraceRouter`).

    A stochastic latency model (``noise``) runs as replication
    ``seed_keys[2]`` of the keys ``seed_keys[:2]`` has it
    (`_reference_noise.run_latency`): its per-run effects shared by the
    replicas of one model, and per-step noise drawn per replica, replica
    r >= 1 from its own key (spec, "Fleets").

    Returns a dict of per-request arrays, by the fleet's request index:
    ``status`` (the reference's codes), ``first_token_s``, ``finish_s``,
    ``num_preemptions``, ``num_tokens``, ``replica``.
    """
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    a = np.asarray(arrival, dtype=np.float64)
    n = a.size
    engines = list(engine) if isinstance(engine, (list, tuple)) else [engine] * replicas
    latencies = list(latency) if isinstance(latency, (list, tuple)) else [latency] * replicas
    if len(engines) != replicas or len(latencies) != replicas:
        raise ValueError(f"a mixed fleet needs an engine and a latency model per replica ({replicas}), got "
                         f"{len(engines)} and {len(latencies)}")
    noises = [None] * replicas
    for r, lat in enumerate(latencies):
        latencies[r], steps = run_latency(lat, *(int(k) for k in seed_keys))
        if steps is not None:
            noises[r] = StepNoiseDraws(_replica_key(steps.key, r), steps.sd, steps.p, steps.mean)
    reps = [_PausedReplica(e, lat, horizon_s, nz) for e, lat, nz in zip(engines, latencies, noises)]
    rng = _RouterStream(*(int(k) for k in seed_keys), purpose=13)   # (the kernel's S_ROUTE: after its 13 streams)
    ngroups = (int(np.max(pgrp)) + 1 if n else 0) if n_groups is None else n_groups
    table = [-1] * max(ngroups, 1)
    trace = None
    hashing = [e for e in engines if e.enable_prefix_caching and e.block_hash_caching]
    if block_hashes is not None and hashing:   # (a fleet none of whose replicas hash routes as without them)
        trace = _TraceRouter(block_hashes, prompt, hash_block_size, hashing[0].block_size, replicas)
    owner, reqs = [], []
    k_scrape = 0
    live = staleness_s == 0.0 or router == "least_outstanding"
    views = [(0, 0, 0, 0)] * replicas
    for i in range(n):
        t = float(a[i])
        if router not in ("random", "round_robin") and replicas > 1:
            if live:
                for rep in reps:
                    rep.advance_until(t)
                views = [rep.view() for rep in reps]
            else:
                while k_scrape * staleness_s <= t:
                    for rep in reps:
                        rep.advance_until(k_scrape * staleness_s)
                    views = [rep.view() for rep in reps]
                    k_scrape += 1
        if trace is None:
            r = _choose(router, i, int(pgrp[i]), views, table, rng, load_cap)
        else:
            r = trace.choose(router, i, views, rng, load_cap)
            trace.hand(i, r)
        rep = reps[r]
        j = rep.handed
        at = t + routing_latency_s
        req = _Request(idx=j, arrival=at, P=int(prompt[i]), O=int(output[i]), prio=int(prio[i]),
                       sjf_key=int(sjfk[i]), group=int(pgrp[i]), prefix_len=int(plen[i]),
                       qkey=queue_key(engines[r].policy, j, at, int(prio[i]), int(sjfk[i]),
                                      engines[r].priority_aging_s))
        if engines[r].enable_prefix_caching and engines[r].block_hash_caching:
            if block_hashes is None:
                req.idents = prompt_block_identities(j, req.P, engines[r].block_size, req.group, req.prefix_len)
            else:
                req.group, req.prefix_len = -1, 0
                req.idents = prompt_block_identities(j, req.P, engines[r].block_size,
                                                     block_hashes=block_hashes[i], hash_block_size=hash_block_size)
        rep.hand(req)
        owner.append(r)
        reqs.append(req)
    for rep in reps:
        rep.advance_until(math.inf)
        rep.finish()
    return {
        "status": np.array([r.status for r in reqs], dtype=np.int8),
        "first_token_s": np.array([r.first_token for r in reqs], dtype=np.float64),
        "finish_s": np.array([r.finish for r in reqs], dtype=np.float64),
        "num_preemptions": np.array([r.num_preemptions for r in reqs], dtype=np.int64),
        "num_tokens": np.array([r.g for r in reqs], dtype=np.int64),
        "replica": np.array(owner, dtype=np.int64),
    }
