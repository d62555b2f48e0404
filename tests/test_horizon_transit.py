"""A request that reaches its replica at or after the horizon (sent before
it, delayed by the fleet's routing latency) is never taken in by the
replica: only arrivals before the horizon exist (docs/engine-model.md,
"Horizon" and "Fleets"); in the fleet it came to before the horizon, it is
unfinished. Found by stop 70's autoscaler fuzz: the kernel took such a
request in where the replica's last step was still in flight at its
arrival (unfinished), and left it out where the replica was idle (pending,
not counted among the arrivals), while the reference never took it in; the
static fleet did the same. Now `replica._hand` hands it as never arriving,
and the fleet's reduction (`cluster._reduce_fleet`) and the reference
(`_reference_cluster.fleet_status`) count it unfinished; and the fleet's
time-in-system integral counts each unfinished request to the fleet's end,
so that Little's law holds over a fleet run to a horizon."""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._reference_autoscale import simulate_autoscaled_reference
from fastsim._reference_cluster import simulate_fleet_reference
from fastsim._replicate import pack_scenario

LAG, H = 0.5, 5.0


def _status(ref):
    s = np.asarray(ref["status"]).astype(np.int64) + K.ST_COMPLETED
    s[np.asarray(ref["status"]) == -1] = K.ST_PENDING
    return s


def _case(scheduler, arrival, output=100):
    n = len(arrival)
    eng = fastsim.EngineConfig.synchronous(max_num_seqs=1, num_gpu_blocks=100, block_size=16, scheduler=scheduler)
    lat = fastsim.LatencyModel(base_s=0.3)
    wl = fastsim.Workload(arrival_times=np.asarray(arrival, float), num_requests=n, prompt_len=1,
                          output_len=output, horizon_s=H)
    stream = (np.asarray(arrival, float), np.ones(n, np.int64), np.full(n, output), np.zeros(n, np.int64),
              np.full(n, output), np.full(n, -1), np.zeros(n, np.int64))
    return eng, lat, wl, stream


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_a_request_reaching_its_replica_after_the_horizon_is_never_taken_in(scheduler):
    """One replica of 0.3 s steps, busy past the horizon with request 0; request 1 sent at 4.6 reaches it at
    5.1, inside the last step (4.7 .. 5.0 .. ends at or after 5): pending, as the reference has it, in the
    static fleet and in an autoscaled one pinned at one replica."""
    eng, lat, wl, stream = _case(scheduler, [0.0, 4.6])
    sc = fastsim.Scenario(engine=eng, latency=lat, workload=wl,
                          fleet=fastsim.Fleet(1, router="round_robin", routing_latency_s=LAG))
    p = pack_scenario(sc)
    st = K.cluster.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"], p["fleet"],
                                         K.ROUTER_CODES["round_robin"], 1)[0]
    ref = simulate_fleet_reference(*stream, eng, lat, 1, "round_robin", horizon_s=H, routing_latency_s=LAG)
    assert np.array_equal(st, _status(ref))
    assert st[1] == K.ST_UNFINISHED and st[0] == K.ST_UNFINISHED   # (request 1: in the fleet, never taken in)
    pol = fastsim.Autoscaler(metric="queue_depth", target=1.0, interval_s=100.0, min_replicas=1, max_replicas=1)
    st2 = K.autoscale.simulate_autoscaled_stream(*stream, p["ipar"], p["fpar"], p["lat"], p["fleet"],
                                                 K.ROUTER_CODES["round_robin"], pol._record())[0]
    ref2 = simulate_autoscaled_reference(*stream, eng, lat, "round_robin", metric="queue_depth", target=1.0,
                                         interval_s=100.0, min_replicas=1, max_replicas=1, horizon_s=H,
                                         routing_latency_s=LAG)
    assert np.array_equal(st2, _status(ref2)) and np.array_equal(st2, st)


@pytest.mark.parametrize("router", ["jsq", "round_robin", "least_kv"])
@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_many_requests_in_transit_at_the_horizon_are_the_reference_bit_for_bit(router, scheduler):
    """Requests every 0.05 s over the last second before the horizon, three replicas of busy engines: those
    that reach their replica at or after it are pending, the others as the reference runs them."""
    arrival = np.concatenate([np.arange(0.0, 4.0, 0.4), np.arange(4.0, H, 0.05)])
    eng, lat, wl, stream = _case(scheduler, arrival, output=20)
    sc = fastsim.Scenario(engine=dataclasses.replace(eng, max_num_seqs=2), latency=lat, workload=wl,
                          fleet=fastsim.Fleet(3, router=router, routing_latency_s=LAG))
    p = pack_scenario(sc)
    per = K.cluster.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"], p["fleet"],
                                          K.ROUTER_CODES[router], 3, 7, 8, 0)
    ref = simulate_fleet_reference(*stream, sc.engine, lat, 3, router, horizon_s=H, routing_latency_s=LAG,
                                   seed_keys=(7, 8, 0))
    assert np.array_equal(per[0], _status(ref))
    for k, key in ((1, "first_token_s"), (2, "finish_s")):
        assert np.array_equal(per[k], ref[key], equal_nan=True)
    late = stream[0] + LAG >= H
    assert late.any() and (per[0][late] == K.ST_UNFINISHED).all()


