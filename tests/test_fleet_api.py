"""The fleet's Python API: `Fleet` validation, `replicate` of a fleet
scenario (the metric names of one replica plus the load-balance columns,
nothing lost, results independent of threads), `fleet_capacity`'s input
checks."""

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K


def _sc(router="jsq", replicas=3, **fleet):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=200),
        workload=fastsim.Workload(arrival_rate=9.0, num_requests=150, prompt_len=fastsim.Uniform(10, 100),
                                  output_len=fastsim.Uniform(5, 60), warmup_requests=10),
        fleet=fastsim.Fleet(replicas=replicas, router=router, **fleet))


@pytest.mark.parametrize("kwargs, match", [
    (dict(replicas=0), "replicas must be"),
    (dict(replicas=[1, 2]), r"replicas\[0\] must be a fastsim.Deployment or an \(EngineConfig, LatencyModel\) pair"),
    (dict(router="fastest"), "router must be one of random, round_robin"),
    (dict(router_staleness_s=-1.0), "router_staleness_s"),
    (dict(routing_latency_s=-0.1), "routing_latency_s"),
    (dict(prefix_load_cap=-1), "prefix_load_cap"),
    (dict(gpu_hour_price=-2.0), "gpu_hour_price"),
])
def test_a_bad_fleet_is_refused_naming_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastsim.Fleet(**kwargs)


def test_a_scenario_takes_only_a_fleet():
    with pytest.raises(ValueError, match="fleet must be None or a fastsim.Fleet"):
        fastsim.Scenario(fleet=4)


def test_a_fleet_runs_on_the_numba_backend_only():
    with pytest.raises(ValueError, match="backend must be 'numba' for a fleet"):
        fastsim.replicate(_sc(), n_replications=2, backend="reference")


@pytest.mark.parametrize("router", list(K.ROUTER_CODES))
def test_replicate_a_fleet(router):
    sc = _sc(router, router_staleness_s=0.3 if router == "jsq" else 0.0, routing_latency_s=0.002)
    one = fastsim.replicate(sc, n_replications=12, seed=3, n_threads=1)
    two = fastsim.replicate(sc, n_replications=12, seed=3, n_threads=2, batch_size=5)
    pr = one.per_replication
    assert list(pr.columns[:K.N_COLUMNS]) == list(K.COLUMNS)
    assert list(pr.columns[K.N_COLUMNS:]) == list(K.FLEET_COLUMNS)
    assert np.array_equal(pr.to_numpy(), two.per_replication.to_numpy(), equal_nan=True)
    # nothing lost: every arrival accounted once
    total = pr[["n_completed", "n_rejected", "n_dropped", "n_unfinished"]].sum(axis=1)
    assert (pr["n_arrived"] == total).all() and (pr["n_arrived"] == 150).all()
    assert (pr["blocks_used_at_end"] == 0).all()
    # Little's law holds for the fleet as a sample-path identity
    np.testing.assert_allclose(pr["time_in_system_integral"], pr["sojourn_sum"], rtol=1e-9)
    assert "requests_per_replica_cv" in one.summary().index


def test_fleet_capacity_checks_its_inputs():
    sc = _sc().replace(fleet=None)
    with pytest.raises(ValueError, match="scenario.fleet must be a fastsim.Fleet"):
        fastsim.fleet_capacity(sc, {"ttft_p99": 1.0})
    with pytest.raises(ValueError, match="max_replicas"):
        fastsim.fleet_capacity(_sc(), {"ttft_p99": 1.0}, max_replicas=0)
    with pytest.raises(ValueError, match="slo"):
        fastsim.fleet_capacity(_sc(), {})


def test_a_fleet_from_toml_and_the_cli_finds_the_fewest_replicas(tmp_path, capsys):
    """[fleet] in a scenario file, and `fastsim capacity --replicas auto`: random
    routing of M/D/1 replicas (service 10 steps of 10 ms, 6 req/s): one replica's
    mean TTFT is 10 ms + 0.6 * 0.1 / (2 * 0.4) = 85 ms, two replicas' 31.4 ms, so
    under a 50 ms limit the answer is 2."""
    from fastsim import _cli

    path = tmp_path / "fleet.toml"
    path.write_text('[engine]\nmax_num_seqs = 1\nmax_num_batched_tokens = 64\nnum_gpu_blocks = 400\n'
                    '[workload]\narrival_rate = 6.0\nnum_requests = 300\nprompt_len = 1\noutput_len = 10\n'
                    '[latency]\nstep_s = 0.01\n[fleet]\nrouter = "random"\nreplicas = 3\n')
    sc = _cli._load_config(path)[0]
    assert sc.fleet == fastsim.Fleet(replicas=3, router="random")
    assert _cli.main(["capacity", str(path), "--replicas", "auto", "--slo", "ttft_mean=0.05",
                      "--replications", "30", "--seed", "1"]) == 0
    assert "fewest replicas proven to meet them: 2" in capsys.readouterr().out
    path.write_text(path.read_text().replace('router = "random"', 'routr = "random"'))
    with pytest.raises(ValueError, match=r"\[fleet\].*routr"):
        _cli._load_config(path)


