"""A fleet: replicas of the engine behind a router, in compiled code.

The fleet's requests are one stream (`workload._draw_workload`, at the
fleet's rate). For each arrival, in order, the router reads the replicas'
state (`router`): each replica is advanced to the arrival's time (a paused
replica, `replica._simulate` with ``STEP_ADVANCE``; only those whose state
can change by then are called, taken from an event queue of due times,
`_look_due`; power of two choices looks at the two replicas it draws
only; a router that reads requests in the system only leaves a replica
paused until a request can leave it, `_departs`, and a replica handed a
request while paused before a stretch is keyed by that stretch's end,
pushed by what the request adds to it, `_keep_end`), or, with a stale view
(``fleet[FL_STALENESS]`` > 0), the state every replica had at the router's
last scrape, the scrapes at multiples of that period; the request is then
handed (`replica._hand`) to the replica chosen, arriving there after the
routing latency. Random and round-robin routing read no state, so no
replica is advanced for them until the end. After the last arrival every
replica runs to its end. Semantics: ``docs/engine-model.md``, "Fleets".

Replica ``r`` lives in row ``r`` of 2-D workspaces (`FleetBuffers`), each
row the workspace of a replica able to hold ``m`` requests of the stream
(its capacity, ``rs_a.shape[1]``: every request, ``m`` = ``n``, whose
pages a replica never reaches are never touched; or a compact row,
`compact_capacity`, which a request may overfill, `ROW_FULL`); its first
``size[r]`` entries, exactly `workspace._ws_need_compact` for its
parameters (the replicas of a mixed fleet differ). Its parameter records are row ``r`` of
``rip``, ``rfp`` and ``rlat``: its engine's and latency model's (a uniform
fleet's are all the same), with its warm-up count, which is its requests
handed before the fleet's first measured request (unknown until then: the
whole capacity, so that none is measured).
"""

from __future__ import annotations

import functools
from collections import namedtuple

import numba
import numpy as np

from .._numba_options import function_pointer, njit_noalloc
from .arrivals import _arrival_status
from .drivers import _array_key, _run_records
from .kv_cache import _blocks_of, _log2_exact
from .layout import (A_BLOCKS_END, A_END, A_HIT_TOK, A_KV_INT, A_L_INT, A_MAX_BLOCKS, A_MAX_SWAP, A_N_ITL, A_OCC_INT,
                     A_QUERY_TOK, A_QUEUE_INT, A_STEPS, A_WINDOW_START, FL_LATENCY, FL_LOAD_CAP, FL_SCORERS,
                     F_HORIZON, FL_STALENESS, I_ASYNC, I_BLOCK_SIZE, I_CACHING, I_CHUNKED, I_HAS_DELAY, I_HAS_HORIZON,
                     I_BLOCK_HASH, I_MAX_BATCHED_TOKENS, I_MAX_CONCURRENCY, I_MAX_NUM_SEQS, I_NUM_GPU_BLOCKS, I_POLICY,
                     I_PRIO_PREEMPT, I_SESSIONS, I_STATIC, I_SWAP, I_WARMUP, L_BASE, L_CTX, L_DECODE_SCALE, L_KEY_HI,
                     L_KEY_LO, L_NOISE, L_PREFILL, L_ROOF, L_SWAP, LOAD_IN_SYSTEM, LOAD_KV, LOAD_RUNNING, LOAD_WAITING,
                     N_ACC, N_COLUMNS, N_HIST, N_IPAR, POLICY_FCFS, ROUTER_POWER_OF_TWO, ROUTER_PREFIX_AFFINITY,
                     ROUTER_WEIGHTED, ST_REJECTED_ADMISSION, ST_REJECTED_TOO_LONG, ST_RUNNING, ST_UNFINISHED,
                     ST_WAITING, _COL)
from .latency import _constant_in_step, _noise_key
from .metrics import _reduce
from .replica import (MODE_FAST_STEP, MODE_SLOW_STEP, STEP_ADVANCE, STEP_EMPTY, STEP_FINISH, STEP_INIT,
                      STEP_NO_STRETCH, MODE_STRETCH, _hand, _simulate, _state_dims_compact)
from .rng import _mix64, _seed_streams
from .scheduler import _first_chunk
from .workload import _draw_workload
from .trace_blocks import (TMAP_ROWS, hashing_block_size, localise as _localise, reset as _tmap_reset,
                           route_prefix as _route_prefix)
from .router import (_in_system_only, _live_state, _needs_state, _reads_kv, _route, _route_weighted, _shorter,
                     _two_choices)
from .workspace import (N_RF, N_RI, RF_CLOCK, RF_STEP_END, RF_STRETCH_END, RI_DIM_CAP, RI_DIM_NBP, RI_DIM_NBT,
                        RI_DIM_NCNT, RI_DIM_NHELD, RI_DIM_NITL, RI_FAST_STEPS, RI_FREE, RI_MODE, RI_N_HELD,
                        RI_N_KNOWN, RI_N_OTHERS, RI_N_RUN, RI_N_SWAPPED, RI_N_WAIT, RI_NEXT_ARRIVAL, RI_RESERVED,
                        RI_RUN_LEN, WF_DEC_COST, WF_FINISH, WF_FIRST, WF_HEAD, WI_G, WI_HEAD, WI_HEAP_KEY,
                        WI_HEAP_SIZE, WI_K, WI_NPRE, WI_NSWAP, WI_OTHERS, WI_RUN, WI_STATUS, _float_sizes, _fleet_sizes,
                        _int_sizes)

#: A fleet's buffers (`fleet_buffers`): per replica (row ``r``) its
#: parameter record, stream (arrival; prompt, output, priority, SJF key,
#: prefix group, prefix length as ``rs_i[0..5, r]``) and workspace; per
#: request of the fleet its replica and its index there; the router's view
#: (`layout.LOAD_*`), its prefix-group table and random stream state; the
#: replicas' due times (``due[r]``: the first time at which advancing
#: replica ``r`` can change it, `_due`) and their event queue (``ev``: a
#: binary min-heap of replicas by due time in ``ev[0..N-1]``, each
#: replica's place in it in ``ev[N..2N-1]``, kept only above `SCAN_MAX`
#: replicas (at most that many, `_look_due` scans ``due`` and lists a look's
#: due replicas in ``ev[0..N-1]``), the replicas handed a request
#: since the router's last look in ``ev[2N..3N-1]`` with their count in
#: ``ev[4N]`` and a flag each in ``ev[3N..4N-1]``); each replica's float and
#: latency records (``rfp``, ``rlat``, as ``rip``) and its workspace's
#: entries (``size[r]``: int, float; its rows may be wider, `_rows`).
#: Appended: for the routers that read requests in the system only
#: (`router._in_system_only`), each replica's departure bound (``dep[r]``:
#: no request leaves it before then, `_departs`; an empty ``dep`` turns
#: the bound off; ``dep[N + r]`` and ``dep[2N + r]``, where ``dep`` is 3N
#: long, its kept stretch end and its plan's, `_keep_end`) and where its running lists start in its row
#: (``seg[r, SEG_*]``, `_segments`; ``SEG_DEC_COST`` in its float row);
#: each replica's measured output tokens handed (``tok[r]``: bounded by
#: its gap samples' room, `workspace._compact_dims`). A replica's capacity
#: is its stream's length, ``rs_a.shape[1]``: the fleet's whole stream, or
#: fewer (a compact row, `compact_capacity`). Last, where a replayed trace's
#: block identities key prefix caching by block hash, the map of each
#: replica's first holder of a block (``tmap``, `trace_blocks.TMAP_ROWS`
#: rows); otherwise ``tmap`` has no columns.
FleetBuffers = namedtuple("FleetBuffers", ("rip", "rs_a", "rs_i", "wi", "wf", "owner", "local", "load",
                                           "table", "rstate", "due", "ev", "rfp", "rlat", "size", "dep", "seg",
                                           "tok", "tmap"))

#: `_simulate_fleet_rows`' code for a trace map (``FleetBuffers.tmap``) too small for the stream
#: (`trace_blocks.reset`): the compiled driver stops before the replication, the Python layer sizes it.
TMAP_SMALL = -10

#: `_simulate_fleet_rows`' code for a request that would overfill its
#: replica's compact row (`compact_capacity`): the caller runs the
#: replication again on rows for the whole stream (the same bits). (Not
#: `replica._simulate`'s codes: a workspace of the wrong size is an error.)
ROW_FULL = -9

# The segments of a replica's workspace `_departs` reads (``fb.seg[r, SEG_*]``: their offsets in its row);
# and whether it may keep a stretch end across a hand (``fb.seg[r, SEG_KEEPS]``: `_keeps` of its records,
# stated when the event queue is keyed, `_queue_key`, so that a hand does not read them again).
SEG_RUN, SEG_HEAP_KEY, SEG_HEAP_SIZE, SEG_OTHERS, SEG_DEC_COST, SEG_KEEPS = range(6)
N_SEG = 6


@njit_noalloc(inline="llvm")
def _rows(fb, r):
    """Replica ``r``'s workspace: its rows' first ``size[r]`` entries."""
    return fb.wi[r][:fb.size[r, 0]], fb.wf[r][:fb.size[r, 1]]


@njit_noalloc(inline="llvm")
def _call(fb, r, n, fpar, lat, full, t, what):
    """`_simulate` on replica ``r``. (Inlined: a call would pass every array
    of ``fb`` as seven words, at every call of the engine.)"""
    ri = fb.rs_i
    wi, wf = _rows(fb, r)
    return _simulate(n, fb.rs_a[r], ri[0, r], ri[1, r], ri[2, r], ri[3, r], ri[4, r], ri[5, r], fb.rip[r], fpar,
                     lat, wi, wf, full, t, what)


