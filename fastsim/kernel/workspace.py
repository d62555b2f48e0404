"""The workspace: a replication's whole state lives in two flat arrays, ``wi``
(int64) and ``wf`` (float64), carved into views by the engine, so that the
engine allocates nothing: a CPU thread reuses one workspace for all its
replications, and a GPU thread gets its slice of one device allocation.
Layout (n requests): wi = status, k, g, blocks, npre, nswap, ctok (7n), a
reduction scratch (n + N_HIST), the inter-token gap weights (nitl), then the
engine's internal state; wf = first_t, last_t, finish_t, swapped_s (4n), the
accumulators (N_ACC), the gap values (nitl), then internal state. (The
reduction's per-request values go to columns the run no longer needs once
it has ended, `metrics._reduce`: columns the engine wrote anyway, so the
reduction makes no more of the workspace resident.) `_ws_sizes` is the one statement of the sizes (from the
dimensions `_ws_dims` reads off the requests; `_ws_need` composes the two);
the per-request columns of the heads are named below (column j of a head
is ``a[j * n:(j + 1) * n]``; a jitted function without NRT cannot return
the view, so each use slices).
"""

from __future__ import annotations

from collections import namedtuple

from numba.core import cgutils, types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic, overload
from numba.np.arrayobj import make_array, populate_array

from .._numba_options import njit_noalloc
from .block_pool import _list_capacity
from .arrivals import _session_max_len
from .layout import (I_BLOCK_HASH, I_BLOCK_SIZE, I_CACHING, I_MAX_NUM_SEQS, I_NUM_GPU_BLOCKS, I_SESSIONS, I_WARMUP,
                     N_ACC, N_HIST)


# The segments of ``wi`` (int64), in their order; the first WI_HEAD are the
# per-request columns (column j is ``wi[j * n:(j + 1) * n]``), read by the
# reduction and by `drivers.simulate_stream`.
(WI_STATUS, WI_K, WI_G, WI_BLOCKS, WI_NPRE, WI_NSWAP, WI_CTOK, WI_ONES,   # WI_ONES: reduction scratch
 WI_HIST,                       # reduction: the histogram that narrows percentile searches
 WI_ITL_W,                      # weights of the inter-token gap samples
 WI_QUEUE, WI_QUEUE_STATE,      # the waiting queue (ring buffer or heap) and (size, ring head)
 WI_RUN, WI_SCHED, WI_EVER,     # running requests in admission order; tokens scheduled; ever scheduled
 WI_DMEM, WI_DPOS, WI_KOFF, WI_GOFF, WI_PHASES,        # lazy decoders (`decoders`)
 WI_HEAP_SIZE, WI_HEAP_KEY, WI_HEAP_REQ, WI_DSTATE,    # their completion heap: size (by its top), keys, requests;
                                                       # (count, sum of koff, measured)
 WI_OTHERS,                     # the running requests that are not lazy decoders
 WI_SWAPQ, WI_SWAPQ_SIZE,       # the swapped queue (preemption_mode="swap")
 WI_FPRE, WI_HOFF, WI_CNT, WI_LPREV, WI_LNEXT, WI_CST, WI_HELD, WI_PRIVATE, WI_NENT,   # `prefix_cache`
 WI_QPREV, WI_QNEXT, WI_REF, WI_BHASH, WI_DPREV, WI_DNEXT,   # `block_pool`: the free-block queue, blocks
 WI_HUSED, WI_HKEY, WI_HHEAD, WI_HTAIL,                      # its table of identities
 WI_BOFF, WI_RBLK, WI_NCACHED, WI_PST,                       # each request's blocks; the pool's counts
 WI_GAPW,                       # inter-token gaps of pure decode steps, by decoder count
 WI_HELD_FINISHED,              # async scheduling: finished requests holding seat and blocks (`pipeline`)
 WI_SCALARS,                    # the replica's scalar state between calls (`RI_*`)
 N_WI) = range(54)
WI_HEAD = 8

