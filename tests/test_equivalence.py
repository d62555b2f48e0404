"""Statistical equivalence: the harness in ``fastsim/testing.py``, and the fast
kernel against the pure-Python reference simulator as *distributions* of
whole-replication metrics.

``tests/test_reference_agreement.py`` shows that the two backends agree bit
for bit on identical request streams. The tests here are the complementary,
black-box check a refactoring or a new backend would use: independent
replications (different seeds) of each backend, compared metric by metric with
a Welch t-test and a Kolmogorov-Smirnov test, Holm-corrected over all metric x
test pairs. Every assertion has a family-wise false-alarm probability of at
most ``ALPHA`` = 1e-6, and every check that a difference *is* found has a
power short of 1 by less than that, so the suite passes for any seed; seeds
are drawn fresh on every run and printed on failure.
"""

import functools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import fastsim
from fastsim.testing import adjust_pvalues, assert_equivalent, assert_matches_theory, compare_results

# Family-wise false-alarm probability of one equivalence assertion (at 1e-4, the five in a
# default run could fail up to 5e-4 of fresh runs together).
ALPHA = 1e-6


def fresh_seed():
    return int(np.random.SeedSequence().entropy % 2**63)


def replicate(sc, n, backend="numba", seed=None):
    seed = fresh_seed() if seed is None else seed
    return fastsim.replicate(sc, n_replications=n, seed=seed, backend=backend, n_threads=1)


def check_equivalent(a, b, **kw):
    try:
        return assert_equivalent(a, b, **kw)
    except AssertionError as err:
        raise AssertionError(f"seeds {a.seed} ({a.backend}) vs {b.seed} ({b.backend}):\n{err}")


# ------------------------------------------------------------------------------
# The harness on the kernel

def queueing_scenario(rate):
    """Four seats near saturation: TTFT is dominated by queueing."""
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, num_gpu_blocks=400),
        workload=fastsim.Workload(arrival_rate=rate, num_requests=300, prompt_len=fastsim.LogNormal(100, 0.6),
                                  output_len=fastsim.LogNormal(60, 0.7), warmup_requests=20),
        ttft_slo_s=1.0, tpot_slo_s=0.05)


def test_same_scenario_with_different_seeds_is_equivalent():
    sc = queueing_scenario(6.0)
    a, b = replicate(sc, 100), replicate(sc, 100)
    table = check_equivalent(a, b, alpha=ALPHA)
    assert list(table.index) == list(fastsim.METRIC_DESCRIPTIONS)
    assert (table.loc[["blocking_probability", "drop_probability"], "status"] == "constant_equal").all()
    assert (table.loc["ttft_mean", "status"] == "tested") and table.attrs["n_tests"] >= 2 * 18


def test_a_ten_percent_higher_arrival_rate_is_detected_in_ttft_mean():
    # Power: with 300 replications a side, Welch's t on ttft_mean had mean 12.8 and SD 1.05 over
    # 200 fresh pairs (minimum 10.0); ALPHA after Holm over 38 tests needs |t| > 5.6, 6.8 SDs
    # below the mean. With 100 a side (mean 7.3) 6-7% of pairs went undetected, and at least 1 in
    # 300 at the old ALPHA of 1e-4 (largest adjusted p 10^-2.5).
    a, b = replicate(queueing_scenario(6.0), 300), replicate(queueing_scenario(6.6), 300)
    with pytest.raises(AssertionError, match="ttft_mean") as info:
        assert_equivalent(a, b, alpha=ALPHA)
    msg = str(info.value)
    line = next(s for s in msg.splitlines() if s.strip().startswith("ttft_mean:"))
    for part in ("a=", "b=", "difference=", "%", "p_welch=", "p_ks=", "adj"):
        assert part in line
    table = compare_results(a, b, alpha=ALPHA)
    assert table.loc["ttft_mean", "difference"] > 0 and not table.loc["ttft_mean", "equivalent"]
    assert table.loc["ttft_mean", "relative_difference"] == pytest.approx(
        table.loc["ttft_mean", "difference"] / table.loc["ttft_mean", "estimate_a"])


