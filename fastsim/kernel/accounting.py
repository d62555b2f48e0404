"""Run-level bookkeeping: the time integrals of a step (occupancy, queue, KV
use, number in system) and the inter-token gaps as weighted samples.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc


@njit_noalloc
def _account_step(acc, t, t_end, d, n_run, n_wait, used, ws, we):
    """Run-level bookkeeping of one step [t, t_end) of duration d, with
    ``n_run`` running, ``n_wait`` waiting and ``used`` blocks; time integrals
    count its overlap with the window [ws, we]. ``acc``: the accumulators
    (occupancy, queue, KV and number-in-system integrals, steps, most blocks
    used), returned updated (scalars in a tuple, not an array: the call then
    inlines and they stay in registers). The occupancy and KV integrals are
    of running requests and used blocks; `replica._finish_replica` divides
    them by max_num_seqs and num_gpu_blocks once at the end, not every step
    (a division costs more than the rest of a step)."""
    a_occ, a_queue, a_kv, a_l, a_steps, a_max = acc
    if used > a_max:
        a_max = used
    a_steps += 1.0
    a_l += (n_run + n_wait) * d
    overlap = min(t_end, we) - max(t, ws)
    if overlap > 0.0:
        a_occ += overlap * n_run
        a_queue += overlap * n_wait
        a_kv += overlap * used
    return a_occ, a_queue, a_kv, a_l, a_steps, a_max


@njit_noalloc(inline="llvm")
def _add_in_system(acc, x):
    """``x`` request-seconds more in the system (the number-in-system integral of `_account_step`'s
    accumulators ``acc``)."""
    a_occ, a_queue, a_kv, a_l, a_steps, a_max = acc
    return a_occ, a_queue, a_kv, a_l + x, a_steps, a_max


@njit_noalloc
def _gap_add(itl_v, itl_w, n_itl, x, w):
    """Record ``w`` inter-token gaps of value ``x``; return the new entry count.
    A gap equal to the last entry's value adds to its multiplicity (steps of
    one batch composition repeat their duration: far fewer entries)."""
    if n_itl > 0 and itl_v[n_itl - 1] == x:
        itl_w[n_itl - 1] += w
        return n_itl
    itl_v[n_itl] = x
    itl_w[n_itl] = w
    return n_itl + 1