@pytest.mark.parametrize("router", ["jsq", "prefix_affinity"])
def test_replicate_a_fleet_of_vllm_v1_servers(router):
    """vLLM 0.22's serving rules in every replica (async scheduling, the
    full-input gate, the null block, caching by block hash): nothing lost,
    the blocks all free at the end, Little's law, the same bits on two
    threads, and a fleet of one replica is the replica's replications."""
    v1 = dict(async_scheduling=True, scheduler_reserve_full_isl=True, null_block=True,
              enable_prefix_caching=True, block_hash_caching=True)
    sc = _sc(router).replace(**{f"engine.{k}": v for k, v in v1.items()},
                             **{"workload.prefix_groups": 3, "workload.prefix_len": 48})
    one = fastsim.replicate(sc, n_replications=8, seed=5, n_threads=1)
    two = fastsim.replicate(sc, n_replications=8, seed=5, n_threads=2, batch_size=3)
    pr = one.per_replication
    assert np.array_equal(pr.to_numpy(), two.per_replication.to_numpy(), equal_nan=True)
    total = pr[["n_completed", "n_rejected", "n_dropped", "n_unfinished"]].sum(axis=1)
    assert (pr["n_arrived"] == total).all() and (pr["blocks_used_at_end"] == 0).all()
    np.testing.assert_allclose(pr["time_in_system_integral"], pr["sojourn_sum"], rtol=1e-9)
    assert (pr["prefix_hit_rate"] > 0).all()
    alone = fastsim.replicate(sc.replace(fleet=None), n_replications=8, seed=5).per_replication
    single = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(replicas=1, router=router)), n_replications=8,
                               seed=5).per_replication
    np.testing.assert_array_equal(single[list(K.COLUMNS)].to_numpy(), alone[list(K.COLUMNS)].to_numpy())


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("arrival_rate", [None, 14.0])
@pytest.mark.parametrize("fleet", [fastsim.Fleet(1), fastsim.Fleet(3, router="round_robin"),
                                   fastsim.Fleet(replicas=[(fastsim.EngineConfig(), fastsim.LatencyModel.default()),
                                                           (fastsim.EngineConfig(max_num_seqs=8),
                                                            fastsim.LatencyModel.default())])],
                         ids=["one", "three", "mixed"])
def test_a_closed_loop_in_a_fleet_runs_its_clients_across_the_replicas(policy, arrival_rate, fleet):
    """A closed loop's seats span the fleet (`kernel.fleet_client`): every
    request is sent and served once. Before stop 68 the fleet refused it
    (stops 65-66 of benchmarks/HISTORY.md: such runs had handed every
    request at once). A fleet of one replica is the engine's own closed
    loop (no request here is rejected: the same counts and latencies)."""
    kw = dict(priorities=(0, 1), priority_probs=(0.5, 0.5)) if policy == "priority" else {}
    w = fastsim.Workload(arrival_rate=arrival_rate, max_concurrency=4, num_requests=60, **kw)
    e = fastsim.EngineConfig(max_num_seqs=6, num_gpu_blocks=90, policy=policy)
    alone = fastsim.replicate(fastsim.Scenario(engine=e, workload=w), n_replications=2, seed=0).per_replication
    res = fastsim.replicate(fastsim.Scenario(engine=e, workload=w, fleet=fleet), n_replications=2,
                            seed=0).per_replication
    assert (res["n_completed"] == 60).all() and (alone["n_completed"] == 60).all()
    if fleet.n_replicas == 1:
        for col in ("ttft_mean", "ttft_p99", "e2e_mean", "tpot_mean", "request_throughput", "window_s"):
            np.testing.assert_allclose(res[col], alone[col], rtol=1e-12)
    else:   # (every replica served: the most any got is under the whole stream's share of one)
        assert (res["requests_per_replica_max_ratio"] < fleet.n_replicas).all()
