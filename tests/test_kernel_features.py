"""Issue 10's scheduler features in the Numba kernel: bit-exact agreement with
the reference simulator (``fastsim/_reference.py``) on the grids of
tests/test_reference_agreement.py, the random streams the features add, and
their validation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import fastsim
from fastsim._validation import KERNEL_PENDING_OPTIONS

from conftest import Z, t_point
from test_reference_agreement import LATENCIES, assert_same, scenario


# ============================================================ predicted-length SJF
PRED = fastsim.LogNormalPredictor


@pytest.mark.parametrize("latency", list(LATENCIES))
@pytest.mark.parametrize("sigma", [0.0, 0.5, 1.5])
def test_sjf_with_predicted_keys_agrees_with_the_reference(sigma, latency):
    sc = scenario({"policy": "sjf", "length_predictor": PRED(sigma)}, LATENCIES[latency])
    out = assert_same(sc, seed=11)
    assert (out["status"] == "completed").any() and out["num_preemptions"].sum() > 0


def test_sjf_key_column_is_used_by_the_kernel():
    """A given sjf_key column drives the numba backend too (not only the reference)."""
    sc = scenario({"policy": "sjf"}, LATENCIES["full"])
    stream = fastsim.sample_requests(sc, seed=4)
    assert "sjf_key" not in stream
    base = fastsim.simulate_requests(sc, stream)
    keyed = stream.assign(sjf_key=stream["output_len"])        # the default keys: same run
    pd.testing.assert_frame_equal(fastsim.simulate_requests(sc, keyed), base, check_exact=True)
    rev = stream.assign(sjf_key=-stream["output_len"])          # longest first
    fast = fastsim.simulate_requests(sc, rev)
    ref = fastsim.simulate_requests(sc, rev, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert not fast["finish_s"].equals(base["finish_s"])


def test_sigma_zero_predicts_the_true_lengths_and_other_columns_do_not_change():
    sc = scenario({"policy": "sjf"}, LATENCIES["constant"])
    plain = fastsim.sample_requests(sc, seed=9, replication=2)
    for sigma in (0.0, 0.8):
        pred = fastsim.sample_requests(sc.replace(**{"engine.length_predictor": PRED(sigma)}), seed=9,
                                       replication=2)
        pd.testing.assert_frame_equal(pred.drop(columns="sjf_key"), plain, check_exact=True)
        if sigma == 0.0:
            assert (pred["sjf_key"] == pred["output_len"]).all()
    # and the run with exact predictions is the run with the true lengths
    exact = sc.replace(**{"engine.length_predictor": PRED(0.0)})
    pd.testing.assert_frame_equal(
        fastsim.replicate(exact, n_replications=3, seed=5).per_replication,
        fastsim.replicate(sc, n_replications=3, seed=5).per_replication, check_exact=True)


@pytest.mark.parametrize("sigma", [0.3, 1.0])
def test_lognormal_prediction_error_has_the_stated_law(sigma):
    """log(key / true) before the ceil is sigma * Z: with true lengths of 10^6
    the ceil moves the log by less than 1e-6, so the sample of log(key / true)
    has mean 0 and standard deviation sigma within its confidence intervals."""
    n_true = 1_000_000
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(policy="sjf", length_predictor=PRED(sigma),
                                                      num_gpu_blocks=10**6),
                          workload=fastsim.Workload(num_requests=20000, output_len=n_true, prompt_len=1))
    x = np.log(fastsim.sample_requests(sc, seed=21)["sjf_key"].to_numpy() / n_true)
    n = x.size
    assert abs(x.mean()) <= Z * sigma / math.sqrt(n)
    s2 = x.var(ddof=1)
    tail = stats.norm.sf(Z)
    lo = (n - 1) * s2 / stats.chi2.isf(tail, n - 1)
    hi = (n - 1) * s2 / stats.chi2.ppf(tail, n - 1)
    assert lo <= sigma**2 <= hi
    assert abs(stats.skew(x)) < 0.1 and abs(stats.kurtosis(x)) < 0.2   # normal


def test_replicate_backends_agree_with_a_predictor():
    sc = scenario({"policy": "sjf", "length_predictor": PRED(0.7)}, LATENCIES["a10g"])
    fast = fastsim.replicate(sc, n_replications=3, seed=8).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=8, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kw, message", [
    (dict(policy="sjf", length_predictor=0.5), "length_predictor must be None, a fastsim.LogNormalPredictor"),
    (dict(policy="fcfs", length_predictor=PRED(0.5)), "length_predictor requires policy='sjf'"),
])
def test_length_predictor_validation(kw, message):
    with pytest.raises(ValueError, match=message):
        fastsim.EngineConfig(**kw)


@pytest.mark.parametrize("sigma", [-0.1, math.inf, "1", None])
def test_lognormal_predictor_rejects_bad_sigma(sigma):
    with pytest.raises(ValueError, match=r"LogNormalPredictor.sigma must be a finite number >= 0, got"):
        PRED(sigma)


def test_predictor_needs_the_sjf_key_column():
    sc = scenario({"policy": "sjf", "length_predictor": PRED(0.5)}, LATENCIES["constant"])
    stream = fastsim.sample_requests(sc, seed=1).drop(columns="sjf_key")
    with pytest.raises(ValueError, match="requests must have an 'sjf_key' column"):
        fastsim.simulate_requests(sc, stream)


@pytest.mark.parametrize("latency", list(LATENCIES))
@pytest.mark.parametrize("accuracy", [0.0, 0.7, 1.0])
def test_sjf_with_a_bucket_classifier_agrees_with_the_reference(accuracy, latency):
    pred = fastsim.BucketPredictor(edges=(20, 40, 80), accuracy=accuracy)
    sc = scenario({"policy": "sjf", "length_predictor": pred}, LATENCIES[latency])
    assert_same(sc, seed=12)


def test_bucket_classifier_has_the_stated_law():
    edges, acc = (30, 60, 120), 0.6
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(policy="sjf", length_predictor=fastsim.BucketPredictor(
                              edges=edges, accuracy=acc)),
                          workload=fastsim.Workload(num_requests=40000, output_len=fastsim.LogNormal(60, 1.0)))
    req = fastsim.sample_requests(sc, seed=2)
    lower = np.array((1,) + edges)
    true_b = np.searchsorted(lower, req["output_len"].to_numpy(), side="right") - 1
    assert set(np.unique(req["sjf_key"])) <= set(lower)
    pred_b = np.searchsorted(lower, req["sjf_key"].to_numpy(), side="right") - 1
    right = pred_b == true_b
    n = right.size
    assert abs(right.mean() - acc) <= Z * math.sqrt(acc * (1 - acc) / n)
    # a wrong answer is uniform over the other buckets
    for b in range(lower.size):
        wrong = pred_b[(true_b == b) & ~right]
        counts = np.array([(wrong == c).sum() for c in range(lower.size) if c != b])
        if counts.sum() > 100:
            chi2 = ((counts - counts.mean()) ** 2 / counts.mean()).sum()
            assert chi2 < stats.chi2.isf(stats.norm.sf(Z), counts.size - 1)
    exact = sc.replace(**{"engine.length_predictor": fastsim.BucketPredictor(edges=edges, accuracy=1.0)})
    q = fastsim.sample_requests(exact, seed=2)["sjf_key"].to_numpy()
    np.testing.assert_array_equal(q, lower[true_b])


@pytest.mark.parametrize("kw, message", [
    (dict(edges=()), "BucketPredictor.edges must be a non-empty, strictly increasing"),
    (dict(edges=(10, 10)), "BucketPredictor.edges must be a non-empty, strictly increasing"),
    (dict(edges=(1, 10)), "integers >= 2"),
    (dict(edges=(10.5,)), "BucketPredictor.edges"),
    (dict(accuracy=1.5), r"BucketPredictor.accuracy must be a finite number >= 0 and <= 1, got 1.5"),
])
def test_bucket_predictor_validation(kw, message):
    with pytest.raises(ValueError, match=message):
        fastsim.BucketPredictor(**kw)


def test_predictor_from_a_config_dict():
    sc = fastsim.Scenario.from_dict({"engine": {"policy": "sjf",
                                                "length_predictor": {"edges": [64, 256], "accuracy": 0.9}}})
    assert sc.engine.length_predictor == fastsim.BucketPredictor((64, 256), 0.9)
    sc = fastsim.Scenario.from_dict({"engine": {"policy": "sjf", "length_predictor": {"sigma": 0.25}}})
    assert sc.engine.length_predictor == PRED(0.25)


# ============================================== active priority preemption, aging
PRIORITY_GRID = {
    "priority-preempt": {"policy": "priority", "priority_preemption": True},
    "priority-preempt-roomy-kv": {"policy": "priority", "priority_preemption": True, "num_gpu_blocks": 5000,
                                  "max_num_seqs": 4},
    "priority-preempt-no-chunking": {"policy": "priority", "priority_preemption": True,
                                     "enable_chunked_prefill": False, "max_num_batched_tokens": 512},
    "priority-aging": {"policy": "priority", "priority_aging_s": 0.7},
    "priority-preempt-aging": {"policy": "priority", "priority_preemption": True, "priority_aging_s": 2.0},
    "priority-preempt-abandonment": {"policy": "priority", "priority_preemption": True,
                                     "max_queue_delay_s": 0.6, "max_num_seqs": 4},
    "sjf-preempt": {"policy": "sjf", "priority_preemption": True},
    "sjf-preempt-predicted": {"policy": "sjf", "priority_preemption": True, "length_predictor": PRED(0.8),
                              "num_gpu_blocks": 5000, "max_num_seqs": 4},
    "sjf-aging": {"policy": "sjf", "priority_aging_s": 0.05},
    "sjf-preempt-aging-queue-limit": {"policy": "sjf", "priority_preemption": True, "priority_aging_s": 0.1,
                                      "admission": "queue_limit", "max_waiting": 6},
    "static-priority-aging": {"policy": "priority", "priority_aging_s": 0.5, "scheduler": "static",
                              "num_gpu_blocks": 120},
}


@pytest.mark.parametrize("latency", list(LATENCIES))
@pytest.mark.parametrize("name", list(PRIORITY_GRID))
def test_priority_preemption_and_aging_agree_with_the_reference(name, latency):
    sc = scenario(PRIORITY_GRID[name], LATENCIES[latency])
    out = assert_same(sc, seed=2024)
    assert (out["status"] == "completed").any()


@pytest.mark.parametrize("seed", range(4))
def test_priority_preemption_agrees_with_bursty_arrivals_and_a_horizon(seed):
    engine = {"policy": ["priority", "sjf"][seed % 2], "priority_preemption": True,
              "priority_aging_s": [None, 1.5][seed // 2], "max_num_seqs": 6}
    sc = scenario(engine, LATENCIES["full"], horizon_s=15.0, burstiness=0.3)
    assert_same(sc, seed=seed, replication=seed)


def test_phase_zero_preempts_in_the_kernel():
    """The grid really exercises phase 0: active preemption preempts more than
    KV pressure alone, with roomy KV only phase 0 can preempt."""
    lat = LATENCIES["constant"]
    roomy = PRIORITY_GRID["priority-preempt-roomy-kv"]
    off = {**roomy, "priority_preemption": False}
    def pre(engine, streams=1):
        sc = scenario(engine, lat)
        return sum(fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=2024, replication=r))
                   ["num_preemptions"].sum() for r in range(streams))
    # roomy KV (400 seeds): 0 preemptions without phase 0, 22 to 72 (mean 45, sd 8) with it
    assert pre(off) == 0 < pre(roomy)
    # Active preemption changes the cache's path, so it need not preempt more on every stream: on 400
    # seeds the paired excess was -53 to 272 (mean 64, sd 40, skew +1.0; <= 0 on 8). Summed over 24
    # common streams (80 fresh seeds): mean 1,570, sd 199, min 1,104, so 7.9 sd above 0.
    assert pre(PRIORITY_GRID["priority-preempt"], 24) > pre({"policy": "priority"}, 24)


@pytest.mark.parametrize("name", ["priority-preempt", "sjf-preempt-aging-queue-limit"])
def test_replicate_backends_agree_with_priority_preemption(name):
    sc = scenario(PRIORITY_GRID[name], LATENCIES["a10g"])
    fast = fastsim.replicate(sc, n_replications=3, seed=8).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=8, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)
    assert (fast["n_arrived"] == fast["n_completed"] + fast["n_rejected"] + fast["n_dropped"]
            + fast["n_unfinished"]).all()
    np.testing.assert_allclose(fast["time_in_system_integral"], fast["sojourn_sum"], rtol=1e-9)


def test_guard_lists_only_what_the_kernel_lacks():
    for name in ("priority_preemption", "priority_aging_s"):
        assert name not in KERNEL_PENDING_OPTIONS


# ================================================================ swap preemption
def swap_latency(latency, s_per_block=1e-3):
    import dataclasses

    return dataclasses.replace(LATENCIES[latency], swap_s_per_block=s_per_block)


SWAP_GRID = {
    "swap": {"preemption_mode": "swap", "swap_space_blocks": 20},
    "swap-small-space": {"preemption_mode": "swap", "swap_space_blocks": 6},
    "swap-priority": {"preemption_mode": "swap", "swap_space_blocks": 20, "policy": "priority"},
    "swap-sjf-aging": {"preemption_mode": "swap", "swap_space_blocks": 20, "policy": "sjf",
                       "priority_aging_s": 0.2},
    "swap-no-chunking": {"preemption_mode": "swap", "swap_space_blocks": 30, "enable_chunked_prefill": False,
                         "max_num_batched_tokens": 512},
    "swap-queue-limit": {"preemption_mode": "swap", "swap_space_blocks": 20, "admission": "queue_limit",
                         "max_waiting": 4},
    "swap-abandonment": {"preemption_mode": "swap", "swap_space_blocks": 20, "max_queue_delay_s": 0.4},
    "swap-kv-reservation": {"preemption_mode": "swap", "swap_space_blocks": 20, "admission": "kv_reservation",
                            "num_gpu_blocks": 80},
}


@pytest.mark.parametrize("latency", list(LATENCIES))
@pytest.mark.parametrize("name", list(SWAP_GRID))
def test_swap_preemption_agrees_with_the_reference(name, latency):
    sc = scenario(SWAP_GRID[name], swap_latency(latency))
    out = assert_same(sc, seed=2024)
    assert (out["status"] == "completed").any()
    if name != "swap-kv-reservation":     # reservations never overcommit the KV cache: nothing to swap
        assert out["num_swaps"].sum() > 0 and (out["swapped_s"] > 0).any()
    assert (out["num_swaps"] <= out["num_preemptions"]).all()


@pytest.mark.parametrize("seed", range(4))
def test_swap_agrees_with_bursty_arrivals_and_a_horizon(seed):
    """Requests still swapped at the horizon: swapped_s runs to the stop."""
    engine = {**SWAP_GRID["swap"], "policy": ["fcfs", "priority"][seed % 2]}
    sc = scenario(engine, swap_latency("full", 2e-3), horizon_s=15.0, burstiness=0.3)
    assert_same(sc, seed=seed, replication=seed)


def test_swap_with_no_space_is_the_recompute_run():
    """docs/engine-model.md: swap_space_blocks=0 falls back to recompute, bit for bit."""
    # (swap preemption runs on the synchronous loop, without prefix caching)
    rec = scenario({"async_scheduling": False, "enable_prefix_caching": False}, swap_latency("full"))
    sw = scenario({"preemption_mode": "swap", "swap_space_blocks": 0}, swap_latency("full"))
    stream = fastsim.sample_requests(rec, seed=3)
    a, b = fastsim.simulate_requests(rec, stream), fastsim.simulate_requests(sw, stream)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert a["num_preemptions"].sum() > 0 and b["num_swaps"].sum() == 0
    pd.testing.assert_frame_equal(fastsim.replicate(rec, 3, seed=2).per_replication,
                                  fastsim.replicate(sw, 3, seed=2).per_replication, check_exact=True)


def test_swap_transfer_time_is_charged():
    """Free transfers change nothing but the charge: with swap_s_per_block > 0
    the same run takes longer."""
    cheap = scenario(SWAP_GRID["swap"], swap_latency("constant", 0.0))
    dear = scenario(SWAP_GRID["swap"], swap_latency("constant", 0.01))
    stream = fastsim.sample_requests(cheap, seed=2024)
    a, b = fastsim.simulate_requests(cheap, stream), fastsim.simulate_requests(dear, stream)
    assert b["finish_s"].max() > a["finish_s"].max()


@pytest.mark.parametrize("name", ["swap", "swap-small-space", "swap-abandonment"])
def test_replicate_backends_agree_with_swap(name):
    sc = scenario(SWAP_GRID[name], swap_latency("a10g"))
    fast = fastsim.replicate(sc, n_replications=3, seed=8).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=8, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)
    assert (fast["n_swaps"] > 0).all() and (fast["swaps_per_request"] > 0).all()
    assert (fast["n_arrived"] == fast["n_completed"] + fast["n_rejected"] + fast["n_dropped"]
            + fast["n_unfinished"]).all()
    np.testing.assert_allclose(fast["time_in_system_integral"], fast["sojourn_sum"], rtol=1e-9)
    assert (fast["max_blocks_used"] <= sc.engine.num_gpu_blocks).all()
    assert (0 < fast["max_swap_blocks_used"]).all()
    assert (fast["max_swap_blocks_used"] <= sc.engine.swap_space_blocks).all()


def test_swap_is_no_longer_pending():
    assert "preemption_mode" not in KERNEL_PENDING_OPTIONS
    res = fastsim.replicate(scenario(SWAP_GRID["swap"], swap_latency("a10g")), 2, seed=1)
    assert "swaps_per_request" in res.summary().index


# ================================================================ prefix caching
def prefix_scenario(engine, latency, groups=5, prefix_len=fastsim.Uniform(20, 120), popularity=1.0, **kw):
    sc = scenario({"enable_prefix_caching": True, **engine}, latency, **kw)
    return sc.replace(**{"workload.prefix_groups": groups, "workload.prefix_len": prefix_len,
                         "workload.prefix_popularity": popularity})


CACHE_GRID = {
    "cache-tight-kv": {},
    "cache-roomy-kv": {"num_gpu_blocks": 5000},
    "cache-priority": {"policy": "priority"},
    "cache-sjf-preempt-aging": {"policy": "sjf", "priority_preemption": True, "priority_aging_s": 0.3},
    "cache-priority-preempt": {"policy": "priority", "priority_preemption": True, "num_gpu_blocks": 80},
    "cache-no-chunking": {"enable_chunked_prefill": False, "max_num_batched_tokens": 512},
    "cache-abandonment-queue-limit": {"max_queue_delay_s": 0.5, "admission": "queue_limit", "max_waiting": 5},
    "cache-kv-reservation": {"admission": "kv_reservation", "num_gpu_blocks": 80},
}


@pytest.mark.parametrize("latency", list(LATENCIES))
@pytest.mark.parametrize("name", list(CACHE_GRID))
def test_prefix_caching_agrees_with_the_reference(name, latency):
    sc = prefix_scenario(CACHE_GRID[name], LATENCIES[latency])
    out = assert_same(sc, seed=2024)
    assert (out["status"] == "completed").any() and out["cached_tokens"].sum() > 0


@pytest.mark.parametrize("groups, prefix_len, popularity", [
    (1, 100, 0.0), (40, fastsim.LogNormal(60, 0.7), 1.2), (3, fastsim.Uniform(1, 15), 0.0)])
def test_prefix_caching_agrees_across_group_laws(groups, prefix_len, popularity):
    for latency in LATENCIES:
        sc = prefix_scenario({"num_gpu_blocks": 70}, LATENCIES[latency], groups, prefix_len, popularity)
        assert_same(sc, seed=5, replication=1)


@pytest.mark.parametrize("seed", range(4))
def test_prefix_caching_agrees_with_bursty_arrivals_and_a_horizon(seed):
    engine = {"policy": ["fcfs", "priority"][seed % 2], "num_gpu_blocks": [48, 90][seed // 2]}
    sc = prefix_scenario(engine, LATENCIES["full"], horizon_s=15.0, burstiness=0.3)
    assert_same(sc, seed=seed, replication=seed)


def test_lru_eviction_is_exercised_and_agrees():
    """A tight cache with many groups: cached blocks are evicted (a hit rate well
    below the roomy cache's) and the kernel still follows the reference."""
    def hit(blocks):
        sc = prefix_scenario({"num_gpu_blocks": blocks}, LATENCIES["a10g"], groups=30,
                             prefix_len=fastsim.Uniform(60, 140), popularity=0.5)
        out = assert_same(sc, seed=7)
        return out["cached_tokens"].sum()
    # one stream, but 300 seeds gave the roomy cache 11,087 more cached tokens (sd 578, min 9,024): 19 sd
    assert hit(40) < hit(5000)


def test_caching_without_groups_changes_nothing():
    plain = scenario({}, LATENCIES["full"])
    cached = scenario({"enable_prefix_caching": True}, LATENCIES["full"])
    stream = fastsim.sample_requests(plain, seed=3)
    pd.testing.assert_frame_equal(fastsim.simulate_requests(plain, stream),
                                  fastsim.simulate_requests(cached, stream), check_exact=True)
    a = fastsim.replicate(plain, 3, seed=2).per_replication
    b = fastsim.replicate(cached, 3, seed=2).per_replication
    # (prefix caching forces the slow path: the ITL sample is summed in another order)
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12, atol=0)
    assert a["prefix_hit_rate"].isna().all()


