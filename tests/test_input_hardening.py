"""Bad input found by stop 70's input fuzz (a reviewer helper, about 490
trials of extreme values through the Python API and the command line):
each now gets a ValueError naming the parameter before any kernel runs,
where it hung, ran out of memory, crashed with an unnamed error, named the
wrong parameter, or returned wrong numbers."""

from pathlib import Path

import numpy as np
import pytest

import fastsim
from fastsim import _cli

W = dict(arrival_rate=4.0, num_requests=50, prompt_len=20, output_len=10)


def test_a_stale_router_scrapes_at_most_every_millisecond():
    """1e-12 s hung the run (a look at every replica each scrape: T / staleness of them)."""
    for bad in (1e-12, 1e-300, 9.9e-4):
        with pytest.raises(ValueError, match="router_staleness_s must be 0 .live state. or >= 0.001 s"):
            fastsim.Fleet(4, router="jsq", router_staleness_s=bad)
    assert fastsim.Fleet(4, router_staleness_s=1e-3).router_staleness_s == 1e-3
    assert fastsim.Fleet(4, router_staleness_s=0.0).router_staleness_s == 0.0


def test_an_autoscalers_evaluations_are_at_least_10_ms_apart():
    """1e-9 s asked numpy for 1.84 TiB of evaluation rows."""
    with pytest.raises(ValueError, match="interval_s must be a finite number >= 0.01"):
        fastsim.Autoscaler(interval_s=1e-9)


@pytest.mark.parametrize("kw", [dict(link_bandwidth_gbps=1e-300, kv_bytes_per_token=1e5),
                                dict(link_bandwidth_gbps=100.0, kv_bytes_per_token=1e300)])
def test_a_kv_transfer_beyond_the_clocks_range_is_refused(kw):
    """A link of 1e-300 Gb/s gave an e2e of 4e299 s and a TPOT of 0."""
    sc = fastsim.Scenario(workload=fastsim.Workload(**W), fleet=fastsim.Disaggregated(1, 1, **kw))
    with pytest.raises(ValueError, match="makes the longest KV transfer .* more than 1e\\+12 s"):
        fastsim.replicate(sc, 2, seed=0, n_threads=1)


def test_a_rate_schedule_too_slow_for_its_requests_is_refused():
    """As arrival_rate's bound: a rate of 1e-20 gave TPOTs of 0; with a horizon it is a valid (empty) run."""
    with pytest.raises(ValueError, match="rate_schedule's rates bring 1e-08 arrivals expected"):
        fastsim.Workload(rate_schedule=fastsim.RateSchedule((0.0,), (1e-20,)), num_requests=20)
    fastsim.Workload(rate_schedule=fastsim.RateSchedule((0.0,), (1e-20,)), num_requests=20, horizon_s=10.0)
    # a schedule that stops (rate 0 after 10 s, not repeated) just ends the stream early, unless its arrivals
    # would come beyond the clock's range
    fastsim.Workload(rate_schedule=fastsim.RateSchedule((0.0, 10.0), (1.0, 0.0)), num_requests=100)
    with pytest.raises(ValueError, match="fewer than num_requests .100."):
        fastsim.Workload(rate_schedule=fastsim.RateSchedule((0.0, 1e20), (1e-19, 0.0)), num_requests=100)


def test_length_laws_at_extreme_spreads_name_sd():
    with pytest.raises(ValueError, match="sd must give a gamma shape"):
        fastsim.Gamma(100, 1e-300)
    with pytest.raises(ValueError, match="sd must be at most 1e6 times mean_len"):
        fastsim.LogNormal.from_mean_sd(100, 1e300)
    assert fastsim.LogNormal.from_mean_sd(100, 1e7).sigma == pytest.approx(np.sqrt(np.log1p(1e10)))


def test_an_unreachable_precision_target_runs_to_max_replications():
    """precision 1e-300: (rel / target) ** 2 overflowed; now the run goes to max_replications and warns."""
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=50.0, num_requests=20,
                                                    prompt_len=fastsim.Uniform(1, 200), output_len=10))
    with pytest.warns(RuntimeWarning, match="precision targets not reached with max_replications=8"):
        res = fastsim.replicate(sc, 2, seed=0, n_threads=1, precision={"ttft_mean": 1e-300}, max_replications=8)
    assert res.n_replications == 8


def test_from_arrivals_bounds_its_bins_and_names_its_input():
    with pytest.raises(ValueError, match="bin_s must be at least the arrivals' span / 1e\\+07"):
        fastsim.RateSchedule.from_arrivals([0.0, 1e6], 1e-9)
    with pytest.raises(ValueError, match="arrival_s must be a non-empty 1-D array"):
        fastsim.RateSchedule.from_arrivals(["a"], 1.0)


def test_simulate_requests_checks_a_sessions_frame():
    """NaN think times hung the run, negative ones sent requests in the past, a missing column raised a bare
    KeyError."""
    sc = fastsim.Scenario(workload=fastsim.Workload(**W, sessions=fastsim.Sessions(turns=3, think_time_s=1.0)))
    d = fastsim.sample_requests(sc, seed=0)
    for value in (np.nan, -5.0):
        bad = d.copy()
        bad.loc[~bad["first_turn"], "think_s"] = value
        with pytest.raises(ValueError, match="think_s'\\] must hold a finite think time >= 0"):
            fastsim.simulate_requests(sc, bad)
    with pytest.raises(ValueError, match="columns \\['turns'\\] are missing"):
        fastsim.simulate_requests(sc, d.drop(columns=["turns"]))
    bad = d.copy()
    bad["first_turn"] = True   # (every row a session's start: the later turns' rows have no arrival; it hung)
    with pytest.raises(ValueError, match="arrival_s'\] must hold finite arrival times >= 0, in order"):
        fastsim.simulate_requests(sc, bad)
    bad = d.copy()
    bad["first_turn"] = bad["first_turn"].astype(int)
    with pytest.raises(ValueError, match="first_turn'\\] must be booleans"):
        fastsim.simulate_requests(sc, bad)
    assert len(fastsim.simulate_requests(sc, d)) == len(d)


