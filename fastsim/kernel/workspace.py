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

from collections import namedtuple

from .._numba_options import njit_noalloc
from .layout import I_BLOCK_SIZE, I_CACHING, I_MAX_NUM_SEQS, I_NUM_GPU_BLOCKS, I_WARMUP, N_ACC, N_HIST


# The segments of ``wi`` (int64), in their order; the first WI_HEAD are the
# per-request columns (column j is ``wi[j * n:(j + 1) * n]``), read by the
# reduction and by `drivers.simulate_stream`.
(WI_STATUS, WI_K, WI_G, WI_BLOCKS, WI_NPRE, WI_NSWAP, WI_CTOK, WI_ONES,   # WI_ONES: reduction scratch
 WI_HIST,                       # reduction: the histogram that narrows percentile searches
 WI_ITL_W,                      # weights of the inter-token gap samples
 WI_QUEUE, WI_QUEUE_STATE,      # the waiting queue (ring buffer or heap) and (size, ring head)
 WI_RUN, WI_SCHED, WI_EVER,     # running requests in admission order; tokens scheduled; ever scheduled
 WI_DMEM, WI_DPOS, WI_KOFF, WI_GOFF, WI_PHASES,        # lazy decoders (`decoders`)
 WI_HEAP_KEY, WI_HEAP_REQ, WI_HEAP_SIZE, WI_DSTATE,    # their completion heap; (count, sum of koff, measured)
 WI_OTHERS,                     # the running requests that are not lazy decoders
 WI_SWAPQ, WI_SWAPQ_SIZE,       # the swapped queue (preemption_mode="swap")
 WI_FPRE, WI_HOFF, WI_CNT, WI_LPREV, WI_LNEXT, WI_CST, WI_HELD, WI_PRIVATE, WI_NENT,   # `prefix_cache`
 WI_GAPW,                       # inter-token gaps of pure decode steps, by decoder count
 WI_SCALARS,                    # the replica's scalar state between calls (`RI_*`)
 N_WI) = range(39)
WI_HEAD = 8

# The segments of ``wf`` (float64), in their order.
(WF_FIRST, WF_LAST, WF_FINISH, WF_SWAPPED,   # per-request columns
 WF_ACC,                        # run-level accumulators (`layout.A_*`)
 WF_TTFT, WF_E2E, WF_TPOT,      # reduction scratch
 WF_ITL_V,                      # values of the inter-token gap samples
 WF_KEY, WF_DEC_COST, WF_SKEY, WF_SWAPPED_SINCE,   # queue keys, decode term by batch size, swap keys and times
 WF_SCALARS,                    # the replica's scalar state between calls (`RF_*`)
 N_WF) = range(15)
WF_HEAD = 4
WF_SCRATCH = 3

# A replica's scalar state between two calls (`replica.advance_until`):
# ``wi[WI_SCALARS]`` and ``wf[WF_SCALARS]``.
(RI_N, RI_NEXT_ARRIVAL, RI_NEXT_DROP, RI_N_RUN, RI_RUN_LEN, RI_N_OTHERS, RI_FAST_STEPS, RI_PHASE,
 RI_N_WAIT, RI_FREE, RI_RESERVED, RI_N_ITL, RI_N_SWAPPED, RI_SWAP_USED, RI_PENDING_SWAP, RI_MAX_USED,
 RI_MODE, RI_N_DEC, RI_N_PREFILL, N_RI) = range(20)
(RF_CLOCK, RF_STEP_END, RF_OCC, RF_QUEUE, RF_KV, RF_L, RF_STEPS, N_RF) = range(8)


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
def _int_sizes(n, bs, cap, ncnt, nheld, nitl):
    """The sizes of the ``WI_*`` segments, in order: the one statement of
    ``wi``'s layout (dimensions: `_ws_dims`)."""
    return (n, n, n, n, n, n, n, n,
            N_HIST, nitl,
            2 * n + 2, 2,
            2 * cap, n, n,
            cap, n, n, n, bs,
            cap, cap, 1, 3,
            cap,
            n + 1, 1,
            n, n + 1, ncnt, ncnt, ncnt, 4, nheld, n, n,
            cap + 1,
            N_RI)


@njit_noalloc
def _float_sizes(n, cap, nitl):
    """The sizes of the ``WF_*`` segments, in order: the one statement of ``wf``'s layout."""
    return (n, n, n, n,
            N_ACC,
            n, n, n,
            nitl,
            n, cap + 1, n, n,
            N_RF)


@njit_noalloc
def _offset(sizes, j):
    """Where segment ``j`` of a layout (`_int_sizes`, `_float_sizes`) starts."""
    o = 0
    for i in range(j):
        o += sizes[i]
    return o


@njit_noalloc
def _span(sizes, j):
    """The slice of segment ``j`` of a layout (a function compiled without
    Numba's runtime cannot return a view, so callers slice)."""
    o = _offset(sizes, j)
    return slice(o, o + sizes[j])


@njit_noalloc
def _ws_sizes(n, bs, cap, ncnt, nheld, nitl):
    """The workspace sizes (int64 entries, float64 entries) from the dimensions `_ws_dims` gives."""
    return _offset(_int_sizes(n, bs, cap, ncnt, nheld, nitl), N_WI), _offset(_float_sizes(n, cap, nitl), N_WF)


