"""A slow, plain-Python reference simulator of ``docs/engine-model.md``.

This module exists to check the fast Numba kernel (``fastsim/_kernel.py``)
against an independent, deliberately simple implementation of the same
specification. It shares no simulation code with the kernel: it uses only the
configuration (:class:`EngineConfig`) and the latency model
(:class:`LatencyModel`).

It is written for clarity, not speed: one object per request, plain lists for
the running batch and the waiting queue, one iteration of the main loop per
engine step. Comments quote the rules of ``docs/engine-model.md`` ("spec")
that each piece of code implements. Where the spec is ambiguous, the most
literal reading is implemented and the choice is marked ``SPEC-QUESTION:``.
"""

from __future__ import annotations

import math
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
    k: int = 0        # tokens computed (held in the KV cache)
    g: int = 0        # output tokens generated (emitted)
    blocks: int = 0   # KV blocks currently allocated to it
    reserved_tokens: int = 0   # admission="kv_reservation" reservation held
    ever_scheduled: bool = False
    num_preemptions: int = 0
    status: int = NOT_ARRIVED
    first_token: float = math.nan
    finish: float = math.nan
    last_token: float = math.nan
    itl_max: float = math.nan
    ingested: float = math.nan   # when it was ingested (>= arrival)

    def __post_init__(self):
        self.gaps: list[float] = []  # inter-token gaps, in order

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
    """The waiting queue, kept in policy order (head = element 0).

    Spec, "Waiting-queue order":
    * fcfs: arrival order; a preempted request goes to the *front*;
    * priority: ascending c_i, ties by arrival index;
    * sjf: ascending O_i, ties by arrival index;
    for priority and sjf a preempted request re-enters with its own key.
    """

    def __init__(self, policy: str):
        self.policy = policy
        self.items: list[_Request] = []

    def _key(self, r: _Request):
        if self.policy == "priority":
            return (r.prio, r.idx)
        return (r.O, r.idx)  # sjf

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


