"""Disaggregated prefill and decode (`fastsim.Disaggregated`, `kernel.disagg`,
the reference `fastsim._reference_disagg`; ``docs/engine-model.md``,
"Disaggregated prefill and decode"): a hand-computed case, the kernel held
to the reference bit for bit per request, conservation across the pools,
the API's validation, and the xPyD search."""

import math

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._reference_disagg import simulate_disagg_reference
from fastsim._replicate import pack_scenario
from fastsim.kernel import cluster as C
from fastsim.kernel import disagg as D
from test_fleet_reference import _fleet_record, _link_record

ROUTERS = tuple(K.ROUTER_CODES)
COL = {c: j for j, c in enumerate(K.COLUMNS)}

#: vLLM V1's switches, all off: the synchronous model these hand-computed and reference cases are written
#: for, whatever `EngineConfig`'s defaults (vLLM's rules: `test_disagg_v1.py`)
SYNC = dict(async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False, enable_prefix_caching=False,
            block_hash_caching=False)


def _sync(**kw):
    return fastsim.EngineConfig(**{**SYNC, **kw})


def _packed(engine, latency, workload=None):
    wl = workload or fastsim.Workload(arrival_rate=1.0, num_requests=10, prompt_len=fastsim.Uniform(5, 20),
                                      output_len=fastsim.Uniform(1, 5))
    return pack_scenario(fastsim.Scenario(engine=engine, workload=wl, latency=latency))


def _kernel(stream, pe, pl, n_p, router_p, de, dl, n_d, router_d, *, kvb, bw, lat, workload=None, staleness=0.0,
            lag=0.0, cap=2, keys=(11, 12, 3), weights=((3.0, 2.0, 2.0), (3.0, 2.0, 2.0)), **kwargs):
    """The kernel on one stream (a stochastic latency model on the replication's records, as `_disagg._one`
    hands them: per-run effects drawn, the step-noise key set); ``kwargs``: `simulate_disagg_stream`'s."""
    pp, pd_ = _packed(pe, pl, workload), _packed(de, dl, workload)
    (lat_p, fpar_p), (lat_d, fpar_d) = (K.run_records(q["lat"], q["fpar"], *keys) if m.is_stochastic
                                        else (q["lat"], q["fpar"]) for q, m in ((pp, pl), (pd_, dl)))
    link = _link_record(bw, lat, kvb, cap, weights[1])
    return D.simulate_disagg_stream(*stream, (pp["ipar"], fpar_p, lat_p, _fleet_record(staleness, lag, cap, weights[0]),
                                              K.ROUTER_CODES[router_p], n_p),
                                    (pd_["ipar"], fpar_d, lat_d, K.ROUTER_CODES[router_d], n_d), link, *keys,
                                    **kwargs)


def _hand_stream():
    arrival = [0.0, 0.05, 1.0]
    prompt, output = [10, 20, 5], [3, 2, 1]
    return (arrival, prompt, output, [0, 0, 0], [0, 0, 0], [-1, -1, -1], [0, 0, 0])


ENGINE = _sync(max_num_seqs=8, num_gpu_blocks=1000)


