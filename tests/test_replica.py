"""A replica that can be paused: run in many `advance_until` calls, it gives
the bits of one call.

`kernel.drivers.Replica` drives `replica._init_replica`,
`replica._simulate` with ``STEP_ADVANCE`` and `replica._finish_replica`. Each scenario's
stream is run to the end in one call (`simulate_stream`, i.e. `_simulate`)
and again in many calls at random times, which fall inside steps (a step in
flight) and inside stretches (a stretch planned again on the next call); the
per-request results and the metrics row must agree to the bit, and the
pauses must have hit every place a replica can stand.
"""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._replicate import pack_scenario
from fastsim.kernel import replica as R
from fastsim.kernel.workspace import RI_MODE

LAT = fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5,
                           ctx_per_token_s=2e-7)
CASES = {
    # long decodes: stretches, fast steps, few events (constant step time: many steps at once)
    "stretches": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=400),
        workload=fastsim.Workload(arrival_rate=4.0, num_requests=60, prompt_len=fastsim.Uniform(20, 200),
                                  output_len=fastsim.Uniform(50, 600), warmup_requests=5)),
    # a context term (stretch steps that lengthen), tight KV (preemption, slow steps), a horizon
    "tight-kv-context": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=6, num_gpu_blocks=60, max_num_batched_tokens=256,
                                    max_queue_delay_s=3.0),
        workload=fastsim.Workload(arrival_rate=6.0, num_requests=80, prompt_len=fastsim.Uniform(20, 300),
                                  output_len=fastsim.Uniform(5, 200), horizon_s=20.0),
        latency=LAT),
    # the full engine: priority with active preemption and aging, swap preemption
    "priority-swap": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=40, policy="priority",
                                    preemption_mode="swap", swap_space_blocks=20),
        workload=fastsim.Workload(arrival_rate=5.0, num_requests=60, prompt_len=fastsim.Uniform(20, 120),
                                  output_len=fastsim.Uniform(5, 150), priorities=(0, 1, 2),
                                  priority_probs=(0.3, 0.3, 0.4), warmup_requests=3),
        latency=LAT),
    # the full engine: prefix caching (every step a slow one)
    "prefix-caching": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=50, enable_prefix_caching=True),
        workload=fastsim.Workload(arrival_rate=5.0, num_requests=50, prompt_len=fastsim.Uniform(40, 160),
                                  output_len=fastsim.Uniform(2, 60), prefix_groups=3, prefix_len=64)),
    # async scheduling (two steps in flight), tight KV (preemptions of requests with a token in
    # flight), a horizon and abandonment, the full-input gate and the null block
    "async": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=6, num_gpu_blocks=60, max_num_batched_tokens=256,
                                    max_queue_delay_s=3.0, async_scheduling=True, null_block=True,
                                    scheduler_reserve_full_isl=True),
        workload=fastsim.Workload(arrival_rate=6.0, num_requests=80, prompt_len=fastsim.Uniform(20, 300),
                                  output_len=fastsim.Uniform(5, 200), horizon_s=20.0),
        latency=LAT),
    # static batching
    "static": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=200, scheduler="static"),
        workload=fastsim.Workload(arrival_rate=3.0, num_requests=40, prompt_len=fastsim.Uniform(10, 80),
                                  output_len=fastsim.Uniform(5, 80))),
}


def _stream(sc, rep):
    p = pack_scenario(sc)
    return K.draw_workload(rep, 11, 12, *K.scenario_arrays(p, lat=False)), p


def _same(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True) and np.array_equal(np.signbit(x), np.signbit(y))


@pytest.mark.parametrize("name", list(CASES))
def test_many_calls_give_the_bits_of_one(name):
    modes = set()
    for rep in range(3):
        stream, p = _stream(CASES[name], rep)
        whole = K.simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])
        one = K.drivers.Replica(*stream, p["ipar"], p["fpar"], p["lat"])
        assert one.advance_until(np.inf) in ("idle", "done")
        _same(one.finish(), whole)
        end = float(whole[2][np.isfinite(whole[2])].max()) if np.isfinite(whole[2]).any() else 1.0
        rng = np.random.default_rng(rep)
        for count in (5, 300):
            times = np.sort(rng.uniform(0.0, 1.1 * end, count))
            rep_ = K.drivers.Replica(*stream, p["ipar"], p["fpar"], p["lat"])
            for t in times:
                rep_.advance_until(t)
                modes.add(int(rep_.ri[RI_MODE]))
            rep_.advance_until(np.inf)
            _same(rep_.finish(), whole)
    assert R.MODE_BETWEEN_STEPS in modes or R.MODE_STRETCH in modes
    if name == "stretches":
        assert {R.MODE_FAST_STEP, R.MODE_STRETCH} <= modes   # paused in a step and before a stretch
    if name in ("tight-kv-context", "priority-swap", "prefix-caching", "static"):
        assert R.MODE_SLOW_STEP in modes
    if name == "async":
        assert {R.MODE_FAST_STEP, R.MODE_SLOW_STEP} <= modes


