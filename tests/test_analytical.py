"""fastsim.analytical: exact reductions of the chain and monotonicity of predictions."""

import numpy as np
import pandas as pd
import pytest

import fastsim
from conftest import SYNC, Z, within
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
    engine = {**SYNC, **engine}
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


@pytest.mark.parametrize("admission", ["none", "kv_reservation"])
@pytest.mark.parametrize("model", ["birth_death", "knapsack"])
def test_blocking_is_a_probability(model, admission):
    """Blocking sums non-negative terms (``1 - lam_eff / lam`` rounded below 0),
    also for fixed lengths (whose fit probability can round above 1), and
    is exactly 0 without admission control when every request fits."""
    for lam in (0.2, 1.0, 3.0):
        sc = scenario(lam=lam, c=8, kv=2048).replace(**{"engine.admission": admission})
        assert 0.0 <= predict(sc, model=model).loc["blocking_probability", "estimate"] <= 1.0
        fixed = sc.replace(**{"workload.prompt_len": 1, "workload.output_len": 1})
        blocking = predict(fixed, model=model).loc["blocking_probability", "estimate"]
        assert (blocking == 0.0) if admission == "none" else (0.0 <= blocking <= 1.0)


def test_blocking_without_admission_control_is_the_too_long_fraction():
    """With admission="none" only requests that never fit (here: longer than
    max_model_len) are refused, in every state: the simulation's estimate of
    their fraction must cover the prediction."""
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=16, max_model_len=600, **SYNC),
                          workload=fastsim.Workload(arrival_rate=1.0, num_requests=400,
                                                    prompt_len=fastsim.LogNormal(median=200, sigma=0.8),
                                                    output_len=fastsim.LogNormal(median=100, sigma=0.8)))
    pred = predict(sc).loc["blocking_probability", "estimate"]
    x = fastsim.replicate(sc, n_replications=40).per_replication["blocking_probability"]
    assert 0.05 < pred < 0.5
    # 40 replications: the ratio is t with 39 dof, whose two-sided 1e-6 point is 5.79 (Z = 5 would fail 1.3e-5)
    within(x.mean(), pred, x.std(ddof=1) / np.sqrt(x.size), z=5.8)


def roughly(prediction, summary, metric, bias_rel=0.0, bias_abs=0.0):
    """A model's prediction agrees with the simulation's estimate within a bound on the model's bias
    (``bias_rel`` of the estimate plus ``bias_abs``) plus Z standard errors of the estimate."""
    sim, se = summary.loc[metric, "estimate"], summary.loc[metric, "std_error"]
    bound = bias_rel * sim + bias_abs + Z * se
    assert abs(prediction - sim) <= bound, (
        f"{metric}: predicted {prediction:.6g}, simulated {sim:.6g} +- {se:.3g}; allowed {bound:.3g}")


# The models below are approximations: how far off they are was measured with 20,000 replications; the
# bounds are about twice that. The noise term is Z standard errors of 200 replications (t with 199 dof:
# 1.3e-6 two-sided even with the bias at its bound); with the measured biases the failure point lies 7.6 or
# more standard deviations of the 200-replication mean away (0 failures in 100 fresh seeds each).


def test_light_load_matches_simulation_roughly():
    # the knapsack model is 0.4% high in ttft_mean here and within 0.0001 of the blocking (0.028)
    sc = scenario(lam=0.5, c=8, kv=2048)
    sim = fastsim.replicate(sc, n_replications=200, seed=0).summary()
    est = predict(sc, model="knapsack")["estimate"]
    roughly(est["ttft_mean"], sim, "ttft_mean", bias_rel=0.01)
    roughly(est["blocking_probability"], sim, "blocking_probability", bias_abs=0.001)


@pytest.mark.parametrize("change", [{"engine.policy": "sjf"}, {"engine.scheduler": "static"},
                                    {"engine.max_queue_delay_s": 1.0}, {"workload.burstiness": 0.5},
                                    {"engine.async_scheduling": True}])
def test_unsupported_features_raise(change):
    with pytest.raises(ValueError, match="cannot represent"):
        predict(scenario().replace(**change))


def test_unknown_model():
    with pytest.raises(ValueError, match="model must be one of"):
        predict(scenario(), model="nope")


# ----------------------------------------------------------------------------
# The KV chain (model "ctmc")

