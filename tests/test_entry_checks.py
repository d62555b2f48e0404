"""The entry points beside `replicate` honour every part of a scenario (found
by stop 66's review: each ran something other than what the scenario says,
or failed without naming a parameter).

* `capacity` and `fleet_capacity` refuse what `replicate` refuses (they run
  the kernel directly: an engine option the kernel does not implement ran,
  and wrongly).
* `fleet_capacity` refuses an autoscaled fleet (a probe of N replicas was
  the autoscaled fleet whatever N) and a workload with no arrival rate.
* `disaggregation_search` counts a replica's GPUs by its server's tensor-
  parallel size, the scenario's own server's too.
* `sweep` takes the autoscaled fleet's columns (GPU-hours), as `compare`.
* The memory guard sizes a disaggregated server whose pool serves a trace's
  block identities without re-checking the pools as Scenarios.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fastsim

LAT = fastsim.LatencyModel.default()
W = fastsim.Workload(arrival_rate=4.0, num_requests=60)


def test_capacity_and_fleet_capacity_refuse_what_replicate_refuses():
    bad = fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=200, async_scheduling=True,
                               enable_prefix_caching=True, block_hash_caching=False)
    w = fastsim.Workload(arrival_rate=4.0, num_requests=60, prefix_groups=4, prefix_len=64)
    msg = "async_scheduling=True with the synthetic prefix-group cache"
    with pytest.raises(NotImplementedError, match=msg):
        fastsim.capacity(fastsim.Scenario(engine=bad, workload=w), {"ttft_mean": 1.0}, n_replications=2,
                         max_replications=2)
    with pytest.raises(NotImplementedError, match=msg):
        fastsim.fleet_capacity(fastsim.Scenario(engine=bad, workload=w, fleet=fastsim.Fleet(2)), {"ttft_mean": 1.0},
                               n_replications=2, max_replications=2)


def test_fleet_capacity_refuses_an_autoscaler_and_a_workload_without_a_rate():
    auto = fastsim.Scenario(workload=W, fleet=fastsim.Fleet(autoscaler=fastsim.Autoscaler(max_replicas=8)))
    with pytest.raises(ValueError, match="fleet_capacity searches a static number of replicas; scenario.fleet has an "
                                         "autoscaler"):
        fastsim.fleet_capacity(auto, {"ttft_mean": 1.0}, n_replications=2)
    sched = fastsim.Workload(rate_schedule=fastsim.RateSchedule(times=(0.0, 10.0), rates=(3.0, 9.0)), num_requests=60)
    with pytest.raises(ValueError, match="fleet_capacity needs workload.arrival_rate"):
        fastsim.fleet_capacity(fastsim.Scenario(workload=sched, fleet=fastsim.Fleet(2)), {"ttft_mean": 1.0},
                               n_replications=2)


def test_disaggregation_search_counts_the_scenario_servers_tensor_parallel_gpus():
    dep = fastsim.Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", tensor_parallel_size=2,
                             max_model_len=4096, max_num_seqs=32)
    w = fastsim.Workload(arrival_rate=6.0, num_requests=60, prompt_len=fastsim.LogNormal(300, 0.5),
                         output_len=fastsim.LogNormal(80, 0.6))
    res = fastsim.disaggregation_search(fastsim.Scenario(engine=dep.engine, latency=dep.latency, workload=w), gpus=4,
                                        slo={"ttft_mean": 1.0}, n_replications=2, seed=0, n_threads=1)
    t = res.table.set_index("config")
    assert t.loc["co-located", "replicas"] == 2 and list(t["gpus"]) == [4, 4]
    assert res.results["co-located"].scenario.fleet.n_replicas == 2
    assert list(t.index) == ["co-located", "1P1D"]   # (two TP-2 replicas in 4 GPUs: one split)


def test_sweep_takes_an_autoscaled_fleets_columns():
    auto = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=6.0, num_requests=100),
                            fleet=fastsim.Fleet(autoscaler=fastsim.Autoscaler(max_replicas=3)), ttft_slo_s=0.3)
    got = fastsim.sweep(auto, {"workload.arrival_rate": [4.0, 8.0]}, 2, seed=0, metrics=["gpu_hours", "ttft_mean"])
    assert set(got.frame["metric"]) == {"gpu_hours", "ttft_mean"}
    assert (got.frame.loc[got.frame["metric"] == "gpu_hours", "estimate"] > 0).all()
    with pytest.raises(ValueError, match="gpu_hours"):
        fastsim.sweep(auto.replace(fleet=fastsim.Fleet(2)), {"workload.arrival_rate": [4.0]}, 2, seed=0,
                      metrics=["gpu_hours"])


def test_the_memory_guard_of_a_disaggregated_server_serving_trace_identities():
    """A 1P2D server whose one prefill replica keys a replayed trace's block
    hashes (the decode pool does not cache): `Scenario` accepts it, and the
    memory guard no longer refuses it by re-checking the pools as Scenarios
    with the other pool's engine (stop 66's `engine_variants`)."""
    trace = fastsim.Workload.from_trace(Path(fastsim.__file__).parent / "data" / "traces"
                                        / "mooncake_conversation_head300.jsonl", resample=True, duration_s=20.0)
    hashing = fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=4000, async_scheduling=False,
                                   enable_prefix_caching=True, block_hash_caching=True)
    plain = dataclasses.replace(hashing, enable_prefix_caching=False, block_hash_caching=False)
    sc = fastsim.Scenario(engine=plain, workload=trace, fleet=fastsim.Disaggregated(
        prefill=1, decode=2, kv_bytes_per_token=1e5, prefill_server=(hashing, LAT)))
    pr = fastsim.replicate(sc, n_replications=2, seed=0, n_threads=1).per_replication
    assert (pr["prefix_hit_rate"] > 0).all()
    assert np.array_equal(pr["n_arrived"], pr["n_completed"] + pr["n_rejected"] + pr["n_dropped"] + pr["n_unfinished"])


def test_capacity_and_replicate_take_an_autoscaled_fleet_with_priority_classes():
    """Priority classes set each request's priority: `capacity` runs an
    autoscaled fleet with them (stop 66's review: refused for a while), and
    `replicate` gives its per-class rows (`_autoscale.served_autoscaled`)."""
    w = fastsim.Workload(arrival_rate=2.0, num_requests=60, prompt_len=fastsim.Exponential(300),
                         classes=fastsim.RequestClasses("prompt_len", [256], priorities=[0, 1]))
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(policy="priority"), workload=w,
                          fleet=fastsim.Fleet(autoscaler=fastsim.Autoscaler(max_replicas=3)))
    pc = fastsim.replicate(sc, n_replications=2, seed=0).per_class
    assert set(pc["class"]) == {"<256", ">=256"} and pc["n_arrived"].sum() == 120
    res = fastsim.capacity(sc, {"ttft_mean": 5.0}, rate_bounds=(1.0, 4.0), n_replications=2, max_replications=2)
    assert len(res.probes) >= 1


def test_the_stability_check_of_a_capped_stream_but_not_of_a_pure_closed_loop():
    """A capped stream (`max_concurrency` with `arrival_rate`) is checked on
    the times its requests want to go (its client-side backlog can grow
    without bound); a pure closed loop's sends follow departures: not
    checked (`replications` 0)."""
    e = fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=400)
    capped = fastsim.Scenario(engine=e, workload=fastsim.Workload(arrival_rate=50.0, max_concurrency=4,
                                                                  num_requests=300))
    with pytest.warns(RuntimeWarning, match="overloaded"):
        st = fastsim.replicate(capped, n_replications=2, seed=0).stability
    assert st.replications == 2 and st.overloaded
    loop = capped.replace(**{"workload.arrival_rate": None})
    assert fastsim.replicate(loop, n_replications=2, seed=0).stability.replications == 0


def test_a_sweep_of_an_engine_no_listed_replica_runs_warns():
    """A fleet that lists its replicas runs their engines: sweeping the
    scenario's ``engine.*`` changes only the stream's draws (the points
    differ by chance), so `sweep_points` warns, naming the keys; a fleet
    of the scenario's engine does not."""
    from fastsim._sweep import sweep_points

    four = fastsim.EngineConfig(max_num_seqs=4)
    listed = fastsim.Scenario(workload=W, fleet=fastsim.Fleet(replicas=[(four, LAT)] * 2))
    with pytest.warns(UserWarning, match=r"sweep of engine.max_num_seqs, latency.base_s: the scenario's fleet runs"):
        sweep_points(listed, {"engine.max_num_seqs": [4, 64], "latency.base_s": [0.01]})
    with pytest.warns(UserWarning, match=r"sweep of engine.max_num_seqs") as rec:   # (pointing at the caller)
        fastsim.sweep(listed, {"engine.max_num_seqs": [4, 64]}, 2, seed=0, metrics=["ttft_mean"])
    assert rec[0].filename == __file__
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sweep_points(listed.replace(fleet=fastsim.Fleet(2)), {"engine.max_num_seqs": [4, 64]})
        sweep_points(listed, {"workload.arrival_rate": [2.0, 4.0]})


def test_a_comparison_of_an_engine_no_listed_replica_runs_warns():
    four = fastsim.EngineConfig(max_num_seqs=4)
    listed = fastsim.Scenario(workload=W, fleet=fastsim.Fleet(replicas=[(four, LAT)] * 2))
    other = listed.replace(**{"engine.max_num_seqs": 64})
    msg = r"scenarios \['b'\] differ from the baseline 'a' in the scenario's engine"
    with pytest.warns(UserWarning, match=msg) as rec:
        fastsim.compare({"a": listed, "b": other}, n_replications=2, seed=0)
    assert rec[0].filename == __file__


def test_the_stability_check_of_an_autoscaled_fleet():
    """An autoscaled fleet's stability is checked on its own per-request
    results (`_autoscale.served_autoscaled`): at 60 req/s three replicas of
    four seats are overloaded, at 6 req/s not (stop 66's review: it was
    skipped, and before that checked on one replica)."""
    e = fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=400)
    fleet = fastsim.Fleet(router="jsq", autoscaler=fastsim.Autoscaler(max_replicas=3))
    for rate, over in ((6.0, False), (60.0, True)):
        w = fastsim.Workload(arrival_rate=rate, num_requests=300, prompt_len=fastsim.Exponential(300),
                             output_len=fastsim.Exponential(60))
        res = fastsim.replicate(fastsim.Scenario(engine=e, workload=w, fleet=fleet), n_replications=3, seed=0)
        import warnings
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            st = res.stability
        assert st.replications == 3 and st.overloaded == over