def test_assert_matches_theory_on_md1_mean_ttft():
    """M/D/1 (one seat, constant step, 1-token prompts): TTFT = Wq + d."""
    d, o, rho = 0.01, 10, 0.7
    lam = rho / (o * d)
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=1),
                          workload=fastsim.Workload(arrival_rate=lam, num_requests=2000, prompt_len=1,
                                                    output_len=o, warmup_requests=200),
                          latency=fastsim.LatencyModel.constant(d))
    res = replicate(sc, 200)
    truth = lam * (o * d) ** 2 / (2 * (1 - rho)) + d
    assert abs(assert_matches_theory(res, "ttft_mean", truth)) <= 5
    assert assert_matches_theory(res, "tpot_mean", d) == 0.0  # constant per replication
    with pytest.raises(AssertionError, match="standard errors"):
        assert_matches_theory(res, "ttft_mean", truth * 1.2)
    with pytest.raises(AssertionError, match="tpot_mean: estimate"):
        assert_matches_theory(res, "tpot_mean", 1.01 * d)


# ------------------------------------------------------------------------------
# The harness on synthetic data

def synthetic(rng, n, shift=0.0):
    """Per-replication-like columns: smooth, skewed, discrete with ties, a
    proportion, constant, partly NaN, NaN only."""
    tpot = rng.normal(0.05, 0.01, n)
    tpot[rng.random(n) < 0.2] = np.nan
    return pd.DataFrame({
        "ttft_mean": rng.normal(1.0, 0.2, n) + shift * 0.2,
        "ttft_p99": rng.lognormal(0.0, 1.5, n),
        "preemptions_per_request": rng.poisson(2.0, n) / 10,
        "blocking_probability": rng.binomial(50, 0.1, n) / 50,
        "drop_probability": np.zeros(n),
        "tpot_mean": tpot,
        "itl_mean": np.full(n, np.nan),
    })


def rejections(correction, n_comparisons, alpha, rng):
    count = 0
    for _ in range(n_comparisons):
        table = compare_results(synthetic(rng, 40), synthetic(rng, 40), alpha=alpha, correction=correction)
        count += int(not table["equivalent"].all())
    return count


def test_correction_controls_false_positives_under_h0():
    """Many comparisons of two samples from the same law: the fraction in
    which *any* metric is declared different is at most alpha (Holm), while
    without a correction it is several times alpha."""
    rng = np.random.default_rng()
    n, alpha = 300, 0.05
    holm = rejections("holm", n, alpha, rng)
    none = rejections("none", n, alpha, rng)
    # P(Binomial(300, 0.05) > limit) < 1e-6.
    limit = stats.binom.isf(1e-6, n, alpha)
    assert holm <= limit, f"{holm}/{n} comparisons rejected at family-wise alpha={alpha}"
    # 5 tested metrics x 2 tests at 0.05 each: well above alpha without a correction.
    assert none > 2 * alpha * n, f"only {none}/{n} uncorrected rejections: the check has no teeth"


def test_bonferroni_is_also_valid_and_holm_is_at_least_as_powerful():
    rng = np.random.default_rng()
    for _ in range(20):
        a, b = synthetic(rng, 40), synthetic(rng, 40, shift=0.5)
        holm = compare_results(a, b, correction="holm")
        bonf = compare_results(a, b, correction="bonferroni")
        assert (holm["p_welch_adj"].fillna(0) <= bonf["p_welch_adj"].fillna(0) + 1e-15).all()
        assert (holm["p_ks_adj"].fillna(0) <= bonf["p_ks_adj"].fillna(0) + 1e-15).all()


def test_a_large_shift_is_detected_in_synthetic_data():
    rng = np.random.default_rng()
    a, b = synthetic(rng, 40), synthetic(rng, 40, shift=3.0)  # 3 standard deviations
    with pytest.raises(AssertionError, match="ttft_mean") as info:
        assert_equivalent(a, b, alpha=ALPHA)
    assert "ttft_p99" not in str(info.value)


