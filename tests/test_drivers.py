"""The CPU driver calls the engine through function pointers (`_numba_options.function_pointer`).

`kernel.drivers._run_chunk` takes the compiled `_draw_workload`, `_ws_need`,
`_simulate` and `_reduce` as first-class functions, so its own compilation
does not link in (and have LLVM optimise again) the engine. These tests check
that the pointers call the same code as the Python entries, and that the
driver's compiled module really holds no copy of the engine.
"""

import inspect
import re

import numba
import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._numba_options import function_pointer
from fastsim._replicate import pack_scenario
from test_engine_variants import CASES, LATENCIES, OPTIONS, scenario

ENGINE = ("_draw_workload", "_ws_need", "_simulate", "_reduce")


@pytest.mark.parametrize("case", sorted(CASES))
def test_pack_scenario_makes_the_arrays_the_kernel_names(case):
    p = pack_scenario(CASES[case])
    assert tuple(p) == K.SCENARIO_ARRAYS
    assert [id(a) for a in K.scenario_arrays(p)] == [id(a) for a in p.values()]
    assert [id(a) for a in K.scenario_arrays(p, lat=False)] == [id(v) for k, v in p.items() if k != "lat"]


def test_the_drivers_take_the_scenario_arrays_in_that_order():
    names = K.SCENARIO_ARRAYS
    assert tuple(inspect.signature(K.run_chunk).parameters)[4:16] == names
    assert tuple(inspect.signature(K._run_chunk.py_func).parameters)[4:16] == names
    assert tuple(inspect.signature(K.draw_workload).parameters)[3:14] == tuple(n for n in names if n != "lat")


def test_function_pointer_refuses_an_internal_function():
    with pytest.raises(TypeError, match="needs an entry"):
        function_pointer(K.stretch._stretch_kv, ())


def test_a_pointer_has_the_type_numba_would_give_it():
    """A pointer's Numba type is built once (`_numba_options._typeof_function_pointer`):
    the one Numba's own typeof of the wrapper address protocol builds on every call."""
    from numba.experimental.function_type import typeof_function_type

    given = K.scenario_arrays(pack_scenario(CASES["fcfs-tight-kv/a10g"]))
    for ptr in K.engine_pointers(given, None):
        assert numba.typeof(ptr) is ptr.numba_type
        assert typeof_function_type(ptr, None) == ptr.numba_type


def stream_rows(p, reps, key=(1, 2)):
    """Each replication's metrics row, drawn and simulated on its own (`simulate_stream`)."""
    return np.array([K.simulate_stream(*K.draw_workload(r, *key, *K.scenario_arrays(p, lat=False)),
                                       p["ipar"], p["fpar"], p["lat"])[-1] for r in reps])


def prefix_caching():
    engine, workload, _ = OPTIONS["prefix_caching"]
    return scenario(engine, LATENCIES["a10g"]).replace(**workload)


SCENARIOS = {"common engine": CASES["fcfs-tight-kv/a10g"], "full engine": prefix_caching()}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_driver_holds_no_copy_of_the_engine(name):
    """A fresh compilation of `_run_chunk` (uncached, so its LLVM IR can be read)
    gives, bit for bit, the rows of the entries called one by one from Python
    (`draw_workload`, `simulate_stream`), defines none of the engine's
    functions, and calls them through pointers."""
    p = pack_scenario(SCENARIOS[name])
    given = K.scenario_arrays(p)
    full = K.engine_variant(p["ipar"])
    pointers = K.engine_pointers(given, full)
    fresh = numba.njit(K._run_chunk.py_func, cache=False)
    rows = np.empty((5, K.N_COLUMNS))
    buf = K.ChunkBuffers(int(p["ipar"][K.I_NUM_REQUESTS]))
    assert K.run_on(fresh, buf, 3, 5, 1, 2, given, rows, full, pointers) == 0
    np.testing.assert_array_equal(rows, stream_rows(p, range(3, 8)))
    (ir,) = fresh.inspect_llvm().values()
    defined = re.findall(r"^define [^@]*@\"?([^\"(\s]+)", ir, re.M)
    assert any("_run_chunk" in d for d in defined)
    for fn in ENGINE:
        mangled = f"{len(fn)}{fn}"   # Numba's mangling: length, then the name
        assert not [d for d in defined if mangled in d], f"{fn} was linked into the driver"
    for arg in ("draw", "ws_need", "simulate", "reduce"):   # _run_chunk's pointer arguments
        assert re.search(rf"call [^@\n]*%fptr_of_{arg}\.", ir), f"no call through the {arg} pointer"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_driver_is_compiled_for_the_call_replicate_makes(name):
    """`_entry_pointers` compiles `_run_chunk` with the entries (on a cold
    start, in the helper process), for types it declares before the entries
    exist: they must be those of `replicate`'s call, pointers included (the
    entries' declared return types), or that call would compile it again."""
    p = pack_scenario(SCENARIOS[name])
    given = K.scenario_arrays(p)
    full = K.engine_variant(p["ipar"])
    pointers = K.engine_pointers(given, full)
    out = np.empty((6, K.N_COLUMNS))   # _replicate._run's rows
    buf = K.ChunkBuffers(int(p["ipar"][K.I_NUM_REQUESTS])).arrays()
    call = (3, 2, np.uint64(1), np.uint64(2), *given, out[2:4], *buf, full, *pointers)   # keys as _replicate draws them
    declared = K.drivers._driver_types(tuple(numba.typeof(a) for a in given), full)[K._run_chunk]
    assert tuple(numba.typeof(a) for a in call) == declared
    assert declared in K._run_chunk.overloads
    # and replicate's real call, in the calling thread and on a pool, compiles no other version
    before = set(K._run_chunk.overloads)
    for n_threads, reps in ((1, 2), (2, 200)):
        fastsim.replicate(SCENARIOS[name], n_replications=reps, seed=4, n_threads=n_threads, progress=False)
    assert set(K._run_chunk.overloads) == before


