"""The waiting queue: a ring-buffer deque (fcfs) or a binary heap ordered by
(key, arrival index) (priority, sjf), both with lazy deletion of requests that
abandoned; the same heap holds the swapped queue.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc
from .layout import ST_WAITING

# Waiting queue: a ring-buffer deque (fcfs) or a binary heap (priority, sjf),
# both with lazy deletion of requests that abandoned.

@njit_noalloc
def _before(a, b, key):
    """Heap order: smaller key first, ties by arrival index."""
    return key[a] < key[b] or (key[a] == key[b] and a < b)


@njit_noalloc
def _heap_push(heap, qs, key, i):
    pos = qs[0]
    heap[pos] = i
    qs[0] = pos + 1
    while pos > 0:
        parent = (pos - 1) // 2
        if _before(heap[pos], heap[parent], key):
            tmp = heap[parent]
            heap[parent] = heap[pos]
            heap[pos] = tmp
            pos = parent
        else:
            break


@njit_noalloc
def _heap_pop(heap, qs, key):
    top = heap[0]
    last = qs[0] - 1
    qs[0] = last
    if last > 0:
        heap[0] = heap[last]
        pos = 0
        while True:
            left = 2 * pos + 1
            if left >= last:
                break
            best = left
            right = left + 1
            if right < last and _before(heap[right], heap[left], key):
                best = right
            if _before(heap[best], heap[pos], key):
                tmp = heap[best]
                heap[best] = heap[pos]
                heap[pos] = tmp
                pos = best
            else:
                break
    return top


@njit_noalloc(inline="llvm")
def _q_push(q, qs, key, policy, i, front):
    """Append request ``i`` (to the front for a preempted fcfs request)."""
    if policy != 0:
        _heap_push(q, qs, key, i)
        return
    # (0 <= head < cap and size < cap: a conditional wrap, not an integer division)
    if front:
        qs[1] = qs[1] - 1 if qs[1] > 0 else q.size - 1
        q[qs[1]] = i
    else:
        e = qs[1] + qs[0]
        q[e - q.size if e >= q.size else e] = i
    qs[0] += 1


# _q_peek, _q_pop (and arrivals._arrivals_during_step) are inlined into the
# engine loop by LLVM: measured faster together, though neither alone (code
# layout); as fast as Numba's IR inlining, and much less compiling.
@njit_noalloc(inline="llvm")
def _q_peek(q, qs, key, policy, status):
    """Head of the queue, discarding entries of requests no longer waiting; -1 if empty."""
    while qs[0] > 0:
        i = q[0] if policy != 0 else q[qs[1]]
        if status[i] == ST_WAITING:
            return i
        _q_pop(q, qs, key, policy)
    return -1


@njit_noalloc(inline="llvm")
def _q_pop(q, qs, key, policy):
    if policy != 0:
        return _heap_pop(q, qs, key)
    i = q[qs[1]]
    qs[1] = qs[1] + 1 if qs[1] + 1 < q.size else 0
    qs[0] -= 1
    return i
