"""Disaggregated prefill and decode, in compiled code.

Two pools of replicas, each a fleet's buffers (`cluster.FleetBuffers`):
the prefill pool runs the stream with every output capped at one token
(`cluster._simulate_fleet`, its router and all); each request that
completed there is then handed, in order of its first token ``t1`` (ties
by request index), to the decode replica the decode router picks from the
decode pool's state at ``t1`` (`cluster._look_due`, `router._route`), arriving
there when its KV has crossed that replica's inbound link (`_transfer`)
with its prompt's KV but the last token already computed (the engine's
admission starts it there: `replica._schedule_fast`, `_admit_waiting`,
which with caching by block hash first references the prompt's blocks
that replica holds cached and caches the rest: the KV loaded covers them).
Semantics: ``docs/engine-model.md``, "Disaggregated prefill and decode".

Why the prefill pool runs first, whole: nothing on the decode side acts on
the prefill side in this model (a prefill replica frees a request's blocks
at its first token), so its run is the same whenever the hand-offs happen;
the hand-offs then happen in time order, each decode replica advanced to
the hand-off's time, as a fleet's arrivals are. This holds under async
scheduling and caching by block hash too: each replica's pipeline and
block pool are its own (`pipeline`, `block_pool`).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .._numba_options import njit_noalloc
from .cluster import (ROW_FULL, TMAP_SMALL, _call, _fits, _look, _look_due, _own_records, _queue_handed, _queue_init,
                      _ri, _rows, _set_up_uniform, _simulate_fleet)
from .layout import (A_BLOCKS_END, A_END, A_HIT_TOK, A_KV_INT, A_L_INT, A_MAX_BLOCKS, A_MAX_SWAP, A_N_ITL,
                     A_OCC_INT, A_QUERY_TOK, A_QUEUE_INT, A_STEPS, A_WINDOW_START, C_GOODPUT, C_TTFT_MEAN,
                     DL_BANDWIDTH, DL_KV_BYTES, DL_LATENCY, DL_LOAD_CAP, DL_SCORERS, F_TPOT_SLO, F_TTFT_OVERHEAD,
                     F_TTFT_SLO, I_BLOCK_SIZE, I_HAS_TPOT_SLO, I_HAS_TTFT_SLO, I_NUM_GPU_BLOCKS, I_SWAP, I_WARMUP,
                     LOAD_IN_SYSTEM, N_ACC, N_HIST, ROUTER_PREFIX_AFFINITY, ROUTER_WEIGHTED, ST_COMPLETED, _COL)
from .metrics import _mean, _percentiles, _reduce
from .replica import STEP_ADVANCE, STEP_FINISH, STEP_NO_STRETCH, _hand
from .rng import _seed_streams
from .router import _in_system_only, _needs_state, _reads_kv, _route, _route_weighted
from .trace_blocks import localise as _localise, reset as _tmap_reset, route_prefix as _route_prefix
from .workspace import (RI_N_KNOWN, WF_FINISH, WF_FIRST, WF_HEAD, WF_LAST, WI_HEAD,
                        WI_K, WI_NPRE, WI_NSWAP, WI_ONES, WI_STATUS)

#: The hand-off's buffers (`disagg_buffers`), per request of the stream:
#: its prefill first token ``t1`` (nan: it never completed there), its KV's
#: arrival at its decode replica ``ready``, the hand-off order and a sort's
#: scratch; per decode replica the time its link is free; the routers'
#: random streams (the decode router's at purpose `layout.S_ROUTE_DECODE`).
DisaggBuffers = namedtuple("DisaggBuffers", ("t1", "ready", "order", "scratch", "link_free", "rstate"))


@njit_noalloc
def _sort_by_time(m, key, order, scratch):
    """Sort ``order[:m]`` (request indices, ascending) by ``key``, ties
    keeping the index order. The prefill side's first tokens come nearly
    in index order (each request's a prefill step or a few after its
    arrival), so an insertion sort, O(m + inversions), does it in one pass;
    past ``4 m`` moves it stops and a bottom-up merge sort finishes (both
    stable, and the array they leave or take has equal keys in index order:
    the part sorted so far holds lower indices than the rest, which is still
    in index order), so the order is the same either way: by key, then
    index. The keys are not NaN (the first tokens of completed requests):
    the two sorts would place a NaN differently."""
    moves = 0
    done = m
    for e in range(1, m):
        x = order[e]
        kx = key[x]
        f = e
        while f > 0 and key[order[f - 1]] > kx:
            order[f] = order[f - 1]
            f -= 1
        order[f] = x
        moves += e - f
        if moves > 4 * m:
            done = e
            break
    if done == m:
        return
    width = 1
    src, dst = order, scratch
    while width < m:
        lo = 0
        while lo < m:
            mid = min(lo + width, m)
            hi = min(lo + 2 * width, m)
            a, b, o = lo, mid, lo
            while a < mid and b < hi:
                if key[src[b]] < key[src[a]]:
                    dst[o] = src[b]
                    b += 1
                else:
                    dst[o] = src[a]
                    a += 1
                o += 1
            while a < mid:
                dst[o] = src[a]
                a += 1
                o += 1
            while b < hi:
                dst[o] = src[b]
                b += 1
                o += 1
            lo = hi
        src, dst = dst, src
        width *= 2
    if src is not order:
        for e in range(m):
            order[e] = src[e]


@njit_noalloc
def _handoffs(n, fbp, db):
    """The requests that completed on the prefill side into ``db.order``,
    sorted by their first token (ties: by index); returns how many."""
    cp = fbp.rs_a.shape[1]   # (a replica's capacity: its rows' per-request columns)
    m = 0
    for i in range(n):
        r, j = fbp.owner[i], fbp.local[i]
        wi, wf = fbp.wi[r], fbp.wf[r]
        if wi[WI_STATUS * cp + j] == ST_COMPLETED:
            db.t1[i] = wf[WF_FIRST * cp + j]
            db.order[m] = i
            m += 1
        else:
            db.t1[i] = np.nan
    _sort_by_time(m, db.t1, db.order, db.scratch)
    return m


@njit_noalloc
def _init_pool(n, stream, ipar, dims, fpar, lat, nrep, fb, full, ws):
    """Set up ``nrep`` empty replicas in ``fb`` (as `cluster._simulate_fleet`
    does) for the stream ``(arrival, prompt, output, prio, sjfk, pgrp,
    plen)``, laid out by the record ``dims`` (`dims_record`), each
    measuring from ``ws``; returns `_simulate`'s code."""
    rc = _set_up_uniform(n, stream, ipar, fpar, lat, nrep, fb, full, dims)
    if rc < 0:
        return rc
    for r in range(nrep):
        fb.wf[r][WF_HEAD * fb.rs_a.shape[1] + A_WINDOW_START] = ws
    return 0