from fastsim.analytical import KVChain, kv_ctmc  # noqa: E402


def kaufman_roberts(arrival_rates, mean_services, sizes, capacity):
    """Per-class blocking of the stochastic knapsack (independent recursion, for reference)."""
    q = np.zeros(capacity + 1)
    q[0] = 1.0
    for j in range(1, capacity + 1):
        q[j] = sum(lam * tau * s * q[j - s] for lam, tau, s in zip(arrival_rates, mean_services, sizes)
                   if j >= s) / j
    q /= q.sum()
    return np.array([q[capacity - s + 1:].sum() for s in sizes])


@pytest.mark.parametrize("method", ["levels", "spsolve"])
@pytest.mark.parametrize("c,N,lam", [(1, 6, 0.7), (1, 6, 1.6), (3, 10, 2.5), (4, 4, 3.0), (10, 10, 6.0)])
def test_kv_chain_one_size_is_mmcn(method, c, N, lam):
    # every request reserves one unit: the chain is M/M/c/N (Erlang-B when c = N)
    ch = kv_ctmc(lam, [0.0, 1.0], N, c, [0.0, 1.0], method=method)
    assert isinstance(ch, KVChain)
    ref = mmc_stationary(lam, 1.0, c, N)
    np.testing.assert_allclose(ch.level_pi, ref, rtol=1e-9, atol=1e-14)
    assert ch.blocking == pytest.approx(ref[-1], rel=1e-9)
    if c == N:
        assert ch.blocking == pytest.approx(erlang_b(N, lam), rel=1e-9)
    if c == 1:
        rho = lam
        np.testing.assert_allclose(ch.level_pi, rho ** np.arange(N + 1) / np.sum(rho ** np.arange(N + 1)),
                                   rtol=1e-9)
    assert ch.throughput == pytest.approx(lam * (1 - ref[-1]), rel=1e-9)


def test_kv_chain_loss_system_is_kaufman_roberts():
    # several sizes, enough slots for everything that fits: the product form, per class
    lam = 3.0
    p = np.array([0, 0.5, 0.0, 0.3, 0.0, 0.2])
    tau = np.array([0, 1.0, 0.0, 2.0, 0.0, 0.5])
    L = 12
    ch = kv_ctmc(lam, p, L, L, tau)
    sizes = [1, 3, 5]
    ref = kaufman_roberts(lam * p[sizes], tau[sizes], sizes, L)
    np.testing.assert_allclose(ch.class_blocking[sizes], ref, rtol=1e-9)
    assert ch.blocking == pytest.approx(float(p[sizes] @ ref), rel=1e-9)
    acc = p * (1 - ch.class_blocking[: p.size])
    np.testing.assert_allclose(ch.accepted_pmf[: p.size], acc / acc.sum(), rtol=1e-9)
    # insensitivity: Erlang phases of the service do not change a loss system
    ch3 = kv_ctmc(lam, p, L, L, tau, phases=3)
    assert ch3.blocking == pytest.approx(ch.blocking, rel=1e-8)


def test_kv_chain_phases_give_pollaczek_khinchine():
    # one size, one slot, Erlang-m service, a buffer too large to bind: M/E_m/1
    lam, m = 0.6, 3
    ch = kv_ctmc(lam, [0.0, 1.0], 200, 1, [0.0, 1.0], phases=m)
    rho, scv = lam, 1.0 / m
    mean_n = rho + rho ** 2 * (1 + scv) / (2 * (1 - rho))
    assert ch.level_pi @ np.arange(ch.level_pi.size) == pytest.approx(mean_n, rel=1e-8)
    assert ch.level_pi[0] == pytest.approx(1 - rho, rel=1e-8)


