"""The compiled fleet (`kernel.cluster`, `kernel.router`) and the reference
fleet (`fastsim._reference_cluster`, plain Python over the reference
simulator, no code shared with the kernel) agree bit for bit per request,
over every router, with live and stale views and a routing latency; and a
fleet of one replica is today's engine bit for bit (per request and the
metrics row), whatever the router."""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._reference_cluster import ROUTERS, simulate_fleet_reference
from fastsim.kernel import cluster as C
from test_replica import CASES as _ALL_CASES, LAT, _stream

CASES = _ALL_CASES

#: The reference's status codes are the kernel's less ST_COMPLETED; a request
#: that never arrived (at or after the horizon) is pending in the kernel.
def _kernel_status(ref_status):
    s = ref_status.astype(np.int64) + K.ST_COMPLETED
    s[ref_status == -1] = K.ST_PENDING
    return s


def _fleet_record(staleness=0.0, latency=0.0, cap=2.0, weights=(3.0, 2.0, 2.0)):
    rec = np.zeros(K.N_FLEET)
    rec[K.FL_STALENESS], rec[K.FL_LATENCY], rec[K.FL_LOAD_CAP] = staleness, latency, cap
    rec[K.FL_SCORERS:K.FL_SCORERS + K.N_SCORERS] = weights
    return rec


def _link_record(bandwidth, latency, kv_bytes, cap=2.0, weights=(3.0, 2.0, 2.0)):
    """A disaggregated server's link record (`kernel.layout.DL_*`; the decode router's cap and weights)."""
    rec = np.zeros(K.N_DLINK)
    rec[K.DL_BANDWIDTH], rec[K.DL_LATENCY], rec[K.DL_KV_BYTES], rec[K.DL_LOAD_CAP] = bandwidth, latency, kv_bytes, cap
    rec[K.DL_SCORERS:K.DL_SCORERS + K.N_SCORERS] = weights
    return rec


def _agree(sc, stream, p, router, nrep, staleness, latency, weights=(3.0, 2.0, 2.0)):
    res = C.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"],
                                  _fleet_record(staleness, latency, weights=weights), K.ROUTER_CODES[router], nrep,
                                  11, 12, 3)
    st, first, finish, npre, g, owner, row, bal = res
    ref = simulate_fleet_reference(*stream, sc.engine, sc.latency, nrep, router, horizon_s=sc.workload.horizon_s,
                                   staleness_s=staleness, routing_latency_s=latency, load_cap=2,
                                   seed_keys=(11, 12, 3), scorer_weights=weights)
    assert np.array_equal(owner, ref["replica"])
    assert np.array_equal(st, _kernel_status(ref["status"]))
    assert np.array_equal(first, ref["first_token_s"], equal_nan=True)
    assert np.array_equal(finish, ref["finish_s"], equal_nan=True)
    assert np.array_equal(npre, ref["num_preemptions"]) and np.array_equal(g, ref["num_tokens"])
    return owner


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_fleet_is_the_reference_fleet_bit_for_bit(name, router):
    sc = CASES[name]
    used = set()
    for rep, (nrep, staleness, latency) in enumerate(((3, 0.0, 0.0), (2, 0.7, 0.01), (4, 0.25, 0.0))):
        stream, p = _stream(sc, rep)
        used |= set(_agree(sc, stream, p, router, nrep, staleness, latency).tolist())
    assert len(used) >= 2   # the router did spread requests


@pytest.mark.parametrize("name", list(CASES))
def test_a_fleet_of_one_replica_is_the_engine_bit_for_bit(name):
    for rep in range(2):
        stream, p = _stream(CASES[name], rep)
        whole = K.simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])
        for router in ROUTERS:
            st, first, finish, npre, g, owner, row, bal = C.simulate_fleet_stream(
                *stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(), K.ROUTER_CODES[router], 1)
            assert np.array_equal(st, whole[0].astype(np.int64))
            for x, y in ((first, whole[1]), (finish, whole[2]), (npre, whole[3]), (g, whole[4]), (row, whole[-1])):
                assert np.array_equal(x, y, equal_nan=True)
            assert (owner == 0).all() and bal[0] == 0.0 and bal[1] == 1.0


#: Prefix caching by block hash in a fleet: each replica its own block pool,
#: its block lists laid out as requests are handed (`replica._hand`); shared
#: prefixes (the prefix-affinity router's case) and, without sharing, a
#: counted pool laid out at the first preemption (tight KV).
_HASH = dict(enable_prefix_caching=True, block_hash_caching=True, scheduler_reserve_full_isl=True, null_block=True)
HASH_CASES = {
    "block-hash-shared": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=6, num_gpu_blocks=80, max_num_batched_tokens=256, **_HASH),
        workload=fastsim.Workload(arrival_rate=9.0, num_requests=90, prompt_len=fastsim.Uniform(20, 300),
                                  output_len=fastsim.Uniform(5, 150), prefix_groups=3, prefix_len=96),
        latency=LAT),
    "block-hash-tight": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=6, num_gpu_blocks=40, max_num_batched_tokens=256, **_HASH),
        workload=fastsim.Workload(arrival_rate=9.0, num_requests=90, prompt_len=fastsim.Uniform(20, 300),
                                  output_len=fastsim.Uniform(5, 150)),
        latency=LAT),
}


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", list(HASH_CASES))
def test_fleets_with_caching_by_block_hash_are_the_reference_bit_for_bit(name, router):
    sc = HASH_CASES[name]
    npre = 0
    for rep, (nrep, staleness, latency) in enumerate(((3, 0.0, 0.0), (2, 0.7, 0.01))):
        stream, p = _stream(sc, rep)
        _agree(sc, stream, p, router, nrep, staleness, latency)
        npre += C.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(staleness, latency),
                                        K.ROUTER_CODES[router], nrep, 11, 12, 3)[3].sum()
    if name == "block-hash-tight":
        assert npre > 0   # (the counted pools were laid out)


def test_prefix_affinity_with_caching_by_block_hash_hits_more_than_round_robin():
    """The point of prefix-aware routing: with vLLM's cache, sending a prefix
    group's requests to one replica finds its blocks cached there more often
    (paired: the same streams, per replication)."""
    sc = HASH_CASES["block-hash-shared"].replace(**{"engine.num_gpu_blocks": 400})
    rates = {}
    for router in ("prefix_affinity", "round_robin"):
        res = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(replicas=3, router=router)), n_replications=6, seed=3)
        rates[router] = res.per_replication["prefix_hit_rate"].to_numpy()
    assert (rates["prefix_affinity"] > rates["round_robin"]).all()


@pytest.mark.parametrize("router", ["jsq", "least_outstanding", "vllm_dp"])
def test_a_fleet_larger_than_the_scan_is_the_reference_bit_for_bit(router):
    """Fleets of more than `cluster.SCAN_MAX` replicas find their due
    replicas by the event queue's heap, not by a scan (every other test here
    runs fewer): the reference fleet's results, bit for bit, at a rate that
    keeps the replicas busy."""
    nrep = C.SCAN_MAX + 6
    base = CASES["stretches"]
    load = dataclasses.replace(base.workload, arrival_rate=base.workload.arrival_rate * nrep / 4, num_requests=6 * nrep)
    sc = base.replace(workload=load)
    stream, p = _stream(sc, 0)
    owner = _agree(sc, stream, p, router, nrep, 0.0, 0.0)
    assert len(set(owner.tolist())) == nrep   # (every replica served)