@njit_noalloc
def _transfer(link, link_free, d, t1, p):
    """When the KV of a prompt of ``p`` tokens, handed off at ``t1``, has
    reached decode replica ``d``: its inbound link carries one transfer at a
    time, in hand-off order."""
    start = max(t1, link_free[d])
    link_free[d] = start + p * link[DL_KV_BYTES] / link[DL_BANDWIDTH]
    return link_free[d] + link[DL_LATENCY]


@njit_noalloc(entry=True)
def _simulate_disagg(n, arrival, prompt, ones, output, prio, sjfk, pgrp, plen,
                     ipar_p, fpar_p, lat_p, fleet_p, router_p, nrep_p, fbp, full_p,
                     ipar_d, dims_d, fpar_d, lat_d, router_d, nrep_d, fbd, full_d,
                     link, key0, key1, rep, db):
    """Run a disaggregated server over the requests ``0..n-1`` of its stream, to the end.

    Parameters
    ----------
    n, arrival, prompt, output, prio, sjfk, pgrp, plen : int, 1-D arrays
        The stream (`workload._draw_workload`), sorted by arrival.
    ones : 1-D int array
        ``n`` ones: the prefill side's outputs.
    ipar_p, fpar_p, lat_p, fleet_p, router_p, nrep_p, fbp, full_p
        The prefill pool: its parameter records, its fleet record and
        router (`cluster._simulate_fleet`'s), replicas, buffers and engine.
    ipar_d, fpar_d, lat_d, router_d, nrep_d, fbd, full_d
        The decode pool: the same, without a fleet record (live state, no
        routing latency); ``ipar_d``'s warm-up is the stream's.
    dims_d : 1-D int array
        The integer record the decode pool's rows are laid out by
        (`dims_record` of ``ipar_d``: ``fbd``'s sizes are of it).
    link : 1-D float array
        The link's record (`layout.DL_*`).
    key0, key1, rep : int
        The routers' random streams' keys.
    db : DisaggBuffers
        The hand-off's buffers (`disagg_buffers`).

    Returns
    -------
    int
        0, or the first negative code of `replica._simulate` or `_hand`;
        `cluster.ROW_FULL` if a request would overfill a compact row of
        either pool (its capacity ``fb.rs_a.shape[1]`` below ``n``).
    """
    md = fbd.rs_a.shape[1]
    rc = _simulate_fleet(n, arrival, prompt, ones, prio, sjfk, pgrp, plen, ipar_p, fpar_p, lat_p, fleet_p,
                         router_p, nrep_p, key0, key1, rep, fbp, full_p)
    if rc < 0:
        return rc
    m = _handoffs(n, fbp, db)
    warmup = ipar_d[I_WARMUP]
    ws = 0.0 if warmup == 0 else (arrival[warmup] if n > warmup else np.inf)
    rc = _init_pool(n, (arrival, prompt, output, prio, sjfk, pgrp, plen), ipar_d, dims_d, fpar_d, lat_d, nrep_d, fbd,
                    full_d, ws)
    if rc < 0:
        return rc
    # each decode replica on its rows of records: per-step noise, a stream of its own (replica nrep_p + d)
    _own_records(fbd, nrep_d, fpar_d, lat_d, nrep_p)
    _seed_streams(key0, key1, rep, db.rstate)
    rstate = db.rstate[1:]   # (its `S_ROUTE` entry is purpose `S_ROUTE_DECODE`)
    for d in range(nrep_d):
        db.link_free[d] = 0.0
    for i in range(n):
        fbd.owner[i] = -1
        db.ready[i] = np.nan
    reads = _needs_state(router_d) and nrep_d > 1
    what = STEP_ADVANCE | (STEP_NO_STRETCH if _reads_kv(router_d, link[DL_SCORERS:]) else 0)
    cap = link[DL_LOAD_CAP]
    # the decode router's look by the fleet's event queue (`cluster._look_due`: only the replicas whose state
    # can change by the hand-off advanced, with the departure bound for the routers that read requests in
    # the system only, each replica on its rows of records). The same bits as advancing and observing every
    # replica (`cluster._look`, which a short ``fbd.ev`` asks for: tests): each look advances exactly the
    # replicas `_look` would (`cluster`, the comment before `_due`), and a replica not advanced keeps the
    # row of the view it had, which is what `_look` would observe of it
    queue = reads and fbd.ev.size >= 4 * nrep_d + 1
    # the departure bound (`cluster._departs`) where its buffers hold it (an empty ``fbd.dep``: off, for tests)
    bound = _in_system_only(router_d) and fbd.dep.size >= nrep_d
    if queue:
        _queue_init(fbd, nrep_d, md, what, bound)
    # a replayed trace's block identities: each decode replica handed parents of its own (`trace_blocks`),
    # in the hand-offs' order (first tokens); the prefill pool's map is its fleet's (`fbp.tmap`)
    jg = _tmap_reset(n, prompt, ipar_d[I_BLOCK_SIZE], fbd.tmap)
    if jg < 0:
        return TMAP_SMALL
    traced = jg > 0
    measured = warmup == 0
    for e in range(m):
        i = db.order[e]
        t1 = db.t1[i]
        if not measured and i >= warmup:   # the decode pool's warm-up: hand-offs before the first measured one
            measured = True
            for r in range(nrep_d):
                fbd.rip[r, I_WARMUP] = _ri(fbd, r, RI_N_KNOWN)
        if queue:
            rc = _look_due(fbd, nrep_d, md, full_d, t1, what, bound)
        elif reads:
            rc = _look(fbd, nrep_d, md, full_d, t1, ipar_d[I_NUM_GPU_BLOCKS], what, bound)
        if reads and rc < 0:
            return rc
        if traced and router_d == ROUTER_PREFIX_AFFINITY:   # (the most leading blocks handed, `trace_blocks`)
            d = _route_prefix(i, fbd.load, LOAD_IN_SYSTEM, cap, nrep_d, prompt, pgrp, plen, ipar_d[I_BLOCK_SIZE],
                              jg, fbd.tmap)
        elif router_d == ROUTER_WEIGHTED:
            d = _route_weighted(i, fbd.load, fbd.table, rstate, link[DL_SCORERS:], fbd.rip, nrep_d, prompt, pgrp, plen,
                                ipar_d[I_BLOCK_SIZE], jg, fbd.tmap)
        else:   # (a trace's parents are no groups: session affinity routes by load)
            d = _route(router_d, i, pgrp[i], fbd.load, fbd.table, rstate, cap, nrep_d)
        if md < n and not _fits(fbd, d, measured, output[i]):
            return ROW_FULL
        at = _transfer(link, db.link_free, d, t1, prompt[i])
        ri = fbd.rs_i
        wi, wf = _rows(fbd, d)
        g, lp = pgrp[i], plen[i]
        if traced:
            g, lp = _localise(i, d, nrep_d, _ri(fbd, d, RI_N_KNOWN), prompt, pgrp, plen, ipar_d[I_BLOCK_SIZE], jg,
                              fbd.tmap)
        j = _hand(md, fbd.rs_a[d], ri[0, d], ri[1, d], ri[2, d], ri[3, d], ri[4, d], ri[5, d], fbd.rip[d], fpar_d,
                  wi, wf, full_d, at, prompt[i], output[i], prio[i], sjfk[i], g, lp)
        if j < 0:
            return j
        fbd.wi[d][WI_K * md + j] = prompt[i] - 1   # its KV but the last token's: vLLM recomputes that one
        fbd.owner[i] = d
        fbd.local[i] = j
        db.ready[i] = at
        if queue:
            _queue_handed(fbd, d, nrep_d, md, what, bound)
    for r in range(nrep_d):
        rc = _call(fbd, r, md, fbd.rfp[r], fbd.rlat[r], full_d, np.inf, STEP_ADVANCE | STEP_FINISH)
        if rc < 0:
            return rc
    return 0


