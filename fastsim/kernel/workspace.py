"""The workspace: a replication's whole state lives in two flat arrays, ``wi``
(int64) and ``wf`` (float64), carved into views by the engine, so that the
engine allocates nothing: a CPU thread reuses one workspace for all its
replications, and a GPU thread gets its slice of one device allocation.
Layout (n requests): wi = status, k, g, blocks, npre, nswap, ctok (7n), a
reduction scratch (n + N_HIST), the inter-token gap weights (nitl), then the
engine's internal state; wf = first_t, last_t, finish_t, swapped_s (4n), the
accumulators (N_ACC), a reduction scratch (3n), the gap values (nitl), then
internal state. `_ws_sizes` is the one statement of the sizes (from the
dimensions `_ws_dims` reads off the requests; `_ws_need` composes the two);
the per-request columns of the heads are named below (column j of a head
is ``a[j * n:(j + 1) * n]``; a jitted function without NRT cannot return
the view, so each use slices).
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .layout import I_BLOCK_SIZE, I_CACHING, I_MAX_NUM_SEQS, I_NUM_GPU_BLOCKS, I_WARMUP, N_ACC, N_HIST


WI_STATUS, WI_K, WI_G, WI_BLOCKS, WI_NPRE, WI_NSWAP, WI_CTOK, WI_ONES = range(8)   # WI_ONES: reduction scratch


WI_HEAD = 8          # columns before the histogram (N_HIST), the gap weights, internal state


WF_FIRST, WF_LAST, WF_FINISH, WF_SWAPPED = range(4)


WF_HEAD = 4          # columns before the accumulators (N_ACC)


WF_SCRATCH = 3       # reduction scratch after the accumulators (TTFT, E2E, TPOT), then the gap values


@njit_noalloc
def _ws_dims(n, output, pgrp, plen, ipar):
    """Data-dependent sizes: (seats, prefix-cache entries, prefix references,
    gap samples, most prefix blocks of a request)."""
    bs = ipar[I_BLOCK_SIZE]
    cap = max(1, min(ipar[I_MAX_NUM_SEQS], n))
    # Gaps come only from measured requests that can complete, whose output
    # fits the KV cache: cap each term so one huge (rejected) draw cannot
    # exhaust memory. (Gaps are stored as weighted samples, one per step for
    # the lazy decoders, so far fewer entries are used.)
    kv_tokens = ipar[I_NUM_GPU_BLOCKS] * bs
    n_tok = 0
    for i in range(ipar[I_WARMUP], n):
        n_tok += min(output[i], kv_tokens)
    ngrp = 0
    jmax = 0
    nheld = 0
    if ipar[I_CACHING] == 1:
        for i in range(n):
            if pgrp[i] >= 0:
                f = plen[i] // bs
                ngrp = max(ngrp, pgrp[i] + 1)
                jmax = max(jmax, f)
                nheld += f
    return cap, max(ngrp * jmax, 1), max(nheld, 1), max(n_tok, 1), jmax


@njit_noalloc(entry=True)
def _ws_need(n, output, pgrp, plen, ipar):
    """Sizes (int64 entries, float64 entries) of the workspace of requests ``0..n-1``."""
    cap, ncnt, nheld, nitl, _jmax = _ws_dims(n, output, pgrp, plen, ipar)
    return _ws_sizes(n, ipar[I_BLOCK_SIZE], cap, ncnt, nheld, nitl)


@njit_noalloc
def _ws_sizes(n, bs, cap, ncnt, nheld, nitl):
    """The workspace sizes from the dimensions `_ws_dims` gives (the layout `_simulate` carves)."""
    # q, qs, run, sched, ever, dmem, dpos, koff, goff, ph, hk, hr, hs, dstate,
    # oth, sq, sqs, fpre, hoff, cnt, lprev, lnext, cst, held, private, nent, gapw
    internal = ((2 * n + 2) + 2 + 2 * cap + n + n + cap + n + n + n + bs + cap + cap + 1 + 3
                + cap + (n + 1) + 1 + n + (n + 1) + 3 * ncnt + 4 + nheld + n + n + (cap + 1))
    need_i = WI_HEAD * n + N_HIST + nitl + internal
    # key, dec_cost, skey, swapped_since
    need_f = (WF_HEAD + WF_SCRATCH) * n + N_ACC + nitl + n + (cap + 1) + n + n
    return need_i, need_f
