"""The compiled autoscaling fleet (`kernel.autoscale`) and the reference
(`fastsim._reference_autoscale`, plain Python over the reference
simulator's paused replicas, no code shared with the kernel) agree bit for
bit per request, in the evaluations' table and in the replica-seconds held,
over the routers, metrics, delays and cool-downs; and an autoscaler whose
bounds pin the fleet is the static fleet bit for bit."""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._autoscale import ROUTERS
from fastsim._reference_autoscale import simulate_autoscaled_reference
from fastsim.kernel import autoscale as A
from fastsim.kernel import cluster as C
from test_replica import CASES as _ALL_CASES, _stream

#: Every engine of `test_replica`, prefix caching by block hash (vLLM's default) included.
CASES = _ALL_CASES

POLICIES = {
    "queue": dict(metric="queue_depth", target=1.0, interval_s=2.0, min_replicas=1, max_replicas=4,
                  provisioning_delay_s=3.0, scale_in_cooldown_s=4.0, tolerance=0.1),
    "queue-now": dict(metric="queue_depth", target=0.5, interval_s=1.5, min_replicas=1, max_replicas=3,
                      provisioning_delay_s=0.0, scale_in_cooldown_s=0.0, tolerance=0.0, spare_replicas=1),
    "kv": dict(metric="kv_utilisation", target=0.2, interval_s=2.5, min_replicas=1, max_replicas=5,
               provisioning_delay_s=1.0, scale_in_cooldown_s=2.0, tolerance=0.05),
    "rate": dict(metric="rate", target=1.5, interval_s=3.0, min_replicas=2, max_replicas=6,
                 provisioning_delay_s=5.0, scale_in_cooldown_s=6.0, tolerance=0.1),
}


def _kernel_status(ref_status):
    s = ref_status.astype(np.int64) + K.ST_COMPLETED
    s[ref_status == -1] = K.ST_PENDING
    return s


def _run_both(sc, stream, p, router, policy, latency=0.0, queue=True, refs=None):
    """Kernel and reference on one stream, compared; the evaluations' table. ``refs``: a list that receives
    the reference's results. A stochastic latency model runs on the replication's records (`_autoscale`'s)."""
    scaler = fastsim.Autoscaler(**policy)
    fleet = np.array([0.0, latency, 2.0])
    lat, fpar = K.run_records(p["lat"], p["fpar"], 11, 12, 3) if sc.latency.is_stochastic else (p["lat"], p["fpar"])
    st, first, finish, npre, g, owner, windows, gpu_s, end = A.simulate_autoscaled_stream(
        *stream, p["ipar"], fpar, lat, fleet, K.ROUTER_CODES[router], scaler._record(), 11, 12, 3, queue=queue)
    ref = simulate_autoscaled_reference(*stream, sc.engine, sc.latency, router, horizon_s=sc.workload.horizon_s,
                                        routing_latency_s=latency, seed_keys=(11, 12, 3), **policy)
    assert np.array_equal(owner, ref["replica"])
    assert np.array_equal(st, _kernel_status(ref["status"]))
    assert np.array_equal(first, ref["first_token_s"], equal_nan=True)
    assert np.array_equal(finish, ref["finish_s"], equal_nan=True)
    assert np.array_equal(npre, ref["num_preemptions"]) and np.array_equal(g, ref["num_tokens"])
    assert np.array_equal(windows[:, :K.W_SLO_MET], ref["windows"])
    assert gpu_s == ref["replica_s"] and end == ref["end_s"]
    if refs is not None:
        refs.append(ref)
    return windows


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_autoscaler_is_the_reference_bit_for_bit(name, router):
    sc = CASES[name]
    scaled = False
    for rep, (pname, latency) in enumerate((("queue", 0.0), ("queue-now", 0.01), ("kv", 0.0), ("rate", 0.0))):
        stream, p = _stream(sc, rep)
        w = _run_both(sc, stream, p, router, POLICIES[pname], latency)
        scaled |= bool(np.any(w[:, K.W_DESIRED] != w[0, K.W_DESIRED]))
    assert scaled   # the policies did scale


