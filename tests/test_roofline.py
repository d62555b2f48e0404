"""Roofline step-time model: physical bounds, its parts, the fitted efficiencies and the
mapping onto the kernel's regression form."""

import json

import numpy as np
import pytest

import fastsim
from fastsim._roofline import _EFF, FAMILIES, Roofline, efficiencies


@pytest.fixture(scope="module")
def llama_h100():
    return fastsim.Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", max_model_len=8192)


def test_decode_step_bounded_by_weight_read(llama_h100):
    """One decode step reads every weight once: it cannot beat the datasheet bandwidth,
    and with the fitted efficiency it is within 1/eta_m (+ fixed latencies) of that bound."""
    r = llama_h100.roofline
    bound = llama_h100.weight_bytes_per_rank / llama_h100.gpu.bandwidth_bytes_s
    t = float(r.decode_step(1, 0))
    eta_m = r.eff["gemm"][1]
    assert bound < t < bound / eta_m * 1.1


def test_large_prefill_bounded_by_flops(llama_h100):
    r = llama_h100.roofline
    n = 8192
    flops = 2.0 * llama_h100.spec.num_parameters() * n
    t = float(r.step_time(0, 0, n, r.chunk_pairs(n)))
    assert t > flops / llama_h100.gpu.peak_flops()
    assert t < flops / (r.eff["gemm"][0] * llama_h100.gpu.peak_flops()) * 1.5


def test_decode_attention_is_linear_in_context(llama_h100):
    r = llama_h100.roofline
    t0, t1, t2 = (float(r.step_time(8, c)) for c in (1000, 5000, 9000))
    assert t2 - t1 == pytest.approx(t1 - t0, rel=1e-9)
    per_token = (t1 - t0) / 4000
    kv = llama_h100.kv_bytes_per_token
    assert per_token == pytest.approx(kv / (r.eff["gen_attn"][0] * llama_h100.gpu.bandwidth_bytes_s), rel=1e-9)


def test_tensor_parallel_and_moe():
    one = fastsim.Deployment(model="meta-llama/Llama-3.1-70B", gpu="H100", tensor_parallel_size=4, max_model_len=8192)
    two = fastsim.Deployment(model="meta-llama/Llama-3.1-70B", gpu="H100", tensor_parallel_size=8, max_model_len=8192)
    a, b = float(one.roofline.decode_step(1)), float(two.roofline.decode_step(1))
    assert 0.45 * a < b < a  # half the weights per rank, plus all-reduces
    moe = fastsim.Deployment(model="Qwen/Qwen3-30B-A3B", gpu="H100", max_model_len=8192).roofline
    # one token touches num_experts_per_tok experts, many tokens all of them: decode grows, then saturates
    t1, t8, t512 = (float(moe.decode_step(b)) for b in (1, 8, 512))
    assert t1 < t8 < t512 < 4 * t8


def test_efficiencies_file_and_leave_one_out():
    assert set(_EFF["gpus"]) == {"a100_sxm", "b200_sxm", "h100_sxm", "h200_sxm", "l40s"}
    for g, entry in _EFF["gpus"].items():
        for k in FAMILIES:
            p = entry[k]["params"]
            assert all(0 < v for v in p) and all(v <= 1.0 for v in p[:-1]), (g, k, p)
            fit, loo = entry[k]["fit"], entry[k]["leave_one_gpu_out"]
            assert fit["median_abs_rel_error"] <= loo["median_abs_rel_error"] + 0.05
    med = efficiencies(None)
    loo = efficiencies(None, exclude="h100_sxm")
    assert med.keys() == loo.keys() == set(FAMILIES)


def test_mapping_onto_kernel_form(llama_h100):
    lm = llama_h100.latency
    assert isinstance(lm, fastsim.LatencyModel)
    m = lm.calibration
    assert m.decode_max_abs_rel_error < 0.02  # decode without context: the fitted curve
    assert m.median_abs_rel_error < 0.15
    r = llama_h100.roofline
    b = np.array([1, 16, 128, 256])
    assert np.allclose(lm.step_time(b), r.decode_step(b), rtol=0.02)


def test_calibration_corrections_recover_known_values(llama_h100):
    r = llama_h100.roofline
    truth = Roofline(model=r.model, gpu=r.gpu, step_overhead_s=1.5e-3, per_seq_overhead_s=4e-5)
    b = np.array([1, 2, 4, 8, 16, 32, 64])
    fitted = r.calibrated(b, truth.decode_step(b, 100), 100)
    assert fitted.step_overhead_s == pytest.approx(1.5e-3, rel=1e-6)
    assert fitted.per_seq_overhead_s == pytest.approx(4e-5, rel=1e-6)


def test_deployment_latency_runs_in_the_kernel():
    dep = fastsim.Deployment(model="Qwen/Qwen2.5-1.5B-Instruct", gpu="A10G", max_num_seqs=32,
                             max_num_batched_tokens=2048, max_model_len=2048)
    sc = fastsim.Scenario(engine=dep.engine, latency=dep.latency,
                          workload=fastsim.Workload(arrival_rate=2.0, num_requests=50, prompt_len=200, output_len=50))
    res = fastsim.replicate(sc, n_replications=4, seed=0)
    # every TPOT is an average of step times with 1 to 32 sequences and at most one 200-token prefill
    lo = float(dep.latency.step_time(1))
    hi = float(dep.latency.step_time(32, 200, 32 * 250 + 200))
    assert lo <= res.estimate("tpot_mean") <= hi


