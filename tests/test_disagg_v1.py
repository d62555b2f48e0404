"""Disaggregated prefill and decode under vLLM V1's rules: async scheduling
and caching by block hash in either pool (``docs/engine-model.md``,
"Disaggregated prefill and decode", "Under vLLM V1's rules"). The kernel
held to the reference bit for bit per request over random scenarios (async
on and off x caching by block hash on and off x tight and loose KV x prefix
groups), conservation across the pools, the one-step lag of async
scheduling in closed form, and the API's checks."""

import itertools
import math

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._reference_disagg import simulate_disagg_reference

from test_disagg import _kernel, _packed, _same

ROUTERS = tuple(K.ROUTER_CODES)


def _engine(async_on, hashing, *, isl=None, null=None, **kw):
    """An engine with vLLM V1's switches set explicitly (``isl``/``null``:
    the full-input gate and the null block, by default with ``async_on``
    and ``hashing``)."""
    return fastsim.EngineConfig(async_scheduling=async_on,
                                scheduler_reserve_full_isl=async_on if isl is None else isl,
                                null_block=hashing if null is None else null,
                                enable_prefix_caching=hashing, block_hash_caching=hashing, **kw)


LAT_P = fastsim.LatencyModel(base_s=0.012, prefill_per_token_s=4e-5, ctx_per_token_s=1e-7)
LAT_D = fastsim.LatencyModel(base_s=0.008, decode_scale_s=0.002, decode_alpha=0.7, ctx_per_token_s=2e-7)


def _random_case(rng, async_on, hashing, tight, groups):
    """A random disaggregated server and workload: the engines' sizes, block
    size, chunking, gate and null block, the pools, routers and link drawn
    from ``rng``; ``tight``: caches too small for the load (preemptions on
    both sides)."""
    bs = int(rng.choice([16, 32]))
    kw = dict(block_size=bs)

    def eng(seqs, blocks, budget):
        return _engine(async_on, hashing, isl=bool(rng.integers(2)) if async_on else False,
                       null=bool(rng.integers(2)), max_num_seqs=seqs, num_gpu_blocks=blocks,
                       max_num_batched_tokens=budget, **kw)

    pe = eng(int(rng.integers(2, 9)), int(rng.integers(30, 50)) if tight else 400, int(rng.choice([128, 256, 512])))
    de = eng(int(rng.integers(4, 17)), int(rng.integers(25, 40)) if tight else 800, int(rng.choice([64, 128, 256])))
    shared = dict(prefix_groups=3, prefix_len=int(rng.choice([64, 96]))) if groups else {}
    wl = fastsim.Workload(arrival_rate=float(rng.uniform(4, 12)), num_requests=60,
                          prompt_len=fastsim.Uniform(20, 360), output_len=fastsim.Uniform(1, 120),
                          warmup_requests=3, **shared)
    n_p, n_d = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    router_p, router_d = (ROUTERS[int(rng.integers(len(ROUTERS)))] for _ in range(2))
    bw = float(rng.choice([math.inf, 5e6, 2e7]))
    return pe, de, wl, n_p, n_d, router_p, router_d, bw


CASES = list(itertools.product((False, True), (False, True), ("loose", "tight"), ("groups", "unique")))


@pytest.mark.parametrize("async_on, hashing, kv, groups", CASES)
def test_kernel_is_the_reference_bit_for_bit_under_v1_rules(async_on, hashing, kv, groups):
    rng = np.random.default_rng([36, 40, *(int(x) for x in (async_on, hashing, kv == "tight", groups == "groups"))])
    preempted = 0
    decode_hits = 0
    for rep in range(3):
        pe, de, wl, n_p, n_d, router_p, router_d, bw = _random_case(rng, async_on, hashing, kv == "tight",
                                                                     groups == "groups")
        pp = _packed(pe, LAT_P, wl)
        stream = K.draw_workload(rep, 5, 6, *K.scenario_arrays(pp, lat=False))
        per, row, _ = _kernel(stream, pe, LAT_P, n_p, router_p, de, LAT_D, n_d, router_d, kvb=1000.0, bw=bw,
                              lat=0.002, workload=wl, lag=0.005, keys=(5, 6, rep))
        ref = simulate_disagg_reference(*stream, prefill=(pe, LAT_P, n_p, router_p),
                                        decode=(de, LAT_D, n_d, router_d), kv_bytes_per_token=1000.0,
                                        link_bandwidth=bw, link_latency_s=0.002, routing_latency_s=0.005,
                                        load_cap=2, seed_keys=(5, 6, rep))
        _same(per, ref)
        assert all(b == 0 for b in ref["decode_blocks_end"])
        assert dict(zip(K.COLUMNS, row))["blocks_used_at_end"] == 0
        preempted += int(per["num_preemptions"].sum())
        decode_hits += int(np.nansum(ref["decode_cached_tokens"]))
    if kv == "tight":
        assert preempted > 0           # the case is the one it says
    if hashing and groups == "groups":
        assert decode_hits > 0         # transferred prompts found their group's blocks cached on the decode side
    if not hashing:
        assert decode_hits == 0


