"""The two compilations of the engine (`kernel.replica._simulate`'s ``full``).

``full=None`` compiles the *common* engine: static batching, active priority
preemption, swap preemption, prefix caching, async scheduling, closed loops,
sessions, the roofline and per-step noise are constants there, and Numba
drops their branches before typing (a shorter cold start). ``full=1``
compiles the engine with every option. On a scenario that uses none of
those options the two must be one engine: the same metrics rows and the same
per-request results, bit for bit. The common engine refuses a scenario that
needs the full one instead of simulating it without the option.
"""

import dataclasses

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._replicate import pack_scenario
from test_reference_agreement import GRID, LATENCIES, scenario

# Mechanisms of the reference-agreement grid that the common engine has, and
# a few more: priority aging, SJF on predicted lengths, bursty arrivals with
# a horizon, prefix groups without caching, trace rows, multi-user arrivals.
# (prefix caching and async scheduling, on by default as in vLLM, are options
# of the full engine; the full-input admission gate and the null block are not)
COMMON = {"enable_prefix_caching": False, "async_scheduling": False}
BASE = scenario(COMMON, LATENCIES["a10g"])
CASES = {f"{name}/{lat}": scenario({**COMMON, **GRID[name]}, LATENCIES[lat])
         for name in GRID if "static" not in name for lat in ("a10g", "full")}
CASES.update({
    "priority-aging": scenario({**COMMON, "policy": "priority", "priority_aging_s": 0.5}, LATENCIES["full"]),
    "sjf-lognormal-predictor": scenario({**COMMON, "policy": "sjf",
                                         "length_predictor": fastsim.LogNormalPredictor(0.5)}, LATENCIES["a10g"]),
    "sjf-bucket-predictor": scenario({**COMMON, "policy": "sjf",
                                      "length_predictor": fastsim.BucketPredictor((32, 128), 0.8)},
                                     LATENCIES["a10g"]),
    "bursty-horizon-abandonment": scenario({**COMMON, "max_queue_delay_s": 0.4}, LATENCIES["a10g"],
                                           horizon_s=20.0, burstiness=4.0),
    "prefix-groups-without-caching": BASE.replace(**{"workload.prefix_groups": 3, "workload.prefix_len": 32}),
    "trace-rows": fastsim.Scenario(engine=BASE.engine, latency=BASE.latency, workload=fastsim.Workload(
        arrival_rate=6.0, num_requests=150, lengths=fastsim.sharegpt_lengths("sample"))),
    "multi-user": fastsim.Scenario(engine=BASE.engine, latency=BASE.latency, workload=fastsim.Workload.multi_user(
        (4, 8), 10.0, 2.0, prompt_len=fastsim.LogNormal(60, 0.8), output_len=fastsim.LogNormal(40, 0.9))),
})


def chunk(sc, full, nrep=6, key=(11, 12)):
    p = pack_scenario(sc)
    out = np.empty((nrep, K.N_COLUMNS))
    rc = K.run_chunk(0, nrep, np.uint64(key[0]), np.uint64(key[1]), *K.scenario_arrays(p), out, full)
    return rc, out


def per_request(sc, full, rep=0):
    """status, tokens, preemptions, first-token and finish times of one replication."""
    p = pack_scenario(sc)
    a, pr, o, c, q, grp, plen = K.draw_workload(rep, 3, 4, *K.scenario_arrays(p, lat=False))
    n = a.size
    ni, nf = K._ws_need(n, pr, o, grp, plen, p["ipar"])
    wi, wf = np.zeros(ni, np.int64), np.zeros(nf)
    assert K._simulate(n, a, pr, o, c, q, grp, plen, p["ipar"], p["fpar"], p["lat"], wi, wf, full,
                       np.inf, K.WHOLE_RUN) >= 0
    ints = [wi[j * n:(j + 1) * n] for j in (K.WI_STATUS, K.WI_G, K.WI_NPRE)]
    floats = [wf[j * n:(j + 1) * n] for j in (K.WF_FIRST, K.WF_FINISH)]
    return ints, floats


@pytest.mark.parametrize("name", list(CASES))
def test_the_common_engine_is_the_full_engine_without_its_options(name):
    sc = CASES[name]
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


NOISY = dataclasses.replace(LATENCIES["a10g"],
                            noise=fastsim.StepNoise(jitter_sd=0.2, stall_prob=0.05, stall_mean_s=0.05))
ROOFLINE = fastsim.Deployment(model="Qwen/Qwen2.5-1.5B-Instruct", gpu="A10G").latency

# each with a load under which the option changes what happens: the engine's
# settings, and the scenario's other fields with the option, and without it
OPTIONS = {
    "static": ({"scheduler": "static", "num_gpu_blocks": 200}, {}, {}),
    "priority_preemption": ({"policy": "priority", "priority_preemption": True}, {}, {}),
    "swap": ({"preemption_mode": "swap", "swap_space_blocks": 24}, {}, {}),
    "prefix_caching": ({"enable_prefix_caching": True, "num_gpu_blocks": 200},
                       {"workload.prefix_groups": 2, "workload.prefix_len": 48}, {}),
    "async_scheduling": ({"async_scheduling": True}, {}, {}),
    "closed_loop": ({}, {"workload.max_concurrency": 4, "workload.warmup_requests": 0},
                    {"workload.max_concurrency": None}),
    "sessions": ({}, {"workload.warmup_requests": 0, "workload.sessions": fastsim.Sessions(turns=3, think_time_s=0.5)},
                 {"workload.sessions": None}),
    "noise": ({}, {"latency": NOISY}, {"latency": LATENCIES["a10g"]}),
    "roofline": ({}, {"latency": ROOFLINE}, {"latency": LATENCIES["a10g"]}),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_scenario_with_an_option_of_the_full_engine_gets_it(option):
    engine, with_it, without_it = OPTIONS[option]
    sc = scenario({**COMMON, **engine}, LATENCIES["a10g"]).replace(**with_it)
    p = pack_scenario(sc)
    ipar = p["ipar"]
    assert K.engine_variant(ipar) == 1
    # the common engine refuses it, before simulating anything
    rc, out = chunk(sc, None, nrep=2)
    assert rc == -2
    n = 5
    args = (np.linspace(0.0, 1.0, n),) + tuple(np.full(n, v, np.int64) for v in (40, 5, 0, 5, -1, 0))
    wi, wf = np.full(10, 7, np.int64), np.zeros(10)
    assert K._simulate(n, *args, ipar, p["fpar"], p["lat"], wi, wf, None, np.inf, K.WHOLE_RUN) == -2
    assert (wi == 7).all()
    # simulate_requests and replicate choose the full engine by themselves: the
    # option acts (the results differ from the scenario without it) and agrees
    # with the reference simulator
    stream = fastsim.sample_requests(sc, seed=1)
    kernel = fastsim.simulate_requests(sc, stream, backend="numba")
    pd.testing.assert_frame_equal(kernel, fastsim.simulate_requests(sc, stream, backend="reference"),
                                  check_exact=True)
    off = {"scheduler": "continuous", "priority_preemption": False, "preemption_mode": "recompute",
           "swap_space_blocks": 0, "enable_prefix_caching": False, "async_scheduling": False}
    plain = sc.replace(**{f"engine.{k}": off[k] for k in engine if k in off}, **without_it)
    assert not kernel.equals(fastsim.simulate_requests(plain, fastsim.sample_requests(plain, seed=1), backend="numba"))
    res = fastsim.replicate(sc, n_replications=3, seed=0)
    assert res.estimate("request_throughput") > 0
