"""vLLM V1's KV block pool with prefix caching by block hash
(docs/engine-model.md, "Prefix caching by block hash"; vLLM's
``v1/core/block_pool.py`` and ``kv_cache_utils.py``), the full engine only.

Physical blocks ``0 .. nb-1`` (the usable ones: vLLM's null block is left
out, and vLLM's block ``b + 1`` is block ``b`` here, so the order by id is
vLLM's). Their state, in `workspace.BlockPool`:

* the *free-block queue*: every block no request references, free or cached,
  in eviction order, a doubly linked list (``qprev``, ``qnext``) closed by a
  sentinel ``nb``: taking a block pops the head (and evicts the identity it
  was cached under); a request's blocks, when it frees them, join the tail
  last block first; a cache hit on a queued block takes it out of the queue.
  Its length is the engine's ``free`` (free plus evictable cached blocks, vLLM's
  ``get_num_free_blocks``).
* ``ref``: each block's reference count (requests holding it).
* the *cache*: a block full of known tokens is cached under its *identity*
  (``bhash``; -1: not cached), a number that stands for vLLM's chained block
  hash: two blocks have one identity exactly when they hold the same tokens
  after the same prefix (`_block_id`). One identity may name several blocks
  (duplicates computed at the same time), kept in caching order (``dprev``,
  ``dnext``); a lookup takes the first. An open-addressing table (linear
  probing; ``hused``, ``hkey``, ``hhead``, ``htail``) maps an identity to that list;
  it has at least twice as many slots as blocks (an identity is in it only
  while a block is cached under it), so it never fills.
* each request's blocks in token order (``rblk[boff[r]:]``, its count
  ``Requests.blocks``) and how many of its leading blocks are cached
  (``ncached``).

``pst``: [cached blocks, 1 if the pool is *materialised*, 1 if it may be
*counted*, requests in the system that were ever preempted].

Counted pool. When nothing is shared (no request has a block of a prefix
group: every identity is one request's own) and no request in the system
was ever preempted, no block in the queue can ever be hit (a request's
blocks are looked up only when it is re-admitted after a preemption; a
finished request's never again), so which physical blocks a request holds
and the queue's order cannot show: the pool is just a count of free blocks,
exactly as without caching, and the engine takes fast steps. At the first
preemption (`_pool_materialise`) the pool is laid out as it would stand: the
running requests' blocks, cached up to their computed tokens (``k`` and the
tokens scheduled this step: vLLM caches a block full of known tokens when
it is scheduled), and the free blocks, queued in any order (none of them
can be hit, so none of their evictions shows). It is counted again
(`_pool_counted`) when no request in the system was ever preempted (the
cached blocks then left in the queue are finished requests': dead). With
async scheduling a block is cached a step later, which the token counts do
not tell: the counted pool keeps, per running request, how many of its
leading blocks are cached (`_count_cached` and its callers), and the layout
takes those.

The functions a step calls are inlined (``inline="llvm"``): a call would
copy the descriptors of every view of the pool and of the requests.

The reference simulator (``fastsim/_reference.py``, ``_BlockPool``) is
written from the same vLLM code; the tests hold the two to each other bit
for bit.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .layout import ST_RUNNING

# Fibonacci hashing of an identity into the table (2**64 / golden ratio, as int64).
_HASH_MULT = -7046029254386353131


@njit_noalloc(inline="llvm")
def _block_id(r, j, req, bs, jmax, nb):
    """The identity of request ``r``'s block ``j`` (its tokens and all before
    them). A block wholly inside the prefix of r's prefix group G is the
    group's block j (id ``G * jmax + j``, shared by the group); any other
    block holds tokens of r alone (the rest of its prompt, its outputs): an
    id of its own, ``-2 - (r * (nb + 1) + j)`` (negative, so apart from the
    group ids without knowing how many there are; a request holds at most
    ``nb`` blocks; -1 marks a block not cached). With a trace's identities
    (``pgrp`` -2 - parent) the prompt's full blocks are keyed by the
    request that first held their prefix instead of a group."""
    g = req.pgrp[r]
    if g >= 0 and (j + 1) * bs <= req.plen[r]:
        return g * jmax + j
    if g <= -2 and (j + 1) * bs <= req.prompt[r]:
        # A replayed trace's prompt blocks (`workload._trace_parents`): r's
        # first plen tokens are its parent's (-2 - g, an earlier request);
        # a block is the earliest request's holding the same prefix.
        q = r
        while (j + 1) * bs <= req.plen[q]:
            q = -2 - req.pgrp[q]
        return q * jmax + j
    return -2 - (r * (nb + 1) + j)


@njit_noalloc(inline="llvm")
def _slot(key, mask):
    return ((key * _HASH_MULT) >> 20) & mask


@njit_noalloc(inline="llvm")
def _find(key, pool):
    """The table slot of identity ``key``, or -1 if no block is cached under it."""
    mask = pool.hkey.size - 1
    i = _slot(key, mask)
    while True:
        k = pool.hkey[i]
        if pool.hused[i] == 0:
            return -1
        if k == key:
            return i
        i = (i + 1) & mask


@njit_noalloc
def _delete_slot(i, pool):
    """Empty slot ``i``, moving later entries of its probe run back (linear
    probing without tombstones)."""
    mask = pool.hkey.size - 1
    j = i
    while True:
        j = (j + 1) & mask
        if pool.hused[j] == 0:
            break
        home = _slot(pool.hkey[j], mask)
        # entry j stays unless its home lies cyclically outside (i, j]
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            pool.hkey[i] = pool.hkey[j]
            pool.hhead[i] = pool.hhead[j]
            pool.htail[i] = pool.htail[j]
            i = j
    pool.hused[i] = 0


@njit_noalloc(inline="llvm")
def _cache_block(b, key, pool):
    """Block ``b`` is cached under identity ``key`` (after the blocks already there)."""
    i = _find(key, pool)
    if i < 0:
        mask = pool.hkey.size - 1
        i = _slot(key, mask)
        while pool.hused[i] == 1:
            i = (i + 1) & mask
        pool.hused[i] = 1
        pool.hkey[i] = key
        pool.hhead[i] = b
        pool.dprev[b] = -1
    else:
        t = pool.htail[i]
        pool.dnext[t] = b
        pool.dprev[b] = t
    pool.dnext[b] = -1
    pool.htail[i] = b
    pool.bhash[b] = key
    pool.pst[0] += 1


@njit_noalloc(inline="llvm")
def _evict(b, pool):
    """Block ``b`` is taken for new tokens: it leaves the cache."""
    i = _find(pool.bhash[b], pool)
    p = pool.dprev[b]
    q = pool.dnext[b]
    if p >= 0:
        pool.dnext[p] = q
    else:
        pool.hhead[i] = q
    if q >= 0:
        pool.dprev[q] = p
    else:
        pool.htail[i] = p
    if pool.hhead[i] < 0:
        _delete_slot(i, pool)
    pool.bhash[b] = -1
    pool.pst[0] -= 1


@njit_noalloc(inline="llvm")
def _q_unlink(b, pool):
    p = pool.qprev[b]
    q = pool.qnext[b]
    pool.qnext[p] = q
    pool.qprev[q] = p


@njit_noalloc(inline="llvm")
def _q_append(b, pool):
    s = pool.qnext.size - 1
    p = pool.qprev[s]
    pool.qnext[p] = b
    pool.qprev[b] = p
    pool.qnext[b] = s
    pool.qprev[s] = b


@njit_noalloc
def _pool_cold(pool, nb):
    """A cold cache (a new server in a fleet row whose replica left, holding
    no request), and where `_pool_init` starts: every block free, in id
    order, nothing cached. The per-request lists (``boff``, ``rblk``,
    ``ncached``) are left: the finished requests' are dead, and `_hand` sizes
    each new one's. Whether the pool is counted stays: with no request in the
    system the counted and the laid-out pools are the same."""
    s = nb
    pool.qnext[s] = 0 if nb > 0 else s
    pool.qprev[s] = nb - 1 if nb > 0 else s
    for b in range(nb):
        pool.qprev[b] = b - 1 if b > 0 else s
        pool.qnext[b] = b + 1
        pool.ref[b] = 0
        pool.bhash[b] = -1
    for i in range(pool.hused.size):
        pool.hused[i] = 0
    pool.pst[0] = 0


@njit_noalloc
def _pool_init(n, req, pool, nb, bs, countable):
    """Every block free, in id order; nothing cached; each request's block
    list sized for its prompt and output (`workspace._ws_dims`). The pool
    starts counted if ``countable`` (the synchronous loop) and no request
    has a block of a prefix group."""
    _pool_cold(pool, nb)
    pool.pst[3] = 0
    pool.boff[0] = 0
    for r in range(n):
        pool.boff[r + 1] = pool.boff[r] + _list_capacity(req.prompt[r], req.output[r], nb, bs)
        pool.ncached[r] = 0
        if req.pgrp[r] != -1 and req.plen[r] >= bs:   # (a group's or a trace parent's blocks)
            countable = False
    pool.pst[2] = 1 if countable else 0
    pool.pst[1] = 1 - pool.pst[2]


@njit_noalloc
def _pool_materialise(req, run, n_run, pool, bs, jmax, kept):
    """Lay the counted pool out (the first preemption since it was counted):
    the running requests hold blocks 0, 1, ... in running order, each cached
    up to its computed and scheduled tokens (``kept``, async scheduling: as
    many leading blocks as the counts kept while it was counted,
    `_count_cached`); the rest are queued, uncached."""
    for i in range(pool.hused.size):
        pool.hused[i] = 0
    nb = pool.ref.size
    pool.pst[0] = 0
    b = 0
    for jj in range(n_run):
        r = run[jj]
        base = pool.boff[r]
        for j in range(req.blocks[r]):
            pool.rblk[base + j] = b
            pool.ref[b] = 1
            pool.bhash[b] = -1
            b += 1
        ntok = pool.ncached[r] * bs if kept else req.k[r] + req.sched[r]
        pool.ncached[r] = 0
        _pool_cache_full(r, ntok, req, pool, bs, jmax)
    s = nb
    pool.qnext[s] = s
    pool.qprev[s] = s
    for c in range(b, nb):
        pool.ref[c] = 0
        pool.bhash[c] = -1
        _q_append(c, pool)
    pool.pst[1] = 1


@njit_noalloc(inline="llvm")
def _pool_counted(pool):
    """Whether the pool is counted (see the module's docstring), at the start
    of a step: it is counted again once no request in the system was ever
    preempted."""
    if pool.pst[1] == 1 and pool.pst[2] == 1 and pool.pst[3] == 0:
        pool.pst[1] = 0
    return pool.pst[1] == 0


@njit_noalloc(inline="llvm")
def _preempted(v, req, run, n_run, pool, bs, jmax, kept):
    """Bookkeeping of a preemption of ``v`` (before its blocks are freed):
    lay the pool out if it was counted (``kept``: `_pool_materialise`'s);
    count v among the requests ever preempted."""
    if pool.pst[1] == 0:
        _pool_materialise(req, run, n_run, pool, bs, jmax, kept)
    if req.npre[v] == 0:
        pool.pst[3] += 1


@njit_noalloc(inline="llvm")
def _list_capacity(prompt, output, nb, bs):
    """The most blocks a request can hold: those of P + O tokens, at most the pool."""
    return min((prompt + output + bs - 1) // bs, nb)


@njit_noalloc(inline="llvm")
def _pool_take(r, nnew, req, pool):
    """vLLM's get_new_blocks: ``r`` gets ``nnew`` blocks from the queue's head
    (each evicted from the cache if it was cached). The caller checked they
    are there and lowers its count of free blocks."""
    s = pool.qnext.size - 1
    base = pool.boff[r] + req.blocks[r]
    for m in range(nnew):
        b = pool.qnext[s]
        _q_unlink(b, pool)
        if pool.bhash[b] != -1:
            _evict(b, pool)
        pool.ref[b] = 1
        pool.rblk[base + m] = b
    req.blocks[r] += nnew


@njit_noalloc(inline="llvm")
def _pool_cache_full(r, ntok, req, pool, bs, jmax):
    """vLLM's cache_blocks: cache r's blocks that are full of its first
    ``ntok`` tokens and not cached yet."""
    full = ntok // bs
    nb = pool.ref.size
    base = pool.boff[r]
    for j in range(pool.ncached[r], full):
        _cache_block(pool.rblk[base + j], _block_id(r, j, req, bs, jmax, nb), pool)
    if full > pool.ncached[r]:
        pool.ncached[r] = full


@njit_noalloc(inline="llvm")
def _pool_hits(w, req, pool, bs, jmax):
    """vLLM's find_longest_cache_hit: the leading blocks of w cached, at
    most (P + g - 1) tokens' worth (the last known token is recomputed)."""
    lim = (req.prompt[w] + req.g[w] - 1) // bs
    nb = pool.ref.size
    h = 0
    while h < lim and _find(_block_id(w, h, req, bs, jmax, nb), pool) >= 0:
        h += 1
    return h


@njit_noalloc(inline="llvm")
def _pool_queued_hits(w, h, req, pool, bs, jmax):
    """How many of w's ``h`` hit blocks are in the free-block queue (taking
    them uses up free capacity)."""
    nb = pool.ref.size
    m = 0
    for j in range(h):
        b = pool.hhead[_find(_block_id(w, j, req, bs, jmax, nb), pool)]
        if pool.ref[b] == 0:
            m += 1
    return m


@njit_noalloc(inline="llvm")
def _pool_claim(w, h, req, pool, bs, jmax):
    """vLLM's touch: ``w`` (holding nothing) references its ``h`` hit blocks,
    which leave the queue if no one held them; its first ``h`` blocks are
    cached. Return how many left the queue."""
    nb = pool.ref.size
    base = pool.boff[w]
    m = 0
    for j in range(h):
        b = pool.hhead[_find(_block_id(w, j, req, bs, jmax, nb), pool)]
        if pool.ref[b] == 0:
            _q_unlink(b, pool)
            m += 1
        pool.ref[b] += 1
        pool.rblk[base + j] = b
    req.blocks[w] = h
    pool.ncached[w] = h
    return m


@njit_noalloc(inline="llvm")
def _pool_free(r, req, pool):
    """vLLM's free: r's blocks, last first, drop a reference; those no one
    holds join the queue's tail (still cached). Return how many joined."""
    base = pool.boff[r]
    m = 0
    for j in range(req.blocks[r] - 1, -1, -1):
        b = pool.rblk[base + j]
        pool.ref[b] -= 1
        if pool.ref[b] == 0:
            _q_append(b, pool)
            m += 1
    req.blocks[r] = 0
    pool.ncached[r] = 0
    return m


@njit_noalloc(inline="llvm")
def _known_tokens(req, r, t, lag):
    """The tokens of ``r`` known when a step is scheduled at ``t``: its prompt
    and outputs, less (``lag``: async scheduling, the step that ended at
    ``t`` still in flight for vLLM) the token that step gave it, whose value
    vLLM does not know yet (its block cannot be hashed)."""
    if lag and req.last_t[r] == t:
        return req.prompt[r] + req.g[r] - 1
    return req.prompt[r] + req.g[r]


@njit_noalloc(inline="llvm")
def _cache_arrived_tokens(req, batch, n_run, pool, t, bs, jmax):
    """Async scheduling: the outputs of the step that ended at ``t`` reach
    vLLM after the next step is scheduled (``update_from_output``); each
    request still running that got a token caches its blocks full of
    computed tokens whose values are known (vLLM: ``cache_blocks(request,
    num_computed_tokens - num_output_placeholders)``): those of the step
    just scheduled count, less its own token in flight."""
    for jj in range(n_run):
        r = batch.run[jj]
        if req.status[r] == ST_RUNNING and req.last_t[r] == t:
            _pool_cache_full(r, min(req.k[r] + req.sched[r], req.prompt[r] + req.g[r] - 1), req, pool, bs, jmax)


# ------------------------------------------------------------------------------
# A counted pool under async scheduling. vLLM caches a block a step later
# there (`_known_tokens`), so how many of a running request's leading blocks
# are cached is not a function of its token counts when the pool is laid out;
# it is kept instead (``ncached``), as `_pool_cache_full` would have it, at
# the same points, so that `_pool_materialise` can lay it out exactly.

@njit_noalloc(inline="llvm")
def _count_cached(r, ntok, pool, bs):
    """`_pool_cache_full`'s count for a counted pool: r's blocks full of its
    first ``ntok`` tokens are cached."""
    full = ntok // bs
    if full > pool.ncached[r]:
        pool.ncached[r] = full


@njit_noalloc
def _count_scheduled(req, oth, n_oth, pool, t, lag, bs):
    """A fast step scheduled at ``t``: the requests it schedules one by one
    (``oth``) cache their blocks full of known tokens (`_pool_cache_full`'s
    calls of the slow step's phases)."""
    for jj in range(n_oth):
        r = oth[jj]
        _count_cached(r, min(req.k[r] + req.sched[r], _known_tokens(req, r, t, lag)), pool, bs)


@njit_noalloc
def _count_lazy(dec, S, pool, bs):
    """The lazy decoders before they get their own token counts again: each
    fast step (async) scheduled one of them one token, at a step start at
    which it had just got a token whose value was not known yet, so its
    blocks full of all its computed tokens but the last are cached (after no
    fast step, the count kept when it became lazy stands: it is at least
    that)."""
    for jj in range(dec.dstate[0]):
        r = dec.dmem[jj]
        _count_cached(r, dec.koff[r] + S - 1, pool, bs)


@njit_noalloc
def _count_arrived(req, batch, n_run, pool, t, bs):
    """`_cache_arrived_tokens` for a counted pool."""
    for jj in range(n_run):
        r = batch.run[jj]
        if req.status[r] == ST_RUNNING and req.last_t[r] == t:
            _count_cached(r, min(req.k[r] + req.sched[r], req.prompt[r] + req.g[r] - 1), pool, bs)


@njit_noalloc
def _pool_check(req, run, n_run, pool, free):
    """Conservation (a test path): the queue holds ``free`` blocks, none
    referenced; the running requests' references are all the references; every
    block is queued or referenced; every cached block is found under its
    identity. Return 0, or a code naming the first broken rule."""
    nb = pool.ref.size
    s = nb
    q = 0
    b = pool.qnext[s]
    while b != s:
        if pool.ref[b] != 0:
            return 1
        q += 1
        if q > nb:
            return 2
        b = pool.qnext[b]
    if q != free:
        return 3
    refs = 0
    held = 0
    cached = 0
    for b in range(nb):
        refs += pool.ref[b]
        if pool.ref[b] > 0:
            held += 1
        if pool.bhash[b] != -1:
            cached += 1
            if _find(pool.bhash[b], pool) < 0:
                return 4
    if held + q != nb:
        return 5
    if cached != pool.pst[0]:
        return 6
    total = 0
    for jj in range(n_run):
        total += req.blocks[run[jj]]
    if total != refs:
        return 7
    return 0


@njit_noalloc
def _pool_session_lists(n, pool, nb, bs, lim):
    """Sessions: each request's block list sized for ``lim`` tokens (a turn's
    prompt is set when it is sent: `workspace._session_dims`), and the pool
    laid out (a session's turns share blocks, so it is never counted)."""
    for r in range(n):
        pool.boff[r + 1] = pool.boff[r] + _list_capacity(lim, 0, nb, bs)
    pool.pst[2] = 0
    pool.pst[1] = 1
