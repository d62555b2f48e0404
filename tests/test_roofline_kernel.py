"""The roofline evaluated by the kernel (`fastsim.RooflineLatency`): the kernel and the
plain-Python reference simulator agree bit for bit, request by request, with the
roofline's step time (dense, MoE, tensor parallel; chunked prefill, no chunking, static
batching, swap, vLLM V1's rules on and off, per-step noise); the kernel's step time is
the roofline's; what cannot be simulated with it is refused."""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim._reference import _roofline_step_time
from fastsim.kernel import layout as K

from conftest import assert_same

V1_OFF = dict(async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False,
              enable_prefix_caching=False, block_hash_caching=False)
V1_ON = dict(async_scheduling=True, scheduler_reserve_full_isl=True, null_block=True,
             enable_prefix_caching=True, block_hash_caching=True)
BASE_ENGINE = dict(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48)

GRID = {
    "chunked-tight-kv": {},
    "no-chunking": {"enable_chunked_prefill": False, "max_num_batched_tokens": 512},
    "roomy-kv": {"num_gpu_blocks": 5000},
    "static": {"scheduler": "static", "num_gpu_blocks": 200},
    "swap": {"preemption_mode": "swap", "swap_space_blocks": 64},
}


@pytest.fixture(scope="module")
def deployments():
    kw = dict(max_num_seqs=12, max_num_batched_tokens=192)
    return {
        "dense": fastsim.Deployment(model="Qwen/Qwen2.5-1.5B-Instruct", gpu="A10G", **kw),
        "moe": fastsim.Deployment(model="Qwen/Qwen3-30B-A3B", gpu="H100-SXM", **kw),
        "tp2": fastsim.Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="L40S", tensor_parallel_size=2,
                                  **kw),
    }


def scenario(engine, latency, v1=V1_OFF, rate=8.0, groups=False):
    wl = dict(arrival_rate=rate, num_requests=200,
              prompt_len=fastsim.Mixture([fastsim.LogNormal(60, 0.8), fastsim.Uniform(150, 250)], [0.7, 0.3]),
              output_len=fastsim.LogNormal(40, 0.9), warmup_requests=10)
    if groups:
        wl.update(prefix_groups=4, prefix_len=64)
    return fastsim.Scenario(engine=fastsim.EngineConfig(**{**BASE_ENGINE, **v1, **engine}),
                            workload=fastsim.Workload(**wl), latency=latency)


@pytest.mark.parametrize("name", list(GRID))
def test_kernel_and_reference_agree_with_the_roofline(deployments, name):
    lat = deployments["dense"].latency
    if name == "swap":
        lat = dataclasses.replace(lat, swap_s_per_block=2e-4)
    sc = scenario(GRID[name], lat)
    out = assert_same(sc, seed=37)
    assert (out["status"] == "completed").sum() > 100


@pytest.mark.parametrize("model", ["moe", "tp2"])
@pytest.mark.parametrize("v1", ["off", "on"])
def test_kernel_and_reference_agree_moe_and_tensor_parallel(deployments, model, v1):
    sc = scenario({}, deployments[model].latency, V1_ON if v1 == "on" else V1_OFF, groups=v1 == "on")
    out = assert_same(sc, seed=38)
    assert (out["status"] == "completed").sum() > 100


def test_kernel_and_reference_agree_in_long_decode_stretches(deployments):
    """A light load: most steps are stretches of pure decode steps, whose clock the kernel
    takes in closed form (the context term linear in the step index)."""
    sc = scenario({"num_gpu_blocks": 5000}, deployments["dense"].latency, rate=1.0)
    assert_same(sc, seed=39)


@pytest.mark.parametrize("v1", ["off", "on"])
def test_kernel_and_reference_agree_with_long_prompts_in_chunks(deployments, v1):
    """Prompts of thousands of tokens taken in chunks of a few hundred: prefill steps whose
    chunks sit after long cached contexts (their KV read and their causal pairs both large),
    beside decoders."""
    wl = fastsim.Workload(arrival_rate=2.0, num_requests=60, prompt_len=fastsim.Uniform(1500, 4000),
                          output_len=fastsim.LogNormal(20, 0.5), warmup_requests=0)
    engine = fastsim.EngineConfig(**{**BASE_ENGINE, **(V1_ON if v1 == "on" else V1_OFF),
                                     "max_num_batched_tokens": 256, "num_gpu_blocks": 2000,
                                     "max_model_len": 8192})
    out = assert_same(fastsim.Scenario(engine=engine, workload=wl, latency=deployments["dense"].latency), seed=42)
    assert (out["status"] == "completed").sum() > 40


def test_kernel_and_reference_agree_with_per_step_noise(deployments):
    lat = dataclasses.replace(deployments["dense"].latency, noise=fastsim.StepNoise(jitter_sd=0.05))
    assert_same(scenario({}, lat), seed=40)


