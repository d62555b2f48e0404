"""An autoscaling fleet: replicas of the engine behind a router, their
number set over time by a policy, in compiled code.

The fleet's rows (`cluster.FleetBuffers`, one per replica that may be held
at once: ``max_replicas``) are each in a state (`layout.REP_*`): not held,
provisioning, serving, draining. Every ``interval_s`` (the evaluations, at
k x interval_s, k = 1, 2, ..., each before an arrival at the same instant)
the replicas held are advanced to that time and observed (`cluster._advance`,
`cluster._observe`); a draining replica that holds no request leaves; the
policy's metric over the serving replicas gives the replicas wanted (as
Kubernetes' HPA: ceil(total / target), unchanged within the tolerance, plus
the spare replicas, clamped to the bounds); more start provisioning and
serve ``provisioning_delay_s`` later; fewer (no sooner than the cool-down
after the last scaling) cancel the provisioning ones first, then drain the
serving ones with the fewest requests. Each arrival goes to a serving
replica: the router (`router._route`, unchanged) reads the serving
replicas' rows copied in order into a scratch view, and the index it picks
is mapped back (where they are the first rows, it reads those rows
themselves: the same view; the serving set is stated again only at an
evaluation or an activation, `_serving_set`). After the last arrival
evaluations go on until the fleet holds no request (or the horizon).
Semantics: ``docs/engine-model.md``, "Autoscaling fleets"; the reference:
`fastsim._reference_autoscale`.

A row whose replica left is reused by the next replica to start: it holds
no request then (its results stay in its row, by the requests' local
indices), and a new server's prefix cache is cold: the row's block pool is
laid out empty when a replica starts in it (`_cold`; prefix caching by
block hash only: autoscaling refuses the prefix-group cache). A draining
replica keeps its cache until it leaves.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from .._numba_options import njit_noalloc
from .block_pool import _pool_cold
from .cluster import (TMAP_SMALL, _advance, _call, _keep_end, _look_due, _observe, _own_records,
                      _queue_handed, _queue_key, _ri, _rows, _set_up_uniform)
from .layout import (AS_COOLDOWN, AS_DELAY, AS_GPUS, AS_INITIAL, AS_INTERVAL, AS_MAX, AS_METRIC,
                     AS_METRIC_KV, AS_METRIC_RATE, AS_MIN, AS_SPARE, AS_TARGET, AS_TOLERANCE, AS_WINDOWS_FULL,
                     F_HORIZON, F_TPOT_SLO, F_TTFT_OVERHEAD, F_TTFT_SLO, FL_LATENCY, FL_LOAD_CAP, FL_SCORERS,
                     I_BLOCK_HASH, I_BLOCK_SIZE, I_CACHING, I_HAS_HORIZON, I_HAS_TPOT_SLO, I_HAS_TTFT_SLO,
                     I_NUM_GPU_BLOCKS, I_WARMUP, LOAD_IN_SYSTEM, LOAD_KV, LOAD_WAITING, REP_DRAINING, REP_OFF,
                     REP_PROVISIONING, REP_SERVING, ST_COMPLETED, W_ARRIVALS, W_DESIRED, W_DRAINING, W_IN_SYSTEM,
                     W_METRIC, W_PROVISIONING, W_QUEUE, W_SERVING, W_SLO_MET, W_T)
from .replica import STEP_ADVANCE, STEP_FINISH, STEP_NO_STRETCH, _hand
from .rng import _seed_streams
from .router import _in_system_only, _needs_state, _reads_kv, _route
from .trace_blocks import localise as _localise, reset as _tmap_reset
from .workspace import (N_RI, RI_DIM_CAP, RI_DIM_NBP, RI_DIM_NBT, RI_DIM_NCNT, RI_DIM_NHELD, RI_DIM_NITL, RI_N_KNOWN,
                        WF_FINISH, WF_FIRST, WI_STATUS, Stream, _carve)

#: An autoscaled fleet's own buffers: per row its state (`layout.REP_*`),
#: when its replica was started, when it serves (provisioning), its
#: replica-seconds held; the router's scratch view of the serving replicas
#: (``sload``, rows as `FleetBuffers.load`) and their rows (``pos``); the
#: evaluations' table (`layout.WINDOW_COLUMNS`); and ``out``: windows
#: written, scaling actions, the fleet's end, peak replicas held.
AutoscaleBuffers = namedtuple("AutoscaleBuffers", ("state", "since", "ready", "life", "pos", "sload", "windows",
                                                   "out"))
O_NWIN, O_EVENTS, O_END, O_PEAK = 0, 1, 2, 3
N_OUT = 4


@njit_noalloc
def _count(ab, m, which):
    c = 0
    for r in range(m):
        if ab.state[r] == which:
            c += 1
    return c


@njit_noalloc
def _leave(ab, r, tau):
    """Row ``r``'s replica is no longer held from ``tau``."""
    ab.life[r] += tau - ab.since[r]
    ab.state[r] = REP_OFF