@pytest.mark.parametrize("bw, lat, kvb, expect", [
    # an instant link: the KV is at the decode replica at the prefill's first token
    (math.inf, 0.0, 1000.0, {"first": [0.1, 0.2, 1.1], "ready": [0.1, 0.2, 1.1], "first_d": [0.15, 0.25, 1.15],
                             "finish": [0.25, 0.3, 1.15]}),
    # 1e5 bytes/s, 1000 bytes a token, 10 ms latency: A's 10 tokens take 0.1 s (link free at 0.2), B's 20
    # tokens start at 0.2 (its t1) and take 0.2 s, C's 5 tokens 0.05 s
    (1e5, 0.01, 1000.0, {"first": [0.1, 0.2, 1.1], "ready": [0.21, 0.41, 1.16], "first_d": [0.26, 0.46, 1.21],
                         "finish": [0.36, 0.51, 1.21]}),
    # 15 ms a token of A's (1500 bytes): A's transfer ends at 0.25, so B (t1 = 0.2) waits for the link
    (1e5, 0.01, 1500.0, {"first": [0.1, 0.2, 1.1], "ready": [0.26, 0.56, 1.185],
                         "first_d": [0.31, 0.61, 1.235], "finish": [0.41, 0.66, 1.235]}),
])
def test_one_prefill_one_decode_replica_is_the_hand_computed_case(bw, lat, kvb, expect):
    """Constant steps: 0.1 s on the prefill replica, 0.05 s on the decode
    replica. A (a=0, P=10, O=3) and B (a=0.05, P=20, O=2) prefill one step
    each, C (a=1, P=5, O=1) alone. On the decode side each recomputes its
    last prompt token in the step that emits its first token, then decodes
    one token a step (B joins A's batch if it arrives by A's third step)."""
    stream = _hand_stream()
    per, row, extra = _kernel(stream, ENGINE, fastsim.LatencyModel(base_s=0.1), 1, "jsq", ENGINE,
                              fastsim.LatencyModel(base_s=0.05), 1, "jsq", kvb=kvb, bw=bw, lat=lat)
    assert (per["status"] == K.ST_COMPLETED).all()
    assert per["first_token_s"] == pytest.approx(expect["first"], abs=1e-12)
    assert per["ready_s"] == pytest.approx(expect["ready"], abs=1e-12)
    assert per["decode_first_token_s"] == pytest.approx(expect["first_d"], abs=1e-12)
    assert per["finish_s"] == pytest.approx(expect["finish"], abs=1e-12)
    assert list(per["num_tokens"]) == [3, 2, 1]
    # the row: TTFT is the prefill side's first token, TPOT the decode side's
    a = np.array(stream[0])
    assert row[COL["ttft_mean"]] == pytest.approx(np.mean(np.array(expect["first"]) - a), abs=1e-12)
    tpot = [(expect["finish"][0] - expect["first_d"][0]) / 2, expect["finish"][1] - expect["first_d"][1]]
    assert row[COL["tpot_mean"]] == pytest.approx(np.mean(tpot), abs=1e-12)
    assert row[COL["e2e_mean"]] == pytest.approx(np.mean(np.array(expect["finish"]) - a), abs=1e-12)
    ex = dict(zip(K.DISAGG_COLUMNS, extra))
    assert ex["ttft_decode_mean"] == pytest.approx(np.mean(np.array(expect["first_d"]) - a), abs=1e-12)
    assert ex["kv_transfer_mean"] == pytest.approx(np.mean(np.array(expect["ready"]) - expect["first"]), abs=1e-12)
    ref = simulate_disagg_reference(*stream, prefill=(ENGINE, fastsim.LatencyModel(base_s=0.1), 1, "jsq"),
                                    decode=(ENGINE, fastsim.LatencyModel(base_s=0.05), 1, "jsq"),
                                    kv_bytes_per_token=kvb, link_bandwidth=bw, link_latency_s=lat)
    _same(per, ref)


def _same(per, ref):
    status = ref["status"].astype(np.int64) + K.ST_COMPLETED
    assert np.array_equal(per["status"].astype(np.int64), status)
    for k in ("first_token_s", "decode_first_token_s", "ready_s", "finish_s", "prefill_finish_s"):
        assert np.array_equal(per[k], ref[k], equal_nan=True), k
    for k in ("num_preemptions", "num_tokens", "prefill_replica", "decode_replica"):
        assert np.array_equal(per[k], ref[k]), k


LAT_P = fastsim.LatencyModel(base_s=0.012, prefill_per_token_s=4e-5, ctx_per_token_s=1e-7)
LAT_D = fastsim.LatencyModel(base_s=0.008, decode_scale_s=0.002, decode_alpha=0.7, ctx_per_token_s=2e-7)
WORKLOAD = fastsim.Workload(arrival_rate=8.0, num_requests=70, prompt_len=fastsim.Uniform(20, 400),
                            output_len=fastsim.Uniform(1, 250), warmup_requests=4, prefix_groups=3, prefix_len=16)

