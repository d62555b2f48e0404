"""`compare`: scenarios on common random numbers, paired differences and variance reduction."""

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim._compare import COLUMNS, CompareResult, compare, paired_difference, same_workload

# Near saturation, so the scheduling policy matters and every replication's
# load (its draw of arrivals and lengths) drives both policies' metrics.
LOADED = fastsim.Scenario(
    engine=fastsim.EngineConfig(max_num_seqs=8),
    workload=fastsim.Workload(arrival_rate=6.0, num_requests=150, prompt_len=fastsim.LogNormal(200, 0.5),
                              output_len=fastsim.LogNormal(60, 1.0)),
    ttft_slo_s=0.5)
SJF = LOADED.replace(**{"engine.policy": "sjf"})
METRICS = ["ttft_mean", "e2e_mean", "request_throughput", "ttft_p99", "goodput"]
NREP = 30


@pytest.fixture(scope="module")
def policies():
    return compare({"fcfs": LOADED, "sjf": SJF, "fcfs_again": LOADED}, n_replications=NREP, seed=7,
                   metrics=METRICS)


def test_frame_is_tidy(policies):
    assert isinstance(policies, CompareResult)
    frame = policies.frame
    assert list(frame.columns) == list(COLUMNS)
    assert frame.shape == (2 * len(METRICS), len(COLUMNS))
    assert frame["scenario"].tolist() == ["sjf"] * len(METRICS) + ["fcfs_again"] * len(METRICS)
    assert frame["metric"].tolist() == METRICS * 2
    assert policies.baseline == "fcfs" and set(policies.results) == {"fcfs", "sjf", "fcfs_again"}
    assert (frame["n"] == NREP).all()
    assert policies.seed == 7


def test_identical_scenarios_differ_by_exactly_zero(policies):
    same = policies.frame[policies.frame.scenario == "fcfs_again"]
    assert (same["difference"] == 0).all()
    assert (same["ci_low"] == 0).all() and (same["ci_high"] == 0).all() and (same["std_error"] == 0).all()
    assert not same["significant"].any()
    assert (same["estimate"] == same["baseline_estimate"]).all()
    # Their values vary across replications, but not within a pair.
    assert np.isinf(same.set_index("metric").loc["ttft_mean", "variance_reduction"])
    assert policies.confidence_interval("fcfs_again", "ttft_mean") == fastsim.ConfidenceInterval(0.0, 0.0)


def test_paired_difference_is_the_difference_of_the_estimates(policies):
    frame = policies.frame
    assert (frame["difference"] == frame["estimate"] - frame["baseline_estimate"]).all()
    # ...and the estimates are exactly replicate's, which compare ran with the one seed.
    for name in ("fcfs", "sjf"):
        direct = fastsim.replicate({"fcfs": LOADED, "sjf": SJF}[name], NREP, seed=7).summary()
        pd.testing.assert_frame_equal(policies.results[name].summary(), direct, check_exact=True)
    sjf = frame[frame.scenario == "sjf"].set_index("metric")
    base = policies.results["fcfs"].summary()
    np.testing.assert_array_equal(sjf["baseline_estimate"], base.loc[METRICS, "estimate"])
    np.testing.assert_array_equal(sjf["estimate"], policies.results["sjf"].summary().loc[METRICS, "estimate"])
    # The interval is the Student-t interval of the per-replication differences, around the difference.
    d = (policies.results["sjf"].per_replication["ttft_mean"]
         - policies.results["fcfs"].per_replication["ttft_mean"]).to_numpy()
    est, low, high, se, n = fastsim._stats.mean_interval(d, 0.95)
    row = sjf.loc["ttft_mean"]
    np.testing.assert_allclose([row.difference, row.ci_low, row.ci_high], [est, low, high], rtol=1e-12)
    assert row.std_error == se and row.n == n
    assert policies.difference("sjf", "ttft_mean") == row.difference


def test_common_random_numbers_narrow_the_interval(policies):
    """Same arrivals in both arms: the paired interval is narrower than independent streams'."""
    sjf = policies.frame[policies.frame.scenario == "sjf"].set_index("metric")
    for m in ("ttft_mean", "e2e_mean", "request_throughput"):
        assert sjf.loc[m, "variance_reduction"] > 1, m
        assert sjf.loc[m, "std_error"] < sjf.loc[m, "std_error_independent"], m
        np.testing.assert_allclose(sjf.loc[m, "variance_reduction"],
                                   (sjf.loc[m, "std_error_independent"] / sjf.loc[m, "std_error"]) ** 2)
    # Equivalently: under common streams the two arms' values are positively correlated.
    a, b = (policies.results[s].per_replication["ttft_mean"] for s in ("fcfs", "sjf"))
    assert np.corrcoef(a, b)[0, 1] > 0