@njit_noalloc
def _advance(fb, r, n, fpar, lat, full, t, what):
    """Advance replica ``r`` to ``t`` (``what``: `_simulate`'s); a call that could change nothing (a
    step in flight beyond ``t``, or nothing known left to do: `_due`) is skipped."""
    if t < _due(fb, r, what):
        return 0
    return _call(fb, r, n, fpar, lat, full, t, what)


@njit_noalloc(inline="llvm")
def _ri(fb, r, k):
    """Replica ``r``'s integer scalar ``k`` (`workspace.RI_*`: the last
    ``N_RI`` entries of its workspace), read in place."""
    return fb.wi[r, fb.size[r, 0] - N_RI + k]


@njit_noalloc(inline="llvm")
def _rf(fb, r, k):
    """Replica ``r``'s float scalar ``k`` (`workspace.RF_*`), read in place."""
    return fb.wf[r, fb.size[r, 1] - N_RF + k]


@njit_noalloc(inline="llvm")
def _observe(fb, r, nblk, t=np.inf):
    """Replica ``r``'s state at ``t`` into the router's view: requests in the
    system (handed and not yet gone), waiting (queued, swapped, or handed and
    not yet taken in), running, KV blocks not free. (Async scheduling: a
    replica paused before a stretch it did not take, at a step end before
    ``t``, holds the requests that finished there until the stretch's first
    step is scheduled; by ``t`` they have left, `pipeline`.)"""
    waiting = _ri(fb, r, RI_N_WAIT) + _ri(fb, r, RI_N_SWAPPED) + _ri(fb, r, RI_N_KNOWN) - _ri(fb, r, RI_NEXT_ARRIVAL)
    # (a product, not a branch: the mode of the replica looked at is not predictable)
    held = (_ri(fb, r, RI_MODE) == MODE_STRETCH) & (_rf(fb, r, RF_CLOCK) < t)
    running = _ri(fb, r, RI_N_RUN) - held * _ri(fb, r, RI_N_HELD)
    fb.load[r, LOAD_WAITING] = waiting
    fb.load[r, LOAD_RUNNING] = running
    fb.load[r, LOAD_IN_SYSTEM] = waiting + running
    fb.load[r, LOAD_KV] = nblk - _ri(fb, r, RI_FREE)


@njit_noalloc
def _look(fb, nrep, n, full, t, nblk, what, bound=False):
    """Every replica advanced to ``t`` (each on its rows of records,
    ``fb.rfp``, ``fb.rlat``) and observed; returns the first negative code
    of `_simulate`, else 0. ``bound``: for a router that reads requests in
    the system only (`router._in_system_only`), a replica from which no
    request can have left by ``t`` (`_departs`) is observed as it stands
    (its rows of ``fb.seg`` set up, `_segments`)."""
    for r in range(nrep):
        lat = fb.rlat[r]
        if not bound or t >= _departs(fb, r, n, _min_step(lat), lat):
            rc = _advance(fb, r, n, fb.rfp[r], lat, full, t, what)
            if rc < 0:
                return rc
        _observe(fb, r, nblk, t)
    return 0


# The event queue: a router that reads the replicas' state advances only the
# replicas whose state can change by the time it looks (due at or before
# it), and observes only those and the replicas handed a request since its
# last look; the others' rows of its view are as they were. `_due` is the
# rule by which `_advance` skips a call, as a time, so each look advances
# exactly the replicas `_look` would.

@njit_noalloc(inline="llvm")
def _due(fb, r, what, t=np.inf):
    """The first time at which advancing replica ``r`` (`_advance`, with
    ``what``) can change it: never (``inf``) while it has nothing known
    left to do; the end of its step in flight; the end of the stretch it
    waits at, or the lower bound of it the plan gave (planned again, and not
    taken, before then); else any time (``-inf``)."""
    if (_ri(fb, r, RI_N_RUN) + _ri(fb, r, RI_N_WAIT) + _ri(fb, r, RI_N_SWAPPED) == 0
            and _ri(fb, r, RI_NEXT_ARRIVAL) >= _ri(fb, r, RI_N_KNOWN)):
        return np.inf
    mode = _ri(fb, r, RI_MODE)
    if mode == MODE_FAST_STEP or mode == MODE_SLOW_STEP:
        return _rf(fb, r, RF_STEP_END)
    if mode == MODE_STRETCH and what & STEP_NO_STRETCH == 0:
        if _ri(fb, r, RI_N_HELD) > 0 and _rf(fb, r, RF_CLOCK) >= t:
            return -np.inf   # (async, observed at its clock ``t``: its view changes right after, `_observe`)
        return _rf(fb, r, RF_STRETCH_END)
    return -np.inf


# The departure bound: a router that reads only each replica's requests in
# the system (`router._in_system_only`: JSQ, least outstanding, prefix and
# session affinity) sees a replica change only when a request leaves it (a
# completion, a rejection at ingestion) or is handed to it. A request with
# m tokens still to emit leaves after m more steps that emit one each, and
# no step is shorter than `_min_step` (a request handed and not yet taken
# in also has its prompt's prefill term to run first, `_after_prefill`: a
# disaggregated prefill pool's requests emit one token); so until the
# earliest such time (`_departs`) advancing the replica cannot change what
# the router reads, and it is left paused (a replica advanced later, in
# fewer calls, gives the same bits). Where the rule cannot say
# (abandonment, closed loops, static batches, async scheduling's finished
# requests held, a rejection that admission control may still make), the
# bound is -inf: the event queue's due time alone decides, as for the other
# routers.

@njit_noalloc(inline="llvm")
def _min_step(lat):
    """A lower bound of every step's duration under the latency record
    ``lat`` (`latency._step_time`: the base plus terms that are not
    negative, or 0.0 where the record allows a shorter step: per-step
    noise, a negative coefficient). A change of the step-time model must
    keep this a lower bound (tests/test_fleet_speed.py checks it)."""
    if lat[L_NOISE] != 0.0:
        return 0.0
    if lat[L_DECODE_SCALE] < 0.0 or lat[L_PREFILL] < 0.0 or lat[L_CTX] < 0.0 or lat[L_SWAP] < 0.0:
        return 0.0
    return max(lat[L_BASE], 0.0)


@njit_noalloc(inline="llvm")
def _after(c, m, dmin):
    """No earlier than ``m`` steps of at least ``dmin`` after ``c`` (>= 0),
    as the engine's clock sums them in floating point: each sum rounds down
    by at most a unit roundoff of itself, so the bound is shrunk by
    ``m + 8`` of them (and the bound's own arithmetic)."""
    if m <= 0 or dmin <= 0.0:
        return c
    return (c + m * dmin) * (1.0 - (m + 8) * 2.3e-16)


@njit_noalloc(inline="llvm")
def _after_prefill(a, m, dmin, pre):
    """No earlier than the departure of a request arriving at ``a`` that
    emits ``m`` >= 1 tokens, with ``pre`` the prefill term of the prompt
    tokens it still has to compute (``prefill_per_token_s`` times them):
    its first token ends the step that computes its last prompt token, and
    the steps that compute its prompt last at least the base plus their
    prefill terms (`latency._step_time` of the regression model, its terms
    not negative: ``dmin`` > 0, `_min_step`), each chunk's own in its
    step; then ``m - 1`` more steps of at least ``dmin``. The sums are
    shrunk as `_after`'s (the step's own three roundings inside the margin).
    A prompt computed in several chunks takes one clock addition more per
    chunk than the margin counts; each such step adds at least ``dmin``,
    which covers its rounding while ``dmin`` exceeds about 1e-16 of the
    clock (a base of 1e-12 s would need a clock beyond 1e4 s)."""
    if m <= 0 or dmin <= 0.0:
        return a
    return (a + m * dmin + pre) * (1.0 - (m + 16) * 2.3e-16)


@njit_noalloc
def _segments(fb, r, n):
    """Where replica ``r``'s running list, completion heap and other
    running requests start in its row of ``fb.wi`` (the layout of
    `workspace._int_sizes` for its dimensions, set up), and its decode
    term by batch size in its row of ``fb.wf``: ``fb.seg[r]``."""
    w = fb.wi[r]
    b = fb.size[r, 0] - N_RI
    si = _int_sizes(n, fb.rip[r, I_BLOCK_SIZE], w[b + RI_DIM_CAP], w[b + RI_DIM_NCNT], w[b + RI_DIM_NHELD],
                    w[b + RI_DIM_NITL], w[b + RI_DIM_NBP], w[b + RI_DIM_NBT])
    o = 0
    k = 0
    for x in si:
        if k == WI_RUN:
            fb.seg[r, SEG_RUN] = o
        elif k == WI_HEAP_KEY:
            fb.seg[r, SEG_HEAP_KEY] = o
        elif k == WI_HEAP_SIZE:
            fb.seg[r, SEG_HEAP_SIZE] = o
        elif k == WI_OTHERS:
            fb.seg[r, SEG_OTHERS] = o
        o += x
        k += 1
    o = 0
    k = 0
    for x in _float_sizes(n, w[b + RI_DIM_CAP], w[b + RI_DIM_NITL]):
        if k == WF_DEC_COST:
            fb.seg[r, SEG_DEC_COST] = o
        o += x
        k += 1


