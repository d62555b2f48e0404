"""Prefix caching by block hash (vLLM V1's, ``docs/engine-model.md``) in the
kernel (``fastsim/kernel/block_pool.py``): held to the reference simulator
bit for bit per request and on every metric, synchronous and with async
scheduling, with the full-input gate and the null block, shared prefixes,
tight KV (preemptions, re-admissions finding their own cached blocks), block
sizes 16 and 32, the priority policy; and the block pool's conservation
(queued + referenced = usable blocks, references = the running requests'
blocks, the cache table consistent) checked after every step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fastsim
import fastsim.kernel as K
from fastsim._config import EngineConfig
from fastsim._latency import LatencyModel
from fastsim._replicate import pack_scenario

from conftest import assert_same

HASH = dict(enable_prefix_caching=True, block_hash_caching=True)
BASE = dict(max_num_seqs=16, max_num_batched_tokens=256, block_size=16, num_gpu_blocks=64, **HASH)
V1 = dict(async_scheduling=True, scheduler_reserve_full_isl=True, null_block=True)

GRID = {
    "sync": {},
    "sync-gate-null-block": dict(scheduler_reserve_full_isl=True, null_block=True),
    "sync-tight": dict(num_gpu_blocks=36),
    "sync-block-32": dict(block_size=32, num_gpu_blocks=40),
    "sync-priority": dict(policy="priority"),
    "sync-priority-preemption": dict(policy="priority", priority_preemption=True),
    "sync-no-chunking": dict(enable_chunked_prefill=False, max_num_batched_tokens=512),
    "async": dict(async_scheduling=True),
    "v1-defaults": V1,
    "v1-tight": dict(V1, num_gpu_blocks=36),
    "v1-block-32": dict(V1, block_size=32, num_gpu_blocks=40),
    "v1-priority": dict(V1, policy="priority"),
    "v1-roomy": dict(V1, num_gpu_blocks=2000),
    "v1-no-chunking": dict(V1, enable_chunked_prefill=False, max_num_batched_tokens=512),
}


def scenario(engine, latency=None, groups=4, prefix_len=48, n=250, rate=8.0):
    extra = dict(prefix_groups=groups, prefix_len=prefix_len) if groups else {}
    return fastsim.Scenario(
        engine=EngineConfig(**{**BASE, **engine}),
        workload=fastsim.Workload(
            arrival_rate=rate, num_requests=n,
            prompt_len=fastsim.Mixture([fastsim.LogNormal(60, 0.8), fastsim.Uniform(150, 250)], [0.7, 0.3]),
            output_len=fastsim.LogNormal(40, 0.9), priorities=(0, 1, 2), priority_probs=(0.2, 0.3, 0.5),
            warmup_requests=10, **extra),
        latency=latency or LatencyModel.default())


LATENCIES = {"a10g": LatencyModel.default(),
             "full": LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3,
                                  prefill_per_token_s=3e-5, ctx_per_token_s=2e-7)}


@pytest.mark.parametrize("latency", list(LATENCIES))
@pytest.mark.parametrize("name", list(GRID))
def test_kernel_and_reference_agree_per_request(name, latency):
    sc = scenario(GRID[name], LATENCIES[latency])
    fast = assert_same(sc, seed=11)
    assert (fast["status"] == "completed").any()
    assert fast["cached_tokens"].sum() > 0   # prefixes were shared


@pytest.mark.parametrize("name", ["sync-tight", "v1-tight", "v1-block-32"])
def test_tight_kv_preempts_and_recomputed_requests_hit_their_own_blocks(name):
    # Without prefix groups every identity is a request's own: any hit is a
    # re-admitted request finding its blocks still cached. Its TTFT is then
    # shorter than with caching off (its prompt is not recomputed in full).
    sc = scenario(GRID[name], groups=0)
    stream = fastsim.sample_requests(sc, seed=5)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert fast["num_preemptions"].sum() > 20
    assert fast["cached_tokens"].sum() == 0   # (first admissions: nothing of theirs cached yet)
    off = fastsim.simulate_requests(
        sc.replace(**{"engine.enable_prefix_caching": False, "engine.block_hash_caching": False}), stream)
    assert not off["finish_s"].equals(fast["finish_s"])   # the re-admissions' hits change the run


@pytest.mark.parametrize("name", ["sync", "v1-defaults", "v1-tight"])
def test_replicate_backends_agree_on_every_metric(name):
    """Whole replications: the reference computes its metrics (time integrals,
    the prefix hit rate) from its own step log, independently of the kernel.
    (A latency without per-run effects: the reference's replications draw none.)"""
    sc = scenario(GRID[name], LATENCIES["full"])
    fast = fastsim.replicate(sc, n_replications=3, seed=8).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=8, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)
    assert (fast["prefix_hit_rate"] > 0).all()


