"""The Numba kernel and the independent pure-Python reference simulator
(``fastsim/_reference.py``) agree exactly, request by request, on identical
request streams, in every mechanism of docs/engine-model.md.

Exact means bit-identical floating-point times: both compute each step's
duration with the same formula in the same order, and any divergence in
scheduling (an off-by-one step, a wrong victim, a missed refund) would show
up as a different first-token or finish time.
"""

import numpy as np
import pandas as pd
import pytest

import fastsim

from conftest import assert_same

BASE_ENGINE = dict(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48)

GRID = {
    "fcfs-tight-kv": {},
    "priority-tight-kv": {"policy": "priority"},
    "sjf-tight-kv": {"policy": "sjf"},
    "no-chunking": {"enable_chunked_prefill": False, "max_num_batched_tokens": 512},
    "roomy-kv": {"num_gpu_blocks": 5000},
    "queue-limit": {"admission": "queue_limit", "max_waiting": 3},
    "loss-system": {"admission": "queue_limit", "max_waiting": 0},
    "kv-reservation": {"admission": "kv_reservation", "num_gpu_blocks": 80},
    "abandonment": {"max_queue_delay_s": 0.4},
    "max-model-len": {"max_model_len": 260},
    "static": {"scheduler": "static", "num_gpu_blocks": 200},
    "static-no-chunking": {"scheduler": "static", "enable_chunked_prefill": False,
                           "max_num_batched_tokens": 512, "num_gpu_blocks": 200},
    "static-priority": {"scheduler": "static", "policy": "priority", "num_gpu_blocks": 120},
    # block sizes other than 16: one that is no power of two (the kernel then
    # divides where it otherwise shifts), and one token per block
    "block-size-12": {"block_size": 12, "num_gpu_blocks": 64},
    "block-size-1": {"block_size": 1, "num_gpu_blocks": 768},
}

LATENCIES = {
    "constant": fastsim.LatencyModel.constant(0.02),
    "a10g": fastsim.LatencyModel.default(),
    "full": fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3,
                                 prefill_per_token_s=3e-5, ctx_per_token_s=2e-7),
}


def scenario(engine, latency, horizon_s=None, burstiness=1.0):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**{**BASE_ENGINE, **engine}),
        workload=fastsim.Workload(
            arrival_rate=8.0, num_requests=250, burstiness=burstiness, horizon_s=horizon_s,
            prompt_len=fastsim.Mixture([fastsim.LogNormal(60, 0.8), fastsim.Uniform(150, 250)], [0.7, 0.3]),
            output_len=fastsim.LogNormal(40, 0.9), priorities=(0, 1, 2), priority_probs=(0.2, 0.3, 0.5),
            warmup_requests=10),
        latency=latency, ttft_slo_s=0.5, tpot_slo_s=0.05)


#: The engine's vLLM V1 rules: vLLM 0.22's defaults (`EngineConfig`'s), or all
#: four off (the synchronous loop).
RULES = {"vllm-0.22": {}, "sync": dict(async_scheduling=False, scheduler_reserve_full_isl=False,
                                       null_block=False, enable_prefix_caching=False)}


@pytest.mark.parametrize("rules", list(RULES))
@pytest.mark.parametrize("latency", list(LATENCIES))
@pytest.mark.parametrize("name", list(GRID))
def test_kernel_and_reference_agree_request_by_request(name, latency, rules):
    sc = scenario({**RULES[rules], **GRID[name]}, LATENCIES[latency])
    out = assert_same(sc, seed=2024)
    assert (out["status"] == "completed").any()


def test_the_grid_exercises_each_mechanism():
    """Guard against a grid that silently stops testing something."""
    lat = LATENCIES["constant"]
    def statuses(name):
        stream = fastsim.sample_requests(scenario(GRID[name], lat), seed=2024)
        return fastsim.simulate_requests(scenario(GRID[name], lat), stream)
    assert statuses("fcfs-tight-kv")["num_preemptions"].sum() > 0
    assert statuses("priority-tight-kv")["num_preemptions"].sum() > 0
    assert (statuses("loss-system")["status"] == "rejected_admission").any()
    assert (statuses("kv-reservation")["status"] == "rejected_admission").any()
    assert (statuses("abandonment")["status"] == "dropped").any()
    assert (statuses("max-model-len")["status"] == "rejected_too_long").any()


@pytest.mark.parametrize("seed", range(5))
def test_agreement_with_bursty_arrivals_and_a_horizon(seed):
    sc = scenario({"policy": ["fcfs", "priority", "sjf"][seed % 3]}, LATENCIES["full"], horizon_s=15.0,
                  burstiness=0.3)
    out = assert_same(sc, seed=seed, replication=seed)
    assert (out["status"] == "unfinished").any() or (out["status"] == "completed").all()


@pytest.mark.parametrize("name", ["fcfs-tight-kv", "kv-reservation", "abandonment", "static"])
def test_replicate_backends_agree_on_every_metric(name):
    """Whole replications: the reference backend computes its metrics in
    NumPy from per-request output, independently of the kernel's reduction."""
    sc = scenario(GRID[name], LATENCIES["a10g"])
    fast = fastsim.replicate(sc, n_replications=3, seed=8).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=8, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)


def test_backends_agree_when_the_horizon_ends_arrivals_within_the_warm_up():
    """Fewer arrivals than warmup_requests before the horizon: nothing is
    measured (n_measured 0, per-request rates NaN) in both backends."""
    sc = scenario({}, LATENCIES["constant"], horizon_s=0.5)   # ~4 arrivals at 8 req/s, 10 warm-up
    fast = fastsim.replicate(sc, n_replications=3, seed=1).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=1, backend="reference").per_replication
    assert (fast["n_arrived"] < 10).all() and (fast["n_measured"] == 0).all()
    assert fast["preemptions_per_request"].isna().all()
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("engine", [
    {"admission": "queue_limit", "max_waiting": 1, "max_num_seqs": 3},
    {"admission": "kv_reservation", "num_gpu_blocks": 8},
    {"max_queue_delay_s": 0.5, "max_num_seqs": 2},
], ids=["queue-limit", "kv-reservation", "abandonment"])
def test_agreement_when_arrivals_fall_exactly_on_step_boundaries(engine):
    """Ties between an arrival and a step end: the arrival must be ingested after
    that step's completions (docs/engine-model.md). A power-of-two step keeps
    every time exact, so ties really happen."""
    rng = np.random.default_rng(7)
    n = 400
    times = np.cumsum(rng.integers(0, 3, n)) * 0.125
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(**{**BASE_ENGINE, **engine}),
        workload=fastsim.Workload(arrival_rate=None, arrival_times=times, prompt_len=fastsim.Uniform(1, 40),
                                  output_len=fastsim.Uniform(1, 6)),
        latency=fastsim.LatencyModel.constant(0.125))
    out = assert_same(sc, seed=1)
    assert out["status"].isin(["rejected_admission", "dropped"]).any()