#: (prefill engine, prefill replicas, decode engine, decode replicas, bandwidth, latency, staleness, lag)
CONFIGS = {
    "instant-link": (_sync(max_num_seqs=8, num_gpu_blocks=300), 2,
                     _sync(max_num_seqs=16, num_gpu_blocks=600), 3, math.inf, 0.0, 0.0, 0.0),
    "finite-link": (_sync(max_num_seqs=4, num_gpu_blocks=200, max_num_batched_tokens=256), 1,
                    _sync(max_num_seqs=16, num_gpu_blocks=600), 2, 2e6, 0.003, 0.0, 0.01),
    # a decode cache too small for its load: preemption by recomputation of requests that came with KV
    "tight-decode-kv": (_sync(max_num_seqs=8, num_gpu_blocks=300), 2,
                        _sync(max_num_seqs=8, num_gpu_blocks=45, max_num_batched_tokens=128), 2,
                        5e6, 0.001, 0.0, 0.0),
    # a stale prefill router; swap preemption on the decode side (the full engine)
    "stale-swap": (_sync(max_num_seqs=4, num_gpu_blocks=120), 3,
                   _sync(max_num_seqs=6, num_gpu_blocks=50, preemption_mode="swap",
                                        swap_space_blocks=30), 2, 1e7, 0.0, 0.3, 0.0),
}


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_kernel_is_the_reference_bit_for_bit(name, router):
    pe, n_p, de, n_d, bw, lat, stale, lag = CONFIGS[name]
    pp = _packed(pe, LAT_P, WORKLOAD)
    used = set()
    preempted = 0
    for rep in range(2):
        stream = K.draw_workload(rep, 11, 12, *K.scenario_arrays(pp, lat=False))
        router_p = ROUTERS[(ROUTERS.index(router) + rep) % len(ROUTERS)]
        per, row, extra = _kernel(stream, pe, LAT_P, n_p, router_p, de, LAT_D, n_d, router, kvb=2000.0, bw=bw,
                                  lat=lat, workload=WORKLOAD, staleness=stale, lag=lag, keys=(11, 12, rep))
        ref = simulate_disagg_reference(*stream, prefill=(pe, LAT_P, n_p, router_p), decode=(de, LAT_D, n_d, router),
                                        kv_bytes_per_token=2000.0, link_bandwidth=bw, link_latency_s=lat,
                                        routing_latency_s=lag, staleness_s=stale, load_cap=2,
                                        seed_keys=(11, 12, rep))
        _same(per, ref)
        assert all(b == 0 for b in ref["decode_blocks_end"])
        used |= set(per["decode_replica"].tolist())
        preempted += int(per["num_preemptions"].sum())
    assert len(used - {-1}) >= 2   # the decode router did spread requests
    if name == "tight-decode-kv":
        assert preempted > 0       # the case is the one it says


@pytest.mark.parametrize("name", list(CONFIGS))
def test_conservation_across_pools(name):
    """Every request is routed once to the prefill pool and, if it completed
    there, handed once to the decode pool; its blocks are held in one place
    at a time (the prefill replica frees them at its first token, before the
    KV reaches the decode replica, which allocates them at admission); no
    block is left allocated at the end; Little's law holds over both pools
    and the links."""
    pe, n_p, de, n_d, bw, lat, stale, lag = CONFIGS[name]
    pp = _packed(pe, LAT_P, WORKLOAD)
    for rep in range(3):
        stream = K.draw_workload(rep, 11, 12, *K.scenario_arrays(pp, lat=False))
        n = stream[0].size
        per, row, extra = _kernel(stream, pe, LAT_P, n_p, "jsq", de, LAT_D, n_d, "vllm_dp", kvb=2000.0, bw=bw,
                                  lat=lat, workload=WORKLOAD, staleness=stale, lag=lag, keys=(11, 12, rep))
        c = dict(zip(K.COLUMNS, row))
        assert ((per["prefill_replica"] >= 0) & (per["prefill_replica"] < n_p)).all()
        handed = per["decode_replica"] >= 0
        assert (per["decode_replica"][handed] < n_d).all()
        assert np.isfinite(per["first_token_s"][handed]).all() and np.isnan(per["ready_s"][~handed]).all()
        # one place at a time: prefill blocks freed at t1 <= arrival at the decode replica < its first token there
        done = per["status"] == K.ST_COMPLETED
        assert np.array_equal(per["prefill_finish_s"][handed], per["first_token_s"][handed])
        assert (per["first_token_s"][handed] <= per["ready_s"][handed]).all()
        assert (per["ready_s"][handed & done] < per["decode_first_token_s"][handed & done]).all()
        assert (per["num_tokens"][done] == np.asarray(stream[2])[done]).all()
        assert c["n_arrived"] == n
        assert c["n_completed"] + c["n_rejected"] + c["n_dropped"] + c["n_unfinished"] == n
        assert c["n_completed"] == done.sum()
        assert c["blocks_used_at_end"] == 0
        assert c["time_in_system_integral"] == pytest.approx(c["sojourn_sum"], rel=1e-9)