@njit_noalloc
def _activate(ab, m, t):
    """Provisioning replicas ready at or before ``t`` serve."""
    for r in range(m):
        if ab.state[r] == REP_PROVISIONING and ab.ready[r] <= t:
            ab.state[r] = REP_SERVING


@njit_noalloc
def _cold(fb, r, n, full):
    """Row ``r``'s prefix cache emptied (`block_pool._pool_cold`): a new
    replica starts there, and a new server's cache is cold. The row holds no
    request; its finished requests' results are not touched."""
    if full is not None:   # (the block pool is the full engine's)
        ip = fb.rip[r]
        if ip[I_CACHING] == 1 and ip[I_BLOCK_HASH] >= 1:
            w, wf = _rows(fb, r)
            ri = w[w.size - N_RI:]
            rs = fb.rs_i
            stream = Stream(fb.rs_a[r], rs[0, r], rs[1, r], rs[2, r], rs[3, r], rs[4, r], rs[5, r])
            dims = (n, ip[I_BLOCK_SIZE], ri[RI_DIM_CAP], ri[RI_DIM_NCNT], ri[RI_DIM_NHELD], ri[RI_DIM_NITL],
                    ri[RI_DIM_NBP], ri[RI_DIM_NBT])
            cache = _carve(stream, dims, w, wf)[4]
            _pool_cold(cache.pool, ip[I_NUM_GPU_BLOCKS])


@njit_noalloc
def _start(fb, ab, m, k, tau, delay, n, full):
    """Start up to ``k`` replicas at ``tau`` in the lowest free rows (serving at
    once without a delay), each with a cold cache; return how many started."""
    started = 0
    for r in range(m):
        if started == k:
            break
        if ab.state[r] == REP_OFF:
            _cold(fb, r, n, full)
            ab.state[r] = REP_SERVING if delay == 0.0 else REP_PROVISIONING
            ab.since[r] = tau
            ab.ready[r] = tau + delay
            started += 1
    held = m - _count(ab, m, REP_OFF)
    ab.out[O_PEAK] = max(ab.out[O_PEAK], held)
    return started


@njit_noalloc
def _shrink(ab, fb, m, k, tau):
    """Give up ``k`` replicas at ``tau``: provisioning ones first (the highest
    rows), then drain serving ones with the fewest requests (ties: the
    highest row); one holding nothing leaves at once."""
    for r in range(m - 1, -1, -1):
        if k == 0:
            return
        if ab.state[r] == REP_PROVISIONING:
            _leave(ab, r, tau)
            k -= 1
    while k > 0:
        best = -1
        for r in range(m - 1, -1, -1):
            if ab.state[r] == REP_SERVING and (best < 0 or fb.load[r, LOAD_IN_SYSTEM] < fb.load[best, LOAD_IN_SYSTEM]):
                best = r
        if best < 0:
            return
        ab.state[best] = REP_DRAINING
        if fb.load[best, LOAD_IN_SYSTEM] == 0:
            _leave(ab, best, tau)
        k -= 1