def _vllm_defaults(**kw):
    return _engine(True, True, isl=True, null=True, **kw)


@pytest.mark.parametrize("rules", ["sync", "vllm-0.22-defaults"])
def test_conservation_across_pools_under_v1_rules(rules):
    """Every request routed once to the prefill pool and, if it completed
    there, handed once to the decode pool; its prefill blocks freed at its
    first token, before its KV reaches the decode replica; every block free
    (referenced by none: cached ones are free) at the end in both pools;
    Little's law over both pools and the links."""
    make = _vllm_defaults if rules != "sync" else (lambda **kw: _engine(False, False, **kw))
    pe = make(max_num_seqs=6, num_gpu_blocks=60, max_num_batched_tokens=256)
    de = make(max_num_seqs=8, num_gpu_blocks=40, max_num_batched_tokens=128)
    wl = fastsim.Workload(arrival_rate=8.0, num_requests=80, prompt_len=fastsim.Uniform(20, 300),
                          output_len=fastsim.Uniform(1, 150), warmup_requests=4, prefix_groups=3, prefix_len=64)
    pp = _packed(pe, LAT_P, wl)
    for rep in range(3):
        stream = K.draw_workload(rep, 7, 8, *K.scenario_arrays(pp, lat=False))
        n = stream[0].size
        per, row, _ = _kernel(stream, pe, LAT_P, 2, "jsq", de, LAT_D, 2, "vllm_dp", kvb=2000.0, bw=5e6, lat=0.001,
                              workload=wl, lag=0.002, keys=(7, 8, rep))
        c = dict(zip(K.COLUMNS, row))
        handed = per["decode_replica"] >= 0
        done = per["status"] == K.ST_COMPLETED
        assert ((per["prefill_replica"] >= 0) & (per["prefill_replica"] < 2)).all()
        assert np.isnan(per["ready_s"][~handed]).all()
        assert np.array_equal(per["prefill_finish_s"][handed], per["first_token_s"][handed])
        assert (per["first_token_s"][handed] <= per["ready_s"][handed]).all()
        assert (per["ready_s"][handed & done] < per["decode_first_token_s"][handed & done]).all()
        assert (per["num_tokens"][done] == np.asarray(stream[2])[done]).all()
        assert c["n_arrived"] == n
        assert c["n_completed"] + c["n_rejected"] + c["n_dropped"] + c["n_unfinished"] == n
        assert c["n_completed"] == done.sum() == n   # (both pools can hold every request)
        assert c["blocks_used_at_end"] == 0
        assert c["time_in_system_integral"] == pytest.approx(c["sojourn_sum"], rel=1e-9)
        if rules != "sync":
            assert per["num_preemptions"].sum() > 0 and c["prefix_hit_rate"] > 0


# ------------------------------------------------------------------------------
# The one-step lag in closed form

C_P, C_D = 0.1, 0.02
O_LONG = 400
#: (decode step m during which the request's KV arrives, fraction of the step, output)
LATE = ((10, 0.3, 5), (21, 0.5, 1), (33, 0.7, 12), (47, 0.9, 3))


@pytest.mark.parametrize("async_on, hashing", list(itertools.product((False, True), (False, True))))
def test_async_lag_on_the_decode_side_in_closed_form(async_on, hashing):
    """One prefill replica (one seat, constant steps ``C_P``) and one decode
    replica with room for everything (constant steps ``C_D``), an instant
    link. Request 0 (long output) keeps the decode replica stepping from
    ``s0 = C_P`` on: its steps end at ``s0 + (j + 1) C_D``. Each later request
    reaches the prefill replica idle (its first token at ``a + C_P``, sync
    or async) and its KV reaches the decode replica during decode step ``m``.
    Synchronous: it is scheduled at that step's end and its first decode
    token comes at ``s0 + (m + 2) C_D``; async: the step after the one in
    flight was scheduled when it started, before the KV came, so one step
    later, ``s0 + (m + 3) C_D``; it then decodes a token a step."""
    s0 = C_P
    arrival = [0.0] + [s0 + (m + f) * C_D - C_P for m, f, _ in LATE]
    output = [O_LONG] + [o for _, _, o in LATE]
    n = len(arrival)
    stream = (arrival, [200] * n, output, [0] * n, [0] * n, [-1] * n, [0] * n)
    eng = _engine(async_on, hashing, max_num_seqs=1, num_gpu_blocks=200)
    big = _engine(async_on, hashing, max_num_seqs=64, num_gpu_blocks=5000)
    lp, ld = fastsim.LatencyModel(base_s=C_P), fastsim.LatencyModel(base_s=C_D)
    per, _, _ = _kernel(stream, eng, lp, 1, "jsq", big, ld, 1, "jsq", kvb=1.0, bw=math.inf, lat=0.0)
    ref = simulate_disagg_reference(*stream, prefill=(eng, lp, 1, "jsq"), decode=(big, ld, 1, "jsq"),
                                    kv_bytes_per_token=1.0, link_bandwidth=math.inf)
    _same(per, ref)
    lag = 1 if async_on else 0
    assert per["first_token_s"] == pytest.approx(np.array(arrival) + C_P, abs=1e-9)
    assert per["decode_first_token_s"][0] == pytest.approx(s0 + C_D, abs=1e-9)
    assert per["finish_s"][0] == pytest.approx(s0 + O_LONG * C_D, abs=1e-9)
    for i, (m, _, o) in enumerate(LATE, start=1):
        assert per["ready_s"][i] == pytest.approx(per["first_token_s"][i], abs=0)
        assert per["decode_first_token_s"][i] == pytest.approx(s0 + (m + 2 + lag) * C_D, abs=1e-9)
        assert per["finish_s"][i] == pytest.approx(s0 + (m + 1 + lag + o) * C_D, abs=1e-9)