@njit_noalloc
def _gather_pool(n, fb, nrep, share, macc, pool, wm_i, wm_f, m):
    """A pool's run-level figures into the server's ``macc`` (occupancy and
    KV use weighted by ``share``, 1 / all replicas; the rest totals or
    maxima) and its own time integrals into ``pool`` (occupancy, KV use:
    means over the pool; queue: total); its inter-token gaps appended to
    the server's from entry ``m``; returns the new count."""
    c = fb.rs_a.shape[1]   # (a replica's capacity)
    o_wv = WF_HEAD * n + N_ACC
    o_ww = WI_HEAD * n + N_HIST
    o_rv = WF_HEAD * c + N_ACC
    o_rw = WI_HEAD * c + N_HIST
    for r in range(nrep):
        wi, wf = fb.wi[r], fb.wf[r]
        acc = wf[WF_HEAD * c:WF_HEAD * c + N_ACC]
        for j in (A_OCC_INT, A_KV_INT):
            macc[j] += acc[j] * share
        for j in (A_QUEUE_INT, A_L_INT, A_STEPS, A_BLOCKS_END, A_HIT_TOK, A_QUERY_TOK):
            macc[j] += acc[j]
        for j in (A_MAX_BLOCKS, A_MAX_SWAP, A_END):
            macc[j] = max(macc[j], acc[j])
        pool[0] += acc[A_OCC_INT] / nrep
        pool[1] += acc[A_KV_INT] / nrep
        pool[2] += acc[A_QUEUE_INT]
        k = np.int64(acc[A_N_ITL])
        for e in range(k):
            wm_i[o_ww + m + e] = wi[o_rw + e]
            wm_f[o_wv + m + e] = wf[o_rv + e]
        m += k
    return m


