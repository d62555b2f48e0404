"""EngineConfig's defaults are vLLM 0.22's serving defaults (async scheduling,
the full-input gate, the null block, prefix caching by block hash), resolved
per engine: on where the engine supports them, off where it cannot have them,
and resolved again by `EngineConfig.replace` / `Scenario.replace`."""

import dataclasses
import pickle

import pandas as pd
import pytest

import fastsim
from fastsim import EngineConfig
from conftest import SYNC

V1 = ("async_scheduling", "scheduler_reserve_full_isl", "null_block", "enable_prefix_caching", "block_hash_caching")


def switches(e):
    return {name: getattr(e, name) for name in V1}


def test_the_defaults_are_vllm_022s():
    e = EngineConfig()
    assert switches(e) == dict.fromkeys(V1, True)
    assert set(e.defaulted) == set(V1) - {"null_block"}
    assert e.usable_gpu_blocks == e.num_gpu_blocks - 1
    # the same engine, spelled out, is equal (the record of defaults is not compared)
    assert e == EngineConfig(**dict.fromkeys(V1, True))


@pytest.mark.parametrize("kw, off", [
    (dict(scheduler="static"), {"async_scheduling", "scheduler_reserve_full_isl", "enable_prefix_caching",
                                "block_hash_caching"}),
    (dict(preemption_mode="swap"), {"async_scheduling", "enable_prefix_caching", "block_hash_caching"}),
    (dict(policy="priority", priority_preemption=True), {"async_scheduling"}),
    (dict(block_hash_caching=False), {"async_scheduling", "block_hash_caching"}),
    (dict(enable_prefix_caching=False), {"enable_prefix_caching", "block_hash_caching"}),
])
def test_a_default_the_engine_cannot_have_is_off(kw, off):
    e = EngineConfig(**kw)
    assert {name for name, on in switches(e).items() if not on} == off


@pytest.mark.parametrize("kw, name", [
    (dict(scheduler="static", async_scheduling=True), "async_scheduling"),
    (dict(scheduler="static", enable_prefix_caching=True), "enable_prefix_caching"),
    (dict(preemption_mode="swap", async_scheduling=True), "async_scheduling"),
    (dict(policy="priority", priority_preemption=True, async_scheduling=True), "async_scheduling"),
    (dict(async_scheduling="yes"), "async_scheduling"),
])
def test_a_switch_set_by_the_user_is_checked_not_overridden(kw, name):
    with pytest.raises(ValueError, match=name):
        EngineConfig(**kw)


def test_replace_resolves_the_defaults_again():
    e = EngineConfig()
    static = e.replace(scheduler="static")
    assert not static.async_scheduling and not static.enable_prefix_caching and static.null_block
    assert static.replace(scheduler="continuous") == e
    # a switch the user set stays set
    sync = EngineConfig(async_scheduling=False)
    assert sync.replace(max_num_seqs=8).async_scheduling is False
    # dataclasses.replace keeps the resolved values, so the conflict is named
    with pytest.raises(ValueError, match="requires scheduler='continuous'"):
        dataclasses.replace(e, scheduler="static")
    sc = fastsim.Scenario()
    assert not sc.replace(**{"engine.scheduler": "static"}).engine.async_scheduling


def test_the_defaults_survive_pickling_and_toml(tmp_path):
    e = EngineConfig(max_num_seqs=8)
    back = pickle.loads(pickle.dumps(e))
    assert back == e and back.defaulted == e.defaulted
    path = tmp_path / "s.toml"
    path.write_text("[engine]\nmax_num_seqs = 8\n\n[workload]\narrival_rate = 1.0\nnum_requests = 10\n")
    from fastsim._cli import _load

    sc, _ = _load(path)
    assert switches(sc.engine) == dict.fromkeys(V1, True)
    path.write_text("[engine]\nasync_scheduling = false\nenable_prefix_caching = false\n\n"
                    "[workload]\narrival_rate = 1.0\nnum_requests = 10\n")
    sc, _ = _load(path)
    assert not sc.engine.async_scheduling and not sc.engine.block_hash_caching
    assert sc.engine.scheduler_reserve_full_isl and sc.engine.null_block


def test_an_autoscaled_fleet_keeps_vllm_defaults_and_runs_with_caching():
    """An autoscaled fleet takes prefix caching by block hash (each replica that
    starts has a cold cache): `Scenario` switches none of vLLM's defaults off,
    and a run with shared prefixes hits; the prefix-group cache is refused."""
    fleet = fastsim.Fleet(router="jsq",
                          autoscaler=fastsim.Autoscaler(metric="queue_depth", target=4.0, interval_s=5.0,
                                                        min_replicas=1, max_replicas=3))
    wl = fastsim.Workload(arrival_rate=2.0, num_requests=20, prefix_groups=2, prefix_len=64)
    sc = fastsim.Scenario(workload=wl, fleet=fleet)
    assert sc.engine == EngineConfig() and sc.engine.defaulted == EngineConfig().defaulted
    assert all(getattr(sc.engine, name) for name in V1)
    res = fastsim.replicate(sc, n_replications=2, seed=0)
    assert res.to_frame().loc["prefix_hit_rate", "estimate"] > 0.0
    with pytest.raises(ValueError, match="block_hash_caching must be True with an autoscaler"):
        fastsim.replicate(fastsim.Scenario(engine=EngineConfig(enable_prefix_caching=True, block_hash_caching=False),
                                           workload=wl, fleet=fleet), n_replications=2, seed=0)


def test_the_default_engine_is_the_reference_bit_for_bit():
    # vLLM's defaults, tight KV (preemptions), shared prefixes: kernel = reference per request
    sc = fastsim.Scenario(
        engine=EngineConfig(max_num_seqs=16, max_num_batched_tokens=256, num_gpu_blocks=120),
        workload=fastsim.Workload(arrival_rate=6.0, num_requests=300, prompt_len=fastsim.LogNormal(120, 0.7),
                                  output_len=fastsim.LogNormal(60, 0.8), prefix_groups=4,
                                  prefix_len=fastsim.Uniform(16, 64)),
        latency=fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.2, prefill_per_token_s=3e-5))
    stream = fastsim.sample_requests(sc, seed=3)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert fast["num_preemptions"].sum() > 0
    sync = fastsim.simulate_requests(sc.replace(**{f"engine.{k}": v for k, v in SYNC.items()}), stream)
    assert not fast["first_token_s"].equals(sync["first_token_s"])   # the rules are on: the times differ


def test_the_scenario_says_which_rules_it_simulates():
    assert "vLLM 0.22's serving defaults (async scheduling, the full-input gate, the null block, prefix caching " \
           "by block hash)" in fastsim.Scenario().describe()
    sync = fastsim.Scenario(engine=EngineConfig.synchronous())
    assert "V1 rules on: none (the synchronous loop)" in sync.describe()
    assert switches(sync.engine) == dict.fromkeys(V1, False)
    static = fastsim.Scenario(engine=EngineConfig(scheduler="static"))
    assert "V1 rules on: the null block;" in static.describe()