FLEETS = {
    "static": lambda lag: fastsim.Fleet(3, router="jsq", routing_latency_s=lag),
    "mixed": lambda lag: fastsim.Fleet([(fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=300),
                                         fastsim.LatencyModel.default().deterministic()),
                                        (fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=400),
                                         fastsim.LatencyModel.default().deterministic())],
                                       router="round_robin", routing_latency_s=lag),
    "autoscaled": lambda lag: fastsim.Fleet(router="jsq", routing_latency_s=lag,
                                            autoscaler=fastsim.Autoscaler(min_replicas=1, max_replicas=3,
                                                                          interval_s=2.0, target=2.0)),
}


@pytest.mark.parametrize("v1", [False, True])
@pytest.mark.parametrize("lag", [0.0, 0.5])
@pytest.mark.parametrize("kind", list(FLEETS))
def test_nothing_is_lost_at_the_horizon_and_littles_law_holds_for_the_fleet(kind, lag, v1):
    """A fleet run to a horizon: every request that came to the fleet before it is counted once (the stream's
    arrivals, as one replica counts them), those in transit or never taken in as unfinished, and the fleet's
    time-in-system integral equals its sojourn sum (each request in the system from its arrival at the fleet
    until it leaves or the fleet's run ends, its last replica's stop: a replica that stopped earlier holds its
    unfinished requests to then). vLLM V1's rules: async scheduling's arrivals no schedule saw, too."""
    eng = fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=400) if v1 else \
        fastsim.EngineConfig.synchronous(max_num_seqs=8, num_gpu_blocks=400)
    sc = fastsim.Scenario(engine=eng, latency=fastsim.LatencyModel.default().deterministic(),
                          workload=fastsim.Workload(arrival_rate=10.0, num_requests=400, horizon_s=20.0))
    one = fastsim.replicate(sc, 4, seed=1, n_threads=1).per_replication
    pr = fastsim.replicate(sc.replace(fleet=FLEETS[kind](lag)), 4, seed=1, n_threads=1).per_replication
    assert (pr["n_arrived"] == one["n_arrived"]).all()
    total = pr[["n_completed", "n_rejected", "n_dropped", "n_unfinished"]].sum(axis=1)
    assert (pr["n_arrived"] == total).all() and (pr["n_unfinished"] > 0).all()
    np.testing.assert_allclose(pr["time_in_system_integral"], pr["sojourn_sum"], rtol=1e-9)


@pytest.mark.parametrize("kind", ["static", "static-2", "autoscaled"])
def test_a_request_in_transit_after_the_replicas_went_idle_ends_the_fleet_at_the_horizon(kind):
    """Every replica idle long before the horizon (its last departure at 0.55 s), a request sent at 4.6
    reaching its replica at 5.1: unfinished, in the system from 4.6 to the fleet's end, which is the horizon,
    not the replicas' last stop (before it came: a negative sojourn; found by stop 70's second fuzz)."""
    eng = fastsim.EngineConfig.synchronous(max_num_seqs=1, num_gpu_blocks=100, block_size=16)
    wl = fastsim.Workload(arrival_times=np.array([0.0, 4.6]), num_requests=2, prompt_len=1, output_len=5,
                          horizon_s=H)
    fleet = {"static": fastsim.Fleet(1, router="round_robin", routing_latency_s=LAG),
             "static-2": fastsim.Fleet(2, router="jsq", routing_latency_s=LAG),
             "autoscaled": fastsim.Fleet(router="jsq", routing_latency_s=LAG, autoscaler=fastsim.Autoscaler(
                 min_replicas=1, max_replicas=1, interval_s=100.0))}[kind]
    sc = fastsim.Scenario(engine=eng, latency=fastsim.LatencyModel(base_s=0.01), workload=wl, fleet=fleet)
    r = fastsim.replicate(sc, 2, seed=1, n_threads=1).per_replication.iloc[0]
    assert (r.n_arrived, r.n_completed, r.n_unfinished) == (2, 1, 1)
    assert r.end_s == H
    assert r.sojourn_sum == pytest.approx((LAG + 5 * 0.01) + (H - 4.6), rel=1e-9)   # (request 0: 5 steps)
    assert r.time_in_system_integral == pytest.approx(r.sojourn_sum, rel=1e-9)


@pytest.mark.parametrize("kind", ["static", "autoscaled"])
def test_a_request_its_replica_rejects_is_no_sojourn_in_transit_either(kind):
    """Requests too long for their replica's max_model_len, rejected at their replica after the routing
    latency: their transit is not counted in the system (nor in the sojourn: a rejection is none), so
    Little's law holds (the integral exceeded the sojourn sum by n_rejected x lag)."""
    eng = fastsim.EngineConfig.synchronous(max_num_seqs=4, num_gpu_blocks=400, max_model_len=100)
    fleet = {"static": fastsim.Fleet(1, router="round_robin", routing_latency_s=LAG),
             "autoscaled": fastsim.Fleet(router="jsq", routing_latency_s=LAG, autoscaler=fastsim.Autoscaler(
                 min_replicas=1, max_replicas=1, interval_s=10.0))}[kind]
    wl = fastsim.Workload(arrival_times=np.array([0.0, 1.0, 2.0, 3.0]), num_requests=4,
                          prompt_len=fastsim.Histogram([50, 51, 500, 501], [1, 0, 1]), output_len=10)
    sc = fastsim.Scenario(engine=eng, latency=fastsim.LatencyModel(base_s=0.01), workload=wl, fleet=fleet)
    pr = fastsim.replicate(sc, 8, seed=1, n_threads=1).per_replication
    assert (pr["n_rejected"] > 0).any() and (pr["n_completed"] > 0).any()
    np.testing.assert_allclose(pr["time_in_system_integral"], pr["sojourn_sum"], rtol=1e-9)
