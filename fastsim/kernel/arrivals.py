"""Arrivals and abandonment: what happens to a request when it arrives
(rejected as never fitting, rejected by admission control, or queued), at a
step's start or during a step, and to a waiting request that gives up; and,
in a closed loop, when a request is sent at all (`_release_seats`), and
with multi-turn sessions, when and what each turn sends (`_session_sends`).
"""

from __future__ import annotations

import numpy as np

from .._numba_options import njit_noalloc
from .layout import (ADMISSION_KV_RESERVATION, ADMISSION_QUEUE_LIMIT, ARRIVAL_CLOSED, F_HORIZON, F_MAX_DELAY,
                     I_ADMISSION, I_ARRIVAL_KIND, I_BLOCK_SIZE, I_CHUNKED, I_HAS_DELAY, I_HAS_HORIZON,
                     I_MAX_BATCHED_TOKENS, I_MAX_CONCURRENCY, I_MAX_MODEL_LEN, I_MAX_NUM_SEQS, I_MAX_WAITING,
                     I_NUM_GPU_BLOCKS, I_POLICY, I_SESSIONS, POLICY_PRIORITY, SESSIONS_USERS, ST_COMPLETED,
                     ST_DROPPED, ST_REJECTED_ADMISSION, ST_REJECTED_TOO_LONG, ST_RUNNING, ST_SWAPPED, ST_UNFINISHED,
                     ST_WAITING)
from .waiting_queue import _q_push


@njit_noalloc(inline="llvm")
def _arrival_status(p, o, ipar, in_system, reserved):
    """What ingestion does with an arrival (``docs/engine-model.md``, in order):
    reject it as never fitting, reject it by admission control, or queue it."""
    bs = ipar[I_BLOCK_SIZE]
    mml = ipar[I_MAX_MODEL_LEN]
    if ((mml > 0 and p + o > mml)
            or p + o - 1 > ipar[I_NUM_GPU_BLOCKS] * bs   # (more blocks than the cache: no division)
            or (ipar[I_CHUNKED] == 0 and p + o - 1 > ipar[I_MAX_BATCHED_TOKENS])):
        return ST_REJECTED_TOO_LONG
    admission = ipar[I_ADMISSION]
    if admission == ADMISSION_QUEUE_LIMIT and in_system >= ipar[I_MAX_NUM_SEQS] + ipar[I_MAX_WAITING]:
        return ST_REJECTED_ADMISSION
    if admission == ADMISSION_KV_RESERVATION and reserved + p + o > ipar[I_NUM_GPU_BLOCKS] * bs:
        return ST_REJECTED_ADMISSION
    return ST_WAITING


@njit_noalloc(inline="llvm")
def _ingest(n, req, batch, ipar, t, nxt, in_system, n_wait, reserved):
    """Ingest the arrivals up to and including ``t`` (the engine idle or at a
    step's start), of the first ``n`` requests: reject them or queue them.
    Return the updated (next arrival, waiting, reserved tokens)."""
    kv_reservation = ipar[I_ADMISSION] == ADMISSION_KV_RESERVATION
    while nxt < n and req.arrival[nxt] <= t:
        i = nxt
        nxt += 1
        req.status[i] = _arrival_status(req.prompt[i], req.output[i], ipar, in_system, reserved)
        if req.status[i] == ST_WAITING:
            if kv_reservation:
                reserved += req.prompt[i] + req.output[i]
            n_wait += 1
            in_system += 1
            _q_push(batch.q, batch.qs, req.key, ipar[I_POLICY], i, False)
    return nxt, n_wait, reserved


@njit_noalloc
def _unseen_at_horizon(n, req, horizon, t, nxt, acc):
    """Async scheduling, the run stopping at the horizon at ``t``: the
    arrivals before the horizon that no schedule has seen yet (they came
    during the last steps) are in the system, unfinished, from their
    arrival to ``t`` (the in-system integral counts that time; they never
    queued). Return the updated (next arrival, accumulators)."""
    a_occ, a_queue, a_kv, a_l, a_steps, a_max = acc
    while nxt < n and req.arrival[nxt] < horizon:
        req.status[nxt] = ST_UNFINISHED
        a_l += t - req.arrival[nxt]
        nxt += 1
    return nxt, (a_occ, a_queue, a_kv, a_l, a_steps, a_max)


