"""Fleets against exact queueing theory.

A single-seat replica (``max_num_seqs=1``, a constant step ``d``, 1-token
prompts) serving a request of ``O`` output tokens is a server busy for
exactly ``O d``; its TTFT is its wait plus ``d`` (``tests/test_theory.py``).

* Random routing splits a Poisson stream into N independent Poisson streams
  at ``lambda / N``: each replica is M/G/1 (Pollaczek-Khinchine).
* Round robin gives each replica every N-th arrival: Erlang-N gaps; with a
  deterministic service the waits are the Lindley recursion of those gaps,
  request by request, and in distribution an E_N/D/1 queue.
* `fleet_capacity` brackets the smallest N whose M/G/1 replicas meet a mean
  TTFT limit under random routing.
* Power of two choices over N = 100 replicas: the mean-field law (fraction of
  queues with at least k requests ``rho^(2^k - 1)``), within a few percent.

Tolerances come from the replications' standard errors (`conftest.within`).
"""

import numpy as np
import pytest

import fastsim
from conftest import SYNC, Z, within
from fastsim import kernel as K
from fastsim._replicate import pack_scenario
from fastsim.kernel import cluster as C
from fastsim.testing import mg1_mean_wait

STEP = 0.01


def fleet_mg1(rho, law, replicas, router, num_requests=4000, warmup=600):
    """N single-seat replicas, each offered load rho (the fleet's rate N times one's)."""
    lam = replicas * rho / (law.mean() * STEP)
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**SYNC, max_num_seqs=1),
        workload=fastsim.Workload(arrival_rate=lam, num_requests=num_requests, prompt_len=1, output_len=law,
                                  warmup_requests=warmup),
        latency=fastsim.LatencyModel.constant(STEP),
        fleet=fastsim.Fleet(replicas=replicas, router=router))


@pytest.mark.parametrize("replicas", [2, 5])
def test_random_routing_is_independent_mg1_queues(replicas):
    law = fastsim.Uniform(1, 19)
    sc = fleet_mg1(0.7, law, replicas, "random")
    res = fastsim.replicate(sc, n_replications=200, seed=None)
    es, es2 = law.mean() * STEP, law.second_moment() * STEP ** 2
    truth = mg1_mean_wait(sc.workload.arrival_rate / replicas, es, es2) + STEP
    row = res.summary().loc["ttft_mean"]
    within(row.estimate, truth, row.std_error)
    # nothing lost; each replica got about 1/N of the requests
    pr = res.per_replication
    assert (pr["n_arrived"] == pr["n_completed"]).all()
    assert res.summary().loc["requests_per_replica_max_ratio", "estimate"] < 1.2


def _lindley(arrivals, service):
    """Start times of a FIFO single server (Lindley): start_k = max(a_k, end_{k-1})."""
    start = np.empty_like(arrivals)
    end = -np.inf
    for k, a in enumerate(arrivals):
        start[k] = max(a, end)
        end = start[k] + service
    return start


def test_round_robin_waits_are_the_lindley_recursion_request_by_request():
    law, n_rep = fastsim.Fixed(10), 3
    sc = fleet_mg1(0.8, law, n_rep, "round_robin", num_requests=600, warmup=0)
    p = pack_scenario(sc)
    for rep in range(3):
        stream = K.draw_workload(rep, 5, 6, *K.scenario_arrays(p, lat=False))
        st, first, finish, npre, g, owner, row, bal = C.simulate_fleet_stream(
            *stream, p["ipar"], p["fpar"], p["lat"], p["fleet"], p["router"], n_rep)
        assert np.array_equal(owner, np.arange(stream[0].size) % n_rep)
        for r in range(n_rep):
            a = stream[0][owner == r]
            start = _lindley(a, 10 * STEP)
            np.testing.assert_allclose(first[owner == r], start + STEP, rtol=1e-12, atol=1e-9)
            np.testing.assert_allclose(finish[owner == r], start + 10 * STEP, rtol=1e-12, atol=1e-9)


