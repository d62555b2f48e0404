"""Autoscaled fleets with prefix caching by block hash: a replica that
starts in a row whose replica left starts with a cold cache (a new vLLM
server's), in the kernel (`kernel.autoscale._cold`) and in the reference
(`fastsim._reference_autoscale`), and the two agree bit for bit per request
(cached tokens included) with shared prefix groups, async scheduling on and
off, over the routers that read the replicas' state and one that does not,
with rows reused; every block is free at the end of the run."""

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._numba_options import python_version
from fastsim._reference_autoscale import simulate_autoscaled_reference
from fastsim._replicate import pack_scenario
from fastsim.kernel import autoscale as A
from fastsim.kernel import cluster as C
from fastsim.kernel.workspace import (N_RI, RI_DIM_CAP, RI_DIM_NBP, RI_DIM_NBT, RI_DIM_NCNT, RI_DIM_NHELD,
                                      RI_DIM_NITL, WF_FINISH, WF_FIRST, WI_CTOK, WI_STATUS, Stream, _carve,
                                      _ws_need_handed)

#: Bursts, a lull (the fleet shrinks, replicas drain and leave), bursts again
#: (new replicas start in the rows left).
SCHEDULE = fastsim.RateSchedule(times=(0.0, 12.0, 30.0, 45.0), rates=(12.0, 0.3, 12.0, 12.0))

POLICY = dict(metric="queue_depth", target=0.5, interval_s=1.5, min_replicas=1, max_replicas=3,
              provisioning_delay_s=0.0, scale_in_cooldown_s=0.0, tolerance=0.0)
POLICY_DELAYED = dict(metric="queue_depth", target=1.0, interval_s=2.0, min_replicas=1, max_replicas=3,
                      provisioning_delay_s=1.0, scale_in_cooldown_s=2.0, tolerance=0.1)


def _scenario(async_on, blocks=60):
    eng = fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=blocks, enable_prefix_caching=True,
                               block_hash_caching=True, async_scheduling=async_on,
                               scheduler_reserve_full_isl=async_on, null_block=True)
    wl = fastsim.Workload(rate_schedule=SCHEDULE, num_requests=260, prompt_len=fastsim.Uniform(40, 160),
                          output_len=fastsim.Uniform(30, 250), prefix_groups=3, prefix_len=64)
    return fastsim.Scenario(engine=eng, workload=wl)


def _run_kernel(stream, p, router, policy):
    """The compiled fleet over one stream (as `simulate_autoscaled_stream`),
    its buffers kept: per request (row, local index, status, first token,
    finish, cached tokens), and the row buffers."""
    n = stream[0].size
    ipar = p["ipar"]
    full = K.engine_variant(ipar)
    m = policy["max_replicas"]
    need_i, need_f = _ws_need_handed(np.int64(n), stream[1], stream[2], stream[5], stream[6], ipar)
    fb = C.fleet_buffers(n, m, need_i, need_f, C._ngroups(stream[5]))
    ab = A.autoscale_buffers(m, 4096)
    rc = A._simulate_autoscaled(np.int64(n), *stream, ipar, p["fpar"], p["lat"], np.zeros(3),
                                np.int64(K.ROUTER_CODES[router]), fastsim.Autoscaler(**policy)._record(),
                                np.uint64(11), np.uint64(12), np.int64(3), fb, ab, full)
    assert rc == 0
    col = lambda a, c: np.array([a[r][c * n + j] for r, j in zip(fb.owner[:n], fb.local[:n])])   # noqa: E731
    return (fb.owner[:n].copy(), col(fb.wi, WI_STATUS), col(fb.wf, WF_FIRST), col(fb.wf, WF_FINISH),
            col(fb.wi, WI_CTOK), fb, ab)


def _pool(fb, r, n, ipar):
    w = fb.wi[r]
    ri = w[w.size - N_RI:]
    rs = fb.rs_i
    stream = Stream(fb.rs_a[r], rs[0, r], rs[1, r], rs[2, r], rs[3, r], rs[4, r], rs[5, r])
    dims = (np.int64(n), ipar[K.I_BLOCK_SIZE], ri[RI_DIM_CAP], ri[RI_DIM_NCNT], ri[RI_DIM_NHELD], ri[RI_DIM_NITL],
            ri[RI_DIM_NBP], ri[RI_DIM_NBT])
    pool = python_version(_carve)(stream, tuple(int(x) for x in dims), w, fb.wf[r])[4].pool
    nb = int(ipar[K.I_NUM_GPU_BLOCKS])
    seen, b = 0, pool.qnext[nb]   # the free-block queue, walked from its sentinel
    while b != nb and seen <= nb:
        seen, b = seen + 1, pool.qnext[b]
    return int(pool.ref[:nb].sum()), seen


def _restarts(windows):
    """Whether the fleet shrank and later grew again (rows reused: the
    lowest free rows are taken)."""
    step = np.diff(windows[:, K.W_SERVING] + windows[:, K.W_PROVISIONING])
    down = np.flatnonzero(step < 0)
    return down.size > 0 and bool(np.any(step[down[0]:] > 0))


