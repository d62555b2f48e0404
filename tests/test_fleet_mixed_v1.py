"""Mixed fleets under vLLM V1's rules: replicas of different engines, each
with its own async scheduling, full-input gate, null block and caching by
block hash (on or off per replica), and their own latency models, behind one
router.

* The compiled fleet (`kernel.cluster`) and the reference fleet
  (`_reference_cluster`: one `_PausedReplica` per entry, its own engine,
  block pool and latency model; async replicas advanced by
  `advance_async_until`) agree bit for bit per request over every router,
  live and stale views, a routing latency, shared prefixes and tight KV.
* A mixed fleet of identical entries is the uniform fleet, bit for bit,
  under async scheduling and caching by block hash.
* Nothing is lost.
"""

import dataclasses

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._reference_cluster import ROUTERS
from fastsim.kernel import cluster as C
from test_fleet_mixed import _agree as _base_agree, _compare, _records as _base_records
from test_fleet_reference import _fleet_record

LAT = fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5,
                           ctx_per_token_s=2e-7)
SLOW = fastsim.LatencyModel(base_s=0.012, decode_scale_s=2e-4, decode_alpha=1.3, prefill_per_token_s=6e-5,
                            ctx_per_token_s=4e-7)


def eng(async_on, v1, caching, **kw):
    """An engine with every vLLM V1 switch set explicitly."""
    return fastsim.EngineConfig(async_scheduling=async_on, scheduler_reserve_full_isl=v1, null_block=v1,
                                enable_prefix_caching=caching, block_hash_caching=caching, **kw)


#: The fleet's stream: shared prefixes (three groups of 96 tokens), so that
#: caching by block hash has something to find and prefix-affinity routing
#: something to follow.
BASE = fastsim.Scenario(
    engine=eng(True, True, True, max_num_seqs=8, num_gpu_blocks=400),
    workload=fastsim.Workload(arrival_rate=12.0, num_requests=90, prompt_len=fastsim.Uniform(20, 300),
                              output_len=fastsim.Uniform(5, 200), prefix_groups=3, prefix_len=96),
    latency=LAT)
#: Replicas under vLLM 0.22's defaults, under each rule switched off, and
#: the synchronous engine, with tight KV (preemptions, a counted block pool
#: laid out) and another block size.
V1_ALL = (eng(True, True, True, max_num_seqs=8, num_gpu_blocks=400),
          dataclasses.replace(fastsim.LatencyModel.default(), ttft_overhead_s=0.0))
ASYNC_TIGHT = (eng(True, False, True, max_num_seqs=6, num_gpu_blocks=45, max_num_batched_tokens=256), LAT)
SYNC_HASH_32 = (eng(False, True, True, max_num_seqs=6, num_gpu_blocks=100, block_size=32), SLOW)
ASYNC_NO_CACHE = (eng(True, True, False, max_num_seqs=4, num_gpu_blocks=60, max_num_batched_tokens=128), SLOW)
SYNC_PLAIN = (eng(False, False, False, max_num_seqs=4, num_gpu_blocks=50), LAT)
FLEETS = [
    [V1_ALL, ASYNC_TIGHT, SYNC_HASH_32],
    [ASYNC_NO_CACHE, SYNC_PLAIN, ASYNC_TIGHT, V1_ALL],
    [SYNC_HASH_32, ASYNC_TIGHT],
]


def _records(members, rep):
    return _base_records(members, rep, BASE)


def _agree(members, rep, router, staleness, latency):
    return _base_agree(members, rep, router, staleness, latency, BASE)


@pytest.mark.parametrize("router", ROUTERS)
def test_kernel_v1_mixed_fleet_is_the_reference_bit_for_bit(router):
    used, preempted = set(), 0
    for rep, (members, staleness, latency) in enumerate(zip(FLEETS, (0.0, 0.5, 0.0), (0.0, 0.01, 0.0))):
        owner, npre = _agree(members, rep, router, staleness, latency)
        used |= set(owner.tolist())
        preempted += int(npre.sum())
    assert len(used) >= 2        # the router did spread requests
    assert preempted > 0         # and the tight replicas did preempt