class _Reference:
    """The state of one run and the operations of the spec on it."""

    def __init__(self, requests: list[_Request], engine: EngineConfig, latency: LatencyModel,
                 horizon_s: float | None):
        self.e = engine
        self.latency = latency
        self.horizon = horizon_s
        self.requests = requests
        # Spec, "Horizon": "only arrivals with a_i < H exist".
        self.arrivals = [r for r in requests if horizon_s is None or r.arrival < horizon_s]
        self.next_arrival = 0                 # index into self.arrivals
        self.t = 0.0                          # the clock (start of the current step)
        self.running: list[_Request] = []     # in admission order
        self.waiting = _WaitingQueue(engine.policy)
        self.blocks_used = 0
        self.reserved_tokens = 0              # sum of kv_reservation reservations held
        self.num_steps = 0
        self.max_blocks_used = 0
        # (t, t + d, running, waiting, blocks used) of every step with a duration
        self.step_log: list[tuple[float, float, int, int, int]] = []

    # ------------------------------------------------------------------ blocks
    def blocks_for(self, tokens: int) -> int:
        """Spec, "KV cache": a request with k + s tokens holds ceil((k + s) / block_size) blocks."""
        return -(-tokens // self.e.block_size)

    def free_blocks(self) -> int:
        return self.e.num_gpu_blocks - self.blocks_used

    def allocate_to(self, r: _Request, total_tokens: int) -> None:
        """Grow r's allocation to cover total_tokens tokens (caller checked it fits)."""
        new = self.blocks_for(total_tokens) - r.blocks
        assert 0 <= new <= self.free_blocks()
        r.blocks += new
        self.blocks_used += new

    def free_all_blocks(self, r: _Request) -> None:
        self.blocks_used -= r.blocks
        r.blocks = 0

    # -------------------------------------------------------- arrivals & exits
    def ingest_until(self, time: float, inclusive: bool) -> None:
        """Ingest, in index order, the arrivals with a_i < time (or <= time)."""
        while self.next_arrival < len(self.arrivals):
            r = self.arrivals[self.next_arrival]
            if r.arrival < time or (inclusive and r.arrival == time):
                r.ingested = time
                self.ingest(r)
                self.next_arrival += 1
            else:
                break

    def ingest(self, r: _Request) -> None:
        """Spec, "Arrival handling and admission control": on ingestion, in this order."""
        e = self.e
        # 1. Never-fits rejection (reason too_long).
        too_long = ((e.max_model_len is not None and r.P + r.O > e.max_model_len)
                    or self.blocks_for(r.P + r.O - 1) > e.num_gpu_blocks
                    or (not e.enable_chunked_prefill and r.P + r.O - 1 > e.max_num_batched_tokens))
        if too_long:
            r.status = REJECTED_TOO_LONG
            return
        # 2. Admission control (reason admission).
        if e.admission == "queue_limit":
            # "reject if running + waiting >= max_num_seqs + max_waiting at that instant"
            if len(self.running) + len(self.waiting) >= e.max_num_seqs + e.max_waiting:
                r.status = REJECTED_ADMISSION
                return
        elif e.admission == "kv_reservation":
            # "each admitted request reserves P_i + O_i tokens of the KV capacity
            # num_gpu_blocks * block_size from ingestion until it leaves; reject if
            # the reservation would not fit beside the reservations held."
            # SPEC-QUESTION: the reservation is P + O tokens although a request never
            # holds more than P + O - 1 (rule 1 uses P + O - 1), so a request with
            # P + O - 1 == capacity passes rule 1 but is always rejected here.
            need = r.P + r.O
            if self.reserved_tokens + need > e.num_gpu_blocks * e.block_size:
                r.status = REJECTED_ADMISSION
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
        """Spec, step 1: fcfs and sjf preempt the last of the running list;
        priority preempts the running request with the largest (c, arrival index)."""
        if self.e.policy == "priority":
            return max(self.running, key=lambda r: (r.prio, r.idx))
        return self.running[-1]

    def schedule_continuous(self) -> dict:
        """One step of the continuous-batching scheduler. Returns {request: s}."""
        e = self.e
        B = e.max_num_batched_tokens
        scheduled: dict[_Request, int] = {}   # insertion-ordered
        preempted_this_step = False

        # 1. Running requests, in the order they were admitted.
        i = 0
        while i < len(self.running) and B > 0:          # "Stop when B = 0."
            r = self.running[i]
            s = min(r.P + r.g - r.k, B)
            r_was_victim = False
            # "Allocate the blocks for k_r + s tokens. If there are not enough free
            # blocks, preempt a victim and retry until the allocation fits or r
            # itself was the victim."
            while self.blocks_for(r.k + s) - r.blocks > self.free_blocks():
                v = self.victim()
                v_index = self.running.index(v)
                self.preempt(v)
                preempted_this_step = True
                if v in scheduled:
                    # "If the victim had already been scheduled earlier in this step,
                    # its tokens are returned to the budget."
                    B += scheduled.pop(v)
                if v is r:
                    r_was_victim = True
                    break
                if v_index < i:
                    i -= 1        # the list shifted under the cursor
            if r_was_victim:
                break             # "If r was the victim, stop scheduling running requests."
            # "Otherwise schedule s tokens for r, B -= s."
            self.allocate_to(r, r.k + s)
            scheduled[r] = s
            B -= s
            i += 1

        # 2. Waiting requests, only if nothing was preempted in this step.
        if not preempted_this_step:
            while len(self.waiting) > 0 and B > 0 and len(self.running) < e.max_num_seqs:
                w = self.waiting.head()
                assert w.k == 0 and w.blocks == 0
                need = w.P + w.g
                if e.enable_chunked_prefill:
                    s = min(need, B)
                else:
                    s = need
                    if need > B:
                        break     # "if need > B stop admitting in this step"
                if self.blocks_for(s) > self.free_blocks():
                    break         # "if ceil(s / block_size) blocks are not free, stop admitting"
                # "otherwise admit w (append to running), allocate, schedule s, B -= s."
                self.waiting.pop_head()
                self.running.append(w)
                w.ever_scheduled = True
                self.allocate_to(w, s)
                scheduled[w] = s
                B -= s
        return scheduled

    def preempt(self, v: _Request) -> None:
        """Spec: "Preemption is by recompute: the victim frees all its blocks, k := 0
        (its generated tokens g are kept ...), and it returns to the waiting queue
        (front for fcfs)"."""
        self.running.remove(v)
        self.free_all_blocks(v)
        v.k = 0
        v.num_preemptions += 1
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
    def run(self) -> float:
        e = self.e
        static = e.scheduler == "static"
        while True:
            # ---- step start at time t (all arrivals with a_i <= t are ingested)
            self.abandon()
            if not self.running and len(self.waiting) == 0:
                # "when the engine is idle (nothing running or waiting), time jumps to
                # the next arrival and the step starts at that instant"
                if self.next_arrival >= len(self.arrivals):
                    # Drained (or no more arrivals before the horizon). SPEC-QUESTION:
                    # the spec does not say when such a run "ends"; end_s is the
                    # clock: the last step's end, or the instant of a later idle
                    # jump whose arrivals were all rejected; with a horizon that the
                    # run drains before, it is not H but that same clock.
                    break
                self.t = self.arrivals[self.next_arrival].arrival
                self.ingest_until(self.t, inclusive=True)
                continue          # a new step start (ingestion, then abandonment)

            scheduled = self.schedule_static() if static else self.schedule_continuous()
            if not scheduled:
                # "If nothing is scheduled the step has no duration and the loop continues"
                continue

            # ---- step duration (spec, "Step duration (latency model)")
            n_decode = 0
            n_prefill_tokens = 0
            n_context_tokens = 0
            for r, s in scheduled.items():
                # decoding: "one token, g >= 1, k = P + g - 1". Literal reading: the
                # last 1-token chunk of a recompute (g >= 1) also counts as decoding,
                # the last 1-token chunk of a first prefill (g = 0) does not.
                if s == 1 and r.g >= 1 and r.k == r.P + r.g - 1:
                    n_decode += 1
                else:
                    n_prefill_tokens += s
                n_context_tokens += r.k + s
            d = float(self.latency.step_time(n_decode, n_prefill_tokens, n_context_tokens))
            self.num_steps += 1
            self.max_blocks_used = max(self.max_blocks_used, self.blocks_used)
            t_end = self.t + d
            self.step_log.append((self.t, t_end, len(self.running), len(self.waiting), self.blocks_used))

            # ---- at t + d: arrivals with a_i < t + d are ingested before the
            # step's completions are applied ...
            self.ingest_until(t_end, inclusive=False)
            # ... then the step is applied: "every scheduled request adds s to k,
            # emits a token if k = P + g, and completes if g = O".
            for r, s in scheduled.items():
                if static and r.g == r.O:
                    continue      # padding: no KV growth, no token
                r.k += s
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
            # ... and a request arriving exactly at t + d is ingested after them.
            self.ingest_until(t_end, inclusive=True)
            self.t = t_end

            # "Horizon: the run stops at the first step boundary t >= H"
            if self.horizon is not None and self.t >= self.horizon:
                break
        # Requests still running or waiting are unfinished.
        for r in self.running:
            r.status = UNFINISHED
        for r in self.waiting:
            r.status = UNFINISHED
        return self.t


def simulate_reference(arrival_s, prompt_len, output_len, priority, engine: EngineConfig,
                       latency: LatencyModel, horizon_s: float | None = None) -> dict:
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
        ``step_log`` : float64 array, shape (num_steps, 5)
            Per step: start, end, running, waiting, allocated blocks.

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

    requests = [_Request(idx=i, arrival=float(a[i]), P=int(p[i]), O=int(o[i]), prio=int(c[i]))
                for i in range(a.size)]
    sim = _Reference(requests, engine, latency, horizon_s)
    end_s = sim.run()

    assert all(r.status != _IN_SYSTEM for r in requests)
    return {
        "status": np.array([r.status for r in requests], dtype=np.int8),
        "first_token_s": np.array([r.first_token for r in requests], dtype=np.float64),
        "finish_s": np.array([r.finish for r in requests], dtype=np.float64),
        "num_preemptions": np.array([r.num_preemptions for r in requests], dtype=np.int64),
        "num_tokens": np.array([r.g for r in requests], dtype=np.int64),
        "itl_max_s": np.array([r.itl_max for r in requests], dtype=np.float64),
        "itl_gaps_s": [np.array(r.gaps, dtype=np.float64) for r in requests],
        "ingested_s": np.array([r.ingested for r in requests], dtype=np.float64),
        "step_log": np.array(sim.step_log, dtype=np.float64).reshape(-1, 5),
        "end_s": float(end_s),
        "num_steps": int(sim.num_steps),
        "max_blocks_used": int(sim.max_blocks_used),
        "blocks_used_at_end": int(sim.blocks_used),
        "total_preemptions": int(sum(r.num_preemptions for r in requests)),
    }


__all__ = ["simulate_reference", "COMPLETED", "REJECTED_TOO_LONG", "REJECTED_ADMISSION",
           "DROPPED", "UNFINISHED", "NOT_ARRIVED"]
