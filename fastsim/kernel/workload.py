"""Drawing a replication's request stream: arrival times (renewal,
given times, multi-user, or a closed loop's wanted times), prompt and
output lengths (mixture laws or trace rows), priority classes, SJF keys and
prefix groups, each from a random stream of its own (`layout.S_*`).
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from .._numba_options import njit_noalloc
from .layout import (ARRIVAL_SCHEDULE, F_BURSTINESS, F_HORIZON, F_PRED_ACCURACY, F_PRED_SIGMA, F_RATE, F_THINK,
    F_TRACE_WINDOW, F_USER_REQUESTS, I_ARRIVAL_KIND, I_BLOCK_SIZE, I_HAS_HORIZON, I_MAX_CONCURRENCY,
    I_NORMALIZE_ARRIVALS, I_NUM_REQUESTS, I_PREDICTOR, I_PREFIX, I_PRIO_BAND, I_SESSIONS, I_SJF_KEY, I_THINK_EXP,
    I_TRACE_HASH, I_TRACE_MODE, I_USERS_HI, I_USERS_LO, I_USER_CAP, SESSIONS_USERS, S_ARRIVAL, S_OUTPUT_COMPONENT,
    S_OUTPUT_VALUE, S_PREDICT, S_PREFIX_GROUP, S_PREFIX_LEN, S_PRIORITY, S_PROMPT_COMPONENT, S_PROMPT_VALUE,
    S_TRACE_ROW, S_USERS)
from .rng import _gamma, _normal, _poisson, _seed_streams, _uniform

_MAX_LEN_FLOAT = 2.0 ** 40  # longer draws are rejected as too long anyway


@njit_noalloc
def _search_cdf(cdf, lo, hi, u):
    """First index j in [lo, hi) with cdf[j] >= u (cdf[hi - 1] == 1 >= u)."""
    hi -= 1  # the last entry is always a valid answer
    while lo < hi:
        mid = (lo + hi) // 2
        if cdf[mid] >= u:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit_noalloc
def _lognormal_length(state, s, median, sigma):
    """ceil(median * exp(sigma * Z)), Z standard normal from stream ``s``."""
    x = median * math.exp(sigma * _normal(state, s))
    # X > 0, so ceil(X) >= 1; max() only guards against exp() underflowing.
    return max(np.int64(1), np.int64(math.ceil(min(x, _MAX_LEN_FLOAT))))


@njit_noalloc
def _one_lognormal(lo, hi, lcomp, lpar):
    """(median, sigma) of the law in components [lo, hi) if it is one
    lognormal component, else (-1.0, 0.0)."""
    if hi - lo == 1 and lcomp[lo, 0] == 1:
        return lpar[lo, 0], lpar[lo, 1]
    return -1.0, 0.0


@njit_noalloc
def _sample_length(state, s_comp, s_val, lo, hi, lcomp, lpar, ltab, i):
    """The length of request ``i`` from the law stored in components [lo, hi)."""
    j = lo
    if hi - lo > 1:
        u = _uniform(state, s_comp)
        while j < hi - 1 and lpar[j, 2] < u:
            j += 1
    kind = lcomp[j, 0]
    if kind == 0:  # fixed
        return np.int64(lpar[j, 0])
    if kind == 1:
        return _lognormal_length(state, s_val, lpar[j, 0], lpar[j, 1])
    if kind == 2:  # integer uniform on [low, high]
        low = np.int64(lpar[j, 0])
        width = np.int64(lpar[j, 1]) - low + 1
        k = np.int64(_uniform(state, s_val) * width)
        return low + min(k, width - 1)
    if kind == 5:  # geometric: ceil(-log(U) / q), so P(L > k) = exp(-q k)
        x = -math.log(_uniform(state, s_val)) / lpar[j, 0]
        return max(np.int64(1), np.int64(math.ceil(min(x, _MAX_LEN_FLOAT))))
    if kind == 6:  # ceil(X), X ~ Gamma(shape lpar[j, 0], scale lpar[j, 1])
        x = _gamma(state, s_val, lpar[j, 0]) * lpar[j, 1]
        return max(np.int64(1), np.int64(math.ceil(min(x, _MAX_LEN_FLOAT))))
    # tables: rows [start, start + n) of ltab hold (value, cdf)
    start = lcomp[j, 1]
    if kind == 4:  # replayed in order
        return np.int64(ltab[start + i % lcomp[j, 2], 0])
    row = _search_cdf(ltab[:, 1], start, start + lcomp[j, 2], _uniform(state, s_val))
    return np.int64(ltab[row, 0])


@njit_noalloc
def _heapsort(x, n):
    """Sort ``x[:n]`` in place (no allocation, so that GPU threads can use it too)."""
    for start in range(n // 2 - 1, -1, -1):
        _sift_down(x, start, n)
    for end in range(n - 1, 0, -1):
        tmp = x[0]
        x[0] = x[end]
        x[end] = tmp
        _sift_down(x, 0, end)


@njit_noalloc
def _sift_down(x, pos, end):
    while True:
        c = 2 * pos + 1
        if c >= end:
            return
        if c + 1 < end and x[c + 1] > x[c]:
            c += 1
        if x[c] <= x[pos]:
            return
        tmp = x[c]
        x[c] = x[pos]
        x[pos] = tmp
        pos = c


@njit_noalloc
def _multi_user_arrivals(ipar, fpar, state, arrival):
    """Merged arrival times of a multi-user workload; return their count."""
    lo = ipar[I_USERS_LO]
    width = ipar[I_USERS_HI] - lo + 1
    users = lo + min(np.int64(_uniform(state, S_USERS) * width), width - 1)
    rate = fpar[F_RATE]
    n = 0
    for _u in range(users):
        m = _poisson(state, S_USERS, fpar[F_USER_REQUESTS], ipar[I_USER_CAP])
        t = 0.0
        for _j in range(m):
            t += -math.log(_uniform(state, S_ARRIVAL)) / rate
            arrival[n] = t
            n += 1
    _heapsort(arrival, n)
    if ipar[I_HAS_HORIZON] == 1:
        m = 0
        while m < n and arrival[m] < fpar[F_HORIZON]:
            m += 1
        n = m
    return n


@njit_noalloc
def _window_start(state, times, duration):
    """A window of a trace's arrival ``times``: its start ``ws``, uniform on
    [0, max(T - duration, 0)] (T the last arrival; one uniform of stream
    S_TRACE_ROW), and its first row, the first with ``times[row] >= ws``."""
    span = max(times[times.size - 1] - duration, 0.0)
    ws = _uniform(state, S_TRACE_ROW) * span
    # (ws <= T: the last row qualifies, as `_search_cdf` needs)
    return ws, _search_cdf(times, 0, times.size, ws)


@njit_noalloc(entry=True)
def _trace_window(rep, key0, key1, times, duration, state):
    """`_window_start` of replication ``rep`` (for Python: which trace rows it
    replays; ``state``: scratch of N_STREAMS words)."""
    _seed_streams(key0, key1, rep, state)
    return _window_start(state, times, duration)


@njit_noalloc
def _trace_window_arrivals(ipar, fpar, state, arr_times, arrival):
    """The arrivals of a trace window (`_window_start`): ``times[row0 + i] - ws``
    while before ``ws + duration``, at most I_NUM_REQUESTS; return (count, row0)."""
    duration = fpar[F_TRACE_WINDOW]
    ws, row0 = _window_start(state, arr_times, duration)
    end = ws + duration
    n = 0
    while row0 + n < arr_times.size and n < ipar[I_NUM_REQUESTS] and arr_times[row0 + n] < end:
        arrival[n] = arr_times[row0 + n] - ws
        if ipar[I_HAS_HORIZON] == 1 and arrival[n] >= fpar[F_HORIZON]:
            break
        n += 1
    return n, row0


@njit_noalloc
def _given_arrivals(ipar, fpar, arr_times, arrival):
    """Given arrival times (``I_ARRIVAL_KIND`` 1), up to the horizon; return their count."""
    has_h = ipar[I_HAS_HORIZON] == 1
    n = 0
    for i in range(ipar[I_NUM_REQUESTS]):
        if has_h and arr_times[i] >= fpar[F_HORIZON]:
            break
        arrival[i] = arr_times[i]
        n += 1
    return n


@njit_noalloc
def _closed_loop_arrivals(ipar, fpar, state, arrival):
    """A pure closed loop's wanted times (``I_ARRIVAL_KIND`` 4); return their count.

    Requests 0..c-1 go at once; request k >= c holds the think time of the
    (k - c)-th departure (fixed, or exponential of that mean), which
    `arrivals._release_seats` turns into a send time."""
    c = ipar[I_MAX_CONCURRENCY]
    think = fpar[F_THINK]
    n_cap = ipar[I_NUM_REQUESTS]
    for i in range(n_cap):
        if i < c:
            arrival[i] = 0.0
        elif ipar[I_THINK_EXP] == 1:
            arrival[i] = -math.log(_uniform(state, S_ARRIVAL)) * think
        else:
            arrival[i] = think
    return n_cap


@njit_noalloc
def _renewal_arrivals(ipar, fpar, state, arrival):
    """Renewal arrivals (``I_ARRIVAL_KIND`` 0), up to the horizon; return their count.

    Gaps ~ Gamma(shape=burstiness, mean=1/rate) (exponential if 1). By
    default the first request arrives at time 0. `vllm bench serve` instead
    sums n gaps (the first included) and rescales them so that the last
    request is sent at exactly n / rate."""
    n_cap = ipar[I_NUM_REQUESTS]
    has_h = ipar[I_HAS_HORIZON] == 1
    horizon = fpar[F_HORIZON]
    rate = fpar[F_RATE]
    shape = fpar[F_BURSTINESS]
    normalize = ipar[I_NORMALIZE_ARRIVALS] == 1
    t = 0.0
    n = 0
    for i in range(n_cap):
        if i > 0 or normalize:
            if shape == 1.0:
                t += -math.log(_uniform(state, S_ARRIVAL)) / rate
            else:
                t += _gamma(state, S_ARRIVAL, shape) / (shape * rate)
        if has_h and t >= horizon and not normalize:
            break
        arrival[i] = t
        n += 1
    if normalize:
        # As vLLM, rescale only when the last delay is positive (very
        # bursty gamma gaps can all underflow to 0: everything at t = 0).
        factor = (n_cap / rate) / arrival[n_cap - 1] if arrival[n_cap - 1] > 0.0 else 1.0
        n = 0
        for i in range(n_cap):
            arrival[i] = arrival[i] * factor
            if has_h and arrival[i] >= horizon:
                break
            n += 1
    return n


@njit_noalloc
def _schedule_time(sched, s):
    """Lambda^{-1}(s) of a rate schedule's table ``sched`` (`layout.ARRIVAL_SCHEDULE`):
    the first time t at which the integral of the rate over [0, t] reaches
    ``s``; inf if it never does (a last rate of 0)."""
    nk = (sched.size - 2) // 3
    ot, orr, oc = 2, 2 + nk, 2 + 2 * nk
    total = sched[oc + nk - 1]
    base = 0.0
    if sched[1] > 0.0:   # a period: whole periods first
        c = math.floor(s / total)
        s = s - c * total
        if s < 0.0:        # (rounding at a period's edge)
            c -= 1.0
            s += total
        elif s >= total:
            c += 1.0
            s -= total
        base = c * sched[1]
    elif s >= total:     # after the last knot: its rate, constant
        r = sched[orr + nk - 1]
        if r <= 0.0:
            return np.inf
        return sched[ot + nk - 1] + (s - total) / r
    k = _search_cdf(sched, oc + 1, oc + nk, s) - oc - 1   # the piece: first knot whose integral >= s, less one
    d = s - sched[oc + k]
    t0, width, r0 = sched[ot + k], sched[ot + k + 1] - sched[ot + k], sched[orr + k]
    if d <= 0.0:
        u = 0.0
    elif sched[0] == 0.0:
        u = d / r0
    else:   # r0 u + slope u^2 / 2 = d, in the form without cancellation
        slope = (sched[orr + k + 1] - r0) / width
        u = 2.0 * d / (r0 + math.sqrt(max(r0 * r0 + 2.0 * slope * d, 0.0)))
    return base + t0 + min(u, width)


@njit_noalloc
def _schedule_arrivals(ipar, fpar, state, sched, arrival):
    """Arrivals of a Poisson process of the rate schedule ``sched``, by
    inversion: a_i = Lambda^{-1}(S_i), S_i the sum of i + 1 unit exponentials
    (stream S_ARRIVAL); at most I_NUM_REQUESTS, before the horizon. Return
    their count."""
    has_h = ipar[I_HAS_HORIZON] == 1
    n = 0
    s = 0.0
    for i in range(ipar[I_NUM_REQUESTS]):
        s += -math.log(_uniform(state, S_ARRIVAL))
        t = _schedule_time(sched, s)
        if i > 0:
            t = max(t, arrival[i - 1])   # (sorted, even where a period's rounding says otherwise)
        if t == np.inf or (has_h and t >= fpar[F_HORIZON]):
            break
        arrival[i] = t
        n += 1
    return n


@njit_noalloc
def _draw_arrivals(ipar, fpar, state, arr_times, arrival):
    """The arrival times of a replication, by ``I_ARRIVAL_KIND``; return
    (their count, the trace row of request 0: a trace window's first)."""
    kind = ipar[I_ARRIVAL_KIND]
    if kind == ARRIVAL_SCHEDULE:
        return _schedule_arrivals(ipar, fpar, state, arr_times, arrival), 0
    if kind == 3:
        return _trace_window_arrivals(ipar, fpar, state, arr_times, arrival)
    if kind == 1:
        return _given_arrivals(ipar, fpar, arr_times, arrival), 0
    if kind == 2:
        return _multi_user_arrivals(ipar, fpar, state, arrival), 0
    if kind == 4:
        return _closed_loop_arrivals(ipar, fpar, state, arrival), 0
    return _renewal_arrivals(ipar, fpar, state, arrival), 0


#: The length laws of a workload (`_pack.pack_scenario`'s tables):
#: components (kind, table start, table rows), their parameters, the
#: tables' (value, cdf) rows, and the component ranges [lo, hi) of the
#: prompt, output, prefix-length and prefix-group laws.
Laws = namedtuple("Laws", ("lcomp", "lpar", "ltab", "lrange"))


@njit_noalloc(inline="llvm")
def _draw_lengths(state, i, row0, ipar, laws, lognormals, trace, prompt, output):
    """Prompt and output length of request ``i``: from the laws (a law of
    one lognormal component, (median, sigma) in ``lognormals``, drawn here
    from the stream `_sample_length` would use) or from a trace row."""
    mode = ipar[I_TRACE_MODE]
    if mode == 0:
        p_med, p_sig, o_med, o_sig = lognormals
        lr = laws.lrange
        if p_med > 0.0:
            prompt[i] = _lognormal_length(state, S_PROMPT_VALUE, p_med, p_sig)
        else:
            prompt[i] = _sample_length(state, S_PROMPT_COMPONENT, S_PROMPT_VALUE, lr[0], lr[1],
                                       laws.lcomp, laws.lpar, laws.ltab, i)
        if o_med > 0.0:
            output[i] = _lognormal_length(state, S_OUTPUT_VALUE, o_med, o_sig)
        else:
            output[i] = _sample_length(state, S_OUTPUT_COMPONENT, S_OUTPUT_VALUE, lr[2], lr[3],
                                       laws.lcomp, laws.lpar, laws.ltab, i)
        return
    nrows = trace.shape[0]
    if mode == 1:
        row = (row0 + i) % nrows
    else:
        row = min(np.int64(_uniform(state, S_TRACE_ROW) * nrows), nrows - 1)
    prompt[i] = trace[row, 0]
    output[i] = trace[row, 1]


@njit_noalloc(inline="llvm")
def _draw_priority(state, i, ipar, prio_val, prio_cdf, prompt, output, prio):
    """Priority class of request ``i``: its length band's (``I_PRIO_BAND``),
    else drawn from the classes' law, else the one class."""
    npri = prio_val.size
    band = ipar[I_PRIO_BAND]
    if band != 0:
        # the class of its length band: the first upper edge above the length
        blen = prompt[i] if band == 1 else (output[i] if band == 2 else prompt[i] + output[i])
        prio[i] = prio_val[_search_cdf(prio_cdf, 0, npri, blen + 0.5)]
    elif npri > 1:
        prio[i] = prio_val[_search_cdf(prio_cdf, 0, npri, _uniform(state, S_PRIORITY))]
    else:
        prio[i] = prio_val[0]


@njit_noalloc(inline="llvm")
def _draw_sjf_key(state, i, ipar, fpar, pred_edges, prompt, output, sjfk):
    """SJF key q_i of request ``i``: its true length L_i (output, prompt or
    total, ``I_SJF_KEY``), or a predictor's (``I_PREDICTOR``)."""
    key = ipar[I_SJF_KEY]
    base = output[i] if key == 0 else (prompt[i] if key == 1 else prompt[i] + output[i])
    if ipar[I_PREDICTOR] == 1:
        sjfk[i] = _lognormal_length(state, S_PREDICT, float(base), fpar[F_PRED_SIGMA])
    elif ipar[I_PREDICTOR] == 2:
        # bucket classifier: buckets [e_b, e_{b+1}) with e_0 = 1 (pred_edges =
        # e_0 .. e_{B-1}); right with probability F_PRED_ACCURACY, else a
        # uniformly drawn other bucket; the key is its lower edge
        nb = pred_edges.size
        b = 0
        while b + 1 < nb and base >= pred_edges[b + 1]:
            b += 1
        if nb > 1 and _uniform(state, S_PREDICT) >= fpar[F_PRED_ACCURACY]:
            o = min(np.int64(_uniform(state, S_PREDICT) * (nb - 1)), nb - 2)
            b = o + 1 if o >= b else o
        sjfk[i] = np.int64(pred_edges[b])
    else:
        sjfk[i] = base


@njit_noalloc(inline="llvm")
def _draw_prefix(state, i, ipar, laws, prompt, pgrp, plen):
    """Prefix group (-1: none) and prefix length min(L, P_i - 1) of request ``i``."""
    if ipar[I_PREFIX] == 1:
        lr = laws.lrange
        pgrp[i] = _sample_length(state, S_PREFIX_GROUP, S_PREFIX_GROUP, lr[6], lr[7],
                                 laws.lcomp, laws.lpar, laws.ltab, i)
        ln = _sample_length(state, S_PREFIX_LEN, S_PREFIX_LEN, lr[4], lr[5], laws.lcomp, laws.lpar, laws.ltab, i)
        plen[i] = min(ln, prompt[i] - 1)
    else:
        pgrp[i] = -1
        plen[i] = 0


@njit_noalloc(entry=True)
def _draw_workload(rep, key0, key1, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange,
                   trace, prio_val, prio_cdf, pred_edges, state, arrival, prompt, output, prio, sjfk, pgrp, plen):
    """Fill the request arrays of replication ``rep``; return the arrival count.

    An entry point (called from Python, the drivers and the GPU kernel),
    whose arguments are the packed scenario's arrays
    (`_pack.pack_scenario`, `drivers.scenario_arrays`) and the buffers
    it fills; each draw comes from a random stream of its own, so a column
    does not depend on the options that draw the others.

    Parameters
    ----------
    rep : int64
        The replication's index (with the keys, the random streams' counter).
    key0, key1 : uint64
        The run's seed keys.
    ipar, fpar : int64, float64 arrays
        The parameter records (``layout.I_*``, ``layout.F_*``).
    arr_times : float64 array
        Given arrival times, or a trace's (kinds 1 and 3).
    lcomp, lpar, ltab, lrange : arrays
        The length laws (`Laws`).
    trace : int64 array (rows, 2)
        A trace's (prompt, output) rows (``I_TRACE_MODE`` 1: in order, 2: sampled).
    prio_val, prio_cdf : arrays
        The priority classes and their cumulative probabilities (or band edges).
    pred_edges : float64 array
        The bucket predictor's lower edges.
    state : uint64 array
        Scratch: the random streams' state (N_STREAMS + 1 words).
    arrival, prompt, output, prio, sjfk, pgrp, plen : arrays of at least I_NUM_REQUESTS
        Filled: arrival times; prompt and output lengths; priority classes;
        SJF keys q_i (the true length L_i: output, prompt or total,
        ``I_SJF_KEY``; with a lognormal length predictor
        ceil(L_i * exp(sigma * Z_i)), Z_i standard normal from the dedicated
        stream S_PREDICT, so the other columns do not depend on the
        predictor); prefix group (-1: none) and prefix length
        min(L, P_i - 1), from streams of their own.
    """
    _seed_streams(key0, key1, rep, state)
    n, row0 = _draw_arrivals(ipar, fpar, state, arr_times, arrival)
    n_starts = n
    if ipar[I_SESSIONS] != 0:
        n = ipar[I_NUM_REQUESTS]   # (every request a send of some session's turn: `_draw_sessions`)
    laws = Laws(lcomp, lpar, ltab, lrange)
    # (the per-request phases are inlined into this loop: called, each would
    # take its arrays as seven words apiece, a few times the drawing's cost)
    # A law of one lognormal component (the usual case) is drawn in
    # `_draw_lengths` itself, from the same stream as `_sample_length`
    # would: that call, with its table arguments, is a noticeable share of
    # the drawing's time.
    p_med, p_sig, o_med, o_sig = -1.0, 0.0, -1.0, 0.0
    if ipar[I_TRACE_MODE] == 0:
        p_med, p_sig = _one_lognormal(lrange[0], lrange[1], lcomp, lpar)
        o_med, o_sig = _one_lognormal(lrange[2], lrange[3], lcomp, lpar)
    lognormals = (p_med, p_sig, o_med, o_sig)
    for i in range(n):
        _draw_lengths(state, i, row0, ipar, laws, lognormals, trace, prompt, output)
        _draw_priority(state, i, ipar, prio_val, prio_cdf, prompt, output, prio)
        _draw_sjf_key(state, i, ipar, fpar, pred_edges, prompt, output, sjfk)
        _draw_prefix(state, i, ipar, laws, prompt, pgrp, plen)
    if ipar[I_SESSIONS] != 0:
        _draw_sessions(ipar, fpar, state, n_starts, n, arrival, prompt, output, sjfk, pgrp, plen, laws)
    if ipar[I_TRACE_HASH] == 1:
        _trace_parents(ipar, trace, ltab, row0, n, pgrp, plen)
    return n


@njit_noalloc
def _trace_parents(ipar, trace, ltab, row0, n, pgrp, plen):
    """A replayed trace's block identities (`_traces.parent_steps`): request
    i (row row0 + i) gets ``pgrp`` = -2 - its parent (the request it shares
    the most leading blocks with; itself when none) and ``plen`` the tokens
    shared: the first of its row's steps (``ltab`` rows ``trace[row, 2]``
    .. + ``trace[row, 3]``: (earlier row, blocks)) whose row is replayed.
    `block_pool._block_id` follows the parents."""
    bs = ipar[I_BLOCK_SIZE]
    for i in range(n):
        row = row0 + i
        pgrp[i] = -2 - i
        plen[i] = 0
        for e in range(trace[row, 2], trace[row, 2] + trace[row, 3]):
            s = np.int64(ltab[e, 0])
            if s >= row0:
                pgrp[i] = -2 - (s - row0)
                plen[i] = np.int64(ltab[e, 1]) * bs
                break


@njit_noalloc
def _draw_sessions(ipar, fpar, state, n_starts, n, arrival, prompt, output, sjfk, pgrp, plen, laws):
    """Multi-turn sessions (`arrivals._session_sends`): request k gets the
    turns T_k of the session it would start (the law at lrange[4:6], which
    sessions take from the prefix length, with its stream S_PREFIX_LEN:
    sessions and prefix groups are exclusive). Users: requests 0..c-1 (c =
    I_MAX_CONCURRENCY) are the users' first sessions, at time 0. Open: the
    first ``n_starts`` arrival times are session starts; the first c
    sessions, c the fewest whose turns fill the ``n`` requests, are drawn.
    A first turn gets ``pgrp`` its session, ``plen`` its tokens and ``sjfk``
    the turns after it; request k >= c keeps its new tokens (``prompt``),
    output and priority, gets the think time before it in ``arrival`` (users:
    the closed loop's draw; open: drawn here from S_ARRIVAL, fixed or
    exponential of mean F_THINK) and ``pgrp`` = -T_k. ``laws``: the length
    laws (`Laws`)."""
    lcomp, lpar, ltab, lrange = laws
    for i in range(n):
        pgrp[i] = -_sample_length(state, S_PREFIX_LEN, S_PREFIX_LEN, lrange[4], lrange[5], lcomp, lpar, ltab, i)
    if ipar[I_SESSIONS] == SESSIONS_USERS:
        c = min(ipar[I_MAX_CONCURRENCY], n)
    else:
        c = 0
        turns = 0
        while c < n_starts and turns < n:
            turns -= pgrp[c]
            c += 1
        for i in range(c, n):
            if ipar[I_THINK_EXP] == 1:
                arrival[i] = -math.log(_uniform(state, S_ARRIVAL)) * fpar[F_THINK]
            else:
                arrival[i] = fpar[F_THINK]
    for i in range(c):
        sjfk[i] = -pgrp[i] - 1
        pgrp[i] = i
        plen[i] = prompt[i] + output[i]