@njit_noalloc(inline="llvm")
def _arrivals_during_step(n, req, batch, ipar, t_end, nxt, n_in_step, n_wait, reserved, acc, ws, we):
    """Ingest the arrivals during a step ending at ``t_end``: they see it
    before its completions (``n_in_step`` requests were in it). They are in
    the system (waiting) since their arrival, not since t_end: the
    accumulators ``acc`` (`accounting._account_step`'s, window [ws, we])
    count that time. Return the updated (next arrival, waiting, reserved
    tokens, accumulators)."""
    if not (nxt < n and req.arrival[nxt] < t_end):
        return nxt, n_wait, reserved, acc
    a_occ, a_queue, a_kv, a_l, a_steps, a_max = acc
    kv_reservation = ipar[I_ADMISSION] == ADMISSION_KV_RESERVATION
    while nxt < n and req.arrival[nxt] < t_end:
        i = nxt
        nxt += 1
        req.status[i] = _arrival_status(req.prompt[i], req.output[i], ipar, n_in_step + n_wait, reserved)
        if req.status[i] == ST_WAITING:
            if kv_reservation:
                reserved += req.prompt[i] + req.output[i]
            n_wait += 1
            _q_push(batch.q, batch.qs, req.key, ipar[I_POLICY], i, False)
            a_l += t_end - req.arrival[i]
            # (not the builtin ``min`` of two floats: compiled by both the compile helper and this process,
            # its two copies made the engine's code differ with the helper, benchmarks/HISTORY.md, stop 56)
            part = (t_end if t_end < we else we) - max(req.arrival[i], ws)
            if part > 0.0:
                a_queue += part
    return nxt, n_wait, reserved, (a_occ, a_queue, a_kv, a_l, a_steps, a_max)


@njit_noalloc(inline="llvm")
def _abandon(req, ipar, fpar, t, drop_ptr, nxt, n_wait, reserved):
    """Abandonment, observed at a step's start: a request that has waited
    ``max_queue_delay_s`` without ever being scheduled leaves. Return the
    updated (next request to check, waiting, reserved tokens)."""
    if ipar[I_HAS_DELAY] != 1:
        return drop_ptr, n_wait, reserved
    max_delay = fpar[F_MAX_DELAY]
    while drop_ptr < nxt and req.arrival[drop_ptr] + max_delay <= t:
        i = drop_ptr
        drop_ptr += 1
        if req.status[i] == ST_WAITING and not req.ever[i]:
            req.status[i] = ST_DROPPED
            req.finish_t[i] = t
            n_wait -= 1
            if ipar[I_ADMISSION] == ADMISSION_KV_RESERVATION:
                reserved -= req.prompt[i] + req.output[i]
    return drop_ptr, n_wait, reserved


# Closed loop (``docs/engine-model.md``, "Closed-loop load"): c clients, or
# c permits of a semaphore around each request as ``vllm bench serve
# --max-concurrency`` has. Requests 0..c-1 go at once (a pure closed loop)
# or at their drawn times; let R_j be the instant of the j-th departure from
# the system (a completion, as its last token is emitted, a rejection at
# ingestion, an abandonment). In a pure closed loop the j-th departure's
# client sends again at R_j + Z_j (Z_j its think time), and the requests
# not yet ingested hold those times in order: request k is the k-th send.
# Capping a stream, request k >= c goes at max(w_k, R_(k-c), a_(k-1)), w_k
# its drawn time. Departures are counted, not listed: at any instant they
# are the ingested requests no longer in the system.


@njit_noalloc
def _closed_loop_init(n, req, ipar):
    """Closed loop: requests ``c..n-1`` wait for a seat. What their drawn
    arrival holds (a pure closed loop: the think time of departure k - c;
    a capped stream: the wanted send time w_k) is kept in ``finish_t``
    (unused until they leave); their arrivals are unknown (inf) until a
    departure sets them."""
    c = ipar[I_MAX_CONCURRENCY]
    for k in range(c, n):
        req.finish_t[k] = req.arrival[k]
        req.arrival[k] = np.inf


@njit_noalloc(inline="llvm")
def _release_seats(n, req, ipar, nxt, t, left, released):
    """Closed loop: ``left - released`` requests left the system at ``t``
    (``left``: the departures so far, ``released``: those already turned
    into arrivals): set the send time each one's seat gives (requests
    ``nxt..`` are not ingested yet). Return the departures handled
    (``left``); open loop: ``released``."""
    c = ipar[I_MAX_CONCURRENCY]
    if c == 0:
        return released
    pure = ipar[I_ARRIVAL_KIND] == ARRIVAL_CLOSED
    while released < left:
        k = released + c
        released += 1
        if k < n:
            if pure:
                # insert R_j + Z_j among the pending sends (sorted; ties after)
                v = t + req.finish_t[k]
                pos = k
                while pos > nxt and req.arrival[pos - 1] > v:
                    req.arrival[pos] = req.arrival[pos - 1]
                    pos -= 1
                req.arrival[pos] = v
            else:
                req.arrival[k] = max(max(req.finish_t[k], t), req.arrival[k - 1])
            req.finish_t[k] = np.nan
    return released


