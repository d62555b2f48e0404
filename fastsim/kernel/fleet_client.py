"""A closed loop of clients in front of a fleet, in compiled code.

``Workload(max_concurrency=c)`` with a fleet: one client (as ``vllm bench
serve --max-concurrency c`` pointed at the router) holds ``c`` seats across
the fleet; a departure from any replica frees one. Request ``k`` is the
``k``-th send: a pure closed loop's departure ``j`` sends at ``R_j + Z_j``
(the sends in time order, ties to the earlier departure), a capped stream's
request ``k >= c`` goes at ``max(w_k, R_(k-c), a_(k-1))``, as one replica's
closed loop (`arrivals._release_seats`). Semantics:
``docs/engine-model.md``, "Fleets", closed loops.

The sends come from departures, so the fleet's requests are not known
before the run: the replicas advance in global time, instant by instant.
Each replica is keyed by a lower bound of its next departure as the client
sees it (`_key`: the end of its step in flight or of the stretch it waits
at, `cluster._due`, or later by the departure bound, `cluster._departs_parts`;
an idle replica by its next handed arrival). At the least instant ``H`` of
the keys, the next send and the next scrape of a stale view: (1) the
replicas keyed at ``H`` end their steps there (called to ``H``: paused
before they schedule at ``H``); (2) the sends at ``H`` are routed and handed
(departures at ``H`` release theirs first, in send order); (3) the replicas
that act at ``H`` schedule there (called to just past ``H``); where those
schedules free seats (rejections, abandonment), every other replica is
called just past ``H`` too before the sends they make at ``H`` are routed
(a replica left paused by its key may have a schedule at ``H`` to make
first). No departure is ever found before the instant it was looked for
at (the keys are lower bounds; checked, `CLOSED_LATE`).
"""

from __future__ import annotations

import numpy as np

from .._numba_options import njit_noalloc
from .cluster import (ROW_FULL, _call, _departs_parts, _due, _fits, _min_step, _observe, _rf, _ri, _rows,
                      _segments, _set_up_rows, simulate_fleet_stream)
from .layout import (ARRIVAL_CLOSED, FL_LATENCY, FL_LOAD_CAP, FL_SCORERS, FL_STALENESS, I_ARRIVAL_KIND,
                     I_MAX_CONCURRENCY, I_NUM_GPU_BLOCKS, ROUTER_POWER_OF_TWO, ROUTER_WEIGHTED, ST_COMPLETED,
                     ST_DROPPED)
from .replica import MODE_STRETCH, STEP_ADVANCE, STEP_FINISH, STEP_NO_STRETCH, _hand
from .rng import _seed_streams
from .router import (_in_system_only, _live_state, _needs_state, _reads_kv, _route, _route_weighted, _shorter,
                     _two_choices)
from .workspace import (RF_CLOCK, RI_MODE, RI_N_KNOWN, RI_N_RUN, RI_N_SWAPPED, RI_N_WAIT, RI_NEXT_ARRIVAL, WF_FINISH,
                        WI_STATUS)

#: `_simulate_fleet_closed`'s codes for a broken invariant (never expected: a test asserts them away): a
#: departure found before the instant the replica was called at (a key that was no lower bound), and a
#: replica that acted at an instant and is still keyed there (no progress), requests left unsent with
#: nothing in the fleet to send them.
CLOSED_LATE, CLOSED_STALL, CLOSED_STUCK = -11, -12, -13


@njit_noalloc(inline="llvm")
def _key(fb, r, m, what, now):
    """A lower bound of the next departure from replica ``r`` (requests
    handed so far, none more), as the client sees it, at the instant
    ``now`` of the loop: ``inf`` with nothing in it and nothing handed to
    come; an idle replica's next handed arrival; else the first time its
    state can change (`cluster._due`; ``now`` where it may act at once),
    or the departure bound where that is later."""
    n_sys = _ri(fb, r, RI_N_RUN) + _ri(fb, r, RI_N_WAIT) + _ri(fb, r, RI_N_SWAPPED)
    nxt, known = _ri(fb, r, RI_NEXT_ARRIVAL), _ri(fb, r, RI_N_KNOWN)
    if n_sys == 0:
        if nxt >= known:
            return np.inf
        d = fb.rs_a[r, nxt]
    else:
        d = _due(fb, r, what)
        if d == -np.inf:
            d = max(now, _rf(fb, r, RF_CLOCK))
    lat = fb.rlat[r]
    taken, handed = _departs_parts(fb, r, m, _min_step(lat), lat)
    # (never before ``now``: a replica left paused by the bound, then handed a request that turns the bound
    # off, is keyed by its step end, past; nothing can leave it before now)
    return max(max(d, min(taken, handed)), now)


