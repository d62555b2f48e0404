"""The four vLLM V1 rules in the reference simulator: exact checks and validation.

(vLLM's own scheduler checks them request by request in ``tests/oracle``.)
"""

import math

import numpy as np
import pandas as pd
import pytest

import fastsim
from conftest import legacy_engine as EngineConfig  # (V1 switches off unless a case sets them: the model its times were derived in)
from fastsim import LatencyModel, Scenario, Workload
from fastsim._reference import simulate_reference

C = 0.01   # the constant step time


def _one_step_lag_case(async_scheduling, b_steps, out_b):
    """Request A (index 0) decodes for 200 steps from time 0; request B arrives
    at b_steps * C, in the middle of one of A's steps, with out_b outputs."""
    engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=64, num_gpu_blocks=100,
                          async_scheduling=async_scheduling)
    res = simulate_reference([0.0, b_steps * C], [8, 8], [200, out_b], [0, 0], engine,
                             LatencyModel.constant(C))
    return res


@pytest.mark.parametrize("b_steps", [2.5, 7.5, 30.25, 99.75])
@pytest.mark.parametrize("out_b", [1, 2, 17])
def test_async_scheduling_one_step_lag_closed_form(b_steps, out_b):
    """With constant step time C, steps end at multiples of C. Synchronous: B,
    arriving in step m (m = ceil(b / C)), is scheduled in step m + 1 and its
    first token comes at (m + 1) C. Async: step m + 1 was scheduled when step m
    started, before B arrived; B is first scheduled at m C for the step after
    the one in flight, so its first token comes at (m + 2) C: exactly one step
    later. Its later tokens follow one per step; A is not delayed."""
    m = math.ceil(b_steps)
    sync = _one_step_lag_case(False, b_steps, out_b)
    asyn = _one_step_lag_case(True, b_steps, out_b)
    # Times are sums of C, so compare with the same sums.
    assert sync["first_token_s"][1] == pytest.approx((m + 1) * C, abs=1e-12)
    assert asyn["first_token_s"][1] == pytest.approx((m + 2) * C, abs=1e-12)
    assert asyn["finish_s"][1] == pytest.approx((m + 1 + out_b) * C, abs=1e-12)
    assert sync["finish_s"][1] == pytest.approx((m + out_b) * C, abs=1e-12)
    for res in (sync, asyn):
        assert res["first_token_s"][0] == pytest.approx(C, abs=1e-12)
        assert res["finish_s"][0] == pytest.approx(200 * C, abs=1e-12)


def test_async_scheduling_lone_request_no_lag():
    """A request alone: async scheduling schedules its decode steps back to back
    and does not schedule a step after its last token."""
    for O in (1, 2, 9):
        res = simulate_reference([0.5], [40], [O], [0], EngineConfig(async_scheduling=True),
                                 LatencyModel.constant(C))
        assert res["first_token_s"][0] == pytest.approx(0.5 + C, abs=1e-12)
        assert res["finish_s"][0] == pytest.approx(0.5 + O * C, abs=1e-12)
        assert res["num_steps"] == O


def test_null_block_leaves_one_block_fewer():
    """null_block=True: num_gpu_blocks counts the null block; a request needing
    exactly num_gpu_blocks blocks no longer fits."""
    lat = LatencyModel.constant(C)
    for null, status in ((False, 0), (True, 1)):
        res = simulate_reference([0.0], [16 * 9], [17], [0], EngineConfig(num_gpu_blocks=10, null_block=null),
                                 lat)
        assert res["status"][0] == status


def test_full_input_gate_counts_whole_prompt():
    """With the gate a waiting request is admitted only if its whole prompt's
    blocks are free: two 20-block prompts, 30 blocks, chunks of 64 tokens. Without
    the gate both start (and one is preempted later); with it the second waits
    for the first to finish and nothing is preempted."""
    lat = LatencyModel.constant(C)
    kw = dict(num_gpu_blocks=30, max_num_batched_tokens=64, max_num_seqs=4)
    off = simulate_reference([0.0, 0.0], [320, 320], [5, 5], [0, 0], EngineConfig(**kw), lat)
    on = simulate_reference([0.0, 0.0], [320, 320], [5, 5], [0, 0],
                            EngineConfig(scheduler_reserve_full_isl=True, **kw), lat)
    assert off["num_preemptions"].sum() > 0
    assert on["num_preemptions"].sum() == 0
    assert on["first_token_s"][1] > on["finish_s"][0] - 1e-12