@njit_noalloc
def _merge_requests(n, fbp, fbd, wm_i, wm_f, swap):
    """Each request's status, preemptions, first token and finish into the
    server's workspace: the decode side's where it got there (preemptions
    of both sides), else the prefill side's."""
    cp, cd = fbp.rs_a.shape[1], fbd.rs_a.shape[1]   # (the pools' capacities)
    for i in range(n):
        r, j = fbp.owner[i], fbp.local[i]
        wi, wf = fbp.wi[r], fbp.wf[r]
        st, npre = wi[WI_STATUS * cp + j], wi[WI_NPRE * cp + j]
        first, fin = wf[WF_FIRST * cp + j], wf[WF_FINISH * cp + j]
        # (swaps: a pool's column is written only where its engine swaps)
        nsw = wi[WI_NSWAP * cp + j] if swap and fbp.rip[r, I_SWAP] == 1 else 0
        d = fbd.owner[i]
        if d >= 0:
            k = fbd.local[i]
            wi, wf = fbd.wi[d], fbd.wf[d]
            st, first, fin = wi[WI_STATUS * cd + k], wf[WF_FIRST * cd + k], wf[WF_FINISH * cd + k]
            npre += wi[WI_NPRE * cd + k]
            if swap and fbd.rip[d, I_SWAP] == 1:
                nsw += wi[WI_NSWAP * cd + k]
        wm_i[WI_STATUS * n + i] = st
        wm_i[WI_NPRE * n + i] = npre
        if swap:
            wm_i[WI_NSWAP * n + i] = nsw
        wm_f[WF_FIRST * n + i] = first
        wm_f[WF_FINISH * n + i] = fin