def _simulate_checked(sc, stream):
    """Run the kernel on ``stream`` with the block pool's conservation checked
    after every step (``I_BLOCK_HASH`` = 2): `_simulate` returns -3 at the
    first step where it fails."""
    packed = pack_scenario(sc)
    ipar = packed["ipar"].copy()
    ipar[K.I_BLOCK_HASH] = 2
    a = np.array(stream["arrival_s"], dtype=np.float64)   # (writeable: a closed loop writes send times)
    stream = stream.assign(**{c: stream[c] if c in stream else v
                              for c, v in (("prefix_group", -1), ("prefix_len", 0))})
    cols = [np.array(stream[c], dtype=np.int64)   # (writeable: sessions write the turns they send)
            for c in ("prompt_len", "output_len", "priority", "output_len", "prefix_group", "prefix_len")]
    n = np.int64(a.size)
    ni, nf = K._ws_need(n, cols[0], cols[1], cols[4], cols[5], ipar)
    wi, wf = np.zeros(ni, np.int64), np.zeros(nf)
    rlat, rfpar = K.run_records(packed["lat"], packed["fpar"], np.uint64(0), np.uint64(0), 0)
    return K._simulate(n, a, *cols, ipar, rfpar, rlat, wi, wf, 1, np.inf, K.WHOLE_RUN)


@pytest.mark.parametrize("name", ["sync-tight", "v1-tight", "v1-block-32", "sync-priority-preemption"])
def test_blocks_are_conserved_after_every_step(name):
    sc = scenario(GRID[name])
    stream = fastsim.sample_requests(sc, seed=3)
    assert _simulate_checked(sc, stream) >= 0


@pytest.mark.parametrize("name", ["sync", "sync-tight", "sync-block-32", "sync-priority-preemption",
                                  "sync-no-chunking", "sync-gate-null-block"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_counted_pool_gives_the_reference_bits(name, seed):
    """Nothing shared, synchronous loop: the kernel counts the block pool (fast
    steps) until the first preemption, lays it out there and counts it again
    once no request in the system was ever preempted (`block_pool`)."""
    sc = scenario(dict(GRID[name], num_gpu_blocks=GRID[name].get("num_gpu_blocks", 64) - 8), groups=0, rate=10.0)
    stream = fastsim.sample_requests(sc, seed=seed)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert fast["num_preemptions"].sum() > 0
    assert _simulate_checked(sc, stream) >= 0


def test_nothing_shared_hits_nothing_on_first_admission():
    # Roomy KV, no prefix groups: no preemption, so no request ever finds a
    # block cached; the run is the run without caching, bit for bit.
    sc = scenario(dict(V1, num_gpu_blocks=4000), groups=0)
    stream = fastsim.sample_requests(sc, seed=2)
    on = fastsim.simulate_requests(sc, stream)
    off = fastsim.simulate_requests(
        sc.replace(**{"engine.enable_prefix_caching": False, "engine.block_hash_caching": False}), stream)
    assert on["num_preemptions"].sum() == 0
    pd.testing.assert_frame_equal(on, off, check_exact=True)


def _random_async_engine(rng):
    """An async engine with caching by block hash over random limits (block
    sizes 1-32, few to many seats, small token budgets that leave decoders
    unscheduled behind a long prompt's chunks, tight KV, gate, null block,
    chunking on and off, priority)."""
    bs = int(rng.choice([1, 2, 4, 16, 32]))
    eng = dict(max_num_seqs=int(rng.choice([2, 4, 16, 64])),
               max_num_batched_tokens=int(rng.choice([32, 64, 256, 2048])), block_size=bs,
               num_gpu_blocks=int(rng.integers(30, 400)) * (16 // min(bs, 16)), max_model_len=1024,
               async_scheduling=True, scheduler_reserve_full_isl=bool(rng.integers(2)),
               null_block=bool(rng.integers(2)), enable_chunked_prefill=bool(rng.integers(2)),
               policy=str(rng.choice(["fcfs", "priority"])), **HASH)
    if not eng["enable_chunked_prefill"]:
        eng["max_num_batched_tokens"] = max(eng["max_num_batched_tokens"], 1024)
    return eng


@pytest.mark.parametrize("case", range(40))
def test_counted_pool_under_async_scheduling_is_the_laid_out_pool(case):
    """Nothing shared: the pool is counted under async scheduling too, and
    laid out at the first preemption from the counts of cached blocks it kept
    (`block_pool._count_cached`), which vLLM's one-step-late caching makes
    differ from the token counts. Every request as the reference's explicit
    pool has it, over random engines (cases 12 and 35 fail if a lazy decoder's
    last computed token is counted as cached)."""
    rng = np.random.default_rng(1)
    for _ in range(case + 1):
        eng = _random_async_engine(rng)
        lat = LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5,
                           ctx_per_token_s=float(rng.choice([0, 2e-7])))
        rate = float(rng.choice([2, 8, 30]))
    sc = fastsim.Scenario(
        engine=EngineConfig(**eng),
        workload=fastsim.Workload(
            arrival_rate=rate, num_requests=200,
            prompt_len=fastsim.Mixture([fastsim.LogNormal(60, 0.8), fastsim.Uniform(150, 700)], [0.7, 0.3]),
            output_len=fastsim.LogNormal(40, 0.9), priorities=(0, 1, 2), priority_probs=(0.2, 0.3, 0.5)),
        latency=lat)
    stream = fastsim.sample_requests(sc, seed=case)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert _simulate_checked(sc, stream) >= 0
