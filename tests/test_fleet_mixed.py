"""Mixed fleets: replicas of different engines and latency models behind
one router (`Fleet(replicas=[Deployment | (EngineConfig, LatencyModel),
...])`).

* The compiled fleet (`kernel.cluster`, each replica on its own parameter
  records and workspace size) and the reference fleet (one `_Reference`
  replica per entry) agree bit for bit per request, over every router, live
  and stale views, with a routing latency; the common and the full engine
  (swap preemption on one replica) both.
* A mixed fleet of identical entries is the uniform fleet, bit for bit.
* Nothing is lost; `fleet_capacity` refuses a mixed fleet clearly; bad
  entries are refused before any kernel runs.
"""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._reference_cluster import ROUTERS, simulate_fleet_reference
from fastsim._replicate import pack_scenario
from fastsim.kernel import cluster as C
from test_fleet_reference import _fleet_record, _kernel_status

LAT = fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5,
                           ctx_per_token_s=2e-7)
BASE = fastsim.Scenario(
    engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=400),
    workload=fastsim.Workload(arrival_rate=9.0, num_requests=70, prompt_len=fastsim.Uniform(20, 200),
                              output_len=fastsim.Uniform(20, 300), warmup_requests=5))
#: Three kinds of replica: a large one with a constant-ish step, a small one
#: with a context term and tight KV (preemption, slow steps), one with block
#: size 32 and chunking limits.
MEMBERS = [
    (fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=400), fastsim.LatencyModel.default()),
    (fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=45, max_num_batched_tokens=256), LAT),
    (fastsim.EngineConfig(max_num_seqs=6, num_gpu_blocks=100, block_size=32), LAT),
]
#: The full engine on one replica: swap preemption.
SWAP = (fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=30, preemption_mode="swap", swap_space_blocks=20), LAT)


def _records(members, rep, base=BASE):
    """The fleet's stream (the base scenario's) and a record row per replica."""
    p = pack_scenario(base)
    stream = K.draw_workload(rep, 11, 12, *K.scenario_arrays(p, lat=False))
    packs = [pack_scenario(base.replace(engine=e, latency=lat)) for e, lat in members]
    return stream, [np.array([q[k] for q in packs]) for k in ("ipar", "fpar", "lat")]


def _compare(stream, records, members, rep, router, staleness, latency, base):
    """The kernel fleet on ``records`` against the reference fleet of
    ``members``, request by request, bit for bit; the kernel's owners,
    preemptions and first-token times."""
    ipars, fpars, lats = records
    nrep = len(members)
    st, first, finish, npre, g, owner, row, bal = C.simulate_fleet_stream(
        *stream, ipars, fpars, lats, _fleet_record(staleness, latency), K.ROUTER_CODES[router], nrep, 11, 12, rep)
    ref = simulate_fleet_reference(*stream, [e for e, _ in members], [lat for _, lat in members], nrep, router,
                                   horizon_s=base.workload.horizon_s, staleness_s=staleness,
                                   routing_latency_s=latency, load_cap=2, seed_keys=(11, 12, rep))
    assert np.array_equal(owner, ref["replica"])
    assert np.array_equal(st, _kernel_status(ref["status"]))
    assert np.array_equal(first, ref["first_token_s"], equal_nan=True)
    assert np.array_equal(finish, ref["finish_s"], equal_nan=True)
    assert np.array_equal(npre, ref["num_preemptions"]) and np.array_equal(g, ref["num_tokens"])
    return owner, npre, first


def _agree(members, rep, router, staleness, latency, base=BASE):
    stream, records = _records(members, rep, base)
    owner, npre, _ = _compare(stream, records, members, rep, router, staleness, latency, base)
    return owner, npre


@pytest.mark.parametrize("router", ROUTERS)
def test_kernel_mixed_fleet_is_the_reference_bit_for_bit(router):
    used, preempted = set(), 0
    for rep, (members, staleness, latency) in enumerate(((MEMBERS, 0.0, 0.0), (MEMBERS[::-1], 0.5, 0.01),
                                                         (MEMBERS[1:] + [SWAP], 0.0, 0.0))):
        owner, npre = _agree(members, rep, router, staleness, latency)
        used |= set(owner.tolist())
        preempted += int(npre.sum())
    assert len(used) >= 2        # the router did spread requests
    assert preempted > 0         # and the tight replicas did preempt