@pytest.mark.parametrize("server", ["fleet", "driven fleet", "disaggregated", "autoscaled"])
@pytest.mark.parametrize("threads", [1, 2])
def test_an_interrupted_fleet_keeps_its_finished_replications(monkeypatch, server, threads):
    """Ctrl-C in a fleet's, a disaggregated server's or an autoscaled fleet's
    run: `fastsim.Interrupted` with the finished replications, each equal to
    an uninterrupted run's (it raised an IndexError from an empty table of
    one replica's width: stop 66's review). The interrupt is raised in the
    fifth replication's Python (`_one`; with the compiled driver, the first
    replication of a later chunk)."""
    from fastsim import _autoscale, _disagg
    from fastsim import _fleet as F

    # (a mixed fleet: the compiled driver takes uniform fleets only, so each replication runs in `_one`)
    mixed = fastsim.Fleet([(fastsim.EngineConfig(max_num_seqs=8), LAT), (fastsim.EngineConfig(max_num_seqs=16), LAT)],
                          router="jsq")
    w = fastsim.Workload(arrival_rate=8.0, num_requests=80)
    sc, module = {
        "fleet": (fastsim.Scenario(workload=w, fleet=mixed), F),
        "driven fleet": (fastsim.Scenario(workload=w, fleet=fastsim.Fleet(2, router="jsq")), F),
        "disaggregated": (fastsim.Scenario(workload=w, fleet=fastsim.Disaggregated(1, 1, kv_bytes_per_token=1e5)),
                          _disagg),
        "autoscaled": (fastsim.Scenario(workload=w,
                                        fleet=fastsim.Fleet(autoscaler=fastsim.Autoscaler(max_replicas=2))),
                       _autoscale)}[server]
    full = fastsim.replicate(sc, n_replications=40, seed=4, n_threads=1).per_replication
    # (the driver runs a chunk's replications after its first, in calls of at most `DRIVER_CALL`)
    name, at = ("_compiled", 2) if server == "driven fleet" else ("_one", 5)
    real, calls = getattr(module, name), []

    def interrupted(*args, **kw):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(module, name, interrupted)
    monkeypatch.setattr(F, "DRIVER_CALL", 16)   # (calls of 16: the second of a 40-replication chunk interrupted)
    with pytest.raises(fastsim.Interrupted) as stop:
        fastsim.replicate(sc, n_replications=40, seed=4, n_threads=threads)
    part = stop.value.partial
    assert part.interrupted and 1 <= part.n_replications < 40
    if server == "driven fleet" and threads == 1:   # (replication 0 by Python, 16 by the first driver call)
        assert part.n_replications == 1 + F.DRIVER_CALL
    pd.testing.assert_frame_equal(part.per_replication, full.loc[part.per_replication.index])