@njit_noalloc(inline="llvm")
def _departs_parts(fb, r, n, dmin, lat):
    """The earliest times at which a request can leave replica ``r`` (paused,
    with the requests handed to it so far): of those it has taken in, and of
    those handed and not yet taken in; ``inf`` if there are none, both
    ``-inf`` where the rule cannot say (see above). Each request counts
    from where its next token-emitting step can end: the step in flight's
    end (its requests may emit there), else the replica's clock; a request
    handed and not yet taken in from its arrival, if admission cannot
    reject it (its bound in the system and KV reserved are at most what
    they are now plus the requests handed before it), its prompt's prefill
    counted (`_after_prefill`). ``dmin``: the replica's shortest step
    (`_min_step`) under its latency record ``lat``."""
    ipar = fb.rip[r]
    if (ipar[I_HAS_DELAY] == 1 or ipar[I_MAX_CONCURRENCY] > 0 or ipar[I_SESSIONS] != 0 or ipar[I_STATIC] == 1
            or _ri(fb, r, RI_N_HELD) > 0):
        return -np.inf, -np.inf
    w = fb.wi[r]
    b = fb.size[r, 0] - N_RI
    mode = w[b + RI_MODE]
    flight = mode == MODE_FAST_STEP or mode == MODE_SLOW_STEP
    c = _rf(fb, r, RF_STEP_END) if flight else _rf(fb, r, RF_CLOCK)
    k = -1 if flight else 0   # (in flight: its end is the first step's)
    n_run, n_wait, n_sw = w[b + RI_N_RUN], w[b + RI_N_WAIT], w[b + RI_N_SWAPPED]
    d = np.inf
    if n_wait + n_sw > 0:   # (queued or swapped: a token each step at best)
        d = _after(c, 1 + k, dmin)
    seg = fb.seg[r]
    if w[seg[SEG_HEAP_SIZE]] > 0:   # the lazy decoders: the first to complete (`decoders`)
        d = min(d, _after(c, w[seg[SEG_HEAP_KEY]] - w[b + RI_FAST_STEPS] + k, dmin))
    out = fb.rs_i[1, r]
    if mode == MODE_SLOW_STEP:   # (its batch: the running list; else the lazy decoders and the others)
        lst, m = seg[SEG_RUN], w[b + RI_RUN_LEN]
    else:
        lst, m = seg[SEG_OTHERS], w[b + RI_N_OTHERS]
    for j in range(m):
        q = w[lst + j]
        if w[WI_STATUS * n + q] == ST_RUNNING:
            d = min(d, _after(c, out[q] - w[WI_G * n + q] + k, dmin))
    arr, prompt = fb.rs_a[r], fb.rs_i[0, r]
    in_sys = n_run + n_wait + n_sw
    reserved = w[b + RI_RESERVED]
    # a handed request's prompt still to compute (``WI_K``: its KV computed, 0, or a disaggregated decode
    # replica's prompt less one) is prefilled before its first token, each chunk's term in its step: where the
    # step time is the regression model's (no roofline) and no token is a cache hit (no prefix caching)
    pf = lat[L_PREFILL] if lat[L_ROOF] == 0.0 and ipar[I_CACHING] == 0 else 0.0
    h = np.inf
    for i in range(w[b + RI_NEXT_ARRIVAL], w[b + RI_N_KNOWN]):
        if _arrival_status(prompt[i], out[i], ipar, in_sys, reserved) != ST_WAITING:
            return -np.inf, -np.inf
        in_sys += 1
        reserved += prompt[i] + out[i]
        h = min(h, _after_prefill(arr[i], out[i], dmin, pf * (prompt[i] - w[WI_K * n + i])))
    return d, h


@njit_noalloc(inline="llvm")
def _departs(fb, r, n, dmin, lat):
    """The earliest time at which a request can leave replica ``r``
    (`_departs_parts`, the earlier of the two)."""
    d, h = _departs_parts(fb, r, n, dmin, lat)
    return min(d, h)


# The kept stretch end: a replica paused before a stretch of decode steps
# (`replica._stretches`) is keyed by that stretch's end E, exact, until a
# request is handed to it (`replica._hand` drops E: the stretch may now end
# at the arrival); from then on the departure bound alone (every step the
# record's base) keyed it, and came early. `_keep_end` states when E, or E
# pushed by the handed request's own prefill, stays a lower bound of the
# next departure of the requests the replica has taken in.

@njit_noalloc(inline="llvm")
def _keeps(ipar, lat):
    """Whether a replica of these records may keep a stretch end across a
    hand (`_keep_end`): synchronous scheduling, no prefix caching, no
    priority preemption, no horizon; a deterministic regression step time
    without a context term, its prefill term not negative (`_departs_parts`
    rules out the rest: abandonment, closed loops, static batches)."""
    return (ipar[I_ASYNC] == 0 and ipar[I_CACHING] == 0 and ipar[I_PRIO_PREEMPT] == 0 and ipar[I_HAS_HORIZON] == 0
            and lat[L_ROOF] == 0.0 and _constant_in_step(lat) and lat[L_PREFILL] >= 0.0)


@njit_noalloc(inline="llvm")
def _keep_end(fb, r, nrep, n, ta, p, o):
    """A lower bound of the next departure of the requests replica ``r``
    has taken in, once a request of prompt ``p`` and output ``o``,
    arriving at ``ta``, is handed to it (called before `replica._hand`),
    ``-inf`` where none is known; and the planned stretch end E while
    every hand since the plan was pushed (below), else ``-inf``.
    ``fb.dep[nrep + r]`` and ``fb.dep[2 nrep + r]`` hold the two of an
    earlier hand since the replica's last call.

    Paused before a stretch (its start c, the clock; its end E; b lazy
    decoders, no other running request; kmax steps to the first decoder's
    completion, which ends the stretch or comes after its end), the
    stretch's k <= kmax steps each last dp = base + decode term(b): E is the
    running sum c + dp + ... + dp. Every request handed since (in
    ``[next arrival, known)`` and this one) is counted by its whole length:
    if their blocks, ceil((p + o) / block_size) each, and the decoders' new
    blocks over kmax steps (at most b * (kmax // block_size + 1)) fit in the
    free blocks, no request is preempted before the first decoder
    completes. Then every step until then holds the b decoders and possibly
    handed requests, no fewer, and lasts at least dp (the decode term not
    smaller at larger batches, checked on the table; the prefill term not
    negative); the first k steps, summed by the same floating-point
    additions, so end no earlier than E, and no request taken in leaves
    before: the decoders complete at step kmax >= k, a waiting request
    (seats full) runs first. The rule is the same for the end kept at an
    earlier hand (the replica not called since: the same c, E, b, kmax and
    free blocks), with the request handed now counted too.

    The push: the first request handed since the plan (none waiting, a seat
    free, first come first served) joins the first step that starts at or
    after ``ta`` (step J); if J < k (``ta`` before the last step's start,
    E - dp, with a margin for E's rounding), that step schedules the
    decoders and then it, with s = its first chunk of the budget left
    (`scheduler._first_chunk`) tokens: its blocks fit (above), so it lasts
    fl(dp + prefill * s) (`latency._step_time`, the same additions) and the
    k steps' real sum is at least E's plus prefill * s. Requests handed
    later queue behind it and only lengthen steps. The two sums differ from
    their real values by at most k unit roundoffs of the total each, so
    the bound is E + prefill * s shrunk by (2 kmax + 16) of 2.3e-16 of
    itself. If s is its whole prompt, it decodes in the steps after J
    (b + 1 decoders: each at least dp1 = base + decode term(b + 1)) until
    it leaves; the steps J + 1 .. k - 1 are at least floor((E - ta) / dp) - 3
    (step j starts at c + j dp, up to the sums' rounding), so the bound
    grows by that many (dp1 - dp). If it leaves before, it is the next to
    leave (the decoders complete at step kmax >= k), and its own bound,
    with the handed ones' (`_departs_parts`), keys the replica: the key
    is the earlier of the two.

    A later hand (the replica not called since, each hand since the plan
    pushed, so every request handed before it is admitted at its own join
    step) is pushed by its own prefill alone: first come first served, it
    queues behind those, which take at most their prompts of a step's
    budget; with a seat for it even if all of them are still in, it joins
    the first step at or after ``ta`` with at least its first chunk of the
    budget less their prompts, and that step, if it starts before the
    plan's last step (``ta`` before E - dp), is longer by at least its
    prefill term (in one step with others, the prefill terms add). The kept
    end is dropped when the replica is next called.

    E may be a lower bound of the plan's end, not the end itself: the plan
    stops summing once its clock passes the call's ``t_stop``
    (`stretch._end_bound`). Each use above stays a bound with it: the push
    adds to E, and a smaller E makes ``ta`` before E - dp rarer and counts
    fewer steps after J."""
    ipar = fb.rip[r]
    lat = fb.rlat[r]
    if fb.seg[r, SEG_KEEPS] == 0:   # (`_keeps`, stated by `_queue_key`)
        return -np.inf, -np.inf
    w = fb.wi[r]
    b = fb.size[r, 0] - N_RI
    if w[b + RI_MODE] != MODE_STRETCH or w[b + RI_N_OTHERS] != 0 or w[b + RI_N_SWAPPED] != 0:
        return -np.inf, -np.inf
    e = _rf(fb, r, RF_STRETCH_END)
    eo = e
    fresh = e > -np.inf   # (planned at the last call, nothing handed since; else the end kept then)
    if not fresh:
        e, eo = fb.dep[nrep + r], fb.dep[2 * nrep + r]
        if not e > -np.inf:
            return -np.inf, -np.inf
    seg = fb.seg[r]
    if w[seg[SEG_HEAP_SIZE]] <= 0:
        return -np.inf, -np.inf
    bs = ipar[I_BLOCK_SIZE]
    bsh = _log2_exact(bs)   # (blocks by a shift: a division per handed request was a noticeable share of a hand)
    nd = w[b + RI_N_RUN]
    kmax = w[seg[SEG_HEAP_KEY]] - w[b + RI_FAST_STEPS]
    need = nd * _blocks_of(kmax + 1, bs, bsh) + _blocks_of(p + o, bs, bsh)   # (kmax // bs + 1 blocks a decoder)
    prompt, out = fb.rs_i[0, r], fb.rs_i[1, r]
    nxt, known = w[b + RI_NEXT_ARRIVAL], w[b + RI_N_KNOWN]
    ahead = 0   # (the prompts handed before it: at most what they take of a step's budget)
    for i in range(nxt, known):
        need += _blocks_of(prompt[i] + out[i], bs, bsh)
        ahead += prompt[i]
    if need > w[b + RI_FREE]:
        return -np.inf, -np.inf
    dc = seg[SEG_DEC_COST]
    cap = w[b + RI_DIM_CAP]
    top = min(nd + known - nxt + 1, ipar[I_MAX_NUM_SEQS], cap)
    wf = fb.wf[r]
    for j in range(nd + 1, top + 1):
        if wf[dc + j] < wf[dc + nd]:
            return -np.inf, -np.inf
    # the push: the plan's end ``eo`` (-inf: a hand since it was not pushed, or nothing may be pushed)
    if fresh and (nxt < known or w[b + RI_N_WAIT] > 0):
        return e, -np.inf
    budget = ipar[I_MAX_BATCHED_TOKENS] - nd - ahead
    if (not eo > -np.inf or nd + known - nxt >= ipar[I_MAX_NUM_SEQS] or ipar[I_POLICY] != POLICY_FCFS
            or budget <= 0):
        return e, -np.inf
    s = _first_chunk(p, budget, ipar[I_CHUNKED] == 1)
    dp = lat[L_BASE] + wf[dc + nd]
    if s <= 0 or not ta < (eo - dp) - eo * 1e-15:
        return e, -np.inf
    x = e + lat[L_PREFILL] * s
    if fresh and s == p and nd + 1 <= top:
        # it decodes in the steps after J: at least floor((E - ta) / dp) - 3 of them before the k-th ends
        m = np.int64((eo - ta) / dp) - 3
        if m > 0:
            x += m * (((lat[L_BASE] + wf[dc + nd + 1]) - dp) * (1.0 - 1e-12))
    return x - x * ((2 * kmax + 16) * 2.3e-16), eo


