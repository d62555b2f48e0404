"""Per-step noise and per-run effects in a disaggregated server: every
replica of both pools draws its step noise from a stream of its own (the
prefill pool's replicas 0..P-1, the decode pool's P..P+D-1: the key rule of
a fleet, docs/engine-model.md, "Fleets"), and the per-run effects of a
replication are shared by the replicas of one model.

Checked against the reference (bit for bit, every router, both pools noisy,
each pool its own model) and, without it, against the noise's law: one
request at a time through one prefill and one decode step each, the steps'
noise factors are log-normal with the stated parameters, and the replicas'
streams are independent (a shared key would make two replicas' factors
equal step for step)."""

import dataclasses
import math

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._reference_disagg import simulate_disagg_reference
from test_disagg import CONFIGS, LAT_D, LAT_P, ROUTERS, WORKLOAD, _kernel, _packed, _same, _scenario, _sync

NOISE_P = fastsim.StepNoise(jitter_sd=0.25, stall_prob=0.03, stall_mean_s=0.02, speed_sd=0.1)
NOISE_D = fastsim.StepNoise(jitter_sd=0.15, stall_prob=0.05, stall_mean_s=0.01, prefill_sd=0.2, overhead_sd=0.001)


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", ["instant-link", "tight-decode-kv", "stale-swap"])
def test_noisy_pools_are_the_reference_bit_for_bit(name, router):
    pe, n_p, de, n_d, bw, lat, stale, lag = CONFIGS[name]
    lp = dataclasses.replace(LAT_P, noise=NOISE_P)
    ld = dataclasses.replace(LAT_D, noise=NOISE_D)
    pp = _packed(pe, lp, WORKLOAD)
    for rep in range(2):
        stream = K.draw_workload(rep, 11, 12, *K.scenario_arrays(pp, lat=False))
        router_p = ROUTERS[(ROUTERS.index(router) + rep + 1) % len(ROUTERS)]
        per, _, _ = _kernel(stream, pe, lp, n_p, router_p, de, ld, n_d, router, kvb=2000.0, bw=bw, lat=lat,
                                  workload=WORKLOAD, keys=(11, 12, rep), staleness=stale, lag=lag)
        ref = simulate_disagg_reference(*stream, prefill=(pe, lp, n_p, router_p), decode=(de, ld, n_d, router),
                                        kv_bytes_per_token=2000.0, link_bandwidth=bw, link_latency_s=lat,
                                        routing_latency_s=lag, staleness_s=stale, load_cap=2,
                                        seed_keys=(11, 12, rep))
        _same(per, ref)
        assert all(b == 0 for b in ref["decode_blocks_end"])


def test_the_looks_every_replica_and_unbounded_paths_give_the_same_noisy_bits():
    """The decode router's look at every replica (`cluster._look`) and the runs without the departure bound
    read each replica's own records: the bits of the event queue's look."""
    pe, n_p, de, n_d, bw, lat, stale, lag = CONFIGS["instant-link"]
    lp = dataclasses.replace(LAT_P, noise=NOISE_P)
    ld = dataclasses.replace(LAT_D, noise=NOISE_D)
    stream = K.draw_workload(0, 11, 12, *K.scenario_arrays(_packed(pe, lp, WORKLOAD), lat=False))
    runs = [_kernel(stream, pe, lp, n_p, "jsq", de, ld, n_d, "jsq", kvb=2000.0, bw=bw, lat=lat,
                          workload=WORKLOAD, keys=(11, 12, 0), queue=q, bound=b)[0]
            for q, b in ((True, True), (False, True), (True, False), (False, False))]
    for other in runs[1:]:
        for k in ("first_token_s", "finish_s", "decode_replica", "prefill_replica"):
            assert np.array_equal(runs[0][k], other[k], equal_nan=True), k


