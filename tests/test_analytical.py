"""fastsim.analytical: exact reductions of the chain and monotonicity of predictions."""

import numpy as np
import pytest

import fastsim
from fastsim._queueing import erlang_b
from fastsim.analytical import (birth_death_stationary, length_pmf, mm1_stationary, mmc_stationary,
                                predict)


def test_stationary_sums_to_one_and_balance():
    rng = np.random.default_rng(1)
    lam, mu = rng.uniform(0.1, 3, 20), rng.uniform(0.1, 3, 20)
    pi = birth_death_stationary(lam, mu)
    assert pi.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(pi[:-1] * lam, pi[1:] * mu, rtol=1e-10)


def test_mm1_geometric():
    lam, mu, N = 0.7, 1.0, 400
    pi = mm1_stationary(lam, mu, N)
    rho = lam / mu
    np.testing.assert_allclose(pi[:50], (1 - rho) * rho ** np.arange(50), rtol=1e-9)
    n = np.arange(N + 1)
    assert pi @ n / lam == pytest.approx(1 / (mu - lam), rel=1e-9)   # Little: E[T] = 1/(mu - lam)


def test_mmc_erlang_c():
    lam, mu, c = 3.0, 1.0, 4
    pi = mmc_stationary(lam, mu, c, 500)
    a, rho = lam / mu, lam / (c * mu)
    b = erlang_b(c, a)
    erlang_c = b / (1 - rho + rho * b)
    assert pi[c:].sum() == pytest.approx(erlang_c, rel=1e-9)
    lq = float(pi @ np.maximum(np.arange(pi.size) - c, 0))
    assert lq / lam == pytest.approx(erlang_c / (c * mu - lam), rel=1e-9)


@pytest.mark.parametrize("c,a", [(1, 0.9), (4, 3.0), (8, 6.0), (30, 25.0)])
def test_loss_system_is_erlang_b(c, a):
    pi = mmc_stationary(a, 1.0, c, c)
    assert pi[-1] == pytest.approx(erlang_b(c, a), rel=1e-10)


def test_stationary_rejects_bad_input():
    with pytest.raises(ValueError):
        birth_death_stationary([1.0], [0.0])
    with pytest.raises(ValueError):
        birth_death_stationary([1.0, 2.0], [1.0])


def test_length_pmf_moments():
    for d in (fastsim.LogNormal(median=128, sigma=0.7), fastsim.Uniform(low=3, high=9), fastsim.Fixed(value=5)):
        p = length_pmf(d)
        k = np.arange(p.size)
        assert p.sum() == pytest.approx(1.0)
        assert p @ k == pytest.approx(d.mean(), rel=1e-6)


def scenario(lam=1.0, c=4, kv=4096, **engine):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=c, num_gpu_blocks=kv // 16, admission="kv_reservation", **engine),
        workload=fastsim.Workload(arrival_rate=lam, num_requests=2000, warmup_requests=200,
                                  prompt_len=fastsim.LogNormal(median=256, sigma=0.55),
                                  output_len=fastsim.LogNormal(median=128, sigma=0.70)),
        latency=fastsim.LatencyModel.default())


@pytest.mark.parametrize("model", ["birth_death", "knapsack"])
def test_predict_frame_and_monotone(model):
    f = predict(scenario(), model=model)
    assert list(f.columns[:1]) == ["estimate"]
    for m in ("ttft_mean", "ttft_p50", "ttft_p95", "ttft_p99", "goodput", "blocking_probability"):
        assert np.isfinite(f.loc[m, "estimate"])
    e = f["estimate"]
    assert e["ttft_p50"] <= e["ttft_p95"] <= e["ttft_p99"]
    blk = [predict(scenario(lam=lam, c=8), model=model).loc["blocking_probability", "estimate"]
           for lam in (0.5, 1, 2, 3)]
    assert all(x <= y + 1e-12 for x, y in zip(blk, blk[1:]))
    blk = [predict(scenario(lam=2, c=8, kv=kv), model=model).loc["blocking_probability", "estimate"]
           for kv in (2048, 4096, 8192)]
    assert all(x >= y - 1e-12 for x, y in zip(blk, blk[1:]))


def test_light_load_matches_simulation_roughly():
    sc = scenario(lam=0.5, c=8, kv=2048)
    sim = fastsim.replicate(sc, n_replications=20, seed=0).summary()["estimate"]
    est = predict(sc, model="knapsack")["estimate"]
    assert est["ttft_mean"] == pytest.approx(sim["ttft_mean"], rel=0.1)
    assert abs(est["blocking_probability"] - sim["blocking_probability"]) < 0.02


@pytest.mark.parametrize("change", [{"engine.policy": "sjf"}, {"engine.scheduler": "static"},
                                    {"engine.max_queue_delay_s": 1.0}, {"workload.burstiness": 0.5}])
def test_unsupported_features_raise(change):
    with pytest.raises(ValueError, match="cannot represent"):
        predict(scenario().replace(**change))


def test_unknown_model():
    with pytest.raises(ValueError, match="model must be one of"):
        predict(scenario(), model="nope")
