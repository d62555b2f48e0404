"""Automatic prefix caching (docs/engine-model.md, "Prefix caching"), the full
engine only. Entry (G, j) has the id G * jmax + j; cnt[e] is its reference
count (-1: not cached). The evictable entries (count 0) form a doubly linked
LRU list (lprev, lnext; cst = [head, tail, evictable count, cached count]).
Request i may use the entries j < f_i; held[hoff[i] + j] says whether it
references (G_i, j).
"""

from __future__ import annotations

from .._numba_options import njit_noalloc


@njit_noalloc
def _lru_append(e, cst, lprev, lnext):
    lprev[e] = cst[1]
    lnext[e] = -1
    if cst[1] >= 0:
        lnext[cst[1]] = e
    else:
        cst[0] = e
    cst[1] = e
    cst[2] += 1


@njit_noalloc
def _lru_remove(e, cst, lprev, lnext):
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


@njit_noalloc
def _take_blocks(nb, free, cst, cnt, lprev, lnext):
    """Take ``nb`` blocks for private use: free ones first, then evict the
    head of the evictable list. Return the new number of free blocks."""
    while free < nb:
        e = cst[0]
        _lru_remove(e, cst, lprev, lnext)
        cnt[e] = -1
        cst[3] -= 1
        free += 1
    return free - nb


@njit_noalloc
def _release_blocks(r, free, private, nent, grp, fpre, held, hoff, jmax, cst, cnt, lprev, lnext):
    """Spec, "Release": r's private blocks become free; the counts of the
    entries it references drop in descending j (a count reaching 0 joins the
    tail of the evictable list). Return the new number of free blocks."""
    free += private[r]
    private[r] = 0
    if nent[r] > 0:
        base = grp[r] * jmax
        for j in range(fpre[r] - 1, -1, -1):
            if held[hoff[r] + j]:
                held[hoff[r] + j] = 0
                e = base + j
                cnt[e] -= 1
                if cnt[e] == 0:
                    _lru_append(e, cst, lprev, lnext)
        nent[r] = 0
    return free


@njit_noalloc
def _lookup(w, grp, fpre, jmax, cnt):
    """Spec, "Lookup": the longest run of cached entries (G_w, 0 .. h-1), h <= f_w."""
    h = 0
    if fpre[w] > 0:
        base = grp[w] * jmax
        while h < fpre[w] and cnt[base + h] >= 0:
            h += 1
    return h


@njit_noalloc
def _evictable_hits(w, h, grp, jmax, cnt):
    """How many of w's h hit entries are evictable (not free capacity for w)."""
    m = 0
    base = grp[w] * jmax
    for j in range(h):
        if cnt[base + j] == 0:
            m += 1
    return m


@njit_noalloc
def _claim_hits(w, h, grp, held, hoff, jmax, nent, cst, cnt, lprev, lnext):
    base = grp[w] * jmax
    for j in range(h):
        e = base + j
        if cnt[e] == 0:
            _lru_remove(e, cst, lprev, lnext)
        cnt[e] += 1
        held[hoff[w] + j] = 1
    nent[w] = h


@njit_noalloc
def _register(r, k0, k1, bs, grp, fpre, held, hoff, jmax, private, nent, cst, cnt):
    """Spec, "Registration": r's blocks j in [k0 // bs, min(k1 // bs, f_r))
    become entries (count 1) unless the cache already holds (G_r, j)."""
    hi = min(k1 // bs, fpre[r])
    base = grp[r] * jmax
    for j in range(k0 // bs, hi):
        e = base + j
        if cnt[e] >= 0:
            continue
        cnt[e] = 1
        cst[3] += 1
        held[hoff[r] + j] = 1
        nent[r] += 1
        private[r] -= 1