@njit_noalloc(inline="llvm")
def _departed(fb, r, m, j):
    """Whether request ``j`` of replica ``r`` has left it as its client sees
    it: completed (with async scheduling, also while it holds its seat
    until the next schedule: its finish time is set), rejected or dropped."""
    st = fb.wi[r, WI_STATUS * m + j]
    f = fb.wf[r, WF_FINISH * m + j]
    return (st >= ST_COMPLETED and st <= ST_DROPPED) or f == f


@njit_noalloc
def _collect(fb, r, m, link, n, t):
    """The departures from replica ``r`` since it was last looked at, taken
    off its list of outstanding requests (``link``: a list per replica
    through the fleet's request indices, its head at ``link[n + r]``); the
    count, or `CLOSED_LATE` if one finished before ``t``."""
    prev = -1
    i = link[n + r]
    cnt = 0
    while i >= 0:
        nx = link[i]
        j = fb.local[i]
        if _departed(fb, r, m, j):
            if fb.wf[r, WF_FINISH * m + j] < t and fb.wi[r, WI_STATUS * m + j] != ST_DROPPED:
                return CLOSED_LATE
            if prev < 0:
                link[n + r] = nx
            else:
                link[prev] = nx
            cnt += 1
        else:
            prev = i
        i = nx
    return cnt


@njit_noalloc
def _release(cnt, t, released, c, n, arrival, wanted, pure, ns):
    """``cnt`` departures at ``t``: the seats they free set the send times
    of requests ``released + c ..`` (``wanted``: each one's think time in a
    pure closed loop, its wanted time in a capped stream; requests ``ns ..``
    are not sent yet, their pending times sorted in ``arrival``, the
    unknown ones inf). Returns the departures released."""
    for _ in range(cnt):
        k = released + c
        released += 1
        if k >= n:
            continue
        if pure:   # R_j + Z_j among the pending sends (ties: after them, the earlier departures')
            v = t + wanted[k]
            pos = k
            while pos > ns and arrival[pos - 1] > v:
                arrival[pos] = arrival[pos - 1]
                pos -= 1
            arrival[pos] = v
        else:
            arrival[k] = max(max(wanted[k], t), arrival[k - 1])
    return released


@njit_noalloc
def _advance_closed(fb, r, n, m, full, t_stop, what, now, keys, last, link, seats):
    """Replica ``r`` advanced to ``t_stop`` at the loop's instant ``now``:
    its departures collected (`_collect`) and released at ``now``
    (`_release`; ``seats``: (released, c, arrival, wanted, pure, next
    send)), its key and last stop set. Returns the departures released so
    far, or a negative code."""
    released, c, arrival, wanted, pure, ns = seats
    rc = _call(fb, r, m, fb.rfp[r], fb.rlat[r], full, t_stop, what)
    if rc < 0:
        return rc
    last[r] = t_stop
    cnt = _collect(fb, r, m, link, n, now)
    if cnt < 0:
        return cnt
    keys[r] = _key(fb, r, m, what, now)
    return _release(cnt, now, released, c, n, arrival, wanted, pure, ns)


@njit_noalloc
def _look_closed(fb, nrep, n, m, full, h, tv, what, bound, keys, last, link, seats):
    """The router's look at ``h``: the replicas whose view can have changed
    by then (keyed there, for a router that reads requests in the system
    only, ``bound``; else due there, `cluster._due`) advanced to ``h``,
    every replica observed at ``tv`` (``h``, or just past it once the
    replicas have made their schedules at ``h``). Returns the departures
    released so far, or a negative code."""
    released = seats[0]
    for r in range(nrep):
        if (keys[r] if bound else _due(fb, r, what, h)) <= h:
            released = _advance_closed(fb, r, n, m, full, h, what, h, keys, last, link, (released,) + seats[1:])
            if released < 0:
                return released
        _observe(fb, r, fb.rip[r, I_NUM_GPU_BLOCKS], tv)
    return released


@njit_noalloc
def _schedule_at(fb, r, n, m, full, h, what, keys, last, link, seats):
    """Replica ``r``, left paused by its key (past ``h``), makes the
    schedule it has at ``h``, if any, before the sends that schedules at
    ``h`` freed are routed (the departures released so far, or a negative
    code): one whose next action is at or before ``h`` (idle and handed a
    request by ``h``, between steps, a step in flight ending at ``h``) is
    called to just past ``h``; one paused before a stretch of decode steps
    runs them one by one to ``h`` (a stretch is taken whole or not at all),
    and if a step of it ends at ``h``, schedules there. One in flight past
    ``h`` has no schedule at ``h``; calling it just past ``h`` could end a
    step one unit of roundoff after ``h`` and date its departures at ``h``."""
    released = seats[0]
    if _due(fb, r, what, h) > h:
        if _ri(fb, r, RI_MODE) != MODE_STRETCH:
            return released
        released = _advance_closed(fb, r, n, m, full, h, what | STEP_NO_STRETCH, h, keys, last, link, seats)
        if released < 0 or _due(fb, r, what, h) > h:
            return released
    released = _advance_closed(fb, r, n, m, full, np.nextafter(h, np.inf), what, h, keys, last, link,
                               (released,) + seats[1:])
    if released >= 0 and keys[r] <= h:
        return CLOSED_STALL
    return released


