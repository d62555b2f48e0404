"""Routers: which replica of a fleet gets the next request.

Each policy is a small function over the replicas' state as the router sees
it (``load``: a row per replica, columns `layout.LOAD_*`, filled by
`cluster`, live or as of the last scrape) and its own memory (``table``:
prefix group to replica); `_route` picks one by its `layout.ROUTER_*` code,
so adding a policy that reads no more touches this module and the code
table only. The weighted router (`_route_weighted`) reads the request's
prompt, its scorers' weights and the replicas' records too: the routing
loops call it by name. Ties go to the lowest replica index (a deterministic
rule the reference shares by specification, ``docs/engine-model.md``,
"Fleets"), but the weighted router's, drawn from the router's stream.
"""

from __future__ import annotations

import numpy as np

from .._numba_options import njit_noalloc
from .layout import (I_BLOCK_SIZE, I_NUM_GPU_BLOCKS, LOAD_IN_SYSTEM, LOAD_KV, LOAD_RUNNING, LOAD_WAITING,
                     ROUTER_JSQ, ROUTER_LEAST_KV, ROUTER_LEAST_OUTSTANDING, ROUTER_POWER_OF_TWO,
                     ROUTER_PREFIX_AFFINITY, ROUTER_RANDOM, ROUTER_ROUND_ROBIN, ROUTER_SESSION_AFFINITY,
                     ROUTER_VLLM_DP, ROUTER_WEIGHTED, S_ROUTE, SC_KV, SC_PREFIX, SC_QUEUE)
from .rng import _uniform
from .trace_blocks import matched, roots


@njit_noalloc
def _pick(state, m):
    """A uniform index in ``0..m-1`` from the router's stream."""
    return min(int(_uniform(state, S_ROUTE) * m), m - 1)


@njit_noalloc
def _route_random(state, nrep):
    """Uniformly at random."""
    return _pick(state, nrep)


@njit_noalloc
def _route_round_robin(i, nrep):
    """The fleet's ``i``-th request to replica ``i mod N``."""
    return i % nrep


@njit_noalloc(inline="llvm")
def _route_least(load, col, nrep):
    """The fewest of column ``col`` (requests in the system: least
    outstanding, join the shortest queue)."""
    best = 0
    least = load[0, col]
    for r in range(1, nrep):   # (selects, not branches: which replica is least is not predictable)
        x = load[r, col]
        fewer = x < least
        best = r if fewer else best
        least = x if fewer else least
    return best


@njit_noalloc
def _route_vllm_dp(load, nrep):
    """vLLM's data-parallel load score, ``4 * waiting + running``, lowest."""
    best = 0
    score = 4 * load[0, LOAD_WAITING] + load[0, LOAD_RUNNING]
    for r in range(1, nrep):
        s = 4 * load[r, LOAD_WAITING] + load[r, LOAD_RUNNING]
        if s < score:
            best, score = r, s
    return best


@njit_noalloc
def _two_choices(state, nrep):
    """Two distinct replicas drawn at random, ``(a, b)`` (``b == a`` only
    with one replica): power of two choices' draws, apart so that a fleet
    can look at these two only."""
    a = _pick(state, nrep)
    if nrep == 1:
        return a, a
    b = _pick(state, nrep - 1)
    if b >= a:
        b += 1
    return a, b


@njit_noalloc
def _shorter(load, a, b):
    """Of replicas ``a`` and ``b``, the one with fewer requests in the system (``a`` on a tie)."""
    return b if load[b, LOAD_IN_SYSTEM] < load[a, LOAD_IN_SYSTEM] else a


@njit_noalloc
def _route_power_of_two(state, load, nrep):
    """Two distinct replicas at random, the one with fewer requests in the
    system (the first drawn on a tie)."""
    a, b = _two_choices(state, nrep)
    return _shorter(load, a, b)


@njit_noalloc
def _route_least_kv(load, nrep):
    """The least KV cache in use (blocks not free), then fewer requests."""
    best = 0
    for r in range(1, nrep):
        if load[r, LOAD_KV] < load[best, LOAD_KV] or (
                load[r, LOAD_KV] == load[best, LOAD_KV] and load[r, LOAD_IN_SYSTEM] < load[best, LOAD_IN_SYSTEM]):
            best = r
    return best


@njit_noalloc
def _route_prefix_affinity(load, table, grp, cap, nrep):
    """The replica that last got the request's prefix group (whose cache
    holds its prefix), unless its requests exceed the least loaded
    replica's by more than ``cap``: then the least loaded, which the group
    follows from then on. No group: the least loaded."""
    least = _route_least(load, LOAD_IN_SYSTEM, nrep)
    if grp < 0 or grp >= table.size:
        return least
    r = table[grp]
    if r < 0 or load[r, LOAD_IN_SYSTEM] > load[least, LOAD_IN_SYSTEM] + cap:
        table[grp] = least
        return least
    return r


@njit_noalloc
def _route_session_affinity(load, table, grp, nrep):
    """A session (a prefix group: one conversation's shared history) stays
    on the replica its first request went to, the least loaded then.
    No group: the least loaded."""
    if grp < 0 or grp >= table.size:
        return _route_least(load, LOAD_IN_SYSTEM, nrep)
    if table[grp] < 0:
        table[grp] = _route_least(load, LOAD_IN_SYSTEM, nrep)
    return table[grp]