@njit_noalloc
def _desired(apar, total, serving, current):
    """The replicas the rule wants (HPA's: ceil(total / target), the
    current count within the tolerance; plus the spare ones; clamped)."""
    target = apar[AS_TARGET]
    if serving > 0 and abs(total / (serving * target) - 1.0) <= apar[AS_TOLERANCE]:
        d = current
    else:
        d = np.int64(math.ceil(total / target)) + np.int64(apar[AS_SPARE])
    return max(np.int64(apar[AS_MIN]), min(np.int64(apar[AS_MAX]), d))


@njit_noalloc
def _look_held(fb, ab, m, n, full, tau, what):
    """Every held replica advanced to ``tau`` (on its row's records) and
    observed; returns the first negative code of `_simulate`, else 0."""
    nblk = fb.rip[0, I_NUM_GPU_BLOCKS]
    for r in range(m):
        if ab.state[r] == REP_SERVING or ab.state[r] == REP_DRAINING:
            rc = _advance(fb, r, n, fb.rfp[r], fb.rlat[r], full, tau, what)
            if rc < 0:
                return rc
            _observe(fb, r, nblk, tau)
    return 0


@njit_noalloc
def _evaluate(fb, ab, apar, m, tau, arrived, last_scale, act, n, full):
    """The evaluation at ``tau`` (the held replicas observed): drained
    replicas leave, the rule decides, its row is written, and (``act``) the
    fleet scales (``n``, ``full``: the rows' capacity and engine, for
    `_start`). Return the time of the last scaling action, or
    AS_WINDOWS_FULL."""
    nblk = fb.rip[0, I_NUM_GPU_BLOCKS]
    queue = 0.0
    insys = 0.0
    total = 0.0
    for r in range(m):
        s = ab.state[r]
        if s == REP_DRAINING and fb.load[r, LOAD_IN_SYSTEM] == 0 and act:
            _leave(ab, r, tau)
        elif s == REP_SERVING or s == REP_DRAINING:
            queue += fb.load[r, LOAD_WAITING]
            insys += fb.load[r, LOAD_IN_SYSTEM]
            if s == REP_SERVING:
                if apar[AS_METRIC] == AS_METRIC_KV:
                    total += fb.load[r, LOAD_KV] / nblk
                else:
                    total += fb.load[r, LOAD_WAITING]
    if apar[AS_METRIC] == AS_METRIC_RATE:
        total = arrived / apar[AS_INTERVAL]
    serving = _count(ab, m, REP_SERVING)
    prov = _count(ab, m, REP_PROVISIONING)
    drain = _count(ab, m, REP_DRAINING)
    current = serving + prov
    d = _desired(apar, total, serving, current)
    w = np.int64(ab.out[O_NWIN])
    if w >= ab.windows.shape[0]:
        return AS_WINDOWS_FULL
    row = ab.windows[w]
    row[W_T], row[W_SERVING], row[W_PROVISIONING], row[W_DRAINING] = tau, serving, prov, drain
    row[W_METRIC], row[W_DESIRED], row[W_QUEUE], row[W_IN_SYSTEM] = total, d, queue, insys
    row[W_ARRIVALS], row[W_SLO_MET] = arrived, 0.0
    ab.out[O_NWIN] = w + 1
    if not act:
        return last_scale
    if d > current:
        if _start(fb, ab, m, d - current, tau, apar[AS_DELAY], n, full) > 0:
            ab.out[O_EVENTS] += 1
            return tau
    elif d < current and tau - last_scale >= apar[AS_COOLDOWN]:
        _shrink(ab, fb, m, current - d, tau)
        ab.out[O_EVENTS] += 1
        return tau
    return last_scale


@njit_noalloc
def _serving_set(ab, m):
    """The serving replicas' count; whether they are rows ``0..count-1``
    (the router may then read `FleetBuffers.load` itself: its view in
    `_serving_view` would be those rows, in order); and the earliest time a
    provisioning replica serves (``inf``: none). The set changes only at an
    evaluation and when a replica is activated, so an arrival between
    them reads these instead of scanning the rows."""
    ns = 0
    prefix = True
    ready = np.inf
    for r in range(m):
        s = ab.state[r]
        if s == REP_SERVING:
            prefix = prefix and r == ns
            ns += 1
        elif s == REP_PROVISIONING:
            ready = min(ready, ab.ready[r])
    return ns, prefix and ns > 0, ready


