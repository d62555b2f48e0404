"""A slow, plain-Python reference simulator of ``docs/engine-model.md``.

This module exists to check the fast Numba kernel (``fastsim/kernel/``)
against an independent, deliberately simple implementation of the same
specification. It shares no simulation code with the kernel: it uses only the
configuration (:class:`EngineConfig`) and the latency model
(:class:`LatencyModel`).

It is written for clarity, not speed: one object per request, plain lists for
the running batch and the waiting and swapped queues, a dict for the prefix
cache, one iteration of the main loop per engine step. It implements every
option of the spec, including those the kernel may not have yet (swap
preemption, active priority preemption and aging, SJF keys, prefix caching),
and asserts the conservation of KV blocks and swap space after every
scheduling pass. Comments quote the rules of ``docs/engine-model.md`` ("spec")
that each piece of code implements. Where the spec is ambiguous, the most
literal reading is implemented and the choice is marked ``SPEC-QUESTION:``.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ._config import EngineConfig
from ._latency import LatencyModel

# Final status of a request (the ``status`` output array).
COMPLETED = 0
REJECTED_TOO_LONG = 1
REJECTED_ADMISSION = 2
DROPPED = 3
UNFINISHED = 4
# SPEC-QUESTION: the spec says arrivals with a_i >= H "do not exist"; the
# output still has one entry per input row, so such rows get this extra code
# (they are none of completed/rejected/dropped/unfinished).
NOT_ARRIVED = -1

_IN_SYSTEM = -2  # internal: waiting or running (becomes UNFINISHED at a horizon)


@dataclass(eq=False)
class _Request:
    """One request and everything the reference tracks about it."""

    idx: int          # arrival index i
    arrival: float    # a_i
    P: int            # prompt length P_i
    O: int            # output length O_i
    prio: int         # priority c_i (lower is more urgent)
    sjf_key: int = 0  # q_i, the SJF key (O_i unless predicted)
    group: int = -1   # prefix group G_i (-1: none)
    prefix_len: int = 0   # L_i, tokens of the group's shared prefix at the start of the prompt
    qkey: object = 0  # queue key e_i (spec, "Waiting-queue order"); the arrival index for fcfs
    k: int = 0        # tokens computed (held in the KV cache)
    g: int = 0        # output tokens generated (emitted)
    private: int = 0  # KV blocks allocated to it alone (all its blocks without prefix caching)
    swap_blocks: int = 0      # m: blocks it holds in the CPU swap space while swapped
    swapped_since: float = math.nan
    num_swaps: int = 0
    swapped_s: float = 0.0
    cached_tokens: int = 0    # h * block_size at its first admission
    reserved_tokens: int = 0   # admission="kv_reservation" reservation held
    ever_scheduled: bool = False
    num_preemptions: int = 0
    status: int = NOT_ARRIVED
    first_token: float = math.nan
    finish: float = math.nan
    last_token: float = math.nan
    itl_max: float = math.nan
    ingested: float = math.nan   # when it was ingested (>= arrival)

    ph: int = 0       # async scheduling: output placeholders (tokens of steps in flight)
    num_cached: int = 0   # block_hash_caching: its leading blocks already cached
    turns_left: int = -1  # sessions: turns of its session after it (-1: none, or its departure handled)
    remote_k: int = 0     # disaggregated decode side: prompt tokens whose KV arrived from a prefill replica

    def __post_init__(self):
        self.gaps: list[float] = []  # inter-token gaps, in order
        # Prefix-cache entries (group, j) it references, by j (always ascending).
        self.entries: list[int] = []
        # block_hash_caching: the ids of its blocks in the block pool, in token order,
        # and the identity of each full block of its prompt (None: unique to it).
        self.block_ids: list[int] = []
        self.idents: list = []
        self.chains: list[int] = []   # chained block hashes, computed as its blocks fill

    @property
    def blocks(self) -> int:
        """Its KV blocks: referenced cache entries plus private blocks (or, with
        block_hash_caching, its blocks in the pool)."""
        return len(self.entries) + self.private + len(self.block_ids)

    def emit(self, when: float) -> None:
        """Spec: "the request emits one token (g += 1)" at the end of the step."""
        self.g += 1
        if self.g == 1:
            self.first_token = when          # TTFT measured at the end of that step
        else:
            gap = when - self.last_token
            self.gaps.append(gap)
            self.itl_max = gap if math.isnan(self.itl_max) else max(self.itl_max, gap)
        self.last_token = when


class _WaitingQueue:
    """The waiting (or swapped) queue, kept in order (head = element 0).

    Spec, "Waiting-queue order":
    * fcfs: arrival order; a preempted request goes to the *front*;
    * priority and sjf: ascending (e_i, i), e_i the queue key (c_i, or q_i
      for sjf, plus a_i / A with aging);
    for priority and sjf a preempted request re-enters with its own key.
    The swapped queue is ordered by (e_i, i) for every policy (e_i = i for
    fcfs): pass policy="keyed".
    """

    def __init__(self, policy: str):
        self.policy = policy
        self.items: list[_Request] = []

    @staticmethod
    def _key(r: _Request):
        return (r.qkey, r.idx)

    def _add_sorted(self, r: _Request) -> None:
        self.items.append(r)
        self.items.sort(key=self._key)  # keys are unique (they include the index)

    def add_arrival(self, r: _Request) -> None:
        if self.policy == "fcfs":
            self.items.append(r)
        else:
            self._add_sorted(r)

    def add_preempted(self, r: _Request) -> None:
        if self.policy == "fcfs":
            self.items.insert(0, r)
        else:
            self._add_sorted(r)

    def head(self) -> _Request:
        return self.items[0]

    def pop_head(self) -> _Request:
        return self.items.pop(0)

    def remove(self, r: _Request) -> None:
        self.items.remove(r)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(list(self.items))


class _BlockPool:
    """vLLM V1's KV block pool with prefix caching by block hash
    (``vllm/v1/core/block_pool.py``; spec, "Prefix caching by block hash").

    One queue holds every block that no request references, free or cached, in
    eviction order (head first): initially all blocks by id (block 0 taken out
    as the null block when there is one); taking a block pops the head and
    evicts the hash it had; a request's freed blocks join the tail in reverse
    order (its last block is evicted first); a hit on a queued block removes it
    from the queue. A hash may name several blocks (duplicates computed at the
    same time); a lookup takes the first one cached.
    """

    def __init__(self, num_blocks: int, null_block: bool):
        first = 1 if null_block else 0
        self.usable = num_blocks - first
        self.queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(first, num_blocks))
        self.ref = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, list[int]] = {}     # chained hash -> its blocks, in caching order

    def num_free(self) -> int:
        """Blocks no request references (free or cached): vLLM's get_num_free_blocks."""
        return len(self.queue)

    def num_evictable(self) -> int:
        return sum(self.hash[b] is not None for b in self.queue)

    def lookup(self, h: int) -> int | None:
        blocks = self.cached.get(h)
        return blocks[0] if blocks else None

    def take(self, n: int) -> list[int]:
        """get_new_blocks: pop n blocks from the head, evicting their hashes."""
        assert n <= len(self.queue)
        out = []
        for _ in range(n):
            b, _ = self.queue.popitem(last=False)
            if self.hash[b] is not None:
                lst = self.cached[self.hash[b]]
                lst.remove(b)
                if not lst:
                    del self.cached[self.hash[b]]
                self.hash[b] = None
            assert self.ref[b] == 0
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.queue[b]
            self.ref[b] += 1

    def release(self, ordered: list[int]) -> None:
        """free_blocks: drop one reference each; those reaching 0 join the tail in order."""
        for b in ordered:
            self.ref[b] -= 1
        for b in ordered:
            if self.ref[b] == 0:
                self.queue[b] = None

    def cache(self, b: int, h: int) -> None:
        assert self.hash[b] is None
        self.hash[b] = h
        self.cached.setdefault(h, []).append(b)

    def check(self, held: dict[int, int]) -> None:
        """Conservation: every usable block is queued (no reference) or referenced
        by the running requests exactly ref times; the hash map matches the
        blocks' hashes."""
        assert len(self.queue) + len(held) == self.usable
        for b, n in held.items():
            assert b not in self.queue and self.ref[b] == n
        assert all(self.ref[b] == 0 for b in self.queue)
        assert all(self.hash[b] == h for h, lst in self.cached.items() for b in lst)
        assert sum(len(lst) for lst in self.cached.values()) == sum(h is not None for h in self.hash)


