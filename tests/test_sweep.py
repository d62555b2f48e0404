"""`sweep` (grids of scenarios) and the joblib wrapper it runs through (`fastsim._parallel`)."""

import itertools
import operator
import warnings

import numba
import numpy as np
import pandas as pd
import pytest

import fastsim
import fastsim._sweep as sweep_module
from fastsim._parallel import available_cores, check_n_jobs, effective_n_jobs, run_parallel
from fastsim._sweep import SweepResult, point_seeds, sweep

BASE = fastsim.Scenario(
    engine=fastsim.EngineConfig(max_num_seqs=8),
    workload=fastsim.Workload(arrival_rate=2.0, num_requests=120, prompt_len=fastsim.LogNormal(200, 0.5),
                              output_len=fastsim.LogNormal(50, 0.6)),
    ttft_slo_s=0.2)
GRID = {"workload.arrival_rate": [1.0, 3.0], "engine.max_num_seqs": [4, 16]}
METRICS = ["ttft_mean", "e2e_p99", "goodput"]
NREP = 12


@pytest.fixture(scope="module")
def swept():
    return sweep(BASE, GRID, n_replications=NREP, seed=5, metrics=METRICS)


@pytest.fixture
def count_replicate(monkeypatch):
    """Count the simulations a sweep runs in this process (n_jobs=1)."""
    calls = []
    real = sweep_module.replicate

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "replicate", counting)
    return calls


# ------------------------------------------------------------------------------
# The frame

def test_frame_is_tidy_with_the_grid_as_columns(swept):
    assert isinstance(swept, SweepResult)
    frame = swept.frame
    assert list(frame.columns) == ["point", "workload.arrival_rate", "engine.max_num_seqs", "metric",
                                   "estimate", "ci_low", "ci_high", "std_error", "n"]
    assert frame.shape == (4 * len(METRICS), 9)
    assert swept.parameters == ["workload.arrival_rate", "engine.max_num_seqs"]
    # Every grid point appears once per metric, in product order (last key fastest).
    combos = frame.drop_duplicates("point")[list(GRID)].itertuples(index=False, name=None)
    assert list(combos) == list(itertools.product(*GRID.values()))
    assert (frame.groupby("point")["metric"].apply(list) == pd.Series([METRICS] * 4)).all()
    assert (frame["n"] == NREP).all()
    assert (frame.ci_low <= frame.estimate).all() and (frame.estimate <= frame.ci_high).all()
    assert swept.points == [dict(zip(GRID, c)) for c in itertools.product(*GRID.values())]
    assert swept.cached == [False] * 4 and swept.seed == 5
    # The per-point results are the scenarios the points describe.
    for change, res in zip(swept.points, swept.results):
        assert res.scenario.workload.arrival_rate == change["workload.arrival_rate"]
        assert res.scenario.engine.max_num_seqs == change["engine.max_num_seqs"]
        assert res.n_replications == NREP
    # Higher load, same seats: longer TTFT (a large effect, not a seed-specific number).
    est = frame[frame.metric == "ttft_mean"].set_index(list(GRID))["estimate"]
    assert est[(3.0, 4)] > est[(1.0, 4)]


def test_estimate_equals_replicate_with_the_documented_child_seed(swept):
    n_points = len(swept.points)
    children = np.random.SeedSequence(5).spawn(n_points)
    assert [c.spawn_key for c in point_seeds(5, n_points)] == [c.spawn_key for c in children]
    for i in (0, 3):
        direct = fastsim.replicate(BASE.replace(**swept.points[i]), NREP, seed=children[i]).summary()
        rows = swept.frame[swept.frame.point == i].set_index("metric")
        for col in ("estimate", "ci_low", "ci_high", "std_error"):
            np.testing.assert_array_equal(rows[col].to_numpy(), direct.loc[METRICS, col].to_numpy())
        assert swept.results[i].seed.spawn_key == (i,)


def test_points_have_independent_streams():
    res = sweep(BASE, points=[{}, {}], n_replications=NREP, seed=1, metrics=["ttft_mean"])
    a, b = (r.per_replication["ttft_mean"].to_numpy() for r in res.results)
    assert not np.array_equal(a, b)
    assert list(res.frame.columns) == ["point", "metric", "estimate", "ci_low", "ci_high", "std_error", "n"]


