"""The two compilations of the engine (`_kernel._simulate`'s ``full``).

``full=None`` compiles the *common* engine: static batching, active priority
preemption, swap preemption and prefix caching are constants there, and
Numba drops their branches before typing (a shorter cold start). ``full=1``
compiles the engine with every option. On a scenario that uses none of
those options the two must be one engine: the same metrics rows and the same
per-request results, bit for bit. The common engine refuses a scenario that
needs the full one instead of simulating it without the option.
"""

import numpy as np
import pytest

import fastsim
from fastsim import _kernel as K
from fastsim._replicate import pack_scenario
from test_reference_agreement import GRID, LATENCIES, scenario

COMMON = [name for name in GRID if "static" not in name]


def chunk(sc, full, nrep=6, key=(11, 12)):
    p = pack_scenario(sc)
    out = np.empty((nrep, K.N_COLUMNS))
    rc = K.run_chunk(0, nrep, np.uint64(key[0]), np.uint64(key[1]), p["ipar"], p["fpar"], p["lat"], p["arr_times"],
                     p["lcomp"], p["lpar"], p["ltab"], p["lrange"], p["trace"], p["prio_val"], p["prio_cdf"],
                     p["pred_edges"], out, full)
    return rc, out


def per_request(sc, full, rep=0):
    """status, tokens, preemptions, first-token and finish times of one replication."""
    p = pack_scenario(sc)
    a, pr, o, c, q, grp, plen = K.draw_workload(rep, 3, 4, p["ipar"], p["fpar"], p["arr_times"], p["lcomp"],
                                                p["lpar"], p["ltab"], p["lrange"], p["trace"], p["prio_val"],
                                                p["prio_cdf"], p["pred_edges"])
    n = a.size
    ni, nf = K._ws_need(n, o, grp, plen, p["ipar"])
    wi, wf = np.zeros(ni, np.int64), np.zeros(nf)
    assert K._simulate(n, a, pr, o, c, q, grp, plen, p["ipar"], p["fpar"], p["lat"], wi, wf, full) >= 0
    ints = [wi[j * n:(j + 1) * n] for j in (K.WI_STATUS, K.WI_G, K.WI_NPRE)]
    floats = [wf[j * n:(j + 1) * n] for j in (K.WF_FIRST, K.WF_FINISH)]
    return ints, floats


@pytest.mark.parametrize("latency", ["a10g", "full"])
@pytest.mark.parametrize("name", COMMON)
def test_the_common_engine_is_the_full_engine_without_its_options(name, latency):
    # (and one case with a horizon, which ends a run with requests in the system)
    sc = scenario(GRID[name], LATENCIES[latency], horizon_s=30.0 if name == "abandonment" else None)
    assert K.engine_variant(pack_scenario(sc)["ipar"]) is None
    rc_common, common = chunk(sc, None)
    rc_full, full = chunk(sc, 1)
    assert rc_common == rc_full == 0
    np.testing.assert_array_equal(common, full)   # NaN == NaN here, every other value bit for bit
    ints_c, floats_c = per_request(sc, None)
    ints_f, floats_f = per_request(sc, 1)
    for x, y in zip(ints_c + floats_c, ints_f + floats_f):
        np.testing.assert_array_equal(x, y)
    assert (ints_c[0] == K.ST_COMPLETED).any()


OPTIONS = {
    "static": dict(scheduler="static"),
    "priority_preemption": dict(policy="priority", priority_preemption=True),
    "swap": dict(preemption_mode="swap", swap_space_blocks=8),
    "prefix_caching": dict(enable_prefix_caching=True),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_scenario_with_an_option_of_the_full_engine_gets_it(option):
    sc = scenario({**OPTIONS[option], "num_gpu_blocks": 200}, LATENCIES["a10g"])
    ipar = pack_scenario(sc)["ipar"]
    assert K.engine_variant(ipar) == 1
    # the common engine refuses it, before simulating anything
    rc, out = chunk(sc, None, nrep=2)
    assert rc == -2
    p = pack_scenario(sc)
    n = 5
    args = (np.linspace(0.0, 1.0, n),) + tuple(np.full(n, v, np.int64) for v in (40, 5, 0, 5, -1, 0))
    wi, wf = np.full(10, 7, np.int64), np.zeros(10)
    assert K._simulate(n, *args, ipar, p["fpar"], p["lat"], wi, wf, None) == -2
    assert (wi == 7).all()
    # replicate chooses the full engine by itself
    res = fastsim.replicate(sc.replace(**{"workload.num_requests": 60}), n_replications=3, seed=0)
    assert res.estimate("request_throughput") > 0