# The engine's views of a workspace, grouped by concept (`_carve`): named
# tuples of array views, which compile without Numba's runtime and for CUDA.

#: The request stream (given) and each request's engine state.
Requests = namedtuple("Requests", (
    "arrival", "prompt", "output", "prio", "sjfk", "pgrp", "plen",   # the stream (`workload`)
    "status", "k", "g", "blocks", "npre",   # status; tokens computed and generated; KV blocks; preemptions
    "sched", "ever",                        # tokens scheduled this step; 1 once ever scheduled
    "first_t", "last_t", "finish_t",        # first-token, last-token and finish times
    "key"))                                 # waiting-queue key e_i (priority or SJF, aged)
#: The waiting queue and the running batch.
Batch = namedtuple("Batch", ("q", "qs", "run", "oth"))
#: The lazy decoders (`decoders`) and their completion heap.
Decoders = namedtuple("Decoders", ("dmem", "dpos", "koff", "goff", "ph", "hk", "hr", "hs", "dstate"))
#: Swap preemption: the swapped queue, its keys, and each request's swaps and time swapped.
Swap = namedtuple("Swap", ("sq", "sqs", "skey", "swapped_since", "nswap", "swapped_s"))
#: The prefix cache (`prefix_cache`) and each request's cached tokens.
PrefixCache = namedtuple("PrefixCache", ("fpre", "hoff", "cnt", "lprev", "lnext", "cst", "held", "private",
                                         "nent", "ctok"))
#: What the run records: inter-token gaps, the decode term by batch size, the accumulators.
Record = namedtuple("Record", ("itl_v", "itl_w", "gapw", "dec_cost", "acc"))
#: The replica's scalar state between calls (`RI_*`, `RF_*`).
Scalars = namedtuple("Scalars", ("ri", "rf"))
#: The requests of a stream (the arguments of `replica._simulate`).
Stream = namedtuple("Stream", ("arrival", "prompt", "output", "prio", "sjfk", "pgrp", "plen"))


@njit_noalloc
def _carve(stream, dims, wi, wf):
    """The engine's views (`Requests`, `Batch`, `Decoders`, `Swap`,
    `PrefixCache`, `Record`, `Scalars`) of the workspace ``wi``/``wf`` for
    the requests of ``stream`` and the dimensions ``dims`` (`_ws_dims`:
    seats, cache entries, prefix references, gap samples; n first)."""
    n, bs, cap, ncnt, nheld, nitl = dims
    si = _int_sizes(n, bs, cap, ncnt, nheld, nitl)
    sf = _float_sizes(n, cap, nitl)
    req = Requests(stream.arrival, stream.prompt, stream.output, stream.prio, stream.sjfk, stream.pgrp, stream.plen,
                   wi[_span(si, WI_STATUS)], wi[_span(si, WI_K)], wi[_span(si, WI_G)],
                   wi[_span(si, WI_BLOCKS)], wi[_span(si, WI_NPRE)], wi[_span(si, WI_SCHED)],
                   wi[_span(si, WI_EVER)], wf[_span(sf, WF_FIRST)], wf[_span(sf, WF_LAST)],
                   wf[_span(sf, WF_FINISH)], wf[_span(sf, WF_KEY)])
    batch = Batch(wi[_span(si, WI_QUEUE)], wi[_span(si, WI_QUEUE_STATE)], wi[_span(si, WI_RUN)],
                  wi[_span(si, WI_OTHERS)])
    dec = Decoders(wi[_span(si, WI_DMEM)], wi[_span(si, WI_DPOS)], wi[_span(si, WI_KOFF)],
                   wi[_span(si, WI_GOFF)], wi[_span(si, WI_PHASES)], wi[_span(si, WI_HEAP_KEY)],
                   wi[_span(si, WI_HEAP_REQ)], wi[_span(si, WI_HEAP_SIZE)], wi[_span(si, WI_DSTATE)])
    swap = Swap(wi[_span(si, WI_SWAPQ)], wi[_span(si, WI_SWAPQ_SIZE)], wf[_span(sf, WF_SKEY)],
                wf[_span(sf, WF_SWAPPED_SINCE)], wi[_span(si, WI_NSWAP)], wf[_span(sf, WF_SWAPPED)])
    cache = PrefixCache(wi[_span(si, WI_FPRE)], wi[_span(si, WI_HOFF)], wi[_span(si, WI_CNT)],
                        wi[_span(si, WI_LPREV)], wi[_span(si, WI_LNEXT)], wi[_span(si, WI_CST)],
                        wi[_span(si, WI_HELD)], wi[_span(si, WI_PRIVATE)], wi[_span(si, WI_NENT)],
                        wi[_span(si, WI_CTOK)])
    rec = Record(wf[_span(sf, WF_ITL_V)], wi[_span(si, WI_ITL_W)], wi[_span(si, WI_GAPW)],
                 wf[_span(sf, WF_DEC_COST)], wf[_span(sf, WF_ACC)])
    return req, batch, dec, swap, cache, rec, Scalars(wi[_span(si, WI_SCALARS)], wf[_span(sf, WF_SCALARS)])
