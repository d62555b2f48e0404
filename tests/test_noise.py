"""Stochastic step times (``fastsim.StepNoise``): the kernel and the plain-Python
reference agree bit for bit with noise on; noise off is today's model; the
draws follow their laws; the single-run band and the mean's interval answer
their two questions."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import fastsim
from fastsim import kernel as K
from fastsim._reference_noise import run_latency

BASE = fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5,
                            ttft_overhead_s=0.01)
COV = np.diag([1e-8, 1e-10, 1e-3, 1e-11, 4e-6])
COV[0, 2] = COV[2, 0] = 2e-6   # correlated base and alpha
NOISES = {
    "jitter": fastsim.StepNoise(jitter_sd=0.05),
    "stalls": fastsim.StepNoise(jitter_sd=0.02, stall_prob=0.02, stall_mean_s=0.05),
    "per-run": fastsim.StepNoise(speed_log_mean=0.02, speed_sd=0.05, prefill_log_mean=-0.3, prefill_sd=0.3,
                                 overhead_sd=0.003),
    "calibration": fastsim.StepNoise(calibration_cov=COV),
    "all": fastsim.StepNoise(jitter_sd=0.03, stall_prob=0.01, stall_mean_s=0.03, speed_sd=0.03, prefill_sd=0.2,
                             overhead_sd=0.002, calibration_cov=COV),
}
ENGINES = {
    "tight-kv": dict(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48),
    "roomy": dict(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=5000),
    "swap": dict(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48,
                 preemption_mode="swap", swap_space_blocks=64),
}


def scenario(noise, engine="tight-kv", n=200, latency=BASE):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**ENGINES[engine]),
        workload=fastsim.Workload(arrival_rate=8.0, num_requests=n, prompt_len=fastsim.LogNormal(60, 0.8),
                                  output_len=fastsim.LogNormal(40, 0.9), warmup_requests=5),
        latency=dataclasses.replace(latency, noise=noise))


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("noise", list(NOISES))
def test_kernel_and_reference_agree_bit_for_bit_with_noise(noise, engine):
    sc = scenario(NOISES[noise], engine)
    for rep in (0, 3):
        stream = fastsim.sample_requests(sc, seed=11, replication=rep)
        fast = fastsim.simulate_requests(sc, stream, seed=11, replication=rep)
        ref = fastsim.simulate_requests(sc, stream, backend="reference", seed=11, replication=rep)
        pd.testing.assert_frame_equal(fast, ref, check_exact=True)
        assert (fast.status == "completed").sum() > 50


def test_replicate_runs_each_replication_with_its_own_draws():
    """replicate()'s replication r is simulate_requests(seed, replication=r)."""
    sc = scenario(NOISES["all"], n=120)
    res = fastsim.replicate(sc, 4, seed=5, n_threads=1)
    for rep in range(4):
        one = fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=5, replication=rep), seed=5,
                                        replication=rep)
        done = one.iloc[5:]   # the warm-up requests are not measured
        assert res.per_replication.ttft_mean[rep] == pytest.approx(done.ttft_s.mean(), rel=1e-12)


def test_noise_off_is_the_deterministic_model_bit_for_bit():
    """noise=None and a StepNoise with every effect 0 give today's bits; so does the
    preset's deterministic name against the model written out."""
    sc0 = scenario(None)
    r0 = fastsim.replicate(sc0, 6, seed=2, n_threads=1).per_replication
    r1 = fastsim.replicate(scenario(fastsim.StepNoise()), 6, seed=2, n_threads=1).per_replication
    pd.testing.assert_frame_equal(r0, r1, check_exact=True)
    det = fastsim.LatencyModel.deterministic_default()
    assert det.noise is None and not det.is_stochastic
    noisy = fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b")
    assert noisy.deterministic().base_s == det.base_s
    assert noisy.is_stochastic and not fastsim.LatencyModel.default().is_stochastic


