"""`compile_entries`: on a cold start a helper process compiles all entries but the first into Numba's disk cache.

Checked on a small module of cached functions written for each test (a new
file, so nothing of it is in memory or in the cache at first): which
functions this process compiled and which it loaded from the cache shows who
compiled what (``dispatcher.stats``).
"""

import importlib
import sys

import numpy as np
import pytest
from numba import types

from fastsim import _kernel as K
from fastsim import _numba_options as O

TOY = '''
import numba

@numba.njit(cache=True)
def first(x):
    return x + 1

@numba.njit(cache=True)
def second(x):
    return x * 2.5

@numba.njit(cache=True)
def third(x):
    return x - 3
'''

SIG = (types.int64,)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    name = f"fastsim_toy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("FASTSIM_COMPILE_HELPER", raising=False)
    monkeypatch.setattr(O, "_usable_cpus", lambda: 2)   # whatever this machine has
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


def entries(mod):
    return [(mod.first, SIG), (mod.second, SIG), (mod.third, SIG)]


def compiled_here(dispatcher):
    return sum(dispatcher.stats.cache_misses.values())


def loaded_from_cache(dispatcher):
    return sum(dispatcher.stats.cache_hits.values())


def test_a_helper_compiles_the_others_on_a_cold_start(toy):
    O.compile_entries(entries(toy))
    assert compiled_here(toy.first) == 1
    for d in (toy.second, toy.third):
        assert (compiled_here(d), loaded_from_cache(d)) == (0, 1), "the helper did not compile it"
    assert (toy.first(4), toy.second(4), toy.third(4)) == (5, 10.0, 1)


def test_no_helper_when_turned_off(toy, monkeypatch):
    monkeypatch.setenv("FASTSIM_COMPILE_HELPER", "0")
    monkeypatch.setattr(O, "_start_helper", pytest.fail)
    O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_no_helper_with_one_cpu(toy, monkeypatch):
    monkeypatch.setattr(O, "_usable_cpus", lambda: 1)
    monkeypatch.setattr(O, "_start_helper", pytest.fail)
    O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_no_helper_when_the_first_is_cached(toy, monkeypatch):
    O.compile_entries(entries(toy))
    warm = importlib.reload(toy)   # new dispatchers: nothing in memory, everything in the disk cache
    monkeypatch.setattr(O, "_start_helper", pytest.fail)
    O.compile_entries(entries(warm))
    assert [loaded_from_cache(d) for d in (warm.first, warm.second, warm.third)] == [1, 1, 1]


def test_a_failed_helper_leaves_the_work_to_this_process(toy, monkeypatch):
    import subprocess

    def failing(rest):
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdin=subprocess.PIPE)

    monkeypatch.setattr(O, "_start_helper", failing)
    O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]
    assert toy.second(2) == 5.0


def test_a_helper_that_cannot_start_leaves_the_work_to_this_process(toy, monkeypatch):
    def no_interpreter(*args, **kwargs):
        raise FileNotFoundError("no python here")

    monkeypatch.setattr(O.subprocess, "Popen", no_interpreter)
    O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_a_helper_that_hangs_is_stopped(toy, monkeypatch):
    import subprocess

    hung = []

    def hanging(rest):
        hung.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.PIPE))
        return hung[-1]

    monkeypatch.setattr(O, "_start_helper", hanging)
    monkeypatch.setattr(O, "HELPER_GRACE_S", 0.5)
    O.compile_entries(entries(toy))
    assert hung[0].poll() is not None
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_a_failed_first_compile_stops_the_helper(toy, monkeypatch):
    from numba.core.errors import TypingError

    started, real = [], O._start_helper
    monkeypatch.setattr(O, "_start_helper", lambda rest: started.append(real(rest)) or started[-1])
    with pytest.raises(TypingError):
        O.compile_entries([(toy.first, (types.unicode_type,))] + entries(toy)[1:])   # "x" + 1
    assert started and started[0].poll() is not None   # stopped, not left running


def test_the_engine_is_compiled_first(monkeypatch):
    """The engine is the costliest entry: this process compiles it, the helper the rest."""
    seen = []
    monkeypatch.setattr(K, "compile_entries", lambda items: seen.extend(d for d, _ in items))
    monkeypatch.setattr(K, "function_pointer", lambda d, argtypes: d)
    from fastsim._replicate import pack_scenario
    from test_engine_variants import BASE

    import numba

    p = pack_scenario(BASE)
    given = tuple(numba.typeof(p[k]) for k in ("ipar", "fpar", "lat", "arr_times", "lcomp", "lpar", "ltab",
                                                 "lrange", "trace", "prio_val", "prio_cdf", "pred_edges"))
    K._entry_pointers.__wrapped__(given, None)
    assert seen[0] is K._simulate and set(seen) == {K._simulate, K._ws_need, K._reduce, K._draw_workload}
    seen.clear()
    K.simulate_stream(np.array([0.0]), [5], [3], [0], [0], [-1], [0], p["ipar"], p["fpar"], p["lat"])
    assert seen[0] is K._simulate and set(seen) == {K._simulate, K._ws_need, K._reduce}
