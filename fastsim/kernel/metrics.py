"""Reduction of one replication to its row of metrics (`layout.COLUMNS`):
means, weighted percentiles of TTFT, TPOT, ITL and E2E, throughputs,
goodput, blocking, and the time averages.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from .._numba_options import njit_noalloc
from .layout import (A_BLOCKS_END, A_END, A_HIT_TOK, A_KV_INT, A_L_INT, A_MAX_BLOCKS, A_MAX_SWAP, A_N_ITL,
    A_OCC_INT, A_QUERY_TOK, A_QUEUE_INT, A_STEPS, A_WINDOW_START, C_BLOCKING, C_DROP, C_E2E_MEAN, C_GOODPUT,
    C_HIT, C_ITL_MEAN, C_KV, C_N_ARRIVED, C_OCC, C_OUT_TPUT, C_PREEMPT, C_QUEUE, C_REQ_TPUT, C_SWAPS,
    C_TPOT_MEAN, C_TTFT_MEAN, F_HORIZON, F_TPOT_SLO, F_TTFT_OVERHEAD, F_TTFT_SLO, I_HAS_HORIZON,
    I_HAS_TPOT_SLO, I_HAS_TTFT_SLO, I_SWAP, I_WARMUP, N_ACC, N_HIST, ST_COMPLETED, ST_DROPPED,
    ST_PENDING, ST_REJECTED_ADMISSION, ST_REJECTED_TOO_LONG, ST_UNFINISHED)
from .workspace import (WF_FINISH, WF_FIRST, WF_HEAD, WF_LAST, WI_BLOCKS, WI_HEAD, WI_K, WI_NPRE, WI_NSWAP,
    WI_ONES, WI_STATUS)


@njit_noalloc
def _lerp(a, b, t):
    """numpy's percentile interpolation, operation for operation (it
    interpolates from the upper neighbour when t >= 0.5)."""
    diff = b - a
    if t >= 0.5:
        return b - diff * (1.0 - t)
    return a + diff * t


@njit_noalloc
def _ranks(total, q):
    """The two 0-based ranks numpy's percentile ``q`` of ``total`` values
    interpolates between, and the position between them."""
    pos = q / 100.0 * (total - 1)
    r = int(math.floor(pos))
    return r, (r + 1 if r + 1 < total else r), pos


@njit_noalloc
def _weighted_select(v, w, lo, hi, below, j):
    """The value at 0-based rank ``j`` of the sorted sample in which each
    ``v[e]`` occurs ``w[e]`` >= 1 times (a zero weight could be taken for
    the next rank; every caller's weights count something), searched in
    ``v[lo:hi]`` by three-way quickselect (expected O(hi - lo); reorders
    ``v`` and ``w`` there together). Every entry before ``lo`` is smaller
    than all of ``v[lo:hi]`` and they weigh ``below`` (so ``below <= j``).

    Returns ``(value, lt, before, gt, upto)``: the value's entries are
    ``v[lt:gt]``, every entry before ``lt`` is smaller (weight ``before``),
    every entry from ``gt`` on is larger, and ``upto`` is the weight of the
    entries <= the value. A larger rank can be searched from ``(lt, before)``.
    """
    while True:
        a = v[lo]
        b = v[(lo + hi - 1) // 2]
        c = v[hi - 1]
        pivot = max(min(a, b), min(max(a, b), c))   # median of three
        i = lo
        lt = lo
        gt = hi
        w_lt = 0
        w_eq = 0
        while i < gt:
            x = v[i]
            if x < pivot:
                v[i], v[lt] = v[lt], x
                w[i], w[lt] = w[lt], w[i]
                w_lt += w[lt]
                lt += 1
                i += 1
            elif x > pivot:
                gt -= 1
                v[i], v[gt] = v[gt], x
                w[i], w[gt] = w[gt], w[i]
            else:
                w_eq += w[i]
                i += 1
        if j < below + w_lt:
            hi = lt
        elif j < below + w_lt + w_eq:
            return pivot, lt, below + w_lt, gt, below + w_lt + w_eq
        else:
            below += w_lt + w_eq
            lo = gt


@njit_noalloc
def _percentile_from(v, w, m, total, q, lo, below):
    """numpy's percentile ``q`` of the expanded sample (total weight
    ``total`` > 0) in ``v[:m]``, searching from ``(lo, below)`` (see
    `_weighted_select`; ``(0, 0)`` for the whole sample). Returns the value
    and the ``(lo, below)`` from which any higher percentile can be searched,
    so that ascending percentiles each search a shrinking part."""
    r, r2, pos = _ranks(total, q)
    x_lo, lt, before, gt, upto = _weighted_select(v, w, lo, m, below, r)
    x_hi = x_lo
    if r2 > r and r2 >= upto:
        # the next rank holds the smallest value above x_lo: all of them are in v[gt:m]
        x_hi = np.inf
        for e in range(gt, m):
            if v[e] < x_hi:
                x_hi = v[e]
    return _lerp(x_lo, x_hi, pos - r), lt, before


@njit_noalloc
def _percentile_into(v, w, m, total, q, lo, below, row, col):
    """``row[col]`` = `_percentile_from` (nan for an empty sample); return the next ``(lo, below)``."""
    if total == 0:
        row[col] = np.nan
        return lo, below
    x, lo, below = _percentile_from(v, w, m, total, q, lo, below)
    row[col] = x
    return lo, below


@njit_noalloc
def _bucket(x, lo, scale, nb):
    """Histogram bucket of ``x``: non-decreasing in ``x`` (so equal values share a
    bucket, and a value in a lower bucket is strictly smaller)."""
    b = np.int64((x - lo) * scale)
    return b if b < nb else nb - 1


@njit_noalloc
def _rank_buckets(hist, total, q):
    """The histogram buckets [b_lo, b_hi] that hold the two ranks numpy's
    percentile ``q`` interpolates between, and the weight of the buckets below b_lo."""
    nb = hist.size
    r, r2, _pos = _ranks(total, q)
    cum = 0
    b_lo = -1
    below = 0
    b_hi = nb - 1
    for b in range(nb):
        if b_lo < 0 and cum + hist[b] > r:
            b_lo = b
            below = cum
        if cum + hist[b] > r2:
            b_hi = b
            break
        cum += hist[b]
    return b_lo, b_hi, below


@njit_noalloc(inline="llvm")
def _swap_entries(v, w, a, b):
    """Swap entries ``a`` and ``b`` of the weighted sample ``v``, ``w``."""
    v[a], v[b] = v[b], v[a]
    w[a], w[b] = w[b], w[a]


@njit_noalloc
def _gather(v, w, m, lo, scale, marked):
    """Move the entries of ``v[:m]``, ``w[:m]`` whose histogram bucket is
    marked (``marked[b] != 0``) to the front; return their count. (A lookup,
    not range tests: a third of the time, with no branch but the move's.)"""
    nb = marked.size
    c = 0
    for e in range(m):
        if marked[_bucket(v[e], lo, scale, nb)] != 0:
            _swap_entries(v, w, e, c)
            c += 1
    return c


@njit_noalloc
def _percentile_in_buckets(v, w, m, total, q, lo, scale, nb, b_lo, b_hi, below):
    """numpy's percentile ``q`` of the expanded sample, searching only the
    entries of its rank buckets [b_lo, b_hi] (`_rank_buckets`: below them
    weigh ``below``), which are among ``v[:m]``, ``w[:m]``."""
    r, r2, pos = _ranks(total, q)
    # those buckets' entries to the front (an unsigned comparison: one test for the range)
    span = np.uint64(b_hi - b_lo)
    c = 0
    for e in range(m):
        if np.uint64(_bucket(v[e], lo, scale, nb) - b_lo) <= span:
            _swap_entries(v, w, e, c)
            c += 1
    x_lo, lt, before, gt, upto = _weighted_select(v, w, 0, c, below, r)
    x_hi = x_lo
    if r2 > r and r2 >= upto:
        # the next rank holds the smallest value above x_lo; it is in the gathered buckets
        x_hi = np.inf
        for e in range(gt, c):
            if v[e] < x_hi:
                x_hi = v[e]
    return _lerp(x_lo, x_hi, pos - r)


@njit_noalloc
def _percentiles(v, w, m, hist, q0, q1, q2, q3, nq, row, c):
    """numpy's percentiles ``q0 <= q1 <= ...`` (the first ``nq`` <= 4) of the
    sample in which each ``v[e]`` occurs ``w[e]`` >= 1 times, into
    ``row[c:c + nq]`` (nan for an empty sample); reorders ``v[:m]``, ``w[:m]``.

    A sample of ``m`` >= 32 entries is first counted into ``min(hist.size,
    m // 2)`` buckets of equal width between its minimum and maximum (two
    cheap passes); the entries of the buckets that hold the percentiles'
    ranks are gathered to the front (a third pass), and each percentile is
    selected among those of its own (at most two) buckets. Smaller samples,
    and spans too narrow to scale, use plain selection (`_percentile_into`).
    ``hist`` is scratch."""
    total = 0
    lo = np.inf
    hi = -np.inf
    for e in range(m):
        total += w[e]
        x = v[e]
        lo = min(lo, x)
        hi = max(hi, x)
    # About two entries a bucket, at most hist.size: cheaper than plain
    # selection from a few dozen entries up (`benchmarks/HISTORY.md`)
    nb = min(hist.size, m // 2)
    scale = nb / (hi - lo) if hi > lo else 0.0
    if total == 0 or nb < 16 or not (0.0 < scale < 1e300):
        a = 0
        b = 0
        for j in range(nq):
            q = q0 if j == 0 else (q1 if j == 1 else (q2 if j == 2 else q3))
            a, b = _percentile_into(v, w, m, total, q, a, b, row, c + j)
        return
    hist = hist[:nb]
    for b in range(nb):
        hist[b] = 0
    for e in range(m):
        hist[_bucket(v[e], lo, scale, nb)] += w[e]
    # Each percentile's rank buckets (empty ranges [1, 0] for the unused ones);
    # then the counts are spent, and hist marks those buckets for `_gather`.
    l0, h0, s0 = _rank_buckets(hist, total, q0)
    l1, h1, s1 = 1, 0, 0
    l2, h2, s2 = 1, 0, 0
    l3, h3, s3 = 1, 0, 0
    if nq > 1:
        l1, h1, s1 = _rank_buckets(hist, total, q1)
    if nq > 2:
        l2, h2, s2 = _rank_buckets(hist, total, q2)
    if nq > 3:
        l3, h3, s3 = _rank_buckets(hist, total, q3)
    for b in range(nb):
        hist[b] = 0
    for b_lo, b_hi in ((l0, h0), (l1, h1), (l2, h2), (l3, h3)):
        for b in range(b_lo, b_hi + 1):
            hist[b] = 1
    m = _gather(v, w, m, lo, scale, hist)
    row[c] = _percentile_in_buckets(v, w, m, total, q0, lo, scale, nb, l0, h0, s0)
    if nq > 1:
        row[c + 1] = _percentile_in_buckets(v, w, m, total, q1, lo, scale, nb, l1, h1, s1)
    if nq > 2:
        row[c + 2] = _percentile_in_buckets(v, w, m, total, q2, lo, scale, nb, l2, h2, s2)
    if nq > 3:
        row[c + 3] = _percentile_in_buckets(v, w, m, total, q3, lo, scale, nb, l3, h3, s3)


@njit_noalloc
def _weighted_stats(v, w, m, row, c, hist):
    """Mean, p50 and p99 into ``row[c:c + 3]`` of the sample in which each
    ``v[e]`` occurs ``w[e]`` times: the values numpy gives on the expanded
    sample (percentiles by linear interpolation), from ``m`` entries, by
    selection rather than sorting (`_percentiles`; ``hist``: its scratch).
    Reorders ``v[:m]`` and ``w[:m]``."""
    total = 0
    s = 0.0
    for e in range(m):
        total += w[e]
        s += v[e] * w[e]
    row[c] = s / total if total > 0 else np.nan
    _percentiles(v, w, m, hist, 50.0, 99.0, 0.0, 0.0, 2, row, c + 1)


@njit_noalloc
def _mean(x, m):
    if m == 0:
        return np.nan
    s = 0.0
    for j in range(m):
        s += x[j]
    return s / m


#: A replication's outcome per request, as the engine left it (`_reduce`'s
#: views of the workspace's per-request columns).
Outcomes = namedtuple("Outcomes", ("status", "npre", "nswap", "first_t", "finish_t"))
#: The measured requests' latency samples, and the unit weights their
#: percentiles take (`_reduce` puts them in columns the ended run no longer needs).
LatencySamples = namedtuple("LatencySamples", ("ttft", "e2e", "tpot", "ones"))


@njit_noalloc
def _tally_run(n, arrival, out, swap, end, row):
    """The whole run's counts of requests by status, preemptions and swaps,
    and the sojourn sum (Little's law), into their columns of ``row``;
    return the sends never made (sessions: requests that did not arrive)."""
    c_pend = 0
    c_done = 0
    c_long = 0
    c_adm = 0
    c_drop = 0
    c_unf = 0
    c_pre = 0
    c_swap = 0
    sojourn = 0.0
    for i in range(n):
        st = out.status[i]
        if st == ST_COMPLETED:
            c_done += 1
        elif st == ST_REJECTED_TOO_LONG:
            c_long += 1
        elif st == ST_REJECTED_ADMISSION:
            c_adm += 1
        elif st == ST_DROPPED:
            c_drop += 1
        elif st == ST_UNFINISHED:
            c_unf += 1
        elif st == ST_PENDING:
            c_pend += 1   # (sessions: a send never made; it did not arrive)
            continue
        c_pre += out.npre[i]
        c_swap += out.nswap[i] if swap else 0   # (written by the engine only with swap preemption)
        # Little's law bookkeeping: sojourn of every accepted request, from
        # arrival to completion, drop, or the end of the run.
        if st == ST_COMPLETED or st == ST_DROPPED:
            sojourn += out.finish_t[i] - arrival[i]
        elif st == ST_UNFINISHED:
            sojourn += end - arrival[i]
    c0 = C_N_ARRIVED
    row[c0 + 1] = c_done
    row[c0 + 2] = c_long + c_adm
    row[c0 + 3] = c_long
    row[c0 + 4] = c_adm
    row[c0 + 5] = c_drop
    row[c0 + 6] = c_unf
    row[c0 + 7] = c_pre
    row[c0 + 8] = c_swap
    row[c0 + 17] = sojourn
    return c_pend


@njit_noalloc
def _tally_measured(n, arrival, output, out, ipar, fpar, smp):
    """The measured requests' (from ``I_WARMUP`` on) latency samples into
    ``smp`` (TTFT and E2E of those completed, TPOT of those with two
    tokens or more); return (completed, TPOT samples, within the SLOs,
    output tokens, rejected, dropped, preemptions, swaps) among them."""
    swap = ipar[I_SWAP] == 1
    has_ttft = ipar[I_HAS_TTFT_SLO] == 1
    has_tpot = ipar[I_HAS_TPOT_SLO] == 1
    ttft_slo = fpar[F_TTFT_SLO]
    tpot_slo = fpar[F_TPOT_SLO]
    overhead = fpar[F_TTFT_OVERHEAD]
    n_done = 0
    n_tpot = 0
    n_good = 0
    out_tokens = 0
    n_rej = 0
    n_drop = 0
    pre = 0
    swaps = 0
    for i in range(ipar[I_WARMUP], n):
        st = out.status[i]
        pre += out.npre[i]
        swaps += out.nswap[i] if swap else 0
        if st == ST_REJECTED_TOO_LONG or st == ST_REJECTED_ADMISSION:
            n_rej += 1
        elif st == ST_DROPPED:
            n_drop += 1
        elif st == ST_COMPLETED:
            a = out.first_t[i] - arrival[i] + overhead
            e = out.finish_t[i] - arrival[i] + overhead
            smp.ttft[n_done] = a
            smp.e2e[n_done] = e
            n_done += 1
            out_tokens += output[i]
            ok = not (has_ttft and a > ttft_slo)
            if output[i] > 1:
                tp = (out.finish_t[i] - out.first_t[i]) / (output[i] - 1)
                smp.tpot[n_tpot] = tp
                n_tpot += 1
                if has_tpot and tp > tpot_slo:
                    ok = False
            if ok:
                n_good += 1
    return n_done, n_tpot, n_good, out_tokens, n_rej, n_drop, pre, swaps


@njit_noalloc
def _latency_stats(smp, n_done, n_tpot, itl_v, itl_w, hist, row):
    """Means and percentiles of TTFT, TPOT, ITL (weighted gap samples
    ``itl_v``, ``itl_w``) and E2E into ``row``; ``hist``: scratch."""
    row[C_TTFT_MEAN] = _mean(smp.ttft, n_done)
    # percentiles by selection (each reorders its array; the means come first)
    _percentiles(smp.ttft, smp.ones, n_done, hist, 50.0, 90.0, 95.0, 99.0, 4, row, C_TTFT_MEAN + 1)
    row[C_TPOT_MEAN] = _mean(smp.tpot, n_tpot)
    _percentiles(smp.tpot, smp.ones, n_tpot, hist, 50.0, 99.0, 0.0, 0.0, 2, row, C_TPOT_MEAN + 1)
    _weighted_stats(itl_v, itl_w, itl_v.size, row, C_ITL_MEAN, hist)
    row[C_E2E_MEAN] = _mean(smp.e2e, n_done)
    _percentiles(smp.e2e, smp.ones, n_done, hist, 50.0, 99.0, 0.0, 0.0, 2, row, C_E2E_MEAN + 1)


@njit_noalloc
def _time_averages(window, n_done, out_tokens, n_good, acc, row):
    """Throughputs, goodput and the time averages over the measurement
    window (nan without one)."""
    if window > 0.0:
        row[C_REQ_TPUT] = n_done / window
        row[C_OUT_TPUT] = out_tokens / window
        row[C_GOODPUT] = n_good / window
        row[C_OCC] = acc[A_OCC_INT] / window
        row[C_QUEUE] = acc[A_QUEUE_INT] / window
        row[C_KV] = acc[A_KV_INT] / window
    else:
        row[C_REQ_TPUT] = np.nan
        row[C_OUT_TPUT] = np.nan
        row[C_GOODPUT] = np.nan
        row[C_OCC] = np.nan
        row[C_QUEUE] = np.nan
        row[C_KV] = np.nan


@njit_noalloc
def _per_measured(nm, n_rej, n_drop, pre, swaps, row):
    """Blocking and drop probabilities, preemptions and swaps per measured
    request (nan without one)."""
    if nm > 0:
        row[C_BLOCKING] = n_rej / nm
        row[C_DROP] = n_drop / nm
        row[C_PREEMPT] = pre / nm
        row[C_SWAPS] = swaps / nm
    else:
        row[C_BLOCKING] = np.nan
        row[C_DROP] = np.nan
        row[C_PREEMPT] = np.nan
        row[C_SWAPS] = np.nan


@njit_noalloc
def _run_columns(n, nm, window, acc, row):
    """The prefix-cache hit rate and the run's figures from its accumulators."""
    row[C_HIT] = acc[A_HIT_TOK] / acc[A_QUERY_TOK] if acc[A_QUERY_TOK] > 0 else np.nan
    c0 = C_N_ARRIVED
    row[c0 + 0] = n
    row[c0 + 9] = nm
    row[c0 + 10] = acc[A_STEPS]
    row[c0 + 11] = acc[A_MAX_BLOCKS]
    row[c0 + 12] = acc[A_BLOCKS_END]
    row[c0 + 13] = acc[A_MAX_SWAP]
    row[c0 + 14] = window
    row[c0 + 15] = acc[A_END]
    row[c0 + 16] = acc[A_L_INT]


@njit_noalloc(entry=True)
def _reduce(n, arrival, output, ipar, fpar, wi, wf, row):
    """Per-replication metrics of the measured requests (``docs/engine-model.md``)
    from the workspace ``wi``/``wf`` that `_simulate` filled, into ``row``
    (`layout.COLUMNS`)."""
    out = Outcomes(wi[WI_STATUS * n:(WI_STATUS + 1) * n], wi[WI_NPRE * n:(WI_NPRE + 1) * n],
                   wi[WI_NSWAP * n:(WI_NSWAP + 1) * n], wf[WF_FIRST * n:(WF_FIRST + 1) * n],
                   wf[WF_FINISH * n:(WF_FINISH + 1) * n])
    # The measured requests' TTFT, E2E and TPOT go to columns the ended run
    # no longer needs (last-token times; tokens computed and KV blocks, int64
    # read as doubles): the engine wrote them, so they are resident already,
    # where a scratch of their own would add 24 bytes a request.
    smp = LatencySamples(wf[WF_LAST * n:(WF_LAST + 1) * n], wi[WI_K * n:(WI_K + 1) * n].view(np.float64),
                         wi[WI_BLOCKS * n:(WI_BLOCKS + 1) * n].view(np.float64), wi[WI_ONES * n:(WI_ONES + 1) * n])
    acc = wf[WF_HEAD * n:WF_HEAD * n + N_ACC]
    n_itl = np.int64(acc[A_N_ITL])
    o = WI_HEAD * n
    hist = wi[o:o + N_HIST]
    itl_w = wi[o + N_HIST:o + N_HIST + n_itl]
    o = WF_HEAD * n + N_ACC
    itl_v = wf[o:o + n_itl]
    for i in range(n):
        smp.ones[i] = 1
    c_pend = _tally_run(n, arrival, out, ipar[I_SWAP] == 1, acc[A_END], row)
    n_done, n_tpot, n_good, out_tokens, n_rej, n_drop, pre, swaps = _tally_measured(n, arrival, output, out, ipar,
                                                                                    fpar, smp)
    _latency_stats(smp, n_done, n_tpot, itl_v, itl_w, hist, row)
    nm = max(n - ipar[I_WARMUP] - c_pend, 0)   # (sessions refuse warm-up: the sends never made are not measured)
    # The window closes at the horizon, or else at the end of the drained run
    # (its last completion) as the client sees it.
    window_end = fpar[F_HORIZON] if ipar[I_HAS_HORIZON] == 1 else acc[A_END] + fpar[F_TTFT_OVERHEAD]
    window = window_end - acc[A_WINDOW_START] if nm > 0 else 0.0
    _time_averages(window, n_done, out_tokens, n_good, acc, row)
    _per_measured(nm, n_rej, n_drop, pre, swaps, row)
    _run_columns(n - c_pend, nm, window, acc, row)