C_WINDOW = _COL["window_s"]


@njit_noalloc(entry=True)
def _reduce_disagg(n, arrival, output, ipar, fpar, nrep_p, nrep_d, lag, fbp, fbd, db, wm_i, wm_f, row, extra):
    """The server's metrics row (`metrics._reduce` over every request, with
    the decode side's first token, then TTFT and goodput again with the
    prefill side's) and its own columns (`layout.DISAGG_COLUMNS`) into
    ``extra``. ``ipar``/``fpar``: the decode pool's records with the
    stream's warm-up (`reduction_record`: swaps counted if either pool
    swaps); ``lag``: the prefill pool's routing latency."""
    swap = ipar[I_SWAP] == 1
    macc = wm_f[WF_HEAD * n:WF_HEAD * n + N_ACC]
    for j in range(N_ACC):
        macc[j] = 0.0
    pool = extra[8:14]   # (integrals, divided by the window below)
    for j in range(6):
        pool[j] = 0.0
    share = 1.0 / (nrep_p + nrep_d)
    m = _gather_pool(n, fbp, nrep_p, share, macc, extra[8:14:2], wm_i, wm_f, 0)
    m = _gather_pool(n, fbd, nrep_d, share, macc, extra[9:14:2], wm_i, wm_f, m)
    macc[A_N_ITL] = m
    macc[A_WINDOW_START] = fbd.wf[0][WF_HEAD * fbd.rs_a.shape[1] + A_WINDOW_START]
    for i in range(n):   # requests in transit (to a prefill replica, on a link) are in the system
        macc[A_L_INT] += max(0.0, min(arrival[i] + lag, macc[A_END]) - arrival[i])
        if fbd.owner[i] >= 0:
            macc[A_L_INT] += db.ready[i] - db.t1[i]
    _merge_requests(n, fbp, fbd, wm_i, wm_f, swap)
    _reduce(n, arrival, output, ipar, fpar, wm_i, wm_f, row)
    for c in range(5):
        extra[c] = row[C_TTFT_MEAN + c]   # the decode side's first token
    window = row[C_WINDOW]
    for c in range(8, 14):
        extra[c] = extra[c] / window if window > 0 else np.nan
    _client_ttft(n, arrival, output, ipar, fpar, db, wm_i, wm_f, window, row, extra)