def test_prefix_groups_do_not_change_the_other_columns():
    plain = scenario({}, LATENCIES["constant"])
    grouped = prefix_scenario({}, LATENCIES["constant"])
    a = fastsim.sample_requests(plain, seed=9, replication=3)
    b = fastsim.sample_requests(grouped, seed=9, replication=3)
    pd.testing.assert_frame_equal(b[list(a.columns)], a, check_exact=True)
    assert (b["prefix_len"] < b["prompt_len"]).all() and (b["prefix_len"] >= 0).all()
    assert (b["prefix_len"] == np.minimum(b["prefix_len"], b["prompt_len"] - 1)).all()


def test_prefix_group_popularity_is_zipf():
    g, s = 6, 1.1
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=30000, prefix_groups=g, prefix_len=10,
                                                    prefix_popularity=s))
    grp = fastsim.sample_requests(sc, seed=13)["prefix_group"].to_numpy()
    counts = np.bincount(grp, minlength=g)
    p = np.arange(1, g + 1) ** -s
    p /= p.sum()
    chi2 = ((counts - grp.size * p) ** 2 / (grp.size * p)).sum()
    assert chi2 < stats.chi2.isf(stats.norm.sf(Z), g - 1)
    # the prefix length law, clipped below the prompt
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=2000, prompt_len=50, prefix_groups=2,
                                                    prefix_len=fastsim.Uniform(30, 80)))
    plen = fastsim.sample_requests(sc, seed=1)["prefix_len"].to_numpy()
    assert plen.min() == 30 and plen.max() == 49 and (plen == 49).mean() > 0.5


