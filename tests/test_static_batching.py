"""Static batching's decode steps taken O(1) each (`kernel.replica._static_decode`).

The fast path computes the slow step's terms in the slow step's order, so
the kernel must stay bit for bit equal to the plain-Python reference
simulator, request by request, in every situation the path meets: arrivals
and abandonment during a batch, admission limits, a horizon that ends a run
inside a batch, step noise (a per-step draw), warm-up requests whose gaps
are not recorded, chunked prefill off, a budget just the batch's size, and
a replica paused inside a batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._replicate import pack_scenario

from conftest import assert_same, kernel_as_python, patch_kernel

BASE = dict(scheduler="static", max_num_seqs=12, max_num_batched_tokens=512, num_gpu_blocks=300)

CASES = {
    "plain": {},
    "priority": {"policy": "priority"},
    "sjf-aging": {"policy": "sjf", "priority_aging_s": 2.0},
    "queue-limit": {"admission": "queue_limit", "max_waiting": 6},
    "kv-reservation": {"admission": "kv_reservation", "num_gpu_blocks": 120},
    "abandonment": {"max_queue_delay_s": 1.5},
    "no-chunking": {"enable_chunked_prefill": False},
    "budget-of-the-batch": {"max_num_batched_tokens": 12},   # one token a member: prefill in 12-token chunks
    "max-model-len": {"max_model_len": 300},
}

LATENCIES = {
    "a10g": fastsim.LatencyModel.default(),
    "context": fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3,
                                    prefill_per_token_s=3e-5, ctx_per_token_s=2e-7),
    "noise": dataclasses.replace(fastsim.LatencyModel.default(),
                                 noise=fastsim.StepNoise(jitter_sd=0.1, stall_prob=0.01, stall_mean_s=0.05)),
}


def scenario(engine, latency, horizon_s=None, warmup=10):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**{**BASE, **engine}),
        workload=fastsim.Workload(
            arrival_rate=6.0, num_requests=200, horizon_s=horizon_s, warmup_requests=warmup,
            prompt_len=fastsim.LogNormal(60, 0.8), output_len=fastsim.LogNormal(40, 1.0),
            priorities=(0, 1, 2), priority_probs=(0.2, 0.3, 0.5)),
        latency=latency, ttft_slo_s=0.5, tpot_slo_s=0.05)


@pytest.mark.parametrize("latency", list(LATENCIES))
@pytest.mark.parametrize("name", list(CASES))
def test_static_batching_agrees_with_the_reference_request_by_request(name, latency):
    out = assert_same(scenario(CASES[name], LATENCIES[latency]), seed=7)
    assert (out["status"] == "completed").any()


@pytest.mark.parametrize("seed", range(4))
def test_a_horizon_inside_a_batch(seed):
    """The run ends while a batch decodes: its members are unfinished, their
    counts and last-token times as the slow steps would have left them."""
    out = assert_same(scenario({}, LATENCIES["context"], horizon_s=12.0 + seed), seed=seed)
    assert (out["status"] == "unfinished").any()


def test_whole_replications_agree_with_the_reference_backend():
    """The run-level figures too (inter-token gaps entered per step, not per
    member; time integrals; steps), to the reference's NumPy rounding."""
    sc = scenario({"max_queue_delay_s": 3.0}, LATENCIES["context"])
    fast = fastsim.replicate(sc, n_replications=3, seed=4).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=4, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)


def test_a_replica_paused_inside_batches_gives_the_bits_of_one_call():
    """Paused at random times (inside the fast path's runs, and at their
    edges), a replica gives the per-request results of one call."""
    sc = scenario({}, LATENCIES["context"], warmup=0)
    p = pack_scenario(sc)
    stream = K.draw_workload(0, 1, 2, *K.scenario_arrays(p, lat=False))
    whole = K.simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])
    rng = np.random.default_rng(3)
    end = float(whole[2][np.isfinite(whole[2])].max())
    replica = K.drivers.Replica(*stream, p["ipar"], p["fpar"], p["lat"])
    for t in np.sort(rng.uniform(0.0, end, 200)):
        replica.advance_until(t)
    replica.advance_until(np.inf)
    parts = replica.finish()
    for a, b in zip(parts[:-1], whole[:-1]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(parts[-1], whole[-1])


def test_the_fast_path_takes_most_steps():
    """Run as Python (NumPy bounds-checks every access), the fast path takes
    most of a static run's steps, and the results are the compiled kernel's."""
    sc = scenario({}, LATENCIES["a10g"], warmup=0).replace(**{"workload.num_requests": 60})
    p = pack_scenario(sc)
    ipar, fpar, lat = p["ipar"], p["fpar"], p["lat"]
    stream = K.draw_workload(0, 1, 2, *K.scenario_arrays(p, lat=False))
    compiled = K.simulate_stream(*stream, ipar, fpar, lat)
    n = np.int64(stream[0].size)
    taken = []
    row = np.empty(K.N_COLUMNS)
    with kernel_as_python() as mp:
        inner = K.replica._static_decode   # (its Python version)

        def counting(*args):
            out = inner(*args)
            taken.append(out.acc5[4] - args[7].acc5[4])   # steps counted in the accumulators (`Loop`)
            return out

        patch_kernel(mp, "_static_decode", counting)
        need_i, need_f = K.workspace._ws_need(n, stream[1], stream[2], stream[5], stream[6], ipar)
        wi, wf = np.zeros(need_i, np.int64), np.zeros(need_f)
        K.replica._simulate(n, *stream, ipar, fpar, lat, wi, wf, 1, np.inf, K.WHOLE_RUN)
        K.metrics._reduce(n, stream[0], stream[2], ipar, fpar, wi, wf, row)
    np.testing.assert_array_equal(row, compiled[-1])
    steps = row[list(K.COLUMNS).index("n_steps")]
    assert sum(taken) > 0.5 * steps, (sum(taken), steps)