@pytest.mark.parametrize("c,phases", [(1, 1), (1, 3), (2, 1), (3, 2)])
def test_kv_chain_stationary_and_balance(c, phases):
    p = np.zeros(9)
    p[[2, 3, 5, 8]] = [0.4, 0.3, 0.2, 0.05]        # 5% never fits (mass missing)
    tau = np.where(p > 0, 0.5 + 0.1 * np.arange(9), 0.0)
    ch = kv_ctmc(1.7, p, 16, c, tau, phases=phases, max_in_system=8)
    assert ch.pi.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(ch.pi >= 0)
    assert np.abs(ch.pi @ ch.generator).max() < 1e-10
    assert np.allclose(np.asarray(ch.generator.sum(axis=1)).ravel(), 0.0, atol=1e-9)
    sp = kv_ctmc(1.7, p, 16, c, tau, phases=phases, max_in_system=8, method="spsolve")
    np.testing.assert_allclose(sp.pi, ch.pi, atol=1e-10)
    assert np.all(ch.used <= 16) and ch.n.max() <= 8
    # the lumped birth-death chain has the level law as its stationary law
    lumped = birth_death_stationary(ch.level_up[:-1], ch.level_down[1:])
    np.testing.assert_allclose(lumped, ch.level_pi, atol=1e-12)
    assert ch.blocking >= 0.05 - 1e-12                # the never-fitting share is always rejected
    assert np.all(np.diff(ch.class_blocking[1:17]) >= -1e-12)   # larger requests are rejected more


def test_kv_chain_one_size_monotone():
    # M/M/c/N: blocking falls with the buffer and rises with the load (one size, exact)
    for c in (1, 2, 4):
        by_cap = [kv_ctmc(2.0, [0, 0, 1.0], cap, c, [0, 0, 1.0]).blocking for cap in (4, 6, 10, 16, 30)]
        assert all(x > y for x, y in zip(by_cap, by_cap[1:]))
        by_rate = [kv_ctmc(lam, [0, 0, 1.0], 12, c, [0, 0, 1.0]).blocking for lam in (0.5, 1, 2, 4)]
        assert all(x < y for x, y in zip(by_rate, by_rate[1:]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(arrival_rate=0.0), "arrival_rate"),
    (dict(size_pmf=[0.1, 0.9]), r"size_pmf\[0\]"),
    (dict(size_pmf=[0.0, 0.8, 0.4]), "sum to <= 1"),
    (dict(size_pmf=[0.0, -0.1, 1.0]), "size_pmf"),
    (dict(capacity=0), "capacity"),
    (dict(servers=0), "servers"),
    (dict(phases=0), "phases"),
    (dict(mean_service=[1.0]), "mean_service"),
    (dict(mean_service=[0.0, 0.0, 1.0]), "mean_service"),
    (dict(method="dense"), "method"),
    (dict(max_in_system=0), "max_in_system"),
])
def test_kv_chain_rejects_bad_input(kwargs, match):
    args = dict(arrival_rate=1.0, size_pmf=[0.0, 0.5, 0.5], capacity=4, servers=1, mean_service=[0.0, 1.0, 1.0])
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        kv_ctmc(**args)


def test_ctmc_scenario_loss_system_is_erlang_b():
    # one block per request (P + O = block_size), more slots than blocks, constant steps:
    # the scenario's chain is Erlang's loss system with service O * step
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=4, block_size=16, admission="kv_reservation",
                                    **SYNC),
        workload=fastsim.Workload(arrival_rate=25.0, num_requests=2000, prompt_len=fastsim.Fixed(8),
                                  output_len=fastsim.Fixed(8)),
        latency=fastsim.LatencyModel.constant(0.01))
    est = predict(sc, model="ctmc")["estimate"]
    assert est["blocking_probability"] == pytest.approx(erlang_b(4, 25.0 * 8 * 0.01), rel=1e-9)
    # a single slot: no joiners, every decode step is the batch-of-one step
    assert est["tpot_p50"] == pytest.approx(0.01, rel=1e-9)
    assert est["itl_p99"] == pytest.approx(0.01, rel=1e-9)


def test_ctmc_predict_monotone_and_ordered():
    blk = [predict(scenario(lam=lam, c=1, kv=2048), model="ctmc")["estimate"] for lam in (0.5, 1, 2, 3)]
    b = [e["blocking_probability"] for e in blk]
    assert all(x <= y + 1e-12 for x, y in zip(b, b[1:]))
    by_kv = [predict(scenario(lam=1, c=c, kv=kv), model="ctmc")["estimate"]["blocking_probability"]
             for c in (1, 4) for kv in (2048, 4096, 8192)]
    for i in (0, 3):
        assert by_kv[i] >= by_kv[i + 1] - 1e-12 >= by_kv[i + 2] - 2e-12
    for e in blk:
        assert e["ttft_p50"] <= e["ttft_p95"] <= e["ttft_p99"]
        assert e["tpot_p50"] <= e["tpot_p99"]
        assert e["itl_p50"] <= e["itl_p99"]
        assert e["e2e_p50"] <= e["e2e_p99"]
        assert e["e2e_p99"] >= e["ttft_p99"]
        assert e["e2e_mean"] >= e["ttft_mean"]
        assert 0 <= e["blocking_probability"] <= 1


