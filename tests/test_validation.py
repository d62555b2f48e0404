"""Bad input fails before any kernel runs, with a message naming the
parameter, the value and what is allowed."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest

import fastsim

E, W = fastsim.EngineConfig, fastsim.Workload


@pytest.mark.parametrize("kwargs, match", [
    ({"max_num_seqs": 0}, r"max_num_seqs must be an integer >= 1, got 0"),
    ({"max_num_seqs": 2.5}, r"max_num_seqs must be an integer >= 1, got 2.5"),
    ({"max_num_batched_tokens": -1}, r"max_num_batched_tokens must be an integer >= 1, got -1"),
    ({"block_size": 0}, r"block_size must be an integer in \[1, 65536\], got 0"),
    ({"num_gpu_blocks": True}, r"num_gpu_blocks must be an integer >= 1, got True"),
    ({"policy": "lifo"}, r"policy must be one of 'fcfs', 'priority', 'sjf', got 'lifo'"),
    ({"scheduler": "dynamic"}, r"scheduler must be one of 'continuous', 'static', got 'dynamic'"),
    ({"admission": "drop"}, r"admission must be one of 'none', 'queue_limit', 'kv_reservation'"),
    ({"admission": "queue_limit"}, r"max_waiting must be an integer >= 0 when admission='queue_limit'"),
    ({"max_waiting": 3}, r"max_waiting is only used with admission='queue_limit'"),
    ({"admission": "queue_limit", "max_waiting": -1}, r"max_waiting must be an integer >= 0"),
    ({"max_queue_delay_s": 0.0}, r"max_queue_delay_s must be a finite number > 0 or None, got 0.0"),
    ({"max_queue_delay_s": math.nan}, r"max_queue_delay_s must be a finite number > 0 or None, got nan"),
    ({"enable_chunked_prefill": "yes"}, r"enable_chunked_prefill must be True or False, got 'yes'"),
    # beyond the kernel's int64 token arithmetic: refused, not overflowed
    ({"num_gpu_blocks": 2 ** 63},
     r"num_gpu_blocks must be an integer in \[1, 1099511627776\], got 9223372036854775808"),
    ({"block_size": 2 ** 40}, r"block_size must be an integer in \[1, 65536\], got 1099511627776"),
    ({"num_gpu_blocks": 2 ** 37, "block_size": 16},
     r"num_gpu_blocks \* block_size \(the KV cache in tokens\) must be < 2\*\*40, got 137438953472 \* 16"),
    ({"max_model_len": 2 ** 63}, r"max_model_len must be an integer in \[2, 1099511627776\] or None"),
    ({"max_model_len": 1}, r"max_model_len must be an integer >= 2 or None, got 1"),
])
def test_engine_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        E(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"arrival_rate": 0}, r"arrival_rate must be a finite number > 0, got 0"),
    ({"arrival_rate": -2.0}, r"arrival_rate must be a finite number > 0, got -2.0"),
    ({"arrival_rate": math.inf}, r"arrival_rate must be a finite number > 0, got inf"),
    ({"arrival_rate": math.nan}, r"arrival_rate must be a finite number > 0, got nan"),
    ({"num_requests": 0}, r"num_requests must be an integer >= 1, got 0"),
    ({"prompt_len": 0}, r"prompt_len must be an integer >= 1 or a length distribution"),
    ({"output_len": "long"}, r"output_len must be an integer >= 1 or a length distribution"),
    ({"burstiness": 0}, r"burstiness must be a finite number > 0, got 0"),
    ({"priorities": (0, 1), "priority_probs": (0.5, 0.6)}, r"priority_probs must sum to 1"),
    ({"priorities": (0, 1), "priority_probs": (1.0,)}, r"priority_probs must have 2 entries"),
    ({"priorities": (0.5,)}, r"priorities must be a non-empty sequence of integers"),
    ({"warmup_requests": 1000}, r"warmup_requests must be an integer in \[0, 999\], got 1000"),
    ({"horizon_s": -1.0}, r"horizon_s must be a finite number > 0 or None, got -1.0"),
    ({"arrival_times": [1.0, 0.5], "arrival_rate": None},
     r"arrival_times must be finite, >= 0 and non-decreasing, got 0.5 at index 1 \(after 1.0\)"),
    ({"arrival_times": [0.0, -2.0], "arrival_rate": None}, r"non-decreasing, got -2.0 at index 1$"),
    ({"arrival_times": [0.0, np.nan], "arrival_rate": None}, r"non-decreasing, got nan at index 1$"),
    ({"lengths": [1, 2]}, r"lengths must be a LengthTrace or None"),
    ({"lengths": fastsim.LengthTrace([5, 6], [7, 8]), "output_len": 5},
     r"output_len must be left at its default \(128\) when lengths gives the \(prompt, output\) pairs, got 5"),
    ({"arrival_times": [0.0, 1.0], "arrival_rate": None, "burstiness": 0.25},
     r"burstiness must be 1.0 \(its default\) when arrival_times is given, got 0.25"),
    ({"arrival_times": ["0", "1"], "arrival_rate": None},
     r"arrival_times must hold numbers \(seconds\), got dtype <U1"),
    ({"arrival_times": 5.0, "arrival_rate": None}, r"arrival_times must be a non-empty 1-d sequence, got shape \(\)"),
    ({"priorities": (2 ** 63,)}, r"priorities must be a non-empty sequence of integers in \[-2\*\*62, 2\*\*62\]"),
    ({"prefix_groups": 2 ** 63, "prefix_len": 8}, r"prefix_groups must be an integer in \[0, 16777216\]"),
    ({"users": 2 ** 63, "requests_per_user": 1.0, "user_rate": 1.0, "arrival_rate": None},
     r"users must be an integer in \[1, 16777216\], got 9223372036854775808"),
    ({"prompt_len": 2 ** 63}, r"prompt_len must be an integer in \[1, 1099511627776\], got 9223372036854775808"),
])
def test_workload_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        W(**kwargs)


def test_arrival_times_that_look_like_timestamps_warn():
    """Epoch timestamps (the first arrival >= 1e6 s) are accepted as times from
    the start of the run, with a warning saying what that means."""
    with pytest.warns(UserWarning, match=r"arrival_times start at 1\.7e\+09 s, which looks like an absolute "
                                         r"timestamp.*subtract the first arrival time") as rec:
        W(arrival_times=[1.7e9, 1.7e9 + 1.0], arrival_rate=None)
    assert rec[0].filename == __file__                        # points at the caller
    requests = pd.DataFrame({"arrival_s": [2e6, 2e6 + 0.5], "prompt_len": [10, 10], "output_len": [3, 3]})
    with pytest.warns(UserWarning, match=r"requests\['arrival_s'\] start at 2e\+06 s") as rec:
        fastsim.simulate_requests(fastsim.Scenario(), requests)
    assert rec[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        W(arrival_times=[9.9e5, 1e6 + 1.0], arrival_rate=None)  # a late start, not taken for a timestamp


@pytest.mark.parametrize("factory, match", [
    (lambda: fastsim.LogNormal(median=0, sigma=1), r"median must be a finite number > 0, got 0"),
    (lambda: fastsim.LogNormal(median=10, sigma=-1), r"sigma must be a finite number >= 0, got -1"),
    (lambda: fastsim.Uniform(5, 2), r"high must be >= low \(5\), got 2"),
    (lambda: fastsim.Fixed(0), r"value must be an integer >= 1, got 0"),
    (lambda: fastsim.Empirical([3, 0]), r"values must contain integers >= 1, got 0"),
    (lambda: fastsim.Empirical([2 ** 63]),
     r"values must contain integers in \[1, 1099511627776\], got 9223372036854775808"),
    (lambda: fastsim.Fixed(2 ** 63), r"value must be an integer in \[1, 1099511627776\]"),
    (lambda: fastsim.LogNormal(median=1e19, sigma=1),
     r"median must be a finite number > 0 and <= 1099511627776, got 1e\+19"),
    (lambda: fastsim.Empirical([3, 4], weights=[0.2, 0.2]), r"weights must sum to 1"),
    (lambda: fastsim.Mixture([fastsim.Fixed(3)], [0.5]), r"weights must sum to 1"),
    (lambda: fastsim.Mixture([fastsim.Fixed(3), 0], [0.5, 0.5]), r"components\[1\] must be an integer >= 1"),
    (lambda: fastsim.LengthTrace([1, 2], [3]), r"prompt_len and output_len must have the same length"),
    (lambda: fastsim.LatencyModel(base_s=0), r"base_s must be a finite number > 0, got 0"),
    (lambda: fastsim.LatencyModel(base_s=0.01, prefill_per_token_s=-1e-5), r"prefill_per_token_s must be"),
    (lambda: fastsim.LatencyModel.constant(math.nan), r"step_s must be a finite number > 0, got nan"),
])
def test_distribution_and_latency_errors(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_valid_inputs_that_look_unusual_are_accepted(tmp_path, monkeypatch):
    """The checks above refuse nothing legitimate: a workload rebuilt with
    lengths by Scenario.replace (its prompt_len is then Fixed(256)), arrival
    times held as Python numbers in an object array, a pyarrow table of
    requests, an output path under ~."""
    trace = fastsim.LengthTrace([5, 6], [7, 8])
    assert fastsim.Scenario().replace(**{"workload.lengths": trace}).workload.lengths is trace
    t = W(arrival_times=pd.Series([0.0, 1, 2.5], dtype=object), arrival_rate=None).arrival_times
    assert t.dtype == np.float64 and t.tolist() == [0.0, 1.0, 2.5]
    pa = pytest.importorskip("pyarrow")
    requests = {"arrival_s": [0.0, 0.5], "prompt_len": [10, 12], "output_len": [3, 4]}
    out = fastsim.simulate_requests(fastsim.Scenario(), pa.table(requests))
    pd.testing.assert_frame_equal(out, fastsim.simulate_requests(fastsim.Scenario(), pd.DataFrame(requests)))
    monkeypatch.setenv("HOME", str(tmp_path))
    fastsim.replicate(fastsim.Scenario(workload=W(num_requests=20)), 2, seed=0).save("~/r.csv")
    assert (tmp_path / "r.csv").is_file()


def test_simulate_requests_and_predict_name_what_is_wrong():
    sc = fastsim.Scenario()
    with pytest.raises(ValueError, match=r"requests has no column\(s\) 'output_len'; it needs arrival_s, prompt_len"):
        fastsim.simulate_requests(sc, pd.DataFrame({"arrival_s": [0.0], "prompt_len": [3]}))
    with pytest.raises(ValueError, match=r"requests must be a pandas DataFrame .* got ndarray"):
        fastsim.simulate_requests(sc, np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"requests: All arrays must be of the same length"):
        fastsim.simulate_requests(sc, {"arrival_s": [0.0, 1.0], "prompt_len": [3], "output_len": [3, 3]})
    with pytest.raises(ValueError, match=r"scenario must be a fastsim.Scenario, got Workload"):
        fastsim.simulate_requests(sc.workload, pd.DataFrame({"arrival_s": [0.0], "prompt_len": [3], "output_len": [3]}))
    with pytest.raises(ValueError, match=r"scenario must be a fastsim.Scenario, got Workload"):
        fastsim.analytical.predict(sc.workload)


def test_scenario_errors():
    with pytest.raises(ValueError, match=r"prompt_len \+ output_len must be <= max_model_len \(100\), got 90 \+ 20"):
        fastsim.Scenario(engine=E(max_model_len=100), workload=W(prompt_len=90, output_len=20))
    with pytest.raises(ValueError, match=r"engine must be a EngineConfig"):
        fastsim.Scenario(engine={"max_num_seqs": 4})
    with pytest.raises(ValueError, match=r"ttft_slo_s must be a finite number > 0 or None, got 0"):
        fastsim.Scenario(ttft_slo_s=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_replications": 1}, r"n_replications must be an integer >= 2, got 1"),
    ({"backend": "gpu"}, r"backend must be one of 'numba', 'cuda', 'reference', got 'gpu'"),
    ({"confidence_level": 1.0}, r"confidence_level must be a finite number > 0 and < 1, got 1.0"),
    ({"seed": -3}, r"seed must be None, an integer >= 0"),
    ({"precision": {"ttft_p999": 0.01}}, r"precision metric must be one of"),
    ({"precision": {"ttft_p99": 0}}, r"precision\['ttft_p99'\] must be a finite number > 0, got 0"),
    ({"n_replications": 100, "max_replications": 10, "precision": {"ttft_mean": 0.1}},
     r"max_replications must be an integer >= 100"),
    ({"n_threads": 0}, r"n_threads must be an integer >= 1 or None, got 0"),
])
def test_replicate_errors(kwargs, match):
    sc = fastsim.Scenario(workload=W(num_requests=10))
    kwargs = {"n_replications": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        fastsim.replicate(sc, **kwargs)


def test_from_dict_errors(tmp_path):
    with pytest.raises(ValueError, match=r"top level: unknown key 'engin' \(did you mean 'engine'\?\); "
                                         r"allowed keys: engine, workload"):
        fastsim.Scenario.from_dict({"engin": {}})
    with pytest.raises(ValueError, match=r"\[engine\]: unknown key 'max_seqs' .*allowed keys: max_num_seqs, "):
        fastsim.Scenario.from_dict({"engine": {"max_seqs": 4}})
    with pytest.raises(ValueError, match=r"prompt_len.dist must be one of"):
        fastsim.Scenario.from_dict({"workload": {"prompt_len": {"dist": "pareto"}}})
    with pytest.raises(ValueError, match=r"path must be an existing CSV file"):
        fastsim.Workload.from_trace(tmp_path / "missing.csv")


def test_budget_must_cover_the_batch():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens must be >= max_num_seqs \(64\), got 32"):
        E(max_num_seqs=64, max_num_batched_tokens=32)