def test_n_jobs_does_not_change_results(swept):
    two = sweep(BASE, GRID, n_replications=NREP, seed=5, metrics=METRICS, n_jobs=2)
    pd.testing.assert_frame_equal(two.frame, swept.frame, check_exact=True)
    for a, b in zip(two.results, swept.results):
        pd.testing.assert_frame_equal(a.per_replication, b.per_replication, check_exact=True)


def test_explicit_points_fill_unset_parameters_with_the_base_value():
    pts = [{"workload.arrival_rate": 1.5}, {"engine.max_num_seqs": 4, "workload.arrival_rate": 2.5},
           {"engine.policy": "sjf"}]
    res = sweep(BASE, points=pts, n_replications=NREP, seed=2, metrics=["ttft_mean"])
    frame = res.frame
    assert list(frame.columns[:4]) == ["point", "workload.arrival_rate", "engine.max_num_seqs", "engine.policy"]
    assert frame["workload.arrival_rate"].tolist() == [1.5, 2.5, 2.0]
    assert frame["engine.max_num_seqs"].tolist() == [8, 4, 8]
    assert frame["engine.policy"].tolist() == ["fcfs", "fcfs", "sjf"]
    assert res.results[2].scenario.engine.policy == "sjf"
    assert res.points == pts


def test_seed_none_is_reproducible_from_the_result():
    res = sweep(BASE, points=[{}, {"engine.max_num_seqs": 4}], n_replications=NREP, metrics=["ttft_mean"])
    again = sweep(BASE, points=[{}, {"engine.max_num_seqs": 4}], n_replications=NREP, seed=res.seed,
                  metrics=["ttft_mean"])
    pd.testing.assert_frame_equal(res.frame, again.frame, check_exact=True)


# ------------------------------------------------------------------------------
# Cache and resume

def test_cache_dir_resumes_an_interrupted_sweep(tmp_path, monkeypatch, swept):
    real = sweep_module.replicate
    calls = []

    def fails_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "replicate", fails_on_third)
    with pytest.raises(KeyboardInterrupt):
        sweep(BASE, GRID, n_replications=NREP, seed=5, metrics=METRICS, cache_dir=tmp_path)

    calls.clear()
    monkeypatch.setattr(sweep_module, "replicate", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    resumed = sweep(BASE, GRID, n_replications=NREP, seed=5, metrics=METRICS, cache_dir=tmp_path)
    assert len(calls) == 2                       # only the two unfinished points ran
    assert resumed.cached == [True, True, False, False]
    pd.testing.assert_frame_equal(resumed.frame, swept.frame, check_exact=True)

    calls.clear()
    again = sweep(BASE, GRID, n_replications=NREP, seed=5, metrics=METRICS, cache_dir=str(tmp_path), n_jobs=2)
    assert calls == [] and again.cached == [True] * 4
    pd.testing.assert_frame_equal(again.frame, swept.frame, check_exact=True)

    # A different seed or replication count is a different computation.
    other = sweep(BASE, GRID, n_replications=NREP, seed=6, metrics=METRICS, cache_dir=tmp_path)
    assert other.cached == [False] * 4 and len(calls) == 4


# ------------------------------------------------------------------------------
# Validation: everything is checked before anything is simulated

@pytest.mark.parametrize("grid, match", [
    ({"engine.max_num_seqs": [4], "engine.max_num_seq": [2]}, "'engine.max_num_seq' is not a scenario parameter"),
    ({"server.max_num_seqs": [4]}, "unknown scenario section 'server'"),
    ({"arrival_rate": [1.0]}, "'arrival_rate' is not a scenario parameter"),
    ({"engine.policy": "sjf"}, r"grid\['engine.policy'\] must be a non-empty list"),
    ({"engine.policy": []}, r"grid\['engine.policy'\] must be a non-empty list"),
    ({"engine.max_num_seqs": [8, 0]}, r"sweep point 1 \{'engine.max_num_seqs': 0\}: max_num_seqs must be"),
    ({"workload.arrival_rate": [1.0, -2.0]}, "arrival_rate"),
    ({}, "grid must be a non-empty dict"),
])
def test_bad_grid_raises_before_simulating(grid, match, count_replicate):
    with pytest.raises(ValueError, match=match):
        sweep(BASE, grid, n_replications=NREP, seed=0)
    assert count_replicate == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(points=[{"engine.max_num_seqs": 4}, {"engine.bogus": 1}]), r"points\[1\] key 'engine.bogus'"),
    (dict(points=[{}, "engine.max_num_seqs"]), r"points\[1\] must be a dict"),
    (dict(points=[]), "points must be a non-empty list"),
    (dict(grid=GRID, points=[{}]), "exactly one of grid"),
    (dict(), "exactly one of grid"),
    (dict(grid=GRID, n_jobs=0), "n_jobs must be an integer >= 1, or -1"),
    (dict(grid=GRID, n_replications=1), "n_replications must be an integer >= 2"),
    (dict(grid=GRID, metrics=["ttft_avg"]), "metric must be one of"),
    (dict(grid=GRID, confidence_level=1.0), "confidence_level"),
    (dict(grid=GRID, seed=-1), "seed must be None"),
])
def test_bad_arguments_raise_before_simulating(kwargs, match, count_replicate):
    kwargs = {"n_replications": NREP, **kwargs}
    with pytest.raises(ValueError, match=match):
        sweep(BASE, **kwargs)
    assert count_replicate == []


