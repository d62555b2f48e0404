"""The pages behind the workspaces (`fastsim._pages`): a thread's engine
workspace on transparent huge pages where the system grants them on
request, a fleet's sparse rows on ordinary pages. (What it buys is measured
by benchmarks, `benchmarks/HISTORY.md`, stop 57.)"""

import numpy as np
import pytest

from fastsim import _pages
from fastsim import kernel as K


def _vm_flags(address):
    """The ``VmFlags`` of the mapping holding ``address`` (Linux's /proc/self/smaps), or None."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_a_large_workspace_starts_on_a_huge_page_advised_so(dtype):
    n = 3 * _pages.HUGE_WORKSPACE_MIN // 8 + 5
    a = _pages.huge_pages(n, dtype)
    assert a.shape == (n,) and a.dtype == dtype and a.flags.writeable and a.flags.c_contiguous
    a[:] = 7
    assert np.all(a == 7)
    huge = _pages.thp_size()
    if huge is None:
        assert isinstance(a.base, (type(None), np.ndarray))   # (np.empty's)
        return
    assert a.ctypes.data % huge == 0
    flags = _vm_flags(a.ctypes.data)
    if flags is not None:
        assert "hg" in flags   # (advised: MADV_HUGEPAGE)


def test_a_small_workspace_or_no_huge_pages_is_numpys(monkeypatch):
    small = _pages.huge_pages(_pages.HUGE_WORKSPACE_MIN // 8 - 1, np.int64)
    assert small.size == _pages.HUGE_WORKSPACE_MIN // 8 - 1 and small.base is None
    monkeypatch.setattr(_pages, "thp_size", lambda: None)
    big = _pages.huge_pages(_pages.HUGE_WORKSPACE_MIN, np.float64)
    assert big.size == _pages.HUGE_WORKSPACE_MIN and big.base is None


def test_a_fleets_rows_are_on_ordinary_pages():
    a = _pages.small_pages(_pages.HUGE_WORKSPACE_MIN, np.int64)
    assert a.size == _pages.HUGE_WORKSPACE_MIN and a.flags.writeable
    a[::512] = 1
    flags = _vm_flags(a.ctypes.data)
    if flags is not None and _pages.thp_size() is not None:
        assert "nh" in flags   # (advised: MADV_NOHUGEPAGE)


def test_the_chunk_buffers_workspace_is_on_huge_pages():
    buf = K.ChunkBuffers(10)
    buf.need[:] = (_pages.HUGE_WORKSPACE_MIN // 8, 5)
    buf.grow()
    assert buf.wi.size >= buf.need[0] and buf.wf.size >= 5
    if _pages.thp_size() is not None:
        assert buf.wi.ctypes.data % _pages.thp_size() == 0 and buf.wf.base is None


def test_a_runs_workspace_is_handed_to_the_next_run(monkeypatch):
    """`replicate` hands its buffers' workspaces on (`ChunkBuffers.give_back`):
    the next call's buffers take one (no fresh pages to fault in), dirty,
    and give the same results."""
    import fastsim
    from fastsim.kernel import drivers

    spares = _pages.Spares(max_bytes=64 * 2 ** 20)
    monkeypatch.setattr(drivers, "SPARES", spares)
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=4.0, num_requests=300))
    first = fastsim.replicate(sc, n_replications=3, seed=0, n_threads=1).to_frame()
    assert len(spares) == 1
    (_, (wi, wf), _), = spares._items
    again = fastsim.replicate(sc, n_replications=3, seed=0, n_threads=1).to_frame()
    assert len(spares) == 1 and spares._items[0][1][0] is wi and spares._items[0][1][1] is wf
    assert first.equals(again)


def test_the_spares_stay_within_their_bounds_and_let_the_oldest_go():
    spares = _pages.Spares(max_bytes=3 * 8000, max_items=3)
    arrays = {n: np.empty(n, np.int64) for n in (200, 1000, 100, 600, 50, 60)}
    for n in (200, 1000, 100, 600):
        spares.give_back("k", (arrays[n],), n)
        assert sum(a.nbytes for _, arrs, _ in spares._items for a in arrs) <= spares.max_bytes
    assert [b for _, _, b in spares._items] == [1000, 100, 600]   # (200 let go: the oldest)
    spares.give_back("other", (arrays[50],), 50)
    spares.give_back("k", (arrays[60],), 60)
    assert [b for _, _, b in spares._items] == [600, 50, 60]   # (at most three)
    assert spares.take("k", lambda a: a[0].size >= 700) is None
    assert spares.take("k", lambda a: a[0].size >= 100) == 600   # (the oldest that fits, under its key)
    assert spares.take("k") == 60 and spares.take("k") is None and spares.take("other") == 50 and len(spares) == 0


def test_buffers_take_a_spare_that_fits(monkeypatch):
    from fastsim.kernel import drivers

    spares = _pages.Spares(max_bytes=2 ** 20)
    monkeypatch.setattr(drivers, "SPARES", spares)
    buf = K.ChunkBuffers(1)
    buf.wi, buf.wf = np.empty(1000, np.int64), np.empty(1000)
    spare = buf.wi
    buf.give_back()
    assert buf.wi.size == 0 and buf.wf.size == 0 and len(spares) == 1
    buf = K.ChunkBuffers(1)
    buf.need[:] = (1200, 10)
    buf.grow()
    assert buf.wi.size >= 1200 and len(spares) == 1   # (too small: a fresh one)
    buf2 = K.ChunkBuffers(1)
    buf2.need[:] = (500, 500)
    buf2.grow()
    assert buf2.wi is spare and len(spares) == 0