def test_a_mixed_fleet_of_identical_entries_is_the_uniform_fleet():
    sc = BASE.replace(latency=LAT, **{"workload.num_requests": 300})
    for router in ("jsq", "least_kv", "power_of_two"):
        uniform = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(replicas=4, router=router)), n_replications=4,
                                    seed=7)
        mixed = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(replicas=[(sc.engine, sc.latency)] * 4,
                                                                 router=router)), n_replications=4, seed=7)
        assert uniform.per_replication.equals(mixed.per_replication)


def test_a_mixed_fleet_loses_nothing_and_spreads_by_speed():
    """Every arrival accounted once; under JSQ the fast replica (half the
    step time) takes more of the requests than the slow one in every
    replication's total (paired: the same streams)."""
    fast = (BASE.engine, LAT)
    slow = (BASE.engine, fastsim.LatencyModel(base_s=0.012, decode_scale_s=2e-4, decode_alpha=1.3,
                                              prefill_per_token_s=6e-5, ctx_per_token_s=4e-7))
    sc = BASE.replace(fleet=fastsim.Fleet(replicas=[fast, slow], router="jsq"),
                      **{"workload.num_requests": 400, "workload.arrival_rate": 12.0})
    res = fastsim.replicate(sc, n_replications=6, seed=2)
    pr = res.per_replication
    counts = ["n_completed", "n_rejected", "n_dropped", "n_unfinished"]
    assert (pr["n_arrived"] == pr[counts].sum(axis=1)).all()
    assert (pr["n_arrived"] == 400).all()
    stream, (ipars, fpars, lats) = _records([fast, slow], 0)
    owner = C.simulate_fleet_stream(*stream, ipars, fpars, lats, _fleet_record(), K.ROUTER_CODES["jsq"], 2)[5]
    assert (owner == 0).sum() > (owner == 1).sum()


def test_mixed_fleets_are_refused_where_they_are_not_defined():
    sc = BASE.replace(fleet=fastsim.Fleet(replicas=MEMBERS[1:]))
    with pytest.raises(ValueError, match="fleet_capacity searches a number of identical replicas"):
        fastsim.fleet_capacity(sc, slo={"ttft_mean": 1.0})
    with pytest.raises(ValueError, match=r"replicas\[1\] must be a fastsim.Deployment"):
        fastsim.Fleet(replicas=[MEMBERS[0], (BASE.engine,)])
    with pytest.raises(ValueError, match="empty list"):
        fastsim.Fleet(replicas=[])
    with pytest.raises(ValueError, match="one ttft_overhead_s"):
        fastsim.Fleet(replicas=[MEMBERS[1], (BASE.engine, dataclasses.replace(LAT, ttft_overhead_s=0.05))])


def test_a_deployment_entry_is_its_engine_and_latency():
    """A Deployment entry is its (engine, latency) pair, and a fleet of two
    GPU kinds runs and loses nothing."""
    h100 = fastsim.Deployment("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", max_num_seqs=16)
    a100 = fastsim.Deployment("meta-llama/Llama-3.1-8B-Instruct", gpu="A100", max_num_seqs=16)
    fleet = fastsim.Fleet(replicas=[h100, a100, h100], router="jsq")
    assert fleet.replicas[0] == (h100.engine, h100.latency) and fleet.n_replicas == 3
    sc = fastsim.Scenario(engine=h100.engine, latency=h100.latency, fleet=fleet,
                          workload=fastsim.Workload(arrival_rate=6.0, num_requests=200,
                                                    prompt_len=fastsim.Uniform(50, 500),
                                                    output_len=fastsim.Uniform(20, 200)))
    pr = fastsim.replicate(sc, n_replications=2, seed=1).per_replication
    assert (pr["n_arrived"] == pr["n_completed"]).all()