@njit_noalloc
def _client_ttft(n, arrival, output, ipar, fpar, db, wm_i, wm_f, window, row, extra):
    """TTFT with the prefill side's first token (what the client sees), the
    goodput with it and the decode side's TPOT, and the KV transfer times,
    over the measured requests, into ``row`` and ``extra``."""
    status = wm_i[WI_STATUS * n:(WI_STATUS + 1) * n]
    first_d = wm_f[WF_FIRST * n:(WF_FIRST + 1) * n]
    finish = wm_f[WF_FINISH * n:(WF_FINISH + 1) * n]
    ones = wm_i[WI_ONES * n:(WI_ONES + 1) * n]
    hist = wm_i[WI_HEAD * n:WI_HEAD * n + N_HIST]
    v = wm_f[WF_LAST * n:(WF_LAST + 1) * n]   # (scratch: `_reduce` is done with it)
    has_ttft = ipar[I_HAS_TTFT_SLO] == 1
    has_tpot = ipar[I_HAS_TPOT_SLO] == 1
    overhead = fpar[F_TTFT_OVERHEAD]
    n_done = 0
    n_good = 0
    for i in range(ipar[I_WARMUP], n):
        if status[i] != ST_COMPLETED:
            continue
        a = db.t1[i] - arrival[i] + overhead
        v[n_done] = a
        n_done += 1
        ok = not (has_ttft and a > fpar[F_TTFT_SLO])
        if output[i] > 1 and has_tpot and (finish[i] - first_d[i]) / (output[i] - 1) > fpar[F_TPOT_SLO]:
            ok = False
        if ok:
            n_good += 1
    row[C_TTFT_MEAN] = _mean(v, n_done)
    _percentiles(v, ones, n_done, hist, 50.0, 90.0, 95.0, 99.0, 4, row, C_TTFT_MEAN + 1)
    if window > 0:
        row[C_GOODPUT] = n_good / window
    m = 0
    for i in range(ipar[I_WARMUP], n):
        if not np.isnan(db.ready[i]):
            v[m] = db.ready[i] - db.t1[i]
            m += 1
    extra[5] = _mean(v, m)
    _percentiles(v, ones, m, hist, 50.0, 99.0, 0.0, 0.0, 2, extra, 6)


def dims_record(ipar_d):
    """The integer record by which the decode pool is laid out
    (`workspace._ws_need_compact` of it, and `_simulate_disagg`'s ``dims_d``): its
    own with no warm-up, so that the gap samples' room counts every
    request's output tokens. The hand-offs come in order of first token,
    and a replica measures every request handed after its first measured
    one, requests of the warm-up among them: a room for the tokens after the
    warm-up alone was overrun (a stream whose warm-up requests reach the
    decode pool late, with long outputs; tests/test_disagg.py)."""
    from .layout import I_WARMUP
    out = np.array(ipar_d, np.int64)
    out[I_WARMUP] = 0
    return out