@njit_noalloc
def _serving_view(fb, ab, m):
    """The serving replicas' load rows, in row order, into ``sload``
    (their rows into ``pos``); return their count."""
    k = 0
    for r in range(m):
        if ab.state[r] == REP_SERVING:
            ab.pos[k] = r
            for c in range(fb.load.shape[1]):
                ab.sload[k, c] = fb.load[r, c]
            k += 1
    return k


@njit_noalloc
def _set_up(n, stream, ipar, fpar, lat, fb, ab, apar, full):
    """Every row set up empty (as `cluster._simulate_fleet`) for the stream
    ``(arrival, prompt, output, prio, sjfk, pgrp, plen)``, the first
    ``initial_replicas`` serving; returns the first negative code, else 0."""
    m = np.int64(apar[AS_MAX])
    rc = _set_up_uniform(n, stream, ipar, fpar, lat, m, fb, full, ipar)
    if rc < 0:
        return rc
    for r in range(m):
        ab.state[r] = REP_SERVING if r < apar[AS_INITIAL] else REP_OFF
        ab.since[r] = 0.0
        ab.ready[r] = 0.0
        ab.life[r] = 0.0
    for j in range(ab.out.size):
        ab.out[j] = 0.0
    ab.out[O_PEAK] = min(apar[AS_INITIAL], apar[AS_MAX])
    for g in range(fb.table.size):
        fb.table[g] = -1
    return 0