@pytest.mark.parametrize("name", ["cache-tight-kv", "cache-sjf-preempt-aging", "cache-abandonment-queue-limit"])
def test_replicate_backends_agree_with_prefix_caching(name):
    sc = prefix_scenario(CACHE_GRID[name], LATENCIES["a10g"])
    sc = sc.replace(**{"workload.warmup_requests": 10})
    fast = fastsim.replicate(sc, n_replications=3, seed=8).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=8, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)
    assert ((fast["prefix_hit_rate"] > 0) & (fast["prefix_hit_rate"] < 1)).all()
    assert (fast["n_arrived"] == fast["n_completed"] + fast["n_rejected"] + fast["n_dropped"]
            + fast["n_unfinished"]).all()
    np.testing.assert_allclose(fast["time_in_system_integral"], fast["sojourn_sum"], rtol=1e-9)
    assert (fast["max_blocks_used"] <= sc.engine.num_gpu_blocks).all()


def test_hit_rate_grows_with_the_cache():
    """Replication r sees the same requests at every cache size: the paired gain
    is many standard errors above 0 (conftest.t_point(n - 1), the t point with the normal tail beyond Z)."""
    n = 20
    rates = []
    for blocks in (40, 80, 5000):
        sc = prefix_scenario({"num_gpu_blocks": blocks}, LATENCIES["a10g"], groups=20,
                             prefix_len=fastsim.Uniform(60, 140), popularity=0.8)
        rates.append(fastsim.replicate(sc, n, seed=3).per_replication["prefix_hit_rate"].to_numpy())
    # Per replication (1,200 of them, 150 seeds) the gain is 0.117 (sd 0.024) from 40 to 80 blocks and
    # 0.247 (sd 0.026) from 80 to 5,000. With 20 pairs, on 100 fresh seeds: t = 22.9 (sd 3.5, min 15.9)
    # and 44.3 (sd 7.8, min 31.2) against 7.35; noncentral t puts P(t <= 7.35) near 1e-19.
    crit = t_point(n - 1)
    for small, large in zip(rates, rates[1:]):
        d = large - small
        assert d.mean() > crit * d.std(ddof=1) / math.sqrt(n), (d.mean(), d.std(ddof=1))