def test_a_request_too_long_for_the_decode_side_is_rejected_there():
    """A prompt the prefill side takes but the decode side cannot hold ends
    rejected (once), with its prefill first token recorded."""
    stream = ([0.0, 0.5], [40, 300], [5, 5], [0, 0], [0, 0], [-1, -1], [0, 0])
    small = _sync(max_num_seqs=4, num_gpu_blocks=10, max_model_len=160, max_num_batched_tokens=160)
    big = _sync(max_num_seqs=4, num_gpu_blocks=100)
    per, row, _ = _kernel(stream, big, fastsim.LatencyModel(base_s=0.1), 1, "jsq", small,
                          fastsim.LatencyModel(base_s=0.05), 1, "jsq", kvb=1.0, bw=math.inf, lat=0.0)
    ref = simulate_disagg_reference(*stream, prefill=(big, fastsim.LatencyModel(base_s=0.1), 1, "jsq"),
                                    decode=(small, fastsim.LatencyModel(base_s=0.05), 1, "jsq"),
                                    kv_bytes_per_token=1.0, link_bandwidth=math.inf)
    _same(per, ref)
    assert per["status"][0] == K.ST_COMPLETED and per["status"][1] != K.ST_COMPLETED
    assert np.isfinite(per["first_token_s"][1])
    assert dict(zip(K.COLUMNS, row))["n_rejected"] == 1


# ------------------------------------------------------------------------------
# The API

def _scenario(dis, **kw):
    wl = fastsim.Workload(arrival_rate=6.0, num_requests=120, prompt_len=fastsim.Uniform(100, 1500),
                          output_len=fastsim.Uniform(10, 200), warmup_requests=5)
    return fastsim.Scenario(engine=_sync(max_num_seqs=32, num_gpu_blocks=3000), workload=wl,
                            fleet=dis, **kw)


def test_replicate_gives_the_metrics_and_the_pools_columns_reproducibly():
    dis = fastsim.Disaggregated(prefill=1, decode=fastsim.Fleet(2, router="round_robin"), link_bandwidth_gbps=50,
                                link_latency_s=0.001, kv_bytes_per_token=65536)
    sc = _scenario(dis, ttft_slo_s=0.5)
    a = fastsim.replicate(sc, 8, seed=3, n_threads=1)
    b = fastsim.replicate(sc, 8, seed=3, n_threads=2)
    assert a.per_replication.equals(b.per_replication)
    for m in K.METRICS + K.DISAGG_COLUMNS:
        assert m in a.per_replication.columns
    f = a.per_replication
    assert (f["kv_transfer_mean"] > 0.001).all()        # the latency and the bytes
    assert (f["ttft_decode_mean"] > f["ttft_mean"]).all()   # the decode side's first token comes later
    assert (f["blocks_used_at_end"] == 0).all()
    ci = a.confidence_interval("ttft_p99")
    assert ci.low <= a.per_replication["ttft_p99"].mean() <= ci.high
    res = fastsim.compare({"disagg": sc, "colocated": _scenario(fastsim.Fleet(3))}, 8, seed=3,
                          metrics=["ttft_mean", "e2e_mean"])
    assert len(res.summary()) == 2


def test_kv_bytes_per_token_from_a_deployment():
    dep = fastsim.Deployment("meta-llama/Llama-3.1-8B-Instruct", gpu="H100")
    dis = fastsim.Disaggregated(prefill_server=dep, decode_server=dep, link_bandwidth_gbps=400)
    # Llama 3.1 8B: 32 layers, 8 KV heads of 128, K and V, 2 bytes: 128 KiB a token
    assert dis.kv_bytes() == 2 * 32 * 8 * 128 * 2
    assert dis.gpus() == 2