def test_constant_nan_and_missing_metrics():
    rng = np.random.default_rng()
    a, b = synthetic(rng, 30), synthetic(rng, 30)
    a.loc[0, "tpot_mean"] = np.nan   # partly NaN whatever the draw (else 0.8^30 of draws have none)
    table = compare_results(a, b)
    assert table.loc["drop_probability", "status"] == "constant_equal"
    assert table.loc["itl_mean", "status"] == "skipped"
    assert table.loc["tpot_mean", "n_a"] == a["tpot_mean"].notna().sum() < 30
    assert table.loc["tpot_mean", "status"] == "tested"
    assert np.isnan(table.loc["drop_probability", "p_welch"])
    assert table.loc[["drop_probability", "itl_mean"], "equivalent"].all()
    # Constant but different: a failure with zero standard error.
    b2 = b.assign(drop_probability=0.01)
    with pytest.raises(AssertionError, match=r"drop_probability: a=0 .*constant_different"):
        assert_equivalent(a, b2, alpha=0.5, tests="ks")
    # Values on one side only.
    b3 = b.assign(itl_mean=0.01 + rng.random(30))
    with pytest.raises(AssertionError, match=r"itl_mean: .*missing_a"):
        assert_equivalent(a, b3, metrics=["itl_mean", "ttft_mean"])


def test_holm_adjustment_matches_the_textbook_procedure():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan])
    np.testing.assert_allclose(adjust_pvalues(p, "holm")[:4], [0.03, 0.06, 0.06, 0.02])
    assert np.isnan(adjust_pvalues(p)[4])
    np.testing.assert_allclose(adjust_pvalues(p, "bonferroni")[:4], [0.04, 0.16, 0.12, 0.02])
    np.testing.assert_allclose(adjust_pvalues([0.5, 0.2], "holm"), [0.5, 0.4])


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": 0}, "alpha"), ({"alpha": 1.5}, "alpha"), ({"alpha": "0.01"}, "alpha"),
    ({"metrics": []}, "metrics"), ({"metrics": ["nope"]}, "metrics"), ({"metrics": [1]}, "metrics"),
    ({"metrics": ["ttft_mean", "ttft_mean"]}, "metrics"),
    ({"tests": ["welch", "anova"]}, "tests"), ({"tests": []}, "tests"),
    ({"correction": "fdr"}, "correction"),
])
def test_arguments_are_validated(kwargs, match):
    rng = np.random.default_rng(0)
    a, b = synthetic(rng, 10), synthetic(rng, 10)
    with pytest.raises(ValueError, match=match):
        compare_results(a, b, **kwargs)


def test_result_arguments_are_validated():
    rng = np.random.default_rng(0)
    a = synthetic(rng, 10)
    with pytest.raises(ValueError, match="result_b"):
        compare_results(a, np.zeros(10))
    with pytest.raises(ValueError, match="result_a"):
        assert_equivalent([1, 2], a)
    with pytest.raises(ValueError, match="metric"):
        assert_matches_theory(a, "nope", 1.0)
    with pytest.raises(ValueError, match="value"):
        assert_matches_theory(a, "ttft_mean", float("nan"))
    with pytest.raises(ValueError, match="z"):
        assert_matches_theory(a, "ttft_mean", 1.0, z=0)


# ------------------------------------------------------------------------------
# Fast kernel vs reference simulator, as distributions

BASE_ENGINE = dict(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48)
BASE_WORKLOAD = dict(arrival_rate=8.0, num_requests=200, warmup_requests=10,
                     prompt_len=fastsim.LogNormal(80, 0.8), output_len=fastsim.LogNormal(40, 0.9),
                     priorities=(0, 1, 2), priority_probs=(0.2, 0.3, 0.5))
ROOMY = {"num_gpu_blocks": 5000}
MIXTURE = {"prompt_len": fastsim.Mixture([fastsim.LogNormal(60, 0.8), fastsim.Uniform(150, 250)], [0.7, 0.3]),
           "output_len": fastsim.Mixture([fastsim.Fixed(8), fastsim.LogNormal(80, 0.5)], [0.4, 0.6])}