@pytest.mark.parametrize("kw, message", [
    (dict(prefix_groups=-1, prefix_len=10), r"prefix_groups must be an integer in \[0, 16777216\], got -1"),
    (dict(prefix_groups=3), "prefix_len .* is required with prefix_groups=3"),
    (dict(prefix_len=10), "prefix_len and prefix_popularity need prefix_groups >= 1"),
    (dict(prefix_popularity=1.0), "prefix_len and prefix_popularity need prefix_groups >= 1"),
    (dict(prefix_groups=2, prefix_len=10, prefix_popularity=-0.5), "prefix_popularity must be a finite number >= 0"),
    (dict(prefix_groups=2, prefix_len=0), "prefix_len"),
])
def test_prefix_group_validation(kw, message):
    with pytest.raises(ValueError, match=message):
        fastsim.Workload(**kw)


def test_simulate_requests_validates_prefix_columns():
    sc = prefix_scenario({}, LATENCIES["constant"])
    stream = fastsim.sample_requests(sc, seed=1)
    bad = stream.assign(prefix_len=stream["prompt_len"])
    with pytest.raises(ValueError, match="0 <= prefix_len < prompt_len"):
        fastsim.simulate_requests(sc, bad)
    with pytest.raises(ValueError, match="both 'prefix_group' and 'prefix_len'"):
        fastsim.simulate_requests(sc, stream.drop(columns="prefix_len"))


