"""The engine: one replica of a vLLM-style server over a request stream.

A replica is initialised (`_init_replica`), advanced through every step
that ends at or before a given time any number of times, and finished
(`_finish_replica`): `_simulate` does any of the three (``what``), and the
three at once for a replication. Its whole
state lives in a workspace (`workspace`), so a replica can be paused and
resumed: between two calls its scalars are kept at the ``RI_*``/``RF_*``
slots. Semantics: ``docs/engine-model.md``; reading guide:
``docs/architecture.md``.

An engine step reads as its phases: ingest arrivals, abandonment, schedule
(a fast or a slow step), the step's duration (`latency`), then, when the
step ends, the arrivals during it and its completions. Two paths compute the
same steps. A *fast step* applies when every running request can be
scheduled in full (their token needs fit the budget and their new KV blocks
fit the free blocks), so that the order of the running batch and preemption
play no role; requests that are plainly decoding are then handled in
aggregate as lazy decoders (`decoders`), O(1) per step, and their
inter-token gaps are one weighted sample, or, for a step with no prefill and
no context term, a count in ``gapw`` by decoder count (entered once at the
end, as the step duration d; the reference takes differences of clock
readings, fl(t + d) - t, which differ from d by up to ulp(t) / 2). Any other
step is a *slow step*: the lazy decoders are materialised and the step is
scheduled request by request in admission order (preemption included). Both
paths add the same terms in the same order as the reference simulator, so
every request's times are bit-identical to the reference's. Event skipping
runs a *stretch* of fast steps in which nothing happens but token counts
(`stretch`); its run-level figures agree with the reference to rounding.

Where a replica may pause. ``_simulate(.., t_stop, STEP_ADVANCE)`` schedules a step
only if it starts before ``t_stop`` and ends a step only if it ends at or
before ``t_stop``; a step that ends later stays *in flight* (scheduled and
counted, its end not applied), and a stretch that would end later is not
taken (the replica waits at its start, and plans it again on the next
call). A request that arrives at or after ``t_stop`` can so be handed to the
replica between calls and be treated as if it had been known from the
start, and a replica run in many calls gives the bits of one call.

The options that act on scheduling (active priority preemption, swap
preemption, prefix caching) are implemented in the slow step only, and force
it (correctness first). ``full`` chooses the compiled engine
(`engine_variant`): ``None``, the *common* engine, without static batching,
those three options, async scheduling, closed loops, sessions, the roofline
and per-step noise (what the synchronous open-loop server with the
regression step time never runs), or ``1``, the engine with all of them.
When ``full`` is None, Numba prunes the branches of the options before
typing (every function below that reads an option takes ``full`` and tests
it first), so the common engine compiles faster; both run the same code
otherwise.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .._numba_options import njit_noalloc
from .accounting import _account_step, _add_in_system, _gap_add
from .arrivals import (_abandon, _arrivals_during_step, _closed_loop_init, _ingest, _release_seats,
                       _session_init, _session_max_len, _session_sends, _unseen_at_horizon)
from .decoders import _complete_decoders, _d_add, _hold_decoders
from .kv_cache import _blocks_of, _log2_exact, _phase
from .latency import (_closed_forms, _constant_in_step, _context_slope, _decode_step_time, _fill_decode_costs,
                      _step_noise, _step_time)
from .layout import (I_ASYNC, A_BLOCKS_END, A_END, A_HIT_TOK, A_KV_INT, A_L_INT, A_MAX_BLOCKS, A_MAX_SWAP, A_N_ITL,
                     A_OCC_INT, A_QUERY_TOK, A_QUEUE_INT, A_STEPS, A_WINDOW_START, ADMISSION_KV_RESERVATION,
                     F_AGING, F_HORIZON, I_ADMISSION, I_BLOCK_SIZE, I_CACHING, I_CHUNKED, I_HAS_AGING,
                     I_HAS_DELAY, I_HAS_HORIZON, I_BLOCK_HASH, I_MAX_BATCHED_TOKENS, I_MAX_CONCURRENCY,
                     I_MAX_NUM_SEQS, I_NUM_GPU_BLOCKS, I_POLICY, I_PRIO_PREEMPT, I_SESSIONS, I_STATIC, I_SWAP,
                     I_SWAP_BLOCKS, I_WARMUP, N_ACC, POLICY_FCFS, POLICY_PRIORITY, POLICY_SJF, ST_COMPLETED, ST_PENDING,
                     ST_RUNNING, ST_SWAPPED, ST_UNFINISHED, ST_WAITING, L_NOISE, L_ROOF, I_STEP_EXTRAS)
from .block_pool import (_cache_arrived_tokens, _count_arrived, _count_cached, _count_lazy, _count_scheduled,
                         _known_tokens, _list_capacity, _pool_cache_full, _pool_check, _pool_claim, _pool_counted,
                         _pool_hits, _pool_init, _pool_queued_hits, _pool_session_lists, _pool_take, _preempted)
from .pipeline import _release_finished
from .prefix_cache import _claim_hits, _evictable_hits, _lookup, _register, _release, _take_blocks
from .scheduler import _admission_blocks, _compact_run, _first_chunk, _rebuild, _start_running
from .stretch import (Stretch, _elapsed, _end_bound, _kv_weight, _stretch_blocks, _stretch_steps,
                      _stretch_steps_noisy)
from .waiting_queue import _heap_pop, _heap_push, _q_peek, _q_pop, _q_push
from .workspace import (RI_SESS_MADE, RI_SESS_SCAN, N_RF, N_RI, RF_CLOCK, RF_KV, RF_L, RF_OCC, RF_QUEUE, RF_STEP_END, RF_STEPS,
                        RI_FAST_STEPS, RI_FREE, RI_MAX_USED, RI_MODE, RI_N_DEC, RI_N_ITL, RI_N_OTHERS,
                        RI_N_PREFILL, RI_N_RUN, RI_N_SWAPPED, RI_N_WAIT, RI_NEXT_ARRIVAL, RI_NEXT_DROP,
                        RI_N_HELD, RF_VISIBLE, RI_PENDING_SWAP, RI_PEND_DEPARTURES, RI_PHASE, RI_RELEASED,
                        RI_RESERVED, RI_RUN_LEN, RI_SWAP_USED, Stream, _carve, _ws_dims, _ws_sizes, RI_N_KNOWN,
                        _compact_dims, _handed_dims,
                        WF_FINISH, WF_FIRST, WF_KEY, WF_LAST, WI_BLOCKS, WI_G, WI_K, WI_NPRE, WI_STATUS,
                        _key_offset, _sched_offset,
                        RI_DIM_CAP, RI_DIM_NCNT, RI_DIM_NHELD, RI_DIM_NITL, RI_DIM_JMAX, RI_DIM_NBP, RI_DIM_NBT, RF_STRETCH_END)

# Static batching, active priority preemption, swap preemption, prefix
# caching, async scheduling, the roofline and per-step noise (`I_STEP_EXTRAS`):
# the options only the full engine has (`_simulate`'s ``full``); closed loops
# and sessions too (`_full_engine_needed`). The common engine is what the
# synchronous open-loop server with the regression step time needs: the
# others' code is not compiled for it.
_FULL_ENGINE_FLAGS = (I_STATIC, I_PRIO_PREEMPT, I_SWAP, I_CACHING, I_ASYNC, I_STEP_EXTRAS)

# Where a paused replica stands (``RI_MODE``).
MODE_BETWEEN_STEPS = 0   # the next step is not scheduled
MODE_FAST_STEP = 1       # a fast step is in flight (scheduled and counted, its end not applied)
MODE_SLOW_STEP = 2       # a slow step is in flight
MODE_STRETCH = 3         # a fast step ended: stretches may follow

# What `_simulate` returns when it advances (and does not finish).
ADVANCE_PAUSED = 0       # the next step starts, or the step in flight ends, after ``t_stop``
ADVANCE_IDLE = 1         # nothing to do until another request is handed to it
ADVANCE_DONE = 2         # the horizon is reached


def _full_engine_needed(ipar):
    """Whether ``ipar`` asks for an option of the full engine (plain
    Python: `engine_variant` calls it, `_needs_full_engine` compiles it)."""
    for i in _FULL_ENGINE_FLAGS:
        if ipar[i] == 1:
            return True
    return ipar[I_MAX_CONCURRENCY] > 0 or ipar[I_SESSIONS] != 0


_needs_full_engine = njit_noalloc(_full_engine_needed)


def engine_variant(ipar):
    """The ``full`` argument of `_simulate` (and `run_chunk`) for ``ipar``:
    None, the common engine, unless the scenario uses an option that only
    the full engine has (then 1)."""
    return 1 if _full_engine_needed(ipar) else None


# ------------------------------------------------------------------------------
# Entries

# What a call of `_simulate` does (``what``): bits; a whole run is all three.
# `STEP_EMPTY` with `STEP_INIT`: set up with no request known, the ``n``
# requests given being only the bound on the ones `_hand` will hand it.
# `STEP_NO_STRETCH` with `STEP_ADVANCE`: run pure decode steps one by one (the
# same requests' times), so that a pause leaves the KV cache as it is at
# ``t_stop`` (a router that reads it), not at the start of a stretch.
STEP_INIT, STEP_ADVANCE, STEP_FINISH, STEP_EMPTY, STEP_NO_STRETCH = 1, 2, 4, 8, 16
WHOLE_RUN = STEP_INIT | STEP_ADVANCE | STEP_FINISH


@njit_noalloc(entry=True)
def _simulate(n, arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, wi, wf, full, t_stop, what):
    """Run a replica of the engine model over requests ``0..n-1``: set it up,
    advance it through every step that ends at or before ``t_stop``, and end
    its run, or any of the three (``what``).

    Parameters
    ----------
    n : int
        The number of requests (the replica's capacity with `STEP_EMPTY`).
    arrival, prompt, output, prio, sjfk, pgrp, plen : 1-D arrays
        Each request's arrival time, prompt and output lengths, priority
        class, SJF key, prefix group (-1: none) and prefix length
        (`workload._draw_workload` fills them), sorted by arrival; with
        `STEP_EMPTY`, requests that bound the ones to be handed (the
        layout's dimensions are read off them), and afterwards the arrays
        `_hand` fills.
    ipar, fpar, lat : 1-D arrays
        The integer, float and latency parameter records (`layout`).
    wi, wf : 1-D int64 and float64 arrays
        The workspace, at least `workspace._ws_need` entries; between calls
        it holds the replica (a call without `STEP_INIT` finds its scalars,
        and the layout's dimensions, at the end: exactly that many).
    full : None or int
        The compiled engine (`engine_variant`).
    t_stop : float
        Advance through every step that ends at or before it (``np.inf``: to
        the end); a step that starts before it and ends after it is left in
        flight.
    what : int
        `STEP_INIT` (`_init_replica`; with `STEP_EMPTY`, no request known),
        `STEP_ADVANCE`, `STEP_FINISH` (`_finish_replica`), or their sum;
        `WHOLE_RUN` for a replication.

    Returns
    -------
    int
        With `STEP_FINISH`, the number of inter-token gap entries; else,
        advancing, `ADVANCE_PAUSED`, `ADVANCE_IDLE` (every known request has
        left the system) or `ADVANCE_DONE` (the horizon is reached); else 0.
        -1 if the workspace is too small, -2 if the common engine was asked
        for an option it does not have, -3 if the block pool's conservation
        failed (checked after every schedule with ``ipar[I_BLOCK_HASH] == 2``,
        a test path: `block_pool._pool_check`).

    The loop lives here, its phases inlined into it (``inline="llvm"``),
    so that LLVM optimises and generates the engine's code once (a
    callee's code is optimised again in every caller it is linked into).
    """
    if full is None and (_needs_full_engine(ipar) or lat[L_ROOF] != 0.0 or lat[L_NOISE] != 0.0):
        return -2
    bs = ipar[I_BLOCK_SIZE]
    cap, ncnt, nheld, nitl, jmax, nbp, nbt = _layout_dims(n, prompt, output, pgrp, plen, ipar, wi, what)
    need_i, need_f = _ws_sizes(n, bs, cap, ncnt, nheld, nitl, nbp, nbt)
    if need_i > wi.size or need_f > wf.size or (what & STEP_INIT == 0 and (need_i, need_f) != (wi.size, wf.size)):
        return -1
    stream = Stream(arrival, prompt, output, prio, sjfk, pgrp, plen)
    req, batch, dec, swap, cache, rec, sc = _carve(stream, (n, bs, cap, ncnt, nheld, nitl, nbp, nbt), wi, wf)
    bsh = _log2_exact(bs)
    if what & STEP_INIT:
        _init_replica(n, 0 if what & STEP_EMPTY else n, req, batch, dec, swap, cache, rec, sc, ipar, fpar, lat,
                      full)
        sc.ri[RI_DIM_CAP], sc.ri[RI_DIM_NCNT], sc.ri[RI_DIM_NHELD] = cap, ncnt, nheld
        sc.ri[RI_DIM_NITL], sc.ri[RI_DIM_JMAX], sc.ri[RI_DIM_NBP], sc.ri[RI_DIM_NBT] = nitl, jmax, nbp, nbt
    rc = 0
    if what & STEP_ADVANCE:
        # The engine's step, phase by phase; the scalar state in a `Loop` of locals (registers), stored
        # back at the end. (`Call`: what the loop reads and never changes.)
        c = _call_of(sc, rec, ipar, fpar, t_stop, bs, bsh, jmax, full)
        st = _load_loop(sc)
        mode = sc.ri[RI_MODE]
        rc = ADVANCE_PAUSED
        while True:
            # -- the step in flight ends, if it ends by t_stop
            if mode == MODE_FAST_STEP or mode == MODE_SLOW_STEP:
                if st.t_end > t_stop:
                    break
                if full is not None and c.async_on:
                    if c.has_h and st.t >= c.horizon:
                        rc = ADVANCE_DONE   # (scheduled, as vLLM had, but not run)
                        st = _stop_at_horizon(req, c, st)
                        break
                else:
                    st = _arrivals_in_step(req, batch, ipar, c, st)
                if mode == MODE_FAST_STEP:
                    st = _end_fast_step(req, batch, dec, rec, ipar, lat, c, st, full)
                    # (a closed loop: a completion sends a request, which a stretch cannot see)
                    mode = MODE_STRETCH if not c.closed else MODE_BETWEEN_STEPS
                else:
                    st = _end_slow_step(req, batch, dec, cache, rec, ipar, c, st, full)
                    mode = MODE_BETWEEN_STEPS
                st = _step_departures(req, sc, ipar, fpar, c, st, full)
            # -- stretches of pure decode steps (event skipping)
            if mode == MODE_STRETCH:
                if what & STEP_NO_STRETCH == 0:
                    if st.t > t_stop:   # (paused before it, called to a time before its clock: nothing to do)
                        break
                    paused, st = _stretch_phase(req, batch, dec, cache, rec, ipar, lat, c, st, full)
                    if paused > 0.0:   # (kept: until then no request comes or goes, unless one is handed)
                        sc.rf[RF_STRETCH_END] = paused
                        break
                mode = MODE_BETWEEN_STEPS
            # -- between steps: a static batch's decode steps; idle, the horizon, the pause
            if full is not None:
                if ipar[I_STATIC] == 1 and st.n_run > 0:   # a static batch's decode steps, O(1) each
                    st = _static_decode(req, batch, rec, ipar, fpar, lat, c, st,
                                        ipar[I_NUM_GPU_BLOCKS] - st.free - cache.cst[2])
            stop, st = _wake(req, c, st)
            if stop != GO_ON:
                rc = stop
                if stop == ADVANCE_DONE and full is not None and c.async_on:
                    st = _stop_at_horizon(req, c, st)
                break
            # -- arrivals, the closed loop's sends, abandonment
            st = _ingest_step(req, batch, sc, ipar, fpar, c, st, full)
            if st.n_run == 0 and st.n_wait == 0 and st.n_sw == 0:
                continue
            # -- schedule: a fast step or a slow one
            slow_cache, counted = _cache_path(cache, ipar, full)
            if _fits_fast(req, batch, dec, ipar, c, st, slow_cache, full):
                ran, d, n_in_queue, st = _fast_step(req, batch, dec, cache, rec, ipar, lat, c, st, counted, full)
                mode = MODE_FAST_STEP
            else:
                err, ran, d, n_in_queue, st = _slow_step(req, batch, dec, swap, cache, rec, ipar, lat, c, st,
                                                         counted, full)
                if err != 0:
                    return err
                mode = MODE_SLOW_STEP
            if not ran:   # only preemptions happened, or (async) only held requests run
                st = _retry_held(req, batch, cache, ipar, fpar, c, st, full)
                mode = MODE_BETWEEN_STEPS
                continue
            # -- the step starts: its duration and integrals
            st = _start_step(req, batch, cache, ipar, fpar, c, st, d, n_in_queue, mode == MODE_SLOW_STEP, full)
        _store_loop(sc, st, mode)
    if what & STEP_FINISH:
        if full is not None and sc.ri[RI_N_HELD] > 0:   # (they completed; nothing schedules after the end)
            _release_held(req, batch, cache, sc, ipar, jmax, full)
        return _finish_replica(sc.ri[RI_N_KNOWN], req, dec, swap, cache, rec, sc, ipar, lat, bs, bsh, full)
    return rc


@njit_noalloc(inline="never")
def _release_held(req, batch, cache, sc, ipar, jmax, full):
    """At a run's end (async scheduling): the finished requests held
    leave with their seats and blocks (`pipeline._release_finished`)."""
    caching = False if full is None else ipar[I_CACHING] == 1
    ri = sc.ri
    ri[RI_FREE], ri[RI_RESERVED], ri[RI_N_RUN], ri[RI_N_WAIT] = _release_finished(
        req, batch.zl, ri[RI_N_HELD], cache, ipar, ri[RI_FREE], ri[RI_RESERVED], ri[RI_N_RUN], ri[RI_N_WAIT], jmax,
        caching)
    ri[RI_N_HELD] = 0


@njit_noalloc
def _layout_dims(n, prompt, output, pgrp, plen, ipar, wi, what):
    """The layout's dimensions (`workspace._ws_dims`): read off the requests
    when the replica is set up, else kept in its scalars (the last ``N_RI``
    entries of ``wi``), so that resuming it scans no requests; set up with
    `STEP_EMPTY`, as `_state_dims` stated them there (a fleet's replicas
    share one scan)."""
    if (what & STEP_INIT) != 0 and (what & STEP_EMPTY) == 0:
        return _ws_dims(n, prompt, output, pgrp, plen, ipar)
    ri = wi[wi.size - N_RI:]   # (`STEP_EMPTY`: the caller stated them, `_state_dims`)
    return (ri[RI_DIM_CAP], ri[RI_DIM_NCNT], ri[RI_DIM_NHELD], ri[RI_DIM_NITL], ri[RI_DIM_JMAX], ri[RI_DIM_NBP],
            ri[RI_DIM_NBT])


@njit_noalloc(entry=True)
def _state_dims(n, prompt, output, pgrp, plen, ipar, wi):
    """State the layout's dimensions of a replica handed its requests, bounded
    by requests ``0..n-1`` (`workspace._handed_dims`), in the scalars of the
    workspace ``wi`` (exactly `workspace._ws_need_handed`'s size) before a
    `STEP_INIT` | `STEP_EMPTY` call (or copy them from one that has them)."""
    ri = wi[wi.size - N_RI:]
    (ri[RI_DIM_CAP], ri[RI_DIM_NCNT], ri[RI_DIM_NHELD], ri[RI_DIM_NITL], ri[RI_DIM_JMAX], ri[RI_DIM_NBP],
     ri[RI_DIM_NBT]) = _handed_dims(n, prompt, output, pgrp, plen, ipar)
    return 0


@njit_noalloc(entry=True)
def _state_dims_compact(m, n, prompt, output, pgrp, plen, ipar, wi):
    """`_state_dims` of a replica of ``m`` seats for the requests ``0..n-1``
    (`workspace._compact_dims`; its workspace exactly `workspace._ws_need_compact`'s
    size, its capacity ``m`` in `_simulate` and `_hand`)."""
    ri = wi[wi.size - N_RI:]
    (ri[RI_DIM_CAP], ri[RI_DIM_NCNT], ri[RI_DIM_NHELD], ri[RI_DIM_NITL], ri[RI_DIM_JMAX], ri[RI_DIM_NBP],
     ri[RI_DIM_NBT]) = _compact_dims(m, n, prompt, output, pgrp, plen, ipar)
    return 0


@njit_noalloc(inline="never")
def _init_replica(n, known, req, batch, dec, swap, cache, rec, sc, ipar, fpar, lat, full):
    """Set up a replica for the first ``known`` of the ``n`` requests of
    ``req`` in the workspace's views (`workspace._carve`); `_hand` hands it
    the others."""
    _init_requests(known, req, ipar, fpar)
    if full is not None and ipar[I_MAX_CONCURRENCY] > 0 and ipar[I_SESSIONS] == 0:
        _closed_loop_init(known, req, ipar)
    if full is not None:
        _init_full_engine(known, req, swap, cache, ipar, dec.ph.size)
        if ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1:
            countable = ipar[I_STATIC] == 0 and ipar[I_SWAP] == 0
            _pool_init(n, req, cache.pool, ipar[I_NUM_GPU_BLOCKS], dec.ph.size, countable)
            if ipar[I_SESSIONS] != 0:
                _pool_session_lists(n, cache.pool, ipar[I_NUM_GPU_BLOCKS], dec.ph.size, _session_max_len(ipar))
    _init_state(lat, batch, dec, swap, cache, rec, full)
    for j in range(N_RI):
        sc.ri[j] = 0
    if full is not None and ipar[I_SESSIONS] != 0:
        _session_init(known, req, ipar, sc.ri[RI_SESS_SCAN:RI_SESS_MADE + 1])
    for j in range(N_RF):
        sc.rf[j] = 0.0
    sc.ri[RI_FREE] = ipar[I_NUM_GPU_BLOCKS]
    sc.ri[RI_N_KNOWN] = known
    warmup = ipar[I_WARMUP]
    # Measurement window start: the run's start (time 0, when a benchmark
    # client starts its clock) without warm-up, else the first measured arrival.
    rec.acc[A_WINDOW_START] = 0.0 if warmup == 0 else (req.arrival[warmup] if n > warmup else np.inf)


@njit_noalloc
def _init_requests(n, req, ipar, fpar):
    """Every request pending, nothing computed; the waiting-queue keys e_i
    (docs/engine-model.md, "Waiting-queue order"): the priority class c_i
    or the SJF key q_i, aged; unused for fcfs. Doubles, so that integer keys
    and aged keys share one heap (integers are exact)."""
    # (one loop per array: LLVM turns each into a memset or a vector loop,
    # where one loop over all the arrays stores one element at a time)
    for i in range(n):
        req.status[i] = ST_PENDING
    for i in range(n):
        req.k[i] = 0
    for i in range(n):
        req.g[i] = 0
    for i in range(n):
        req.blocks[i] = 0
    for i in range(n):
        req.npre[i] = 0
    for i in range(n):
        req.sched[i] = 0
    for i in range(n):
        req.ever[i] = 0
    for i in range(n):
        req.first_t[i] = np.nan
    for i in range(n):
        req.last_t[i] = np.nan
    for i in range(n):
        req.finish_t[i] = np.nan
    policy = ipar[I_POLICY]
    has_aging = ipar[I_HAS_AGING] == 1
    if policy != POLICY_FCFS or has_aging or ipar[I_PRIO_PREEMPT] == 1:
        aging = fpar[F_AGING]
        for i in range(n):
            req.key[i] = float(req.prio[i]) if policy == POLICY_PRIORITY else float(req.sjfk[i])
            if has_aging:
                # e_i = c_i + a_i / A: a_i / A first, then added to the integer as a double
                req.key[i] = req.key[i] + req.arrival[i] / aging


@njit_noalloc
def _init_full_engine(n, req, swap, cache, ipar, bs):
    """The arrays of swap preemption and prefix caching (the common engine
    has neither and leaves them as they are: a quarter less memory written
    per request; the reduction reads ``nswap`` only with swap)."""
    caching = ipar[I_CACHING] == 1
    fcfs = ipar[I_POLICY] == POLICY_FCFS
    cache.hoff[0] = 0
    for i in range(n):
        swap.nswap[i] = 0
        cache.ctok[i] = 0
        swap.swapped_s[i] = 0.0
        # the swapped queue is a heap ordered by (e_i, i), by i for fcfs
        swap.skey[i] = req.key[i] if not fcfs else float(i)
        # (the synthetic prefix entries; none with caching by block hash)
        cache.fpre[i] = req.plen[i] // bs if caching and ipar[I_BLOCK_HASH] == 0 and req.pgrp[i] >= 0 else 0
        cache.hoff[i + 1] = cache.hoff[i] + cache.fpre[i]
        cache.private[i] = 0
        cache.nent[i] = 0


@njit_noalloc
def _init_state(lat, batch, dec, swap, cache, rec, full):
    """Empty queues, no lazy decoders, an empty prefix cache, no gaps, the
    accumulators at zero, and the decode term by batch size."""
    for j in range(dec.ph.size):
        dec.ph[j] = 0
    for j in range(rec.gapw.size):
        rec.gapw[j] = 0
    batch.qs[0] = 0
    batch.qs[1] = 0
    dec.hs[0] = 0
    swap.sqs[0] = 0
    for j in range(3):
        dec.dstate[j] = 0
    for j in range(cache.cnt.size):
        cache.cnt[j] = -1
    for j in range(cache.held.size):
        cache.held[j] = 0
    cache.cst[0] = -1
    cache.cst[1] = -1
    cache.cst[2] = 0
    cache.cst[3] = 0
    _fill_decode_costs(lat, rec.dec_cost, full)
    for j in range(N_ACC):
        rec.acc[j] = 0.0


@njit_noalloc(inline="never")
def _finish_replica(n, req, dec, swap, cache, rec, sc, ipar, lat, bs, bsh, full):
    """End a replica's run where it stands: materialise the lazy decoders;
    whatever is in the system (or in flight) is unfinished; store the
    accumulators and the inter-token gaps of pure decode steps. Returns the
    number of inter-token gap entries."""
    if full is None:
        caching = False
    else:
        caching = ipar[I_CACHING] == 1
    ri, rf, acc = sc.ri, sc.rf, rec.acc
    t = rf[RF_CLOCK]
    S = ri[RI_FAST_STEPS]
    for jj in range(dec.dstate[0]):
        r = dec.dmem[jj]
        req.k[r] = dec.koff[r] + S
        req.g[r] = dec.goff[r] + S
        req.blocks[r] = _blocks_of(req.k[r], bs, bsh)
    # The swap clocks only where a request is swapped out: one loop over both would be vectorised
    # with masked loads and stores of them, which cost a fault-suppression assist a vector where their
    # pages were never written (the swap segment of a row on ordinary pages: 100-200x the loop's time;
    # a disaggregated server's prefill pool spent some 10 % of its run here).
    if ri[RI_N_SWAPPED] > 0:
        for i in range(n):
            if req.status[i] == ST_SWAPPED:
                swap.swapped_s[i] += t - swap.swapped_since[i]   # to the stop
    for i in range(n):
        if req.status[i] == ST_WAITING or req.status[i] == ST_RUNNING or req.status[i] == ST_SWAPPED:
            req.status[i] = ST_UNFINISHED
    n_itl = ri[RI_N_ITL]
    for b in range(rec.gapw.size):
        if rec.gapw[b] > 0:
            n_itl = _gap_add(rec.itl_v, rec.itl_w, n_itl, _decode_step_time(lat, rec.dec_cost, b), rec.gapw[b])
    nblk = ipar[I_NUM_GPU_BLOCKS]
    acc[A_OCC_INT] = rf[RF_OCC] / ipar[I_MAX_NUM_SEQS]
    acc[A_QUEUE_INT] = rf[RF_QUEUE]
    acc[A_KV_INT] = rf[RF_KV] / nblk
    acc[A_L_INT] = rf[RF_L]
    acc[A_STEPS] = rf[RF_STEPS]
    acc[A_MAX_BLOCKS] = ri[RI_MAX_USED]
    acc[A_END] = t
    acc[A_BLOCKS_END] = nblk - ri[RI_FREE] - cache.cst[2]
    # prefix hit rate: measured requests of a group that were admitted at least once
    if caching:
        for i in range(ipar[I_WARMUP], n):
            if req.pgrp[i] != -1 and req.ever[i]:   # (a group, a session, or a trace's identities)
                acc[A_HIT_TOK] += cache.ctok[i]
                acc[A_QUERY_TOK] += req.prompt[i]
    acc[A_N_ITL] = n_itl
    return n_itl




# ------------------------------------------------------------------------------
# The engine loop's state and its phases (`_simulate`)

#: The engine loop's scalar state: locals of `_simulate`'s loop (registers),
#: passed whole to the step's phases, which return it updated; loaded from
#: the replica's scalars (`RI_*`, `RF_*`) at a call's start and stored there
#: at its end (`_load_loop`, `_store_loop`).
Loop = namedtuple("Loop", (
    "t", "t_end", "t_vis",   # the clock; the end of the step in flight; (async) arrivals seen up to t_vis
    "nxt", "drop_ptr",       # the next request to arrive; the next to check for abandonment
    "n_wait", "n_run", "rl", "n_oth", "n_sw", "n_held",   # waiting; running, run length, others; swapped; held
    "free", "reserved",      # free KV blocks; tokens reserved (admission by KV reservation)
    "S", "sph",              # fast steps so far (the lazy decoders' clock), its block phase
    "n_dec", "n_pf",         # the step in flight's decoders and prefill tokens
    "n_itl", "swap_used", "pending_swap",   # gap entries; swap blocks used, blocks moved (to charge)
    "acc5"))                 # the integrals: (occupancy, queue, KV, in system, steps, most blocks used)

#: What a call's loop reads and never changes: the requests known, the
#: pause, the block size (and its log2), the most prefix blocks of a
#: request, the measurement window [ws, we], the horizon, and the load's
#: kind (async scheduling, closed loop, sessions and their scalars).
Call = namedtuple("Call", ("n", "t_stop", "bs", "bsh", "jmax", "ws", "we", "has_h", "horizon", "async_on", "closed",
                           "sessions", "sess"))

# `_wake`'s answer when the loop goes on to schedule a step (else an ``ADVANCE_*``).
GO_ON = -1


@njit_noalloc(inline="llvm")
def _call_of(sc, rec, ipar, fpar, t_stop, bs, bsh, jmax, full):
    """The `Call` of a replica advanced to ``t_stop``. Closed loop
    (`arrivals._release_seats`): ``RI_RELEASED``, the departures turned into
    arrivals, and ``RI_PEND_DEPARTURES``, (async) a step's completions not
    yet turned, since vLLM schedules the step after it before it sees them
    (kept in memory, not in the loop's registers). Sessions
    (`arrivals._session_sends`): a turn's departure sends its session's next turn."""
    async_on, closed, sessions = False, False, False   # (the common engine has none of the three)
    if full is not None:
        async_on = ipar[I_ASYNC] == 1
        sessions = ipar[I_SESSIONS] != 0
        closed = ipar[I_MAX_CONCURRENCY] > 0 or sessions
    has_h = ipar[I_HAS_HORIZON] == 1
    horizon = fpar[F_HORIZON]
    return Call(sc.ri[RI_N_KNOWN], t_stop, bs, bsh, jmax, rec.acc[A_WINDOW_START], horizon if has_h else np.inf,
                has_h, horizon, async_on, closed, sessions, sc.ri[RI_SESS_SCAN:RI_SESS_MADE + 1])


@njit_noalloc(inline="llvm")
def _load_loop(sc):
    """The `Loop` of a replica's scalars."""
    ri, rf = sc.ri, sc.rf
    return Loop(rf[RF_CLOCK], rf[RF_STEP_END], rf[RF_VISIBLE], ri[RI_NEXT_ARRIVAL], ri[RI_NEXT_DROP], ri[RI_N_WAIT],
                ri[RI_N_RUN], ri[RI_RUN_LEN], ri[RI_N_OTHERS], ri[RI_N_SWAPPED], ri[RI_N_HELD], ri[RI_FREE],
                ri[RI_RESERVED], ri[RI_FAST_STEPS], ri[RI_PHASE], ri[RI_N_DEC], ri[RI_N_PREFILL], ri[RI_N_ITL],
                ri[RI_SWAP_USED], ri[RI_PENDING_SWAP],
                (rf[RF_OCC], rf[RF_QUEUE], rf[RF_KV], rf[RF_L], rf[RF_STEPS], ri[RI_MAX_USED]))


@njit_noalloc(inline="llvm")
def _store_loop(sc, st, mode):
    """Store the `Loop` ``st`` and the ``mode`` in the replica's scalars."""
    ri, rf = sc.ri, sc.rf
    ri[RI_NEXT_ARRIVAL], ri[RI_NEXT_DROP], ri[RI_N_RUN] = st.nxt, st.drop_ptr, st.n_run
    ri[RI_RUN_LEN], ri[RI_N_OTHERS] = st.rl, st.n_oth
    ri[RI_FAST_STEPS], ri[RI_PHASE], ri[RI_N_WAIT], ri[RI_FREE], ri[RI_RESERVED] = (st.S, st.sph, st.n_wait,
                                                                                     st.free, st.reserved)
    ri[RI_N_ITL], ri[RI_N_SWAPPED], ri[RI_SWAP_USED], ri[RI_PENDING_SWAP] = (st.n_itl, st.n_sw, st.swap_used,
                                                                             st.pending_swap)
    ri[RI_MODE], ri[RI_N_DEC], ri[RI_N_PREFILL] = mode, st.n_dec, st.n_pf
    rf[RF_CLOCK], rf[RF_STEP_END] = st.t, st.t_end
    rf[RF_OCC], rf[RF_QUEUE], rf[RF_KV], rf[RF_L], rf[RF_STEPS], ri[RI_MAX_USED] = st.acc5
    ri[RI_N_HELD], rf[RF_VISIBLE] = st.n_held, st.t_vis


@njit_noalloc(inline="llvm")
def _arrivals_in_step(req, batch, ipar, c, st):
    """The arrivals during the step that ends at ``st.t_end`` (synchronous
    scheduling: they see it before its completions)."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    nxt, n_wait, reserved, acc5 = _arrivals_during_step(c.n, req, batch, ipar, t_end, nxt, n_run + n_sw, n_wait,
                                                        reserved, acc5, c.ws, c.we)
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
                n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="never")
def _stop_at_horizon(req, c, st):
    """Async scheduling, the run stopping at the horizon: the arrivals no
    schedule has seen are unfinished (`arrivals._unseen_at_horizon`)."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    nxt, acc5 = _unseen_at_horizon(c.n, req, c.horizon, t, nxt, acc5)
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
                n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="llvm")
def _step_departures(req, sc, ipar, fpar, c, st, full):
    """After a step's end: its departures send the closed loop's or the
    sessions' next requests (the full engine's); the clock moves to the
    step's end."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    ri = sc.ri
    if full is None:
        pass
    elif c.sessions:
        _session_sends(c.n, req, ipar, fpar, nxt, t_end, c.sess)
    elif c.closed:
        # (async: the finished requests held have left, as the client sees it)
        left = nxt - (n_run + n_wait + n_sw) + n_held
        if c.async_on:
            ri[RI_PEND_DEPARTURES] = left - ri[RI_RELEASED]
        else:
            ri[RI_RELEASED] = _release_seats(c.n, req, ipar, nxt, t_end, left, ri[RI_RELEASED])
    t_vis = t   # (async: the next step was scheduled when this one started)
    t = t_end
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
                n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="llvm")
def _stretch_phase(req, batch, dec, cache, rec, ipar, lat, c, st, full):
    """After a fast step: stretches of pure decode steps (`_stretches`),
    in closed form, or step by step with per-step noise. Returns the time
    the next stretch would end if it ends after ``t_stop`` (paused; else
    0.0), and the state."""
    paused = 0.0
    if full is None:   # (the common engine: no noise; ``noisy`` None, so its code is not compiled)
        paused, st = _stretches(req, batch, dec, cache, rec, ipar, lat, c, st, full, None)
    elif _closed_forms(lat):
        paused, st = _stretches(req, batch, dec, cache, rec, ipar, lat, c, st, full, False)
    elif st.n_oth == 0 and st.n_run > 0 and st.n_sw == 0 and (st.n_wait == 0 or st.n_run == ipar[I_MAX_NUM_SEQS]):
        # per-step noise: a copy of its own (`_noisy_stretches`), entered only where a stretch may follow
        paused, st = _noisy_stretches(req, batch, dec, cache, rec, ipar, lat, c, st, full)
    return paused, st


@njit_noalloc(inline="llvm")
def _wake(req, c, st):
    """Between steps: with nothing in the system, jump to the next arrival;
    then stop at the horizon or the pause. Returns `GO_ON` (schedule a step)
    or what `_simulate` returns (``ADVANCE_*``), and the state."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    rc = GO_ON
    if n_run == 0 and n_wait == 0 and n_sw == 0:
        if nxt >= c.n:
            rc = ADVANCE_IDLE
        elif req.arrival[nxt] > t and req.arrival[nxt] >= c.t_stop:
            rc = ADVANCE_PAUSED
        else:
            if req.arrival[nxt] > t:
                t = req.arrival[nxt]   # idle: jump to the next arrival
            t_vis = t   # (async: nothing in flight)
    if rc == GO_ON:
        t_in = t_vis if c.async_on else t   # arrivals up to t_in are seen
        if c.has_h and t_in >= c.horizon:
            rc = ADVANCE_DONE
        elif t >= c.t_stop:
            rc = ADVANCE_PAUSED   # (before ingesting: a request handed at t_stop is seen by this step)
    return rc, Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph,
                    n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="llvm")
def _ingest_step(req, batch, sc, ipar, fpar, c, st, full):
    """A step's first phase: the arrivals it sees (up to ``t_in``: the clock,
    or with async scheduling the start of the step that just ended), the
    closed loop's or the sessions' sends, abandonment."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    n, ri, sess = c.n, sc.ri, c.sess
    t_in = t_vis if c.async_on else t   # arrivals up to t_in are seen
    w0 = n_wait
    if full is not None and c.async_on:
        nxt, n_wait, reserved, acc5 = _arrivals_during_step(n, req, batch, ipar, t_in, nxt, n_run + n_sw,
                                                            n_wait, reserved, acc5, c.ws, c.we)
    nxt, n_wait, reserved = _ingest(n, req, batch, ipar, t_in, nxt, n_run + n_wait + n_sw, n_wait, reserved)
    if full is not None and c.closed:
        # a rejection's seat sends the client's next request at once (zero think time)
        pend = ri[RI_PEND_DEPARTURES]
        while True:
            if c.sessions:
                _session_sends(n, req, ipar, fpar, nxt, t_in, sess)
            else:
                ri[RI_RELEASED] = _release_seats(n, req, ipar, nxt, t_in, nxt - (n_run + n_wait + n_sw)
                                                 + n_held - pend, ri[RI_RELEASED])
            if not (nxt < n and req.arrival[nxt] <= t_in):
                break
            nxt, n_wait, reserved = _ingest(n, req, batch, ipar, t_in, nxt, n_run + n_wait + n_sw, n_wait,
                                            reserved)
    drop_ptr, n_wait, reserved = _abandon(req, ipar, fpar, t_in, drop_ptr, nxt, n_wait, reserved)
    if t_in < t:
        # (async: the requests just seen have been in the system since their arrival,
        # counted up to t_in, and are from now on: their time from t_in to now; those
        # dropped as of t_in were counted in the step that ended now: not after t_in)
        acc5 = _add_in_system(acc5, (n_wait - w0) * (t - t_in))
    if full is None:
        pass
    elif c.sessions:
        _session_sends(n, req, ipar, fpar, nxt, t_in, sess)
    elif c.closed:
        left = nxt - (n_run + n_wait + n_sw) + n_held
        released = _release_seats(n, req, ipar, nxt, t_in, left - ri[RI_PEND_DEPARTURES], ri[RI_RELEASED])
        # (async: then the completions of the step that ended at t, which vLLM
        # applies after scheduling the step now formed)
        ri[RI_RELEASED] = _release_seats(n, req, ipar, nxt, t, left, released)
        ri[RI_PEND_DEPARTURES] = 0
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
                n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="llvm")
def _cache_path(cache, ipar, full):
    """(Whether prefix caching forces a slow step, whether the block pool is
    counted): prefix caching takes slow steps, unless the block pool is
    counted (`block_pool`)."""
    if full is None:
        caching = False
        hashing = False
    else:
        caching = ipar[I_CACHING] == 1
        hashing = caching and ipar[I_BLOCK_HASH] >= 1
    slow_cache = caching
    counted = False
    if hashing:
        if _pool_counted(cache.pool):
            slow_cache = False
            counted = True
    return slow_cache, counted


@njit_noalloc(inline="llvm")
def _fast_step(req, batch, dec, cache, rec, ipar, lat, c, st, counted, full):
    """Schedule a fast step (`_schedule_fast`) and take its duration.
    Returns whether anything runs, the duration, the requests queued, and
    the state."""
    st, n_ctx = _schedule_fast(req, batch, dec, ipar, c, st)
    t, lag = st.t, c.async_on and st.t_vis < st.t   # (async: the tokens of the step that ended are in flight)
    if counted and c.async_on:
        _count_scheduled(req, batch.oth, st.n_oth, cache.pool, t, lag, c.bs)
    ran = st.n_dec + st.n_pf > 0   # (async: all running may be finished, held)
    pairs2, n_pfs = 0, 0
    if full is not None and st.n_pf > 0 and lat[L_ROOF] != 0.0:
        pairs2, n_pfs = _prefill_work(req, batch.oth, st.n_oth, ipar, full)
    d = _step_time(lat, rec.dec_cost, st.n_dec, st.n_pf, n_ctx, 0, st.acc5[4], pairs2, n_pfs, full)
    return ran, d, st.n_wait, st


@njit_noalloc(inline="llvm")
def _slow_step(req, batch, dec, swap, cache, rec, ipar, lat, c, st, counted, full):
    """Schedule a slow step, request by request (`_schedule_slow`), and
    take its duration. Returns an error code (-3: the block pool's check
    failed, `_simulate`), whether anything runs, the duration, the requests
    queued, and the state."""
    if full is None:
        hashing = False
    else:
        hashing = ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1
    ran, n_ctx, st = _schedule_slow(req, batch, dec, swap, cache, rec, ipar, c, st, counted, full)
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    bs, jmax = c.bs, c.jmax
    lag = c.async_on and t_vis < t
    err = 0
    if hashing:
        if lag:
            if cache.pool.pst[1] == 1:
                _cache_arrived_tokens(req, batch, n_run, cache.pool, t, bs, jmax)
            else:
                _count_arrived(req, batch, n_run, cache.pool, t, bs)
        if (ipar[I_BLOCK_HASH] == 2 and cache.pool.pst[1] == 1
                and _pool_check(req, batch.run, n_run, cache.pool, free) != 0):
            err = -3
    pairs2, n_pfs = 0, 0
    if full is not None and n_pf > 0 and lat[L_ROOF] != 0.0:
        pairs2, n_pfs = _prefill_work(req, batch.run, n_run, ipar, full)
    d = _step_time(lat, rec.dec_cost, n_dec, n_pf, n_ctx, pending_swap, acc5[4], pairs2, n_pfs, full)
    return err, ran, d, n_wait + n_sw, Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held,
                                            free, reserved, S, sph, n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="never")
def _retry_held(req, batch, cache, ipar, fpar, c, st, full):
    """A schedule that ran nothing (only preemptions happened, or, async,
    only held requests run): with requests held, vLLM ends the step in
    flight, applies its output, and the scheduler tries again at once
    (nothing in flight: no lag)."""
    caching = False if full is None else ipar[I_CACHING] == 1
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    if full is not None and n_held > 0:   # (async: the full engine's)
        free, reserved, n_run, n_wait = _release_finished(req, batch.zl, n_held, cache, ipar, free, reserved, n_run,
                                                          n_wait, c.jmax, caching)
        n_held = 0
        if c.sessions:   # (their turns left at t: `_session_sends`'s async order)
            _session_sends(c.n, req, ipar, fpar, nxt, t, c.sess)
        rl = _compact_run(batch.run, rl, req.status)
    t_vis = t
    n_oth = _rebuild(batch.run, rl, batch.oth)
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
                n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="llvm")
def _start_step(req, batch, cache, ipar, fpar, c, st, d, n_in_queue, slow, full):
    """The step scheduled starts: it ends at ``t + d``; its integrals
    (``n_in_queue`` requests queued); (async) the requests held, finished
    at ``t``, leave now."""
    caching = False if full is None else ipar[I_CACHING] == 1
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    if slow:
        pending_swap = 0
    t_end = t + d
    acc5 = _account_step(acc5, t, t_end, d, n_run, n_in_queue, ipar[I_NUM_GPU_BLOCKS] - free - cache.cst[2], c.ws,
                         c.we)
    if full is None:
        pass   # (async scheduling is the full engine's)
    elif c.async_on and c.has_h and t >= c.horizon:
        acc5 = _add_in_system(acc5, -(n_run + n_in_queue) * d)   # (async: not run, the run ends at t)
    elif n_held > 0:
        acc5 = _add_in_system(acc5, -n_held * d)   # (async: finished at t, held in the batch)
        free, reserved, n_run, n_wait = _release_finished(req, batch.zl, n_held, cache, ipar, free, reserved, n_run,
                                                          n_wait, c.jmax, caching)
        n_held = 0
        if c.sessions:
            # (async: the turns that finished at t send now, after the sends of the departures
            # at t_in just handled and before those of the ingestion at t, made at the next step)
            _session_sends(c.n, req, ipar, fpar, nxt, t, c.sess)
        if slow:
            rl = _compact_run(batch.run, rl, req.status)
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
                n_pf, n_itl, swap_used, pending_swap, acc5)


# ------------------------------------------------------------------------------
# The fast step

@njit_noalloc(inline="llvm")
def _fits_fast(req, batch, dec, ipar, c, st, slow_cache, full):
    """Whether every running request can be scheduled in full this step (its
    token need fits the budget, its new blocks the free blocks), so that the
    step can be a fast one. ``slow_cache``: prefix caching needs a slow step."""
    n_oth, n_wait, n_sw, pending_swap, sph, free = st.n_oth, st.n_wait, st.n_sw, st.pending_swap, st.sph, st.free
    bs, bsh = c.bs, c.bsh
    if full is None:
        static = False
        prio_preempt = False
        caching = False
    else:
        static = ipar[I_STATIC] == 1
        prio_preempt = ipar[I_PRIO_PREEMPT] == 1
        caching = slow_cache
    if static:
        return False
    need_tok = dec.dstate[0]
    need_blk = dec.ph[sph]   # lazy decoders whose k is a multiple of block_size
    for jj in range(n_oth):
        r = batch.oth[jj]
        s = req.prompt[r] + req.g[r] - req.k[r]
        need_tok += s
        need_blk += _blocks_of(req.k[r] + s, bs, bsh) - req.blocks[r]
    fast = need_tok <= ipar[I_MAX_BATCHED_TOKENS] and need_blk <= free
    # Correctness first: with active priority preemption and a waiting
    # request, phase 0 may preempt, so the step is always a slow one.
    if prio_preempt and n_wait > 0:
        fast = False
    # Likewise with a swapped request (phase 2) or transfers to charge.
    if n_sw > 0 or pending_swap > 0:
        fast = False
    # And with prefix caching (shared blocks, registration, LRU), but for a
    # counted block pool (`block_pool`).
    if caching:
        fast = False
    return fast


@njit_noalloc(inline="llvm")
def _schedule_fast(req, batch, dec, ipar, c, st):
    """Schedule a fast step: every running request in full (the lazy
    decoders in aggregate), then admit waiting requests as the slow step
    would. Return the state (free blocks, waiting, running, run length,
    others, and the batch composition: decoders, prefill tokens) and the
    step's context tokens."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    bs, bsh = c.bs, c.bsh
    n_d = dec.dstate[0]
    budget = ipar[I_MAX_BATCHED_TOKENS] - n_d
    free -= dec.ph[sph]
    for jj in range(n_oth):
        r = batch.oth[jj]
        s = req.prompt[r] + req.g[r] - req.k[r]
        nb = _blocks_of(req.k[r] + s, bs, bsh) - req.blocks[r]
        req.blocks[r] += nb
        free -= nb
        req.sched[r] = s
        budget -= s
    mns = ipar[I_MAX_NUM_SEQS]
    policy = ipar[I_POLICY]
    chunked = ipar[I_CHUNKED] == 1
    while n_wait > 0 and budget > 0 and n_run < mns:
        w = _q_peek(batch.q, batch.qs, req.key, policy, req.status)
        kw = req.k[w]   # (tokens whose KV arrived from elsewhere, a disaggregated decode side; else 0)
        s = _first_chunk(req.prompt[w] + req.g[w] - kw, budget, chunked)
        if s < 0:
            break
        nb = _blocks_of(kw + s, bs, bsh)
        if _admission_blocks(req.prompt[w] + req.g[w], nb, ipar, bs, bsh) > free:
            break
        _start_running(w, nb, batch.q, batch.qs, req.key, policy, req.status, req.ever, req.blocks)
        n_wait -= 1
        free -= nb
        req.sched[w] = s
        budget -= s
        if rl == batch.run.size:
            rl = _compact_run(batch.run, rl, req.status)
        batch.run[rl] = w
        rl += 1
        batch.oth[n_oth] = w
        n_oth += 1
        n_run += 1
    n_dec = n_d
    n_pf = 0
    n_ctx = dec.dstate[1] + n_d * (S + 1)
    for jj in range(n_oth):
        r = batch.oth[jj]
        s = req.sched[r]
        if s == 1 and req.g[r] >= 1 and req.k[r] == req.prompt[r] + req.g[r] - 1:
            n_dec += 1
        else:
            n_pf += s
        n_ctx += req.k[r] + s
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
           n_pf, n_itl, swap_used, pending_swap, acc5), n_ctx


@njit_noalloc(inline="llvm")
def _end_fast_step(req, batch, dec, rec, ipar, lat, c, st, full):
    """The end of a fast step at ``t_end``: the lazy decoders emit one token
    each (and those at their last complete), the others emit, complete or
    become lazy decoders. Return the state (free blocks, reserved tokens,
    running, others, fast steps, phase, gap entries, requests held updated).
    With async scheduling, the requests that finish are held (`pipeline`)."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    bs, bsh = c.bs, c.bsh
    async_on = c.async_on
    dstate = dec.dstate
    if dstate[2] > 0:
        if _constant_in_step(lat) and n_pf == 0:
            rec.gapw[n_dec] += dstate[2]
        else:
            n_itl = _gap_add(rec.itl_v, rec.itl_w, n_itl, t_end - t, dstate[2])
    S += 1
    sph = sph - 1 if sph > 0 else bs - 1
    warmup = ipar[I_WARMUP]
    admission = ipar[I_ADMISSION]
    if full is not None and async_on:
        if dec.hs[0] > 0 and dec.hk[0] == S:   # (a call passes every array of its views: test first)
            n_held = _hold_decoders(t_end, S, dec, req, batch.zl, n_held, warmup, bs, bsh)
    else:
        free, reserved, n_run = _complete_decoders(t_end, S, free, reserved, n_run, dec, req, ipar, bs, bsh)
    m = 0
    for jj in range(n_oth):
        r = batch.oth[jj]
        s = req.sched[r]
        req.sched[r] = 0
        req.k[r] += s
        emitted = False
        if req.k[r] == req.prompt[r] + req.g[r]:
            req.g[r] += 1
            emitted = True
            if req.g[r] == 1:
                req.first_t[r] = t_end
            elif r >= warmup:
                n_itl = _gap_add(rec.itl_v, rec.itl_w, n_itl, t_end - req.last_t[r], 1)
            req.last_t[r] = t_end
        if req.g[r] == req.output[r]:
            req.finish_t[r] = t_end
            if async_on:
                batch.zl[n_held] = r
                n_held += 1
            else:
                req.status[r] = ST_COMPLETED
                free += req.blocks[r]
                req.blocks[r] = 0
                if admission == ADMISSION_KV_RESERVATION:
                    reserved -= req.prompt[r] + req.output[r]
                n_run -= 1
        elif emitted:
            _d_add(r, req.k[r], req.g[r], S, dec, req.output, warmup, bs, bsh)
        else:
            batch.oth[m] = r
            m += 1
    n_oth = m
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
           n_pf, n_itl, swap_used, pending_swap, acc5)


# ------------------------------------------------------------------------------
# Stretches of decode steps (event skipping, `stretch`)

@njit_noalloc(inline="llvm")
def _stretches(req, batch, dec, cache, rec, ipar, lat, c, st, full, noisy):
    """While every running request is a lazy decoder and nothing else can
    happen (no admission, no abandonment, enough free blocks), run the next
    steps as one stretch, up to the step of the next completion or the one
    during which the next request arrives: the clock step by step (the same
    running sum as the reference's), the rest in closed form. After a
    completion, with nobody waiting and no arrival yet, the next stretch
    follows at once. (Not with active priority preemption and a waiting
    request: phase 0.) A stretch that would end after ``t_stop`` is not
    taken: the first value returned is then the time it would end, or a
    lower bound of it (synchronous scheduling: its steps are summed only
    until they pass ``t_stop``, `stretch._end_bound`) (paused; else 0.0),
    the second the state.

    With async scheduling (`pipeline`), a stretch goes on to the step after
    the one during which the next request arrives (vLLM schedules it before
    it sees the arrival), and the requests that finish at a stretch's end
    are held through the next stretch's first step (its integrals count
    them); the visibility time ``t_vis`` with them.

    ``noisy``: per-step noise (`latency._closed_forms` says no), the steps
    summed one by one (`stretch._stretch_steps_noisy`); a constant at each
    call, so that the deterministic engine's inlined copy has none of it;
    None in the common engine (`engine_variant`), whose build then has no
    noise code at all (Numba prunes ``noisy is not None`` before typing)."""
    if full is None:
        prio_preempt = False
        caching = False
    else:
        prio_preempt = ipar[I_PRIO_PREEMPT] == 1
        caching = ipar[I_CACHING] == 1
    (t, t_end_in, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    n, t_stop, ws, we, bs, bsh, jmax = c.n, c.t_stop, c.ws, c.we, c.bs, c.bsh, c.jmax
    async_on = c.async_on
    mns = ipar[I_MAX_NUM_SEQS]
    has_delay = ipar[I_HAS_DELAY] == 1
    dstate = dec.dstate
    slope = _context_slope(lat)
    # (deterministic steps, none shorter than a pure decode step's: a synchronous stretch is summed while
    # its clock is not past t_stop, `stretch.Stretch`; ``stop`` is just above it, past its next double)
    noise = noisy is not None and noisy
    stop = t_stop + (abs(t_stop) * 2.3e-16 + 1e-300) if slope >= 0.0 and not noise else np.inf
    while n_oth == 0 and n_run > 0 and n_sw == 0 and (n_wait == 0 or (n_run == mns and not has_delay
                                                                      and not prio_preempt)):
        n_d = dstate[0]
        ksum = dstate[1]
        next_a = req.arrival[nxt] if nxt < n else np.inf
        if n_d == 0:
            break   # (async: every running request finished, held)
        dp = _decode_step_time(lat, rec.dec_cost, n_d)
        # every running request is a lazy decoder, so the heap is not
        # empty: the stretch ends with the step of the next completion
        kmax = dec.hk[0] - S
        hb = 0   # (async) blocks of the requests held, which leave once the first step is scheduled
        if n_held > 0:
            if dec.ph[sph] > free:
                break
            for j in range(n_held):
                hb += req.blocks[batch.zl[j]]
            if n_wait > 0:
                kmax = 1   # (a seat frees up after the first step: a waiting request may be admitted)
        if async_on:   # an arrival is seen at the schedule after the step it came in
            plan = Stretch(kmax, we, next_a, dp, slope, n_d, ksum, S, dec.ph, sph, bs, free + hb, np.inf)
            t_prev = t_vis
        else:
            # (the earlier written out, not the builtin ``min``: see `arrivals._arrivals_during_step`)
            # (the clock is not past t_stop here: `_simulate` leaves a replica called to an earlier time as it is)
            plan = Stretch(kmax, next_a if next_a < we else we, np.inf, dp, slope, n_d, ksum, S, dec.ph, sph, bs,
                           free, stop)
            t_prev = t
        if noisy is not None and noisy:   # step by step, each step's own duration (s1: the KV weight itself)
            k0 = np.int64(acc5[4])   # (the run's steps so far: the next step's noise counter)
            kk, t_end, nb, s1, s2, t_last = _stretch_steps_noisy(t, t_prev, plan, lat, k0, rec.itl_v, rec.itl_w,
                                                                 n_itl, dstate[2])
        else:
            kk, t_end, nb, s1, s2, t_last = _stretch_steps(t, t_prev, plan)
        if kk == 0:
            break
        if t_end > t_stop:
            if not t_end < plan.stop:   # summed until it passed t_stop: its end bounded below
                left = kmax - kk
                # (the steps left fit if each decoder's blocks for them do, at most one a block_size
                # steps: the scan of the phases only where they may not)
                fit = left if n_d * _blocks_of(left + 1, bs, bsh) <= free - nb else _stretch_blocks(
                    dec.ph, _phase(sph - kk, bs, bsh), bs, free - nb, n_d)
                t_end = _end_bound(t_end, left, plan.limit, dp, fit)
            return t_end, Loop(t, t_end_in, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free,
                               reserved, S, sph, n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)
        n_held0 = n_held
        if full is not None and n_held > 0:   # (async: the full engine's)
            free, reserved, n_run, n_wait = _release_finished(req, batch.zl, n_held, cache, ipar, free, reserved,
                                                              n_run, n_wait, jmax, caching)
            n_held = 0
        t, free, S, sph, n_itl, acc5 = _account_stretch(dec, rec, ipar, lat, c, plan, (kk, t_end, nb, s1, s2),
                                                        (n_held0, hb), (n_run, n_wait), (t, free, S, sph, n_itl, acc5),
                                                        noisy)
        if full is not None and async_on:
            t_vis = t_last
            if dec.hs[0] > 0 and dec.hk[0] == S:
                # finished, held: the next stretch takes them in its first step
                n_held = _hold_decoders(t, S, dec, req, batch.zl, n_held, ipar[I_WARMUP], bs, bsh)
                if t_vis < next_a:
                    continue
            break   # an arrival to see, the free blocks or the horizon ended the stretch
        # the stretch's last step, as a fast step ends: arrivals during
        # it (they see it before its completions), then completions
        nxt, n_wait, reserved, acc5 = _arrivals_during_step(n, req, batch, ipar, t, nxt, n_run, n_wait, reserved,
                                                            acc5, ws, we)
        if dec.hk[0] != S:
            break   # the next arrival, the free blocks or the horizon ended the stretch
        free, reserved, n_run = _complete_decoders(t, S, free, reserved, n_run, dec, req, ipar, bs, bsh)
        if t >= next_a:
            break   # an arrival to ingest first
    return 0.0, Loop(t, t_end_in, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S,
                     sph, n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="llvm")
def _account_stretch(dec, rec, ipar, lat, c, plan, taken, holding, in_batch, cur, noisy):
    """The integrals, gaps and counters of a stretch taken (`_stretches`):
    ``plan`` (`stretch.Stretch`), ``taken`` (steps, end, blocks allocated,
    S1, S2: `stretch._stretch_steps`), ``holding`` (async: the requests held
    through its first step and their blocks), ``in_batch`` (running,
    waiting), ``cur`` (the clock, free blocks, fast steps, phase, gap
    entries, integrals) at its start. In closed form where the stretch lies
    inside the measurement window or outside it, else step by step. Returns
    ``cur`` at its end."""
    t, free, S, sph, n_itl, acc5 = cur
    kk, t_end, nb, s1, s2 = taken
    n_held0, hb = holding
    n_run, n_wait = in_batch
    ws, we, bs, bsh = c.ws, c.we, c.bs, c.bsh
    dp, slope, n_d, ksum = plan.d, plan.c_ctx, plan.n_d, plan.ksum
    nblk = ipar[I_NUM_GPU_BLOCKS]
    d0 = dp + slope * (ksum + n_d * (S + 1))   # step j of the stretch lasts d0 + j * dlt
    dlt = slope * n_d
    k0 = np.int64(acc5[4])   # (the run's steps before it: its first step's noise counter)
    a_occ, a_queue, a_kv, a_l, a_steps, a_max = acc5
    in_sys = n_run + n_wait
    nm_d = dec.dstate[2]
    if (ws <= t and t_end <= we) or t_end <= ws or t >= we:
        # the stretch lies inside the window or outside it
        x = t_end - t if noisy is not None and noisy else _elapsed(kk, d0, dlt)   # its duration, for the integrals
        used0 = nblk - free
        if n_held0 > 0:   # its first step: the held requests still in (`pipeline`), not in the system
            if noisy is not None and noisy:
                d0 = _step_noise(lat, d0, k0)   # (the first step's duration)
            if used0 + dec.ph[sph] + hb > a_max:
                a_max = used0 + dec.ph[sph] + hb
            if ws <= t and t_end <= we:
                a_occ += d0 * n_held0
                a_kv += d0 * hb
        free -= nb
        used = nblk - free
        if used > a_max:
            a_max = used
        a_steps += kk
        a_l += in_sys * x
        if ws <= t and t_end <= we:
            a_occ += x * n_run
            a_queue += x * n_wait
            a_kv += (used0 + nb) * x - (s1 if noisy is not None and noisy else _kv_weight(s1, s2, d0, dlt))
        if nm_d > 0:
            if noisy is not None and noisy:
                n_itl += kk   # (the gaps `_stretch_steps_noisy` wrote)
            elif _constant_in_step(lat):
                rec.gapw[n_d] += kk * nm_d
            else:
                for jj in range(kk):
                    n_itl = _gap_add(rec.itl_v, rec.itl_w, n_itl, d0 + jj * dlt, nm_d)
        S += kk
        sph -= _phase(kk, bs, bsh)
        if sph < 0:
            sph += bs
        t = t_end
    else:
        # a window edge falls inside: the same steps one by one
        # (`_account_step`'s operations, on the lazy decoders)
        for _j in range(kk):
            free -= dec.ph[sph]
            used = nblk - free
            d = dp + slope * (ksum + n_d * (S + 1))
            if noisy is not None and noisy:
                d = _step_noise(lat, d, a_steps)
            t_end = t + d
            held = n_held0 if _j == 0 else 0   # (the first step: the held requests still in)
            a_occ, a_queue, a_kv, a_l, a_steps, a_max = _account_step(
                (a_occ, a_queue, a_kv, a_l, a_steps, a_max), t, t_end, d, n_run + held, n_wait,
                used + (hb if held > 0 else 0), ws, we)
            a_l -= held * d   # (finished: not in the system)
            if nm_d > 0:
                n_itl = _gap_add(rec.itl_v, rec.itl_w, n_itl, t_end - t, nm_d)
            S += 1
            sph = sph - 1 if sph > 0 else bs - 1
            t = t_end
    return t, free, S, sph, n_itl, (a_occ, a_queue, a_kv, a_l, a_steps, a_max)


@njit_noalloc(inline="llvm")
def _noisy_stretches(req, batch, dec, cache, rec, ipar, lat, c, st, full):
    """`_stretches` with per-step noise: a copy of its own, inlined beside
    the deterministic one (a call would pass every array of the views)."""
    return _stretches(req, batch, dec, cache, rec, ipar, lat, c, st, full, True)


# ------------------------------------------------------------------------------
# The slow step

@njit_noalloc(inline="never")
def _materialise_decoders(req, dec, t, S, bs, bsh):
    """Give the lazy decoders their own token counts and blocks again (a slow
    step schedules request by request), and empty their aggregate."""
    for jj in range(dec.dstate[0]):
        r = dec.dmem[jj]
        req.k[r] = dec.koff[r] + S
        req.g[r] = dec.goff[r] + S
        req.blocks[r] = _blocks_of(req.k[r], bs, bsh)
        req.last_t[r] = t
        dec.dpos[r] = -1
    dec.dstate[0] = 0
    dec.dstate[1] = 0
    dec.dstate[2] = 0
    dec.hs[0] = 0
    for jj in range(bs):
        dec.ph[jj] = 0


@njit_noalloc(inline="llvm")
def _victim(run, n_run, key, keyed):
    """The position in ``run`` of the request to preempt: the last admitted,
    or with ``keyed`` the largest (key, arrival index)."""
    vpos = n_run - 1
    if keyed:
        for jj in range(n_run - 1):
            a = run[jj]
            b = run[vpos]
            if key[a] > key[b] or (key[a] == key[b] and a > b):
                vpos = jj
    return vpos


@njit_noalloc(inline="llvm")
def _remove_running(run, n_run, vpos):
    """Drop position ``vpos`` of ``run[:n_run]``, keeping the order; return the new count."""
    for jj in range(vpos, n_run - 1):
        run[jj] = run[jj + 1]
    return n_run - 1


@njit_noalloc(inline="llvm")
def _schedule_slow(req, batch, dec, swap, cache, rec, ipar, c, st, counted, full):
    """Schedule a slow step: the lazy decoders materialised (``counted``: a
    counted block pool counts them first), the running list compacted, then
    vLLM's phases: a static batch (static batching), phase 0 (active
    priority preemption), the running requests in admission order with
    preemption (phase 1), the swapped ones (phase 2), then admission of
    waiting requests (phase 3). Under async scheduling, the tokens of the
    step that ended at ``t`` are still in flight (``lag``, computed here; for
    vLLM they are not cacheable yet). Return whether anything runs, the step's context
    tokens, and the state (free blocks, waiting, running, swapped, swap
    blocks used, blocks moved, and the batch composition updated)."""
    if full is None:
        static = False
        prio_preempt = False
        swap_on = False
    else:
        static = ipar[I_STATIC] == 1
        prio_preempt = ipar[I_PRIO_PREEMPT] == 1
        swap_on = ipar[I_SWAP] == 1
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    bs, bsh, jmax = c.bs, c.bsh, c.jmax
    lag = c.async_on and t_vis < t   # (async: the tokens of the step that ended are in flight)
    if counted and c.async_on:
        _count_lazy(dec, S, cache.pool, bs)
    _materialise_decoders(req, dec, t, S, bs, bsh)
    rl = _compact_run(batch.run, rl, req.status)
    mbt = ipar[I_MAX_BATCHED_TOKENS]
    if static and n_run == 0:
        free, n_wait, n_run = _form_static_batch(req, batch, ipar, free, n_wait, n_run, bs, bsh)
    if prio_preempt and n_wait > 0:
        free, n_wait, n_run = _preempt_for_waiting(req, batch, cache, ipar, free, n_wait, n_run, bs, bsh, jmax,
                                                   full)
    st = Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
              n_pf, n_itl, swap_used, pending_swap, acc5)
    budget, preempted, st = _schedule_running(req, batch, swap, cache, rec, ipar, c, st, mbt, lag, full)
    if swap_on and not preempted:
        budget, st = _resume_swapped(req, batch, swap, ipar, c, st, budget)
    if not static and not preempted and st.n_sw == 0:
        budget, st = _admit_waiting(req, batch, cache, ipar, c, st, budget, lag, full)
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    n_dec, n_pf, n_ctx = _composition(req, batch, n_run, static)
    rl = n_run
    return n_dec + n_pf > 0, n_ctx, Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held,
                                         free, reserved, S, sph, n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc
def _form_static_batch(req, batch, ipar, free, n_wait, n_run, bs, bsh):
    """Static batching: form a batch, with the KV blocks of every member's
    whole output reserved up front."""
    budget = ipar[I_MAX_BATCHED_TOKENS]
    chunked = ipar[I_CHUNKED] == 1
    policy = ipar[I_POLICY]
    while n_wait > 0 and n_run < ipar[I_MAX_NUM_SEQS]:
        w = _q_peek(batch.q, batch.qs, req.key, policy, req.status)
        need_blk = _blocks_of(req.prompt[w] + req.output[w] - 1, bs, bsh)
        if need_blk > free:
            break
        if not chunked and req.prompt[w] > budget:
            break
        _start_running(w, need_blk, batch.q, batch.qs, req.key, policy, req.status, req.ever, req.blocks)
        n_wait -= 1
        free -= need_blk
        batch.run[n_run] = w
        n_run += 1
        if not chunked:
            budget -= req.prompt[w]
    return free, n_wait, n_run


@njit_noalloc
def _preempt_for_waiting(req, batch, cache, ipar, free, n_wait, n_run, bs, bsh, jmax, full):
    """Phase 0, active priority preemption: while the waiting head w could
    not be scheduled (a seat and the blocks of its first chunk) and the
    victim's key is strictly larger than w's, preempt the victim by
    recompute (nothing is scheduled yet: nothing to refund)."""
    if full is None:
        caching = False
        hashing = False
    else:
        hashing = ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1
        caching = ipar[I_CACHING] == 1 and not hashing
    mbt = ipar[I_MAX_BATCHED_TOKENS]
    w = _q_peek(batch.q, batch.qs, req.key, ipar[I_POLICY], req.status)
    while n_run > 0:
        vpos = _victim(batch.run, n_run, req.key, True)
        v = batch.run[vpos]
        if not req.key[v] > req.key[w]:
            break
        # could w be scheduled? (re-evaluated, lookup included, after each preemption)
        h_w = 0
        cap_w = free
        if caching:
            h_w = _lookup(w, req.pgrp, cache, jmax)
            cap_w = free + cache.cst[2] - _evictable_hits(w, h_w, req.pgrp, cache, jmax)
        elif hashing:
            if cache.pool.pst[1] == 1:   # (a counted pool has no hits: `block_pool`)
                h_w = _pool_hits(w, req, cache.pool, bs, jmax)
                cap_w = free - _pool_queued_hits(w, h_w, req, cache.pool, bs, jmax)
        need_w = req.prompt[w] + req.g[w] - h_w * bs
        c_w = min(need_w, mbt) if ipar[I_CHUNKED] == 1 else need_w
        if n_run < ipar[I_MAX_NUM_SEQS] and _admission_blocks(need_w, _blocks_of(c_w, bs, bsh), ipar, bs,
                                                              bsh) <= cap_w:
            break
        if hashing:
            _preempted(v, req, batch.run, n_run, cache.pool, bs, jmax, ipar[I_ASYNC] == 1)
        free = _release(v, free, req, cache, jmax, caching, hashing)
        req.k[v] = 0
        req.npre[v] += 1
        req.status[v] = ST_WAITING
        n_run = _remove_running(batch.run, n_run, vpos)
        n_wait += 1
        _q_push(batch.q, batch.qs, req.key, ipar[I_POLICY], v, True)
    return free, n_wait, n_run


@njit_noalloc(inline="llvm")
def _schedule_running(req, batch, swap, cache, rec, ipar, c, st, budget, lag, full):
    """Phase 1: the running requests in admission order, each its need cut to
    the budget; where its new blocks do not fit, preempt (by swap or
    recompute) until they do, or preempt itself. Return the budget left,
    whether anything was preempted, and the state (free blocks, waiting,
    running, swapped, swap blocks used, blocks moved updated)."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    bs, bsh, jmax = c.bs, c.bsh, c.jmax
    if full is None:
        static = False
        prio_preempt = False
        swap_on = False
        caching = False
        hashing = False
    else:
        static = ipar[I_STATIC] == 1
        prio_preempt = ipar[I_PRIO_PREEMPT] == 1
        swap_on = ipar[I_SWAP] == 1
        hashing = ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1
        caching = ipar[I_CACHING] == 1 and not hashing
    async_on = c.async_on
    policy = ipar[I_POLICY]
    # The victim of a preemption: the largest (key, index) for priority, and
    # for sjf with active priority preemption; else the last admitted.
    keyed = policy == POLICY_PRIORITY or (policy == POLICY_SJF and prio_preempt)
    run = batch.run
    preempted = False
    kk = 0
    while kk < n_run and budget > 0:
        r = run[kk]
        if static and req.g[r] == req.output[r]:
            req.sched[r] = 1   # padding token of a finished batch member
            budget -= 1
            kk += 1
            continue
        if async_on and req.g[r] == req.output[r]:
            kk += 1   # its last token is in flight: not scheduled again (it stays, a possible victim)
            continue
        s = min(req.prompt[r] + req.g[r] - req.k[r], budget)
        new_blk = _blocks_of(req.k[r] + s, bs, bsh) - req.blocks[r]
        self_preempted = False
        while new_blk > free + cache.cst[2]:   # free + evictable (0 without caching)
            vpos = _victim(run, n_run, req.key, keyed)
            v = run[vpos]
            if hashing:
                _preempted(v, req, run, n_run, cache.pool, bs, jmax, async_on)
            if vpos < kk and req.sched[v] > 0:
                # (one skipped with its last token in flight is not "scheduled": vLLM then
                # moves no cursor, so the request after the victim waits for the next step)
                budget += req.sched[v]
                kk -= 1
            req.sched[v] = 0
            # (with caching, its refunded tokens' blocks are private: all released)
            free = _release(v, free, req, cache, jmax, caching, hashing)
            req.npre[v] += 1
            m_v = _blocks_of(req.k[v], bs, bsh)
            if swap_on and m_v <= ipar[I_SWAP_BLOCKS] - swap_used:
                # by swap: k and g kept, m_v blocks moved out (charged to a step)
                swap_used += m_v
                if swap_used > rec.acc[A_MAX_SWAP]:
                    rec.acc[A_MAX_SWAP] = swap_used
                pending_swap += m_v
                swap.nswap[v] += 1
                swap.swapped_since[v] = t
                req.status[v] = ST_SWAPPED
                _heap_push(swap.sq, swap.sqs, swap.skey, v)
                n_sw += 1
            elif async_on and req.g[v] == req.output[v]:
                # held, finished: vLLM preempts it to the waiting queue, where its
                # last token reaches it (counted waiting until `_release_finished`)
                req.status[v] = ST_WAITING
                n_wait += 1
            else:
                req.k[v] = 0
                req.status[v] = ST_WAITING
                n_wait += 1
                _q_push(batch.q, batch.qs, req.key, policy, v, True)
            n_run = _remove_running(run, n_run, vpos)
            preempted = True
            if v == r:
                self_preempted = True
                break
        if self_preempted:
            break
        if hashing:
            if cache.pool.pst[1] == 1:
                if new_blk > 0:
                    _pool_take(r, new_blk, req, cache.pool)
                    free -= new_blk
                _pool_cache_full(r, min(req.k[r] + s, _known_tokens(req, r, t, lag)), req, cache.pool, bs, jmax)
            else:   # (a counted pool: `block_pool`)
                if new_blk > 0:
                    req.blocks[r] += new_blk
                    free -= new_blk
                if async_on:
                    _count_cached(r, min(req.k[r] + s, _known_tokens(req, r, t, lag)), cache.pool, bs)
        elif new_blk > 0:
            req.blocks[r] += new_blk
            if caching:
                free = _take_blocks(new_blk, free, cache)
                cache.private[r] += new_blk
            else:
                free -= new_blk
        req.sched[r] = s
        budget -= s
        kk += 1
    return budget, preempted, Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free,
                                   reserved, S, sph, n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc
def _resume_swapped(req, batch, swap, ipar, c, st, budget):
    """Phase 2: resume swapped requests (head first) before any new prefill.
    Return the budget left and the state."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    bs, bsh = c.bs, c.bsh
    chunked = ipar[I_CHUNKED] == 1
    while n_sw > 0 and budget > 0 and n_run < ipar[I_MAX_NUM_SEQS]:
        w = swap.sq[0]
        need = req.prompt[w] + req.g[w] - req.k[w]
        if chunked:
            s = min(need, budget)
        elif need > budget:
            break
        else:
            s = need
        nb = _blocks_of(req.k[w] + s, bs, bsh)
        if nb > free:
            break
        _heap_pop(swap.sq, swap.sqs, swap.skey)
        n_sw -= 1
        m_w = _blocks_of(req.k[w], bs, bsh)
        swap_used -= m_w
        pending_swap += m_w
        swap.swapped_s[w] += t - swap.swapped_since[w]
        req.status[w] = ST_RUNNING
        req.blocks[w] = nb
        free -= nb
        req.sched[w] = s
        budget -= s
        batch.run[n_run] = w
        n_run += 1
    return budget, Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S,
                        sph, n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc(inline="llvm")
def _admit_waiting(req, batch, cache, ipar, c, st, budget, lag, full):
    """Phase 3: admit waiting requests in queue order while a seat, the
    budget and the blocks of the first chunk (after prefix-cache hits) allow.
    Return the budget left and the state."""
    if full is None:
        caching = False
        hashing = False
    else:
        hashing = ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1
        caching = ipar[I_CACHING] == 1 and not hashing
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    bs, bsh, jmax = c.bs, c.bsh, c.jmax
    policy = ipar[I_POLICY]
    chunked = ipar[I_CHUNKED] == 1
    while n_wait > 0 and budget > 0 and n_run < ipar[I_MAX_NUM_SEQS]:
        w = _q_peek(batch.q, batch.qs, req.key, policy, req.status)
        h_w = 0
        if caching:
            h_w = _lookup(w, req.pgrp, cache, jmax)
        elif hashing:
            if cache.pool.pst[1] == 1:   # (a counted pool has no hits: `block_pool`)
                h_w = _pool_hits(w, req, cache.pool, bs, jmax)
        # (KV that arrived from elsewhere, `_schedule_fast`: a disaggregated decode side's, which covers
        # its hits, h_w * bs <= P - 1; else 0)
        kw = max(h_w * bs, 0 if caching else req.k[w])
        s = _first_chunk(req.prompt[w] + req.g[w] - kw, budget, chunked)
        if s < 0:
            break
        nb = _blocks_of(kw + s, bs, bsh) - h_w
        # (with the full-input gate, the blocks of the whole input beyond its hits)
        nb_gate = _admission_blocks(req.prompt[w] + req.g[w] - h_w * bs, nb, ipar, bs, bsh)
        if caching:
            if nb_gate > free + cache.cst[2] - _evictable_hits(w, h_w, req.pgrp, cache, jmax):
                break
        elif hashing:
            if nb_gate > free - (_pool_queued_hits(w, h_w, req, cache.pool, bs, jmax) if h_w > 0 else 0):
                break
        elif nb_gate > free:
            break
        _q_pop(batch.q, batch.qs, req.key, policy)
        n_wait -= 1
        req.status[w] = ST_RUNNING
        if caching:
            if not req.ever[w]:
                cache.ctok[w] = h_w * bs       # at its first admission
            _claim_hits(w, h_w, req.pgrp, cache, jmax)
            req.k[w] = h_w * bs
            free = _take_blocks(nb, free, cache)
            cache.private[w] = nb
            req.blocks[w] = h_w + nb
        elif hashing:
            if cache.pool.pst[1] == 1:
                if not req.ever[w]:
                    cache.ctok[w] = h_w * bs       # at its first admission
                free -= _pool_claim(w, h_w, req, cache.pool, bs, jmax)
                req.k[w] = kw
                _pool_take(w, nb, req, cache.pool)
                free -= nb
                _pool_cache_full(w, min(req.k[w] + s, _known_tokens(req, w, t, lag)), req, cache.pool, bs, jmax)
            else:   # (a counted pool: no hits, `block_pool`)
                req.blocks[w] = nb
                free -= nb
                if c.async_on:
                    _count_cached(w, min(kw + s, _known_tokens(req, w, t, lag)), cache.pool, bs)
        else:
            req.blocks[w] = nb
            free -= nb
        req.ever[w] = 1
        req.sched[w] = s
        budget -= s
        batch.run[n_run] = w
        n_run += 1
    return budget, Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S,
                        sph, n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc
def _prefill_work(req, lst, m, ipar, full):
    """What the roofline reads of a step's prefill chunks (`latency._roofline_time`):
    twice their causal query-key pairs, sum of s (2 k + s + 1) over chunks of
    s tokens after k, and their number; over ``lst[:m]``, classified as
    `_composition` does (called only when the step has prefill tokens)."""
    static = False if full is None else ipar[I_STATIC] == 1
    pairs2 = 0
    n_pfs = 0
    for jj in range(m):
        r = lst[jj]
        s = req.sched[r]
        if s == 0:
            continue
        if s == 1 and req.g[r] >= 1 and (req.k[r] == req.prompt[r] + req.g[r] - 1
                                         or (static and req.g[r] == req.output[r])):
            continue
        pairs2 += s * (2 * req.k[r] + s + 1)
        n_pfs += 1
    return pairs2, n_pfs


@njit_noalloc(inline="llvm")
def _composition(req, batch, n_run, static):
    """The batch composition of a slow step: (decoders, prefill tokens, context tokens)."""
    n_dec = 0
    n_pf = 0
    n_ctx = 0
    for jj in range(n_run):
        r = batch.run[jj]
        s = req.sched[r]
        if s == 0:
            continue
        if s == 1 and req.g[r] >= 1 and (req.k[r] == req.prompt[r] + req.g[r] - 1
                                         or (static and req.g[r] == req.output[r])):
            n_dec += 1
        else:
            n_pf += s
        n_ctx += req.k[r] + s
    return n_dec, n_pf, n_ctx


@njit_noalloc(inline="llvm")
def _end_slow_step(req, batch, dec, cache, rec, ipar, c, st, full):
    """The end of a slow step at ``t_end``: token emission (and, with prefix
    caching, registration of full blocks), completions and their blocks'
    release; decoders that emitted become lazy, the rest are "others".
    Return the state (free blocks, reserved tokens, running, run length,
    others, gap entries, requests held updated). With async scheduling, the
    requests that finish are held, in the running list (`pipeline`)."""
    (t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    bs, bsh, jmax = c.bs, c.bsh, c.jmax
    if full is None:
        static = False
        caching = False
        hashing = False
    else:
        static = ipar[I_STATIC] == 1
        hashing = ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1
        caching = ipar[I_CACHING] == 1 and not hashing
    async_on = c.async_on
    warmup = ipar[I_WARMUP]
    run = batch.run
    for jj in range(n_run):
        r = run[jj]
        s = req.sched[r]
        if s == 0:
            continue
        req.sched[r] = 0
        if static and req.g[r] == req.output[r]:
            continue
        req.k[r] += s
        if caching and cache.fpre[r] > 0:
            _register(r, req.k[r] - s, req.k[r], bs, req.pgrp, cache, jmax)
        if req.k[r] == req.prompt[r] + req.g[r]:
            req.g[r] += 1
            if req.g[r] == 1:
                req.first_t[r] = t_end
            elif r >= warmup:
                n_itl = _gap_add(rec.itl_v, rec.itl_w, n_itl, t_end - req.last_t[r], 1)
            req.last_t[r] = t_end
        if req.g[r] == req.output[r] and not static:
            req.finish_t[r] = t_end
            if async_on:
                batch.zl[n_held] = r
                n_held += 1
            else:
                req.status[r] = ST_COMPLETED
    if static:
        _end_static_batch(req, run, n_run, t_end)
    m = 0
    n_oth = 0
    for jj in range(n_run):
        r = run[jj]
        if req.status[r] == ST_COMPLETED:
            if hashing and req.npre[r] > 0:
                cache.pool.pst[3] -= 1   # (one fewer ever preempted in the system)
            free = _release(r, free, req, cache, jmax, caching, hashing)
            if ipar[I_ADMISSION] == ADMISSION_KV_RESERVATION:
                reserved -= req.prompt[r] + req.output[r]
        else:
            run[m] = r
            m += 1
            if async_on and req.g[r] == req.output[r]:
                continue   # finished, held: neither lazy nor scheduled again
            # decoders that emitted at t_end become lazy; the rest are "others"
            if (not static and not caching and not (hashing and cache.pool.pst[1] == 1)
                    and req.last_t[r] == t_end and req.k[r] == req.prompt[r] + req.g[r] - 1):
                _d_add(r, req.k[r], req.g[r], S, dec, req.output, warmup, bs, bsh)
            else:
                batch.oth[n_oth] = r
                n_oth += 1
    n_run, rl = m, m
    return Loop(t, t_end, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec,
           n_pf, n_itl, swap_used, pending_swap, acc5)


@njit_noalloc
def _end_static_batch(req, run, n_run, t_end):
    """Static batching: the batch completes together, when its last member has."""
    for jj in range(n_run):
        if req.g[run[jj]] < req.output[run[jj]]:
            return
    for jj in range(n_run):
        r = run[jj]
        req.status[r] = ST_COMPLETED
        req.finish_t[r] = t_end


# ------------------------------------------------------------------------------
# Handing a request to a paused replica (a router's dispatch)

@njit_noalloc(entry=True)
def _hand(n, arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, wi, wf, full,
          a, p, o, c, q, grp, lp):
    """Hand one request to a paused replica: it becomes request
    ``RI_N_KNOWN`` of the stream arrays (capacity ``n``), set up as
    `_init_replica` sets up a known one. O(1): the layout's dimensions are
    the replica's (`_layout_dims`), its workspace exactly `_ws_need_handed`'s size.

    Parameters
    ----------
    n, arrival .. plen, ipar, fpar, wi, wf, full : as `_simulate`'s
        The replica, set up with `STEP_INIT` and `STEP_EMPTY` (or with
        room left), paused at a time at or before ``a``.
    a, p, o, c, q, grp, lp : float, int
        The request: arrival time (not before the last one handed), prompt
        and output lengths, priority class, SJF key, prefix group (-1: none),
        prefix length.

    Returns
    -------
    int
        Its index in the replica's stream, or -1 if the replica is full,
        -3 if ``a`` precedes the last request's arrival.
    """
    ri = wi[wi.size - N_RI:]
    i = ri[RI_N_KNOWN]
    if i >= n:
        return -1
    wf[wf.size - N_RF + RF_STRETCH_END] = -np.inf   # (a stretch planned may now end at this arrival)
    # at or past the horizon (a fleet's routing latency): never taken in, as only arrivals before it exist
    # (a step in flight at the horizon would otherwise take it in before the run stops); its arrival inf,
    # it is unfinished (it came to the fleet before the horizon: `cluster._reduce_fleet`)
    late = ipar[I_HAS_HORIZON] == 1 and a >= fpar[F_HORIZON]
    if late:
        a = np.inf
    if i > 0 and a < arrival[i - 1]:
        return -3
    arrival[i], prompt[i], output[i], prio[i], sjfk[i], pgrp[i], plen[i] = a, p, o, c, q, grp, lp
    bs = ipar[I_BLOCK_SIZE]
    if full is None:   # (the common engine: its columns written in place, no views carved; a fleet hands often)
        _hand_common(n, ipar, fpar, wi, wf, i, a, c, q)
        if late:
            wi[WI_STATUS * n + i] = ST_UNFINISHED
        ri[RI_N_KNOWN] = i + 1
        return i
    dims = (n, bs, ri[RI_DIM_CAP], ri[RI_DIM_NCNT], ri[RI_DIM_NHELD], ri[RI_DIM_NITL], ri[RI_DIM_NBP],
            ri[RI_DIM_NBT])
    stream = Stream(arrival, prompt, output, prio, sjfk, pgrp, plen)
    req, _batch, _dec, swap, cache, _rec, _sc = _carve(stream, dims, wi, wf)
    req.status[i] = ST_PENDING
    req.k[i], req.g[i], req.blocks[i], req.npre[i], req.sched[i], req.ever[i] = 0, 0, 0, 0, 0, 0
    req.first_t[i], req.last_t[i], req.finish_t[i] = np.nan, np.nan, np.nan
    policy = ipar[I_POLICY]
    has_aging = ipar[I_HAS_AGING] == 1
    if policy != POLICY_FCFS or has_aging or ipar[I_PRIO_PREEMPT] == 1:   # (as `_init_requests`)
        req.key[i] = float(c) if policy == POLICY_PRIORITY else float(q)
        if has_aging:
            req.key[i] = req.key[i] + a / fpar[F_AGING]
    if full is not None:   # (as `_init_full_engine`)
        swap.nswap[i], cache.ctok[i], swap.swapped_s[i] = 0, 0, 0.0
        swap.skey[i] = req.key[i] if policy != POLICY_FCFS else float(i)
        cache.fpre[i] = lp // bs if ipar[I_CACHING] == 1 and grp >= 0 else 0
        if i == 0:
            cache.hoff[0] = 0
        cache.hoff[i + 1] = cache.hoff[i] + cache.fpre[i]
        cache.private[i], cache.nent[i] = 0, 0
        if ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1:   # (as `block_pool._pool_init`: its block list)
            cache.pool.boff[i + 1] = cache.pool.boff[i] + _list_capacity(p, o, ipar[I_NUM_GPU_BLOCKS], bs)
            cache.pool.ncached[i] = 0
    if late:
        req.status[i] = ST_UNFINISHED
    ri[RI_N_KNOWN] = i + 1
    return i


@njit_noalloc
def _hand_common(n, ipar, fpar, wi, wf, i, a, c, q):
    """`_hand`'s set-up of request ``i`` (arrival ``a``, priority class
    ``c``, SJF key ``q``) for the common engine, in the workspace's columns
    themselves: the same entries as through `_carve`'s views, at the
    offsets of the layout (`workspace._sched_offset`, `_key_offset`)."""
    ri = wi[wi.size - N_RI:]
    cap, nitl = ri[RI_DIM_CAP], ri[RI_DIM_NITL]
    wi[WI_STATUS * n + i] = ST_PENDING
    wi[WI_K * n + i] = 0
    wi[WI_G * n + i] = 0
    wi[WI_BLOCKS * n + i] = 0
    wi[WI_NPRE * n + i] = 0
    o = _sched_offset(n, ipar[I_BLOCK_SIZE], cap, ri[RI_DIM_NCNT], ri[RI_DIM_NHELD], nitl, ri[RI_DIM_NBP],
                      ri[RI_DIM_NBT])
    wi[o + i] = 0       # sched
    wi[o + n + i] = 0   # ever (the segment after it, n entries)
    wf[WF_FIRST * n + i] = np.nan
    wf[WF_LAST * n + i] = np.nan
    wf[WF_FINISH * n + i] = np.nan
    policy = ipar[I_POLICY]
    has_aging = ipar[I_HAS_AGING] == 1
    if policy != POLICY_FCFS or has_aging or ipar[I_PRIO_PREEMPT] == 1:   # (as `_init_requests`)
        o = _key_offset(n, cap, nitl)
        wf[o + i] = float(c) if policy == POLICY_PRIORITY else float(q)
        if has_aging:
            wf[o + i] = wf[o + i] + a / fpar[F_AGING]


@njit_noalloc(inline="never")
def _static_decode(req, batch, rec, ipar, fpar, lat, c, st, used):
    """Static batching: the steps of a batch whose members all decode, in
    O(1) a step (amortised) instead of a slow step's passes over the batch.

    Entered between steps at ``t`` (before the arrivals at ``t`` are
    ingested). It applies when every member has its first token and either
    decodes (``k = P + g - 1``, its last token at ``t``) or pads (``g = O``),
    and the budget holds them all (``n_run <= max_num_batched_tokens``):
    then every step until the batch's end schedules each member one token
    (``n_decode = n_run``, no prefill), only the context grows (by the
    members still generating), and nothing but the clock, the arrivals,
    abandonment and the run-level integrals changes outside the batch (no
    block is taken or released: static batching reserved them all). The
    steps are the slow step's, term for term: ingest and abandonment at
    ``t``, `latency._step_time`, `accounting._account_step`, the arrivals
    during the step, then the tokens: one gap entry per step for the
    measured members still generating, whose gaps all equal ``t_end - t``
    (the slow step's `_gap_add` calls would merge into the same entry). A
    member's own counts and times are written when it emits its last token
    (the members sorted by tokens left, in ``batch.oth``) or when the run
    ends. It ends before the batch's last step (which completes the batch:
    the slow step takes it), before a step that would end after ``t_stop``
    or start at or after the horizon (the engine loop then does what it
    does there), so that it leaves the replica between steps at ``t``,
    exactly as the slow steps would have. Returns the state (clock, start
    of the last step, next arrival, next request to check for abandonment,
    waiting, reserved tokens, gap entries, accumulators updated); ``batch.oth``
    holds the running list again.
    """
    if st.n_run == 0 or st.n_run > ipar[I_MAX_BATCHED_TOKENS]:
        return st
    (t, t_end_in, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph, n_dec, n_pf,
     n_itl, swap_used, pending_swap, acc5) = st
    n, t_stop, ws, we = c.n, c.t_stop, c.ws, c.we
    run = batch.run
    oth = batch.oth
    warmup = ipar[I_WARMUP]
    n_gen = 0    # members still generating, into oth
    n_ctx = 0    # the step's context tokens
    c_meas = 0   # measured members still generating
    for jj in range(n_run):
        r = run[jj]
        if req.g[r] < 1:
            return st
        if req.g[r] < req.output[r]:
            if req.k[r] != req.prompt[r] + req.g[r] - 1 or req.last_t[r] != t:
                return st
            oth[n_gen] = r
            n_gen += 1
            if r >= warmup:
                c_meas += 1
        n_ctx += req.k[r] + 1
    if n_gen == 0:   # (not between steps: a batch of padding alone has completed)
        return st
    # the generating members by tokens left (insertion sort: at most max_num_seqs)
    for a in range(1, n_gen):
        r = oth[a]
        left = req.output[r] - req.g[r]
        b = a - 1
        while b >= 0 and req.output[oth[b]] - req.g[oth[b]] > left:
            oth[b + 1] = oth[b]
            b -= 1
        oth[b + 1] = r
    last = req.output[oth[n_gen - 1]] - req.g[oth[n_gen - 1]]   # the batch's steps left
    has_h = ipar[I_HAS_HORIZON] == 1
    horizon = fpar[F_HORIZON]
    c_gen = n_gen   # members still generating
    p = 0      # oth[p:n_gen]: still generating
    j = 0      # steps taken here
    while j + 1 < last:
        if (has_h and t >= horizon) or t >= t_stop:
            break
        d = _step_time(lat, rec.dec_cost, n_run, 0, n_ctx, 0, acc5[4], 0, 0, 1)   # (the full engine only)
        t_end = t + d
        if t_end > t_stop:
            break
        nxt, n_wait, reserved = _ingest(n, req, batch, ipar, t, nxt, n_run + n_wait, n_wait, reserved)
        drop_ptr, n_wait, reserved = _abandon(req, ipar, fpar, t, drop_ptr, nxt, n_wait, reserved)
        acc5 = _account_step(acc5, t, t_end, d, n_run, n_wait, used, ws, we)
        nxt, n_wait, reserved, acc5 = _arrivals_during_step(n, req, batch, ipar, t_end, nxt, n_run, n_wait, reserved,
                                                            acc5, ws, we)
        j += 1
        if c_meas > 0:
            n_itl = _gap_add(rec.itl_v, rec.itl_w, n_itl, t_end - t, c_meas)
        n_ctx += c_gen
        while p < n_gen and req.output[oth[p]] - req.g[oth[p]] == j:   # its last token
            r = oth[p]
            req.k[r] += j
            req.g[r] += j
            req.last_t[r] = t_end
            c_gen -= 1
            if r >= warmup:
                c_meas -= 1
            p += 1
        t_vis = t
        t = t_end
    if j > 0:
        for q in range(p, n_gen):
            r = oth[q]
            req.k[r] += j
            req.g[r] += j
            req.last_t[r] = t
    for jj in range(n_run):
        oth[jj] = run[jj]
    return Loop(t, t_end_in, t_vis, nxt, drop_ptr, n_wait, n_run, rl, n_oth, n_sw, n_held, free, reserved, S, sph,
           n_dec, n_pf, n_itl, swap_used, pending_swap, acc5)