@pytest.mark.parametrize("seed", range(6))
def test_kernel_v1_mixed_fleet_random_members(seed):
    """Random replicas: each V1 switch, the block size, the KV size and the
    latency model drawn per replica; a random router."""
    rng = np.random.default_rng(100 + seed)
    members = []
    for _ in range(int(rng.integers(2, 5))):
        bs = int(rng.choice([8, 16, 32]))
        members.append((eng(bool(rng.integers(2)), bool(rng.integers(2)), bool(rng.integers(2)), block_size=bs,
                            max_num_seqs=int(rng.integers(2, 9)),
                            num_gpu_blocks=int(rng.choice([700, 1500, 6000])) // bs + 2,
                            max_num_batched_tokens=int(rng.choice([128, 512])),
                            policy=str(rng.choice(["fcfs", "priority"]))),
                        LAT if rng.integers(2) else SLOW))
    router = str(rng.choice(ROUTERS))
    _agree(members, seed, router, float(rng.choice([0.0, 0.3])), float(rng.choice([0.0, 0.005])))


@pytest.mark.parametrize("noisy", [False, True], ids=["deterministic", "step-noise"])
@pytest.mark.parametrize("v1", [True, False], ids=["v1-rules", "synchronous"])
def test_a_mixed_fleet_of_identical_entries_is_the_uniform_fleet(v1, noisy):
    """Under vLLM's rules (async scheduling, the gate, the null block,
    caching by block hash) and without them, with per-step noise and
    without, `replicate`'s rows of a mixed fleet of four identical entries
    equal the uniform fleet's."""
    sc = BASE.replace(engine=eng(v1, v1, v1, max_num_seqs=6, num_gpu_blocks=120), latency=NOISY if noisy else LAT,
                      **{"workload.num_requests": 300})
    for router in ("jsq", "least_kv", "prefix_affinity", "power_of_two"):
        uniform = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(replicas=4, router=router)), n_replications=3,
                                    seed=7)
        mixed = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(replicas=[(sc.engine, sc.latency)] * 4,
                                                                 router=router)), n_replications=3, seed=7)
        assert uniform.per_replication.equals(mixed.per_replication)
        if v1:
            assert (uniform.per_replication["prefix_hit_rate"] > 0).all()


def test_a_v1_mixed_fleet_loses_nothing():
    """Every arrival accounted once through `replicate`, on 1 and 2 threads
    alike (the same rows)."""
    sc = BASE.replace(fleet=fastsim.Fleet(replicas=FLEETS[1], router="jsq"),
                      **{"workload.num_requests": 300})
    a = fastsim.replicate(sc, n_replications=4, seed=2, n_threads=1).per_replication
    b = fastsim.replicate(sc, n_replications=4, seed=2, n_threads=2).per_replication
    counts = ["n_completed", "n_rejected", "n_dropped", "n_unfinished"]
    assert (a["n_arrived"] == a[counts].sum(axis=1)).all()
    assert (a["n_arrived"] == 300).all()
    assert a.equals(b)


#: Per-step noise: jitter and stalls, with and without per-run effects.
NOISY = dataclasses.replace(LAT, noise=fastsim.StepNoise(jitter_sd=0.3, stall_prob=0.02, stall_mean_s=0.05))
NOISY_SLOW = dataclasses.replace(SLOW, noise=fastsim.StepNoise(jitter_sd=0.1, speed_sd=0.2))


def _run_records(members, rep):
    """The replication's latency and float records per replica, as
    `_fleet._one` makes them: per-run effects drawn per model, then a
    step-noise key of its own per replica."""
    from fastsim._fleet import set_replica_noise_keys
    stream, (ipars, fpars, lats) = _records(members, rep)
    for r in range(len(members)):
        lats[r], fpars[r] = K.run_records(lats[r], fpars[r], 11, 12, rep)
    set_replica_noise_keys(lats)
    return stream, ipars, fpars, lats