@njit_noalloc(entry=True)
def _simulate_autoscaled(n, arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, fleet, router, apar,
                         key0, key1, rep, fb, ab, full):
    """Run an autoscaled fleet behind the router ``router`` over the
    requests ``0..n-1`` of the fleet's stream, to the end.

    Parameters
    ----------
    n, arrival, prompt, output, prio, sjfk, pgrp, plen : int, 1-D arrays
        The fleet's requests (`workload._draw_workload`), sorted by arrival.
    ipar, fpar, lat : 1-D arrays
        The parameter records of every replica (`layout`).
    fleet : 1-D float array
        The fleet's record (`layout.FL_*`; live state only).
    router : int
        The routing policy (`layout.ROUTER_*`; none that keeps a table).
    apar : 1-D float array
        The policy's record (`layout.AS_*`).
    key0, key1, rep : int
        The router's random stream: keyed as replication ``rep``'s workload.
    fb : FleetBuffers
        ``apar[AS_MAX]`` replica rows (`cluster.fleet_buffers`).
    ab : AutoscaleBuffers
        The policy's state and the evaluations' table (`autoscale_buffers`).
    full : None or int
        The compiled engine (`replica.engine_variant`).

    Returns
    -------
    int
        0, AS_WINDOWS_FULL, or the first negative code of `replica._simulate` or `_hand`.
    """
    m = np.int64(apar[AS_MAX])
    rc = _set_up(n, (arrival, prompt, output, prio, sjfk, pgrp, plen), ipar, fpar, lat, fb, ab, apar, full)
    if rc < 0:
        return rc
    _seed_streams(key0, key1, rep, fb.rstate)
    warmup = ipar[I_WARMUP]
    lag, cap, interval = fleet[FL_LATENCY], fleet[FL_LOAD_CAP], apar[AS_INTERVAL]
    reads = _needs_state(router)
    what = STEP_ADVANCE | (STEP_NO_STRETCH if _reads_kv(router, fleet[FL_SCORERS:]) or apar[AS_METRIC] == AS_METRIC_KV
                           else 0)
    # for the routers the departure bound serves, the arrivals' looks by the static fleet's event queue
    # where ``fb`` holds one (`cluster._look_due`: of the rows, only those due advanced, and those and the
    # ones handed a request since observed; a row not held holds no request, so is never due; each row's
    # segments are set up, `_set_up_uniform`); an evaluation's look advances every held replica, and the
    # queue is keyed afresh after it
    queue = (reads and _in_system_only(router) and fb.seg.shape[0] >= m and fb.ev.size >= 4 * m + 1
             and fb.dep.size >= 3 * m)
    # a replayed trace's block identities: each row handed parents of its own (`trace_blocks`; a row a
    # new replica reuses keeps its map, whose names stay consistent: its cold cache holds none of them)
    jg = _tmap_reset(n, prompt, ipar[I_BLOCK_SIZE], fb.tmap)
    if jg < 0:
        return TMAP_SMALL
    traced = jg > 0
    # each row on its records: per-step noise, a stream of its own (row r's key; a replica that starts in a
    # row reused takes the row's steps on from where they stand)
    _own_records(fb, m, fpar, lat)
    if queue:
        _queue_key(fb, m, n, what, 0.0, True)
    k = 1
    last = 0.0
    arrived = 0
    ns, prefix, ready = _serving_set(ab, m)
    kept, chain = -np.inf, -np.inf
    for i in range(n):
        t = arrival[i]
        if i == warmup and warmup > 0:
            for r in range(m):
                fb.rip[r, I_WARMUP] = _ri(fb, r, RI_N_KNOWN)
        while k * interval <= t:
            tau = k * interval
            _activate(ab, m, tau)
            rc = _look_held(fb, ab, m, n, full, tau, what)
            if rc < 0:
                return rc
            last = _evaluate(fb, ab, apar, m, tau, arrived, last, True, n, full)
            if last == AS_WINDOWS_FULL:
                return AS_WINDOWS_FULL
            if queue:
                _queue_key(fb, m, n, what, tau, True)
            arrived = 0
            k += 1
            ready = -np.inf   # (the serving set may have changed: stated again below)
        if ready <= t:
            _activate(ab, m, t)
            ns, prefix, ready = _serving_set(ab, m)
        if reads and ns > 1:
            if queue:
                rc = _look_due(fb, m, n, full, t, what, True)
            else:
                rc = _look_held(fb, ab, m, n, full, t, what)
            if rc < 0:
                return rc
        if prefix:   # (the serving rows are 0..ns-1: the view would be their rows, in order)
            r = _route(router, i, pgrp[i], fb.load, fb.table, fb.rstate, cap, ns)
        else:
            r = ab.pos[_route(router, i, pgrp[i], ab.sload, fb.table, fb.rstate, cap, _serving_view(fb, ab, m))]
        if queue:   # (the stretch end kept across the hand, as the static fleet's: `cluster._keep_end`)
            kept, chain = _keep_end(fb, r, m, n, t + lag, prompt[i], output[i])
        ri = fb.rs_i
        wi, wf = _rows(fb, r)
        g, lp = pgrp[i], plen[i]
        if traced:
            g, lp = _localise(i, r, m, _ri(fb, r, RI_N_KNOWN), prompt, pgrp, plen, ipar[I_BLOCK_SIZE], jg, fb.tmap)
        j = _hand(n, fb.rs_a[r], ri[0, r], ri[1, r], ri[2, r], ri[3, r], ri[4, r], ri[5, r], fb.rip[r], fpar,
                  wi, wf, full, t + lag, prompt[i], output[i], prio[i], sjfk[i], g, lp)
        if j < 0:
            return j
        fb.owner[i] = r
        fb.local[i] = j
        if queue:
            fb.dep[m + r] = kept
            fb.dep[2 * m + r] = chain
            if fb.dep.size > 3 * m + i:   # (for tests: each hand's kept end, `simulate_autoscaled_stream`)
                fb.dep[3 * m + i] = kept
            _queue_handed(fb, r, m, n, what, True)
        arrived += 1
    rc = _wind_down(n, fpar, ipar, fb, ab, apar, full, k, last, arrived, what)
    if rc < 0:
        return rc
    _close(n, arrival, lag, ipar, fpar, fb, ab, m)
    return 0