@pytest.mark.parametrize("router", ["jsq", "random", "least_kv"])
@pytest.mark.parametrize("name", list(CASES))
def test_pinned_bounds_are_the_static_fleet_bit_for_bit(name, router):
    """min = max = initial = N: the evaluations observe (advance the replicas
    to their times) and change nothing; the fleet is `cluster`'s static
    fleet of N, per request and in its metrics row."""
    for rep, nrep in enumerate((1, 3)):
        stream, p = _stream(CASES[name], rep)
        pol = dict(metric="queue_depth", target=1.0, interval_s=0.7, min_replicas=nrep, max_replicas=nrep)
        st, first, finish, npre, g, owner, windows, gpu_s, end = A.simulate_autoscaled_stream(
            *stream, p["ipar"], p["fpar"], p["lat"], np.zeros(3), K.ROUTER_CODES[router],
            fastsim.Autoscaler(**pol)._record(), 11, 12, 3)
        s_st, s_first, s_finish, s_npre, s_g, s_owner, row, bal = C.simulate_fleet_stream(
            *stream, p["ipar"], p["fpar"], p["lat"], np.zeros(3), K.ROUTER_CODES[router], nrep, 11, 12, 3)
        assert np.array_equal(owner, s_owner) and np.array_equal(st, s_st)
        for x, y in ((first, s_first), (finish, s_finish), (npre, s_npre), (g, s_g)):
            assert np.array_equal(x, y, equal_nan=True)
        assert (windows[:, K.W_SERVING] == nrep).all()
        assert gpu_s == pytest.approx(nrep * end)


@pytest.mark.parametrize("router", ["jsq", "least_outstanding"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_event_queue_changes_no_bit(name, router):
    """The arrivals' looks by the static fleet's event queue (the routers
    that read requests in the system only) give the bits of looks that
    advance and observe every held replica (`autoscale._look_held`), over
    policies that scale out and in."""
    for rep, pname in enumerate(("queue", "queue-now", "rate")):
        stream, p = _stream(CASES[name], rep)
        rec = fastsim.Autoscaler(**POLICIES[pname])._record()
        runs = [A.simulate_autoscaled_stream(*stream, p["ipar"], p["fpar"], p["lat"], np.array([0.0, 0.01, 2.0]),
                                             K.ROUTER_CODES[router], rec, 11, 12, 3, queue=q) for q in (True, False)]
        for x, y in zip(*runs):
            assert np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)


def test_an_autoscaler_of_more_rows_than_the_scan_is_the_reference_bit_for_bit():
    """An autoscaler of more than `cluster.SCAN_MAX` rows (``max_replicas``)
    finds its due replicas by the event queue's heap, not by a scan (every
    other case here holds a few): the reference's bits, as it scales in and
    out under a load that keeps its replicas busy."""
    m = C.SCAN_MAX + 6
    base = CASES["stretches"]
    load = dataclasses.replace(base.workload, arrival_rate=base.workload.arrival_rate * m / 4, num_requests=6 * m)
    sc = base.replace(workload=load, **{"engine.max_num_seqs": 2})
    stream, p = _stream(sc, 0)
    pol = dict(metric="queue_depth", target=0.5, interval_s=0.5, min_replicas=m - 12, max_replicas=m,
               initial_replicas=m - 8, provisioning_delay_s=0.5, scale_in_cooldown_s=1.0, tolerance=0.0)
    w = _run_both(sc, stream, p, "jsq", pol)
    assert len(np.unique(w[:, K.W_DESIRED])) > 1 and len(np.unique(w[:, K.W_SERVING])) > 1   # it scaled


def test_an_autoscaler_keeping_stretch_ends_is_the_reference_bit_for_bit():
    """Where a replica keeps its stretch end across a hand (`cluster._keep_end`: synchronous
    scheduling, no prefix caching, a step time without a context term, roomy KV: the autoscaler keeps an
    end at a share of its hands on these streams, checked here), the autoscaler gives the reference's
    bits as it scales out and in."""
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(async_scheduling=False, scheduler_reserve_full_isl=True, null_block=True,
                                    enable_prefix_caching=False, block_hash_caching=False, max_num_seqs=16,
                                    num_gpu_blocks=4000, max_num_batched_tokens=512),
        workload=fastsim.Workload(arrival_rate=12.0, num_requests=150, prompt_len=fastsim.Uniform(1, 400),
                                  output_len=fastsim.Uniform(1, 200)),
        latency=fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3,
                                     prefill_per_token_s=3e-5))
    scaled = False
    for rep, pname in enumerate(("queue", "queue-now", "rate")):
        stream, p = _stream(sc, rep)
        for router in ("jsq", "least_outstanding"):
            w = _run_both(sc, stream, p, router, POLICIES[pname])
            scaled |= bool(np.any(w[:, K.W_DESIRED] != w[0, K.W_DESIRED]))
            kept = np.empty(stream[0].size)
            A.simulate_autoscaled_stream(*stream, p["ipar"], p["fpar"], p["lat"], np.zeros(3),
                                         K.ROUTER_CODES[router], fastsim.Autoscaler(**POLICIES[pname])._record(),
                                         11, 12, 3, kept=kept)
            assert np.isfinite(kept).mean() > 0.05   # (the rule's conditions hold: ends are kept)
    assert scaled