@pytest.mark.parametrize("router", ("jsq", "round_robin", "least_kv"))
def test_a_mixed_fleet_on_compact_rows_is_on_whole_rows(router):
    """Each kind of replica of a mixed fleet on compact rows of its own
    layout (`kernel.cluster.compact_capacity`'s rows, any capacity, the
    full engine on one replica) gives the bits of whole rows; a capacity
    too small for the run has it again on whole rows."""
    for rep, members in enumerate((MEMBERS, MEMBERS[1:] + [SWAP])):
        stream, (ipars, fpars, lats) = _records(members, rep)
        n, nrep = stream[0].size, len(members)
        args = (*stream, ipars, fpars, lats, _fleet_record(0.0, 0.0), K.ROUTER_CODES[router], nrep, 11, 12, rep)
        whole = C.simulate_fleet_stream(*args, capacity=n)
        for m in (n // nrep + 12, n // 2, 3):
            for x, y in zip(C.simulate_fleet_stream(*args, capacity=m), whole):
                assert np.array_equal(x, y, equal_nan=True), (rep, m)


def test_the_checks_read_the_engines_that_serve_the_requests():
    """The numba backend's support check and the memory guard read the
    engines that serve the requests (`_fleet.running_engines`: a listed
    fleet's replicas, a disaggregated server's pools), not the scenario's
    engine alone (stop 66's review: a listed replica with async scheduling
    and the prefix-group cache ran, and wrongly; a listed fleet of replicas
    with 60 M blocks passed the guard, and failed with a MemoryError)."""
    bad = fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=200, async_scheduling=True,
                               enable_prefix_caching=True, block_hash_caching=False)
    ok = dataclasses.replace(bad, enable_prefix_caching=False)
    w = fastsim.Workload(arrival_rate=30.0, num_requests=40, prefix_groups=4, prefix_len=64)
    for sc in (fastsim.Scenario(engine=ok, latency=LAT, workload=w, fleet=fastsim.Fleet(replicas=[(bad, LAT)] * 2)),
               fastsim.Scenario(engine=ok, latency=LAT, workload=w,
                                fleet=fastsim.Disaggregated(prefill_server=(bad, LAT), kv_bytes_per_token=1e5))):
        with pytest.raises(NotImplementedError, match="async_scheduling=True with the synthetic prefix-group cache"):
            fastsim.replicate(sc, n_replications=2, seed=0)
    # (the scenario's engine, serving no request here, is not refused)
    unused = fastsim.Scenario(engine=bad, latency=LAT, workload=w, fleet=fastsim.Disaggregated(
        prefill_server=(ok, LAT), decode_server=(ok, LAT), kv_bytes_per_token=1e5))
    assert fastsim.replicate(unused, n_replications=2, seed=0).per_replication["n_completed"].sum() == 80
    from fastsim import _memory
    big = fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=60_000_000, enable_prefix_caching=True,
                               block_hash_caching=True)
    small = fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=2000)
    w = fastsim.Workload(arrival_rate=10.0, num_requests=20000, prompt_len=fastsim.Uniform(20, 300),
                         output_len=fastsim.Uniform(1, 4000))
    listed_big = fastsim.Scenario(engine=small, latency=LAT, workload=w, fleet=fastsim.Fleet(replicas=[(big, LAT)] * 4))
    stated_big = listed_big.replace(engine=big, fleet=fastsim.Fleet(4))
    listed_small = stated_big.replace(fleet=fastsim.Fleet(replicas=[(small, LAT)] * 4))
    stated_small = listed_small.replace(engine=small, fleet=fastsim.Fleet(4))
    for sc in (listed_big, stated_big):
        with pytest.raises(ValueError, match="replicate: a fleet of 4 replicas over 20000 requests"):
            _memory.check_run_memory(sc, 10, 1, "replicate")
    assert _memory.check_run_memory(listed_small, 10, 1, "replicate") == \
        _memory.check_run_memory(stated_small, 10, 1, "replicate")


def test_a_serving_engine_must_sort_on_the_stream_s_sjf_keys():
    """The scenario's engine draws each request's SJF key once for the
    stream (`sjf_key`, `length_predictor`); a listed replica scheduling SJF
    on other keys sorted on the scenario's (TTFT 6.49 against 6.35 s for
    the same engine alone, stop 66): refused, naming it. On the same keys
    a listed replica is the engine alone, bit for bit."""
    e0 = fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=200)
    sjf = dataclasses.replace(e0, policy="sjf", sjf_key="prompt")
    w = fastsim.Workload(arrival_rate=6.0, num_requests=120, prompt_len=fastsim.Uniform(20, 400))
    with pytest.raises(ValueError, match=r"^fleet.replicas: sjf_key and length_predictor must be the scenario "
                                         r"engine's \('output', None.*got \('prompt', None\)"):
        fastsim.Scenario(engine=e0, latency=LAT, workload=w, fleet=fastsim.Fleet(replicas=[(sjf, LAT)]))
    with pytest.raises(ValueError, match=r"^prefill_server: sjf_key and length_predictor"):
        fastsim.Scenario(engine=e0, latency=LAT, workload=w,
                         fleet=fastsim.Disaggregated(prefill_server=(sjf, LAT), kv_bytes_per_token=1e5))
    alone = fastsim.Scenario(engine=sjf, latency=LAT, workload=w)
    listed = alone.replace(fleet=fastsim.Fleet(replicas=[(sjf, LAT)]))
    a, b = (fastsim.replicate(sc, n_replications=3, seed=0, n_threads=1).per_replication for sc in (alone, listed))
    assert np.array_equal(a.to_numpy(), b[a.columns].to_numpy(), equal_nan=True)