def test_round_robin_mean_ttft_is_the_erlang_gap_queue():
    """E_N/D/1 mean wait by a long Lindley recursion on independently drawn
    Erlang-N gaps (numpy), against the fleet's mean TTFT: both with errors."""
    n_rep, law, rho = 3, fastsim.Fixed(10), 0.8
    sc = fleet_mg1(rho, law, n_rep, "round_robin")
    res = fastsim.replicate(sc, n_replications=100, seed=None)
    lam = sc.workload.arrival_rate
    rng = np.random.default_rng()
    gaps = rng.gamma(n_rep, 1.0 / lam, size=(50, 40_000))
    waits = []
    for row in gaps:
        a = np.cumsum(row)
        waits.append((_lindley(a, 10 * STEP) - a)[5000:].mean())
    waits = np.array(waits)
    truth, truth_se = waits.mean() + STEP, waits.std(ddof=1) / np.sqrt(waits.size)
    row = res.summary().loc["ttft_mean"]
    within(row.estimate, truth, np.hypot(row.std_error, truth_se))


def test_fleet_capacity_brackets_the_exact_answer():
    """Random routing of M/D/1 replicas, fleet rate 20/s, service 0.1 s: the
    mean TTFT is 0.11 s with 3 replicas and 0.06 s with 4 (PK), so the fewest
    replicas with mean TTFT <= 0.085 s is 4."""
    law = fastsim.Fixed(10)
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(**SYNC, max_num_seqs=1),
        workload=fastsim.Workload(arrival_rate=20.0, num_requests=2000, prompt_len=1, output_len=law,
                                  warmup_requests=300),
        latency=fastsim.LatencyModel.constant(STEP),
        fleet=fastsim.Fleet(replicas=1, router="random", gpu_hour_price=2.5))
    es = 10 * STEP

    def pk(n):
        lam = 20.0 / n
        return mg1_mean_wait(lam, es, es * es) + STEP if lam * es < 1 else np.inf

    exact = min(n for n in range(1, 20) if pk(n) <= 0.085)
    assert exact == 4
    cap = fastsim.fleet_capacity(sc, slo={"ttft_mean": 0.085}, confidence=0.95, n_replications=20, seed=1)
    low, high = cap.replicas_interval
    assert low <= exact <= high
    assert cap.replicas == high and cap.cost_per_hour == pytest.approx(2.5 * high)
    assert set(cap.probes["replicas"]) >= {exact - 1, exact}


def _geometric(p, kmax=2000):
    """Output lengths 1, 2, ... with P(O = k) = p (1 - p)^(k - 1) (truncated where
    the tail is below 1e-17): O steps of d, a service nearly exponential."""
    k = np.arange(1, kmax + 1)
    w = p * (1 - p) ** (k - 1)
    return k, w / w.sum()


@pytest.mark.slow
def test_power_of_two_choices_meets_the_mean_field_law():
    """N = 100 single-seat replicas with (nearly) exponential service under
    power-of-two routing: the mean number in system per replica over a
    window closed by a horizon, against the mean-field law
    sum_k rho^(2^k - 1) (Mitzenmacher; Vvedenskaya, Dobrushin, Karpelevich)."""
    rho, n_rep = 0.8, 100
    k, w = _geometric(0.02)
    law = fastsim.Empirical(k, weights=w)
    sc = fleet_mg1(rho, law, n_rep, "power_of_two", num_requests=30_000, warmup=6000)
    sc = sc.replace(**{"workload.horizon_s": 150.0})
    res = fastsim.replicate(sc, n_replications=6, seed=None)
    pr = res.per_replication
    per_replica = pr["queue_depth_mean"] / n_rep + pr["batch_occupancy_mean"]
    mean_s = law.mean() * STEP
    exp_mean = float(np.sum(k * w)) * STEP
    assert abs(mean_s - exp_mean) < 1e-9
    truth = sum(rho ** (2 ** j - 1) for j in range(1, 30))
    est, se = per_replica.mean(), per_replica.std(ddof=1) / np.sqrt(per_replica.size)
    assert abs(est - truth) <= 0.05 * truth + 4 * se, (est, truth, se)


