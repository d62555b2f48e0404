"""The smaller input gaps of issue 43 (point 7), each now handled: an empty
request stream simulated, non-integer CSV lengths and clocks that would
overflow refused, every bad input a ValueError (not OverflowError or
TypeError), and a sweep resumed from a damaged cache counting what it
really loaded."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim._validation import check_metric_names
from fastsim import kernel as K


def empty_stream():
    """A multi-user scenario and a replication in which no user sends a request."""
    sc = fastsim.Scenario(workload=fastsim.Workload.multi_user(1, requests_per_user=0.01, user_rate=1.0))
    for rep in range(50):
        df = fastsim.sample_requests(sc, seed=0, replication=rep)
        if len(df) == 0:
            return sc, df
    pytest.fail("no empty replication in 50 (P(empty) = exp(-0.01) each)")


@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_simulate_requests_takes_the_empty_stream_sample_requests_draws(backend):
    sc, df = empty_stream()
    out = fastsim.simulate_requests(sc, df, backend=backend)
    assert len(out) == 0
    one = fastsim.simulate_requests(sc, pd.DataFrame({"arrival_s": [0.0], "prompt_len": [5], "output_len": [3]}),
                                    backend=backend)
    assert list(out.columns) == list(one.columns)
    assert (out.dtypes.astype(str) == one.dtypes.astype(str)).all()


def test_csv_lengths_must_be_integers(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("prompt_len,output_len\n10,5\n12.0,2.9\n")
    with pytest.raises(ValueError, match=r"column 'output_len' of .*trace.csv must hold integers >= 1: "
                                         r"row 3: '2.9' is not an integer"):
        fastsim.LengthTrace.from_csv(path)
    path.write_text("prompt_len,output_len\n10,5\n1e1,x\n")
    with pytest.raises(ValueError, match=r"row 3: 'x' is not a number"):
        fastsim.LengthTrace.from_csv(path)
    path.write_text("prompt_len,output_len\n10,5\n12.0,1e1\n")   # integers in float notation are fine
    trace = fastsim.LengthTrace.from_csv(path)
    assert trace.prompt_len.tolist() == [10, 12] and trace.output_len.tolist() == [5, 10]


def test_a_vanishing_arrival_rate_is_refused():
    with pytest.raises(ValueError, match=r"arrival_rate must be >= num_requests / 1e\+12 s = 1e-09 req/s .*"
                                         r"got 1e-320"):
        fastsim.Workload(arrival_rate=1e-320)
    with pytest.raises(ValueError, match=r"user_rate must be >= requests_per_user / 1e\+12 s"):
        fastsim.Workload.multi_user(3, requests_per_user=2.0, user_rate=1e-300)
    fastsim.Workload(arrival_rate=1e-9, num_requests=1000)   # 1e12 s: the largest span allowed


@pytest.mark.parametrize("field, value, term", [
    ("base_s", 1e308, "base_s"),
    ("decode_scale_s", 1e10, "decode_scale_s"),
    ("ctx_per_token_s", 1e8, "ctx_per_token_s"),
])
def test_a_step_beyond_the_clock_is_refused(field, value, term):
    lat = fastsim.LatencyModel(**{"base_s": 0.01, field: value})   # valid alone
    with pytest.raises(ValueError, match=rf"latency\.{term} makes the longest step .* more than 1e\+12 s"):
        fastsim.Scenario(latency=lat)


def test_a_large_but_finite_latency_runs_without_inf_or_nan():
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=20),
                          latency=fastsim.LatencyModel.constant(1e6))
    res = fastsim.replicate(sc, 3, seed=0, n_threads=1)
    assert np.isfinite(res.per_replication[["ttft_mean", "e2e_mean", "request_throughput"]].to_numpy()).all()


def test_out_of_range_replication_is_a_value_error():
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=5))
    for rep in (2 ** 63, 2 ** 64, -1):
        with pytest.raises(ValueError, match=rf"replication must be an integer .*got {rep}"):
            fastsim.sample_requests(sc, seed=0, replication=rep)
    assert len(fastsim.sample_requests(sc, seed=0, replication=2 ** 62)) == 5


@pytest.mark.parametrize("probs", [(0.5 + 0j, 0.5), np.array([0.5, 0.5], complex), (1j, 1.0), ("a", "b"),
                                   ((0.5,), (0.5,))])
def test_bad_probabilities_are_value_errors(probs):
    with pytest.raises(ValueError, match=r"priority_probs must be a non-empty 1-d sequence of probabilities"):
        fastsim.Workload(priorities=(0, 1), priority_probs=probs)


@pytest.mark.parametrize("metrics", [np.array("ttft_mean"), np.array([["ttft_mean"]])])
def test_array_valued_metrics_are_value_errors(metrics):
    with pytest.raises(ValueError, match=r"metrics must be a list of metric names"):
        check_metric_names(metrics, K.METRICS)
    base = fastsim.Scenario(workload=fastsim.Workload(num_requests=20))
    with pytest.raises(ValueError, match=r"metrics must be a list of metric names"):
        fastsim.sweep(base, {"workload.arrival_rate": [1.0]}, n_replications=2, seed=0, metrics=metrics)
    a = fastsim.replicate(base, 4, seed=0)
    with pytest.raises(ValueError, match=r"metrics must (be None, a metric name or a sequence|contain column names)"):
        fastsim.testing.compare_results(a, a, metrics=metrics)


def test_a_numpy_array_of_metric_names_is_a_list_of_names():
    assert check_metric_names(np.array(["ttft_mean", "goodput"]), K.METRICS) == ("ttft_mean", "goodput")


def test_a_sweep_resumed_from_a_damaged_cache_counts_what_it_loaded(tmp_path):
    base = fastsim.Scenario(workload=fastsim.Workload(num_requests=30))
    grid = {"workload.arrival_rate": [1.0, 2.0, 3.0]}
    first = fastsim.sweep(base, grid, n_replications=3, seed=1, metrics=["ttft_mean"], cache_dir=tmp_path)
    outputs = sorted(tmp_path.rglob("output.pkl"))
    assert len(outputs) == 3
    outputs[1].write_bytes(outputs[1].read_bytes()[:20])   # truncated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # joblib's own warning about the file it could not load
        again = fastsim.sweep(base, grid, n_replications=3, seed=1, metrics=["ttft_mean"], cache_dir=tmp_path)
    assert sum(again.cached) == 2 and again.cached.count(False) == 1
    pd.testing.assert_frame_equal(again.frame, first.frame, check_exact=True)