@njit_noalloc(entry=True)
def _simulate_fleet_closed(n, arrival, prompt, output, prio, sjfk, pgrp, plen, fleet, router, nrep, key0, key1,
                           rep, fb, full, wanted, keys, last, link):
    """`cluster._simulate_fleet_rows` for a closed loop of clients (the
    records' ``I_MAX_CONCURRENCY`` seats, ``I_ARRIVAL_KIND`` closed or a
    capped renewal stream): the requests sent as departures free seats,
    each routed at its send. ``arrival`` holds what `workload._draw_workload`
    draws for a closed loop (requests ``0..c-1``: their send times; ``k >=
    c``: the think time of departure ``k - c``, or a capped stream's wanted
    time) and receives each request's send time. Scratch: ``wanted`` (n
    floats), ``keys`` and ``last`` (``nrep`` floats: each replica's key and
    the time its last call stopped at), ``link`` (``n + nrep`` ints). The
    replicas' records are taken as open (no seats of their own). Returns 0,
    the first negative code of `replica._simulate` or `_hand`, `ROW_FULL`,
    or one of the ``CLOSED_*`` codes."""
    m = fb.rs_a.shape[1]
    c = fb.rip[0, I_MAX_CONCURRENCY]
    pure = fb.rip[0, I_ARRIVAL_KIND] == ARRIVAL_CLOSED
    for r in range(nrep):
        fb.rip[r, I_MAX_CONCURRENCY] = 0   # (the client's seats are the fleet's, not a replica's)
    for k in range(min(c, n), n):
        wanted[k] = arrival[k]
        arrival[k] = np.inf
    rc = _set_up_rows(n, arrival, prompt, output, prio, sjfk, pgrp, plen, fb, nrep, full)
    if rc != 0:
        return rc
    _seed_streams(key0, key1, rep, fb.rstate)
    stale, lag, cap = fleet[FL_STALENESS], fleet[FL_LATENCY], fleet[FL_LOAD_CAP]
    reads = _needs_state(router) and nrep > 1
    what = STEP_ADVANCE | (STEP_NO_STRETCH if _reads_kv(router, fleet[FL_SCORERS:]) else 0)
    live = stale == 0.0 or _live_state(router)
    two = reads and live and router == ROUTER_POWER_OF_TWO
    reads = reads and not two
    # a router that reads the requests in the system only leaves a replica paused until it can lose one
    bound = two or _in_system_only(router)
    for r in range(nrep):
        _segments(fb, r, m)
        keys[r] = np.inf
        last[r] = -np.inf
        link[n + r] = -1
    released, ns, k_scrape = 0, 0, 0
    now = -np.inf
    acted = -np.inf   # (the last instant whose schedules were made: sends routed after them see them)
    while True:
        s = arrival[ns] if ns < n else np.inf
        # the least key of a replica not yet called to it (k1), and of one called to it (k3: it acts there)
        k1, k3 = np.inf, np.inf
        for r in range(nrep):
            if keys[r] > last[r]:
                k1 = min(k1, keys[r])
            else:
                k3 = min(k3, keys[r])
        h = min(s, min(k1, k3))
        if h == np.inf:   # (every request sent and gone: the scrapes of a stale view stop too)
            if ns < n:
                return CLOSED_STUCK
            break
        tau = k_scrape * stale if reads and not live else np.inf
        h = min(h, tau)
        if h < now:
            return CLOSED_LATE
        now = h
        seats = (released, c, arrival, wanted, pure, ns)
        if tau == h:   # a scrape of a stale view: the state every replica has at it
            released = _look_closed(fb, nrep, n, m, full, h, h, what, bound, keys, last, link, seats)
            if released < 0:
                return released
            k_scrape += 1
            continue
        if k1 == h:   # (1) steps ending at h end; nothing schedules at h yet
            for r in range(nrep):
                if keys[r] == h and last[r] < h:
                    released = _advance_closed(fb, r, n, m, full, h, what, h, keys, last, link,
                                               (released,) + seats[1:])
                    if released < 0:
                        return released
            continue
        if s == h:   # (2) the next send, routed at h
            i = ns
            ns += 1
            # (a send made by a schedule at h sees the replicas after their schedules there: a replica paused
            # before a stretch with requests that finished at h holds them no more, `cluster._observe`)
            tv = np.nextafter(h, np.inf) if acted == h else h
            if reads and live:
                released = _look_closed(fb, nrep, n, m, full, h, tv, what, bound, keys, last, link,
                                        (released, c, arrival, wanted, pure, ns))
                if released < 0:
                    return released
            if two:
                a, b = _two_choices(fb.rstate, nrep)
                for x in (a, b):
                    if keys[x] <= h:
                        released = _advance_closed(fb, x, n, m, full, h, what, h, keys, last, link,
                                                   (released, c, arrival, wanted, pure, ns))
                        if released < 0:
                            return released
                    _observe(fb, x, fb.rip[x, I_NUM_GPU_BLOCKS], tv)
                r = _shorter(fb.load, a, b)
            elif router == ROUTER_WEIGHTED:   # (a closed loop replays no trace: no block identities)
                r = _route_weighted(i, fb.load, fb.table, fb.rstate, fleet[FL_SCORERS:], fb.rip, nrep, prompt, pgrp,
                                    plen, 1, 0, fb.tmap)
            else:
                r = _route(router, i, pgrp[i], fb.load, fb.table, fb.rstate, cap, nrep)
            if m < n and not _fits(fb, r, True, output[i]):
                return ROW_FULL
            ri = fb.rs_i
            wi, wf = _rows(fb, r)
            j = _hand(m, fb.rs_a[r], ri[0, r], ri[1, r], ri[2, r], ri[3, r], ri[4, r], ri[5, r], fb.rip[r],
                      fb.rfp[r], wi, wf, full, h + lag, prompt[i], output[i], prio[i], sjfk[i], pgrp[i], plen[i])
            if j < 0:
                return j
            fb.owner[i] = r
            fb.local[i] = j
            link[i] = link[n + r]
            link[n + r] = i
            keys[r] = _key(fb, r, m, what, h)
            continue
        # (3) the replicas that act at h schedule there (called to just past it); if those schedules free
        # seats (rejections, abandonment), their sends at h come after every replica's schedule at h: the
        # replicas left paused by their keys that schedule at h do so first (`_schedule_at`)
        after = np.nextafter(h, np.inf)
        acted = h
        before = released
        for r in range(nrep):
            if keys[r] == h and last[r] >= h:
                released = _advance_closed(fb, r, n, m, full, after, what, h, keys, last, link,
                                           (released,) + seats[1:])
                if released < 0:
                    return released
                if keys[r] <= h:
                    return CLOSED_STALL
        if released > before:
            for r in range(nrep):
                if keys[r] < np.inf and last[r] < after:
                    released = _schedule_at(fb, r, n, m, full, h, what, keys, last, link, (released,) + seats[1:])
                    if released < 0:
                        return released
    for r in range(nrep):
        rc = _call(fb, r, m, fb.rfp[r], fb.rlat[r], full, np.inf, STEP_ADVANCE | STEP_FINISH)
        if rc < 0:
            return rc
    return 0


