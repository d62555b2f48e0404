"""`compile_entries`: on a cold start a helper process compiles all entries but the first into Numba's disk cache.

Checked on a small module of cached functions written for each test (a new
file, so nothing of it is in memory or in the cache at first): which
functions this process compiled and which it loaded from the cache shows who
compiled what (``dispatcher.stats``).
"""

import importlib
import re
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from numba import types

import fastsim._parallel
from fastsim import kernel as K
from fastsim import _numba_options as O

TOY = '''
import numba
from fastsim._numba_options import njit_noalloc

@njit_noalloc
def inner(x):
    return x * 3

@numba.njit(cache=True)
def first(x):
    return inner(x) + 1

@numba.njit(cache=True)
def second(x):
    return x * 2.5

@numba.njit(cache=True)
def third(x):
    return x - 3

@numba.njit(cache=True)
def fourth(x):
    return x // 2
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


def first_after_the_helper(toy, monkeypatch, jobs_done):
    """The first entry's compilation starts once the helper has reported
    ``jobs_done`` jobs (the toy's entries compile too fast to leave it any)."""
    real = toy.first.compile

    def compile(argtypes):
        deadline = time.monotonic() + 120
        while len(O._helper.done) < jobs_done and not O._helper.exited and time.monotonic() < deadline:
            time.sleep(0.01)
        return real(argtypes)

    monkeypatch.setattr(toy.first, "compile", compile)


def test_a_helper_compiles_the_others_on_a_cold_start(toy, monkeypatch):
    first_after_the_helper(toy, monkeypatch, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        O.compile_entries(entries(toy))
    assert compiled_here(toy.first) == 1
    for d in (toy.second, toy.third):
        assert (compiled_here(d), loaded_from_cache(d)) == (0, 1), "the helper did not compile it"
    assert (toy.first(4), toy.second(4), toy.third(4)) == (13, 10.0, 1)


def test_the_first_entry_waits_for_its_callees_and_loads_them(toy):
    """The first entry's compilation asks for ``inner`` while the helper is
    still starting: it waits for the helper to save it, then loads it."""
    O.compile_entries(entries(toy), callees=[(toy.inner, SIG)])
    assert (compiled_here(toy.inner), loaded_from_cache(toy.inner)) == (0, 1)
    assert toy.first(4) == 13


def test_this_process_reads_internal_functions_but_never_writes_them(toy):
    toy.inner.compile(SIG)
    assert compiled_here(toy.inner) == 1 and not O._in_disk_cache(toy.inner, SIG)
    fresh = importlib.reload(toy)
    fresh.inner._cache.saving.add(SIG)   # as in a helper
    fresh.inner.compile(SIG)
    assert O._in_disk_cache(fresh.inner, SIG)
    again = importlib.reload(toy)
    again.inner.compile(SIG)
    assert (compiled_here(again.inner), loaded_from_cache(again.inner)) == (0, 1)


def test_an_internal_function_is_only_linked_into_its_callers_compiled_here_or_loaded(toy):
    """An internal function's library is link-only (no module passes, no
    machine code of its own): its caller links it in, optimises it and runs
    it. Saved (a helper's job), it is saved so and read back so, and a
    caller compiled over the loaded one gets the same machine code as over
    one compiled here: the engine is one build whether a cold start had a
    helper or not."""
    assert toy.first(4) == 13
    (cres,) = toy.inner.overloads.values()
    assert isinstance(cres.library, O._LinkOnlyLibrary) != O.KERNEL_DEBUG   # (debug builds are full)
    assert cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name) == 0 or O.KERNEL_DEBUG
    (here,) = toy.first.overloads.values()
    saver = importlib.reload(toy)
    saver.inner._cache.saving.add(SIG)   # as in a helper
    saver.inner.compile(SIG)
    assert O._in_disk_cache(saver.inner, SIG)
    (cres,) = saver.inner.overloads.values()
    assert isinstance(cres.library, O._LinkOnlyLibrary) != O.KERNEL_DEBUG
    loader = importlib.reload(toy)
    loader.first._cache.flush()   # (compiled again over the loaded callee)
    loader.inner.compile(SIG)
    assert (compiled_here(loader.inner), loaded_from_cache(loader.inner)) == (0, 1)
    (cres,) = loader.inner.overloads.values()
    assert isinstance(cres.library, O._LinkOnlyLibrary) != O.KERNEL_DEBUG
    assert loader.first(4) == 13 and compiled_here(loader.first) == 1
    (there,) = loader.first.overloads.values()

    def code(library):   # (Numba numbers each compiled version of a function: names differ by it)
        return re.sub(r"B\d+v\d+B", "B", library.get_asm_str())

    assert code(here.library) == code(there.library)


def test_a_link_only_cache_entry_is_read_back_only_as_one():
    with pytest.raises(ValueError, match="not a link-only library"):
        O._LinkOnlyLibrary.from_cache(None, ("f", "object", b""))


def test_while_a_helper_runs_an_internal_function_is_loaded_only_once_it_reported_it(toy, tmp_path):
    """An index entry on disk (here from an earlier run) is not enough: the
    engine takes its callees from the running helper only, as the helper
    reports them, so that it holds one copy of each function they call."""
    toy.inner._cache.saving.add(SIG)
    toy.inner.compile(SIG)   # on disk now
    fresh = importlib.reload(toy)
    O._claim(str(tmp_path), 0)   # the helper's claim
    proc = fake_helper("import sys; sys.exit(0)")(None, subprocess.DEVNULL, None)   # reports nothing
    helper = O._Helper(proc, [(fresh.inner, SIG)], str(tmp_path))
    O._helper = helper
    try:
        fresh.inner.compile(SIG)
    finally:
        O._helper = None
        helper.stop(60)
    assert (compiled_here(fresh.inner), loaded_from_cache(fresh.inner)) == (1, 0)


def test_this_process_takes_the_jobs_the_helper_has_not_begun_from_the_last_back(toy, monkeypatch, tmp_path):
    """The helper is at the second of three jobs: this process compiles the
    third, and leaves the second to the helper while it runs (here it is
    stopped, and this process then compiles what it left)."""
    def at_the_second_job(jobs, log, claims):
        O._claim(claims, 1)
        return fake_helper("import time; time.sleep(600)")(jobs, log, claims)

    seen = []
    real_stop = O._Helper.stop
    monkeypatch.setattr(O, "_start_helper", at_the_second_job)
    monkeypatch.setattr(O._Helper, "stop", lambda self, timeout: seen.append(
        [compiled_here(d) for d in (toy.second, toy.third, toy.fourth)]) or real_stop(self, 0.1))
    O.compile_entries(entries(toy) + [(toy.fourth, SIG)])
    assert seen == [[0, 0, 1]]
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third, toy.fourth)] == [1, 1, 1, 1]


def test_the_helper_leaves_the_jobs_this_process_claimed(toy, tmp_path):
    O._claim(str(tmp_path), 0)
    with open(tmp_path / "log", "w+b") as log:
        proc = O._start_helper([(toy.second, SIG), (toy.third, SIG)], log, str(tmp_path))
        assert proc.wait(120) == 0, log.seek(0) or log.read().decode()
    assert reports(proc) == [b"1"]
    assert (O._in_disk_cache(toy.second, SIG), O._in_disk_cache(toy.third, SIG)) == (False, True)


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


def reports(proc):
    """The words of a helper's reports, without its heartbeats."""
    return [w for w in proc.stdout.read().split() if w != b"beat"]


def fake_helper(code):
    """`_start_helper` replaced by a process that runs ``code``."""
    def start(jobs, log, claims):
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
    monkeypatch.setattr(O, "_start_helper", lambda *args: started.append(hang(*args)) or started[-1])
    monkeypatch.setattr(O, "HELPER_GRACE_S", 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # stopped, not failed: no warning
        O.compile_entries(entries(toy))
    assert started[0].returncode is not None
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_a_failed_first_compile_stops_the_helper(toy, monkeypatch):
    from numba.core.errors import TypingError

    started, real = [], O._start_helper
    monkeypatch.setattr(O, "_start_helper", lambda *args: started.append(real(*args)) or started[-1])
    with pytest.raises(TypingError):
        O.compile_entries([(toy.first, (types.unicode_type,))] + entries(toy)[1:])   # inner("x") * 3: no NRT
    assert started and started[0].returncode is not None   # stopped and reaped, not left running


@pytest.mark.parametrize("reported", [False, True])
def test_a_stopped_helper_leaves_no_index_entry_it_did_not_finish(toy, reported, tmp_path):
    """Stopped between writing an entry's index and its data, the helper would
    leave an index that points at an older data file: the entries it did not
    report done are taken out of the index."""
    toy.second.compile(SIG)
    assert O._in_disk_cache(toy.second, SIG)
    code = ("print(0, flush=True); " if reported else "") + "import time; time.sleep(600)"
    proc = fake_helper(code)(None, subprocess.DEVNULL, None)
    if reported:   # wait until it has said so (without reading it)
        import select

        assert select.select([proc.stdout], [], [], 60)[0]
    assert O._Helper(proc, [(toy.second, SIG)], str(tmp_path)).stop(0.1) is None   # stopped
    assert O._in_disk_cache(toy.second, SIG) == reported


def test_the_helper_compiles_fastsims_entries(tmp_path):
    """The real entries: their types pickle (the driver's function types
    too), the helper imports fastsim's kernel, compiles and reports each
    (here loaded from this run's cache, or compiled)."""
    import numba

    from fastsim._replicate import pack_scenario
    from test_engine_variants import BASE

    p = pack_scenario(BASE)
    rest = list(K.drivers._driver_types(tuple(numba.typeof(a) for a in K.scenario_arrays(p)), None).items())[1:]
    assert [d for d, _ in rest] == [K._reduce, K._draw_workload, K._ws_need, K._run_chunk]
    with open(tmp_path / "log", "w+b") as log:
        proc = O._start_helper(rest, log, str(tmp_path))
        assert proc.wait(300) == 0, log.seek(0) or log.read().decode()
    assert reports(proc) == [b"0", b"1", b"2", b"3"]


def test_the_helper_skips_an_entry_for_another_cache(toy, monkeypatch, tmp_path):
    monkeypatch.setattr(O, "_cache_path", lambda d: "/somewhere/else")   # what this process reads
    with open(toy.__file__ + ".log", "w+b") as log:
        proc = O._start_helper([(toy.second, SIG)], log, str(tmp_path))
        assert proc.wait(120) == 0
    assert reports(proc) == [b"skip", b"0"]
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
    monkeypatch.setattr(K.drivers, "compile_entries", lambda items, callees: seen.extend(items))
    monkeypatch.setattr(K.drivers, "function_pointer", lambda d, argtypes: d)
    K.drivers._entry_pointers.__wrapped__(given, None)
    assert seen[0][0] is K._simulate
    assert {d for d, _ in seen} == {K._simulate, K._ws_need, K._reduce, K._draw_workload, K._run_chunk}
    seen.clear()
    monkeypatch.undo()
    given_types = {}
    real = K.drivers.compile_entries
    K.drivers._stream_entries.cache_clear()   # an earlier test's simulate_requests may have looked these types up
    monkeypatch.setattr(K.drivers, "compile_entries",
                        lambda items, callees: (given_types.update(items), real(given_types.items(), callees)))
    before = {d: set(d.overloads) for d in (K._simulate, K._ws_need, K._reduce)}
    K.simulate_stream(np.array([0.0, 0.5]), [5, 9], [3, 4], [0, 0], [0, 0], [-1, -1], [0, 0], p["ipar"], p["fpar"],
                      p["lat"])
    assert list(given_types)[0] is K._simulate
    for d, old in before.items():
        assert set(d.overloads) - old <= {given_types[d]}, f"{d.py_func.__name__} compiled another version"
        assert given_types[d] in d.overloads


_ASKED = r"""
import json
from numba.core import event
from fastsim import kernel as K, _numba_options as O

full = {full}
asked = []


class Record(event.Listener):
    def on_start(self, ev):
        d = ev.data["dispatcher"]
        module = d.py_func.__module__.rsplit(".", 1)[1]
        if isinstance(d, O._InternalDispatcher) and (module not in K.callees.ENGINE_MODULES
                                                      or d.py_func.__name__ in K.callees.HELPER_PHASES):
            asked.append((O._name_in_module(d), [str(t) for t in ev.data["args"]]))

    def on_end(self, ev):
        pass


event.register("numba:compile", Record())
K._simulate.compile(K.callees.engine_types(K.callees.V_I, K.callees.V_F, K.callees.V_F, full)[K._simulate])
print(json.dumps(asked))
"""


def test_the_engine_callees_listed_for_the_helper_are_what_compiling_the_engine_asks_for(tmp_path):
    """`kernel.callees.TABLE`, for each engine: the internal functions its
    compilation asks for outside the engine's own modules (and the phases
    of `callees.HELPER_PHASES`), with their
    argument types, in that order (the helper's order of work), as a
    listener recorded here (not the table's own recorder) sees them. Each engine is compiled in a fresh process
    with an empty cache (both at once)."""
    import json
    import os

    procs = {}
    for full in (None, 1):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / f"cache_{full}"), FASTSIM_COMPILE_HELPER="0")
        procs[full] = subprocess.Popen([sys.executable, "-c", _ASKED.format(full=full)], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for full, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        asked = [(name, argtypes) for name, argtypes in json.loads(out.splitlines()[-1])]
        listed = [(O._name_in_module(d), [str(t) for t in argtypes]) for d, argtypes in K.drivers._callee_types(full)]
        assert listed == asked, (f"engine {full}: kernel.callees.TABLE is stale; "
                                 "write it again with: python -c 'from fastsim.kernel import callees; callees.main()'")


_ENGINE_CODE = r"""
import hashlib, os, re, sys
sys.path.insert(0, {benchmarks!r})
import fastsim
from benchmarks.common import reference_workload
from fastsim.kernel import replica
fastsim.replicate(reference_workload(20), n_replications=2, seed=0, progress=False)
(cres,) = replica._simulate.overloads.values()
# Numba numbers each compiled version of a function (names differ by it); an
# environment that no code reads may be declared once more
code = re.sub(r"B\d+v\d+B", "B", cres.library.get_asm_str())
code = "\n".join(line for line in code.splitlines()
                 if "_ZN08NumbaEnv" not in line or not line.lstrip().startswith((".type", ".comm")))
print(hashlib.sha256(code.encode()).hexdigest(), len(code))
"""


def test_the_engine_is_the_same_machine_code_with_and_without_the_helper(tmp_path):
    """A cold start with the compile helper (two cores) and one without
    (one core) make the same engine: the helper saves the internal
    functions as the link-only IR this process would have made, and the
    engine links them in either way. (Before, the helper built them in
    full, and the engine's code, and its speed, depended on the machine.)"""
    import os

    procs = {}
    benchmarks = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    for helper in ("0", "1"):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / f"cache_{helper}"), FASTSIM_COMPILE_HELPER=helper)
        procs[helper] = subprocess.Popen([sys.executable, "-c", _ENGINE_CODE.format(benchmarks=benchmarks)],
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    codes = {}
    for helper, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        codes[helper] = out.split()[-2:]
    assert int(codes["0"][1]) > 100_000   # (the engine, not a stub)
    assert codes["0"] == codes["1"]


def test_the_helper_skips_an_internal_function_it_cannot_compile(toy, tmp_path):
    """(A stale line of `kernel.callees.TABLE`.) It says so and goes on."""
    with open(tmp_path / "log", "w+b") as log:
        proc = O._start_helper([(toy.inner, (types.unicode_type,)), (toy.third, SIG)], log, str(tmp_path))
        assert proc.wait(120) == 0, log.seek(0) or log.read().decode()
        log.seek(0)
        assert b"TypingError" in log.read()
    assert reports(proc) == [b"skip", b"0", b"1"]


def test_the_reports_ignore_what_else_the_helper_prints(tmp_path):
    proc = fake_helper("print('[cache] data saved'); print(); print(0); print('skip 1'); print('2')")(
        None, subprocess.DEVNULL, None)
    helper = O._Helper(proc, [], str(tmp_path))
    assert helper.stop(60) == 0
    assert (helper.done, helper.skipped, helper.exited) == ({0, 2}, {1}, True)


def test_an_internal_function_is_named_in_the_index_only_once_its_data_is_written(toy, monkeypatch):
    """A helper stopped between the two writes leaves nothing to load (Numba
    itself writes the index first, which could then name a stale file)."""
    def stopped(self, overloads):
        raise KeyboardInterrupt

    toy.inner._cache.saving.add(SIG)
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(O._DataFirstCacheFile, "_save_index", stopped)
        toy.inner.compile(SIG)
    assert not O._in_disk_cache(toy.inner, SIG)
    fresh = importlib.reload(toy)
    fresh.inner._cache.saving.add(SIG)
    fresh.inner.compile(SIG)
    assert O._in_disk_cache(fresh.inner, SIG)


def test_a_silent_helper_is_found_stalled_by_its_missing_heartbeat(toy, monkeypatch):
    """Issue 43: a stalled helper cost HELPER_GRACE_S (here 120 s) per callee
    still to come; without a heartbeat for HELPER_STALL_S it is stopped, with
    a warning, and this process compiles everything."""
    started = []
    silent = fake_helper("import time; time.sleep(600)")
    monkeypatch.setattr(O, "_start_helper", lambda *args: started.append(silent(*args)) or started[-1])
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"compile helper stopped responding \(no heartbeat for 3 s\)"):
        O.compile_entries(entries(toy), callees=[(toy.inner, SIG)])
    assert time.monotonic() - start < O.HELPER_STALL_S + 30   # not HELPER_GRACE_S
    assert started[0].returncode is not None
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]
    assert toy.first(4) == 13


def test_a_stopped_real_helper_is_found_stalled(toy, monkeypatch):
    import signal

    started, real = [], O._start_helper

    def start_and_stop(*args):
        proc = real(*args)
        started.append(proc)
        os.kill(proc.pid, signal.SIGSTOP)   # as if swapped out or frozen: alive, silent
        return proc

    import os
    monkeypatch.setattr(O, "_start_helper", start_and_stop)
    with pytest.warns(RuntimeWarning, match="compile helper stopped responding"):
        O.compile_entries(entries(toy), callees=[(toy.inner, SIG)])
    assert started[0].returncode is not None   # killed and reaped, stopped as it was
    assert [compiled_here(d) for d in (toy.first, toy.second, toy.third)] == [1, 1, 1]


def test_a_beating_helper_is_waited_for(tmp_path, monkeypatch):
    """A helper that takes longer than HELPER_STALL_S but beats is not stalled."""
    beats = int(2 * O.HELPER_STALL_S / 0.2)
    proc = fake_helper(f"import time\nfor _ in range({beats}):\n    print('beat', flush=True); time.sleep(0.2)\n"
                       f"print(0, flush=True)")(None, subprocess.DEVNULL, None)

    class Cache:   # a stand-in for the job's dispatcher cache (only its identity matters)
        pass

    d = type("D", (), {"_cache": Cache()})()
    helper = O._Helper(proc, [(d, SIG)], str(tmp_path))
    start = time.monotonic()
    assert helper.ready(d._cache, SIG)   # reported done after 2 x HELPER_STALL_S of heartbeats
    assert time.monotonic() - start > O.HELPER_STALL_S and not helper.stalled
    assert helper.stop(60) == 0


def test_claims_directories_of_killed_cold_starts_are_removed(tmp_path):
    import os
    import tempfile

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()   # a process id that no longer runs
    stale = os.path.join(tempfile.gettempdir(), f"{O._CLAIMS_PREFIX}{gone}-test")
    live = os.path.join(tempfile.gettempdir(), f"{O._CLAIMS_PREFIX}{os.getpid()}-test")
    for d in (stale, live):
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "0"), "w").close()
    try:
        O._remove_stale_claims()
        assert not os.path.exists(stale) and os.path.exists(live)
    finally:
        import shutil

        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


def _exited(pid):
    """Whether process ``pid`` has ended (a zombie nobody reaps counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_helper_whose_parent_died_exits_by_itself(toy, tmp_path):
    """A killed cold start leaves no helper behind: the helper sees its parent
    gone (its heartbeat), begins no further job and exits."""
    import os
    import textwrap

    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from numba import types
        from fastsim import _numba_options as O
        import {toy.__name__} as toy
        sig = (types.int64,)
        jobs = [(toy.second, sig), (toy.third, sig), (toy.fourth, sig)]
        proc = O._start_helper(jobs, sys.stderr, {str(tmp_path / "claims")!r})
        print(proc.pid, flush=True)
        os._exit(0)   # as if killed: nothing is cleaned up
    """)
    (tmp_path / "claims").mkdir()
    parent = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    pid = int(parent.stdout.split()[0])
    deadline = time.monotonic() + 60
    while not _exited(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _exited(pid), "the orphaned helper is still running"
    assert len(os.listdir(tmp_path / "claims")) < 3   # it stopped before the last jobs


def test_quicker_typing_keeps_the_flags_values_and_hash():
    """`_quicker_typing`'s `TargetConfig.values` and hash are Numba's own:
    every option's value (the default where none is set) and the hash of the
    sorted option names, for fresh, set and copied flags."""
    from numba.core.compiler import Flags

    def numbas_values(flags):   # Numba's definition: each option through its property
        return {name: getattr(flags, name) for name in type(flags).options}

    fresh = Flags()
    set_ = Flags()
    set_.nrt = True
    set_.error_model = "numpy"
    set_.boundscheck = False   # set to its default: still equal to a fresh one's value
    copied = Flags(set_)
    for flags in (fresh, set_, copied):
        assert flags.values() == numbas_values(flags)
        assert hash(flags) == hash(tuple(sorted(numbas_values(flags))))
    assert copied == set_ and hash(copied) == hash(set_)
    assert fresh != set_
    assert Flags().values() is not Flags().values()   # a fresh dict each time (callers may change it)


def test_numba_errors_are_written_without_highlighting():
    """A typing error in a function fastsim compiles carries no terminal
    escape codes (`_plain_error_messages`), whether or not colorama is
    installed; afterwards Numba's colour scheme is as it was (a user's own
    jitted code keeps Numba's messages)."""
    import numba
    from numba.core import errors

    from fastsim._numba_options import _HIGHLIGHTS, njit

    scheme = errors.termcolor()
    before = {name: scheme.__dict__.get(name) for name in _HIGHLIGHTS}

    @njit(cache=False)
    def bad(x):
        return x.no_such_attribute

    with pytest.raises(numba.core.errors.TypingError) as info:
        bad(1)
    assert "\x1b[" not in str(info.value)
    assert "no_such_attribute" in str(info.value)
    assert {name: scheme.__dict__.get(name) for name in _HIGHLIGHTS} == before


def _typing_counter(monkeypatch):
    """Count the calls that reach Numba's own typing of calls (under the memo)."""
    from numba.core.types import functions

    memo = functions.BaseFunction.get_call_type
    numbas = memo.__wrapped__
    seen = []

    def counted(self, context, args, kws):
        seen.append((self, tuple(args)))
        return numbas(self, context, args, kws)

    monkeypatch.setattr(functions.BaseFunction, "get_call_type", O._typing_memo(counted))
    return seen


def test_typing_memo_serves_fastsim_compiles_with_numbas_signatures(monkeypatch):
    """While a fastsim function compiles, a call typed before is not typed
    again (`_typing_memo`), and the code is what Numba's own typing gives:
    the same results as a plain ``numba.njit`` copy, compiled without it."""
    import numba

    seen = _typing_counter(monkeypatch)

    def body(a, i):
        s = a[i] + a[i + 1]          # the same getitem typed twice
        return min(s, a[0]) + min(a[1], a[2])   # and min of two int64

    fast = O.njit(body, cache=False)
    assert fast(np.arange(5), 1) == 0 + 1   # min(1 + 2, 0) + min(1, 2)
    ours = list(seen)
    getitems = [args for fn, args in ours if "getitem" in str(fn) and args[1] == types.int64]
    assert len(getitems) == 1   # a[i] and a[i + 1]: typed once, then remembered
    seen.clear()
    plain = numba.njit(body)   # not fastsim's: Numba's typing, every call
    for a, i in ((np.arange(5), 1), (np.array([7, -3, 4, 9]), 0)):
        assert plain(a, i) == fast(a, i)
    assert len([args for fn, args in seen if "getitem" in str(fn) and args[1] == types.int64]) >= 2


def test_typing_memo_keys_the_argument_types(monkeypatch):
    """Calls of one function with other argument types are typed apart
    (``min`` of two int64 and of two float64: typed once each, for both
    call sites, with their own result types)."""
    seen = _typing_counter(monkeypatch)

    def body(x, y):
        return min(x, y) + min(x, y)

    fast = O.njit(body, cache=False)
    assert fast(3, 4) == 6 and isinstance(fast(3, 4), int)
    assert fast(2.5, 4.0) == 5.0 and isinstance(fast(2.5, 4.0), float)
    mins = [args for fn, args in seen if "min" in str(fn)]
    pairs = sorted(str(args) for args in mins if len(args) == 2)
    assert pairs == ["(float64, float64)", "(int64, int64)"]   # each typed by Numba once, for both calls


OUT_OF_LINE_TOY = '''
import numba
import numpy as np
from fastsim._numba_options import njit_noalloc

