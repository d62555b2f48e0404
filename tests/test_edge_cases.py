"""Regression tests for edge cases found in review: each used to hang,
mislead or fail."""

import warnings

import numpy as np
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