@njit_noalloc(inline="llvm")
def _due_for(fb, r, nrep, n, what, t, bound):
    """The replica's key in the event queue: `_due`, or with the departure
    bound (``bound``) the later of it and the departure bound, in which the
    requests taken in count from the end kept at a hand (`_keep_end`,
    where ``fb.dep`` is 3N long) if that is later.

    The kept end bounds the requests taken in only together with the handed
    requests' own bound (the ``min`` below): with a handed request's decode
    term in it, that request may leave first. Use ``fb.dep[nrep + r]`` only
    so, and only until the replica's next call (`_advance_due` drops it;
    `_queue_key` after an autoscaler's evaluation, which calls them all)."""
    d = _due(fb, r, what, t)
    if bound:
        lat = fb.rlat[r]
        taken, handed = _departs_parts(fb, r, n, _min_step(lat), lat)
        if fb.dep.size >= 3 * nrep:
            taken = max(taken, fb.dep[nrep + r])
        fb.dep[r] = min(taken, handed)
        return max(d, fb.dep[r])
    return d


#: Fleets of at most this many replicas find their due replicas by a scan of
#: ``fb.due`` that lists them without a branch (`_look_due`), not by the heap
#: (whose compares, once an arrival, cannot be predicted): the same
#: replicas, advanced in another order, which changes nothing (each
#: replica's advance reads and writes its own rows alone). Larger fleets
#: keep the heap.
SCAN_MAX = 64


@njit_noalloc(inline="llvm")
def _sift_up(due, ev, nrep, k):
    """Move the replica at heap place ``k`` up to its place (by due time)."""
    r = ev[k]
    while k > 0:
        p = (k - 1) >> 1
        q = ev[p]
        if due[q] <= due[r]:
            break
        ev[k] = q
        ev[nrep + q] = k
        k = p
    ev[k] = r
    ev[nrep + r] = k


@njit_noalloc(inline="llvm")
def _sift_down(due, ev, nrep, k, size):
    """Move the replica at heap place ``k`` down to its place in a heap of ``size``."""
    r = ev[k]
    while True:
        c = 2 * k + 1
        if c >= size:
            break
        if c + 1 < size and due[ev[c + 1]] < due[ev[c]]:
            c += 1
        q = ev[c]
        if due[r] <= due[q]:
            break
        ev[k] = q
        ev[nrep + q] = k
        k = c
    ev[k] = r
    ev[nrep + r] = k


@njit_noalloc
def _queue_init(fb, nrep, n, what, bound):
    """Every replica (just set up) observed, due, and in the event queue;
    none handed a request. ``bound``: with the departure bound (`_departs`)."""
    for r in range(nrep):
        _observe(fb, r, fb.rip[r, I_NUM_GPU_BLOCKS])
        if bound:
            _segments(fb, r, n)
    _queue_key(fb, nrep, n, what, np.inf, bound)


@njit_noalloc
def _queue_key(fb, nrep, n, what, t, bound):
    """The event queue keyed afresh, each replica as it stands (its
    segments set up where ``bound``), observed at ``t`` or, with ``t`` inf,
    just set up: its due time (`_due_for`), none marked handed since, no
    stretch end kept (and, where one may be, whether its records allow
    one, ``fb.seg[r, SEG_KEEPS]``); the heap built only above `SCAN_MAX`
    replicas.
    (`_queue_init`; an autoscaled fleet after an evaluation's look, which
    advances every replica it holds.)"""
    ev = fb.ev
    for r in range(nrep):
        if bound and fb.dep.size >= 3 * nrep:
            fb.dep[nrep + r] = -np.inf
            fb.seg[r, SEG_KEEPS] = _keeps(fb.rip[r], fb.rlat[r])
        fb.due[r] = _due_for(fb, r, nrep, n, what, t, bound)
        ev[3 * nrep + r] = 0
    if nrep > SCAN_MAX:   # (else no heap: `_look_due` scans)
        for k in range(nrep):
            ev[k] = k
            _sift_up(fb.due, ev, nrep, k)
    ev[4 * nrep] = 0


@njit_noalloc(inline="llvm")
def _queue_handed(fb, r, nrep, n, what, bound):
    """Replica ``r`` was handed a request: its due time again, and marked to
    be observed at the router's next look."""
    ev = fb.ev
    old = fb.due[r]
    fb.due[r] = _due_for(fb, r, nrep, n, what, np.inf, bound)
    if nrep > SCAN_MAX:   # (else no heap: `_look_due` scans)
        k = ev[nrep + r]
        if fb.due[r] < old:
            _sift_up(fb.due, ev, nrep, k)
        elif fb.due[r] > old:
            _sift_down(fb.due, ev, nrep, k, nrep)
    if ev[3 * nrep + r] == 0:
        ev[3 * nrep + r] = 1
        ev[2 * nrep + ev[4 * nrep]] = r
        ev[4 * nrep] += 1


@njit_noalloc(inline="llvm")
def _advance_due(fb, r, nrep, n, full, t, what, bound):
    """Replica ``r``, due at ``t``, advanced to ``t`` (as `_advance` would
    call it), observed and keyed again; `_simulate`'s code. (Its flag of a
    hand since the last look is cleared by `_look_due`, which lists it.)"""
    rc = _call(fb, r, n, fb.rfp[r], fb.rlat[r], full, t, what)
    _observe(fb, r, fb.rip[r, I_NUM_GPU_BLOCKS], t)
    if bound and fb.dep.size >= 3 * nrep:
        fb.dep[nrep + r] = -np.inf   # (a kept end holds until the replica is called)
    fb.due[r] = _due_for(fb, r, nrep, n, what, t, bound)
    return rc


@njit_noalloc(inline="llvm")
def _look_due(fb, nrep, n, full, t, what, bound=False):
    """`_look` by the event queue, each replica on its own records: the
    replicas due at or before ``t`` advanced to ``t`` and observed, then
    those handed a request since the last look observed; returns the first
    negative code of `_simulate`, else 0. (Inlined, at one call site in
    each routing loop: a call, once a fleet arrival, would pass every array
    of ``fb`` as seven words.)"""
    ev, due = fb.ev, fb.due
    rc = 0
    if nrep <= SCAN_MAX:
        # the due replicas listed in ``ev[0..k-1]`` (the heap's place, unused here) without a branch a
        # replica (which one is due is not predictable), then advanced in the same order
        k = 0
        for r in range(nrep):
            ev[k] = r
            k += due[r] <= t
        for j in range(k):
            rc = _advance_due(fb, ev[j], nrep, n, full, t, what, bound)
            if rc < 0:
                break
    else:
        size = nrep
        while size > 0 and due[ev[0]] <= t:   # the due ones, taken out to the heap's tail
            size -= 1
            r = ev[0]
            ev[0] = ev[size]
            ev[nrep + ev[0]] = 0
            ev[size] = r
            ev[nrep + r] = size
            _sift_down(due, ev, nrep, 0, size)
        for k in range(size, nrep):
            r = ev[k]
            if rc >= 0:
                rc = _advance_due(fb, r, nrep, n, full, t, what, bound)
            _sift_up(due, ev, nrep, k)
    if rc < 0:
        return rc
    for k in range(ev[4 * nrep]):   # (one advanced above is observed again, as it was: no branch)
        r = ev[2 * nrep + k]
        _observe(fb, r, fb.rip[r, I_NUM_GPU_BLOCKS], t)
        ev[3 * nrep + r] = 0
    ev[4 * nrep] = 0
    return 0