@pytest.mark.parametrize("kwargs, match", [
    (dict(prefill=0), "prefill must be an integer >= 1, got 0"),
    (dict(decode="two"), "decode must be an int >= 1"),
    (dict(link_bandwidth_gbps=0), "link_bandwidth_gbps must be a number > 0"),
    (dict(link_bandwidth_gbps=float("nan")), "link_bandwidth_gbps must be a number > 0"),
    (dict(link_latency_s=-1.0), "link_latency_s"),
    (dict(link_bandwidth_gbps=100.0), "kv_bytes_per_token is needed"),
    (dict(kv_bytes_per_token=0.0), "kv_bytes_per_token"),
    (dict(decode=fastsim.Fleet(2, router_staleness_s=1.0)), "decode.router_staleness_s must be 0"),
    (dict(decode=fastsim.Fleet(2, routing_latency_s=0.1)), "decode.routing_latency_s must be 0"),
    (dict(prefill_server="H100"), "prefill_server must be None"),
])
def test_bad_parameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastsim.Disaggregated(**kwargs)


@pytest.mark.parametrize("engine, match", [
    (_sync(num_gpu_blocks=500, enable_prefix_caching=True, block_hash_caching=False),
     "enable_prefix_caching=True needs block_hash_caching=True"),
    (_sync(num_gpu_blocks=500, policy="priority", priority_preemption=True),
     "priority_preemption must be False"),
    (_sync(num_gpu_blocks=500, scheduler="static"), "scheduler must be 'continuous'"),
])
def test_what_the_decode_side_cannot_be_is_refused_before_running(engine, match):
    dis = fastsim.Disaggregated(decode_server=(engine, fastsim.LatencyModel(base_s=0.01)))
    with pytest.raises(ValueError, match=match):
        fastsim.replicate(_scenario(dis), 2, seed=0)


def test_a_horizon_is_refused():
    wl = fastsim.Workload(arrival_rate=1.0, num_requests=10, horizon_s=5.0)
    with pytest.raises(ValueError, match="workload.horizon_s must be None"):
        fastsim.replicate(fastsim.Scenario(workload=wl, fleet=fastsim.Disaggregated()), 2, seed=0)


def test_the_xpyd_search_ranks_splits_beside_colocated_serving():
    sc = _scenario(None)
    res = fastsim.disaggregation_search(sc, gpus=3, slo={"ttft_p99": 5.0, "tpot_mean": 1.0}, n_replications=6,
                                        seed=1)
    t = res.to_frame()
    assert list(t["config"]) == ["co-located", "1P2D", "2P1D"]
    assert (t["gpus"] == 3).all()
    assert (t.loc[t["config"] == "co-located", "ttft_p99_vs_colocated"] == 0).all()
    assert res.best in set(t["config"])   # a generous SLO: some configuration meets it
    ci = res.confidence_interval("1P2D", "ttft_p99")
    row = t[t["config"] == "1P2D"].iloc[0]
    assert (ci.low, ci.high) == pytest.approx((row["ttft_p99_low"], row["ttft_p99_high"]))
    with pytest.raises(ValueError, match="gpus must be"):
        fastsim.disaggregation_search(sc, gpus=1, slo={"ttft_p99": 1.0})


