"""The weighted router (llm-d's inference scheduler: prefix-cache, queue and
KV-cache-utilisation scorers summed with weights, the highest picked, ties
drawn; `kernel.router._route_weighted`): the kernel and the reference fleet
(`_reference_cluster._WeightedRouter`) bit for bit over weights that let
each scorer decide alone and together, with live and stale views, over
prefix groups and a replayed trace's block identities; exact properties
that need neither (a prefix-only router keeps each group on one replica;
where every replica ties it is the random router, request for request);
and what it is for: more prefix-cache hits than round robin."""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._cli import _load
from fastsim.kernel import cluster as C
from test_fleet_reference import CASES, HASH_CASES, _agree, _fleet_record
from test_replica import _stream

#: Each scorer alone, llm-d's default profile, and weights of no round ratio.
WEIGHTS = [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (3.0, 2.0, 2.0), (0.5, 7.0, 0.25)]
SCENARIOS = {"prefix-groups": CASES["prefix-caching"], "tight-kv": CASES["tight-kv-context"],
             "block-hash": HASH_CASES["block-hash-shared"]}


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_weighted_router_is_the_reference_bit_for_bit(name, weights):
    sc = SCENARIOS[name]
    for rep, (nrep, staleness, latency) in enumerate(((3, 0.0, 0.0), (4, 0.25, 0.01), (2, 0.0, 0.005))):
        stream, p = _stream(sc, rep)
        _agree(sc, stream, p, "weighted", nrep, staleness, latency, weights)


def _grouped(rate, n=120):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=400, block_size=16, enable_prefix_caching=True),
        workload=fastsim.Workload(arrival_rate=rate, num_requests=n, prompt_len=fastsim.Uniform(100, 300),
                                  output_len=fastsim.Uniform(2, 40), prefix_groups=5, prefix_len=64),
        latency=fastsim.LatencyModel.default())


def _owners(sc, nrep, router, weights=(3.0, 2.0, 2.0), rep=0):
    stream, p = _stream(sc, rep)
    res = C.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(weights=weights),
                                  K.ROUTER_CODES[router], nrep, 11, 12, rep)
    return stream, res[5]


@pytest.mark.parametrize("rep", range(4))
def test_prefix_only_weights_keep_each_group_on_the_replica_it_first_went_to(rep):
    """Weights (1, 0, 0): a group's first request finds no replica routed its
    prefix (all score 0: one drawn); from then on only that replica scores
    above 0 (its 4 shared blocks of at least 6), so the group stays there."""
    stream, owner = _owners(_grouped(30.0), 4, "weighted", (1.0, 0.0, 0.0), rep)
    pgrp = stream[5]
    assert (pgrp >= 0).all()
    for g in np.unique(pgrp):
        assert len(np.unique(owner[pgrp == g])) == 1
    assert len(np.unique(owner)) > 1


@pytest.mark.parametrize("weights", [(0.0, 1.0, 0.0), (0.0, 1.0, 1.0)])
def test_where_every_replica_ties_the_weighted_router_is_the_random_router(weights):
    """Requests 100 s apart each leave before the next arrives: every
    replica shows no request waiting and no block in use, every score ties
    (no prefix weight), and the picker draws among all of them from the
    router's stream, as the random router draws: the same replicas."""
    sc = _grouped(0.01, n=60)
    _, weighted = _owners(sc, 5, "weighted", weights)
    _, random = _owners(sc, 5, "random")
    assert np.array_equal(weighted, random) and len(np.unique(random)) == 5


def test_weighted_router_hits_the_prefix_cache_more_than_round_robin():
    """What its prefix scorer is for (paired replications, the same streams):
    the per-replication difference of prefix-cache hit rates against round
    robin has a 99% lower confidence bound above 0."""
    sc = HASH_CASES["block-hash-shared"].replace(**{"engine.num_gpu_blocks": 400})
    rates = {}
    for router in ("weighted", "round_robin"):
        res = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(replicas=3, router=router)), n_replications=12, seed=3)
        rates[router] = res.per_replication["prefix_hit_rate"].to_numpy()
    d = rates["weighted"] - rates["round_robin"]
    assert d.mean() - 2.718 * d.std(ddof=1) / np.sqrt(d.size) > 0   # (Student t, 11 degrees, one-sided 99%)