def reduction_record(ipar_p, ipar_d):
    """The integer record `_reduce_disagg` takes: the decode pool's, with
    swaps counted if either pool swaps (as a mixed fleet's reduction)."""
    from .layout import I_SWAP
    red = np.array(ipar_d, np.int64)
    red[I_SWAP] = max(int(ipar_p[I_SWAP]), int(ipar_d[I_SWAP]))
    return red


def disagg_buffers(n, nrep_d):
    """The hand-off's buffers for streams of at most ``n`` requests."""
    from .layout import N_STREAMS
    return DisaggBuffers(np.empty(n), np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64),
                         np.zeros(nrep_d), np.empty(N_STREAMS + 2, np.uint64))


# ------------------------------------------------------------------------------
# From Python

def simulate_disagg_stream(arrival, prompt, output, prio, sjfk, pgrp, plen, prefill, decode, link, key0=0, key1=0,
                           rep=0, queue=True, bound=True, capacity=None):
    """Simulate a disaggregated server over one given request stream (a
    Python entry, for tests and the reference's comparisons).

    Parameters
    ----------
    arrival, prompt, output, prio, sjfk, pgrp, plen : array_like
        The request stream, as `cluster.simulate_fleet_stream` takes it.
    prefill : tuple
        The prefill pool: (ipar, fpar, lat, fleet record, router code,
        replicas).
    decode : tuple
        The decode pool: (ipar, fpar, lat, router code, replicas).
    link : array_like
        The KV link's record (`layout.DL_*`: bandwidth, latency, KV bytes per
        token, load cap).
    key0, key1, rep : int
        The run's seed keys and the replication's index, as
        `cluster.simulate_fleet_stream` takes them.
    queue : bool
        False: the decode router's look advances and observes every decode
        replica at every hand-off (`cluster._look`) instead of those the
        event queue says can have changed (`cluster._look_due`; the same
        bits, more calls; for tests).
    bound : bool
        False turns the departure bound off in both pools (`cluster._departs`:
        the same bits, more calls; for tests).
    capacity : tuple of int, optional
        The prefill and the decode replicas' row capacities (1 .. the
        stream's size each; default `cluster.compact_capacity`'s); a run
        that would overfill a row is run again on rows for the whole stream
        (the same bits; for tests).

    Returns
    -------
    tuple
        A dict of per-request arrays (as
        `_reference_disagg.simulate_disagg_reference`'s), the metrics row
        and the disaggregated columns (`layout.DISAGG_COLUMNS`).
    """
    from .cluster import (_ngroups, compact_capacity, fleet_buffers, stream_trace_blocks, table_size,
                          until_rows_fit)
    from .layout import FL_LATENCY, N_COLUMNS, N_DISAGG_COLUMNS
    from .replica import engine_variant
    from .workspace import WI_G, _ws_need_compact, _ws_need_handed
    stream = (np.array(arrival, dtype=np.float64),) + tuple(
        np.array(x, dtype=np.int64) for x in (prompt, output, prio, sjfk, pgrp, plen))
    n = stream[0].size
    ipar_p, fpar_p, lat_p, fleet_p, router_p, nrep_p = prefill
    ipar_d, fpar_d, lat_d, router_d, nrep_d = decode
    ones = np.ones(n, np.int64)
    full_p, full_d = engine_variant(ipar_p), engine_variant(ipar_d)
    ng = _ngroups(stream[5])
    if capacity is None:
        capacity = compact_capacity(n, nrep_p, ipar_p), compact_capacity(n, nrep_d, ipar_d)
    elif not all(1 <= c <= max(n, 1) for c in capacity):
        raise ValueError(f"capacity must be two ints in 1 .. {max(n, 1)} (the stream's requests), got "
                         f"{capacity!r}")
    arrival, prompt, output, prio, sjfk, pgrp, plen = stream
    dims_d = dims_record(ipar_d)

    def attempt(compact):
        mp, md = (int(c) for c in capacity) if compact else (n, n)
        need_p = _ws_need_compact(np.int64(mp), np.int64(n), stream[1], ones, stream[5], stream[6], ipar_p)
        need_d = _ws_need_compact(np.int64(md), np.int64(n), stream[1], stream[2], stream[5], stream[6], dims_d)
        fbp = fleet_buffers(n, nrep_p, *need_p, table_size(ng, nrep_p, router_p), mp,
                            stream_trace_blocks(stream[1], stream[5], ipar_p))
        fbd = fleet_buffers(n, nrep_d, *need_d, table_size(ng, nrep_d, router_d), md,
                            stream_trace_blocks(stream[1], stream[5], ipar_d))
        if not queue:
            fbd = fbd._replace(ev=np.empty(0, np.int64))
        if not bound:
            fbp, fbd = fbp._replace(dep=np.empty(0)), fbd._replace(dep=np.empty(0))
        db = disagg_buffers(n, nrep_d)
        rc = _simulate_disagg(np.int64(n), arrival, prompt, ones, output, prio, sjfk, pgrp, plen,
                              ipar_p, fpar_p, lat_p, np.asarray(fleet_p, np.float64), np.int64(router_p),
                              np.int64(nrep_p), fbp, full_p, ipar_d, dims_d, fpar_d, lat_d, np.int64(router_d),
                              np.int64(nrep_d), fbd, full_d, np.asarray(link, np.float64), np.uint64(key0),
                              np.uint64(key1), np.int64(rep), db)
        return rc, fbp, fbd, db

    rc, fbp, fbd, db = until_rows_fit(attempt)
    if rc < 0:
        raise RuntimeError(f"the disaggregated server could not be simulated (code {rc})")
    mp, md = fbp.rs_a.shape[1], fbd.rs_a.shape[1]   # (the rows' capacities, `cluster`)
    # (the reduction's workspace: every request's gap samples, as the pool's rows)
    need_d = _ws_need_handed(np.int64(n), stream[1], stream[2], stream[5], stream[6], dims_d)
    wm_i, wm_f = np.zeros(need_d[0], np.int64), np.zeros(need_d[1])
    row, extra = np.empty(N_COLUMNS), np.empty(N_DISAGG_COLUMNS)
    _reduce_disagg(np.int64(n), arrival, output, reduction_record(ipar_p, ipar_d), fpar_d, np.int64(nrep_p),
                   np.int64(nrep_d), np.float64(fleet_p[FL_LATENCY]), fbp, fbd, db, wm_i, wm_f, row, extra)
    per = {"status": wm_i[WI_STATUS * n:(WI_STATUS + 1) * n].astype(np.int8),
           "first_token_s": db.t1.copy(),
           "decode_first_token_s": wm_f[WF_FIRST * n:(WF_FIRST + 1) * n].copy(),
           "ready_s": db.ready.copy(), "finish_s": wm_f[WF_FINISH * n:(WF_FINISH + 1) * n].copy(),
           "num_preemptions": wm_i[WI_NPRE * n:(WI_NPRE + 1) * n].copy(),
           "prefill_replica": fbp.owner.copy(), "decode_replica": fbd.owner.copy()}
    per["num_tokens"] = np.array([fbd.wi[d][WI_G * md + j] if d >= 0 else fbp.wi[r][WI_G * mp + k]
                                  for d, j, r, k in zip(fbd.owner, fbd.local, fbp.owner, fbp.local)], np.int64)
    per["decode_first_token_s"][fbd.owner < 0] = np.nan
    per["prefill_finish_s"] = np.array([fbp.wf[r][WF_FINISH * mp + k] for r, k in zip(fbp.owner, fbp.local)])
    return per, row, extra
