"""Arrivals and abandonment: what happens to a request when it arrives
(rejected as never fitting, rejected by admission control, or queued), at a
step's start or during a step, and to a waiting request that gives up.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .layout import (ADMISSION_KV_RESERVATION, ADMISSION_QUEUE_LIMIT, F_MAX_DELAY, I_ADMISSION, I_BLOCK_SIZE,
                     I_CHUNKED, I_HAS_DELAY, I_MAX_BATCHED_TOKENS, I_MAX_MODEL_LEN, I_MAX_NUM_SEQS, I_MAX_WAITING,
                     I_NUM_GPU_BLOCKS, I_POLICY, ST_DROPPED, ST_REJECTED_ADMISSION, ST_REJECTED_TOO_LONG,
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
            part = min(t_end, we) - max(req.arrival[i], ws)
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
