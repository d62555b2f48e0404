"""Async scheduling (vLLM V1's ``async_scheduling``): the engine core keeps a
queue of two steps (``step_with_batch_queue``), so step j + 1 is scheduled
while step j runs, and sees the state step j leaves: its tokens computed, and
one *placeholder* output token for each request it will make emit
(``AsyncScheduler._update_after_schedule``). The token itself, with its
time, arrives at step j's end (``update_from_output``), and only then does a
request that reached its last token leave, freeing its seat and blocks.

The engine keeps a request's generated count ``g`` *with* its placeholders,
so the scheduler's rules read as in the synchronous loop (its need is
``P + g - k``; a running request with ``g == output`` has its last token in
flight and is not scheduled again). What a step in flight will emit is
recorded here: per slot of the two-step queue, the (request, token index)
pairs (`Pipeline.fly`), emitted at the slot's end time ``fe``.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .accounting import _gap_add
from .layout import ADMISSION_KV_RESERVATION, I_ADMISSION, I_WARMUP, ST_COMPLETED, ST_RUNNING, ST_WAITING
from .prefix_cache import _release

# ``Pipeline.fs``: steps in flight, the oldest one's slot, emissions of slot 0 and of slot 1
FS_COUNT, FS_HEAD, FS_N0 = 0, 1, 2


@njit_noalloc
def _init_pipeline(pipe):
    """No step in flight."""
    for j in range(4):
        pipe.fs[j] = 0
    pipe.fe[0] = 0.0
    pipe.fe[1] = 0.0


@njit_noalloc
def _last_end(pipe, t):
    """When a step scheduled now starts: at the end of the last step in
    flight, or now if none is."""
    nq = pipe.fs[FS_COUNT]
    if nq == 0:
        return t
    return pipe.fe[(pipe.fs[FS_HEAD] + nq - 1) & 1]


@njit_noalloc
def _push_step(req, run, n_run, pipe, t_end):
    """Put the step just scheduled (``req.sched``) in flight, ending at
    ``t_end``: its tokens computed now, a placeholder token for each request
    it completes the input of, whose (request, token index) it records."""
    cap = pipe.fly.size // 4
    slot = (pipe.fs[FS_HEAD] + pipe.fs[FS_COUNT]) & 1
    base = 2 * cap * slot
    m = 0
    for jj in range(n_run):
        r = run[jj]
        s = req.sched[r]
        if s == 0:
            continue
        req.sched[r] = 0
        req.k[r] += s
        if req.k[r] == req.prompt[r] + req.g[r]:
            req.g[r] += 1
            pipe.fly[base + 2 * m] = r
            pipe.fly[base + 2 * m + 1] = req.g[r]
            m += 1
    pipe.fs[FS_N0 + slot] = m
    pipe.fe[slot] = t_end
    pipe.fs[FS_COUNT] += 1


@njit_noalloc
def _oldest_end(pipe):
    """The end time of the oldest step in flight."""
    return pipe.fe[pipe.fs[FS_HEAD]]


@njit_noalloc
def _pop_step(req, rec, pipe, cache, ipar, free, reserved, n_run, n_wait, n_itl, jmax, caching):
    """The oldest step in flight ends: its tokens are emitted at its end
    time; a request whose last token it was completes, leaving the running
    batch (seat and blocks freed) or, if it was
    preempted while its token was in flight, the waiting queue (lazily: its
    entry is skipped). Return the updated (free blocks, reserved tokens,
    running, waiting, gap entries); the caller compacts the running list."""
    cap = pipe.fly.size // 4
    slot = pipe.fs[FS_HEAD]
    base = 2 * cap * slot
    t_end = pipe.fe[slot]
    warmup = ipar[I_WARMUP]
    kv_reservation = ipar[I_ADMISSION] == ADMISSION_KV_RESERVATION
    for m in range(pipe.fs[FS_N0 + slot]):
        r = pipe.fly[base + 2 * m]
        tok = pipe.fly[base + 2 * m + 1]
        if tok == 1:
            req.first_t[r] = t_end
        elif r >= warmup:
            n_itl = _gap_add(rec.itl_v, rec.itl_w, n_itl, t_end - req.last_t[r], 1)
        req.last_t[r] = t_end
        if tok == req.output[r]:
            if req.status[r] == ST_RUNNING:
                free = _release(r, free, req, cache, jmax, caching)
                n_run -= 1
            elif req.status[r] == ST_WAITING:
                n_wait -= 1
            req.status[r] = ST_COMPLETED
            req.finish_t[r] = t_end
            if kv_reservation:
                reserved -= req.prompt[r] + req.output[r]
    pipe.fs[FS_N0 + slot] = 0
    pipe.fs[FS_HEAD] = slot ^ 1
    pipe.fs[FS_COUNT] -= 1
    return free, reserved, n_run, n_wait, n_itl


@njit_noalloc
def _drop_in_flight(req, pipe):
    """At the end of a run, the tokens of the steps still in flight were not
    emitted: take their placeholders back."""
    cap = pipe.fly.size // 4
    for q in range(pipe.fs[FS_COUNT]):
        slot = (pipe.fs[FS_HEAD] + q) & 1
        base = 2 * cap * slot
        for m in range(pipe.fs[FS_N0 + slot]):
            req.g[pipe.fly[base + 2 * m]] -= 1