def test_thread_count_and_chunking_do_not_change_noisy_results():
    sc = scenario(NOISES["all"], n=100)
    a = fastsim.replicate(sc, 8, seed=9, n_threads=1).per_replication
    b = fastsim.replicate(sc, 8, seed=9, n_threads=2, batch_size=3).per_replication
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_per_run_draws_follow_their_laws():
    """The per-run records over 4000 replications: the log speed factor is
    N(mu, sd^2) (seen in base_s, which has no calibration draw here), the
    overhead N(o, sd^2); Kolmogorov-Smirnov at alpha = 1e-3 (any seed)."""
    noise = fastsim.StepNoise(speed_log_mean=0.1, speed_sd=0.05, overhead_sd=0.002)
    lat = dataclasses.replace(BASE, noise=noise)
    arr, fpar = lat._params(), np.zeros(K.N_FPAR)
    fpar[K.F_TTFT_OVERHEAD] = BASE.ttft_overhead_s
    recs = [K.run_records(arr, fpar, 7, 8, r) for r in range(4000)]
    speed = np.log(np.array([r[0][K.L_BASE] for r in recs]) / BASE.base_s)
    over = np.array([r[1][K.F_TTFT_OVERHEAD] for r in recs])
    assert stats.kstest(speed, stats.norm(0.1, 0.05).cdf).pvalue > 1e-3
    assert stats.kstest(over, stats.norm(0.01, 0.002).cdf).pvalue > 1e-3


def test_calibration_draws_have_the_covariance():
    """The coefficients drawn per run have the given covariance: each sample
    variance within its chi-square 99.9 % interval, the base/alpha correlation
    within 4 standard errors."""
    noise = fastsim.StepNoise(calibration_cov=COV)
    lat = dataclasses.replace(BASE, noise=noise)
    arr, fpar = lat._params(), np.zeros(K.N_FPAR)
    fpar[K.F_TTFT_OVERHEAD] = BASE.ttft_overhead_s
    n = 4000
    recs = [K.run_records(arr, fpar, 1, 2, r) for r in range(n)]
    x = np.array([[r[0][K.L_BASE], r[0][K.L_DECODE_ALPHA], r[1][K.F_TTFT_OVERHEAD]] for r in recs])
    want = np.array([COV[0, 0], COV[2, 2], COV[4, 4]])
    var = x.var(axis=0, ddof=1)
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], n - 1) / (n - 1)
    assert np.all((var / want > lo) & (var / want < hi))
    rho = COV[0, 2] / np.sqrt(COV[0, 0] * COV[2, 2])
    assert abs(np.corrcoef(x[:, 0], x[:, 1])[0, 1] - rho) < 4 * (1 - rho ** 2) / np.sqrt(n)


def test_step_jitter_has_mean_one_and_the_stated_sd():
    """Per-step multipliers from the reference's statement of the draws
    (the kernel's are the same bits, test above): the log is N(-sd^2/2, sd^2),
    stalls happen at rate p."""
    noise = fastsim.StepNoise(jitter_sd=0.1, stall_prob=0.05, stall_mean_s=1000.0)
    _, steps = run_latency(dataclasses.replace(BASE, noise=noise), 3, 4, 0)
    d = np.array([steps.apply(1.0, k) for k in range(20000)])
    # a jitter of exp(0.69) is 7 sd away; a stall shorter than 1 s has probability 1e-3
    stalled = d > 2.0
    n = d.size
    assert abs(stalled.mean() - 0.05) < 4 * np.sqrt(0.05 * 0.95 / n) + 0.05 * 1e-3
    logs = np.log(d[~stalled])
    assert stats.kstest(logs, stats.norm(-0.005, 0.1).cdf).pvalue > 1e-3
    assert stats.kstest(d[stalled], stats.expon(scale=1000.0).cdf).pvalue > 1e-3