@pytest.mark.parametrize("model", ["birth_death", "knapsack", "ctmc"])
def test_decode_percentiles_defined(model):
    e = predict(scenario(lam=2, c=8, kv=8192), model=model)["estimate"]
    for m in ("tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99"):
        assert np.isfinite(e[m]) and e[m] > 0
    # joiners' prefill steps make some gaps longer than a decode step
    assert e["itl_p99"] > e["itl_p50"]
    assert e["tpot_p99"] > e["tpot_p50"]


def test_ctmc_mixed_regime_matches_simulation_roughly():
    # one slot and a 2048-token budget: the queue and the KV budget bind together
    # the CTMC model is 0.9% high in ttft_mean here and 0.006 high in the blocking (0.255; the former bound of
    # 0.02 on 20 replications was 4.1 standard deviations away, failing ~2e-5 of seeds)
    sc = scenario(lam=1.0, c=1, kv=2048)
    sim = fastsim.replicate(sc, n_replications=200, seed=0).summary()
    est = predict(sc, model="ctmc")["estimate"]
    roughly(est["blocking_probability"], sim, "blocking_probability", bias_abs=0.01)
    roughly(est["ttft_mean"], sim, "ttft_mean", bias_rel=0.02)


def test_ctmc_needs_kv_reservation():
    with pytest.raises(ValueError, match="cannot represent.*admission='queue_limit'"):
        predict(scenario().replace(**{"engine.admission": "queue_limit", "engine.max_waiting": 4}), model="ctmc")


def test_auto_model_picks_the_joint_chain_for_kv_reservation():
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=256, admission="kv_reservation", **SYNC),
        workload=fastsim.Workload(arrival_rate=2.0, prompt_len=fastsim.LogNormal(256, 0.55),
                                  output_len=fastsim.LogNormal(128, 0.7)))
    auto = predict(sc)["estimate"]
    ctmc = predict(sc, model="ctmc")["estimate"]
    pd.testing.assert_series_equal(auto, ctmc)


def test_multi_user_workloads_are_refused_by_name():
    sc = fastsim.Scenario(workload=fastsim.Workload.multi_user(8, requests_per_user=5, user_rate=0.2))
    with pytest.raises(ValueError, match="multi-user"):
        predict(sc)


@pytest.mark.parametrize("tol", [0.0, -1e-3, 1.0, float("nan"), "1e-9", True])
def test_kv_ctmc_validates_tol(tol):
    with pytest.raises(ValueError, match=r"tol must be a number in \(0, 1\), got"):
        kv_ctmc(1.0, [0.0, 1.0], 4, 1, [0.0, 1.0], tol=tol)


def test_one_seat_and_fixed_outputs_give_finite_laws():
    """One seat and fixed output lengths make the departures deterministic
    (SCV 0): the TTFT law's gamma had infinite shape, its CDF NaN (every
    percentile 0 with a divide-by-zero warning, or an IndexError in the E2E
    law). Found in stop 66's review; now an atom at its mean."""
    import warnings

    eng = fastsim.EngineConfig.synchronous(max_num_seqs=1, num_gpu_blocks=1000)
    lat = fastsim.LatencyModel.constant(1.0)
    for output_len, kw in ((10, {}), (1, {"admission": "kv_reservation"})):
        wl = fastsim.Workload(arrival_rate=0.05, num_requests=300, prompt_len=16, output_len=output_len)
        sc = fastsim.Scenario(engine=eng.replace(**kw), workload=wl, latency=lat)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            p = fastsim.analytical.predict(sc, model="knapsack" if kw else "auto")["estimate"]
        ttft = [p["ttft_p50"], p["ttft_p90"], p["ttft_p99"]]
        assert np.all(np.isfinite(ttft)) and ttft[0] > 0 and ttft[0] <= ttft[1] <= ttft[2]
        assert p["e2e_p50"] > 0 and p["e2e_p99"] >= p["ttft_p99"]