@njit_noalloc
def _look_at(fb, r, n, full, t, what, bound=False):
    """Replica ``r`` advanced to ``t`` on its own records and observed;
    ``bound``: not advanced while no request can have left it (`_departs`)."""
    rc = 0
    if not bound or t >= _departs(fb, r, n, _min_step(fb.rlat[r]), fb.rlat[r]):
        rc = _advance(fb, r, n, fb.rfp[r], fb.rlat[r], full, t, what)
    _observe(fb, r, fb.rip[r, I_NUM_GPU_BLOCKS], t)
    return rc


@njit_noalloc(entry=True)
def _noise_keys(rlat, nrep, first):
    """Per-step noise: the step-noise key of replica ``first + r`` of the
    replication into row ``r`` of the latency records ``rlat`` (each row
    holding the replication's key, `drivers._run_records`): replica 0 keeps
    the replication's key (a fleet of one replica is the engine), replica
    k >= 1 takes SplitMix64's finaliser of ``key + k * 0xD1B54A32D192ED03``
    (docs/engine-model.md, "Fleets"), so the replicas' step noises are
    independent streams. A disaggregated server numbers its prefill
    replicas first, then its decode replicas; an autoscaled fleet its rows.
    Rows without per-step noise are left as they are."""
    for r in range(nrep):
        k = first + r
        if rlat[r, L_NOISE] == 0.0 or k == 0:
            continue
        key = _mix64(_noise_key(rlat[r]) + np.uint64(k) * np.uint64(0xD1B54A32D192ED03))
        rlat[r, L_KEY_HI] = float(key >> np.uint64(32))
        rlat[r, L_KEY_LO] = float(key & np.uint64(0xFFFFFFFF))


@njit_noalloc
def _own_records(fb, nrep, fpar, lat, first=0):
    """Rows ``0..nrep-1`` of ``fb.rfp`` and ``fb.rlat`` set to the float and
    latency records of identical replicas (`_look_due` and the departure
    bound read each replica's own), each with the step-noise key of replica
    ``first + r`` of the replication (`_noise_keys`)."""
    for r in range(nrep):
        for j in range(fpar.size):
            fb.rfp[r, j] = fpar[j]
        for j in range(lat.size):
            fb.rlat[r, j] = lat[j]
    _noise_keys(fb.rlat, nrep, first)


@njit_noalloc
def _set_up_uniform(n, stream, ipar, fpar, lat, nrep, fb, full, dims):
    """Rows ``0..nrep-1`` of ``fb`` set up as empty replicas of the records
    ``ipar``/``fpar``/``lat`` (identical replicas: one scan of the stream
    ``(arrival, prompt, output, prio, sjfk, pgrp, plen)`` states every row's
    layout), router's view and prefix-group table cleared; the warm-up count
    of each the whole capacity (unknown until the fleet's first measured
    request). Returns the first negative code of `_simulate`, else 0.
    (Autoscaled and disaggregated fleets set up so.) Each replica's
    capacity is ``fb.rs_a.shape[1]`` (compact rows: `compact_capacity`).
    ``dims``: the integer record the rows are laid out by (the workspace's
    size of it, ``fb.size``: ``ipar``, or a disaggregated decode pool's
    `disagg.dims_record`, stated by the caller)."""
    arrival, prompt, output, prio, sjfk, pgrp, plen = stream
    m = fb.rs_a.shape[1]
    if not _compact_ok(ipar, m, n):
        return ROW_FULL
    w0 = _rows(fb, 0)[0]
    _state_dims_compact(m, n, prompt, output, pgrp, plen, dims, w0)
    for r in range(nrep):
        for j in range(N_IPAR):
            fb.rip[r, j] = ipar[j]
        w, wf = _rows(fb, r)
        for j in range(RI_DIM_CAP, RI_DIM_NBT + 1):   # (the RI_DIM_* slots, in a row)
            w[w.size - N_RI + j] = w0[w0.size - N_RI + j]
        rc = _simulate(m, arrival, prompt, output, prio, sjfk, pgrp, plen, fb.rip[r], fpar, lat, w, wf, full, 0.0,
                       STEP_INIT | STEP_EMPTY)
        if rc < 0:
            return rc
        fb.rip[r, I_WARMUP] = m if ipar[I_WARMUP] > 0 else 0
        for c in range(fb.load.shape[1]):
            fb.load[r, c] = 0.0
        fb.tok[r] = 0
        if fb.seg.shape[0] >= nrep:
            _segments(fb, r, m)
    for g in range(fb.table.size):
        fb.table[g] = -1
    return 0


@njit_noalloc
def _set_up_rows(n, arrival, prompt, output, prio, sjfk, pgrp, plen, fb, nrep, full):
    """Rows ``0..nrep-1`` of ``fb`` set up as empty replicas of their own
    records (``fb.rip``, ``fb.rfp``, ``fb.rlat``; the warm-up count the whole
    capacity where the workload has one), bounded by the fleet's stream
    ``0..n-1`` (its layout: one scan for each run of replicas with the same
    integer record); the router's view and prefix-group table cleared.
    Returns `ROW_FULL` where a compact row cannot be set up, the first
    negative code of `_simulate`, else 0. (`_simulate_fleet_rows`; a
    closed loop's, `fleet_client`.)"""
    m = fb.rs_a.shape[1]
    warmup = fb.rip[0, I_WARMUP]
    for r in range(nrep):
        if not _compact_ok(fb.rip[r], m, n):
            return ROW_FULL
    # set up empty: the fleet's stream bounds what a replica may be handed (its layout: one scan
    # for each run of replicas with the same integer record)
    for r in range(nrep):
        w = _rows(fb, r)[0]
        same = r > 0
        for j in range(N_IPAR):
            same = same and fb.rip[r, j] == fb.rip[r - 1, j]
        if same:
            w0 = _rows(fb, r - 1)[0]
            for j in range(RI_DIM_CAP, RI_DIM_NBT + 1):   # (the RI_DIM_* slots, in a row)
                w[w.size - N_RI + j] = w0[w0.size - N_RI + j]
        else:
            _state_dims_compact(m, n, prompt, output, pgrp, plen, fb.rip[r], w)
    for r in range(nrep):
        wi, wf = _rows(fb, r)
        rc = _simulate(m, arrival, prompt, output, prio, sjfk, pgrp, plen, fb.rip[r], fb.rfp[r], fb.rlat[r], wi,
                       wf, full, 0.0, STEP_INIT | STEP_EMPTY)
        if rc < 0:
            return rc
        fb.rip[r, I_WARMUP] = m if warmup > 0 else 0
        for c in range(fb.load.shape[1]):
            fb.load[r, c] = 0.0
        fb.tok[r] = 0
    for g in range(fb.table.size):
        fb.table[g] = -1
    return 0


@njit_noalloc(entry=True)
def _simulate_fleet(n, arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, fleet, router, nrep,
                    key0, key1, rep, fb, full):
    """Run a fleet of ``nrep`` identical replicas behind the router
    ``router`` over the requests ``0..n-1`` of the fleet's stream, to the end.

    Parameters
    ----------
    n, arrival, prompt, output, prio, sjfk, pgrp, plen : int, 1-D arrays
        The fleet's requests (`workload._draw_workload`), sorted by arrival.
    ipar, fpar, lat : 1-D arrays
        The parameter records of every replica (`layout`).
    fleet : 1-D float array
        The fleet's record (`layout.FL_*`).
    router, nrep : int
        The routing policy (`layout.ROUTER_*`) and the number of replicas.
    key0, key1, rep : int
        The router's random stream: keyed as replication ``rep``'s workload.
    fb : FleetBuffers
        The replicas and the router's memory (`fleet_buffers`); each
        replica's workspace exactly `workspace._ws_need_handed` of the stream.
    full : None or int
        The compiled engine (`replica.engine_variant`).

    Returns
    -------
    int
        0, or the first negative code of `replica._simulate` or `_hand`.
    """
    for r in range(nrep):
        for j in range(N_IPAR):
            fb.rip[r, j] = ipar[j]
    _own_records(fb, nrep, fpar, lat)
    return _simulate_fleet_rows(n, arrival, prompt, output, prio, sjfk, pgrp, plen, fleet, router, nrep, key0, key1,
                                rep, fb, full)


