"""Pieces of batch formation shared by the fast and the slow step: a waiting
request's first chunk, admission to the running batch, and the running list's
upkeep.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .kv_cache import _blocks_of
from .layout import I_FULL_ISL, ST_RUNNING
from .waiting_queue import _q_pop


@njit_noalloc
def _first_chunk(need, budget, chunked):
    """Tokens an admitted request gets this step: its need, cut to the budget
    with chunked prefill; -1 if it does not fit (no chunking)."""
    if chunked:
        return min(need, budget)
    return need if need <= budget else -1


@njit_noalloc(inline="llvm")
def _admission_blocks(need, nb, ipar, bs, bsh):
    """The free blocks a waiting request needs to be admitted: those of its
    first chunk (``nb``), or, with vLLM's full-input gate
    (``scheduler_reserve_full_isl``), those of its whole remaining input
    (``need`` tokens: prompt and tokens generated before a preemption, less
    prefix-cache hits)."""
    if ipar[I_FULL_ISL] == 1:
        return _blocks_of(need, bs, bsh)
    return nb


@njit_noalloc(inline="llvm")
def _start_running(w, nb, q, qs, key, policy, status, ever, blocks):
    """Move the waiting head ``w`` to running with ``nb`` blocks (the caller
    updates its counts of waiting requests and free blocks)."""
    _q_pop(q, qs, key, policy)
    status[w] = ST_RUNNING
    ever[w] = 1
    blocks[w] = nb


@njit_noalloc
def _compact_run(run, rl, status):
    """Drop requests that are no longer running from ``run[:rl]``, keeping the order."""
    m = 0
    for j in range(rl):
        r = run[j]
        if status[r] == ST_RUNNING:
            run[m] = r
            m += 1
    return m


@njit_noalloc(inline="llvm")
def _rebuild(run, n_run, oth):
    for j in range(n_run):
        oth[j] = run[j]
    return n_run