def test_band_and_interval_answer_two_questions():
    """The CI of the mean shrinks like 1/sqrt(n); the single-run band does not,
    and about 95 % of fresh runs fall in it (binomial 99.9 % bounds)."""
    sc = scenario(NOISES["all"], n=80)
    res = fastsim.replicate(sc, 400, seed=3, n_threads=1)
    more = fastsim.replicate(sc, 1600, seed=4, n_threads=1)
    s = res.summary()
    assert {"band_low", "band_high"} <= set(s.columns)
    band = res.prediction_band("tpot_mean")
    assert band.low == s.loc["tpot_mean", "band_low"]
    ci_ratio = more.confidence_interval("tpot_mean").half_width / res.confidence_interval("tpot_mean").half_width
    assert 0.35 < ci_ratio < 0.65
    band_ratio = more.prediction_band("tpot_mean").half_width / band.half_width
    assert 0.8 < band_ratio < 1.25
    inside = ((more.per_replication.tpot_mean >= band.low) & (more.per_replication.tpot_mean <= band.high)).mean()
    assert abs(inside - 0.95) < 3.3 * np.sqrt(0.95 * 0.05 / 1600) + 0.02   # + the band's own sampling error


def test_noise_is_validated():
    with pytest.raises(ValueError, match="jitter_sd"):
        fastsim.StepNoise(jitter_sd=-0.1)
    with pytest.raises(ValueError, match="stall_prob"):
        fastsim.StepNoise(stall_prob=1.0)
    with pytest.raises(ValueError, match="calibration_cov must be a finite symmetric 5 x 5"):
        fastsim.StepNoise(calibration_cov=np.eye(3))
    with pytest.raises(ValueError, match="positive semi-definite"):
        fastsim.StepNoise(calibration_cov=-np.eye(5))
    with pytest.raises(ValueError, match="noise must be None"):
        fastsim.LatencyModel(base_s=0.01, noise=3)
    assert fastsim.LatencyModel(base_s=0.01, noise={"jitter_sd": 0.1}).noise.jitter_sd == 0.1


def test_cuda_refuses_a_noisy_model():
    with pytest.raises(ValueError, match="backend='cuda' does not simulate a stochastic latency model"):
        fastsim.replicate(scenario(NOISES["jitter"]), 2, backend="cuda")


V1_OFF = dict(async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False,
              enable_prefix_caching=False, block_hash_caching=False)
V1_ON = dict(async_scheduling=True, scheduler_reserve_full_isl=True, null_block=True,
             enable_prefix_caching=True, block_hash_caching=True)
STRETCHES = {
    "roomy": dict(ENGINES["roomy"], **V1_OFF),
    "roomy-v1": dict(ENGINES["roomy"], **V1_ON),
    "few-blocks": dict(ENGINES["roomy"], num_gpu_blocks=90, **V1_OFF),
    "few-blocks-v1": dict(ENGINES["roomy"], num_gpu_blocks=90, **V1_ON),
}


@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("engine", list(STRETCHES))
def test_noisy_stretches_are_the_reference_bit_for_bit(engine, context):
    """Per-step noise in a stretch (`stretch._stretch_steps_noisy`): each
    step's noisy duration one by one, the time integrals from the clock, the
    KV integral from each step's start, the gaps from the clock's
    differences, a window edge inside a stretch (warm-up, horizon), with and
    without vLLM's V1 rules: every request as the reference has it, every
    metric of the replication, and Little's law."""
    lat = dataclasses.replace(BASE, ctx_per_token_s=2e-7 if context else 0.0,
                              noise=fastsim.StepNoise(jitter_sd=0.05, stall_prob=0.01, stall_mean_s=0.02,
                                                      speed_sd=0.03))
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(**STRETCHES[engine]),
        workload=fastsim.Workload(arrival_rate=3.0, num_requests=150, prompt_len=fastsim.LogNormal(60, 0.8),
                                  output_len=fastsim.LogNormal(120, 0.9), warmup_requests=7, horizon_s=40.0),
        latency=lat)
    for rep in (0, 2):
        stream = fastsim.sample_requests(sc, seed=4, replication=rep)
        fast = fastsim.simulate_requests(sc, stream, seed=4, replication=rep)
        ref = fastsim.simulate_requests(sc, stream, backend="reference", seed=4, replication=rep)
        pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    rows = fastsim.replicate(sc, 3, seed=4).per_replication
    ref_rows = fastsim.replicate(sc, 3, seed=4, backend="reference").per_replication
    pd.testing.assert_frame_equal(rows, ref_rows, check_exact=False, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rows["time_in_system_integral"], rows["sojourn_sum"], rtol=1e-9)