def simulate_bench_roofline(rng, truth, *, n=300, noise=0.01, jitter_s=2e-5):
    """A `vllm bench serve --save-detailed` result from a continuous-batching engine whose step
    lasts ``truth.step_time(...)`` (times 1 + noise N(0, 1)): each step decodes every running
    request (its context: prompt + tokens so far) and prefills every waiting one in full."""
    rates = np.where(np.arange(n) < n // 4, 3.0, 30.0)
    arrivals = np.cumsum(rng.exponential(1.0 / rates))
    plen = rng.integers(16, 400, n)
    olen = rng.integers(2, 120, n)
    emitted = [[] for _ in range(n)]
    t, i, done, waiting, running = 0.0, 0, 0, [], []
    while done < n:
        while i < n and arrivals[i] <= t:
            waiting.append(i)
            i += 1
        if not running and not waiting:
            t = arrivals[i]
            continue
        ctx = sum(plen[r] + len(emitted[r]) for r in running)
        npf = int(sum(plen[r] for r in waiting))
        pairs = float(sum(truth.chunk_pairs(plen[r]) for r in waiting))
        d = float(truth.step_time(len(running), ctx, npf, pairs, len(waiting)))
        t += d * (1.0 + noise * rng.standard_normal())
        batch, running, waiting = running + waiting, [], []
        for r in batch:
            emitted[r].append(t)
            if len(emitted[r]) == olen[r]:
                done += 1
            else:
                running.append(r)
    ttfts, itls = [], []
    for r in range(n):
        e = np.asarray(emitted[r]) + jitter_s * rng.standard_normal(len(emitted[r]))
        ttfts.append(float(e[0] - arrivals[r]))
        itls.append(np.diff(e).tolist())
    return {"input_lens": plen.tolist(), "output_lens": olen.tolist(), "ttfts": ttfts, "itls": itls,
            "start_times": (arrivals + 100.0).tolist(), "errors": [""] * n}


# Over 40 seeds (two pooled runs of 300 requests, 1 % step noise, 20 us jitter) the errors were:
# step_overhead_s mean -0.4 us, sd 1.7 us, max 3.9 us; per_seq_overhead_s mean +0.93 us (a 1.5 % bias
# of the per-bin medians), sd 0.20 us, max 1.27 us. Tolerances: about 9 sd and |bias| + 10 sd.
TOL_OVERHEAD = 1.5e-5
TOL_PER_SEQ = 3e-6


def test_roofline_corrections_from_noise_free_bench_are_exact():
    """Without noise or jitter the rebuilt batches and contexts are the engine's own: exact recovery."""
    dep = fastsim.Deployment(model="Qwen/Qwen2.5-1.5B-Instruct", gpu="A10G", max_num_seqs=64,
                             max_num_batched_tokens=2048, max_model_len=2048)
    truth = Roofline.from_deployment(dep, step_overhead_s=1.3e-3, per_seq_overhead_s=6e-5)
    runs = [simulate_bench_roofline(np.random.default_rng([5, k]), truth, noise=0.0, jitter_s=0.0) for k in range(2)]
    fit = dep.roofline.calibrated_from_vllm_bench(runs)
    assert fit.step_overhead_s == pytest.approx(1.3e-3, rel=1e-9)
    assert fit.per_seq_overhead_s == pytest.approx(6e-5, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_roofline_corrections_from_vllm_bench(seed, tmp_path):
    dep = fastsim.Deployment(model="Qwen/Qwen2.5-1.5B-Instruct", gpu="A10G", max_num_seqs=64,
                             max_num_batched_tokens=2048, max_model_len=2048)
    truth = Roofline.from_deployment(dep, step_overhead_s=1.3e-3, per_seq_overhead_s=6e-5)
    paths = []
    for k in range(2):
        p = tmp_path / f"run{k}.json"
        p.write_text(json.dumps(simulate_bench_roofline(np.random.default_rng([seed, k]), truth)))
        paths.append(p)
    fit = dep.roofline.calibrated_from_vllm_bench(paths)
    assert fit.step_overhead_s == pytest.approx(1.3e-3, abs=TOL_OVERHEAD)
    assert fit.per_seq_overhead_s == pytest.approx(6e-5, abs=TOL_PER_SEQ)
    with pytest.raises(ValueError, match="start_times"):
        bad = json.loads(paths[0].read_text())
        del bad["start_times"]
        dep.roofline.calibrated_from_vllm_bench(bad)


def test_decode_attention_time_per_sequence(llama_h100):
    """The decode attention's fixed time per decoding sequence (fitted beside its KV read):
    the kernel's record holds it times the layers, and the step grows by it per decoder;
    an efficiency entry without it (two values) has none."""
    from dataclasses import replace

    from fastsim.kernel import layout as K

    r = llama_h100.roofline
    eta, t0, ts = r.eff["gen_attn"]
    assert 0 < ts < 1e-6
    L = llama_h100.spec.num_hidden_layers
    assert llama_h100.latency._params()[K.L_R_GA_SEQ] == pytest.approx(L * ts, rel=1e-12)
    old = replace(r, eff={**r.eff, "gen_attn": (eta, t0)})
    b = np.array([1.0, 8.0, 64.0])
    assert np.allclose(r.step_time(b, 1000 * b) - old.step_time(b, 1000 * b), L * ts * b, rtol=1e-9)
    assert old.to_kernel_latency()._params()[K.L_R_GA_SEQ] == 0.0