@pytest.mark.parametrize("async_on", [False, True])
@pytest.mark.parametrize("router", ["jsq", "round_robin", "power_of_two", "least_kv"])
def test_kernel_is_the_reference_bit_for_bit_with_caching(async_on, router):
    sc = _scenario(async_on)
    p = pack_scenario(sc)
    assert p["ipar"][K.I_CACHING] == 1 and p["ipar"][K.I_BLOCK_HASH] >= 1
    hits = 0
    for rep, policy in enumerate((POLICY, POLICY_DELAYED)):
        stream = K.draw_workload(rep, 11, 12, *K.scenario_arrays(p, lat=False))
        owner, status, first, finish, ctok, fb, ab = _run_kernel(stream, p, router, policy)
        ref = simulate_autoscaled_reference(*stream, sc.engine, sc.latency, router, seed_keys=(11, 12, 3), **policy)
        assert np.array_equal(owner, ref["replica"])
        assert np.array_equal(status, ref["status"].astype(np.int64) + K.ST_COMPLETED)
        assert np.array_equal(first, ref["first_token_s"], equal_nan=True)
        assert np.array_equal(finish, ref["finish_s"], equal_nan=True)
        assert np.array_equal(ctok, ref["cached_tokens"])
        nw = int(ab.out[A.O_NWIN])
        assert np.array_equal(ab.windows[:nw, :K.W_SLO_MET], ref["windows"])
        assert _restarts(ab.windows[:nw])
        hits += int((ctok > 0).sum())
        # conservation: every arrival completed once, every block free and uncached at the end
        assert (status == K.ST_COMPLETED).all() and status.size == stream[0].size
        nb = int(p["ipar"][K.I_NUM_GPU_BLOCKS])
        for r in range(policy["max_replicas"]):
            assert _pool(fb, r, stream[0].size, p["ipar"]) == (0, nb)   # none held, all queued (free)
    assert hits > 0   # shared prefixes do hit


@pytest.mark.parametrize("async_on", [False, True])
def test_a_restarted_row_starts_with_a_cold_cache(async_on):
    """A row whose replica left and took a new one: the new replica's first
    request of each prefix group finds nothing cached, though the row's
    earlier replica had served that group; a later one of the group hits."""
    sc = _scenario(async_on, blocks=200)   # (room to keep a group's blocks cached)
    p = pack_scenario(sc)
    stream = K.draw_workload(0, 11, 12, *K.scenario_arrays(p, lat=False))
    pgrp = stream[5]
    owner, status, first, finish, ctok, fb, ab = _run_kernel(stream, p, "round_robin", POLICY)
    ref = simulate_autoscaled_reference(*stream, sc.engine, sc.latency, "round_robin", seed_keys=(11, 12, 3),
                                        **POLICY)
    assert np.array_equal(ctok, ref["cached_tokens"])   # (the kernel's hits, the reference's timeline)
    arrival = stream[0]
    starts = sorted(ref["starts"])
    checked = later_hits = 0
    for k, (tau, r) in enumerate(starts):
        mine = np.flatnonzero(owner == r)
        before = mine[arrival[mine] < tau]   # the row's earlier replicas'
        until = min([t for t, q in starts[k + 1:] if q == r], default=np.inf)
        life = mine[(arrival[mine] >= tau) & (arrival[mine] < until)]   # the new replica's
        assert before.size == 0 or finish[before].max() <= tau   # (the row held nothing when it started)
        for g in np.unique(pgrp[life]):
            if g < 0 or not np.any(pgrp[before] == g):
                continue
            of_g = life[pgrp[life] == g]
            assert ctok[of_g[0]] == 0   # cold: what the row's earlier replica cached is gone
            checked += 1
            later_hits += int((ctok[of_g[1:]] > 0).any())
    assert checked > 0 and later_hits > 0


def test_an_autoscaled_fleet_runs_with_vllm_defaults():
    """`Scenario` keeps vLLM's defaults (prefix caching by block hash on) for
    an autoscaled fleet; `replicate` runs it; the prefix-group cache is refused."""
    a = fastsim.Autoscaler(metric="queue_depth", target=1.0, interval_s=2.0, min_replicas=1, max_replicas=3)
    wl = fastsim.Workload(rate_schedule=SCHEDULE, num_requests=120, prefix_groups=2, prefix_len=64)
    sc = fastsim.Scenario(workload=wl, fleet=fastsim.Fleet(router="jsq", autoscaler=a))
    assert sc.engine.enable_prefix_caching and sc.engine.block_hash_caching and sc.engine.async_scheduling
    res = fastsim.replicate(sc, n_replications=2, seed=1)
    hit = res.to_frame().loc["prefix_hit_rate", "estimate"]
    assert 0.0 < hit < 1.0   # the shared prefixes hit, the rest of each prompt does not
    with pytest.raises(ValueError, match="block_hash_caching must be True with an autoscaler"):
        fastsim.replicate(sc.replace(**{"engine.block_hash_caching": False}), n_replications=2, seed=0)