def test_a_step_in_flight_is_not_ended_before_its_end():
    """After `advance_until(t)`, no step that ends after t has been applied:
    every first-token and finish time recorded is at or before t."""
    stream, p = _stream(CASES["tight-kv-context"], 0)
    rep = K.drivers.Replica(*stream, p["ipar"], p["fpar"], p["lat"])
    n = int(rep.n)
    for t in np.linspace(0.05, 15.0, 40):
        rep.advance_until(t)
        first = rep.wf[K.WF_FIRST * n:(K.WF_FIRST + 1) * n]
        finish = rep.wf[K.WF_FINISH * n:(K.WF_FINISH + 1) * n]
        assert np.all(first[np.isfinite(first)] <= t)
        assert np.all(finish[np.isfinite(finish)] <= t)
        assert rep.clock <= t


def test_pausing_at_the_same_time_again_does_nothing():
    stream, p = _stream(CASES["stretches"], 1)
    rep = K.drivers.Replica(*stream, p["ipar"], p["fpar"], p["lat"])
    rep.advance_until(3.3)
    wi, wf = rep.wi.copy(), rep.wf.copy()
    rep.advance_until(3.3)
    rep.advance_until(1.0)   # (an earlier time: nothing to do)
    assert np.array_equal(wi, rep.wi) and np.array_equal(wf, rep.wf, equal_nan=True)


@pytest.mark.parametrize("name", ["stretches", "tight-kv-context"])
def test_a_call_to_an_earlier_time_changes_nothing_with_synchronous_scheduling(name):
    """A replica paused before a stretch and called to a time before its
    clock changes nothing, and the run ends with the bits of one call:
    synchronous scheduling, whose stretches are summed only until they pass
    the call's time (`stretch.Stretch.stop`; the cases above default to
    async scheduling, which sums them whole)."""
    sc = CASES[name]
    sc = sc.replace(engine=dataclasses.replace(sc.engine, async_scheduling=False))
    paused = 0
    for rep in range(2):
        stream, p = _stream(sc, rep)
        whole = K.simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])
        one = K.drivers.Replica(*stream, p["ipar"], p["fpar"], p["lat"])
        end = float(whole[2][np.isfinite(whole[2])].max())
        for t in np.linspace(0.05, 1.05, 60) * end:
            one.advance_until(t)
            clock = float(one.rf[K.workspace.RF_CLOCK])
            if int(one.ri[K.workspace.RI_MODE]) == K.replica.MODE_STRETCH and clock > 0.0:
                wi, wf = one.wi.copy(), one.wf.copy()
                one.advance_until(0.5 * clock)
                assert np.array_equal(wi, one.wi) and np.array_equal(wf, one.wf, equal_nan=True), t
                paused += 1
        one.advance_until(np.inf)
        _same(one.finish(), whole)
    assert paused > 10   # (the case this test is for was met)


@pytest.mark.parametrize("name", list(CASES))
def test_requests_handed_one_at_a_time_give_the_bits_of_one_run(name):
    """A replica set up with no request known (`STEP_EMPTY`, the stream
    only bounding the requests), advanced to each arrival and handed that
    request there (`replica._hand`, as a router does), gives the per-request
    results and the metrics row of one whole run of the stream."""
    for rep in range(3):
        stream, p = _stream(CASES[name], rep)
        whole = K.simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])
        rep_ = K.drivers.Replica(*stream, p["ipar"], p["fpar"], p["lat"], empty=True)
        assert int(rep_.ri[K.workspace.RI_N_KNOWN]) == 0
        assert rep_.advance_until(1.0) == "idle"   # nothing known yet
        for i in range(stream[0].size):
            rep_.advance_until(stream[0][i])
            assert rep_.hand(*(col[i] for col in stream)) == i
        rep_.advance_until(np.inf)
        _same(rep_.finish(), whole)


def test_a_full_or_out_of_order_hand_is_refused():
    stream, p = _stream(CASES["stretches"], 0)
    rep = K.drivers.Replica(*(c[:2] for c in stream), p["ipar"], p["fpar"], p["lat"], empty=True)
    rep.hand(*(c[1] for c in stream))
    with pytest.raises(RuntimeError, match="-3 out of order"):
        rep.hand(*(c[0] for c in stream))
    rep.hand(*(c[1] for c in stream))
    with pytest.raises(RuntimeError, match="-1 full"):
        rep.hand(*(c[1] for c in stream))