def _roofline_step_time(rec, n_decode, n_prefill_tokens, n_context_tokens, pairs2, n_prefill_seqs, n_swap):
    """The roofline's step time (`fastsim.RooflineLatency`) from its coefficient record ``rec``
    (the kernel's latency record, read by slot): in plain Python, the terms in the order the
    docstring of `RooflineLatency` states them."""
    from .kernel import layout as K

    def gemm(o, rows):
        return rec[o] + max(rec[o + 1] * rows, rec[o + 2] + rec[o + 3] * rows)

    t = float(n_decode + n_prefill_tokens)
    rows = float(n_decode + n_prefill_seqs)
    d = float(rec[K.L_R_OVER]) + float(rec[K.L_R_PER_SEQ]) * rows
    for j in range(int(rec[K.L_R_NGEMM])):
        d += float(gemm(K.L_R_GEMM + 4 * j, t))
    e = float(rec[K.L_R_MOE_E])
    if e > 0.0 and t > 0.0:
        touched = e * (1.0 - float(rec[K.L_R_MOE_Q]) ** t)
        m = t * float(rec[K.L_R_MOE_K]) / touched
        d += touched * float(gemm(K.L_R_MOE_GEMM, m) + gemm(K.L_R_MOE_GEMM + 4, m))
    if n_decode > 0:
        d += float(rec[K.L_R_GA_T0]) + float(rec[K.L_R_GA_SEQ]) * n_decode
    if n_prefill_tokens > 0:
        d += float(rec[K.L_R_CA_T0]) + float(rec[K.L_R_CA_PAIR]) * pairs2
    if rows > 0.0:
        d += float(gemm(K.L_R_LM, rows))
    d += float(rec[K.L_R_AR_T0]) + float(rec[K.L_R_AR_TOK]) * t
    d += float(rec[K.L_CTX]) * n_context_tokens
    if n_swap > 0:
        d += float(rec[K.L_SWAP]) * n_swap
    return d