def _erlang_c(servers, offered):
    """The M/M/N probability of waiting (Erlang C) from Erlang B."""
    from fastsim.testing import erlang_b
    b = erlang_b(servers, offered)
    return servers * b / (servers - offered * (1.0 - b))


@pytest.mark.parametrize("replicas, rho, n_replications", [(4, 0.8, 200), (8, 0.85, 120)])
def test_jsq_lies_between_the_central_queue_and_random_routing(replicas, rho, n_replications):
    """N single-seat replicas with (nearly) exponential service: joining the
    shortest queue waits longer than N servers sharing one queue (M/M/N,
    Erlang C) and less than random routing (N independent M/G/1 queues,
    Pollaczek-Khinchine, exact for the service drawn). The service is O
    steps of d with O geometric (p = 0.02): squared coefficient of variation
    1 - p = 0.98, so the central queue of this service waits within about
    1 % of M/M/N's (the Lee-Longton factor (1 + CV^2) / 2), while JSQ's
    mean TTFT is about 20 % (4 replicas) and 35 % (8) above it, some 9 and
    11 standard errors at these replication counts (two replicas were too
    close to M/M/2 to tell apart), and random routing's several times
    higher. Both bounds are checked against the estimate's confidence
    interval, for any seed, and the paired difference of JSQ and random
    routing on common random numbers is negative."""
    k, w = _geometric(0.02)
    law = fastsim.Empirical(k, weights=w)
    es = float(np.sum(k * w)) * STEP
    es2 = float(np.sum(k * k * w)) * STEP ** 2
    jsq = fleet_mg1(rho, law, replicas, "jsq", num_requests=4000, warmup=600)
    lam = jsq.workload.arrival_rate
    central = _erlang_c(replicas, lam * es) / (replicas / es - lam) + STEP   # M/M/N wait, then the first step
    random_routing = mg1_mean_wait(lam / replicas, es, es2) + STEP
    res = fastsim.replicate(jsq, n_replications=n_replications, seed=None)
    row = res.summary().loc["ttft_mean"]
    assert row.estimate - Z * row.std_error > central, (row.estimate, row.std_error, central)
    assert row.estimate + Z * row.std_error < random_routing, (row.estimate, row.std_error, random_routing)
    # nothing lost, and (paired, the same arrivals and lengths) JSQ beats random routing
    pr = res.per_replication
    assert (pr["n_arrived"] == pr["n_completed"]).all()
    rnd = fastsim.replicate(jsq.replace(fleet=fastsim.Fleet(replicas=replicas, router="random")),
                            n_replications=n_replications, seed=res.seed)
    d = (pr["ttft_mean"] - rnd.per_replication["ttft_mean"]).to_numpy()
    assert d.mean() + Z * d.std(ddof=1) / np.sqrt(d.size) < 0


def test_the_stability_check_counts_the_fleet_not_one_replica():
    """Four single-seat replicas at 70 % each are stable (one replica alone
    would be at 280 %: no warning); at 150 % each the fleet is overloaded and
    serves about its capacity, N / E[S] (within 10 %: the check's
    saturated completions)."""
    law = fastsim.Fixed(10)
    stable = fastsim.replicate(fleet_mg1(0.7, law, 4, "jsq", num_requests=2000, warmup=200), n_replications=5,
                               seed=3)
    assert not stable.stability.overloaded
    with pytest.warns(RuntimeWarning, match="overloaded"):
        over = fastsim.replicate(fleet_mg1(1.5, law, 4, "jsq", num_requests=2000, warmup=200), n_replications=5,
                                 seed=3).stability
    assert over.overloaded
    assert over.served_rate == pytest.approx(4 / (10 * STEP), rel=0.1)
