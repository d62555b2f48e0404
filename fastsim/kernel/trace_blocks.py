"""A replayed trace's block identities in the replicas of a fleet
(docs/engine-model.md, "Trace block identities" and "Fleets").

In the stream, request i's prompt blocks are named by its *parent*: ``pgrp``
is ``-2 - p`` (an earlier request of the stream; i itself when none) and
``plen`` the tokens it shares with p (`workload._trace_parents`); block j of
i is the block j of the earliest request holding the same prefix, found by
walking up the parents (`block_pool._block_id`). A replica holds the
requests it is handed at its own indices, so the stream's parents mean
nothing there. Each replica is handed instead a parent *of its own*: the
first request handed to it that holds the longest prefix of i's blocks any
request handed to it holds, through a map from a block's identity in the
stream to the first of the replica's requests holding it (``tmap``: one
open-addressing table for every replica, keys ``(root * jg + j) * nrep +
r``). Its walk then names block j by that replica's first holder of it:
two of its requests share an identity exactly when they do in the stream.
A fleet of one replica is handed the identities the engine alone keys
(its first holder of a block is the stream's earliest). The map is also
what a prefix-affine router knows of the replicas' caches (`route_prefix`:
the blocks of a prompt each replica has been handed, as SGLang's
cache-aware router keeps a tree of what it routed). The static fleet
(`cluster`), the autoscaled one (`autoscale`: a row a new replica reuses
keeps its map, whose names stay consistent, its cold cache holding none of
them) and both pools of a disaggregated server (`disagg`: the decode pool
in the hand-offs' order) hand requests through `localise`.

The map holds a key for each full prompt block of each request handed
(``sum(prompt // block_size)``: `need`), in a table of at least twice as
many slots, so a probe always ends at an empty slot; a third row is
scratch (`ROW_ROOTS`).
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .block_pool import _slot
from .layout import I_BLOCK_HASH, I_BLOCK_SIZE, I_CACHING

#: The map's rows (``FleetBuffers.tmap``): the keys, the first holders, and scratch for the roots of one
#: request's blocks (`route_prefix`).
TMAP_ROWS = 3
ROW_ROOTS = 2


@njit_noalloc
def hashing_block_size(rip, nrep):
    """The block size the stream's parents count in: that of the replicas
    caching by block hash (the Python layer requires theirs to be the
    scenario engine's, which drew the parents); 1 where none does."""
    for r in range(nrep):
        if rip[r, I_CACHING] == 1 and rip[r, I_BLOCK_HASH] >= 1:
            return rip[r, I_BLOCK_SIZE]
    return 1


@njit_noalloc
def need(n, prompt, bs):
    """Keys the map takes for the ``n`` requests of a stream: their full prompt blocks."""
    s = 0
    for i in range(n):
        s += prompt[i] // bs
    return s


@njit_noalloc
def reset(n, prompt, bs, tmap):
    """Empty the map for a stream of ``n`` requests; return the stride of a
    block index in a key (the most full prompt blocks, plus one: at least
    1), 0 where there is no map (no columns: nothing to map), or -1 if the
    table does not suit the stream (fewer than twice `need` slots, or not a
    power of two)."""
    size = tmap.shape[1]
    if size == 0:
        return 0
    if size < 2 * need(n, prompt, bs) + 1 or size & (size - 1) != 0:   # (`localise` probes modulo a power of 2)
        return -1
    jg = 1
    for i in range(n):
        jg = max(jg, prompt[i] // bs + 1)
    for s in range(tmap.shape[1]):
        tmap[0, s] = -1
    return jg


@njit_noalloc
def localise(i, r, nrep, k, prompt, pgrp, plen, bs, jg, tmap):
    """Request ``i`` of the stream, handed to replica ``r`` as its request
    ``k``: its parent there and the tokens it shares with it, as the
    replica's ``(pgrp, plen)`` (``(-2 - k, 0)``: none). Its blocks not yet in
    the replica's map join it, held first by ``k``.

    The blocks are visited last first: a replica holding block j of i holds
    the blocks before it too (an identity names the whole prefix), so the
    first one found ends the walk, and the blocks after it are new."""
    keys = tmap[0]
    mask = keys.size - 1
    q = i
    for j in range(prompt[i] // bs - 1, -1, -1):
        q = _root(q, j, pgrp, plen, bs)   # (the walk goes on from block j + 1's holder: blocks last first)
        key = (q * jg + j) * nrep + r
        s = _slot(key, mask)
        while keys[s] != key and keys[s] >= 0:
            s = (s + 1) & mask
        if keys[s] == key:
            return -2 - tmap[1, s], (j + 1) * bs
        keys[s] = key
        tmap[1, s] = k
    return -2 - k, 0


@njit_noalloc(inline="llvm")
def _root(i, j, pgrp, plen, bs):
    """The stream's earliest holder of block ``j`` of request ``i`` (`block_pool._block_id`'s walk)."""
    q = i
    while (j + 1) * bs <= plen[q]:
        q = -2 - pgrp[q]
    return q


@njit_noalloc(inline="llvm")
def roots(i, prompt, pgrp, plen, bs, tmap):
    """The roots of request ``i``'s full prompt blocks (of ``bs`` tokens)
    into ``tmap[ROW_ROOTS]``, found in one walk up its parents (blocks last
    first, as `localise`), for `matched`; returns how many blocks."""
    f = prompt[i] // bs
    q = i
    for j in range(f - 1, -1, -1):
        q = _root(q, j, pgrp, plen, bs)
        tmap[ROW_ROOTS, j] = q
    return f


@njit_noalloc
def matched(r, nrep, f, jg, tmap):
    """The leading full blocks of a request (``f`` of them, their roots in
    ``tmap[ROW_ROOTS, :f]``: `route_prefix`) that replica ``r`` has been
    handed (held by a request handed to it: in its map), by bisection (the
    blocks of a prompt a replica holds are a leading run: an identity names
    the whole prefix before it). Any of them may be there, the request's
    own blocks too (a disaggregated decode pool is handed a request's
    children before it where their prefills end first)."""
    keys, roots = tmap[0], tmap[ROW_ROOTS]
    mask = keys.size - 1
    lo, hi = 0, f
    while lo < hi:
        mid = (lo + hi + 1) // 2
        j = mid - 1
        key = (roots[j] * jg + j) * nrep + r
        s = _slot(key, mask)
        while keys[s] != key and keys[s] >= 0:
            s = (s + 1) & mask
        if keys[s] == key:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit_noalloc
def route_prefix(i, load, col, cap, nrep, prompt, pgrp, plen, bs, jg, tmap):
    """Prefix affinity over a trace's block identities: the replica that
    has been handed the most leading blocks of request ``i`` (`matched`;
    ties: the fewest requests in the system, ``load[:, col]``, then the
    lowest index), unless its requests exceed the least loaded replica's by
    more than ``cap``: then the least loaded (as without a match). The
    roots of ``i``'s blocks are found once (`roots`), for every replica's
    bisection."""
    if nrep == 1:
        return 0
    f = roots(i, prompt, pgrp, plen, bs, tmap)
    best, most = 0, -1
    least = 0
    for r in range(nrep):
        m = matched(r, nrep, f, jg, tmap)
        x = load[r, col]
        if m > most or (m == most and x < load[best, col]):
            best, most = r, m
        if x < load[least, col]:
            least = r
    if load[best, col] > load[least, col] + cap:
        return least
    return best