def test_buffers_grow_in_the_middle_of_a_chunk():
    """`run_on` grows a workspace too small for a later replication of the
    chunk, runs that replication again, and gets every row right (the
    trace-rows case: replications of different total output lengths, so of
    different workspace sizes)."""
    sc = CASES["trace-rows"]
    p = pack_scenario(sc)
    given = K.scenario_arrays(p)
    full = K.engine_variant(p["ipar"])
    needs = []
    for r in range(12):
        a, pr, o, _, _, grp, plen = K.draw_workload(r, 1, 2, *K.scenario_arrays(p, lat=False))
        needs.append(K._ws_need(a.size, pr, o, grp, plen, p["ipar"]))
    # start at the replication whose workspace is smallest of those followed by a larger one
    r0 = min(range(6), key=lambda r: needs[r])
    assert max(needs[r0:r0 + 6]) > needs[r0]
    buf = K.ChunkBuffers(sc.workload.num_requests)
    buf.wi, buf.wf = np.empty(needs[r0][0], np.int64), np.empty(needs[r0][1])
    first = buf.wi
    rows = np.empty((6, K.N_COLUMNS))
    assert K.run_on(K._run_chunk, buf, r0, 6, 1, 2, given, rows, full, K.engine_pointers(given, full)) == 0
    assert buf.wi is not first and buf.wi.size >= max(n for n, _ in needs[r0:r0 + 6])
    np.testing.assert_array_equal(rows, stream_rows(p, range(r0, r0 + 6)))


@pytest.mark.parametrize("name", ["fcfs-tight-kv/a10g", "bursty-horizon-abandonment", "multi-user"])
def test_a_runner_reuses_its_buffers_and_results_do_not_depend_on_them(name):
    """A runner keeps its `ChunkBuffers` from one call to the next, and a
    replication on buffers that other replications used gives, bit for bit,
    its row on fresh buffers."""
    p = pack_scenario(CASES[name])
    given = K.scenario_arrays(p)
    full = K.engine_variant(p["ipar"])
    run = K.chunk_runner(given, full)
    rows = np.empty((10, K.N_COLUMNS))
    # later replications first, then earlier ones, on the same runner (so on the same buffers)
    assert run(5, 5, 1, 2, rows[5:]) == 0
    kept = run.pool.get_nowait()
    run.pool.put(kept)
    assert run(0, 5, 1, 2, rows[:5]) == 0
    assert run.pool.get_nowait() is kept and run.pool.empty()   # the same set, reused, and no other
    np.testing.assert_array_equal(rows, stream_rows(p, range(10)))


def test_the_pointers_are_looked_up_by_what_numba_types_arrays_by():
    """`engine_pointers` keys its cache by `_array_key`: arrays that share a key
    have the same Numba type (a key that missed would only cost a lookup by
    types), and a hit returns the pointers `_entry_pointers` gave for those types."""
    base = np.arange(12.0).reshape(3, 4)
    ro = base.copy()
    ro.flags.writeable = False
    variants = [base, base.copy(), np.asfortranarray(base), base[:, ::2], ro, base.astype(np.int64),
                base.astype(np.float32), base.ravel(), base[0], np.empty(0), np.empty(0, np.int64), base[:1]]
    for a in variants:
        for b in variants:
            if K.drivers._array_key(a) == K.drivers._array_key(b):
                assert numba.typeof(a) == numba.typeof(b)
    assert len({K.drivers._array_key(a) for a in variants}) >= len({numba.typeof(a) for a in variants}) == 8
    given = K.scenario_arrays(pack_scenario(CASES["fcfs-tight-kv/a10g"]))
    assert K.engine_pointers(given, None) is K.drivers._entry_pointers(tuple(numba.typeof(a) for a in given), None)
    assert K.engine_pointers(tuple(a.copy() for a in given), None) is K.engine_pointers(given, None)
