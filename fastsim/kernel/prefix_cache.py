"""Automatic prefix caching (docs/engine-model.md, "Prefix caching"), the full
engine only. Entry (G, j) has the id G * jmax + j; cnt[e] is its reference
count (-1: not cached). The evictable entries (count 0) form a doubly linked
LRU list (lprev, lnext; cst = [head, tail, evictable count, cached count]).
Request i may use the entries j < f_i; held[hoff[i] + j] says whether it
references (G_i, j). The functions are inlined: a call would copy the whole
`workspace.PrefixCache` (the block pool's views included) as its arguments.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .block_pool import _pool_free


@njit_noalloc(inline="llvm")
def _lru_append(e, cache):
    """Entry ``e`` joins the tail of the evictable list."""
    cst, lprev, lnext = cache.cst, cache.lprev, cache.lnext
    lprev[e] = cst[1]
    lnext[e] = -1
    if cst[1] >= 0:
        lnext[cst[1]] = e
    else:
        cst[0] = e
    cst[1] = e
    cst[2] += 1


@njit_noalloc(inline="llvm")
def _lru_remove(e, cache):
    """Entry ``e`` leaves the evictable list."""
    cst, lprev, lnext = cache.cst, cache.lprev, cache.lnext
    p = lprev[e]
    q = lnext[e]
    if p >= 0:
        lnext[p] = q
    else:
        cst[0] = q
    if q >= 0:
        lprev[q] = p
    else:
        cst[1] = p
    cst[2] -= 1


@njit_noalloc(inline="llvm")
def _take_blocks(nb, free, cache):
    """Take ``nb`` blocks for private use: free ones first, then evict the
    head of the evictable list. Return the new number of free blocks."""
    while free < nb:
        e = cache.cst[0]
        _lru_remove(e, cache)
        cache.cnt[e] = -1
        cache.cst[3] -= 1
        free += 1
    return free - nb


@njit_noalloc(inline="llvm")
def _release_blocks(r, free, grp, cache, jmax):
    """Spec, "Release": r's private blocks become free; the counts of the
    entries it references drop in descending j (a count reaching 0 joins the
    tail of the evictable list). ``grp``: each request's prefix group.
    Return the new number of free blocks."""
    free += cache.private[r]
    cache.private[r] = 0
    if cache.nent[r] > 0:
        base = grp[r] * jmax
        held, hoff, cnt = cache.held, cache.hoff, cache.cnt
        for j in range(cache.fpre[r] - 1, -1, -1):
            if held[hoff[r] + j]:
                held[hoff[r] + j] = 0
                e = base + j
                cnt[e] -= 1
                if cnt[e] == 0:
                    _lru_append(e, cache)
        cache.nent[r] = 0
    return free


@njit_noalloc(inline="llvm")
def _lookup(w, grp, cache, jmax):
    """Spec, "Lookup": the longest run of cached entries (G_w, 0 .. h-1), h <= f_w."""
    h = 0
    f = cache.fpre[w]
    if f > 0:
        base = grp[w] * jmax
        while h < f and cache.cnt[base + h] >= 0:
            h += 1
    return h


@njit_noalloc(inline="llvm")
def _evictable_hits(w, h, grp, cache, jmax):
    """How many of w's h hit entries are evictable (not free capacity for w)."""
    m = 0
    base = grp[w] * jmax
    for j in range(h):
        if cache.cnt[base + j] == 0:
            m += 1
    return m


@njit_noalloc(inline="llvm")
def _claim_hits(w, h, grp, cache, jmax):
    """Request ``w`` takes a reference to each of its ``h`` hit entries."""
    base = grp[w] * jmax
    for j in range(h):
        e = base + j
        if cache.cnt[e] == 0:
            _lru_remove(e, cache)
        cache.cnt[e] += 1
        cache.held[cache.hoff[w] + j] = 1
    cache.nent[w] = h


@njit_noalloc(inline="llvm")
def _register(r, k0, k1, bs, grp, cache, jmax):
    """Spec, "Registration": r's blocks j in [k0 // bs, min(k1 // bs, f_r))
    become entries (count 1) unless the cache already holds (G_r, j)."""
    hi = min(k1 // bs, cache.fpre[r])
    base = grp[r] * jmax
    for j in range(k0 // bs, hi):
        e = base + j
        if cache.cnt[e] >= 0:
            continue
        cache.cnt[e] = 1
        cache.cst[3] += 1
        cache.held[cache.hoff[r] + j] = 1
        cache.nent[r] += 1
        cache.private[r] -= 1


@njit_noalloc(inline="llvm")
def _release(r, free, req, cache, jmax, caching, hashing):
    """Release the KV blocks of request ``r`` (with prefix caching, its
    private blocks and its references to cache entries; with caching by
    block hash, its blocks to the free-block queue, `block_pool`); return
    the free blocks."""
    if hashing and cache.pool.pst[1] == 1:
        return free + _pool_free(r, req, cache.pool)   # (a counted pool: counts, as without caching)
    if caching:
        free = _release_blocks(r, free, req.pgrp, cache, jmax)
    else:
        free += req.blocks[r]
    req.blocks[r] = 0
    return free