@njit_noalloc
def _wind_down(n, fpar, ipar, fb, ab, apar, full, k, last, arrived, what):
    """After the last arrival: evaluations until one finds the fleet holding
    no request (or the horizon: the fleet ends then, and acts no more; that
    one only writes its row, when its window had arrivals); then every
    replica to its end."""
    m = np.int64(apar[AS_MAX])
    has_h = ipar[I_HAS_HORIZON] == 1
    while True:
        tau = k * apar[AS_INTERVAL]
        if has_h and tau >= fpar[F_HORIZON]:
            break
        _activate(ab, m, tau)
        rc = _look_held(fb, ab, m, n, full, tau, what)
        if rc < 0:
            return rc
        left = 0.0
        for r in range(m):
            if ab.state[r] == REP_SERVING or ab.state[r] == REP_DRAINING:
                left += fb.load[r, LOAD_IN_SYSTEM]
        if left == 0.0:
            if arrived > 0 and _evaluate(fb, ab, apar, m, tau, arrived, last, False, n, full) == AS_WINDOWS_FULL:
                return AS_WINDOWS_FULL
            break
        last = _evaluate(fb, ab, apar, m, tau, arrived, last, True, n, full)
        if last == AS_WINDOWS_FULL:
            return AS_WINDOWS_FULL
        arrived = 0
        k += 1
    for r in range(m):
        rc = _call(fb, r, n, fb.rfp[r], fb.rlat[r], full, np.inf, STEP_ADVANCE | STEP_FINISH)
        if rc < 0:
            return rc
    return 0


@njit_noalloc
def _close(n, arrival, lag, ipar, fpar, fb, ab, m):
    """The fleet's end (the horizon, else the last of the last arrival at
    its replica and the requests' departures); the replicas still held are
    counted to it."""
    end = arrival[n - 1] + lag if n > 0 else 0.0
    for i in range(n):
        f = fb.wf[fb.owner[i]][WF_FINISH * n + fb.local[i]]
        if f == f:   # (not nan: it left)
            end = max(end, f)
    if ipar[I_HAS_HORIZON] == 1:
        end = fpar[F_HORIZON]
    for r in range(m):
        if ab.state[r] != REP_OFF:
            ab.life[r] += max(end - ab.since[r], 0.0)
            ab.state[r] = REP_OFF
    ab.out[O_END] = end


@njit_noalloc(entry=True)
def _window_slo(n, arrival, output, ipar, fpar, interval, fb, windows, nwin):
    """Per evaluation's window ((k - 1) interval, k interval], as `_evaluate`
    counts its arrivals: how many of them completed within the scenario's
    SLOs (TTFT and TPOT as `metrics._reduce` measures them)."""
    has_ttft, has_tpot = ipar[I_HAS_TTFT_SLO] == 1, ipar[I_HAS_TPOT_SLO] == 1
    overhead = fpar[F_TTFT_OVERHEAD]
    w = 0
    for i in range(n):
        while w < nwin and arrival[i] >= windows[w, W_T]:
            w += 1
        if w >= nwin:
            return
        r, j = fb.owner[i], fb.local[i]
        wi, wf = fb.wi[r], fb.wf[r]
        if wi[WI_STATUS * n + j] != ST_COMPLETED:
            continue
        first, finish = wf[WF_FIRST * n + j], wf[WF_FINISH * n + j]
        ok = not (has_ttft and first - arrival[i] + overhead > fpar[F_TTFT_SLO])
        if has_tpot and output[i] > 1 and (finish - first) / (output[i] - 1) > fpar[F_TPOT_SLO]:
            ok = False
        if ok:
            windows[w, W_SLO_MET] += 1.0


def autoscale_buffers(nrep, nwin):
    """The policy's buffers for ``nrep`` replica rows and ``nwin`` evaluations."""
    from .layout import N_LOAD, N_WINDOW_COLUMNS
    return AutoscaleBuffers(np.zeros(nrep, np.int64), np.zeros(nrep), np.zeros(nrep), np.zeros(nrep),
                            np.zeros(nrep, np.int64), np.zeros((nrep, N_LOAD)), np.zeros((nwin, N_WINDOW_COLUMNS)),
                            np.zeros(N_OUT))


# ------------------------------------------------------------------------------
# From Python