# The segments of ``wf`` (float64), in their order.
(WF_FIRST, WF_LAST, WF_FINISH, WF_SWAPPED,   # per-request columns
 WF_ACC,                        # run-level accumulators (`layout.A_*`)
 WF_ITL_V,                      # values of the inter-token gap samples
 WF_KEY, WF_DEC_COST, WF_SKEY, WF_SWAPPED_SINCE,   # queue keys, decode term by batch size, swap keys and times
 WF_SCALARS,                    # the replica's scalar state between calls (`RF_*`)
 N_WF) = range(12)
WF_HEAD = 4

# A replica's scalar state between two calls (`replica.advance_until`):
# ``wi[WI_SCALARS]`` and ``wf[WF_SCALARS]``.
# ``RI_N_KNOWN``: the requests handed to it so far (all ``n`` for a whole
# run; `replica._hand` adds one); ``RI_DIM_*``: the layout's dimensions
# (`_ws_dims`), read once when it is set up and kept here, so that a call
# that resumes it carves its workspace without a scan of the requests.
# The first entries are what a fleet's router and event queue read of a paused replica (`cluster`:
# `_observe`, `_due`, `_departs_parts`, `_keep_end`; the layout's dimensions, next, for `_keep_end` and
# `_fits`), side by side: they cross fewer cache lines (so do the ``RF_*``: the clock and the two ends first).
(RI_MODE, RI_N_RUN, RI_N_WAIT, RI_N_SWAPPED, RI_N_KNOWN, RI_NEXT_ARRIVAL, RI_N_HELD, RI_FREE,
 RI_N_OTHERS, RI_FAST_STEPS, RI_RESERVED, RI_RUN_LEN,
 RI_DIM_CAP, RI_DIM_NCNT, RI_DIM_NHELD, RI_DIM_NITL, RI_DIM_JMAX, RI_DIM_NBP, RI_DIM_NBT,
 RI_NEXT_DROP, RI_PHASE, RI_N_ITL, RI_SWAP_USED, RI_PENDING_SWAP, RI_MAX_USED, RI_N_DEC, RI_N_PREFILL,
 RI_RELEASED, RI_PEND_DEPARTURES,
 RI_SESS_SCAN, RI_SESS_MADE,    # sessions (`arrivals._session_sends`): first request not yet handled; sends made
 N_RI) = range(32)
# ``RF_STRETCH_END``: paused before a stretch (`replica.MODE_STRETCH`), the
# time that stretch would end, or a lower bound of it (`stretch._end_bound`;
# no request comes or goes before it).
(RF_CLOCK, RF_STEP_END, RF_STRETCH_END, RF_VISIBLE, RF_OCC, RF_QUEUE, RF_KV, RF_L, RF_STEPS, N_RF) = range(10)


@njit_noalloc(inline="llvm")
def _gap_room(nitl):
    """The gap samples' room of a replica handed its requests (`_handed_dims`)
    for a bound of ``nitl`` (>= 1): rounded up to four significant bits (at
    most an eighth more). Replications whose output tokens differ a little
    then share one layout, so that a fleet's replica rows (`cluster`, laid
    out for the whole stream, in buffers kept from one replication to the
    next) find every segment after the gap samples where the last
    replication left it, its pages faulted in once (exact, the segments
    moved with each replication's tokens and were faulted in afresh). Pages
    of the room never written cost address space only. (One replica run
    over its stream keeps the exact room: a layout the same in every
    replication fixes where its segments fall in the processor's caches
    relative to each other, which measured slower on the single-replica
    workloads than the exact room's, different in each replication;
    `benchmarks/HISTORY.md`.)"""
    s = 0
    x = nitl - 1
    while x >= 16:
        x >>= 1
        s += 1
    return (x + 1) << s