class _Reference:
    """The state of one run and the operations of the spec on it."""

    def __init__(self, requests: list[_Request], engine: EngineConfig, latency: LatencyModel,
                 horizon_s: float | None, step_noise=None, max_concurrency: int | None = None,
                 think_time_s: float = 0.0):
        self.e = engine
        self.latency = latency
        # the roofline's coefficients (`RooflineLatency._params`), read by `_roofline_step_time`
        self.roof = latency._params() if getattr(latency, "roofline", None) is not None else None
        self.step_noise = step_noise   # per-step jitter and stalls (`_reference_noise.StepNoiseDraws`)
        self.horizon = horizon_s
        self.requests = requests
        # Spec, "Horizon": "only arrivals with a_i < H exist".
        self.arrivals = [r for r in requests if horizon_s is None or r.arrival < horizon_s]
        self.next_arrival = 0                 # index into self.arrivals
        # Spec, "Closed-loop load": with c = max_concurrency, the requests after
        # the first c go when departures from the system free seats; until then
        # their arrival is unknown. `wanted` keeps the time each would go at
        # otherwise; `think` the think time of each departure (pure closed loop).
        self.seats = max_concurrency
        self.sessions = None                  # multi-turn sessions (`_session_sends`), set by simulate_reference
        self.pure_loop = think_time_s is not None
        self.think = think_time_s
        self.departures = 0                   # requests that left (completed, rejected, dropped)
        self.wanted = [r.arrival for r in requests]
        # pure closed loop: the known send times of the requests not yet ingested, sorted
        self.pending: list[float] = [r.arrival for r in requests[:self.seats or 0]]
        if self.seats is not None:
            for r in requests[self.seats:]:
                r.arrival = math.inf
        self.t = 0.0                          # the clock (start of the current step)
        self.running: list[_Request] = []     # in admission order
        self.waiting = _WaitingQueue(engine.policy)
        self.swapped = _WaitingQueue("keyed")  # spec: ordered by (e_i, i)
        self.swap = engine.preemption_mode == "swap"
        self.caching = engine.enable_prefix_caching
        # Spec, "The null block": vLLM keeps block 0 out of use.
        self.usable_blocks = engine.num_gpu_blocks - (1 if engine.null_block else 0)
        self.hashing = engine.enable_prefix_caching and engine.block_hash_caching
        self.pool = _BlockPool(engine.num_gpu_blocks, engine.null_block) if self.hashing else None
        self.chain_ids: dict[tuple, int] = {}  # (parent chain, block identity) -> chained hash
        self.private_used = 0                 # private blocks of all requests
        # Prefix cache: (group, j) -> reference count; the evictable entries (count 0)
        # in LRU order (head = evicted first).
        self.cache: dict[tuple[int, int], int] = {}
        self.evictable: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.swap_used = 0                    # blocks held in CPU swap space
        self.pending_swap_blocks = 0          # transfers not yet charged to a step
        self.reserved_tokens = 0              # sum of kv_reservation reservations held
        self.num_steps = 0
        self.max_blocks_used = 0
        self.max_blocks_resident = 0          # allocated + evictable (<= num_gpu_blocks)
        self.max_swap_used = 0
        self.total_swap_transfers = 0         # blocks moved out + in
        self.priority_preemptions = 0         # phase-0 preemptions
        # (t, t + d, running, waiting incl. swapped, allocated blocks, swapped requests,
        #  swap blocks used, evictable cached blocks) of every step with a duration
        self.step_log: list[tuple] = []
        # (start, ((request, tokens, computed before), ...)) of every step with a duration
        self.batches: list[tuple] = []

    # ------------------------------------------------------------------ blocks
    def blocks_for(self, tokens: int) -> int:
        """Spec, "KV cache": a request with k + s tokens holds ceil((k + s) / block_size) blocks."""
        return -(-tokens // self.e.block_size)

    @property
    def blocks_used(self) -> int:
        """Allocated blocks: private ones plus referenced cache entries (each counted once)."""
        if self.hashing:
            return self.pool.usable - self.pool.num_free()
        return self.private_used + len(self.cache) - len(self.evictable)

    @property
    def num_evictable(self) -> int:
        return self.pool.num_evictable() if self.hashing else len(self.evictable)

    def plain_free(self) -> int:
        """Blocks holding nothing (spec: free + private + entries = usable blocks)."""
        return self.usable_blocks - self.private_used - len(self.cache)

    def free_blocks(self) -> int:
        """Spec: "enough free blocks" means at most free + evictable."""
        if self.hashing:
            return self.pool.num_free()
        return self.plain_free() + len(self.evictable)

    def take_block(self) -> None:
        """Spec, "Taking a block": a free block if any, else evict the LRU evictable entry."""
        if self.plain_free() == 0:
            victim, _ = self.evictable.popitem(last=False)
            del self.cache[victim]
        assert self.plain_free() > 0

    def allocate_to(self, r: _Request, total_tokens: int) -> None:
        """Grow r's allocation to cover total_tokens tokens (caller checked it fits)."""
        new = self.blocks_for(total_tokens) - r.blocks
        assert new <= self.free_blocks()
        if self.hashing:
            # vLLM's allocate_slots: new blocks from the queue's head, then every block
            # full of known tokens (prompt and tokens generated so far) up to the end
            # of the scheduled chunk is cached at once, before the step runs.
            r.block_ids += self.pool.take(max(new, 0))
            self.cache_full_blocks(r, min(total_tokens, r.P + r.g))
            return
        assert new >= 0
        for _ in range(new):
            self.take_block()
            r.private += 1
            self.private_used += 1

    def shrink_to(self, r: _Request, total_tokens: int) -> None:
        """Return the private blocks beyond total_tokens (a victim's unexecuted tokens)."""
        if self.hashing:
            return    # vLLM frees the victim's blocks, these included, in its preemption
        extra = r.blocks - self.blocks_for(total_tokens)
        assert 0 <= extra <= r.private
        r.private -= extra
        self.private_used -= extra

    def free_all_blocks(self, r: _Request) -> None:
        """Spec, "Release": private blocks become free; entry counts drop in
        descending j, an entry reaching 0 joins the tail of the evictable list."""
        if self.hashing:
            # vLLM frees a request's blocks last block first, so that its tail is
            # evicted before its head.
            self.pool.release(list(reversed(r.block_ids)))
            r.block_ids = []
            r.num_cached = 0
            return
        self.private_used -= r.private
        r.private = 0
        for j in reversed(r.entries):
            key = (r.group, j)
            self.cache[key] -= 1
            if self.cache[key] == 0:
                self.evictable[key] = None
        r.entries = []

    # ----------------------------------------------------------- prefix cache
    def full_prefix_blocks(self, r: _Request) -> int:
        """f_i = floor(L_i / bs): the prefix blocks r can share (0 without caching)."""
        if not self.caching or r.group < 0:
            return 0
        return r.prefix_len // self.e.block_size

    def chain(self, r: _Request, j: int) -> int:
        """The chained hash of r's block j (its tokens and all before them): block
        identities from the workload for the prompt's full blocks, unique to r
        otherwise (blocks holding generated tokens)."""
        while len(r.chains) <= j:
            m = len(r.chains)
            ident = r.idents[m] if m < len(r.idents) and r.idents[m] is not None else ("req", r.idx, m)
            key = (r.chains[-1] if r.chains else -1, ident)
            r.chains.append(self.chain_ids.setdefault(key, len(self.chain_ids)))
        return r.chains[j]

    def cache_full_blocks(self, r: _Request, num_tokens: int) -> None:
        """vLLM's cache_blocks: cache r's blocks num_cached .. num_tokens // bs - 1."""
        full = num_tokens // self.e.block_size
        for j in range(r.num_cached, full):
            self.pool.cache(r.block_ids[j], self.chain(r, j))
        r.num_cached = max(r.num_cached, full)

    def hit_blocks(self, w: _Request) -> list[int]:
        """vLLM's find_longest_cache_hit: the cached blocks of w's leading full blocks,
        at most (P + g - 1) tokens' worth (the last known token is always recomputed)."""
        out = []
        for j in range((w.P + w.g - 1) // self.e.block_size):
            b = self.pool.lookup(self.chain(w, j))
            if b is None:
                break
            out.append(b)
        return out

    def lookup(self, w: _Request) -> int:
        """Spec, "Lookup": the longest run of cached entries (G_w, 0..h-1), h <= f_w."""
        if self.hashing:
            return len(self.hit_blocks(w))
        f = self.full_prefix_blocks(w)
        h = 0
        while h < f and (w.group, h) in self.cache:
            h += 1
        return h

    def capacity_for(self, w: _Request, h: int) -> int:
        """Spec: free + evictable - (evictable entries among w's h hits)."""
        if self.hashing:
            return self.pool.num_free() - sum(self.pool.ref[b] == 0 for b in self.hit_blocks(w)[:h])
        return self.free_blocks() - sum((w.group, j) in self.evictable for j in range(h))

    def claim_hits(self, w: _Request, h: int) -> None:
        """Admission references the h hit entries and starts w at k = h * bs."""
        assert w.k == 0 and w.blocks == 0
        if self.hashing:
            hits = self.hit_blocks(w)[:h]
            self.pool.touch(hits)
            w.block_ids = list(hits)
            w.num_cached = h
            w.k = h * self.e.block_size
            return
        for j in range(h):
            key = (w.group, j)
            self.cache[key] += 1
            self.evictable.pop(key, None)
            w.entries.append(j)
        w.k = h * self.e.block_size

    def register(self, r: _Request, k0: int) -> None:
        """Spec, "Registration": r's computed tokens grew from k0 to r.k; each of its
        blocks j with floor(k0/bs) <= j < min(floor(k/bs), f) becomes the entry
        (G, j) if the cache has none (else it stays a private duplicate)."""
        if self.hashing:
            return    # cached when scheduled (allocate_to)
        bs = self.e.block_size
        for j in range(k0 // bs, min(r.k // bs, self.full_prefix_blocks(r))):
            key = (r.group, j)
            if key in self.cache:
                continue
            assert r.private > 0
            self.cache[key] = 1
            r.entries.append(j)
            r.private -= 1
            self.private_used -= 1

    def check_invariants(self) -> None:
        """Conservation of blocks and swap space (asserted at every step)."""
        e = self.e
        if self.hashing:
            held: dict[int, int] = {}
            for r in self.running:
                assert len(r.block_ids) >= self.blocks_for(r.k) and r.num_cached <= len(r.block_ids)
                for b in r.block_ids:
                    held[b] = held.get(b, 0) + 1
            self.pool.check(held)
        assert 0 <= self.private_used and self.plain_free() >= 0
        assert self.private_used + len(self.cache) <= self.usable_blocks
        assert self.private_used == sum(r.private for r in self.running)
        refs: dict[tuple[int, int], int] = {}
        for r in self.running:
            assert r.blocks >= self.blocks_for(r.k)
            for j in r.entries:
                refs[(r.group, j)] = refs.get((r.group, j), 0) + 1
        assert all(self.cache[key] == refs.get(key, 0) for key in self.cache)
        assert set(refs) <= set(self.cache)
        assert set(self.evictable) == {key for key, c in self.cache.items() if c == 0}
        for r in self.waiting:
            assert r.blocks == 0 and r.k == 0 and r.swap_blocks == 0
        assert 0 <= self.swap_used <= e.swap_space_blocks
        assert self.swap_used == sum(r.swap_blocks for r in self.swapped)
        for r in self.swapped:
            assert r.blocks == 0 and r.swap_blocks == self.blocks_for(r.k) > 0

    # -------------------------------------------------------- arrivals & exits
    def ingest_until(self, time: float, inclusive: bool) -> None:
        """Ingest, in index order, the arrivals with a_i < time (or <= time)."""
        while self.next_arrival < len(self.arrivals):
            r = self.arrivals[self.next_arrival]
            if r.arrival < time or (inclusive and r.arrival == time):
                r.ingested = time
                if self.sessions is not None:
                    # (a turn's place in the stream is known when it arrives)
                    r.idx = self.next_arrival
                    r.qkey = queue_key(self.e.policy, r.idx, r.arrival, r.prio, r.sjf_key, None)
                self.next_arrival += 1
                if self.seats is not None and self.pure_loop:
                    self.pending.pop(0)   # (its send time)
                self.ingest(r)
            else:
                break

    def ingest_at(self, time: float) -> None:
        """Ingest the arrivals with a_i <= time; with sessions, the turns that
        this sends at ``time`` too (a rejected turn's user may start a session
        at once)."""
        self.ingest_until(time, inclusive=True)
        while self.sessions is not None:
            self.session_sends(time)
            nxt = self.next_arrival
            if not (nxt < len(self.arrivals) and self.arrivals[nxt].arrival <= time):
                break
            self.ingest_until(time, inclusive=True)

    def session_sends(self, t: float) -> None:
        """Spec, "Sessions": each turn that left the system and is not yet
        handled, in arrival order, sends its session's next turn a think time
        after ``t`` (prompt: the conversation so far, its prompt and output,
        then the new tokens), or ends its session (its last turn, or it did
        not complete); a user then starts a new session. The sends made are
        numbered; send m takes the m-th draws (think time, new tokens, output,
        priority, a new session's turns) and is placed among the sends not yet
        arrived by time, after those at the same time."""
        ss = self.sessions
        if ss is None:
            return
        reqs = self.requests
        for r in reqs[ss["scan"]:self.next_arrival]:
            if r.turns_left < 0 or r.status == _IN_SYSTEM:
                continue
            left, r.turns_left = r.turns_left, -1
            m = ss["made"]
            if m >= len(reqs):
                continue
            if r.status == COMPLETED and left > 0:
                conv, sid, after = r.P + r.O, r.group, left - 1
            elif ss["users"]:
                conv, sid, after = 0, m, ss["turns"][m] - 1
            else:
                continue
            v = t + ss["think"][m]
            if self.horizon is not None and v >= self.horizon:
                continue     # only arrivals before the horizon exist
            P, O = conv + ss["new"][m], ss["out"][m]
            turn = _Request(idx=-1, arrival=v, P=P, O=O, prio=ss["prio"][m], sjf_key=O, group=sid,
                            prefix_len=P + O)
            turn.turns_left = after
            if self.hashing:
                # every full block of a turn, prompt or output, is the session's block j
                turn.idents = [("group", sid, j) for j in range((P + O) // self.e.block_size)]
            pos = m
            while pos > self.next_arrival and reqs[pos - 1].arrival > v:
                pos -= 1
            reqs.pop(m)     # (the slot of send m, not yet made)
            reqs.insert(pos, turn)
            ss["made"] = m + 1
        while ss["scan"] < self.next_arrival and reqs[ss["scan"]].turns_left < 0:
            ss["scan"] += 1

    def ingest(self, r: _Request) -> None:
        """Spec, "Arrival handling and admission control": on ingestion, in this order."""
        e = self.e
        # 1. Never-fits rejection (reason too_long).
        too_long = ((e.max_model_len is not None and r.P + r.O > e.max_model_len)
                    or self.blocks_for(r.P + r.O - 1) > self.usable_blocks
                    or (not e.enable_chunked_prefill and r.P + r.O - 1 > e.max_num_batched_tokens))
        if too_long:
            r.status = REJECTED_TOO_LONG
            self.depart(r.ingested)
            return
        # 2. Admission control (reason admission).
        if e.admission == "queue_limit":
            # "reject if running + waiting >= max_num_seqs + max_waiting at that instant
            # (swapped requests count as waiting)"
            if len(self.running) + len(self.waiting) + len(self.swapped) >= e.max_num_seqs + e.max_waiting:
                r.status = REJECTED_ADMISSION
                self.depart(r.ingested)
                return
        elif e.admission == "kv_reservation":
            # "each admitted request reserves P_i + O_i tokens of the KV capacity
            # (usable blocks) * block_size from ingestion until it leaves; reject if
            # the reservation would not fit beside the reservations held."
            # SPEC-QUESTION: the reservation is P + O tokens although a request never
            # holds more than P + O - 1 (rule 1 uses P + O - 1), so a request with
            # P + O - 1 == capacity passes rule 1 but is always rejected here.
            need = r.P + r.O
            if self.reserved_tokens + need > self.usable_blocks * e.block_size:
                r.status = REJECTED_ADMISSION
                self.depart(r.ingested)
                return
            r.reserved_tokens = need
            self.reserved_tokens += need
        # 3. Otherwise the request joins the waiting queue.
        r.status = _IN_SYSTEM
        self.waiting.add_arrival(r)

    def leave(self, r: _Request, status: int, when: float) -> None:
        """r leaves the system (completed or dropped): free its blocks and reservation."""
        self.free_all_blocks(r)
        self.reserved_tokens -= r.reserved_tokens
        r.reserved_tokens = 0
        r.status = status
        r.finish = when
        self.depart(when)

    def depart(self, when: float) -> None:
        """Spec, "Closed-loop load": a request left the system at ``when`` (its last
        token, its rejection, its abandonment), the j-th departure. Pure closed
        loop: its client sends again at when + Z_j, and the requests not yet
        ingested are the pending sends in time order. Capped stream: request
        k = j + c goes at max(w_k, when, a_{k-1})."""
        if self.seats is None:
            return
        j = self.departures
        self.departures += 1
        k = j + self.seats
        if k >= len(self.requests):
            return
        if self.pure_loop:
            # the client sends again after thinking; the next requests to arrive
            # take the pending send times in order (ties: the earlier departure first)
            bisect.insort_right(self.pending, when + self.think[j])
            for i, a in enumerate(self.pending):
                self.requests[self.next_arrival + i].arrival = a
        else:
            self.requests[k].arrival = max(self.wanted[k], when, self.requests[k - 1].arrival)

    # Order at a boundary t: ingestion (a_i < t before the step's completions,
    # a_i == t after them), then abandonment ("At step start time t (after
    # ingestion and abandonment)"), so an arrival ingested at t still sees a
    # request that is dropped at t (e.g. for queue_limit / kv_reservation).
    def abandon(self) -> None:
        """Spec, "Abandonment": at the start of each step, a request that has waited
        since its arrival without ever being scheduled and whose a_i + D <= t leaves
        (dropped). Preempted requests are not subject to abandonment."""
        D = self.e.max_queue_delay_s
        if D is None:
            return
        for r in self.waiting:
            if not r.ever_scheduled and r.arrival + D <= self.t:
                self.waiting.remove(r)
                self.leave(r, DROPPED, self.t)

    # -------------------------------------------------------------- scheduling
    def victim(self) -> _Request:
        """Spec, "the victim": fcfs, and sjf without priority_preemption, preempt the
        last of the running list; priority, and sjf with priority_preemption, the
        running request with the largest (e, arrival index)."""
        e = self.e
        if e.policy == "priority" or (e.policy == "sjf" and e.priority_preemption):
            return max(self.running, key=lambda r: (r.qkey, r.idx))
        return self.running[-1]

    def first_chunk(self, w: _Request, h: int, B: int) -> int:
        """need = P + g - h * bs; the chunk s a budget B gives it (chunked prefill),
        or the whole need (chunked prefill off; the caller checks need <= B)."""
        need = w.P + w.g - max(h * self.e.block_size, w.remote_k)
        return min(need, B) if self.e.enable_chunked_prefill else need

    def could_schedule(self, w: _Request) -> bool:
        """Spec, phase 0: a seat, and ceil(c / bs) blocks of the free capacity for w,
        c its first chunk with the whole budget."""
        if len(self.running) >= self.e.max_num_seqs:
            return False
        h = self.lookup(w)
        c = self.first_chunk(w, h, self.e.max_num_batched_tokens)
        if self.e.scheduler_reserve_full_isl and self.blocks_for(w.P + w.g) - h > self.capacity_for(w, h):
            return False
        return self.blocks_for(c) <= self.capacity_for(w, h)

    def priority_preempt(self) -> None:
        """Spec, phase 0 (active priority preemption): while the waiting head w cannot
        be scheduled and the victim v has a strictly larger key, preempt v."""
        if not self.e.priority_preemption or len(self.waiting) == 0:
            return
        w = self.waiting.head()
        while self.running:
            v = self.victim()
            if not v.qkey > w.qkey:
                break             # "equal keys never preempt each other"
            if self.could_schedule(w):
                break
            self.preempt(v)       # nothing is scheduled yet: nothing to refund
            self.priority_preemptions += 1
            assert self.waiting.head() is w

    def schedule_continuous(self) -> dict:
        """One step of the continuous-batching scheduler. Returns {request: s}."""
        e = self.e
        B = e.max_num_batched_tokens
        scheduled: dict[_Request, int] = {}   # insertion-ordered
        preempted_this_step = False

        # 0. Active priority preemption.
        self.priority_preempt()

        # 1. Running requests, in the order they were admitted.
        i = 0
        while i < len(self.running) and B > 0:          # "Stop when B = 0."
            r = self.running[i]
            if r.ph > 0 and r.k + 2 - r.ph >= r.P + r.O:
                # Spec, "Async scheduling": its step in flight emits its last token.
                i += 1
                continue
            s = min(r.P + r.g + r.ph - r.k, B)
            r_was_victim = False
            # "Allocate the blocks for k_r + s tokens. If there are not enough free
            # blocks, preempt a victim and retry until the allocation fits or r
            # itself was the victim."
            while self.blocks_for(r.k + s) - r.blocks > self.free_blocks():
                v = self.victim()
                v_was_scheduled = v in scheduled
                if v_was_scheduled:
                    # "If the victim had already been scheduled earlier in this step,
                    # its tokens (and the blocks allocated for them) are returned first."
                    B += scheduled.pop(v)
                    self.shrink_to(v, v.k)
                self.preempt(v)
                preempted_this_step = True
                if v is r:
                    r_was_victim = True
                    break
                if v_was_scheduled:
                    i -= 1        # the list shifted under the cursor
            if r_was_victim:
                break             # "If r was the victim, stop scheduling running requests."
            # "Otherwise schedule s tokens for r, B -= s."
            self.allocate_to(r, r.k + s)
            scheduled[r] = s
            B -= s
            i += 1

        # 2. Swapped requests, only if nothing was preempted in phase 1.
        if self.swap and not preempted_this_step:
            while len(self.swapped) > 0 and B > 0 and len(self.running) < e.max_num_seqs:
                w = self.swapped.head()
                need = w.P + w.g - w.k
                assert need >= 1 and w.blocks == 0
                if e.enable_chunked_prefill:
                    s = min(need, B)
                else:
                    s = need
                    if need > B:
                        break
                if self.blocks_for(w.k + s) > self.free_blocks():
                    break         # "if ceil((k_w + s) / bs) blocks are not free, stop"
                # swap w in: swap_used -= m_w, m_w blocks transferred, append to running,
                # allocate, schedule s.
                self.swapped.pop_head()
                self.swap_used -= w.swap_blocks
                self.pending_swap_blocks += w.swap_blocks
                self.total_swap_transfers += w.swap_blocks
                w.swap_blocks = 0
                w.swapped_s += self.t - w.swapped_since
                w.swapped_since = math.nan
                self.running.append(w)
                self.allocate_to(w, w.k + s)
                scheduled[w] = s
                B -= s

        # 3. Waiting requests, only if nothing was preempted in phase 1 and the
        # swapped queue is empty.
        if not preempted_this_step and len(self.swapped) == 0:
            while len(self.waiting) > 0 and B > 0 and len(self.running) < e.max_num_seqs:
                w = self.waiting.head()
                assert w.k == 0 and w.blocks == 0
                h = self.lookup(w)          # 0 without prefix caching
                s = self.first_chunk(w, h, B)
                if s > B:
                    break     # chunked prefill off: "if need > B stop admitting in this step"
                # (a disaggregated decode side's loaded KV covers its hits: h * bs <= P - 1)
                if self.blocks_for(max(h * e.block_size, w.remote_k) + s) - h > self.capacity_for(w, h):
                    break     # "if ceil(s / bs) exceeds the free capacity for w, stop admitting"
                if e.scheduler_reserve_full_isl and self.blocks_for(w.P + w.g) - h > self.capacity_for(w, h):
                    break     # spec, "Full-input admission gate"
                # "otherwise admit w (append to running), reference its h hit entries
                # (k_w := h * bs), allocate ceil(s / bs) new blocks, schedule s, B -= s."
                self.waiting.pop_head()
                self.running.append(w)
                if not w.ever_scheduled:
                    w.cached_tokens = h * e.block_size   # at its first admission
                w.ever_scheduled = True
                self.claim_hits(w, h)
                w.k = max(w.k, w.remote_k)   # spec, "Disaggregated prefill and decode": the loaded KV
                self.allocate_to(w, w.k + s)
                scheduled[w] = s
                B -= s
        return scheduled

    def preempt(self, v: _Request) -> None:
        """Spec, phase 1: by swap if preemption_mode="swap" and m = ceil(k_v / bs) fits
        the swap space (GPU blocks freed, swap_used += m, k kept, to the swapped
        queue, m blocks transferred); otherwise by recompute: "the victim releases
        all its blocks, k := 0 (its generated tokens g are kept ...), and it returns
        to the waiting queue (front for fcfs)". The caller has already returned
        the victim's tokens scheduled in this step."""
        self.running.remove(v)
        v.num_preemptions += 1
        m = self.blocks_for(v.k)
        assert v.blocks == m or self.hashing   # vLLM frees a victim's just-allocated blocks with it
        if self.swap and m <= self.e.swap_space_blocks - self.swap_used:
            assert not v.entries      # swap is not combined with prefix caching
            self.free_all_blocks(v)
            self.swap_used += m
            self.max_swap_used = max(self.max_swap_used, self.swap_used)
            self.pending_swap_blocks += m
            self.total_swap_transfers += m
            v.swap_blocks = m
            v.num_swaps += 1
            v.swapped_since = self.t
            self.swapped.add_arrival(v)
            return
        self.free_all_blocks(v)
        v.k = 0
        v.remote_k = 0      # the loaded KV is gone with its blocks: recomputed here
        self.waiting.add_preempted(v)

    def schedule_static(self) -> dict:
        """One step of the static-batching baseline. Returns {request: s}."""
        e = self.e
        # "When no batch is running, form a batch from the waiting queue in policy
        # order: up to max_num_seqs requests, each reserving all
        # ceil((P + O - 1) / block_size) blocks up front, stopping at the first
        # that does not fit."
        if not self.running:
            budget_left = e.max_num_batched_tokens
            while len(self.waiting) > 0 and len(self.running) < e.max_num_seqs:
                w = self.waiting.head()
                if self.blocks_for(w.P + w.O - 1) > self.free_blocks():
                    break
                # "with chunked prefill off, a member is also only added while its
                # whole prompt fits the step's remaining token budget"
                if not e.enable_chunked_prefill:
                    if w.P > budget_left:
                        break
                    budget_left -= w.P
                self.waiting.pop_head()
                self.running.append(w)
                w.ever_scheduled = True
                self.allocate_to(w, w.P + w.O - 1)

        # "The batch's members are scheduled in steps exactly as above (chunked
        # prefill and the token budget apply)" -- i.e. step 1 over the members in
        # admission order; there is never a preemption (all blocks are reserved).
        # With chunked prefill off the formation rule above guarantees that every
        # member's whole prompt fits the first step, so the branch below that
        # stops on "need > B" is a safeguard that never triggers.
        B = e.max_num_batched_tokens
        scheduled: dict[_Request, int] = {}
        for r in self.running:
            if B == 0:
                break             # "Stop when B = 0."
            if r.g == r.O:
                # "a member that has generated all its tokens keeps its slot and
                # blocks and keeps decoding padding (one token per step, counted in
                # n_decode)". SPEC-QUESTION: padding does not advance k (k stays at
                # P + O - 1, so the reserved blocks suffice); it costs one budget
                # token and, as s = 1 with k = P + g - 1, counts k + 1 = P + O
                # context tokens and one n_decode.
                s = 1
            else:
                need = r.P + r.g - r.k
                if e.enable_chunked_prefill:
                    s = min(need, B)
                else:
                    if need > B:
                        break
                    s = need
            scheduled[r] = s
            B -= s
        blocked = any(m.g < m.O for m in self.running if m not in scheduled)
        if blocked and all(s == 1 and r.k == r.P + r.g - 1 for r, s in scheduled.items()):
            # Every scheduled member takes one token now and will take exactly one
            # token in every later step (decode, then padding), so the budget left
            # for the first unscheduled member never grows: the batch can never end.
            # SPEC-QUESTION: the spec does not rule this out (e.g.
            # max_num_batched_tokens < batch size); the reference refuses to loop.
            raise RuntimeError("static batch can never finish: the token budget left after the "
                               "members' decode/padding tokens never covers an unfinished member "
                               f"(max_num_batched_tokens={e.max_num_batched_tokens}, "
                               f"batch size {len(self.running)})")
        return scheduled

    # --------------------------------------------------------------- main loop
    def step_time(self, scheduled: dict) -> float:
        """Spec, "Step duration": the latency model on the scheduled batch (before
        its tokens are applied; with async scheduling, tokens of a step in flight
        count as known: its placeholders)."""
        n_decode = 0
        n_prefill_tokens = 0
        n_context_tokens = 0
        pairs2 = 0      # the roofline: twice the prefill chunks' causal query-key pairs
        n_prefill_seqs = 0
        for r, s in scheduled.items():
            # decoding: "one token, g >= 1, k = P + g - 1". Literal reading: the
            # last 1-token chunk of a recompute (g >= 1) also counts as decoding,
            # the last 1-token chunk of a first prefill (g = 0) does not.
            g = r.g + r.ph
            if s == 1 and g >= 1 and r.k == r.P + g - 1:
                n_decode += 1
            else:
                n_prefill_tokens += s
                if s > 0:
                    pairs2 += s * (2 * r.k + s + 1)
                    n_prefill_seqs += 1
            n_context_tokens += r.k + s
        # ... + swap_s_per_block * n_swap_blocks, added last.
        if self.roof is not None:
            d = _roofline_step_time(self.roof, n_decode, n_prefill_tokens, n_context_tokens, pairs2,
                                    n_prefill_seqs, self.pending_swap_blocks)
        else:
            d = float(self.latency.step_time(n_decode, n_prefill_tokens, n_context_tokens,
                                             self.pending_swap_blocks))
        if self.step_noise is not None:   # step k's noise, k = the steps before it
            d = self.step_noise.apply(d, self.num_steps)
        self.pending_swap_blocks = 0
        return d

    def log_step(self, t_end: float, scheduled: dict, t_start: float | None = None) -> None:
        t_start = self.t if t_start is None else t_start
        self.batches.append((t_start, tuple((r.idx, s, r.k) for r, s in scheduled.items())))
        self.num_steps += 1
        self.max_blocks_used = max(self.max_blocks_used, self.blocks_used)
        self.max_blocks_resident = max(self.max_blocks_resident, self.blocks_used + self.num_evictable)
        self.step_log.append((t_start, t_end, len(self.running), len(self.waiting) + len(self.swapped),
                              self.blocks_used, len(self.swapped), self.swap_used, self.num_evictable))

    def end_step(self, scheduled: dict, t_end: float, static: bool) -> None:
        """The synchronous loop at t + d, the end of the step ``scheduled``."""
        # arrivals with a_i < t + d are ingested before the step's completions are applied ...
        self.ingest_until(t_end, inclusive=False)
        # ... then the step is applied, in the order of the running list: "each
        # adds s to k; with prefix caching it registers its newly computed full
        # prefix blocks; it emits a token if k = P + g; and it completes if g = O".
        # (scheduled holds the running list's order: phase 1 in running order,
        # then the requests appended to it by phases 2 and 3.)
        assert list(scheduled) == [r for r in self.running if r in scheduled]
        for r, s in scheduled.items():
            if static and r.g == r.O:
                continue      # padding: no KV growth, no token
            k0 = r.k
            r.k += s
            self.register(r, k0)
            if r.k == r.P + r.g:
                r.emit(t_end)
                if r.g == r.O and not static:
                    self.running.remove(r)
                    self.leave(r, COMPLETED, t_end)
        if static and all(r.g == r.O for r in self.running):
            # "until the longest member finishes; then every member completes at
            # that step's end"
            for r in self.running:
                self.leave(r, COMPLETED, t_end)
            self.running = []
        self.session_sends(t_end)
        # ... and a request arriving exactly at t + d is ingested after them.
        self.ingest_at(t_end)
        self.t = t_end

    def form_batch(self, gpu_free: float):
        """Async scheduling: schedule a batch at the clock, to run once the GPU
        is free (at ``gpu_free``); return (scheduled, its end, when the GPU is
        free after it, its outputs [(request, emits)])."""
        scheduled = self.schedule_continuous()
        self.check_invariants()
        if scheduled:
            start = max(self.t, gpu_free)
            end = start + self.step_time(scheduled)
            gpu_free = end
            self.log_step(end, scheduled, start)
        else:
            end = self.t     # an empty batch runs nothing
        outputs = []
        # vLLM's _update_after_schedule: k advances now; a request whose
        # known tokens (placeholders included) are all computed emits a
        # token at the batch's end and holds a placeholder until then.
        for r, s in scheduled.items():
            r.k += s
            emits = r.k == r.P + r.g + r.ph
            if emits:
                r.ph += 1
            outputs.append((r, emits))
        return scheduled, end, gpu_free, outputs

    def apply_batch(self, outputs) -> None:
        """Async scheduling: a batch's output at its end (the clock): its
        tokens emitted, blocks full of known tokens cached, completions."""
        for r, emits in outputs:
            if not emits or r.status != _IN_SYSTEM:
                continue
            r.ph -= 1
            r.emit(self.t)
            running = r in self.running
            if running and self.hashing:
                self.cache_full_blocks(r, r.k - r.ph)
            if r.g == r.O:
                # A request preempted while this step ran completes from the
                # waiting queue (its blocks were freed when it was preempted).
                if running:
                    self.running.remove(r)
                else:
                    self.waiting.remove(r)
                self.leave(r, COMPLETED, self.t)

    def run_async(self) -> float:
        """Spec, "Async scheduling": vLLM's engine core with a batch queue of 2
        (``EngineCore.step_with_batch_queue``). A batch is scheduled at the clock
        ``t`` and runs when the GPU is free; the core schedules a second batch
        at once while one is in flight, and otherwise waits for the oldest batch
        and applies its output at its end. So batch n+1 is scheduled when batch
        n starts, before batch n's tokens and completions are known."""
        in_flight: list[tuple[float, list]] = []   # (end, [(request, emits)]) oldest first
        gpu_free = 0.0
        while True:
            # (sessions, spec "Sessions": the completions applied at t send first, then the
            # ingestion's rejections at t, then the abandonments at t)
            self.ingest_at(self.t)
            self.abandon()
            self.session_sends(self.t)
            if self.running or len(self.waiting) > 0:
                scheduled, end, gpu_free, outputs = self.form_batch(gpu_free)
                in_flight.append((end, outputs))
                if scheduled and len(in_flight) < 2:
                    continue      # the only batch in flight: schedule the next one now
            elif not in_flight:
                if self.next_arrival >= len(self.arrivals):
                    break         # drained
                if self.arrivals[self.next_arrival].arrival == math.inf:
                    break         # (sessions: no turn left to send)
                self.t = max(self.t, self.arrivals[self.next_arrival].arrival)
                continue
            # Wait for the oldest batch and apply its output at its end.
            end, outputs = in_flight.pop(0)
            self.t = max(self.t, end)
            self.apply_batch(outputs)
            self.session_sends(self.t)
            if self.horizon is not None and self.t >= self.horizon:
                # steps still in flight leave their requests unfinished, and
                # the arrivals no schedule has seen yet are unfinished too
                self.unseen_unfinished()
                break
        self.check_invariants()
        for r in self.running:
            r.status = UNFINISHED
        for r in self.waiting:
            r.status = UNFINISHED
        return self.t

    def unseen_unfinished(self) -> None:
        """At an (async) stop at the horizon: the requests that arrived
        before it but that no schedule has seen yet are unfinished."""
        for r in self.arrivals[self.next_arrival:]:
            if not r.arrival < self.horizon:
                break
            r.status = UNFINISHED

    def run(self) -> float:
        e = self.e
        if e.async_scheduling:
            return self.run_async()
        static = e.scheduler == "static"
        while True:
            # ---- step start at time t (all arrivals with a_i <= t are ingested)
            self.abandon()
            self.session_sends(self.t)
            if not self.running and len(self.waiting) == 0 and len(self.swapped) == 0:
                # "when the engine is idle (nothing running or waiting), time jumps to
                # the next arrival and the step starts at that instant"
                if self.next_arrival >= len(self.arrivals):
                    # Drained (or no more arrivals before the horizon). SPEC-QUESTION:
                    # the spec does not say when such a run "ends"; end_s is the
                    # clock: the last step's end, or the instant of a later idle
                    # jump whose arrivals were all rejected; with a horizon that the
                    # run drains before, it is not H but that same clock.
                    break
                if self.arrivals[self.next_arrival].arrival == math.inf:
                    break         # (sessions: no turn left to send)
                self.t = self.arrivals[self.next_arrival].arrival
                self.ingest_at(self.t)
                continue          # a new step start (ingestion, then abandonment)

            scheduled = self.schedule_static() if static else self.schedule_continuous()
            self.check_invariants()
            if not scheduled:
                # "If nothing is scheduled the step has no duration and the loop continues"
                # (its swap transfers, if any, are charged to the next step).
                continue

            # ---- step duration (spec, "Step duration (latency model)")
            d = self.step_time(scheduled)
            t_end = self.t + d
            self.log_step(t_end, scheduled)

            self.end_step(scheduled, t_end, static)

            # "Horizon: the run stops at the first step boundary t >= H"
            if self.horizon is not None and self.t >= self.horizon:
                break
        # Requests still running, waiting or swapped are unfinished.
        self.check_invariants()
        for r in self.running:
            r.status = UNFINISHED
        for r in self.waiting:
            r.status = UNFINISHED
        for r in self.swapped:
            r.status = UNFINISHED
            r.swapped_s += self.t - r.swapped_since   # "to that stop"
        return self.t


def _int_array(name: str, values, n: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.shape != (n,) or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be a 1-d integer array of length {n} (one per request), "
                         f"got shape {arr.shape} and dtype {arr.dtype}")
    return arr.astype(np.int64)


def queue_key(policy: str, index: int, arrival: float, priority: int, sjf_key: int,
              aging_s: float | None):
    """The static queue key e_i (spec, "Waiting-queue order"): c_i (priority) or
    q_i (sjf), plus a_i / A with aging, in double precision: a_i / A first, then
    added to the integer converted to double. fcfs: the arrival index (the
    swapped queue's order)."""
    if policy == "fcfs":
        return index
    base = priority if policy == "priority" else sjf_key
    if aging_s is None:
        return base
    return float(base) + arrival / aging_s


def prompt_block_identities(index: int, prompt_len: int, block_size: int, prefix_group: int = -1,
                            prefix_len: int = 0, block_hashes=None, hash_block_size: int | None = None) -> list:
    """The identity of each full block of a prompt, for prefix caching by block hash.

    Two blocks with the same identity (and the same identities before them)
    hold the same tokens. From a prefix group: block ``j`` with
    ``(j + 1) * block_size <= prefix_len`` is ``("group", G, j)``; from a trace's
    hash list (one hash per ``hash_block_size`` tokens, as the Mooncake traces'
    ``hash_ids`` per 512 tokens): block ``j`` is ``("hash", hashes[m], o)`` with
    ``m, o`` the hash block holding it and its place there, when the hash list
    covers it. Other blocks are ``None``: unique to the request.
    """
    out: list = []
    for j in range(prompt_len // block_size):
        end = (j + 1) * block_size
        if block_hashes is not None:
            m = (j * block_size) // hash_block_size
            out.append(("hash", int(block_hashes[m]), (j * block_size) % hash_block_size // block_size)
                       if m < len(block_hashes) else None)
        elif prefix_group >= 0 and end <= prefix_len:
            out.append(("group", prefix_group, j))
        else:
            out.append(None)
    return out


def simulate_reference(arrival_s, prompt_len, output_len, priority, engine: EngineConfig,
                       latency: LatencyModel, horizon_s: float | None = None, *,
                       sjf_key=None, prefix_group=None, prefix_len=None,
                       block_hashes=None, hash_block_size: int = 512, step_noise=None,
                       max_concurrency: int | None = None, think_time_s=None, sessions=None) -> dict:
    """Simulate one run of the engine model with a slow, literal reference.

    Implements ``docs/engine-model.md`` step by step in plain Python, to check
    the Numba kernel against. Use it on small streams (a few thousand
    requests).

    Parameters
    ----------
    arrival_s : array_like of float, shape (n,)
        Arrival times ``a_i`` in seconds, non-decreasing.
    prompt_len : array_like of int, shape (n,)
        Prompt lengths ``P_i >= 1``.
    output_len : array_like of int, shape (n,)
        Output lengths ``O_i >= 1``.
    priority : array_like of int, shape (n,)
        Priorities ``c_i`` (lower is more urgent; used by ``policy="priority"``).
    engine : EngineConfig
        The server.
    latency : LatencyModel
        Step-time model; ``latency.step_time(n_decode, n_prefill_tokens,
        n_context_tokens)`` gives each step's duration.
    horizon_s : float, optional
        Stop at the first step boundary ``t >= horizon_s``; arrivals at or
        after it do not happen. ``None`` runs until every request has left.
    sjf_key : array_like of int, shape (n,), optional
        The SJF keys ``q_i`` (``policy="sjf"`` orders by them: predicted
        output lengths). Default: ``output_len``.
    prefix_group, prefix_len : array_like of int, shape (n,), optional
        Prefix group ``G_i`` (-1: none) and the length ``L_i`` of the group's
        shared prefix at the start of the prompt (``0 <= L_i < P_i``, 0 when
        ``G_i = -1``); used with ``engine.enable_prefix_caching``. Both or
        neither. Default: no groups.
    block_hashes : sequence of int sequences, length n, optional
        With ``engine.block_hash_caching``: each request's prompt as hashes of
        consecutive ``hash_block_size``-token blocks (a trace's ``hash_ids``);
        requests with equal leading hashes share those blocks' KV. Replaces
        the prefix groups as the source of block identities.
    hash_block_size : int
        Tokens per hash of ``block_hashes`` (512 in the Mooncake traces); a
        multiple of ``engine.block_size``.
    step_noise : object with ``apply(d, k)``, optional
        Per-step noise: step k (from 0) lasts ``step_noise.apply(d, k)``
        instead of ``d`` (``fastsim._reference_noise.run_latency`` gives it,
        with the run's ``latency``). Default: deterministic steps.
    max_concurrency : int, optional
        Closed-loop load (spec, "Closed-loop load") with this many seats.
        With ``think_time_s``, a pure closed loop: requests ``0 ..
        max_concurrency - 1`` arrive at ``arrival_s`` (0), and the client of
        the ``j``-th departure from the system sends again ``think_time_s[j]``
        later (the later requests take those send times in order). Without
        it, a cap on the stream: ``arrival_s`` are the times the requests want
        to go, request ``k >= max_concurrency`` going no earlier than the
        ``(k - max_concurrency)``-th departure. Not with ``horizon_s``.
        Default: open loop.
    think_time_s : array_like of float, optional
        Pure closed loop: the think time after each departure (``n -
        max_concurrency`` values).
    sessions : dict, optional
        Multi-turn sessions (spec, "Sessions"): ``first`` (c, the sessions'
        first turns: requests ``0 .. c-1``, at ``arrival_s``, each its own
        session), ``users`` (bool: a session that ends starts a new one),
        ``think`` and ``turns`` (per request k: the think time before send k
        and the turns of a session send k starts). Requests ``k >= c`` are
        the sends made as turns leave (``arrival_s`` inf): send k takes
        ``prompt_len[k]`` new tokens, ``output_len[k]`` and ``priority[k]``.
        The results are per request in arrival order (``prompt_len``,
        ``output_len``, ``priority`` and ``session`` say what each sent);
        sends never made are ``NOT_ARRIVED``.

    Returns
    -------
    dict
        Per request (arrays of length ``n``):

        ``status`` : int8
            ``COMPLETED`` (0), ``REJECTED_TOO_LONG`` (1), ``REJECTED_ADMISSION``
            (2), ``DROPPED`` (3), ``UNFINISHED`` (4), or ``NOT_ARRIVED`` (-1)
            for rows with ``a_i >= horizon_s``.
        ``first_token_s`` : float64
            Absolute time of the first token, nan if none.
        ``finish_s`` : float64
            Completion time, or for a dropped request the step boundary where
            the drop was observed; nan otherwise.
        ``num_preemptions`` : int64
        ``num_tokens`` : int64
            Output tokens generated.
        ``itl_max_s`` : float64
            Largest gap between consecutive tokens, nan with fewer than 2.
        ``itl_gaps_s`` : list of float64 arrays
            Every gap between consecutive tokens of each request.
        ``ingested_s`` : float64
            When the request was ingested (its arrival, or the end of the
            step during which it arrived); nan if it never arrived.
        ``num_swaps`` : int64
            Preemptions by swap (counted in ``num_preemptions`` too).
        ``swapped_s`` : float64
            Total time in the swapped queue (to the stop for a request still
            swapped then).
        ``cached_tokens`` : int64
            Prefix-cache hit tokens at its first admission (0 if none or never
            admitted).
        ``prefix_queried`` : bool
            Whether it belongs to a prefix group, caching is on, and it was
            admitted at least once (the requests ``prefix_hit_rate`` covers).
        ``batches`` : list of tuples
            Per step: its start and, per scheduled request in scheduling
            order, ``(index, tokens, tokens computed before)``.
        ``step_log`` : float64 array, shape (num_steps, 8)
            Per step: start, end, running, waiting (swapped included),
            allocated blocks, swapped requests, swap blocks used, evictable
            cached blocks.

        ``arrival_s`` : float64
            When each request arrived (a closed loop's: when it was sent).

        Run-level scalars:

        ``end_s`` : float
            The clock when the run stopped: the end of the last step, or (when
            the run ends idle after rejecting the last arrivals) the instant of
            the last idle jump; with a horizon, the stopping boundary.
            0.0 if nothing arrived.
        ``num_steps`` : int
            Steps with nonzero duration.
        ``max_blocks_used`` : int
            Largest number of KV blocks allocated during a step.
        ``blocks_used_at_end`` : int
        ``total_preemptions`` : int
        ``total_priority_preemptions`` : int
            Preemptions by phase 0 (active priority preemption).
        ``total_swaps`` : int
        ``swap_blocks_transferred`` : int
            Blocks moved to and from swap space (what the step times charge).
        ``max_swap_blocks_used``, ``swap_blocks_used_at_end`` : int
        ``max_blocks_resident`` : int
            Largest allocated + evictable cached blocks during a step.
        ``cached_blocks_at_end``, ``evictable_blocks_at_end`` : int
            Prefix-cache entries (all, and those no request references).
        ``prefix_hit_tokens``, ``prefix_query_tokens`` : int
            Sums of ``cached_tokens`` and of prompt lengths over the requests
            with ``prefix_queried``.
        ``prefix_hit_rate`` : float
            Their ratio (nan if no request queried the cache).

    Raises
    ------
    ValueError
        If the inputs have different lengths, are not 1-d, or arrivals
        decrease.
    RuntimeError
        If a static batch can never finish (see the SPEC-QUESTION in
        ``schedule_static``).
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    p = np.asarray(prompt_len, dtype=np.int64)
    o = np.asarray(output_len, dtype=np.int64)
    c = np.asarray(priority, dtype=np.int64)
    if a.ndim != 1 or not (a.shape == p.shape == o.shape == c.shape):
        raise ValueError(f"arrival_s, prompt_len, output_len and priority must be 1-d of equal "
                         f"length, got shapes {a.shape}, {p.shape}, {o.shape}, {c.shape}")
    if np.any(np.diff(a) < 0):
        raise ValueError("arrival_s must be non-decreasing")
    if np.any(p < 1) or np.any(o < 1):
        raise ValueError("prompt_len and output_len must be >= 1")
    if horizon_s is not None:
        horizon_s = float(horizon_s)
    n = a.size
    q = o.copy() if sjf_key is None else _int_array("sjf_key", sjf_key, n)
    if (prefix_group is None) != (prefix_len is None):
        raise ValueError("prefix_group and prefix_len must be given together (or neither)")
    if prefix_group is None:
        grp, plen = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    else:
        grp = _int_array("prefix_group", prefix_group, n)
        plen = _int_array("prefix_len", prefix_len, n)
        if np.any(grp < -1):
            raise ValueError(f"prefix_group must be >= -1 (-1: no group), got {int(grp.min())}")
        if np.any(plen < 0) or np.any(plen >= p):
            i = int(np.flatnonzero((plen < 0) | (plen >= p))[0])
            raise ValueError(f"prefix_len must satisfy 0 <= prefix_len < prompt_len, got "
                             f"prefix_len={int(plen[i])} with prompt_len={int(p[i])} (request {i})")
        if np.any((grp == -1) & (plen != 0)):
            i = int(np.flatnonzero((grp == -1) & (plen != 0))[0])
            raise ValueError(f"prefix_len must be 0 for a request without a prefix group, got "
                             f"prefix_len={int(plen[i])} with prefix_group=-1 (request {i})")

    requests = [_Request(idx=i, arrival=float(a[i]), P=int(p[i]), O=int(o[i]), prio=int(c[i]),
                         sjf_key=int(q[i]), group=int(grp[i]), prefix_len=int(plen[i]),
                         qkey=queue_key(engine.policy, i, float(a[i]), int(c[i]), int(q[i]),
                                        engine.priority_aging_s))
                for i in range(n)]
    if block_hashes is not None:
        if len(block_hashes) != n:
            raise ValueError(f"block_hashes must have one hash list per request ({n}), got {len(block_hashes)}")
        if hash_block_size < engine.block_size or hash_block_size % engine.block_size:
            raise ValueError(f"hash_block_size must be a multiple of engine.block_size ({engine.block_size}), "
                             f"got {hash_block_size}")
    if engine.enable_prefix_caching and engine.block_hash_caching:
        for r in requests:
            r.idents = prompt_block_identities(
                r.idx, r.P, engine.block_size, r.group, r.prefix_len,
                None if block_hashes is None else block_hashes[r.idx], hash_block_size)
    if think_time_s is not None:
        think_time_s = [float(x) for x in np.asarray(think_time_s, dtype=np.float64)]
        if max_concurrency is None or len(think_time_s) != max(n - max_concurrency, 0):
            raise ValueError(f"think_time_s must hold one think time per departure that frees a seat "
                             f"(n - max_concurrency values) and needs max_concurrency, got {len(think_time_s)} "
                             f"values with n={n}, max_concurrency={max_concurrency!r}")
    if max_concurrency is not None:
        if horizon_s is not None:
            raise ValueError(f"horizon_s must be None with max_concurrency (closed-loop load), got {horizon_s!r}")
        if engine.priority_aging_s is not None:
            raise ValueError("engine.priority_aging_s must be None with max_concurrency (closed-loop load), "
                             f"got {engine.priority_aging_s!r}")
    sim = _Reference(requests, engine, latency, horizon_s, step_noise, max_concurrency, think_time_s)
    if sessions is not None:
        c_first = int(sessions["first"])
        turns = [int(x) for x in sessions["turns"]]
        for r in requests[:c_first]:
            r.group, r.prefix_len, r.turns_left = r.idx, r.P + r.O, turns[r.idx] - 1
            if sim.hashing:
                r.idents = [("group", r.idx, j) for j in range((r.P + r.O) // engine.block_size)]
        sim.arrivals = requests   # (turns are made as earlier ones leave: `session_sends`)
        sim.sessions = dict(users=bool(sessions["users"]), think=[float(x) for x in sessions["think"]],
                            turns=turns, new=[r.P for r in requests], out=[r.O for r in requests],
                            prio=[r.prio for r in requests], made=c_first, scan=0)
    end_s = sim.run()

    assert all(r.status != _IN_SYSTEM for r in requests)
    queried = [(r.group >= 0 or (block_hashes is not None and sim.hashing)) and engine.enable_prefix_caching
               and r.ever_scheduled for r in requests]
    hit_tokens = sum(r.cached_tokens for r, qd in zip(requests, queried) if qd)
    query_tokens = sum(r.P for r, qd in zip(requests, queried) if qd)
    sent = {} if sessions is None else {   # (what each turn sent: known only as it was sent)
        "prompt_len": np.array([r.P for r in requests], dtype=np.int64),
        "output_len": np.array([r.O for r in requests], dtype=np.int64),
        "priority": np.array([r.prio for r in requests], dtype=np.int64),
        "session": np.array([r.group for r in requests], dtype=np.int64)}
    return {
        **sent,
        "status": np.array([r.status for r in requests], dtype=np.int8),
        "arrival_s": np.array([r.arrival for r in requests], dtype=np.float64),
        "first_token_s": np.array([r.first_token for r in requests], dtype=np.float64),
        "finish_s": np.array([r.finish for r in requests], dtype=np.float64),
        "num_preemptions": np.array([r.num_preemptions for r in requests], dtype=np.int64),
        "num_tokens": np.array([r.g for r in requests], dtype=np.int64),
        "itl_max_s": np.array([r.itl_max for r in requests], dtype=np.float64),
        "itl_gaps_s": [np.array(r.gaps, dtype=np.float64) for r in requests],
        "ingested_s": np.array([r.ingested for r in requests], dtype=np.float64),
        "num_swaps": np.array([r.num_swaps for r in requests], dtype=np.int64),
        "swapped_s": np.array([r.swapped_s for r in requests], dtype=np.float64),
        "cached_tokens": np.array([r.cached_tokens for r in requests], dtype=np.int64),
        "prefix_queried": np.array(queried, dtype=bool),
        "step_log": np.array(sim.step_log, dtype=np.float64).reshape(-1, 8),
        "batches": sim.batches,
        "end_s": float(end_s),
        "num_steps": int(sim.num_steps),
        "max_blocks_used": int(sim.max_blocks_used),
        "blocks_used_at_end": int(sim.blocks_used),
        "total_preemptions": int(sum(r.num_preemptions for r in requests)),
        "total_priority_preemptions": int(sim.priority_preemptions),
        "total_swaps": int(sum(r.num_swaps for r in requests)),
        "swap_blocks_transferred": int(sim.total_swap_transfers),
        "max_swap_blocks_used": int(sim.max_swap_used),
        "swap_blocks_used_at_end": int(sim.swap_used),
        "max_blocks_resident": int(sim.max_blocks_resident),
        "cached_blocks_at_end": len(sim.cache),
        "evictable_blocks_at_end": len(sim.evictable),
        "prefix_hit_tokens": int(hit_tokens),
        "prefix_query_tokens": int(query_tokens),
        "prefix_hit_rate": hit_tokens / query_tokens if query_tokens else math.nan,
    }


__all__ = ["simulate_reference", "COMPLETED", "REJECTED_TOO_LONG", "REJECTED_ADMISSION",
           "DROPPED", "UNFINISHED", "NOT_ARRIVED"]