def test_save_round_trips(swept, tmp_path):
    for suffix in (".csv", ".parquet", ".json"):
        path = swept.save(tmp_path / f"sweep{suffix}")
        back = {".csv": pd.read_csv, ".parquet": pd.read_parquet,
                ".json": lambda p: pd.read_json(p, orient="records")}[suffix](path)
        assert list(back.columns) == list(swept.frame.columns)
        np.testing.assert_allclose(back["estimate"], swept.frame["estimate"])
    with pytest.raises(ValueError, match="path must end in"):
        swept.save(tmp_path / "sweep.xlsx")
    # Non-scalar parameter values (length laws) are written as their repr.
    laws = sweep(BASE, {"workload.output_len": [fastsim.LogNormal(40, 0.5), 30]}, n_replications=NREP,
                 seed=0, metrics=["ttft_mean"])
    back = pd.read_parquet(laws.save(tmp_path / "laws.parquet"))
    assert back["workload.output_len"].tolist() == [repr(fastsim.LogNormal(40, 0.5)), "30"]


# ------------------------------------------------------------------------------
# The joblib wrapper

@pytest.mark.parametrize("n_jobs", [0, -2, 1.5, True, "2", None])
def test_n_jobs_is_validated(n_jobs):
    with pytest.raises(ValueError, match="n_jobs must be an integer >= 1, or -1 for all cores"):
        check_n_jobs(n_jobs)
    with pytest.raises(ValueError, match="n_jobs must be"):
        run_parallel(operator.neg, [(1,)], n_jobs)


def test_run_parallel_keeps_task_order_and_splits_the_cores():
    assert run_parallel(operator.neg, [(i,) for i in range(10)], n_jobs=1) == [-i for i in range(10)]
    assert run_parallel(operator.neg, [(i,) for i in range(10)], n_jobs=2) == [-i for i in range(10)]
    assert run_parallel(operator.neg, [], n_jobs=2) == []
    assert effective_n_jobs(-1) == available_cores()
    assert effective_n_jobs(8, n_tasks=1) == 1
    workers = effective_n_jobs(2, n_tasks=4)
    threads = run_parallel(numba.get_num_threads, [()] * 4, n_jobs=2)
    if workers > 1:
        assert all(t >= 1 and t * workers <= available_cores() for t in threads)
    # In process (n_jobs=1) the caller's Numba setting is kept.
    assert run_parallel(numba.get_num_threads, [()], n_jobs=1) == [numba.get_num_threads()]


def test_run_parallel_applies_the_callers_warning_filters():
    for n_jobs in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(UserWarning, match="boom"):
                run_parallel(warnings.warn, [("boom",), ("boom",)], n_jobs=n_jobs)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("ignore")
            assert run_parallel(warnings.warn, [("quiet",), ("quiet",)], n_jobs=n_jobs) == [None, None]
        assert not seen


def test_confidence_level_reuses_the_cache(tmp_path, count_replicate):
    first = sweep(BASE, points=[{}], n_replications=NREP, seed=3, metrics=["ttft_mean"], cache_dir=tmp_path)
    wide = sweep(BASE, points=[{}], n_replications=NREP, seed=3, metrics=["ttft_mean"], cache_dir=tmp_path,
                 confidence_level=0.99)
    assert len(count_replicate) == 1 and wide.cached == [True]
    assert wide.results[0].confidence_level == 0.99
    assert wide.frame.ci_low[0] < first.frame.ci_low[0] < first.frame.ci_high[0] < wide.frame.ci_high[0]