def simulate_autoscaled_stream(arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, fleet, router,
                               apar, key0=0, key1=0, rep=0, queue=True, kept=None):
    """Simulate an autoscaled fleet over one given request stream (a Python
    entry, for tests and the reference's comparisons).

    Parameters
    ----------
    arrival, prompt, output, prio, sjfk, pgrp, plen : array_like
        The request stream, as `cluster.simulate_fleet_stream` takes it.
    ipar, fpar, lat : array_like
        One replica's integer, float and latency records (`layout`).
    fleet : array_like
        The fleet record (`layout.FL_*`).
    router : int
        The router's code (`layout.ROUTER_*`).
    apar : array_like
        The autoscaler's record (`layout.AS_*`: metric, target, interval,
        bounds, provisioning delay, cool-down, ...).
    key0, key1, rep : int
        The run's seed keys and the replication's index, as
        `cluster.simulate_fleet_stream` takes them.
    queue : bool
        False: the arrivals' looks advance and observe every held replica
        (`_look_held`) instead of the event queue's (`cluster._look_due`;
        the same bits, more calls; for tests).
    kept : ndarray, optional
        With ``queue``, an array of the stream's size that gets each hand's
        kept stretch end (`cluster._keep_end`; ``-inf`` where none is kept;
        for tests).

    Returns
    -------
    tuple
        Per-request results (status, first token, finish, preemptions,
        tokens, replica row), the evaluations' table, the replica-seconds
        held (times GPUs: ``gpu_s``) and the fleet's end.
    """
    from .cluster import _gather, _ngroups, fleet_buffers, stream_trace_blocks
    from .replica import engine_variant
    from .workspace import _ws_need_handed
    stream = (np.array(arrival, dtype=np.float64),) + tuple(
        np.array(x, dtype=np.int64) for x in (prompt, output, prio, sjfk, pgrp, plen))
    n = stream[0].size
    full = engine_variant(ipar)
    m = int(apar[AS_MAX])
    need_i, need_f = _ws_need_handed(np.int64(n), stream[1], stream[2], stream[5], stream[6], ipar)
    if kept is not None and (not queue or np.shape(kept) != (n,)):
        raise ValueError(f"kept: an array of the stream's {n} entries, with queue=True; got shape "
                         f"{np.shape(kept)}, queue={queue}")
    fb = fleet_buffers(n, m, need_i, need_f, _ngroups(stream[5]),
                       trace_blocks=stream_trace_blocks(stream[1], stream[5], ipar))
    if not queue:
        fb = fb._replace(ev=np.empty(0, np.int64))
    elif kept is not None:
        fb = fb._replace(dep=np.full(3 * m + n, -np.inf))
    nwin = _window_guess(stream[0], apar)
    while True:
        ab = autoscale_buffers(m, nwin)
        rc = _simulate_autoscaled(np.int64(n), *stream, ipar, fpar, lat, np.asarray(fleet, np.float64),
                                  np.int64(router), np.asarray(apar, np.float64), np.uint64(key0), np.uint64(key1),
                                  np.int64(rep), fb, ab, full)
        if rc != AS_WINDOWS_FULL:
            break
        nwin *= 2
    if rc < 0:
        raise RuntimeError(f"the autoscaled fleet could not be simulated (code {rc})")
    if kept is not None:
        kept[:n] = fb.dep[3 * m:]
    nw = int(ab.out[O_NWIN])
    _window_slo(np.int64(n), stream[0], stream[2], ipar, fpar, float(apar[AS_INTERVAL]), fb, ab.windows, nw)
    status = np.array([fb.wi[r][WI_STATUS * n + j] for r, j in zip(fb.owner, fb.local)], np.int64)
    first = np.array([fb.wf[r][WF_FIRST * n + j] for r, j in zip(fb.owner, fb.local)])
    finish = np.array([fb.wf[r][WF_FINISH * n + j] for r, j in zip(fb.owner, fb.local)])
    npre, g = _gather(fb, n)
    return (status, first, finish, npre, g, fb.owner[:n].copy(), ab.windows[:nw].copy(),
            sum(ab.life.tolist()) * float(apar[AS_GPUS]), float(ab.out[O_END]))


def _window_guess(arrival, apar):
    """Evaluations up to the last arrival, and as many again to drain."""
    last = float(arrival[-1]) if arrival.size else 0.0
    return int(2 * last / float(apar[AS_INTERVAL])) + 16
