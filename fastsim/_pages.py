"""Memory for the engine's workspaces, by the pages that back it.

A thread's workspace for one replica at a time (`kernel.drivers.ChunkBuffers`)
is written densely, replication after replication: above
`HUGE_WORKSPACE_MIN` bytes it is backed by transparent huge pages
(`huge_pages`), starting on one. On ordinary pages from the C heap, where
the workspace landed, which the process's history decides, moved the
engine's speed by 15-20 % (its scattered reads across the per-request
columns); on huge pages it runs at the best of those speeds in every
process (`benchmarks/HISTORY.md`, stop 57). A fleet's rows,
each laid out for the whole stream and written only where its replica's
requests fall, are on ordinary pages (`small_pages`): a huge page is zeroed
whole when first touched.
"""

from __future__ import annotations

import functools
import mmap
import threading

import numpy as np

#: Bytes from which a workspace array is backed by huge pages (`huge_pages`):
#: half a huge page, so that rounding up to whole huge pages at most doubles
#: a workspace's resident memory.
HUGE_WORKSPACE_MIN = 2 ** 20


@functools.lru_cache(maxsize=None)
def thp_mode():
    """Linux's transparent huge pages: (mode, bytes of a huge page), the mode
    ``always``, ``madvise`` or ``never``; None where they cannot be read."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read().split("[")[1].split("]")[0]
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            size = int(f.read())
    except (OSError, IndexError, ValueError):
        return None
    return mode, size


def thp_size():
    """The transparent huge page's bytes where a mapping advised to use them
    gets them (THP mode ``always`` or ``madvise``), else None."""
    thp = thp_mode()
    return thp[1] if thp is not None and thp[0] in ("always", "madvise") and thp[1] > 0 else None


def _anonymous(size):
    """A private anonymous mapping of ``size`` bytes (zero pages until
    written); MemoryError where the system refuses it (as NumPy's)."""
    try:
        if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS"):   # (not shared: POSIX's default)
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return mmap.mmap(-1, size)
    except (OSError, OverflowError) as err:
        raise MemoryError(f"could not map {size} bytes: {err}") from err


def huge_pages(count, dtype):
    """A 1-D array of ``count`` entries of ``dtype`` (contents undefined)
    backed by transparent huge pages where the system grants them on
    request (`thp_size`) and the array has `HUGE_WORKSPACE_MIN` bytes or
    more: a mapping advised to use them, the array starting on a huge page
    (a huge page backs only an aligned stretch of one). Elsewhere, or
    smaller, `numpy.empty`."""
    count = max(int(count), 1)
    nbytes = count * np.dtype(dtype).itemsize
    huge = thp_size()
    if huge is None or nbytes < HUGE_WORKSPACE_MIN or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(count, dtype)
    size = -(-nbytes // huge) * huge
    try:
        buf = _anonymous(size + huge)   # (a huge page more: room to start on one)
    except MemoryError:
        return np.empty(count, dtype)   # (NumPy's own refusal, if it cannot either)
    offset = -np.frombuffer(buf, np.uint8, count=1).ctypes.data % huge
    try:
        buf.madvise(mmap.MADV_HUGEPAGE, offset, size)
    except OSError:   # (refused: ordinary pages, as np.empty's)
        pass
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset)


def small_pages(count, dtype):
    """An uninitialised 1-D array of ``count`` entries in memory mapped with
    ordinary pages. A fleet's replica rows are each as large as one
    replica's workspace for the whole stream, and a replica touches only a
    few pages of each of its segments; NumPy asks for transparent huge pages
    on large arrays (where the system grants them on request), and each
    touched huge page is then zeroed whole: the rows would cost their full
    size at every replication that regrows them, and more when the system
    splits and reclaims them."""
    size = max(int(count), 1) * np.dtype(dtype).itemsize
    buf = _anonymous(size)
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is not None:
        try:
            buf.madvise(advice)
        except OSError:   # (a kernel without transparent huge pages)
            pass
    return np.frombuffer(buf, dtype=dtype, count=max(int(count), 1))


class Spares:
    """Buffers of finished runs kept for later ones: a fresh mapping's pages
    are faulted in (a huge page zeroed whole) when first touched, at every
    call, where NumPy's memory from the C heap used to be reused from one
    call to the next. At most ``max_items`` entries and ``max_bytes`` of
    their arrays' bytes (address space: pages never written cost none of
    the memory); the oldest let go first. Thread-safe. Give back only
    buffers no kernel uses any more."""

    def __init__(self, max_bytes, max_items=None):
        self.max_bytes, self.max_items = max_bytes, max_items
        self._items = []   # (key, arrays, buffers)
        self._lock = threading.Lock()

    def take(self, key, fits=lambda arrays: True):
        """The buffers of the oldest entry kept under ``key`` whose arrays
        ``fits`` accepts (removed), or None."""
        with self._lock:
            for k, (kk, arrays, _) in enumerate(self._items):
                if kk == key and fits(arrays):
                    return self._items.pop(k)[2]
        return None

    def give_back(self, key, arrays, buffers):
        """Keep ``buffers`` under ``key``; ``arrays``: its large arrays, whose
        bytes count against ``max_bytes`` (and which `take`'s ``fits`` sees)."""
        with self._lock:
            self._items.append((key, arrays, buffers))
            while self._items and ((self.max_items is not None and len(self._items) > self.max_items)
                                   or sum(a.nbytes for _, arrs, _ in self._items for a in arrs) > self.max_bytes):
                self._items.pop(0)

    def __len__(self):
        with self._lock:
            return len(self._items)
