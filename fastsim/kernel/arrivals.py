"""Ingestion of arrivals: what happens to a request when it arrives (rejected
as never fitting, rejected by admission control, or queued), at a step's
start or during a step.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .layout import (I_ADMISSION, I_BLOCK_SIZE, I_CHUNKED, I_MAX_BATCHED_TOKENS, I_MAX_MODEL_LEN,
    I_MAX_NUM_SEQS, I_MAX_WAITING, I_NUM_GPU_BLOCKS, I_POLICY, ST_REJECTED_ADMISSION, ST_REJECTED_TOO_LONG,
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
    if admission == 1 and in_system >= ipar[I_MAX_NUM_SEQS] + ipar[I_MAX_WAITING]:
        return ST_REJECTED_ADMISSION
    if admission == 2 and reserved + p + o > ipar[I_NUM_GPU_BLOCKS] * bs:
        return ST_REJECTED_ADMISSION
    return ST_WAITING


@njit_noalloc(inline="llvm")
def _arrivals_during_step(nxt, n, t_end, arrival, prompt, output, ipar, n_run, n_wait, reserved,
                          status, q, qs, key, a_l, a_queue, ws, we):
    """Ingest the arrivals during a step ending at ``t_end``: they see it
    before its completions. Return the updated (next arrival, waiting,
    reserved, L integral, queue integral). (Callers skip the call, which
    passes many arrays, when no arrival falls inside the step.)"""
    while nxt < n and arrival[nxt] < t_end:
        i = nxt
        nxt += 1
        status[i] = _arrival_status(prompt[i], output[i], ipar, n_run + n_wait, reserved)
        if status[i] == ST_WAITING:
            if ipar[I_ADMISSION] == 2:
                reserved += prompt[i] + output[i]
            n_wait += 1
            _q_push(q, qs, key, ipar[I_POLICY], i, False)
            # in the system (waiting) since its arrival, not since t_end
            a_l += t_end - arrival[i]
            part = min(t_end, we) - max(arrival[i], ws)
            if part > 0.0:
                a_queue += part
    return nxt, n_wait, reserved, a_l, a_queue