@njit_noalloc
def _ws_dims(n, prompt, output, pgrp, plen, ipar):
    """Data-dependent sizes: (seats, prefix-cache entries, prefix references,
    gap samples, most prefix blocks of a request, blocks of the block pool,
    entries of the requests' block lists); the last two are 0 without
    prefix caching by block hash."""
    bs = ipar[I_BLOCK_SIZE]
    cap = max(1, min(ipar[I_MAX_NUM_SEQS], n))
    if ipar[I_SESSIONS] != 0:
        return _session_dims(n, output, ipar, cap)
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
            elif pgrp[i] <= -2:   # (a trace's identities: `block_pool._block_id` keys prompt blocks by request)
                jmax = max(jmax, prompt[i] // bs)
    nbp = 0
    nbt = 0
    if ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1:
        nbp = ipar[I_NUM_GPU_BLOCKS]
        for i in range(n):
            nbt += _list_capacity(prompt[i], output[i], nbp, bs)
    return cap, max(ngrp * jmax, 1), max(nheld, 1), max(n_tok, 1), jmax, nbp, nbt


@njit_noalloc
def _session_dims(n, output, ipar, cap):
    """`_ws_dims` of a workload of sessions: a turn's prompt is set when it is
    sent (`arrivals._session_sends`), so the sizes are for the longest
    request ingestion admits (`arrivals._session_max_len`): its blocks, the
    block pool's per-request lists; and every output drawn (each is some
    turn's). No prefix-group entries (sessions need caching by block hash)."""
    bs = ipar[I_BLOCK_SIZE]
    kv_tokens = ipar[I_NUM_GPU_BLOCKS] * bs
    n_tok = 0
    for i in range(n):
        n_tok += min(output[i], kv_tokens)
    lim = _session_max_len(ipar)
    nbp = 0
    nbt = 0
    if ipar[I_CACHING] == 1 and ipar[I_BLOCK_HASH] >= 1:
        nbp = ipar[I_NUM_GPU_BLOCKS]
        nbt = n * _list_capacity(lim, 0, nbp, bs)
    return cap, 1, 1, max(n_tok, 1), lim // bs + 1, nbp, nbt


@njit_noalloc(entry=True)
def _ws_need(n, prompt, output, pgrp, plen, ipar):
    """Sizes (int64 entries, float64 entries) of the workspace of requests ``0..n-1``."""
    cap, ncnt, nheld, nitl, _jmax, nbp, nbt = _ws_dims(n, prompt, output, pgrp, plen, ipar)
    return _ws_sizes(n, ipar[I_BLOCK_SIZE], cap, ncnt, nheld, nitl, nbp, nbt)


@njit_noalloc(inline="llvm")
def _handed_dims(n, prompt, output, pgrp, plen, ipar):
    """`_ws_dims` of a replica set up empty and handed its requests (a
    fleet's, bounded by the requests ``0..n-1`` of the stream): the gap
    samples' room rounded up (`_gap_room`)."""
    cap, ncnt, nheld, nitl, jmax, nbp, nbt = _ws_dims(n, prompt, output, pgrp, plen, ipar)
    return cap, ncnt, nheld, _gap_room(nitl), jmax, nbp, nbt


@njit_noalloc(entry=True)
def _ws_need_handed(n, prompt, output, pgrp, plen, ipar):
    """`_ws_need` of a replica handed its requests (`_handed_dims`; a
    fleet's, `replica._state_dims`)."""
    cap, ncnt, nheld, nitl, _jmax, nbp, nbt = _handed_dims(n, prompt, output, pgrp, plen, ipar)
    return _ws_sizes(n, ipar[I_BLOCK_SIZE], cap, ncnt, nheld, nitl, nbp, nbt)


@njit_noalloc
def _compact_dims(m, n, prompt, output, pgrp, plen, ipar):
    """`_handed_dims` of a replica that holds at most ``m`` (<= ``n``) of
    the requests ``0..n-1`` it may be handed (a fleet's compact row,
    `cluster.compact_capacity`): ``m`` seats at most, and the gap samples'
    room for ``m / n`` of the stream's bound (`_gap_share`); the
    prefix-cache and block-pool sizes stay the whole stream's (they bound
    any ``m`` of its requests). With ``m`` = ``n``, `_handed_dims` itself.
    A request that would overfill either bound is not handed
    (`cluster.ROW_FULL`)."""
    return _compact_of(m, n, ipar, _ws_dims(n, prompt, output, pgrp, plen, ipar))


@njit_noalloc(inline="llvm")
def _compact_of(m, n, ipar, dims):
    """`_compact_dims` from the stream's dimensions ``dims`` (`_ws_dims`)."""
    cap, ncnt, nheld, nitl, jmax, nbp, nbt = dims
    if m < n:
        cap = max(1, min(ipar[I_MAX_NUM_SEQS], m))
        nitl = _gap_share(m, n, nitl)
    return cap, ncnt, nheld, _gap_room(nitl), jmax, nbp, nbt


@njit_noalloc(entry=True)
def _fleet_sizes(m, n, prompt, output, pgrp, plen, ipar, out):
    """A fleet replication's workspace sizes from one scan of its stream
    (``out``: int, float entries): `_ws_need_compact` of a replica of ``m``
    seats in ``out[0:2]``, and `_ws_need_handed` of the stream, the
    reduction's workspace, in ``out[2:4]``."""
    dims = _ws_dims(n, prompt, output, pgrp, plen, ipar)
    bs = ipar[I_BLOCK_SIZE]
    cap, ncnt, nheld, nitl, _jmax, nbp, nbt = _compact_of(n, n, ipar, dims)   # (all n seats: `_handed_dims`)
    out[2], out[3] = _ws_sizes(n, bs, cap, ncnt, nheld, nitl, nbp, nbt)
    cap, ncnt, nheld, nitl, _jmax, nbp, nbt = _compact_of(m, n, ipar, dims)
    out[0], out[1] = _ws_sizes(m, bs, cap, ncnt, nheld, nitl, nbp, nbt)


@njit_noalloc(inline="llvm")
def _gap_share(m, n, nitl):
    """The gap samples' bound of a compact row of ``m`` of the ``n``
    requests (`_compact_dims`): the stream's bound ``nitl`` shared by
    request count (``m`` has room to spare for a router's imbalance);
    ``floor(nitl * m / n)`` without the product, which may pass int64."""
    return max((nitl // n) * m + ((nitl % n) * m) // n, 1)


@njit_noalloc(entry=True)
def _ws_need_compact(m, n, prompt, output, pgrp, plen, ipar):
    """`_ws_need` of a replica of ``m`` seats for the stream's requests ``0..n-1``
    (`_compact_dims`; a fleet's compact row)."""
    cap, ncnt, nheld, nitl, _jmax, nbp, nbt = _compact_dims(m, n, prompt, output, pgrp, plen, ipar)
    return _ws_sizes(m, ipar[I_BLOCK_SIZE], cap, ncnt, nheld, nitl, nbp, nbt)


@njit_noalloc
def _table_size(nbp):
    """Slots of the block pool's identity table: a power of two, at least
    twice the blocks (each cached block adds at most one identity)."""
    m = 2
    while m < 2 * nbp:
        m *= 2
    return m


@njit_noalloc(inline="llvm")
def _int_sizes(n, bs, cap, ncnt, nheld, nitl, nbp, nbt):
    """The sizes of the ``WI_*`` segments, in order: the one statement of
    ``wi``'s layout (dimensions: `_ws_dims`; ``nbp`` 0: no block pool)."""
    nht = _table_size(nbp) if nbp > 0 else 0
    npr = n if nbp > 0 else 0   # per-request columns of the block pool
    return (n, n, n, n, n, n, n, n,
            N_HIST, nitl,
            2 * n + 2, 2,
            2 * cap, n, n,
            cap, n, n, n, bs,
            1, cap, cap, 3,
            cap,
            n + 1, 1,
            n, n + 1, ncnt, ncnt, ncnt, 4, nheld, n, n,
            nbp + 1, nbp + 1, nbp, nbp, nbp, nbp,
            nht, nht, nht, nht,
            npr + 1, nbt, npr, 4,
            cap + 1,
            cap,
            N_RI)


@njit_noalloc(inline="llvm")
def _float_sizes(n, cap, nitl):
    """The sizes of the ``WF_*`` segments, in order: the one statement of ``wf``'s layout."""
    return (n, n, n, n,
            N_ACC,
            nitl,
            n, cap + 1, n, n,
            N_RF)


def _total(sizes):
    """The entries of a layout (`_int_sizes`, `_float_sizes`). Compiled, the
    sum is written out (`_total_compiled`); in Python, the loop."""
    o = 0
    for x in sizes:
        o += x
    return o


@intrinsic(prefer_literal=False)
def _tuple_sum(typingctx, sizes):
    """The sum of a tuple of integers, its entries added one by one (an
    int64)."""
    if not (isinstance(sizes, types.UniTuple) and isinstance(sizes.dtype, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        acc = context.get_constant(types.int64, 0)
        for i in range(sig.args[0].count):
            x = context.cast(builder, builder.extract_value(args[0], i), sig.args[0].dtype, types.int64)
            acc = builder.add(acc, x)
        return acc

    return types.int64(sizes), codegen


@overload(_total, target="generic")
def _total_compiled(sizes):
    # Numba compiles a loop over a homogeneous tuple to a loop that picks each entry through a jump table,
    # which LLVM does not unroll: half of a resumed `replica._simulate` that does nothing (it checks the
    # workspace's size by the layout's sums at every call, `_ws_sizes`); the entries added one by one fold.
    # (An intrinsic: typed at once, where the same sum written out in Python took Numba 0.1 s a tuple.)
    if isinstance(sizes, types.UniTuple) and isinstance(sizes.dtype, types.Integer):
        return lambda sizes: _tuple_sum(sizes)
    return None


def _take(w, o, size):
    """The view ``w[o:o + size]`` of the segment of ``size`` entries that
    starts at ``o``, and where the next one starts (`_carve` walks a
    layout's segments in order; the layout is checked against the
    workspace's size before). Compiled, the view is built by `_segment_view`,
    without a slice's bounds normalisation (`_carve` takes some 80 of them
    at every call of `replica._simulate`, resumed ones included); in Python
    and under the CUDA simulator, it is the slice."""
    return w[o:o + size], o + size


@intrinsic(prefer_literal=False)
def _segment_view(typingctx, a, o, size):
    """``a[o:o + size]`` for a segment inside the 1-D array ``a``: the view's
    data pointer ``o`` strides on from ``a``'s, its length ``size``, its
    other fields ``a``'s (the same type: a 1-D view keeps its layout)."""
    if not (isinstance(a, types.Array) and a.ndim == 1 and isinstance(o, types.Integer)
            and isinstance(size, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        src = make_array(sig.args[0])(context, builder, args[0])
        start = context.cast(builder, args[1], sig.args[1], types.intp)
        length = context.cast(builder, args[2], sig.args[2], types.intp)
        stride = cgutils.unpack_tuple(builder, src.strides, 1)[0]
        out = make_array(sig.return_type)(context, builder)
        populate_array(out, data=cgutils.pointer_add(builder, src.data, builder.mul(start, stride), src.data.type),
                       shape=cgutils.pack_array(builder, [length]), strides=src.strides, itemsize=src.itemsize,
                       meminfo=src.meminfo, parent=src.parent)
        # (a borrowed reference: with Numba's runtime on, its count is raised, as a slice's; the kernels run
        # without it, where this is nothing)
        return impl_ret_borrowed(context, builder, sig.return_type, out._getvalue())

    return a(a, o, size), codegen


@overload(_take, target="generic")
def _take_compiled(w, o, size):
    if isinstance(w, types.Array) and w.ndim == 1:
        return lambda w, o, size: (_segment_view(w, o, size), o + size)
    return None


@njit_noalloc(inline="llvm")
def _sched_offset(n, bs, cap, ncnt, nheld, nitl, nbp, nbt):
    """Where segment ``WI_SCHED`` of ``wi`` starts (`_int_sizes`' layout;
    ``WI_EVER`` follows it, ``n`` entries on)."""
    return _total(_int_sizes(n, bs, cap, ncnt, nheld, nitl, nbp, nbt)[:WI_SCHED])


@njit_noalloc(inline="llvm")
def _key_offset(n, cap, nitl):
    """Where segment ``WF_KEY`` of ``wf`` starts (`_float_sizes`' layout)."""
    return _total(_float_sizes(n, cap, nitl)[:WF_KEY])


# (`_int_sizes`, `_float_sizes`, `_total` and `_ws_sizes` inlined: every resumed `replica._simulate` checks its
# workspace's size by them, and as calls they built, passed and summed the layout's tuples at each entry; inlined,
# LLVM folds the sums)
@njit_noalloc(inline="llvm")
def _ws_sizes(n, bs, cap, ncnt, nheld, nitl, nbp, nbt):
    """The workspace sizes (int64 entries, float64 entries) from the dimensions `_ws_dims` gives."""
    return _total(_int_sizes(n, bs, cap, ncnt, nheld, nitl, nbp, nbt)), _total(_float_sizes(n, cap, nitl))


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
Batch = namedtuple("Batch", ("q", "qs", "run", "oth", "zl"))   # zl: finished, held (`pipeline`)
#: The lazy decoders (`decoders`) and their completion heap.
Decoders = namedtuple("Decoders", ("dmem", "dpos", "koff", "goff", "ph", "hk", "hr", "hs", "dstate"))
#: Swap preemption: the swapped queue, its keys, and each request's swaps and time swapped.
Swap = namedtuple("Swap", ("sq", "sqs", "skey", "swapped_since", "nswap", "swapped_s"))
#: The block pool of prefix caching by block hash (`block_pool`).
BlockPool = namedtuple("BlockPool", ("qprev", "qnext", "ref", "bhash", "dprev", "dnext",
                                     "hused", "hkey", "hhead", "htail", "boff", "rblk", "ncached", "pst"))
#: The prefix cache (`prefix_cache`), each request's cached tokens, and the block pool.
PrefixCache = namedtuple("PrefixCache", ("fpre", "hoff", "cnt", "lprev", "lnext", "cst", "held", "private",
                                         "nent", "ctok", "pool"))
#: What the run records: inter-token gaps, the decode term by batch size, the accumulators.
Record = namedtuple("Record", ("itl_v", "itl_w", "gapw", "dec_cost", "acc"))
#: The replica's scalar state between calls (`RI_*`, `RF_*`).
Scalars = namedtuple("Scalars", ("ri", "rf"))
#: The requests of a stream (the arguments of `replica._simulate`).
Stream = namedtuple("Stream", ("arrival", "prompt", "output", "prio", "sjfk", "pgrp", "plen"))


@njit_noalloc(inline="llvm")
def _carve(stream, dims, wi, wf):
    """The engine's views (`Requests`, `Batch`, `Decoders`, `Swap`,
    `PrefixCache`, `Record`, `Scalars`) of the workspace ``wi``/``wf`` for
    the requests of ``stream`` and the dimensions ``dims`` (`_ws_dims`:
    seats, cache entries, prefix references, gap samples, pool blocks, block
    list entries; n first and the block size second): each
    layout's segments taken in their order, ``WI_*`` 0, 1, ... (checked by
    tests/test_workspace.py)."""
    n, bs, cap, ncnt, nheld, nitl, nbp, nbt = dims
    si = _int_sizes(n, bs, cap, ncnt, nheld, nitl, nbp, nbt)
    o = 0
    status, o = _take(wi, o, si[WI_STATUS])
    k, o = _take(wi, o, si[WI_K])
    g, o = _take(wi, o, si[WI_G])
    blocks, o = _take(wi, o, si[WI_BLOCKS])
    npre, o = _take(wi, o, si[WI_NPRE])
    nswap, o = _take(wi, o, si[WI_NSWAP])
    ctok, o = _take(wi, o, si[WI_CTOK])
    _ones, o = _take(wi, o, si[WI_ONES])
    _hist, o = _take(wi, o, si[WI_HIST])
    itl_w, o = _take(wi, o, si[WI_ITL_W])
    q, o = _take(wi, o, si[WI_QUEUE])
    qs, o = _take(wi, o, si[WI_QUEUE_STATE])
    run, o = _take(wi, o, si[WI_RUN])
    sched, o = _take(wi, o, si[WI_SCHED])
    ever, o = _take(wi, o, si[WI_EVER])
    dmem, o = _take(wi, o, si[WI_DMEM])
    dpos, o = _take(wi, o, si[WI_DPOS])
    koff, o = _take(wi, o, si[WI_KOFF])
    goff, o = _take(wi, o, si[WI_GOFF])
    ph, o = _take(wi, o, si[WI_PHASES])
    hs, o = _take(wi, o, si[WI_HEAP_SIZE])
    hk, o = _take(wi, o, si[WI_HEAP_KEY])
    hr, o = _take(wi, o, si[WI_HEAP_REQ])
    dstate, o = _take(wi, o, si[WI_DSTATE])
    oth, o = _take(wi, o, si[WI_OTHERS])
    sq, o = _take(wi, o, si[WI_SWAPQ])
    sqs, o = _take(wi, o, si[WI_SWAPQ_SIZE])
    fpre, o = _take(wi, o, si[WI_FPRE])
    hoff, o = _take(wi, o, si[WI_HOFF])
    cnt, o = _take(wi, o, si[WI_CNT])
    lprev, o = _take(wi, o, si[WI_LPREV])
    lnext, o = _take(wi, o, si[WI_LNEXT])
    cst, o = _take(wi, o, si[WI_CST])
    held, o = _take(wi, o, si[WI_HELD])
    private, o = _take(wi, o, si[WI_PRIVATE])
    nent, o = _take(wi, o, si[WI_NENT])
    qprev, o = _take(wi, o, si[WI_QPREV])
    qnext, o = _take(wi, o, si[WI_QNEXT])
    ref, o = _take(wi, o, si[WI_REF])
    bhash, o = _take(wi, o, si[WI_BHASH])
    dprev, o = _take(wi, o, si[WI_DPREV])
    dnext, o = _take(wi, o, si[WI_DNEXT])
    hused, o = _take(wi, o, si[WI_HUSED])
    hkey, o = _take(wi, o, si[WI_HKEY])
    hhead, o = _take(wi, o, si[WI_HHEAD])
    htail, o = _take(wi, o, si[WI_HTAIL])
    boff, o = _take(wi, o, si[WI_BOFF])
    rblk, o = _take(wi, o, si[WI_RBLK])
    ncached, o = _take(wi, o, si[WI_NCACHED])
    pst, o = _take(wi, o, si[WI_PST])
    gapw, o = _take(wi, o, si[WI_GAPW])
    zl, o = _take(wi, o, si[WI_HELD_FINISHED])
    ri, o = _take(wi, o, si[WI_SCALARS])
    sf = _float_sizes(n, cap, nitl)
    o = 0
    first_t, o = _take(wf, o, sf[WF_FIRST])
    last_t, o = _take(wf, o, sf[WF_LAST])
    finish_t, o = _take(wf, o, sf[WF_FINISH])
    swapped_s, o = _take(wf, o, sf[WF_SWAPPED])
    acc, o = _take(wf, o, sf[WF_ACC])
    itl_v, o = _take(wf, o, sf[WF_ITL_V])
    key, o = _take(wf, o, sf[WF_KEY])
    dec_cost, o = _take(wf, o, sf[WF_DEC_COST])
    skey, o = _take(wf, o, sf[WF_SKEY])
    swapped_since, o = _take(wf, o, sf[WF_SWAPPED_SINCE])
    rf, o = _take(wf, o, sf[WF_SCALARS])
    req = Requests(stream.arrival, stream.prompt, stream.output, stream.prio, stream.sjfk, stream.pgrp, stream.plen,
                   status, k, g, blocks, npre, sched, ever, first_t, last_t,
                   finish_t, key)
    return (req, Batch(q, qs, run, oth, zl),
            Decoders(dmem, dpos, koff, goff, ph, hk, hr, hs, dstate),
            Swap(sq, sqs, skey, swapped_since, nswap, swapped_s),
            PrefixCache(fpre, hoff, cnt, lprev, lnext, cst, held, private,
                        nent, ctok,
                        BlockPool(qprev, qnext, ref, bhash, dprev, dnext, hused,
                                  hkey, hhead, htail, boff, rblk, ncached, pst)),
            Record(itl_v, itl_w, gapw, dec_cost, acc),
            Scalars(ri, rf))