def test_scorer_weights_through_the_api_and_toml(tmp_path):
    sc = _grouped(20.0, n=80).replace(fleet=fastsim.Fleet(3, router="weighted", scorer_weights=[1, 0.5, 0]))
    assert sc.fleet.scorer_weights == (1.0, 0.5, 0.0)
    res = fastsim.replicate(sc, n_replications=3, seed=1)
    again = fastsim.replicate(sc, n_replications=3, seed=1, n_threads=2)
    assert np.array_equal(res.per_replication.to_numpy(), again.per_replication.to_numpy())
    other = fastsim.replicate(sc.replace(fleet=dataclasses.replace(sc.fleet, scorer_weights=(0, 1, 0))),
                              n_replications=3, seed=1)
    assert not np.array_equal(res.per_replication["ttft_mean"], other.per_replication["ttft_mean"])
    toml = tmp_path / "fleet.toml"
    toml.write_text('[workload]\narrival_rate = 20.0\nnum_requests = 80\nprefix_groups = 5\nprefix_len = 64\n'
                    '[fleet]\nreplicas = 3\nrouter = "weighted"\nscorer_weights = [1, 0.5, 0]\n')
    assert _load(toml)[0].fleet.scorer_weights == (1.0, 0.5, 0.0)


@pytest.mark.parametrize("weights, match", [
    ((0, 0, 0), r"scorer_weights must have a weight > 0 \(all 0"),
    ((1, 2), "scorer_weights must be three numbers"),
    ({0: 1, 1: 2, 2: 3}, "scorer_weights must be three numbers"),
    ((1, -1, 0), r"scorer_weights\[1\] must be a finite number >= 0"),
    ((1, float("inf"), 0), r"scorer_weights\[1\] must be a finite number"),
])
def test_bad_scorer_weights_are_refused_by_name(weights, match):
    with pytest.raises(ValueError, match=match):
        fastsim.Fleet(2, router="weighted", scorer_weights=weights)


def test_an_autoscaler_refuses_the_weighted_router():
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=20),
                          fleet=fastsim.Fleet(router="weighted", autoscaler=fastsim.Autoscaler(max_replicas=3)))
    with pytest.raises(ValueError, match="an affinity or weighted router's table"):
        fastsim.replicate(sc, n_replications=2, seed=0)


def test_the_memory_guard_counts_the_weighted_routers_table():
    """Its record of the prefix groups routed to each replica is a table of
    groups x replicas (`cluster.table_size`), one per thread: counted."""
    from fastsim._memory import _fleet_parts

    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=8.0, num_requests=300, prefix_groups=20000,
                                                    prefix_len=16),
                          fleet=fastsim.Fleet(64, router="weighted"))
    weighted = _fleet_parts(sc)[0][0]
    jsq = _fleet_parts(sc.replace(fleet=fastsim.Fleet(64, router="jsq")))[0][0]
    assert weighted - jsq == 8 * 20000 * (64 - 1)


@pytest.mark.parametrize("name", ["instant-link", "tight-decode-kv"])
def test_each_pool_of_a_disaggregated_server_routes_by_its_own_weights(name):
    """Both pools weighted, each by its own weights (the prefill pool's in
    its fleet record, the decode pool's in the link's): the reference's, bit
    for bit; and swapping the two weight vectors changes the routing."""
    from fastsim._reference_disagg import simulate_disagg_reference
    from test_disagg import CONFIGS, LAT_D, LAT_P, WORKLOAD, _kernel, _packed, _same

    pe, n_p, de, n_d, bw, lat, stale, lag = CONFIGS[name]
    weights = ((1.0, 0.0, 0.5), (0.25, 3.0, 1.0))
    owners = []
    for w in (weights, weights[::-1]):
        stream = K.draw_workload(1, 11, 12, *K.scenario_arrays(_packed(pe, LAT_P, WORKLOAD), lat=False))
        per, _, _ = _kernel(stream, pe, LAT_P, n_p, "weighted", de, LAT_D, n_d, "weighted", kvb=2000.0, bw=bw,
                            lat=lat, workload=WORKLOAD, staleness=stale, lag=lag, keys=(11, 12, 1), weights=w)
        ref = simulate_disagg_reference(*stream, prefill=(pe, LAT_P, n_p, "weighted"),
                                        decode=(de, LAT_D, n_d, "weighted"), kv_bytes_per_token=2000.0,
                                        link_bandwidth=bw, link_latency_s=lat, routing_latency_s=lag,
                                        staleness_s=stale, load_cap=2, seed_keys=(11, 12, 1), scorer_weights=w)
        _same(per, ref)
        owners.append(np.concatenate([per["prefill_replica"], per["decode_replica"]]))
    assert not np.array_equal(*owners)