def _one_at_a_time(sd, n=2400, n_p=2, n_d=2, seed_rep=0):
    """``n`` requests 1 s apart (each alone in the server: constant steps of 0.1 s on the prefill side, 0.05 s
    on the decode side, jitter ``sd`` at most some 3x) of one output token, round robin in both pools over an
    instant link: each request takes exactly one prefill step and one decode step, step ``k`` of replica
    ``r`` of a pool being request ``k n + r``. Returns the prefill and decode steps' noise factors, a row per
    replica, by step."""
    eng = _sync(max_num_seqs=4, num_gpu_blocks=400)
    noise = fastsim.StepNoise(jitter_sd=sd)
    lp = fastsim.LatencyModel(base_s=0.1, noise=noise)
    ld = fastsim.LatencyModel(base_s=0.05, noise=noise)
    stream = (np.arange(n, dtype=float), np.full(n, 16), np.ones(n, np.int64), np.zeros(n, np.int64),
              np.zeros(n, np.int64), np.full(n, -1), np.zeros(n, np.int64))
    per, _, _ = _kernel(stream, eng, lp, n_p, "round_robin", eng, ld, n_d, "round_robin", kvb=1.0,
                              bw=math.inf, lat=0.0, workload=None, keys=(5, 6, seed_rep))
    assert (per["status"] == K.ST_COMPLETED).all()
    assert (per["num_tokens"] == 1).all()
    fp = (per["first_token_s"] - stream[0]) / 0.1
    fd = (per["finish_s"] - per["ready_s"]) / 0.05
    assert np.array_equal(per["ready_s"], per["first_token_s"])   # (the instant link)
    assert np.array_equal(per["prefill_replica"], np.arange(n) % n_p)
    assert np.array_equal(per["decode_replica"], np.arange(n) % n_d)
    return np.log(fp).reshape(-1, n_p).T, np.log(fd).reshape(-1, n_d).T


@pytest.mark.parametrize("seed_rep", [0, 1])
def test_each_replica_of_both_pools_draws_its_own_noise_by_its_law(seed_rep):
    """log factor ~ N(-sd^2 / 2, sd^2) on every replica of both pools (means and variances within their 99.99 %
    intervals), and the four replicas' step-by-step factors uncorrelated (each pair within 4.5 standard errors
    of 0: equal keys would give a correlation of 1)."""
    sd = 0.2
    lp, ld = _one_at_a_time(sd, seed_rep=seed_rep)
    rows = np.vstack([lp, ld])
    m = rows.shape[1]
    z = 3.9   # (two-sided 1e-4)
    for x in rows:
        assert abs(x.mean() + sd * sd / 2) <= z * sd / math.sqrt(m)
        # the sample variance of normals: sd^2 chi2(m - 1) / (m - 1), about N(sd^2, 2 sd^4 / (m - 1))
        assert abs(x.var(ddof=1) - sd * sd) <= z * sd * sd * math.sqrt(2.0 / (m - 1))
    c = np.corrcoef(rows)
    for i in range(rows.shape[0]):
        for j in range(i):
            assert abs(c[i, j]) <= 4.5 / math.sqrt(m), (i, j, c[i, j])


def test_replicate_runs_a_noisy_disaggregated_server_reproducibly():
    """`replicate` no longer refuses per-step noise in a disaggregated server; same seed, same bits on one
    thread or two; the noise widens the spread of p99 TPOT over replications against the deterministic
    model (paired: the same streams)."""
    dis = fastsim.Disaggregated(prefill=2, decode=fastsim.Fleet(2, router="round_robin"), link_bandwidth_gbps=50,
                                link_latency_s=0.001, kv_bytes_per_token=65536)
    quiet = _scenario(dis, latency=fastsim.LatencyModel.default().deterministic())
    noisy = quiet.replace(latency=dataclasses.replace(quiet.latency, noise=fastsim.StepNoise(jitter_sd=0.3,
                                                                                            stall_prob=0.05,
                                                                                            stall_mean_s=0.05)))
    a = fastsim.replicate(noisy, 16, seed=3, n_threads=1)
    b = fastsim.replicate(noisy, 16, seed=3, n_threads=2)
    assert a.per_replication.equals(b.per_replication)
    q = fastsim.replicate(quiet, 16, seed=3, n_threads=1)
    assert (a.per_replication["blocks_used_at_end"] == 0).all()
    # stalls of 50 ms at 5 % of the steps: every replication's mean TPOT is longer than without them
    assert (a.per_replication["tpot_mean"] > q.per_replication["tpot_mean"]).all()

