"""vLLM V1's serving rules (``docs/engine-model.md``, "vLLM V1 rules"): async
scheduling, the full-input admission gate (``scheduler_reserve_full_isl``)
and the null block. Hand-computed cases in the reference simulator, exact equivalences,
and the kernel held to the reference bit for bit with each rule on.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import fastsim
from conftest import legacy_engine as EngineConfig  # (V1 switches off unless a case sets them: the model its times were derived in)
from fastsim._latency import LatencyModel
from fastsim._reference import simulate_reference

ONE = LatencyModel.constant(1.0)


def run(reqs, engine, latency=ONE):
    a, p, o = (np.array(col) for col in zip(*reqs))
    return simulate_reference(a.astype(float), p, o, np.zeros(len(reqs), np.int64), engine, latency)


def test_the_gate_waits_for_the_whole_input_instead_of_thrashing():
    # block_size 4, 4 blocks; budget 6 tokens, 1 s steps. R0: P=8, O=2; R1: P=10, O=2, both at 0.
    # Step 1 [0, 1): R0's chunk of 6 (2 blocks). Step 2 [1, 2): R0's last 2 prompt tokens; 4 tokens
    # of budget left.
    #  * Without the gate R1 is admitted with a chunk of 4 (1 block; 1 block left free). Step 3
    #    [2, 3): R0 takes the last block for its decode token; R1 needs 2 more blocks -> R1 is the
    #    victim of its own allocation (preempted, recomputed later).
    #  * With the gate R1 needs ceil(10 / 4) = 3 free blocks: 2 are free at step 2, 1 at step 3;
    #    it waits until R0 completes at 3.
    # Either way R1 runs steps 4-6 [3, 6): chunks 6 and 4 (first token at 5), then its decode.
    reqs = [(0.0, 8, 2), (0.0, 10, 2)]
    eng = EngineConfig(block_size=4, num_gpu_blocks=4, max_num_seqs=2, max_num_batched_tokens=6)
    off = run(reqs, eng)
    on = run(reqs, dataclasses.replace(eng, scheduler_reserve_full_isl=True))
    for r in (off, on):
        assert r["first_token_s"].tolist() == [2.0, 5.0]
        assert r["finish_s"].tolist() == [3.0, 6.0]
    assert off["num_preemptions"].tolist() == [0, 1]
    assert on["num_preemptions"].tolist() == [0, 0]


def test_a_preempted_request_is_readmitted_with_its_whole_input():
    # R0, R1: P=4, O=6 at 0; 4 blocks of 4; 1 s steps. Both admitted at 0 (1 block each),
    # tokens at 1..5 (k = 8, 2 blocks each at t=5). Step 6 [5, 6): both need a 3rd block,
    # none is free: R0's allocation preempts the last admitted, R1 (g = 5 kept). R0 completes
    # at 6. R1's input is then P + g = 9 tokens: the gate asks ceil(9 / 4) = 3 free blocks (4
    # are); chunk of 8 in [6, 7), its last input token in [7, 8) emits token 6 at 8.
    eng = EngineConfig(block_size=4, num_gpu_blocks=4, max_num_seqs=2, max_num_batched_tokens=8,
                       scheduler_reserve_full_isl=True)
    r = run([(0.0, 4, 6), (0.0, 4, 6)], eng)
    assert r["first_token_s"].tolist() == [1.0, 1.0]
    assert r["finish_s"].tolist() == [6.0, 8.0]
    assert r["num_preemptions"].tolist() == [0, 1]


def test_the_null_block_is_one_block_less():
    # num_gpu_blocks is the count vLLM reports, the null block included.
    sc = fastsim.Scenario(engine=EngineConfig(max_num_seqs=8, max_num_batched_tokens=128, num_gpu_blocks=41,
                                              null_block=True),
                          workload=fastsim.Workload(arrival_rate=6.0, num_requests=200,
                                                    prompt_len=fastsim.LogNormal(80, 0.6),
                                                    output_len=fastsim.LogNormal(40, 0.8)),
                          latency=LatencyModel.default())
    plain = dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, num_gpu_blocks=40, null_block=False))
    a = fastsim.replicate(sc, n_replications=4, seed=3).per_replication
    b = fastsim.replicate(plain, n_replications=4, seed=3).per_replication
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    c = fastsim.replicate(dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, null_block=False)),
                          n_replications=4, seed=3).per_replication
    assert not a.equals(c)   # tight enough that one block matters
    with pytest.raises(ValueError, match="null_block"):
        EngineConfig(num_gpu_blocks=1, null_block=True)
    with pytest.raises(ValueError, match="scheduler_reserve_full_isl"):
        EngineConfig(scheduler_reserve_full_isl="yes")


BASE = dict(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48)
GRID = {
    "gate-fcfs": dict(scheduler_reserve_full_isl=True),
    "gate-null-block": dict(scheduler_reserve_full_isl=True, null_block=True),
    "gate-priority": dict(scheduler_reserve_full_isl=True, policy="priority"),
    "gate-priority-preemption": dict(scheduler_reserve_full_isl=True, policy="priority",
                                     priority_preemption=True),
    "gate-no-chunking": dict(scheduler_reserve_full_isl=True, enable_chunked_prefill=False,
                             max_num_batched_tokens=512),
    "gate-block-size-12": dict(scheduler_reserve_full_isl=True, block_size=12, num_gpu_blocks=64),
    "gate-caching": dict(scheduler_reserve_full_isl=True, enable_prefix_caching=True, num_gpu_blocks=64),
    "async": dict(async_scheduling=True),
    "async-roomy": dict(async_scheduling=True, num_gpu_blocks=5000),
    "async-priority": dict(async_scheduling=True, policy="priority"),
    "async-sjf": dict(async_scheduling=True, policy="sjf"),
    "async-gate-null-block": dict(async_scheduling=True, scheduler_reserve_full_isl=True, null_block=True),
    "async-no-chunking": dict(async_scheduling=True, enable_chunked_prefill=False, max_num_batched_tokens=512),
    "async-abandonment": dict(async_scheduling=True, max_queue_delay_s=0.4),
    "async-queue-limit": dict(async_scheduling=True, admission="queue_limit", max_waiting=3),
    "async-kv-reservation": dict(async_scheduling=True, admission="kv_reservation", num_gpu_blocks=80),
}


def scenario(engine, latency, prefix=False):
    extra = dict(prefix_groups=4, prefix_len=48) if prefix else {}
    return fastsim.Scenario(
        engine=EngineConfig(**{**BASE, **engine}),
        workload=fastsim.Workload(
            arrival_rate=8.0, num_requests=250,
            prompt_len=fastsim.Mixture([fastsim.LogNormal(60, 0.8), fastsim.Uniform(150, 250)], [0.7, 0.3]),
            output_len=fastsim.LogNormal(40, 0.9), priorities=(0, 1, 2), priority_probs=(0.2, 0.3, 0.5),
            warmup_requests=10, **extra),
        latency=latency)


@pytest.mark.parametrize("latency", [LatencyModel.default(),
                                     LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3,
                                                  prefill_per_token_s=3e-5, ctx_per_token_s=2e-7)],
                         ids=["a10g", "full"])
@pytest.mark.parametrize("name", list(GRID))
def test_kernel_and_reference_agree_on_the_v1_rules(name, latency):
    sc = scenario(GRID[name], latency, prefix="caching" in name)
    stream = fastsim.sample_requests(sc, seed=7)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert (fast["status"] == "completed").any()


def test_the_gate_cuts_preemptions_under_tight_kv():
    # The point of the gate: no over-admission, so (far) fewer preemptions.
    lat = LatencyModel.default()
    off = scenario({}, lat)
    on = scenario(GRID["gate-fcfs"], lat)
    n_off = sum(fastsim.simulate_requests(off, fastsim.sample_requests(off, seed=s))["num_preemptions"].sum()
                for s in range(3))
    n_on = sum(fastsim.simulate_requests(on, fastsim.sample_requests(on, seed=s))["num_preemptions"].sum()
               for s in range(3))
    assert n_off > 0 and n_on < n_off


@pytest.mark.parametrize("name", ["async", "async-abandonment", "async-queue-limit", "async-gate-null-block"])
def test_replicate_backends_agree_on_every_metric_with_async_scheduling(name):
    """Whole replications: the reference computes its metrics (time integrals
    included) from its own step log, independently of the kernel's."""
    sc = scenario(GRID[name], LatencyModel.default())
    fast = fastsim.replicate(sc, n_replications=3, seed=8).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=8, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)


