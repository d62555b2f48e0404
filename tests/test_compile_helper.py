"""`compile_entries`: on a cold start a helper process compiles all entries but the first into Numba's disk cache.

Checked on a small module of cached functions written for each test (a new
file, so nothing of it is in memory or in the cache at first): which
functions this process compiled and which it loaded from the cache shows who
compiled what (``dispatcher.stats``).
"""

import importlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
from numba import types

import fastsim._parallel
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
    monkeypatch.setattr(fastsim._parallel, "available_cores", lambda: 2)   # whatever this machine has
    monkeypatch.setattr(O, "HELPER_GRACE_S", 120.0)   # time enough on a busy machine
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


def entries(mod):
    return [(mod.first, SIG), (mod.second, SIG), (mod.third, SIG)]


def compiled_here(dispatcher):
    return sum(dispatcher.stats.cache_misses.values())


def loaded_from_cache(dispatcher):
    return sum(dispatcher.stats.cache_hits.values())


def test_a_helper_compiles_the_others_on_a_cold_start(toy):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        O.compile_entries(entries(toy))
    assert compiled_here(toy.first) == 1
    for d in (toy.second, toy.third):
        assert (compiled_here(d), loaded_from_cache(d)) == (0, 1), "the helper did not compile it"
    assert (toy.first(4), toy.second(4), toy.third(4)) == (5, 10.0, 1)


@pytest.mark.parametrize("setting", ["0", "off", "False"])
def test_no_helper_when_turned_off(toy, monkeypatch, setting):
    monkeypatch.setenv("FASTSIM_COMPILE_HELPER", setting)
    monkeypatch.setattr(O, "_start_helper", pytest.fail)
    O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_no_helper_with_one_core(toy, monkeypatch):
    monkeypatch.setattr(fastsim._parallel, "available_cores", lambda: 1)
    monkeypatch.setattr(O, "_start_helper", pytest.fail)
    O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_no_helper_in_a_frozen_application(toy, monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)   # sys.executable would be the application
    monkeypatch.setattr(O, "_start_helper", pytest.fail)
    O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_no_helper_when_the_first_is_cached(toy, monkeypatch):
    O.compile_entries(entries(toy))
    warm = importlib.reload(toy)   # new dispatchers: nothing in memory, everything in the disk cache
    monkeypatch.setattr(O, "_start_helper", pytest.fail)
    O.compile_entries(entries(warm))
    assert [loaded_from_cache(d) for d in (warm.first, warm.second, warm.third)] == [1, 1, 1]


def fake_helper(code):
    """`_start_helper` replaced by a process that runs ``code``."""
    def start(rest, log):
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=log)
    return start


def test_a_failed_helper_leaves_the_work_to_this_process_and_says_why(toy, monkeypatch):
    monkeypatch.setattr(O, "_start_helper", fake_helper("import sys; sys.stderr.write('no luck'); sys.exit(3)"))
    with pytest.warns(RuntimeWarning, match="exited with code 3.*no luck"):
        O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]
    assert toy.second(2) == 5.0