def test_the_roofline_changes_the_simulation(deployments):
    """Not the regression mapping under another name: the step times differ."""
    dep = deployments["dense"]
    sc = scenario({}, dep.latency)
    stream = fastsim.sample_requests(sc, seed=41)
    a = fastsim.simulate_requests(sc, stream)
    b = fastsim.simulate_requests(sc.replace(latency=dep.regression_latency), stream)
    done = (a["status"] == "completed") & (b["status"] == "completed")
    assert not np.array_equal(a.loc[done, "finish_s"], b.loc[done, "finish_s"])


@pytest.mark.parametrize("model", ["dense", "moe", "tp2"])
def test_record_step_time_is_the_roofline(deployments, model):
    """The kernel's record, evaluated as the reference does, is the roofline
    (`Roofline.step_time`: the same terms, the layers and scale folded into the
    coefficients; in decode steps exactly the same model)."""
    dep = deployments[model]
    lat, roof = dep.latency, dep.roofline
    rec = lat._params()
    for b in (1, 2, 7, 12):
        ctx = 300 * b
        want = float(roof.step_time(b, ctx))
        assert _roofline_step_time(rec, b, 0, ctx, 0, 0, 0) == pytest.approx(want, rel=1e-12)
        assert float(lat.step_time(b, 0, ctx)) == _roofline_step_time(rec, b, 0, ctx, 0, 0, 0)
    # a prefill chunk of s after k cached: its attention's FLOPs from the pairs, plus the
    # KV read of its k + s context tokens (the kernel's context term, the roofline's
    # prefill_context_tokens), at any context, short or long
    b, ctx = 3, 900
    for s, k in ((120, 64), (1, 0), (2048, 30000), (16, 100000)):
        pairs2 = s * (2 * k + s + 1)
        got = _roofline_step_time(rec, b, s, ctx + k + s, pairs2, 1, 0)
        want = float(roof.step_time(b, ctx, s, roof.chunk_pairs(s, k), 1, prefill_context_tokens=k + s))
        assert got == pytest.approx(want, rel=1e-12)
        assert float(lat.step_time(b, s, ctx + k + s, prefill_pairs2=pairs2, num_prefill_seqs=1)) == got
        # the chunk's context read is the decode attention's per-token cost, added to its FLOPs
        more = float(roof.step_time(b, ctx, s, roof.chunk_pairs(s, k), 1, prefill_context_tokens=k + s + 1000))
        assert more - want == pytest.approx(1000 * rec[K.L_CTX], rel=1e-9)


def test_moe_touches_the_expected_experts(deployments):
    """One token touches k experts, many tokens all E: the expert GEMMs' weight reads grow
    from k to E experts' worth."""
    rec = deployments["moe"].latency._params()
    e, k = rec[K.L_R_MOE_E], rec[K.L_R_MOE_K]
    spec = deployments["moe"].spec
    assert (e, k) == (spec.num_experts, spec.num_experts_per_tok)
    touched = [e * (1 - rec[K.L_R_MOE_Q] ** t) for t in (1, 4096)]
    assert touched[0] == pytest.approx(k, rel=1e-12)
    assert touched[1] == pytest.approx(e, rel=1e-9)


def test_tensor_parallel_adds_all_reduces(deployments):
    assert deployments["tp2"].latency._params()[K.L_R_AR_TOK] > 0
    assert deployments["dense"].latency._params()[K.L_R_AR_TOK] == 0


def test_per_run_noise_is_refused(deployments):
    with pytest.raises(ValueError, match="per-run effects"):
        dataclasses.replace(deployments["dense"].latency, noise=fastsim.StepNoise(speed_sd=0.05))


def test_regression_record_is_unchanged():
    """The regression model's record has the roofline off (the kernel takes its old branch)."""
    rec = fastsim.LatencyModel.default()._params()
    assert rec.size == K.N_LAT and rec[K.L_ROOF] == 0.0


def test_roofline_latency_is_hashable_and_compares_by_value(deployments):
    a = deployments["dense"].latency
    b = fastsim.Deployment(model="Qwen/Qwen2.5-1.5B-Instruct", gpu="A10G", max_num_seqs=12,
                           max_num_batched_tokens=192).latency
    assert a == b and hash(a) == hash(b)
    assert a != deployments["tp2"].latency


def test_deployment_latency_is_the_kernel_roofline(deployments):
    dep = deployments["dense"]
    assert isinstance(dep.latency, fastsim.RooflineLatency)
    assert type(dep.regression_latency) is fastsim.LatencyModel
    assert dep.latency.regression == dep.regression_latency
    # pure decode steps: the mapping is fitted to them, the roofline is them
    b = np.arange(1, 13)
    assert np.allclose(dep.latency.step_time(b, 0, 0), dep.roofline.decode_step(b, 0), rtol=1e-12)
