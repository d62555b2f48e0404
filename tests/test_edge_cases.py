"""Regression tests for edge cases found in review: each used to hang,
mislead or fail."""

import warnings

import numpy as np
import pandas as pd
import pytest

import fastsim


def test_extreme_lognormal_never_draws_zero_tokens():
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=2000, prompt_len=fastsim.LogNormal(1, 1000)))
    assert fastsim.sample_requests(sc, seed=0)["prompt_len"].min() >= 1


def test_normalized_arrivals_with_extreme_burstiness_stay_finite():
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=5, burstiness=1e-4, normalize_arrivals=True,
                                                    prompt_len=4, output_len=2))
    for seed in range(10):
        assert np.isfinite(fastsim.sample_requests(sc, seed=seed)["arrival_s"]).all()
    res = fastsim.replicate(sc, 5, seed=0)   # and the kernel terminates
    assert (res.per_replication["n_completed"] == 5).all()


def test_lognormal_moments_are_exact_for_sigma_zero_and_cheap_for_heavy_tails():
    law = fastsim.LogNormal(256, 0.0)
    assert (law.mean(), law.second_moment()) == (256.0, 65536.0)
    # ceil(X) lies in [X, X + 1): its mean is E[X] + 1/2 up to rounding effects.
    heavy = fastsim.LogNormal(256, 2.0)
    assert heavy.mean() == pytest.approx(256 * np.exp(2.0) + 0.5, rel=1e-6)
    assert fastsim.Uniform(3, 40).second_moment() == pytest.approx(np.mean(np.arange(3, 41) ** 2.0))


def test_horizon_window_and_exhausted_buffer_warning():
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=5.0, num_requests=2000, horizon_s=30.0,
                                                    prompt_len=50, output_len=20))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = fastsim.replicate(sc, 4, seed=1)
    np.testing.assert_allclose(res.per_replication["window_s"], 30.0)
    small = sc.replace(**{"workload.num_requests": 50})
    with pytest.warns(RuntimeWarning, match="arrivals came before horizon_s=30.0"):
        fastsim.replicate(small, 4, seed=1)


def test_precision_on_a_constant_metric_is_met_at_once_and_on_nan_raises():
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=50, output_len=1))
    res = fastsim.replicate(sc, 10, seed=0, precision={"blocking_probability": 0.01}, max_replications=1000)
    assert res.n_replications == 10
    with pytest.raises(ValueError, match="precision metric 'tpot_mean' is undefined"):
        fastsim.replicate(sc, 10, seed=0, precision={"tpot_mean": 0.01})


def test_many_replications_need_no_max_replications():
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=1, prompt_len=1, output_len=1))
    assert fastsim.replicate(sc, 100_001, seed=0).n_replications == 100_001


def test_toml_named_preset_and_bad_combinations():
    sc = fastsim.Scenario.from_dict({"latency": {"preset": "a10g-qwen2.5-1.5b-deterministic"}})
    assert sc.latency == fastsim.LatencyModel.default()
    sc = fastsim.Scenario.from_dict({"latency": {"preset": "a10g-qwen2.5-1.5b"}})   # with its fitted noise
    assert sc.latency == fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b") and sc.latency.is_stochastic
    with pytest.raises(ValueError, match=r"preset cannot be combined with \['base_s'\]"):
        fastsim.Scenario.from_dict({"latency": {"preset": "default", "base_s": 0.01}})
    with pytest.raises(ValueError, match="name must be one of"):
        fastsim.Scenario.from_dict({"latency": {"preset": "h100"}})
    with pytest.raises(ValueError, match="needs column"):
        fastsim.Scenario.from_dict({"workload": {"prompt_len": {"dist": "empirical", "path": "x.csv"}}})


def test_simulate_requests_rejects_non_integer_priorities():
    sc = fastsim.Scenario()
    reqs = fastsim.sample_requests(sc.replace(**{"workload.num_requests": 5}), seed=0)
    reqs["priority"] = 1.7
    with pytest.raises(ValueError, match=r"requests\['priority'\] must hold integers"):
        fastsim.simulate_requests(sc, reqs)


def test_async_arrivals_no_schedule_saw_before_the_horizon_are_unfinished():
    # Found by test_fuzz (seed 15000): with async scheduling the run stops at the horizon before a
    # schedule sees the last arrivals; they arrived, so they are unfinished (from their arrival to
    # the end), in the kernel and the reference alike. (The kernel had left them pending, uncounted;
    # the reference, in no final state.)
    lengths = fastsim.LengthTrace(prompt_len=np.array([1]), output_len=np.array([1]), order="replay")
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=1, max_num_batched_tokens=1, block_size=1, num_gpu_blocks=2,
                                    enable_chunked_prefill=False, async_scheduling=True),
        workload=fastsim.Workload(arrival_rate=40.0, num_requests=50, lengths=lengths, horizon_s=1.0,
                                  normalize_arrivals=True),
        latency=fastsim.LatencyModel(base_s=0.007966691784345647, decode_scale_s=4.1233062523776856e-05,
                                     decode_alpha=1.148156986935774, prefill_per_token_s=6.738016205660655e-05,
                                     ttft_overhead_s=0.012487641921946478))
    stream = fastsim.sample_requests(sc, seed=15000, replication=1)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    last = fast.iloc[-1]
    assert last["arrival_s"] < 1.0 and last["status"] == "unfinished"
    assert not np.isfinite(last["first_token_s"])
    for backend in ("numba", "reference"):
        rows = fastsim.replicate(sc, n_replications=4, seed=15000, backend=backend).per_replication
        total = rows["n_completed"] + rows["n_rejected"] + rows["n_dropped"] + rows["n_unfinished"]
        np.testing.assert_array_equal(rows["n_arrived"], total)
        np.testing.assert_allclose(rows["time_in_system_integral"], rows["sojourn_sum"], rtol=1e-9, atol=1e-9)
    kernel = fastsim.replicate(sc, n_replications=4, seed=15000).per_replication
    reference = fastsim.replicate(sc, n_replications=4, seed=15000, backend="reference").per_replication
    for col in ("n_arrived", "n_completed", "n_unfinished", "end_s"):
        np.testing.assert_array_equal(kernel[col], reference[col])