def test_the_experiment_runs_quick_and_its_findings_follow_its_intervals(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "disaggregation.py"
    spec = importlib.util.spec_from_file_location("disaggregation_experiment", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table, best = mod.main(["--quick", "--out", str(tmp_path)])
    assert (tmp_path / "disaggregation.csv").exists()
    assert set(table["workload"]) == {"prefill-heavy", "decode-heavy"}
    co = table[table["config"] == "co-located"]
    assert (co["diff_vs_colocated"] == 0).all()
    assert ((table["ci_low"] <= table["estimate"]) & (table["estimate"] <= table["ci_high"])).all()
    for name, b in best.items():
        part = table[(table["workload"] == name)]
        if b is not None:   # the best configuration meets every SLO: its intervals lie below the limits
            for m, limit in mod.SLO.items():
                assert part[(part["config"] == b) & (part["metric"] == m)]["ci_high"].iloc[0] <= limit


def test_the_stability_check_runs_the_stream_through_the_disaggregated_server():
    """`summary()` checks stability by simulating the replications' streams
    again: through both pools (a single replica at the server's rate would
    call a light load overloaded)."""
    sc = fastsim.Scenario(engine=ENGINE, workload=fastsim.Workload(
        arrival_rate=6.0, num_requests=120, prompt_len=fastsim.Uniform(20, 200), output_len=fastsim.Uniform(5, 60)),
        fleet=fastsim.Disaggregated(prefill=1, decode=2))
    res = fastsim.replicate(sc, n_replications=4, seed=1)
    assert not res.stability.overloaded
    assert "ttft_decode_mean" in res.summary().index


def test_warm_up_requests_handed_late_fit_the_decode_pools_gap_room():
    """The decode pool takes its hand-offs in order of first token, and a
    replica measures every request handed after its first measured one, so
    warm-up requests whose prompts take long come out measured. Their gap
    samples (a context term: one a step) once overran a room sized for the
    tokens after the warm-up (here 28: the run wrote past it and did not
    end); the room now counts every request's tokens (`disagg.dims_record`),
    and the kernel is the reference bit for bit."""
    n, w = 24, 10
    idx = np.arange(n)
    prompt, output = np.where(idx < w, 3000, 10), np.where(idx < w, 600, 2)
    z = np.zeros(n, np.int64)
    stream = (idx * 1e-3, prompt, output, z, output.copy(), np.full(n, -1), z)
    engine = _sync(max_num_seqs=32, num_gpu_blocks=4000, max_num_batched_tokens=512)
    lat = fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5,
                               ctx_per_token_s=2e-7)
    wl = fastsim.Workload(arrival_rate=100.0, num_requests=n, warmup_requests=w)
    per, row, extra = _kernel(stream, engine, lat, 3, "round_robin", engine, lat, 1, "jsq", kvb=1000.0,
                              bw=math.inf, lat=0.0, workload=wl)
    ref = simulate_disagg_reference(*stream, prefill=(engine, lat, 3, "round_robin"), decode=(engine, lat, 1, "jsq"),
                                    kv_bytes_per_token=1000.0, link_bandwidth=math.inf, seed_keys=(11, 12, 3))
    _same(per, ref)
    order = np.argsort(per["first_token_s"], kind="stable")
    first_measured = int(np.argmax(order >= w))
    assert (order[first_measured:] < w).any()   # (warm-up requests handed after the first measured one)
    assert output[w:].sum() == 28 and np.isfinite(row[K.COLUMNS.index("tpot_mean")])


def test_a_decode_pool_larger_than_the_scan_is_the_reference_bit_for_bit():
    """A decode pool of more than `cluster.SCAN_MAX` replicas finds its due
    replicas by the event queue's heap, not by a scan (every other case here
    runs a few): the reference's bits, with every decode replica busy."""
    n_d = C.SCAN_MAX + 6
    wl = fastsim.Workload(arrival_rate=2.0 * n_d, num_requests=5 * n_d, prompt_len=fastsim.Uniform(20, 400),
                          output_len=fastsim.Uniform(50, 250))
    pe, de = _sync(max_num_seqs=8, num_gpu_blocks=300), _sync(max_num_seqs=4, num_gpu_blocks=200)
    lat_d = fastsim.LatencyModel(base_s=0.008, decode_scale_s=0.002, decode_alpha=0.7)   # (stretches, no context term)
    stream = K.draw_workload(0, 11, 12, *K.scenario_arrays(_packed(pe, LAT_P, wl), lat=False))
    per, row, extra = _kernel(stream, pe, LAT_P, 4, "jsq", de, lat_d, n_d, "jsq", kvb=2000.0, bw=1e8, lat=0.001,
                              workload=wl, keys=(11, 12, 0))
    ref = simulate_disagg_reference(*stream, prefill=(pe, LAT_P, 4, "jsq"), decode=(de, lat_d, n_d, "jsq"),
                                    kv_bytes_per_token=2000.0, link_bandwidth=1e8, link_latency_s=0.001,
                                    routing_latency_s=0.0, staleness_s=0.0, load_cap=2, seed_keys=(11, 12, 0))
    _same(per, ref)
    assert len(set(per["decode_replica"].tolist()) - {-1}) == n_d