def test_conversion_errors_name_their_parameter():
    with pytest.raises(ValueError, match="counts must be 1 finite non-negative numbers"):
        fastsim.Histogram([1, 3], ["a"])
    with pytest.raises(ValueError, match="classes: the edges of a .by, edges. pair must be a sequence"):
        fastsim.Workload(**W, classes=("prompt_len", 256))


def test_errors_name_the_parameter_at_fault():
    with pytest.raises(ValueError, match="decode_scale_s=0.001 with decode_alpha=100"):
        fastsim.Scenario(latency=fastsim.LatencyModel(base_s=0.01, decode_scale_s=1e-3, decode_alpha=100))
    with pytest.raises(ValueError, match="rate_bounds\\[0\\] must be >= 1e-09"):
        fastsim.capacity(fastsim.Scenario(workload=fastsim.Workload(**W)), {"ttft_p99": 0.5}, n_replications=2,
                         max_replications=4, rate_bounds=(1e-300, 10.0))
    with pytest.raises(ValueError, match="grows with max_replications: reduce max_replications"):
        fastsim.replicate(fastsim.Scenario(workload=fastsim.Workload(**W)), 2, seed=0, n_threads=1,
                          precision={"ttft_mean": 0.1}, max_replications=10**15)
    with pytest.raises(ValueError, match="reduce prefill or decode or num_requests"):
        fastsim.replicate(fastsim.Scenario(workload=fastsim.Workload(**W), fleet=fastsim.Disaggregated(10**7, 1)), 2,
                          seed=0, n_threads=1)
    with pytest.raises(ValueError, match="preset name must be one of"):
        fastsim.LatencyModel.preset(5)
    with pytest.raises(ValueError, match="progress must be"):
        fastsim.replicate(fastsim.Scenario(workload=fastsim.Workload(**W)), 2, seed=0, progress="yes")


def test_a_toml_length_law_missing_a_key_says_which(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[workload]\nnum_requests = 20\nprompt_len = {dist = "lognormal", median = 100}\n')
    with pytest.raises(ValueError, match="prompt_len: missing key\\(s\\) \\['sigma'\\] for dist = 'lognormal'"):
        _cli._load(Path(path))


def test_searches_too_large_for_memory_name_their_bound(monkeypatch):
    """disaggregation_search of 1e6 GPUs built every split (73 s) before failing on replicas; fleet_capacity
    doubled its probes until memory failed, naming replicas, not max_replicas."""
    monkeypatch.setenv("FASTSIM_MEMORY_LIMIT", "2G")
    with pytest.raises(ValueError, match="gpus=1000000: disaggregation_search: .* reduce gpus"):
        fastsim.disaggregation_search(fastsim.Scenario(workload=fastsim.Workload(**W)), gpus=10**6,
                                      slo={"ttft_p99": 1.0}, n_replications=2, n_threads=1)
    sc = fastsim.Scenario(workload=fastsim.Workload(**W), fleet=fastsim.Fleet(1),
                          latency=fastsim.LatencyModel(base_s=0.01, ttft_overhead_s=1.0))   # (no fleet meets it)
    with pytest.raises(ValueError, match="reduce max_replicas .got 1000000000000. or num_requests"):
        fastsim.fleet_capacity(sc, {"ttft_p99": 0.5}, n_replications=2, max_replications=2, max_replicas=10**12)


def test_the_memory_guard_reads_the_address_space_limit():
    """Under ``ulimit -v`` an allocation beyond the limit fails with MemoryError whatever the machine has: the
    guard counts the room left under it (`_memory._address_space_room`; fleet_capacity under ``ulimit -v 8e6``
    ended in a MemoryError)."""
    import os
    import subprocess
    import sys

    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, resource.RLIM_INFINITY)); "
            "from fastsim import _memory; room = _memory._address_space_room(); "
            "assert room is not None and 0 < room < 6 << 30, room; "
            "assert _memory.available_memory()[0] <= room; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "FASTSIM_MEMORY_LIMIT"}   # (which the guard reads first)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_binary_trace_file_is_named(tmp_path):
    """It raised the codec's UnicodeDecodeError, naming neither the trace nor the file."""
    path = tmp_path / "trace.csv"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ValueError, match="path must be a text trace .* got '.*trace.csv'"):
        fastsim.Workload.from_trace(path)


def test_a_deployments_block_override_names_itself():
    with pytest.raises(ValueError, match="num_gpu_blocks_override must be an integer >= 2"):
        fastsim.Deployment(gpu="H100", model="llama-3.1-8b", num_gpu_blocks_override=1)


def test_a_listed_replica_too_short_for_fixed_lengths_is_named_when_the_scenario_is_built():
    """It passed `Scenario` and was refused inside `replicate`'s packing, naming the scenario's engine."""
    lat = fastsim.LatencyModel(base_s=0.01)
    with pytest.raises(ValueError, match="fleet.replicas\\[0\\]'s max_model_len \\(200\\), got 100 \\+ 500"):
        fastsim.Scenario(engine=fastsim.EngineConfig(), latency=lat,
                         workload=fastsim.Workload(arrival_rate=2.0, num_requests=20, prompt_len=100, output_len=500),
                         fleet=fastsim.Fleet(replicas=[(fastsim.EngineConfig(max_model_len=200), lat),
                                                       (fastsim.EngineConfig(), lat)], router="jsq"))