# name: (engine overrides, workload overrides, a check that the mechanism is exercised)
GRID = {
    "light-load": (ROOMY, {"arrival_rate": 2.0}, None),
    "heavy-load": (ROOMY, {"arrival_rate": 30.0}, lambda pr: pr["batch_occupancy_mean"].mean() > 0.7),
    "tight-kv-fcfs": ({}, {}, lambda pr: pr["n_preemptions"].sum() > 0),
    "tight-kv-priority": ({"policy": "priority"}, {}, lambda pr: pr["n_preemptions"].sum() > 0),
    "tight-kv-sjf": ({"policy": "sjf"}, {}, lambda pr: pr["n_preemptions"].sum() > 0),
    "no-chunking": ({"enable_chunked_prefill": False, "max_num_batched_tokens": 512}, {}, None),
    "queue-limit": ({"admission": "queue_limit", "max_waiting": 3}, {},
                    lambda pr: pr["n_rejected_admission"].sum() > 0),
    "loss-system": ({"admission": "queue_limit", "max_waiting": 0}, {},
                    lambda pr: pr["n_rejected_admission"].sum() > 0),
    "kv-reservation": ({"admission": "kv_reservation", "num_gpu_blocks": 80}, {},
                       lambda pr: pr["n_rejected_admission"].sum() > 0),
    "abandonment": ({"max_queue_delay_s": 0.4}, {}, lambda pr: pr["n_dropped"].sum() > 0),
    "bursty": (ROOMY, {"burstiness": 0.3}, None),
    "mixture-lengths": ({"num_gpu_blocks": 120}, MIXTURE, None),
    "static": ({"scheduler": "static", "num_gpu_blocks": 200}, {}, None),
    "static-priority-no-chunking": ({"scheduler": "static", "policy": "priority", "num_gpu_blocks": 200,
                                     "enable_chunked_prefill": False, "max_num_batched_tokens": 512}, {}, None),
    "priority-queue-limit-bursty": ({"policy": "priority", "admission": "queue_limit", "max_waiting": 4},
                                    {"burstiness": 0.3}, lambda pr: pr["n_preemptions"].sum() > 0),
    "sjf-abandonment-mixture": ({"policy": "sjf", "max_queue_delay_s": 0.3, "num_gpu_blocks": 64},
                                {**MIXTURE, "arrival_rate": 12.0},
                                lambda pr: pr["n_dropped"].sum() > 0 and pr["n_preemptions"].sum() > 0),
}
DEFAULT = ["tight-kv-fcfs", "priority-queue-limit-bursty", "sjf-abandonment-mixture", "static"]
N_PER_SIDE = 60


def grid_scenario(name):
    engine, workload, _ = GRID[name]
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**{**BASE_ENGINE, **engine}),
        workload=fastsim.Workload(**{**BASE_WORKLOAD, **workload}),
        latency=fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3,
                                     prefill_per_token_s=3e-5, ctx_per_token_s=2e-7),
        ttft_slo_s=0.5, tpot_slo_s=0.05)


@functools.lru_cache(maxsize=None)
def backend_pair(name):
    """Independent replications (different seeds) of each backend."""
    sc = grid_scenario(name)
    return replicate(sc, N_PER_SIDE, "numba"), replicate(sc, N_PER_SIDE, "reference")


def grid_params(names):
    return [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in names]


@pytest.mark.parametrize("name", grid_params(GRID))
def test_kernel_and_reference_are_statistically_equivalent(name):
    fast, ref = backend_pair(name)
    check_equivalent(fast, ref, alpha=ALPHA)
    exercised = GRID[name][2]
    if exercised is not None:
        assert exercised(fast.per_replication) and exercised(ref.per_replication), (
            f"{name} no longer exercises its mechanism")


@pytest.mark.parametrize("name", grid_params(GRID))
def test_littles_law_on_every_run_of_the_grid(name):
    """L = lambda W as a sample-path identity, on every replication of both backends."""
    for res in backend_pair(name):
        pr = res.per_replication
        assert (pr["sojourn_sum"] > 0).all()
        np.testing.assert_allclose(pr["time_in_system_integral"], pr["sojourn_sum"], rtol=1e-9,
                                   err_msg=f"{name} ({res.backend}, seed {res.seed})")
        counts = pr[["n_completed", "n_rejected", "n_dropped", "n_unfinished"]].sum(axis=1)
        assert (counts == pr["n_arrived"]).all()


def test_the_default_subset_covers_each_policy_and_admission_mode():
    engines = [GRID[n][0] for n in DEFAULT]
    assert {e.get("policy", "fcfs") for e in engines} == {"fcfs", "priority", "sjf"}
    assert {e.get("scheduler", "continuous") for e in engines} == {"continuous", "static"}
    full = [GRID[n][0] for n in GRID]
    assert {e.get("admission", "none") for e in full} == {"none", "queue_limit", "kv_reservation"}