# Multi-turn sessions (``docs/engine-model.md``, "Sessions"). Request k is
# the k-th send, as in the pure closed loop; what it sends is known only
# when it is made. The draw (`workload._draw_sessions`) leaves the first c
# requests as the sessions' first turns (c users at time 0, or the session
# starts of the arrival process), each with ``pgrp`` its session, ``plen``
# its tokens (P + O: every full block of a turn, prompt or output, is the
# session's block, `block_pool._block_id`) and ``sjfk`` the turns after it;
# request k >= c holds the draws of the k-th send made: new tokens
# (``prompt``), output, priority, the think time before it (``arrival``,
# kept in ``finish_t`` until it is made) and, in ``pgrp``, minus the turns of
# a session it would start. When a turn leaves the system, its session
# sends the next turn (prompt = the turn's prompt + its output + the new
# tokens) a think time after; a session ends with its last turn or with a
# turn that does not complete (rejected, dropped), and a user then starts
# a new one a think time after. The sends not yet ingested stay sorted by
# time (ties: the earlier made first) between ``nxt`` and the sends made.


@njit_noalloc
def _session_max_len(ipar):
    """The most tokens (P + O) of a request that ingestion admits: a turn's
    prompt is at most that plus its new tokens (`_arrival_status`)."""
    lim = ipar[I_NUM_GPU_BLOCKS] * ipar[I_BLOCK_SIZE] + 1
    if ipar[I_MAX_MODEL_LEN] > 0:
        lim = min(lim, ipar[I_MAX_MODEL_LEN])
    if ipar[I_CHUNKED] == 0:
        lim = min(lim, ipar[I_MAX_BATCHED_TOKENS] + 1)
    return lim


@njit_noalloc
def _session_init(n, req, ipar, sess):
    """Sessions: requests ``c..n-1`` (c: the first whose ``pgrp`` is not a
    session, `workload._draw_sessions`) are sends not made yet: their think
    time moves to ``finish_t`` and their arrival is unknown (inf)."""
    c = 0
    while c < n and req.pgrp[c] >= 0:
        c += 1
    for k in range(c, n):
        req.finish_t[k] = req.arrival[k]
        req.arrival[k] = np.inf
    sess[0] = 0   # (the first request whose departure is not handled)
    sess[1] = c   # (the sends made)


@njit_noalloc
def _session_make(n, req, ipar, fpar, nxt, m, t, conv, sid, left):
    """Make send ``m`` (``m < n``): a turn of session ``sid`` with ``conv``
    tokens of conversation before its new tokens and ``left`` turns after it,
    a think time after ``t``; insert it among the sends not yet ingested
    (``nxt..m-1``, sorted by time, ties after). Return whether it was made
    (not at or after the horizon: only arrivals before it exist)."""
    v = t + req.finish_t[m]
    if ipar[I_HAS_HORIZON] == 1 and v >= fpar[F_HORIZON]:
        return False
    p = conv + req.prompt[m]
    o = req.output[m]
    c = req.prio[m]
    req.finish_t[m] = np.nan
    pos = m
    while pos > nxt and req.arrival[pos - 1] > v:
        req.arrival[pos] = req.arrival[pos - 1]
        req.prompt[pos] = req.prompt[pos - 1]
        req.output[pos] = req.output[pos - 1]
        req.prio[pos] = req.prio[pos - 1]
        req.sjfk[pos] = req.sjfk[pos - 1]
        req.pgrp[pos] = req.pgrp[pos - 1]
        req.plen[pos] = req.plen[pos - 1]
        req.key[pos] = req.key[pos - 1]
        pos -= 1
    req.arrival[pos] = v
    req.prompt[pos] = p
    req.output[pos] = o
    req.prio[pos] = c
    req.sjfk[pos] = left
    req.pgrp[pos] = sid
    req.plen[pos] = p + o
    # (the queue key: the priority; no aging, no SJF with sessions)
    req.key[pos] = float(c) if ipar[I_POLICY] == POLICY_PRIORITY else 0.0
    return True


@njit_noalloc(inline="never")
def _session_sends(n, req, ipar, fpar, nxt, t, sess):
    """Sessions: the turns that left the system by ``t`` (requests
    ``sess[0]..nxt-1`` whose departure is not handled: ``sjfk`` >= 0), in
    index order, each make their session's next send (or, for users, a new
    session's first); a handled one gets ``sjfk`` -1. ``sess``: (the first
    request whose departure is not handled, the sends made), updated."""
    users = ipar[I_SESSIONS] == SESSIONS_USERS
    m = sess[1]
    for r in range(sess[0], nxt):
        left = req.sjfk[r]
        st = req.status[r]
        if left < 0 or st == ST_WAITING or st == ST_RUNNING or st == ST_SWAPPED:
            continue
        req.sjfk[r] = -1
        if m >= n:
            continue
        if st == ST_COMPLETED and left > 0:
            if _session_make(n, req, ipar, fpar, nxt, m, t, req.prompt[r] + req.output[r], req.pgrp[r], left - 1):
                m += 1
        elif users:
            if _session_make(n, req, ipar, fpar, nxt, m, t, 0, m, -req.pgrp[m] - 1):
                m += 1
    s = sess[0]
    while s < nxt and req.sjfk[s] < 0:
        s += 1
    sess[0] = s
    sess[1] = m
