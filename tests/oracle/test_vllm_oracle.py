"""vLLM 0.22.0's own V1 scheduler as an oracle for fastsim (marker ``oracle``).

Every request's first-token time, finish time and preemption count must be
equal, bit for bit, between vLLM's scheduler (driven by ``vllm_harness``) and
fastsim's reference simulator, with each of the four V1 rules on and off, and
with fastsim's kernel where it supports the configuration. On a mismatch the
message names the first diverging step and the rule involved.

Needs the ``oracle`` environment (``bash tests/oracle/install.sh``); skipped
when vLLM cannot be imported.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fastsim
from fastsim import EngineConfig, LatencyModel, LogNormal, Scenario, Uniform, Workload

pytestmark = pytest.mark.oracle

vllm = pytest.importorskip("vllm", reason="vLLM 0.22.0 is not installed (bash tests/oracle/install.sh)")
if vllm.__version__ != "0.22.0":
    pytest.skip(f"the oracle is pinned to vLLM 0.22.0, found {vllm.__version__}", allow_module_level=True)

from vllm_harness import compare, first_divergence, reference_run, run_vllm  # noqa: E402

LATENCIES = {
    "a10g": LatencyModel.preset("a10g-qwen2.5-1.5b-deterministic"),
    # a context term, so that cached and recomputed tokens change step times
    "ctx": LatencyModel(base_s=0.008, decode_scale_s=4e-4, decode_alpha=1.2, prefill_per_token_s=3e-5,
                        ctx_per_token_s=2e-7),
}

_SHORT = dict(prompt_len=Uniform(8, 400), output_len=Uniform(1, 160))
_LONG = dict(prompt_len=Uniform(200, 3000), output_len=Uniform(1, 120))
_SHARED = dict(prefix_groups=4, prefix_len=Uniform(40, 600), prefix_popularity=0.5)

# name: (engine options, workload options, arrival rate)
SCENARIOS = {
    "loose_kv": (dict(num_gpu_blocks=2000), _SHORT, 6.0),
    "tight_kv": (dict(num_gpu_blocks=90), _SHORT, 12.0),
    "long_prompts_chunked": (dict(num_gpu_blocks=700, max_num_batched_tokens=512), _LONG, 1.5),
    "chunked_prefill_off": (dict(num_gpu_blocks=150, enable_chunked_prefill=False, max_num_batched_tokens=700),
                            dict(prompt_len=Uniform(8, 500), output_len=Uniform(1, 150)), 8.0),
    "block_size_32": (dict(num_gpu_blocks=60, block_size=32), _SHORT, 10.0),
    "priority": (dict(num_gpu_blocks=100, policy="priority"), _SHORT, 10.0),
    "shared_prefixes": (dict(num_gpu_blocks=400), {**_SHORT, **_SHARED, "prompt_len": Uniform(300, 900)}, 5.0),
    "shared_prefixes_tight": (dict(num_gpu_blocks=120), {**_SHORT, **_SHARED, "prompt_len": Uniform(300, 900)},
                              6.0),
    "few_seats": (dict(num_gpu_blocks=300, max_num_seqs=4, max_num_batched_tokens=256), _SHORT, 4.0),
    "lognormal_outputs": (dict(num_gpu_blocks=110),
                          dict(prompt_len=LogNormal(5.0, 0.8), output_len=LogNormal(4.0, 1.0)), 9.0),
}

# The four rules, each off alone, all on (vLLM 0.22's serving defaults), all off.
RULES = ("async_scheduling", "scheduler_reserve_full_isl", "enable_prefix_caching", "null_block")
MODES = {
    "vllm_defaults": dict.fromkeys(RULES, True),
    "sync_loop": dict.fromkeys(RULES, False),
    **{f"no_{r}": {**dict.fromkeys(RULES, True), r: False} for r in RULES},
}
# Replications per case: 3 (the suite's full run); FASTSIM_ORACLE_REPLICATIONS=1 in CI,
# which keeps every scenario, rule setting and latency model.
REPLICATIONS = int(os.environ.get("FASTSIM_ORACLE_REPLICATIONS", "3"))
NUM_REQUESTS = 100


def _engine(options, mode) -> EngineConfig:
    base = dict(max_num_seqs=16, max_num_batched_tokens=1024)
    base.update(options)
    base.update(mode)
    base["block_hash_caching"] = base["enable_prefix_caching"]
    return EngineConfig(**base)


def _stream(engine, latency, workload, rate, rep):
    workload = {"num_requests": NUM_REQUESTS, **workload}
    sc = Scenario(engine=EngineConfig(), latency=latency, workload=Workload(arrival_rate=rate, **workload))
    return fastsim.sample_requests(sc, seed=2026, replication=rep)


def _check(name, v, res, engine):
    c = compare(v, res["first_token_s"], res["finish_s"], res["num_preemptions"])
    if c["agree"] != c["n"]:
        div = first_divergence(v.batches, res["batches"], engine) if "batches" in res else "(kernel)"
        pytest.fail(f"{name}: {c['n'] - c['agree']} of {c['n']} requests differ (first: request "
                    f"{int(c['mismatch'][0])}); {div}")
    return c


@pytest.mark.parametrize("lat", sorted(LATENCIES))
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_reference_equals_vllm(scenario, mode, lat):
    options, workload, rate = SCENARIOS[scenario]
    engine = _engine(options, MODES[mode])
    latency = LATENCIES[lat]
    total = 0
    for rep in range(REPLICATIONS):
        req = _stream(engine, latency, workload, rate, rep)
        v = run_vllm(req, engine, latency)
        res = reference_run(req, engine, latency)
        _check(f"{scenario}/{mode}/{lat}/rep{rep}", v, res, engine)
        assert np.isfinite(v.finish_s).sum() > 0
        total += int(v.num_preemptions.sum())
    if scenario.startswith("tight") and mode == "sync_loop":
        assert total > 0      # the tight scenarios do preempt


#: The rule settings the kernel has: all of them (prefix caching by block hash included).
KERNEL_MODES = tuple(sorted(MODES))


@pytest.mark.parametrize("lat", sorted(LATENCIES))
@pytest.mark.parametrize("mode", KERNEL_MODES)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kernel_equals_vllm(scenario, mode, lat):
    """The kernel, with each rule on and off: vLLM's full defaults (async
    scheduling, the full-input gate, prefix caching by block hash, the null
    block), each rule off alone, and the synchronous loop."""
    options, workload, rate = SCENARIOS[scenario]
    engine = _engine(options, MODES[mode])
    latency = LATENCIES[lat]
    for rep in range(REPLICATIONS):
        req = _stream(engine, latency, workload, rate, rep)
        v = run_vllm(req, engine, latency)
        sim = fastsim.simulate_requests(Scenario(engine=engine, latency=latency, workload=Workload()), req)
        _check(f"{scenario}/kernel/{mode}/{lat}/rep{rep}", v, {k: sim[k].to_numpy() for k in
                                                           ("first_token_s", "finish_s", "num_preemptions")},
               engine)


def test_heavy_preemption_agrees():
    """A heavily overloaded KV cache: more preemptions than requests (the full-input
    gate off, which would prevent most of them; the other rules on)."""
    engine = _engine(dict(num_gpu_blocks=60, max_num_seqs=32), MODES["no_scheduler_reserve_full_isl"])
    latency = LATENCIES["a10g"]
    req = _stream(engine, latency, dict(prompt_len=Uniform(50, 300), output_len=Uniform(100, 400),
                                        num_requests=300), 30.0, 0)
    v = run_vllm(req, engine, latency)
    res = reference_run(req, engine, latency)
    _check("heavy_preemption", v, res, engine)
    assert v.num_preemptions.sum() >= len(req)


def test_trace_block_hashes_agree():
    """Prompts given as Mooncake-style hash lists (one hash per 64 tokens here)."""
    rng = np.random.default_rng(7)
    engine = _engine(dict(num_gpu_blocks=300), MODES["vllm_defaults"])
    latency = LATENCIES["ctx"]
    req = _stream(engine, latency, dict(prompt_len=Uniform(64, 700), output_len=Uniform(1, 100)), 6.0, 0)
    hashes = []
    for i, P in enumerate(req["prompt_len"]):
        m = -(-int(P) // 64)
        shared = int(rng.integers(0, m + 1))
        hashes.append([int(x) for x in rng.integers(0, 3, shared)] + [10_000 + 100 * i + j for j in range(m - shared)])
    v = run_vllm(req, engine, latency, block_hashes=hashes, hash_block_size=64)
    res = reference_run(req, engine, latency, block_hashes=hashes, hash_block_size=64)
    _check("trace_hashes", v, res, engine)