def simulate_closed_fleet_stream(arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, fleet, router, nrep,
                                 key0=0, key1=0, rep=0, **kwargs):
    """`cluster.simulate_fleet_stream` of a closed loop (the integer records'
    ``I_MAX_CONCURRENCY`` seats; a Python entry, for tests and the per-class
    rows): ``arrival`` holds what `workload._draw_workload` draws for it
    (the first seats' send times, then each departure's think time, or a
    capped stream's wanted times); ``sent`` receives the send times. Open
    records run as `cluster.simulate_fleet_stream` runs them."""
    drawn = np.array(arrival, dtype=np.float64)

    def run(a, n, nrep):
        a[1][:] = drawn   # (the kernel writes the send times over what was drawn: again on a retry)
        return _simulate_fleet_closed(*a, *closed_scratch(n, nrep))

    closed = int(np.atleast_2d(np.asarray(ipar))[0, I_MAX_CONCURRENCY]) > 0   # (one record, or a row a replica)
    return simulate_fleet_stream(drawn, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, fleet, router, nrep,
                                 key0, key1, rep, run=run if closed else None, **kwargs)


def closed_scratch(n, nrep):
    """`_simulate_fleet_closed`'s scratch for ``n`` requests over ``nrep``
    replicas: (wanted, keys, last, link)."""
    return np.empty(max(n, 1)), np.empty(nrep), np.empty(nrep), np.empty(n + nrep, np.int64)
