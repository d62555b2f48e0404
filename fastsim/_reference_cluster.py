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

import bisect
import math

import numpy as np

from ._config import EngineConfig
from ._latency import LatencyModel
from ._reference import (_IN_SYSTEM, COMPLETED, DROPPED, NOT_ARRIVED, REJECTED_ADMISSION, REJECTED_TOO_LONG,
                         UNFINISHED, _Reference, _Request, prompt_block_identities, queue_key)
from ._reference_noise import StepNoiseDraws, run_latency

ROUTERS = ("random", "round_robin", "least_outstanding", "vllm_dp", "jsq", "power_of_two", "least_kv", "weighted",
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


class _WeightedRouter:
    """llm-d's inference scheduler (spec, "Fleets", the weighted router):
    each replica scored ``w_prefix * prefix + w_queue * queue + w_kv * kv``,
    the highest picked, ties drawn from the router's stream. ``prefix``:
    the fraction of the prompt's full blocks the replica has been routed
    (a trace's leading blocks handed to it, `matches`; else the request's
    shared prefix where its group was routed there before); ``queue``:
    ``(max - waiting) / (max - min)`` over the replicas (1 where all are
    equal); ``kv``: 1 less the fraction of its usable blocks in use."""

    def __init__(self, weights, engines):
        self.w = tuple(float(x) for x in weights)
        self.block_size = [e.block_size for e in engines]
        self.blocks = [e.usable_gpu_blocks for e in engines]   # (the null block holds nothing)
        self.groups = [set() for _ in engines]    # prefix groups routed to each replica

    def choose(self, grp, P, prefix_len, views, rng, matches=None, blocks=0):
        """The replica for a request of group ``grp`` (-1: none), prompt
        ``P`` and shared prefix ``prefix_len``; over a trace, ``matches[r]``
        of its ``blocks`` full blocks handed to replica r."""
        n = len(views)
        wait = [v[1] for v in views]
        lo, hi = min(wait), max(wait)
        scores = []
        for r in range(n):
            if matches is not None:
                prefix = matches[r] / blocks if blocks > 0 else 0.0
            elif grp >= 0 and grp in self.groups[r] and P // self.block_size[r] > 0:
                f = P // self.block_size[r]
                prefix = min(prefix_len // self.block_size[r], f) / f
            else:
                prefix = 0.0
            queue = 1.0 if hi == lo else (hi - wait[r]) / (hi - lo)
            kv = 1.0 - views[r][3] / self.blocks[r]
            scores.append(self.w[0] * prefix + self.w[1] * queue + self.w[2] * kv)
        top = max(scores)
        tied = [r for r in range(n) if scores[r] == top]
        r = tied[0] if len(tied) == 1 else tied[rng.index(len(tied))]
        if matches is None and grp >= 0:
            self.groups[r].add(grp)
        return r


class _TraceRouter:
    """A router's memory over a replayed trace's hashes (spec, "Fleets"):
    each request's identity list, and each replica's requests' lists, which
    prefix affinity counts. A trace names no groups: the other routers,
    session affinity's too, route as without them."""

    def __init__(self, block_hashes, prompt, hash_block_size, block_size, replicas):
        self.idents = [prompt_block_identities(i, int(prompt[i]), block_size, block_hashes=block_hashes[i],
                                               hash_block_size=hash_block_size) for i in range(len(prompt))]
        self.handed = [[] for _ in range(replicas)]

    def choose(self, router, i, views, rng, cap, weighted=None):
        if router == "prefix_affinity":
            return _choose_by_prefix(self.idents[i], self.handed, [v[0] for v in views], cap)
        if router == "weighted":
            match = [max((_leading_shared(self.idents[i], h) for h in handed), default=0) for handed in self.handed]
            return weighted.choose(-1, 0, 0, views, rng, match, len(self.idents[i]))
        return _choose(router, i, -1, views, [], rng, cap)

    def hand(self, i, r):
        self.handed[r].append(self.idents[i])


def simulate_fleet_reference(arrival, prompt, output, prio, sjfk, pgrp, plen, engine: EngineConfig | list,
                             latency: LatencyModel | list, replicas: int, router: str, *, horizon_s=None,
                             staleness_s=0.0, routing_latency_s=0.0, load_cap=4, seed_keys=(0, 0, 0),
                             n_groups=None, block_hashes=None, hash_block_size=512, max_concurrency=None,
                             pure=False, scorer_weights=(3.0, 2.0, 2.0)):
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

    With ``max_concurrency = c``, one client holding c seats across the
    fleet sends the requests (`_closed_loop_fleet`): ``arrival`` then holds
    what the kernel's `_draw_workload` draws for a closed loop (the first c
    send times, then, ``pure``, each departure's think time, or else a
    capped stream's wanted times). Not with ``horizon_s`` or
    ``block_hashes``.

    ``scorer_weights``: the ``"weighted"`` router's (`_WeightedRouter`).

    Returns a dict of per-request arrays, by the fleet's request index:
    ``status`` (the reference's codes), ``first_token_s``, ``finish_s``,
    ``num_preemptions``, ``num_tokens``, ``replica``, ``arrival_s`` (when
    each request reached the router: a closed loop's send times).
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
    weighted = _WeightedRouter(scorer_weights, engines) if router == "weighted" else None
    if max_concurrency is not None:
        if horizon_s is not None or block_hashes is not None:
            raise ValueError(f"a closed loop (max_concurrency) takes no horizon_s and no block_hashes, got "
                             f"horizon_s={horizon_s!r}, block_hashes {'given' if block_hashes is not None else None}")
        if any(e.priority_aging_s is not None for e in engines):
            raise ValueError("a closed loop (max_concurrency) takes no priority_aging_s (its keys need the arrival "
                             "times, known only as requests are sent)")
        return _closed_loop_fleet(a, prompt, output, prio, sjfk, pgrp, plen, engines, reps, router, staleness_s,
                                  routing_latency_s, load_cap, rng, table, int(max_concurrency), bool(pure), weighted)
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
        if trace is not None:
            r = trace.choose(router, i, views, rng, load_cap, weighted)
            trace.hand(i, r)
        elif weighted is not None:
            r = weighted.choose(int(pgrp[i]), int(prompt[i]), int(plen[i]), views, rng)
        else:
            r = _choose(router, i, int(pgrp[i]), views, table, rng, load_cap)
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
    return _finish(reps, reqs, owner, a)


def _finish(reps, reqs, owner, arrival) -> dict:
    """Every replica run to its end; the fleet's per-request results (`simulate_fleet_reference`'s)."""
    for rep in reps:
        rep.advance_until(math.inf)
        rep.finish()
    return {
        "status": fleet_status(reqs, arrival, reps[0].horizon if reps else None),
        "first_token_s": np.array([r.first_token for r in reqs], dtype=np.float64),
        "finish_s": np.array([r.finish for r in reqs], dtype=np.float64),
        "num_preemptions": np.array([r.num_preemptions for r in reqs], dtype=np.int64),
        "num_tokens": np.array([r.g for r in reqs], dtype=np.int64),
        "replica": np.array(owner, dtype=np.int64),
        "arrival_s": np.array(arrival, dtype=np.float64),
    }


def fleet_status(reqs, arrival, horizon) -> np.ndarray:
    """Each request's status in the fleet: its replica's, except that one that came to the fleet before the
    horizon and was never taken in by its replica (it reached it at or after the horizon: the routing
    latency) is unfinished, in the system until the fleet's run ends (spec, "Fleets")."""
    return np.array([UNFINISHED if (r.status == NOT_ARRIVED and horizon is not None and a < horizon) else r.status
                     for r, a in zip(reqs, arrival)], dtype=np.int8)


_DEPARTED = (COMPLETED, REJECTED_TOO_LONG, REJECTED_ADMISSION, DROPPED)


def _next_event(rep: _PausedReplica) -> float:
    """The earliest time t at which ``rep.advance_until(t)`` or
    ``rep.advance_until(nextafter(t))`` would change the replica: the end of
    its step in flight (async: the oldest batch's, when it waits for it);
    else the time it would schedule its next step: its clock (async: the
    clock or when the GPU is free, the later) if it has requests in the
    system, or handed ones that arrived by then; else its next handed
    arrival; inf when it is idle and has nothing handed."""
    if rep.e.async_scheduling:
        q = rep.batches_in_flight
        if not rep.to_schedule:
            return max(rep.t, q[0][0])
        s = max(rep.t, rep.gpu_free)
        if rep.running or len(rep.waiting) > 0 or q:
            return s
    else:
        if rep.in_flight is not None:
            return rep.in_flight[1]
        s = rep.t
        if not rep.idle():
            return s
    if rep.next_arrival < len(rep.arrivals):
        return max(s, rep.arrivals[rep.next_arrival].arrival)
    return math.inf


def _last_tokens_by(rep: _PausedReplica, t: float) -> list:
    """Async scheduling: the requests whose last token a batch in flight
    ending at or before t emits. Such a batch's output is applied only
    after the replica schedules its next batch, at t (`advance_async_until`),
    but its client has the last token at the batch's end: a departure at t."""
    if not rep.e.async_scheduling:
        return []
    emits_ahead, due = {}, []
    for end, outputs in rep.batches_in_flight:
        for r, emits in outputs:
            if emits and r.status == _IN_SYSTEM:
                emits_ahead[r] = emits_ahead.get(r, 0) + 1
                if end <= t and r.g + emits_ahead[r] == r.O:
                    due.append(r)
    return due


def _closed_loop_fleet(a, prompt, output, prio, sjfk, pgrp, plen, engines, reps, router, staleness_s,
                       routing_latency_s, load_cap, rng, table, c, pure, weighted=None):
    """`simulate_fleet_reference` with a closed loop (spec, "Fleets", closed
    loops): one client holds ``c`` seats across the fleet.

    Request k is the k-th send (row k of the stream). Requests 0 .. c-1 are
    sent at ``a[k]``; ``R_j`` is the instant of the j-th departure from the
    fleet, as the fleet observes it: a completion at its last token (with
    async scheduling at the end of the batch that emits it, although the
    replica applies that output only at its next schedule:
    `_last_tokens_by`), a rejection or an abandonment at the instant the
    replica makes it (an async schedule's: when it is made, which can be
    later than the step start it is dated at). Pure closed loop (``pure``): departure j sends
    again at ``R_j + a[j + c]`` (its think time), the sends taken in time
    order (ties: the earlier departure's first). Capped stream: request
    k >= c is sent at ``max(a[k], R_(k-c), send of k-1)`` (``a[k]``: when it
    wants to go).
    Each request is routed at its send time (as `simulate_fleet_reference`
    routes an arrival: live view, or the last scrape at a multiple of
    ``staleness_s``) and arrives at its replica ``routing_latency_s`` later.

    Instants t are taken in increasing order: the least of the next known
    send, the next scrape (a stale view of a router that reads state, more
    than one replica) and each replica's next event (`_next_event`). At t:
    (1) every replica is advanced to t (steps ending at or before t end,
    nothing is scheduled at t) and the departures this reveals are released
    at t; (2) a scrape at t takes every replica's view; (3) the sends due at
    t are routed and handed in send order; (4) every replica that would
    schedule at t schedules (``advance_until(nextafter(t))``), and the
    departures these schedules make are released at t; their sends at t
    are routed and handed after all the schedules at t: (3) and (4) again
    until nothing is left at t. The run ends when every request has been
    sent and every replica is idle.
    """
    n = a.size
    nrep = len(reps)
    reqs = [None] * n
    owner = [-1] * n
    sent = [math.nan] * n
    out = []                # handed requests that have not departed
    R = []                  # the departure instants R_j, in release order
    pending = sorted(float(a[k]) for k in range(min(c, n)))   # pure loop: the known sends not yet made
    k_next = 0              # the next request to send
    reads = router not in ("random", "round_robin") and nrep > 1
    live = staleness_s == 0.0 or router == "least_outstanding"
    scrapes = reads and not live
    k_scrape = 0
    views = [(0, 0, 0, 0)] * nrep

    def next_send() -> float:
        """The time of request k_next's send, inf while it is not known."""
        if k_next >= n:
            return math.inf
        if pure:
            return pending[0] if pending else math.inf
        if k_next < c:
            return float(a[k_next])
        if len(R) <= k_next - c:
            return math.inf
        return max(float(a[k_next]), R[k_next - c], sent[k_next - 1])

    released = []           # (request, the instant of its departure)

    def release(t: float) -> None:
        """The departures not yet released leave the client's seats at t
        (with async scheduling, the last tokens of the batches ended by t)."""
        ending = {r for rep in reps for r in _last_tokens_by(rep, t)}
        for r in list(out):
            if r.status in _DEPARTED or r in ending:
                out.remove(r)
                released.append((r, t))
                j = len(R)
                R.append(t)
                if pure and j + c < n:
                    bisect.insort_right(pending, t + float(a[j + c]))   # (the think time of departure j)

    def send(t: float) -> None:
        nonlocal k_next, views
        k = k_next
        k_next += 1
        if pure:
            pending.pop(0)
        sent[k] = t
        if reads and live:
            views = [rep.view() for rep in reps]
        if weighted is not None:
            r = weighted.choose(int(pgrp[k]), int(prompt[k]), int(plen[k]), views, rng)
        else:
            r = _choose(router, k, int(pgrp[k]), views, table, rng, load_cap)
        rep = reps[r]
        j = rep.handed
        at = t + routing_latency_s
        req = _Request(idx=j, arrival=at, P=int(prompt[k]), O=int(output[k]), prio=int(prio[k]),
                       sjf_key=int(sjfk[k]), group=int(pgrp[k]), prefix_len=int(plen[k]),
                       qkey=queue_key(engines[r].policy, j, at, int(prio[k]), int(sjfk[k]),
                                      engines[r].priority_aging_s))
        if engines[r].enable_prefix_caching and engines[r].block_hash_caching:
            req.idents = prompt_block_identities(j, req.P, engines[r].block_size, req.group, req.prefix_len)
        rep.hand(req)
        owner[k] = r
        reqs[k] = req
        out.append(req)

    while True:
        t = min([next_send()] + [_next_event(rep) for rep in reps])
        if t == math.inf:
            break
        if scrapes:
            t = min(t, k_scrape * staleness_s)
        # 1. steps ending at or before t end; their departures are released at t
        for rep in reps:
            rep.advance_until(t)
        release(t)
        # 2. a scrape
        if scrapes and k_scrape * staleness_s == t:
            views = [rep.view() for rep in reps]
            k_scrape += 1
        while True:
            # 3. the sends due at t, in send order
            while next_send() <= t:
                assert next_send() == t
                send(t)
            # 4. the schedules at t; their departures are released after them all
            due = [rep for rep in reps if _next_event(rep) <= t]
            if not due:
                break
            for rep in due:
                assert _next_event(rep) == t
                rep.advance_until(math.nextafter(t, math.inf))
                assert _next_event(rep) > t
            release(t)
    assert k_next == n and not out
    assert all(r.finish == t for r, t in released if r.status == COMPLETED)   # (at its last token)
    return _finish(reps, reqs, owner, sent)