@njit_noalloc(entry=True)
def _simulate_fleet_rows(n, arrival, prompt, output, prio, sjfk, pgrp, plen, fleet, router, nrep, key0, key1, rep,
                         fb, full):
    """`_simulate_fleet` with each replica's parameter records given in its
    rows of ``fb.rip``, ``fb.rfp``, ``fb.rlat`` (a mixed fleet: replicas
    of different engines and latency models; the warm-up count, the
    workload's, is the same in every row) and its workspace's size in
    ``fb.size[r]`` (`workspace._ws_need_compact` for its records, of its
    capacity ``m``, ``fb.rs_a.shape[1]``, and the stream: ``m`` = ``n``,
    `workspace._ws_need_handed`). ``full``: the engine every replica runs
    (the full one if any needs it). Returns `ROW_FULL` if a request would
    overfill a compact row (``m`` < ``n``)."""
    m = fb.rs_a.shape[1]
    warmup = fb.rip[0, I_WARMUP]
    rc = _set_up_rows(n, arrival, prompt, output, prio, sjfk, pgrp, plen, fb, nrep, full)
    if rc != 0:
        return rc
    # a replayed trace's block identities: each replica handed parents of its own (`trace_blocks`)
    bs0 = hashing_block_size(fb.rip, nrep)
    jg = _tmap_reset(n, prompt, bs0, fb.tmap)
    if jg < 0:
        return TMAP_SMALL
    traced = jg > 0
    _seed_streams(key0, key1, rep, fb.rstate)
    stale, lag, cap = fleet[FL_STALENESS], fleet[FL_LATENCY], fleet[FL_LOAD_CAP]
    reads = _needs_state(router) and nrep > 1
    # a router that reads the KV cache sees it at the arrival: no stretch across it
    what = STEP_ADVANCE | (STEP_NO_STRETCH if _reads_kv(router, fleet[FL_SCORERS:]) else 0)
    live = stale == 0.0 or _live_state(router)
    # power of two choices with a live view reads two replicas: only those are advanced and
    # observed (a replica advanced later, in fewer calls, gives the same bits; one handed a
    # request is paused before its arrival, as `_hand` asks)
    two = reads and live and router == ROUTER_POWER_OF_TWO
    reads = reads and not two
    # routers that read the requests in the system only: replicas left paused until a request can leave
    # (power of two choices compares the two drawn by that count)
    bound = (reads or two) and (two or _in_system_only(router)) and fb.dep.size >= nrep
    if two and bound:
        for r in range(nrep):
            _segments(fb, r, m)
    # the event queue's routers keep a stretch end across a hand (`_keep_end`) where ``dep`` is 3N long
    keep = reads and bound and fb.dep.size >= 3 * nrep
    kept, chain = -np.inf, -np.inf
    if reads:
        _queue_init(fb, nrep, m, what, bound)
    k_scrape = 0
    for i in range(n):
        t = arrival[i]
        if i == warmup and warmup > 0:
            for r in range(nrep):
                fb.rip[r, I_WARMUP] = _ri(fb, r, RI_N_KNOWN)
        if reads:
            rc = 0
            while rc == 0 and (live or k_scrape * stale <= t):   # live: at t; stale: every scrape up to t
                rc = _look_due(fb, nrep, m, full, t if live else k_scrape * stale, what, bound)
                if live:
                    break
                k_scrape += 1
            if rc < 0:
                return rc
        if two:
            a, b = _two_choices(fb.rstate, nrep)
            rc = _look_at(fb, a, m, full, t, what, bound)
            if rc >= 0:
                rc = _look_at(fb, b, m, full, t, what, bound)
            if rc < 0:
                return rc
            r = _shorter(fb.load, a, b)
        elif traced and router == ROUTER_PREFIX_AFFINITY:   # (the most leading blocks handed, `trace_blocks`)
            r = _route_prefix(i, fb.load, LOAD_IN_SYSTEM, cap, nrep, prompt, pgrp, plen, bs0, jg, fb.tmap)
        elif router == ROUTER_WEIGHTED:
            r = _route_weighted(i, fb.load, fb.table, fb.rstate, fleet[FL_SCORERS:], fb.rip, nrep, prompt, pgrp,
                                plen, bs0, jg, fb.tmap)
        else:   # (a trace's parents, pgrp -2 - parent, are no groups: session affinity routes by load)
            r = _route(router, i, pgrp[i], fb.load, fb.table, fb.rstate, cap, nrep)
        if m < n and not _fits(fb, r, i >= warmup, output[i]):
            return ROW_FULL
        if keep:
            kept, chain = _keep_end(fb, r, nrep, m, t + lag, prompt[i], output[i])
        ri = fb.rs_i
        wi, wf = _rows(fb, r)
        g, lp = pgrp[i], plen[i]
        if traced:
            g, lp = _localise(i, r, nrep, _ri(fb, r, RI_N_KNOWN), prompt, pgrp, plen, bs0, jg, fb.tmap)
        j = _hand(m, fb.rs_a[r], ri[0, r], ri[1, r], ri[2, r], ri[3, r], ri[4, r], ri[5, r], fb.rip[r], fb.rfp[r],
                  wi, wf, full, t + lag, prompt[i], output[i], prio[i], sjfk[i], g, lp)
        if j < 0:
            return j
        fb.owner[i] = r
        fb.local[i] = j
        if keep:
            fb.dep[nrep + r] = kept
            fb.dep[2 * nrep + r] = chain
            if fb.dep.size > 3 * nrep + i:   # (for tests: each hand's kept end, `simulate_fleet_stream`)
                fb.dep[3 * nrep + i] = kept
        if reads:
            _queue_handed(fb, r, nrep, m, what, bound)
    for r in range(nrep):
        rc = _call(fb, r, m, fb.rfp[r], fb.rlat[r], full, np.inf, STEP_ADVANCE | STEP_FINISH)
        if rc < 0:
            return rc
    return 0


@njit_noalloc(inline="llvm")
def _compact_ok(ipar, m, n):
    """Whether a replica of the integer record ``ipar`` may be set up on a
    row of capacity ``m`` for the ``n`` requests of the stream: a row for the
    whole stream always; a compact one (``m`` < ``n``) past the warm-up (its
    set-up reads the first measured arrival, ``arrival[warmup]``, as
    `replica._init_replica` does), without sessions and without caching by
    block hash (whose set-up reads the whole stream, `block_pool._pool_init`).
    `compact_capacity` picks capacities it takes; it is the kernel's guard."""
    if m >= n:
        return True
    return (ipar[I_WARMUP] < m and ipar[I_SESSIONS] == 0
            and not (ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1))


@njit_noalloc(inline="llvm")
def _fits(fb, r, measured, o):
    """Whether replica ``r``'s compact row takes one more request of
    ``o`` output tokens (``measured``: after the warm-up, its tokens
    counted in the gap samples' room, as `workspace._ws_dims` counts them);
    if so, its tokens are counted. (Its seats: `replica._hand`.)"""
    if _ri(fb, r, RI_N_KNOWN) >= fb.rs_a.shape[1]:
        return False
    if measured:
        x = fb.tok[r] + min(o, fb.rip[r, I_NUM_GPU_BLOCKS] * fb.rip[r, I_BLOCK_SIZE])
        if x > _ri(fb, r, RI_DIM_NITL):
            return False
        fb.tok[r] = x
    return True


C_WINDOW = _COL["window_s"]


@njit_noalloc(entry=True)
def _reduce_fleet(n, arrival, output, ipar, fpar, nrep, lag, fb, wm_i, wm_f, row, balance):
    """The fleet's metrics row (`metrics._reduce` over every request of the
    fleet, from its replicas' results gathered in the workspace ``wm_i``/
    ``wm_f`` of the stream) and its load balance (`layout.FLEET_COLUMNS`)
    into ``balance``. ``lag``: the routing latency, during which a request
    is in the fleet and in no replica. (A replica's rows are laid out for
    its capacity, ``fb.rs_a.shape[1]``.)"""
    cm = fb.rs_a.shape[1]
    swap = ipar[I_SWAP] == 1   # (a mixed fleet: if any replica swaps; the others' counts are 0)
    macc = wm_f[WF_HEAD * n:WF_HEAD * n + N_ACC]
    for j in range(N_ACC):
        macc[j] = 0.0
    o_wv = WF_HEAD * n + N_ACC
    o_ww = WI_HEAD * n + N_HIST
    o_rv = WF_HEAD * cm + N_ACC
    o_rw = WI_HEAD * cm + N_HIST
    m = 0
    for r in range(nrep):
        wi, wf = _rows(fb, r)
        acc = wf[WF_HEAD * cm:WF_HEAD * cm + N_ACC]
        for j in (A_OCC_INT, A_KV_INT):
            macc[j] += acc[j] / nrep   # (means over the replicas)
        for j in (A_QUEUE_INT, A_L_INT, A_STEPS, A_BLOCKS_END, A_HIT_TOK, A_QUERY_TOK):
            macc[j] += acc[j]          # (the fleet's totals)
        for j in (A_MAX_BLOCKS, A_MAX_SWAP, A_END):
            macc[j] = max(macc[j], acc[j])
        macc[A_WINDOW_START] = acc[A_WINDOW_START]
        k = np.int64(acc[A_N_ITL])
        for e in range(k):
            wm_i[o_ww + m + e] = wi[o_rw + e]
            wm_f[o_wv + m + e] = wf[o_rv + e]
        m += k
    macc[A_N_ITL] = m
    # The fleet's run ends at its last replica's stop, and not before the horizon where a request came to the
    # fleet before it and reached its replica after it (never taken in: its arrival there inf, `replica._hand`;
    # the replicas may all have stopped, idle, before it came)
    end = macc[A_END]
    for i in range(n):
        if fb.rs_a[fb.owner[i], fb.local[i]] == np.inf and arrival[i] < np.inf:
            end = max(end, fpar[F_HORIZON])
            break
    macc[A_END] = end
    for i in range(n):
        r, j = fb.owner[i], fb.local[i]
        wi, wf = _rows(fb, r)
        st = wi[WI_STATUS * cm + j]
        # Little's law over the fleet: a request is in the system from its arrival at the router (in transit
        # for the routing latency, unless its replica rejects it: a rejection is no sojourn) until it leaves,
        # or to the fleet's end where it is unfinished: one unfinished on a replica that stopped earlier
        # until then, one never taken in from its arrival
        if st == ST_UNFINISHED and fb.rs_a[r, j] == np.inf:
            macc[A_L_INT] += end - arrival[i]
        else:
            if lag > 0.0 and st != ST_REJECTED_TOO_LONG and st != ST_REJECTED_ADMISSION:
                macc[A_L_INT] += max(0.0, min(arrival[i] + lag, end) - arrival[i])
            if st == ST_UNFINISHED:
                macc[A_L_INT] += end - wf[WF_HEAD * cm + A_END]
        wm_i[WI_STATUS * n + i] = st
        wm_i[WI_NPRE * n + i] = wi[WI_NPRE * cm + j]
        if swap:
            wm_i[WI_NSWAP * n + i] = wi[WI_NSWAP * cm + j] if fb.rip[r, I_SWAP] == 1 else 0
        wm_f[WF_FIRST * n + i] = wf[WF_FIRST * cm + j]
        wm_f[WF_FINISH * n + i] = wf[WF_FINISH * cm + j]
    _reduce(n, arrival, output, ipar, fpar, wm_i, wm_f, row)
    _balance(n, nrep, fb, row[C_WINDOW], balance)


