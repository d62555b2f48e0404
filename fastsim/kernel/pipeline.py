"""Async scheduling (vLLM V1's ``async_scheduling``), as a lag on the
synchronous loop.

vLLM's engine core keeps a queue of two steps (``step_with_batch_queue``):
step j + 1 is scheduled when step j starts, with step j's tokens counted as
computed (a *placeholder* for each token it will emit) but before its
outputs are known. Seen from the synchronous loop, which schedules step
j + 1 when step j ends, with everything of step j applied, two things lag by
one step:

* **arrivals**: step j + 1 sees the requests that arrived by the *start* of
  step j (`replica._simulate` ingests up to ``t_vis``, the visibility time,
  instead of the clock);
* **completions**: a request whose last token came at the end of step j
  still holds its seat and its KV blocks while step j + 1 is scheduled (vLLM
  skips it: its last token is in flight), and may be chosen as a
  preemption victim there; it leaves after that. Such requests are kept in
  ``Batch.zl`` (count ``RI_N_HELD``), with status running and
  ``g == output``, until `_release_finished` after the next schedule
  (`decoders._hold_decoders` for the lazy decoders).

Token counts and their times are the same in both loops (a step's tokens
are emitted at its end), so the fast step, the lazy decoders and the
stretches work unchanged. When the scheduler finds nothing to run in the
lagged state, vLLM waits for the step in flight, applies its output and
schedules again at once (two steps back to back, nothing in flight): the
requests that finished are released and the visibility time catches up
with the clock. The reference simulator (``fastsim/_reference.py``,
``run_async``) models the batch queue itself; the tests hold the two to each
other bit for bit.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .layout import ADMISSION_KV_RESERVATION, I_ADMISSION, I_BLOCK_HASH, ST_COMPLETED, ST_RUNNING, ST_WAITING
from .prefix_cache import _release


@njit_noalloc(inline="llvm")
def _release_finished(req, zl, nz, cache, ipar, free, reserved, n_run, n_wait, jmax, caching):
    """The next step is scheduled: the requests held (`decoders._hold_decoders`, a step's end)
    leave; a held request preempted meanwhile (counted waiting, not queued)
    leaves the waiting count. Return (free blocks, reserved tokens, running,
    waiting)."""
    kv_reservation = ipar[I_ADMISSION] == ADMISSION_KV_RESERVATION
    hashing = caching and ipar[I_BLOCK_HASH] >= 1
    for j in range(nz):
        r = zl[j]
        if req.status[r] == ST_RUNNING:
            free = _release(r, free, req, cache, jmax, caching and not hashing, hashing)
            n_run -= 1
        elif req.status[r] == ST_WAITING:
            n_wait -= 1
        if hashing and req.npre[r] > 0:
            cache.pool.pst[3] -= 1   # (one fewer ever preempted in the system: `block_pool`)
        req.status[r] = ST_COMPLETED
        if kv_reservation:
            reserved -= req.prompt[r] + req.output[r]
    return free, reserved, n_run, n_wait