# ------------------------------------------------------------------------------
# The API

def _scenario(engine, dis):
    wl = fastsim.Workload(arrival_rate=6.0, num_requests=100, prompt_len=fastsim.Uniform(100, 1200),
                          output_len=fastsim.Uniform(10, 150), warmup_requests=5, prefix_groups=4, prefix_len=256)
    return fastsim.Scenario(engine=engine, workload=wl, fleet=dis, ttft_slo_s=1.0)


def test_replicate_runs_vllm_defaults_in_both_pools_reproducibly():
    dis = fastsim.Disaggregated(prefill=2, decode=fastsim.Fleet(2, router="least_kv"), link_bandwidth_gbps=50,
                                link_latency_s=0.001, kv_bytes_per_token=65536)
    sc = _scenario(_vllm_defaults(max_num_seqs=32, num_gpu_blocks=3000), dis)
    a = fastsim.replicate(sc, 6, seed=4, n_threads=1)
    b = fastsim.replicate(sc, 6, seed=4, n_threads=2)
    assert a.per_replication.equals(b.per_replication)
    f = a.per_replication
    assert (f["blocks_used_at_end"] == 0).all()
    assert (f["prefix_hit_rate"] > 0).all()            # shared prefixes hit
    assert (f["ttft_decode_mean"] > f["ttft_mean"]).all()
    assert not a.stability.overloaded                  # (its streams run again through both pools)
    assert "ttft_decode_mean" in a.summary().index
    sync = fastsim.replicate(_scenario(_engine(False, False, max_num_seqs=32, num_gpu_blocks=3000), dis), 6, seed=4)
    assert sync.per_replication["prefix_hit_rate"].isna().all()   # (no caching: no hit rate)
    assert not a.per_replication.equals(sync.per_replication)


def test_the_decode_side_refuses_prefix_group_caching():
    de = fastsim.EngineConfig(num_gpu_blocks=500, enable_prefix_caching=True, block_hash_caching=False,
                              async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False)
    dis = fastsim.Disaggregated(decode_server=(de, fastsim.LatencyModel(base_s=0.01)))
    with pytest.raises(ValueError, match="decode engine: enable_prefix_caching=True needs block_hash_caching=True"):
        fastsim.replicate(_scenario(_engine(False, False, num_gpu_blocks=500), dis), 2, seed=0)


@pytest.mark.parametrize("async_on", [False, True])
def test_a_transferred_prompt_finds_its_prefix_cached_on_the_decode_side(async_on):
    """Two requests of one prefix group (64 tokens: 4 blocks of 16), the
    second after the first has left both pools: on the prefill replica and on
    the decode replica it finds the first's 4 prefix blocks cached (the decode
    side cached the first's transferred prompt), and nothing without caching."""
    stream = ([0.0, 1.0], [100, 100], [4, 4], [0, 0], [0, 0], [0, 0], [64, 64])
    lp, ld = fastsim.LatencyModel(base_s=0.1), fastsim.LatencyModel(base_s=0.02)
    for hashing, expect in ((True, [0, 64]), (False, [0, 0])):
        eng = _engine(async_on, hashing, max_num_seqs=4, num_gpu_blocks=100)
        per, row, _ = _kernel(stream, eng, lp, 1, "jsq", eng, ld, 1, "jsq", kvb=1.0, bw=math.inf, lat=0.0)
        ref = simulate_disagg_reference(*stream, prefill=(eng, lp, 1, "jsq"), decode=(eng, ld, 1, "jsq"),
                                        kv_bytes_per_token=1.0, link_bandwidth=math.inf)
        _same(per, ref)
        assert list(ref["decode_cached_tokens"]) == expect
        assert per["finish_s"][0] < 1.0          # (the first has left before the second arrives)
        # both pools' hit tokens over both pools' queried prompts: 64 on each side, of 2 x 2 x 100
        hit = dict(zip(K.COLUMNS, row))["prefix_hit_rate"]
        assert hit == pytest.approx(128 / 400, rel=1e-12) if hashing else np.isnan(hit)