def test_paired_difference_unit():
    a = np.array([1.0, 2.0, 3.0, np.nan, 5.0])
    b = np.array([0.5, 1.5, 2.0, 1.0, np.nan])
    row = paired_difference(a, b)
    assert row["n"] == 3 and row["estimate"] == 2.0 and row["baseline_estimate"] == 4.0 / 3
    var_indep = np.var([1, 2, 3], ddof=1) + np.var([0.5, 1.5, 2.0], ddof=1)
    np.testing.assert_allclose(row["variance_reduction"], var_indep / np.var([0.5, 0.5, 1.0], ddof=1))
    assert np.isnan(paired_difference([1.0, 1.0], [1.0, 1.0])["variance_reduction"])  # nothing varies
    assert paired_difference([np.nan], [1.0])["n"] == 0
    with pytest.raises(ValueError, match="same length"):
        paired_difference([1.0, 2.0], [1.0])


def test_same_workload_is_what_the_kernel_sees():
    assert same_workload(LOADED, SJF)
    assert same_workload(LOADED, LOADED.replace(**{"latency.base_s": 0.02, "ttft_slo_s": 1.0}))
    fixed = LOADED.replace(**{"workload.output_len": 60})
    assert same_workload(fixed, fixed.replace(**{"workload.output_len": fastsim.Fixed(60)}))
    for change in ({"workload.arrival_rate": 5.0}, {"workload.num_requests": 140},
                   {"workload.output_len": fastsim.LogNormal(60, 0.9)}, {"workload.burstiness": 0.5},
                   {"workload.warmup_requests": 10}):
        assert not same_workload(LOADED, LOADED.replace(**change)), change


def test_different_workloads_raise_unless_allowed():
    faster = LOADED.replace(**{"workload.arrival_rate": 5.0})
    with pytest.raises(ValueError, match=r"workloads of \['faster'\] differ from the baseline 'fcfs'"):
        compare({"fcfs": LOADED, "faster": faster}, n_replications=4, seed=0)
    res = compare({"fcfs": LOADED, "faster": faster}, n_replications=4, seed=0, metrics=["ttft_mean"],
                  allow_different_workloads=True)
    assert res.frame.shape[0] == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(scenarios={"a": LOADED}), "at least 2 entries"),
    (dict(scenarios=[LOADED, SJF]), "must be a dict"),
    (dict(scenarios={"a": LOADED, "b": "sjf"}), r"scenarios\['b'\] must be a fastsim.Scenario"),
    (dict(scenarios={"a": LOADED, 2: SJF}), "scenario names must be non-empty strings"),
    (dict(baseline="c"), "baseline must be one of 'a', 'b', got 'c'"),
    (dict(metrics=["ttft"]), "metric must be one of"),
    (dict(n_replications=1), "n_replications must be an integer >= 2"),
    (dict(n_jobs=0), "n_jobs must be"),
    (dict(seed=-3), "seed must be None"),
    (dict(allow_different_workloads="yes"), "allow_different_workloads must be True or False"),
])
def test_bad_arguments(kwargs, match):
    kwargs = {"scenarios": {"a": LOADED, "b": SJF}, "n_replications": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        compare(**kwargs)


def test_baseline_choice_and_n_jobs(policies):
    res = compare({"fcfs": LOADED, "sjf": SJF}, n_replications=NREP, seed=7, baseline="sjf",
                  metrics=METRICS, n_jobs=2)
    mine = res.frame.set_index("metric")
    theirs = policies.frame[policies.frame.scenario == "sjf"].set_index("metric")
    assert (res.frame.scenario == "fcfs").all()
    np.testing.assert_array_equal(mine["difference"], -theirs["difference"])
    np.testing.assert_array_equal(mine["std_error"], theirs["std_error"])
    np.testing.assert_array_equal(mine["variance_reduction"], theirs["variance_reduction"])


def test_seed_none_is_recorded(tmp_path):
    res = compare({"a": LOADED, "b": SJF}, n_replications=4, metrics=["ttft_mean"])
    again = compare({"a": LOADED, "b": SJF}, n_replications=4, seed=res.seed, metrics=["ttft_mean"])
    pd.testing.assert_frame_equal(res.frame, again.frame, check_exact=True)
    back = pd.read_csv(res.save(tmp_path / "cmp.csv"))
    assert list(back.columns) == list(COLUMNS)