def test_async_scheduling_admits_an_arrival_one_step_later():
    # Constant 1 s steps, 1-token prompts. A (O=10) at 0, B (O=3) at 0.5.
    # Synchronous: B is ingested at the end of step 1 (t=1) and runs steps 2-4: tokens at 2, 3, 4.
    # Async: steps 1 and 2 are scheduled at 0 (the second with A's placeholder); at t=1 (step 1
    # ends) B is ingested and scheduled into step 3, which runs after step 2: tokens at 3, 4, 5.
    eng = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=4, num_gpu_blocks=400)
    reqs = [(0.0, 1, 10), (0.5, 1, 3)]
    sync = run(reqs, eng)
    asyn = run(reqs, dataclasses.replace(eng, async_scheduling=True))
    assert sync["first_token_s"].tolist() == [1.0, 2.0] and sync["finish_s"].tolist() == [10.0, 4.0]
    assert asyn["first_token_s"].tolist() == [1.0, 3.0] and asyn["finish_s"].tolist() == [10.0, 5.0]
    sc = fastsim.Scenario(engine=dataclasses.replace(eng, async_scheduling=True),
                          workload=fastsim.Workload(arrival_rate=1.0, num_requests=2), latency=ONE)
    stream = pd.DataFrame({"arrival_s": [0.0, 0.5], "prompt_len": [1, 1], "output_len": [10, 3]})
    out = fastsim.simulate_requests(sc, stream)
    assert out["first_token_s"].tolist() == [1.0, 3.0] and out["finish_s"].tolist() == [10.0, 5.0]


def test_a_single_seat_is_the_same_queue_with_or_without_async_scheduling():
    # With max_num_seqs=1 the next request can only start when the seat is freed, at the end of
    # the step of the last token, in both loops: the same M/D/1 departures, bit for bit.
    sc = fastsim.Scenario(engine=EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, num_gpu_blocks=400),
                          workload=fastsim.Workload(arrival_rate=0.04, num_requests=300, prompt_len=1,
                                                    output_len=fastsim.Uniform(1, 40)),
                          latency=ONE)
    stream = fastsim.sample_requests(sc, seed=5)
    a = fastsim.simulate_requests(sc, stream)
    b = fastsim.simulate_requests(dataclasses.replace(sc, engine=dataclasses.replace(sc.engine,
                                                                                   async_scheduling=True)), stream)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