@njit_noalloc
def _balance(n, nrep, fb, window, balance):
    """Spread of the load across replicas: requests handed (coefficient of
    variation, largest over mean), and the largest minus the smallest
    replica's mean KV use and mean queue depth over the window."""
    s = 0.0
    s2 = 0.0
    mx = 0.0
    kv_lo, kv_hi, q_lo, q_hi = np.inf, -np.inf, np.inf, -np.inf
    for r in range(nrep):
        wi, wf = _rows(fb, r)
        c = float(wi[wi.size - N_RI + RI_N_KNOWN])
        s += c
        s2 += c * c
        mx = max(mx, c)
        acc = wf[WF_HEAD * fb.rs_a.shape[1]:WF_HEAD * fb.rs_a.shape[1] + N_ACC]
        kv, q = acc[A_KV_INT], acc[A_QUEUE_INT]
        kv_lo, kv_hi, q_lo, q_hi = min(kv_lo, kv), max(kv_hi, kv), min(q_lo, q), max(q_hi, q)
    mean = s / nrep
    balance[0] = np.sqrt(max(s2 / nrep - mean * mean, 0.0)) / mean if mean > 0 else np.nan
    balance[1] = mx / mean if mean > 0 else np.nan
    balance[2] = (kv_hi - kv_lo) / window if window > 0 else np.nan
    balance[3] = (q_hi - q_lo) / window if window > 0 else np.nan


@njit_noalloc(entry=True)
def _run_fleet_chunk(rep0, nrep, key0, key1, ipar, fpar, lat, arr_times, lcomp, lpar, ltab, lrange, trace,
                     prio_val, prio_cdf, pred_edges, fleet, router, kind, red_ipar, out, bal, state, arrival,
                     prompt, output, prio, sjfk, pgrp, plen, fpars, lats, scan, fb, wm_i, wm_f, full, draw,
                     simulate, reduce):
    """Replications ``rep0 .. rep0 + nrep - 1`` of a fleet of identical
    replicas, in compiled code, as the Python layer
    runs each (`_fleet._one`): its stream drawn, its records
    (`drivers._run_records`, every replica's the same), its sizes
    (`workspace._fleet_sizes`), the fleet (`_simulate_fleet_rows`) and its
    reduction (`_reduce_fleet`) into ``out[j]`` and ``bal[j]``; those
    three kernels called through function pointers (``draw``,
    ``simulate``, ``reduce``: `fleet_pointers`), as `drivers._run_chunk`
    calls the engine's (linked, the routing loop would be compiled again).
    The scenario's records (``ipar``, ``fpar``, ``lat``, ...) draw the
    stream; ``kind``, the replicas' (integer, float, latency) records,
    run them (a listed fleet of one kind may differ from the scenario's
    engine and latency: `_fleet.fleet_members`).

    ``fb``, ``wm_i``, ``wm_f``: the worker's buffers as a replication of
    ``fb.owner.size`` requests on rows of ``fb.rs_a.shape[1]`` seats left
    them (`_fleet._FleetWorker.buffers`). A replication they do not fit
    (another stream size, larger workspaces, a compact row overfilled:
    `ROW_FULL`) or that fails stops the chunk before it, for the
    Python layer to run it (it grows the buffers, or raises). Returns the
    number of replications done."""
    nf = fpars.shape[0]
    n_rows = fb.owner.size
    m = fb.rs_a.shape[1]
    lag = fleet[FL_LATENCY]
    k_ipar, k_fpar, k_lat = kind
    for j in range(nrep):
        rep = rep0 + j
        n = draw(rep, key0, key1, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange, trace, prio_val, prio_cdf,
                 pred_edges, state, arrival, prompt, output, prio, sjfk, pgrp, plen)
        if n != n_rows:
            return j
        _run_records(k_lat, k_fpar, key0, key1, rep, state, lats[0], fpars[0])
        a, p, o, c, q, g, pl = arrival[:n], prompt[:n], output[:n], prio[:n], sjfk[:n], pgrp[:n], plen[:n]
        _fleet_sizes(m, n, p, o, g, pl, k_ipar, scan)
        if scan[0] > fb.wi.shape[1] or scan[1] > fb.wf.shape[1] or scan[2] > wm_i.size or scan[3] > wm_f.size:
            return j
        for r in range(nf):   # (`cluster.fill_records`; loops: a slice's copy would allocate)
            for k in range(k_ipar.size):
                fb.rip[r, k] = k_ipar[k]
            fb.size[r, 0] = scan[0]
            fb.size[r, 1] = scan[1]
        _own_records(fb, nf, fpars[0], lats[0])   # (per-step noise: each replica a stream of its own)
        if simulate(n, a, p, o, c, q, g, pl, fleet, router, nf, key0, key1, rep, fb, full) != 0:
            return j
        reduce(n, a, o, red_ipar, fpars[0], nf, lag, fb, wm_i[:scan[2]], wm_f[:scan[3]], out[j], bal[j])
    return nrep


_FLEET_POINTERS = {}


def fleet_pointers(arrays, full, draw_args, simulate_args, reduce_args):
    """`workload._draw_workload`, `_simulate_fleet_rows` and
    `_reduce_fleet` as function pointers for `_run_fleet_chunk`,
    for the types of the arguments given (a replication's, as `_fleet._one`
    calls them; compiled or loaded on the first call for them). Looked up
    by the scenario's ``arrays`` (`scenario_arrays`, by `_array_key`) and
    ``full``: the other arguments are the fleet's buffers and scalars,
    whose types are fixed (C-contiguous arrays of fixed dtypes and
    dimensions, whatever their sizes: `tests/test_fleet_driver.py`), and
    their Numba types take a tenth of a millisecond to build."""
    key = (full is None,) + tuple(_array_key(a) for a in arrays)
    pointers = _FLEET_POINTERS.get(key)
    if pointers is None:
        calls = ((_draw_workload, draw_args), (_simulate_fleet_rows, simulate_args), (_reduce_fleet, reduce_args))
        pointers = _FLEET_POINTERS[key] = tuple(function_pointer(d, tuple(numba.typeof(a) for a in args))
                                                for d, args in calls)
    return pointers


def fleet_buffers(n, nrep, need_i, need_f, ngroups, capacity=None, trace_blocks=None):
    """The buffers of a fleet of ``nrep`` replicas over streams of at most
    ``n`` requests (workspaces of ``need_i``/``need_f`` entries each), with
    a router's table of ``ngroups`` entries (`table_size`); each replica holds ``capacity``
    requests at most (default ``n``). With ``trace_blocks`` (the full prompt
    blocks of the largest stream, `trace_blocks.need`), a replayed trace's
    block identities are mapped into each replica (``tmap``, `tmap_size`
    slots). ``np.empty``:
    the pages of replica rows a replica never reaches are never touched."""
    from .layout import N_FPAR, N_LAT, N_LOAD, N_STREAMS
    m = n if capacity is None else capacity
    size = np.empty((nrep, 2), np.int64)
    size[:, 0], size[:, 1] = need_i, need_f
    return FleetBuffers(np.empty((nrep, N_IPAR), np.int64), np.empty((nrep, m)), np.empty((6, nrep, m), np.int64),
                        np.empty((nrep, need_i), np.int64), np.empty((nrep, need_f)), np.empty(n, np.int64),
                        np.empty(n, np.int64), np.zeros((nrep, N_LOAD)),
                        np.empty(max(ngroups, 1), np.int64),
                        np.empty(N_STREAMS + 1, np.uint64), np.empty(nrep), np.empty(4 * nrep + 1, np.int64),
                        np.empty((nrep, N_FPAR)), np.empty((nrep, N_LAT)), size, np.empty(3 * nrep),
                        np.empty((nrep, N_SEG), np.int64), np.zeros(nrep, np.int64),
                        np.empty((TMAP_ROWS, 0 if trace_blocks is None else tmap_size(trace_blocks)), np.int64))