def test_a_helper_that_cannot_start_leaves_the_work_to_this_process(toy, monkeypatch):
    def no_interpreter(*args, **kwargs):
        raise FileNotFoundError("no python here")

    monkeypatch.setattr(O.subprocess, "Popen", no_interpreter)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        O.compile_entries(entries(toy))
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_a_helper_that_hangs_is_stopped(toy, monkeypatch):
    started = []
    hang = fake_helper("import time; time.sleep(600)")
    monkeypatch.setattr(O, "_start_helper", lambda rest, log: started.append(hang(rest, log)) or started[-1])
    monkeypatch.setattr(O, "HELPER_GRACE_S", 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # stopped, not failed: no warning
        O.compile_entries(entries(toy))
    assert started[0].returncode is not None
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_a_failed_first_compile_stops_the_helper(toy, monkeypatch):
    from numba.core.errors import TypingError

    started, real = [], O._start_helper
    monkeypatch.setattr(O, "_start_helper", lambda rest, log: started.append(real(rest, log)) or started[-1])
    with pytest.raises(TypingError):
        O.compile_entries([(toy.first, (types.unicode_type,))] + entries(toy)[1:])   # "x" + 1
    assert started and started[0].returncode is not None   # stopped and reaped, not left running


@pytest.mark.parametrize("reported", [False, True])
def test_a_stopped_helper_leaves_no_index_entry_it_did_not_finish(toy, reported):
    """Stopped between writing an entry's index and its data, the helper would
    leave an index that points at an older data file: the entries it did not
    report done are taken out of the index."""
    toy.second.compile(SIG)
    assert O._in_disk_cache(toy.second, SIG)
    code = ("print(0, flush=True); " if reported else "") + "import time; time.sleep(600)"
    proc = fake_helper(code)(None, subprocess.DEVNULL)
    if reported:   # wait until it has said so (without reading it)
        import select

        assert select.select([proc.stdout], [], [], 60)[0]
    assert O._stop_helper(proc, [(toy.second, SIG)], 0.1) is None   # stopped
    assert O._in_disk_cache(toy.second, SIG) == reported


def test_the_helper_compiles_fastsims_entries(tmp_path):
    """The real entries: their types pickle (the driver's function types
    too), the helper imports fastsim's kernel, compiles and reports each
    (here loaded from this run's cache, or compiled)."""
    import numba

    from fastsim._replicate import pack_scenario
    from test_engine_variants import BASE

    p = pack_scenario(BASE)
    rest = list(K._driver_types(tuple(numba.typeof(a) for a in K.scenario_arrays(p)), None).items())[1:]
    assert [d for d, _ in rest] == [K._ws_need, K._reduce, K._draw_workload, K._run_chunk]
    with open(tmp_path / "log", "w+b") as log:
        proc = O._start_helper(rest, log)
        assert proc.wait(300) == 0, log.seek(0) or log.read().decode()
    assert proc.stdout.read().split() == [b"0", b"1", b"2", b"3"]


def test_the_helper_skips_an_entry_for_another_cache(toy, monkeypatch):
    monkeypatch.setattr(O, "_cache_path", lambda d: "/somewhere/else")   # what this process reads
    with open(toy.__file__ + ".log", "w+b") as log:
        proc = O._start_helper([(toy.second, SIG)], log)
        assert proc.wait(120) == 0
    assert proc.stdout.read() == b""
    assert not O._in_disk_cache(toy.second, SIG)


def test_the_engine_is_compiled_first_and_the_direct_calls_use_what_was_compiled(monkeypatch):
    """The engine is the costliest entry: this process compiles it, the helper
    the rest (the driver included); and `simulate_stream`'s calls from Python use exactly the
    versions `compile_entries` was given (no second compilation)."""
    import numba

    from fastsim._replicate import pack_scenario
    from test_engine_variants import BASE

    p = pack_scenario(BASE)
    given = tuple(numba.typeof(a) for a in K.scenario_arrays(p))
    seen = []
    monkeypatch.setattr(K, "compile_entries", lambda items: seen.extend(items))
    monkeypatch.setattr(K, "function_pointer", lambda d, argtypes: d)
    K._entry_pointers.__wrapped__(given, None)
    assert seen[0][0] is K._simulate
    assert {d for d, _ in seen} == {K._simulate, K._ws_need, K._reduce, K._draw_workload, K._run_chunk}
    seen.clear()
    monkeypatch.undo()
    given_types = {}
    real = K.compile_entries
    K._stream_entries.cache_clear()   # an earlier test's simulate_requests may have looked these types up
    monkeypatch.setattr(K, "compile_entries", lambda items: (given_types.update(items), real(given_types.items())))
    before = {d: set(d.overloads) for d in (K._simulate, K._ws_need, K._reduce)}
    K.simulate_stream(np.array([0.0, 0.5]), [5, 9], [3, 4], [0, 0], [0, 0], [-1, -1], [0, 0], p["ipar"], p["fpar"],
                      p["lat"])
    assert list(given_types)[0] is K._simulate
    for d, old in before.items():
        assert set(d.overloads) - old <= {given_types[d]}, f"{d.py_func.__name__} compiled another version"
        assert given_types[d] in d.overloads