def test_every_option_is_in_the_kernel():
    assert KERNEL_PENDING_OPTIONS == {}


# ========================================================= conservation, all options
NEW_OPTIONS = {
    "swap": ({"preemption_mode": "swap", "swap_space_blocks": 24}, {}),
    "swap-tiny-space": ({"preemption_mode": "swap", "swap_space_blocks": 3}, {}),
    "priority-preempt-aging": ({"policy": "priority", "priority_preemption": True, "priority_aging_s": 1.0}, {}),
    "sjf-preempt-predicted": ({"policy": "sjf", "priority_preemption": True,
                               "length_predictor": PRED(1.0)}, {}),
    "sjf-buckets": ({"policy": "sjf", "length_predictor": fastsim.BucketPredictor((64, 128), 0.7)}, {}),
    "prefix-caching": ({"enable_prefix_caching": True},
                       {"prefix_groups": 8, "prefix_len": fastsim.Uniform(50, 200), "prefix_popularity": 1.0}),
    "prefix-caching-priority-preempt": ({"enable_prefix_caching": True, "policy": "priority",
                                         "priority_preemption": True},
                                        {"prefix_groups": 3, "prefix_len": 120}),
}


@pytest.mark.parametrize("horizon_s", [None, 20.0])
@pytest.mark.parametrize("name", list(NEW_OPTIONS))
def test_new_options_conserve_requests_and_blocks(name, horizon_s, tight_kv_scenario):
    engine, workload = NEW_OPTIONS[name]
    sc = tight_kv_scenario.replace(**{f"engine.{k}": v for k, v in engine.items()},
                                   **{f"workload.{k}": v for k, v in workload.items()},
                                   **{"workload.priorities": (0, 1), "workload.priority_probs": (0.3, 0.7),
                                      "workload.horizon_s": horizon_s})
    pr = fastsim.replicate(sc, n_replications=12, seed=5).per_replication
    total = pr["n_completed"] + pr["n_rejected"] + pr["n_dropped"] + pr["n_unfinished"]
    np.testing.assert_array_equal(pr["n_arrived"], total)
    assert (pr["max_blocks_used"] <= sc.engine.num_gpu_blocks).all()
    if horizon_s is None:
        assert (pr["n_unfinished"] == 0).all() and (pr["blocks_used_at_end"] == 0).all()
    np.testing.assert_allclose(pr["time_in_system_integral"], pr["sojourn_sum"], rtol=1e-9)
    assert (pr["n_swaps"] <= pr["n_preemptions"]).all()
    assert (pr["max_swap_blocks_used"] <= sc.engine.swap_space_blocks).all()
    if "swap_space_blocks" in engine:
        assert (pr["n_swaps"] > 0).any() and (pr["max_swap_blocks_used"] > 0).any()
    if "prefix_groups" in workload:
        assert (pr["prefix_hit_rate"] > 0).all()


