"""The CPU driver calls the engine through function pointers (`_numba_options.function_pointer`).

`_kernel._run_chunk` takes the compiled `_draw_workload`, `_ws_need`,
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
from fastsim import _kernel as K
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
        function_pointer(K._stretch_kv, ())


def prefix_caching():
    engine, workload = OPTIONS["prefix_caching"]
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
    assert fresh(3, 5, np.uint64(1), np.uint64(2), *given, rows, full, *pointers) == 0
    for j in range(5):
        stream = K.draw_workload(3 + j, 1, 2, *K.scenario_arrays(p, lat=False))
        row = K.simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])[-1]
        np.testing.assert_array_equal(rows[j], row)
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
    call = (3, 2, np.uint64(1), np.uint64(2), *given, out[2:4], full, *pointers)   # keys as _replicate draws them
    declared = K._driver_types(tuple(numba.typeof(a) for a in given), full)[K._run_chunk]
    assert tuple(numba.typeof(a) for a in call) == declared
    assert declared in K._run_chunk.overloads
    # and replicate's real call, in the calling thread and on a pool, compiles no other version
    before = set(K._run_chunk.overloads)
    for n_threads, reps in ((1, 2), (2, 200)):
        fastsim.replicate(SCENARIOS[name], n_replications=reps, seed=4, n_threads=n_threads, progress=False)
    assert set(K._run_chunk.overloads) == before