@njit_noalloc
def _prefix_score(r, i, nrep, prompt, pgrp, plen, rip, table, jg, tmap, f):
    """The prefix-cache scorer of replica ``r`` for request ``i``: the
    fraction of the prompt's full blocks it has been handed. Over a trace's
    block identities (``jg`` > 0: `trace_blocks`; ``f`` full blocks, their
    roots found), its leading blocks handed to ``r`` (`trace_blocks.matched`);
    else, in the replica's own blocks, the request's shared prefix
    (``plen``) where its prefix group has been routed to ``r`` (``table[g *
    nrep + r]``), none otherwise."""
    if jg > 0:
        return matched(r, nrep, f, jg, tmap) / f if f > 0 else 0.0
    g = pgrp[i]
    if g < 0 or (g + 1) * nrep > table.size or table[g * nrep + r] < 0:
        return 0.0
    b = rip[r, I_BLOCK_SIZE]
    f = prompt[i] // b
    return min(plen[i] // b, f) / f if f > 0 else 0.0


@njit_noalloc(inline="never")   # (out of the routing loops' line: they run at the speed of their code's layout)
def _route_weighted(i, load, table, state, w, rip, nrep, prompt, pgrp, plen, bs, jg, tmap):
    """llm-d's inference scheduler (its default profile: scorers summed
    with weights, the highest score picked): ``w[SC_PREFIX]`` times the
    prefix-cache scorer (`_prefix_score`; a trace's blocks of ``bs``
    tokens), ``w[SC_QUEUE]`` times the queue scorer (``(max - q) / (max -
    min)`` of the requests waiting, 1 where all are equal) and ``w[SC_KV]``
    times the KV-cache-utilisation scorer (1 less the fraction of the
    replica's blocks in use). Ties: one of the highest drawn uniformly from
    the router's stream (its max-score picker's). The request's prefix
    group is then recorded as routed to the replica picked (a trace's
    blocks are, by the hand: `trace_blocks.localise`)."""
    qmin = qmax = load[0, LOAD_WAITING]
    for r in range(1, nrep):
        qmin = min(qmin, load[r, LOAD_WAITING])
        qmax = max(qmax, load[r, LOAD_WAITING])
    f = roots(i, prompt, pgrp, plen, bs, tmap) if jg > 0 else 0
    best, top, ties = 0, -np.inf, 0
    for p in range(2):   # (the highest score and its ties; then, where several, the one drawn)
        pick = -1 if p == 0 else _pick(state, ties)
        k = 0
        for r in range(nrep):
            qs = 1.0 if qmax == qmin else (qmax - load[r, LOAD_WAITING]) / (qmax - qmin)
            kv = 1.0 - load[r, LOAD_KV] / rip[r, I_NUM_GPU_BLOCKS]
            s = (w[SC_PREFIX] * _prefix_score(r, i, nrep, prompt, pgrp, plen, rip, table, jg, tmap, f)
                 + w[SC_QUEUE] * qs + w[SC_KV] * kv)
            if p == 0:
                if s > top:
                    best, top, ties = r, s, 1
                elif s == top:
                    ties += 1
            elif s == top:
                if k == pick:
                    best = r
                    break
                k += 1
        if ties == 1:
            break
    g = pgrp[i]
    if jg == 0 and g >= 0 and (g + 1) * nrep <= table.size:
        table[g * nrep + best] = 1
    return best


@njit_noalloc(inline="llvm")
def _route(code, i, grp, load, table, state, cap, nrep):
    """The replica (``0..nrep-1``) the router ``code`` sends request ``i``
    of prefix group ``grp`` to. (Inlined into the routing loops, once a
    fleet arrival: a call passes each array as seven words.)"""
    if code == ROUTER_RANDOM:
        return _route_random(state, nrep)
    if code == ROUTER_ROUND_ROBIN:
        return _route_round_robin(i, nrep)
    if code == ROUTER_LEAST_OUTSTANDING or code == ROUTER_JSQ:
        return _route_least(load, LOAD_IN_SYSTEM, nrep)
    if code == ROUTER_VLLM_DP:
        return _route_vllm_dp(load, nrep)
    if code == ROUTER_POWER_OF_TWO:
        return _route_power_of_two(state, load, nrep)
    if code == ROUTER_LEAST_KV:
        return _route_least_kv(load, nrep)
    if code == ROUTER_PREFIX_AFFINITY:
        return _route_prefix_affinity(load, table, grp, cap, nrep)
    return _route_session_affinity(load, table, grp, nrep)


@njit_noalloc
def _needs_state(code):
    """Whether the router reads the replicas' state (random and round robin do not)."""
    return code != ROUTER_RANDOM and code != ROUTER_ROUND_ROBIN


@njit_noalloc
def _live_state(code):
    """Whether the router reads state it keeps itself, never stale: least
    outstanding counts what it sent and what came back."""
    return code == ROUTER_LEAST_OUTSTANDING


@njit_noalloc
def _reads_kv(code, w):
    """Whether the router reads the replicas' KV cache (which grows inside a
    stretch of pure decode steps: the replicas then run step by step); the
    weighted router, where its KV scorer weighs (``w[SC_KV]``, its weights:
    the requests waiting, which its queue scorer reads, are constant inside
    a stretch, as for `_route_vllm_dp`)."""
    return code == ROUTER_LEAST_KV or (code == ROUTER_WEIGHTED and w[SC_KV] != 0.0)


@njit_noalloc
def _in_system_only(code):
    """Whether the router reads no more of a replica than its requests in
    the system (``LOAD_IN_SYSTEM``: join the shortest queue, least
    outstanding, prefix and session affinity), which change only when a
    request is handed to it or leaves it (`cluster._departs`; power of two
    choices, which reads the same, is looked at by its two draws)."""
    return (code == ROUTER_JSQ or code == ROUTER_LEAST_OUTSTANDING or code == ROUTER_PREFIX_AFFINITY
            or code == ROUTER_SESSION_AFFINITY)