@njit_noalloc(inline="never")
def kept(unused, x):
    return x * 7

@njit_noalloc
def merged(x):
    return x + 1

@numba.njit(cache=True, pipeline_class=__import__("fastsim")._numba_options._FastsimCompiler)
def entry(x):
    return kept(np.zeros(3), x) + merged(x)

@numba.njit
def plain(a, x):   # (not an entry: Numba's own library, its copy of ``kept`` by Numba's convention)
    return kept(a, x)
'''


def test_an_entry_makes_the_functions_kept_out_of_line_internal(tmp_path, monkeypatch):
    """An entry's module makes the out-of-line (``noinline``) functions it
    links in internal before its module passes (`_EntryLibrary`), and
    leaves its own functions as Numba made them."""
    import llvmlite.binding as ll

    name = f"fastsim_ool_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(OUT_OF_LINE_TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    try:
        assert mod.entry(3) == 25
        # a later module's copy of ``kept`` is its own, not the entry's internal one (whose unused
        # argument LLVM dropped): the JIT binds a name across modules, so the internal copy is renamed
        assert mod.plain(np.ones(3), 5) == 35
        (cres,) = mod.entry.overloads.values()
        if O.KERNEL_DEBUG:   # (debug builds are Numba's own)
            assert not isinstance(cres.library, O._EntryLibrary)
            return
        assert isinstance(cres.library, O._EntryLibrary)
        functions = {fn.name: fn for fn in cres.library._final_module.functions if not fn.is_declaration}
        kept = [fn for n, fn in functions.items() if ".kept" in n or "4kept" in n]
        assert kept and all(fn.linkage == ll.Linkage.internal and ".in." in fn.name for fn in kept)
        own = [fn for n, fn in functions.items() if "5entry" in n]
        assert own and all(fn.linkage != ll.Linkage.internal for fn in own)
    finally:
        sys.modules.pop(name, None)