def test_the_prefix_group_cache_with_nothing_to_share_runs_as_caching_off():
    """The prefix-group cache registers only group prefixes: with no prefix
    group its steps are caching off's, request for request (checked against
    the reference, which keeps the cache literally), so the kernel takes
    caching off's fast steps; a given stream with groups is cached."""
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=120, max_num_batched_tokens=256,
                                    enable_prefix_caching=True, block_hash_caching=False, async_scheduling=False),
        workload=fastsim.Workload(arrival_rate=12.0, num_requests=150, prompt_len=fastsim.Uniform(10, 300),
                                  output_len=fastsim.Uniform(1, 150), warmup_requests=5))
    stream = fastsim.sample_requests(sc, seed=2)
    fast = fastsim.simulate_requests(sc, stream)
    pd.testing.assert_frame_equal(fast, fastsim.simulate_requests(sc, stream, backend="reference"), check_exact=True)
    off = sc.replace(**{"engine.enable_prefix_caching": False})
    pd.testing.assert_frame_equal(fast, fastsim.simulate_requests(off, stream), check_exact=True)
    assert fast["num_preemptions"].sum() > 0
    pd.testing.assert_frame_equal(fastsim.replicate(sc, 4, seed=2).per_replication,
                                  fastsim.replicate(off, 4, seed=2).per_replication, check_exact=True)
    grouped = stream.assign(prefix_group=np.arange(len(stream)) % 2,
                            prefix_len=np.minimum(stream["prompt_len"] - 1, 32))
    cached = fastsim.simulate_requests(sc, grouped)
    assert cached["cached_tokens"].sum() > 0
    pd.testing.assert_frame_equal(cached, fastsim.simulate_requests(sc, grouped, backend="reference"),
                                  check_exact=True)