def test_block_hash_cache_recompute_finds_own_blocks():
    """A preempted request's freed blocks stay cached: on re-admission it hits
    them (its recompute is shorter than with the group-entry model, which
    caches nothing of a request without a prefix group)."""
    lat = LatencyModel(base_s=0.001, prefill_per_token_s=1e-4)
    kw = dict(num_gpu_blocks=40, max_num_batched_tokens=256, max_num_seqs=8, enable_prefix_caching=True)
    args = ([0.0, 0.001, 0.002], [300, 300, 300], [200, 200, 200], [0, 0, 0])
    hashed = simulate_reference(*args, EngineConfig(block_hash_caching=True, **kw), lat)
    groups = simulate_reference(*args, EngineConfig(**kw), lat)
    assert hashed["num_preemptions"].sum() > 0 and groups["num_preemptions"].sum() > 0
    assert np.nanmax(hashed["finish_s"]) < np.nanmax(groups["finish_s"])


def test_block_hash_cache_shares_prefix_groups_and_conserves_blocks():
    """Requests of one prefix group share its full blocks; the reference asserts
    block conservation (queued + referenced = usable) after every scheduling pass."""
    sc = Scenario(engine=EngineConfig(), latency=LatencyModel.constant(C),
                  workload=Workload(arrival_rate=20.0, num_requests=80, prefix_groups=2,
                                    prefix_len=fastsim.Uniform(64, 256)))
    req = fastsim.sample_requests(sc, seed=3)
    eng = EngineConfig(num_gpu_blocks=200, enable_prefix_caching=True, block_hash_caching=True,
                       async_scheduling=True, scheduler_reserve_full_isl=True, null_block=True)
    res = simulate_reference(req["arrival_s"], req["prompt_len"], req["output_len"], req["priority"], eng,
                             sc.latency, prefix_group=req["prefix_group"], prefix_len=req["prefix_len"])
    assert (res["status"] == 0).all()
    assert res["prefix_hit_tokens"] > 0
    # hits are whole blocks and at most the prompt less one token
    assert (res["cached_tokens"] % eng.block_size == 0).all()
    assert (res["cached_tokens"] <= req["prompt_len"].to_numpy() - 1).all()


@pytest.mark.parametrize("field", ["async_scheduling", "scheduler_reserve_full_isl", "null_block",
                                   "block_hash_caching"])
def test_v1_switches_validated(field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: "yes"})


def test_v1_switch_combinations_rejected():
    with pytest.raises(ValueError, match="block_hash_caching=True requires enable_prefix_caching"):
        EngineConfig(block_hash_caching=True)
    with pytest.raises(ValueError, match="async_scheduling=True requires scheduler='continuous'"):
        EngineConfig(async_scheduling=True, scheduler="static")
    with pytest.raises(ValueError, match="async_scheduling=True cannot be combined with preemption_mode"):
        EngineConfig(async_scheduling=True, preemption_mode="swap")
    with pytest.raises(ValueError, match="num_gpu_blocks must be >= 2 with null_block"):
        EngineConfig(num_gpu_blocks=1, null_block=True)


@pytest.mark.parametrize("field", ["async_scheduling", "scheduler_reserve_full_isl", "null_block",
                                   "block_hash_caching"])
def test_kernel_has_the_v1_rules(field):
    extra = {"enable_prefix_caching": True} if field == "block_hash_caching" else {}
    sc = Scenario(engine=EngineConfig(**{field: True}, **extra), latency=LatencyModel.constant(C),
                  workload=Workload(arrival_rate=1.0, num_requests=5))
    req = fastsim.sample_requests(Scenario(engine=EngineConfig(), latency=sc.latency, workload=sc.workload), seed=1)
    pd.testing.assert_frame_equal(fastsim.simulate_requests(sc, req),
                                  fastsim.simulate_requests(sc, req, backend="reference"), check_exact=True)