def stream_trace_blocks(prompt, pgrp, ipars):
    """For a trace map (`trace_blocks`): the full prompt blocks of a stream
    whose prefix groups carry a replayed trace's block identities (``-2 -
    parent``) served by replicas of the integer records ``ipars`` (one, or
    a row each) of which some cache by block hash; None where there is
    nothing to map."""
    ipars = np.atleast_2d(ipars)
    hashing = (ipars[:, I_CACHING] == 1) & (ipars[:, I_BLOCK_HASH] >= 1)
    if not hashing.any() or not (np.asarray(pgrp) <= -2).any():
        return None
    return int((np.asarray(prompt) // ipars[np.argmax(hashing), I_BLOCK_SIZE]).sum())


def tmap_size(blocks):
    """Slots of a trace map (`trace_blocks`) for streams of ``blocks`` full
    prompt blocks: the least power of two above twice as many."""
    return 1 << int(2 * blocks + 1).bit_length()


def compact_capacity(n, nrep, ipars):
    """The capacity of a fleet's compact replica rows (`workspace._compact_dims`)
    for a stream of ``n`` requests over ``nrep`` replicas of the integer
    records ``ipars`` (a row each, or one): twice an even share and 64 more,
    so that a router that spreads the load never fills one, and the rows lie
    dense (a row for the whole stream touches a page or more per segment:
    the processor's TLB misses, and `_fleet` puts compact rows on huge
    pages); past the warm-up, whose first measured arrival a replica reads
    when it is set up. ``n`` (rows for the whole stream) for one replica,
    and wherever the kernel's own rule refuses a compact row (`_compact_ok`:
    sessions, caching by block hash). A request that would overfill a
    compact row stops the run (`ROW_FULL`); it is run again on whole rows,
    the same bits."""
    ipars = np.atleast_2d(ipars)
    if nrep <= 1 or n <= 0:
        return n
    m = min(n, max(2 * (-(-n // nrep)) + 64, int(ipars[:, I_WARMUP].max()) + 1))
    ok = _python_compact_ok()
    return m if all(ok(row, m, n) for row in ipars) else n


def until_rows_fit(attempt):
    """``attempt(compact)``'s result (a tuple, the kernel's code first), on
    compact rows first (``compact`` True: as `compact_capacity` says), and
    again on rows for the whole stream (False) if a request overfilled a
    compact row (the code `ROW_FULL`): the same bits either way."""
    out = attempt(True)
    if out[0] == ROW_FULL:
        out = attempt(False)
    return out


@functools.lru_cache(maxsize=None)
def _python_compact_ok():
    from .._numba_options import python_version

    return python_version(_compact_ok)


# ------------------------------------------------------------------------------
# From Python

def _ngroups(pgrp):
    return int(pgrp.max()) + 1 if pgrp.size else 0


def table_size(ngroups, nrep, router):
    """Entries of the router's table (``FleetBuffers.table``) for ``ngroups``
    prefix groups: a group's replica each; the weighted router's, whether
    each replica has been routed the group (`router._route_weighted`)."""
    return ngroups * nrep if router == ROUTER_WEIGHTED else ngroups


def fleet_records(ipar, fpar, lat, nrep):
    """Each replica's records (``nrep`` rows each) from one replica's (1-D:
    a uniform fleet) or from a row per replica (2-D: a mixed fleet); the
    fleet's integer and float records for the reduction (row 0's, swap on
    if any replica swaps), and the engine every replica runs."""
    from .layout import I_SWAP
    from .replica import engine_variant
    ipars, fpars, lats = (np.array(np.broadcast_to(np.asarray(x), (nrep, np.asarray(x).shape[-1])))
                          for x in (ipar, fpar, lat))
    red_i = ipars[0].copy()
    red_i[I_SWAP] = ipars[:, I_SWAP].max()
    full = max((engine_variant(row) or 0) for row in ipars) or None
    return ipars, fpars, lats, red_i, fpars[0].copy(), full


def fill_records(fb, ipars, fpars, lats, sizes):
    """Each replica's records and workspace size into its rows of ``fb``."""
    nrep = ipars.shape[0]
    fb.rip[:nrep] = ipars
    fb.rfp[:nrep, :fpars.shape[1]] = fpars
    fb.rlat[:nrep, :lats.shape[1]] = lats
    fb.size[:nrep] = sizes


def simulate_fleet_stream(arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, fleet, router, nrep,
                          key0=0, key1=0, rep=0, bound=True, keep=True, kept=None, capacity=None, sent=None,
                          run=None):
    """Simulate a fleet over one given request stream (a Python entry, for
    tests and the reference's comparisons). A closed loop's records (seats,
    ``I_MAX_CONCURRENCY``) are run by `fleet_client.simulate_closed_fleet_stream`.

    Parameters
    ----------
    arrival, prompt, output, prio, sjfk, pgrp, plen : array_like
        The request stream, sorted by arrival: each request's arrival time
        (s), prompt and output lengths, priority class, SJF key, prefix
        group (-1: none; -2 - parent: a replayed trace's block identities,
        mapped into the replicas that cache by block hash, `trace_blocks`)
        and prefix length (as `workload._draw_workload` draws them).
    ipar, fpar, lat : array_like
        One replica's integer, float and latency records (`layout`; a uniform
        fleet), or a row per replica (a mixed fleet).
    fleet : array_like
        The fleet record (`layout.FL_*`: the router's staleness, routing
        latency, load cap).
    router : int
        The router's code (`layout.ROUTER_*`).
    nrep : int
        The number of replicas.
    key0, key1 : int
        The run's seed keys (the router's random stream).
    rep : int
        The replication's index (its streams are keyed by it).
    bound : bool
        False turns the departure bound off (`_departs`: the same bits, more
        calls; for tests).
    keep : bool
        False turns off the stretch end kept across hands (`_keep_end`).
    kept : ndarray, optional
        An array of the stream's size that receives each hand's kept end
        (``-inf``: none; for tests).
    capacity : int, optional
        Each replica's row capacity (1 .. the stream's size; default
        `compact_capacity`); a run that would overfill a row is run again
        on rows for the whole stream (the same bits; for tests).
    sent : ndarray, optional
        An array of the stream's size that receives each request's arrival
        (a closed loop's send time; else its arrival as given).
    run : callable, optional
        ``run(args, n, nrep)`` runs the fleet kernel on `_simulate_fleet_rows`'
        arguments ``args`` instead of it (`fleet_client`'s closed loop).

    Returns
    -------
    tuple
        Per-request results (as `drivers.simulate_stream`'s, by the fleet's
        request index), then the replica of each request, the metrics row
        and the load-balance row (`layout.FLEET_COLUMNS`).
    """
    from .drivers import _per_request
    from .layout import N_FLEET_COLUMNS
    from .workspace import _ws_need_compact, _ws_need_handed
    stream = (np.array(arrival, dtype=np.float64),) + tuple(
        np.array(x, dtype=np.int64) for x in (prompt, output, prio, sjfk, pgrp, plen))
    n = stream[0].size
    if kept is not None and (not (keep and bound) or np.shape(kept) != (n,)):
        raise ValueError(f"kept: an array of the stream's {n} entries, with keep=True and bound=True; got "
                         f"shape {np.shape(kept)}, keep={keep}, bound={bound}")
    ipars, fpars, lats, red_i, red_f, full = fleet_records(ipar, fpar, lat, nrep)
    blocks = stream_trace_blocks(stream[1], stream[5], ipars)
    m0 = compact_capacity(n, nrep, ipars) if capacity is None else int(capacity)
    if capacity is not None and not 1 <= m0 <= max(n, 1):
        raise ValueError(f"capacity must be an int in 1 .. {max(n, 1)} (the stream's requests), got {capacity!r}")

    def attempt(compact):
        m = m0 if compact else n
        sizes = np.array([_ws_need_compact(np.int64(m), np.int64(n), stream[1], stream[2], stream[5], stream[6], row)
                          for row in ipars], np.int64).reshape(nrep, 2)
        need_i, need_f = sizes.max(axis=0)
        fb = fleet_buffers(n, nrep, need_i, need_f, table_size(_ngroups(stream[5]), nrep, router), m, blocks)
        if not bound:
            fb = fb._replace(dep=np.empty(0))
        elif not keep:
            fb = fb._replace(dep=np.empty(nrep))
        elif kept is not None:
            fb = fb._replace(dep=np.full(3 * nrep + n, -np.inf))
        fill_records(fb, ipars, fpars, lats, sizes)
        args = (np.int64(n), *stream, np.asarray(fleet, np.float64), np.int64(router), np.int64(nrep),
                np.uint64(key0), np.uint64(key1), np.int64(rep), fb, full)
        return (_simulate_fleet_rows(*args) if run is None else run(args, n, nrep)), fb

    if run is None and int(ipars[0, I_MAX_CONCURRENCY]) > 0:
        raise ValueError("a closed loop's records (I_MAX_CONCURRENCY > 0): run them by "
                         "fleet_client.simulate_closed_fleet_stream")
    rc, fb = until_rows_fit(attempt)
    if rc < 0:
        raise RuntimeError(f"the fleet could not be simulated (code {rc})")
    if kept is not None:
        kept[:n] = fb.dep[3 * nrep:]
    if sent is not None:
        sent[:n] = stream[0]
    # (the fleet's workspace for the reduction: of the whole stream, whatever the rows)
    wm_i, wm_f = (np.zeros(x, t) for x, t in zip(
        np.max([_ws_need_handed(np.int64(n), stream[1], stream[2], stream[5], stream[6], row) for row in ipars],
               axis=0), (np.int64, np.float64)))
    row, balance = np.empty(N_COLUMNS), np.empty(N_FLEET_COLUMNS)
    _reduce_fleet(np.int64(n), stream[0], stream[2], red_i, red_f, np.int64(nrep), np.float64(fleet[FL_LATENCY]), fb,
                  wm_i, wm_f, row, balance)
    return _per_request(n, wm_i, wm_f)[:3] + _gather(fb, n) + (fb.owner.copy(), row, balance)


def _gather(fb, n):
    """(preemptions, tokens) of each fleet request from its replica."""
    from .workspace import WI_G
    m = fb.rs_a.shape[1]
    npre = np.array([fb.wi[r][WI_NPRE * m + j] for r, j in zip(fb.owner[:n], fb.local[:n])], np.int64)
    g = np.array([fb.wi[r][WI_G * m + j] for r, j in zip(fb.owner[:n], fb.local[:n])], np.int64)
    return npre, g