def test_small_input_gaps_give_clear_errors(tmp_path):
    """Found by stop 66's review: raw TypeErrors and AttributeErrors where a
    ValueError names the parameter."""
    res = fastsim.replicate(fastsim.Scenario(workload=W), n_replications=2, seed=0)
    for bad in (123, None):
        with pytest.raises(ValueError, match="path must be a file path"):
            res.save(bad)
    with pytest.raises(ValueError, match=r"classes: .*\(its keys: by, edges, priorities\)"):
        fastsim.Workload(classes={})
    with pytest.raises(ValueError, match="calibration_cov must be a finite symmetric 5 x 5 matrix of real numbers"):
        fastsim.StepNoise(calibration_cov=1 + 2j)
    with pytest.raises(ValueError, match="scenario.fleet must be a fastsim.Fleet .*disaggregation_search"):
        fastsim.fleet_capacity(fastsim.Scenario(workload=W, fleet=fastsim.Disaggregated(1, 1)), {"ttft_mean": 0.1})


def test_the_sweep_cache_key_covers_the_kernel_package(tmp_path):
    """A change of the kernel's code (fastsim/kernel/) or of the packaged data
    invalidates cached sweep points (the key hashed fastsim/*.py only)."""
    import shutil

    from fastsim import _sweep

    copy = tmp_path / "fastsim"
    shutil.copytree(Path(fastsim.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    keys = [_sweep._code_fingerprint.__wrapped__(copy)]   # (uncached: the copy changes between calls)
    for part in ("kernel/replica.py", "data/gpus.toml", "_replicate.py"):
        with open(copy / part, "a") as f:
            f.write("\n# changed\n")
        keys.append(_sweep._code_fingerprint.__wrapped__(copy))
    assert len(set(keys)) == 4
    assert _sweep._code_fingerprint() == _sweep._code_fingerprint(Path(fastsim.__file__).parent)


def test_noise_and_time_parameters_beyond_the_clock_are_refused():
    """Per-run noise factors past exp()'s range hung a run (speed_log_mean=710:
    inf steps), lost its arrivals (prefill_log_mean=710) or made every step 0
    (jitter_sd=30); time-like parameters of 1e300 s gave metrics near 1e300
    (stop 66's review). Refused, naming the parameter and its range."""
    for kw, name in ((dict(speed_log_mean=710.0), "speed_log_mean"),
                     (dict(prefill_log_mean=-710.0), "prefill_log_mean"), (dict(speed_sd=400.0), "speed_sd"),
                     (dict(jitter_sd=30.0), "jitter_sd"),
                     (dict(stall_prob=0.1, stall_mean_s=1e300), "stall_mean_s")):
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number >= .* and <= "):
            fastsim.StepNoise(**kw)
    # (within each range, but together past the clock at 8 standard deviations)
    loud = fastsim.StepNoise(speed_log_mean=10.0, speed_sd=2.0, jitter_sd=2.0)
    with pytest.raises(ValueError, match=r"latency.noise makes the longest step .* at 8 standard deviations"):
        fastsim.Scenario(latency=dataclasses.replace(LAT, noise=loud))
    for make, name in ((lambda: dataclasses.replace(LAT, ttft_overhead_s=1e300), "ttft_overhead_s"),
                       (lambda: fastsim.Fleet(2, routing_latency_s=1e300), "routing_latency_s"),
                       (lambda: fastsim.Disaggregated(1, 1, link_latency_s=1e300), "link_latency_s"),
                       (lambda: fastsim.Workload(arrival_rate=None, max_concurrency=2, think_time_s=1e300),
                        "think_time_s")):
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number >= 0 and <= 1000000000000"):
            make()


def test_a_bad_trace_record_is_refused_naming_the_file_and_the_field(tmp_path):
    """A Mooncake record whose hash ids are not int64 integers raised a raw
    OverflowError, or was truncated (2.5 read as 2); a non-number timestamp
    gave a message naming neither file nor field (stop 66's review)."""
    good = '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n'
    for bad, match in (('"hash_ids": [1, 1e30]', r"record 1 \(hash_ids\): expected a list of integers"),
                       ('"hash_ids": [1, 2.5]', r"record 1 \(hash_ids\): expected a list of integers"),
                       ('"hash_ids": [1, 18446744073709551616]', r"record 1 \(hash_ids\)"),
                       ('"timestamp": "x"', r"record 1 \(timestamp\): expected a number, got 'x'")):
        path = tmp_path / "t.jsonl"
        rec = good.replace('"hash_ids": [1, 2]', bad) if "hash_ids" in bad else good.replace('"timestamp": 0', bad)
        path.write_text(good + rec)
        with pytest.raises(ValueError, match=match):
            fastsim.Workload.from_trace(path)
    path.write_text(good + "{not json\n")
    with pytest.raises(ValueError, match=r"line 2 is not JSON"):
        fastsim.Workload.from_trace(path)
    path.write_text(good + good.replace('"timestamp": 0', '"timestamp": 1000'))
    assert fastsim.Workload.from_trace(path).request_trace.blocks(1).tolist() == [1, 2]