def _agree_noisy(members, rep, router, staleness=0.0, latency=0.0):
    stream, ipars, fpars, lats = _run_records(members, rep)
    owner, _, first = _compare(stream, (ipars, fpars, lats), members, rep, router, staleness, latency, BASE)
    return owner, first


@pytest.mark.parametrize("router", ROUTERS)
def test_kernel_noisy_mixed_fleet_is_the_reference_bit_for_bit(router):
    """Per-step noise per replica (each its own stream), per-run effects
    per model, under async scheduling and caching by block hash and not."""
    members = [(V1_ALL[0], NOISY), (ASYNC_TIGHT[0], NOISY_SLOW), (SYNC_HASH_32[0], NOISY), (SYNC_PLAIN[0], LAT)]
    used = set()
    for rep, (staleness, latency) in enumerate(((0.0, 0.0), (0.3, 0.005))):
        owner, _ = _agree_noisy(members, rep, router, staleness, latency)
        used |= set(owner.tolist())
    assert len(used) >= 2


def test_replicas_draw_their_own_step_noise():
    """Two identical noisy replicas under round robin: the same requests on
    the same replica index get other times than with the noise of replica 0
    copied to replica 1 (the replicas' streams differ), and a noiseless
    model gives none of that (the keys change nothing without noise)."""
    from fastsim._fleet import set_replica_noise_keys
    from fastsim._reference_cluster import _replica_key   # (the reference's statement of the rule)
    members = [(SYNC_PLAIN[0], NOISY)] * 2
    stream, ipars, fpars, lats = _run_records(members, 0)
    k0 = (int(lats[0, K.L_KEY_HI]) << 32) | int(lats[0, K.L_KEY_LO])
    k1 = (int(lats[1, K.L_KEY_HI]) << 32) | int(lats[1, K.L_KEY_LO])
    assert k1 == _replica_key(k0, 1) != k0
    shared = lats.copy()
    shared[1] = shared[0]
    rr = K.ROUTER_CODES["round_robin"]
    own = C.simulate_fleet_stream(*stream, ipars, fpars, lats, _fleet_record(), rr, 2)
    same = C.simulate_fleet_stream(*stream, ipars, fpars, shared, _fleet_record(), rr, 2)
    on1 = own[5] == 1
    assert np.array_equal(own[1][~on1], same[1][~on1])   # replica 0 unchanged
    assert not np.array_equal(own[1][on1], same[1][on1])   # replica 1's noise its own
    quiet = np.array([K.run_records(r, f, 11, 12, 0)[0] for r, f in zip(_records([(SYNC_PLAIN[0], LAT)] * 2, 0)[1][2],
                                                                        fpars)])
    before = quiet.copy()
    set_replica_noise_keys(quiet)
    assert np.array_equal(quiet, before)


def test_a_noisy_fleet_of_one_replica_is_the_engine():
    """`replicate` of a fleet of one replica with per-step noise gives the
    engine's rows (same metrics, bit for bit)."""
    sc = BASE.replace(latency=NOISY, engine=V1_ALL[0], **{"workload.num_requests": 200})
    one = fastsim.replicate(sc, n_replications=3, seed=4).per_replication
    fleet = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(replicas=1, router="jsq")), n_replications=3,
                              seed=4).per_replication
    cols = [c for c in one.columns if c in fleet.columns]
    assert len(cols) > 20
    pd.testing.assert_frame_equal(one[cols], fleet[cols], check_exact=True)


def test_a_noisy_uniform_fleet_runs_and_loses_nothing():
    sc = BASE.replace(latency=NOISY, engine=V1_ALL[0], fleet=fastsim.Fleet(replicas=3, router="jsq"),
                      **{"workload.num_requests": 300})
    a = fastsim.replicate(sc, n_replications=4, seed=2, n_threads=1).per_replication
    b = fastsim.replicate(sc, n_replications=4, seed=2, n_threads=2).per_replication
    counts = ["n_completed", "n_rejected", "n_dropped", "n_unfinished"]
    assert (a["n_arrived"] == a[counts].sum(axis=1)).all() and (a["n_arrived"] == 300).all()
    assert a.equals(b)
