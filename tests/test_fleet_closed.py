"""A closed loop of clients in front of a fleet (``Workload(max_concurrency=c)``
with ``Fleet``, `fastsim.kernel.fleet_client`; docs/engine-model.md, "Fleets",
closed loops): the client's seats span the fleet, a departure from any
replica frees one. Checked: a fleet of one replica is the engine's own closed
loop request by request where no rejection or abandonment frees a seat (the
two differ there by rule: the fleet's client learns of those at the step
boundary); the sends are exactly the departures' (the seat law, recomputed
from the run's own finish times, for pure loops with and without think time
and for capped streams, every router); every request accounted for; the
kernel against the plain-Python reference fleet bit for bit; the API end
to end (replicate, per-class rows, determinism across threads), and the
refusals kept."""

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._reference_cluster import simulate_fleet_reference
from fastsim._replicate import pack_scenario
from fastsim.kernel import fleet_client
from test_classes import _pooled
from test_closed_loop import GRID, scenario
from test_fleet_reference import _fleet_record

ROUTERS = ("random", "round_robin", "least_outstanding", "jsq", "vllm_dp", "power_of_two", "least_kv",
           "prefix_affinity", "session_affinity", "weighted")


def _stream(sc, rep):
    p = pack_scenario(sc)
    return K.draw_workload(rep, 11, 12, *K.scenario_arrays(p, lat=False)), p


def _fleet(stream, p, router="jsq", nrep=3, staleness=0.0, latency=0.0, rep=0):
    sent = np.empty(stream[0].size)
    out = fleet_client.simulate_closed_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"],
                                                    _fleet_record(staleness, latency), K.ROUTER_CODES[router], nrep,
                                                    11, 12, rep, sent=sent)
    return out, sent


#: Closed-loop cases of the engine's own grid in which no seat is freed by a
#: rejection or an abandonment (checked in the test): there, a fleet of one
#: replica is the engine's closed loop request by request.
SAME_AS_ENGINE = ("closed-think", "closed-exponential-think", "closed-one-seat", "closed-many-seats", "capped-sjf",
                  "priority", "swap", "static", "async", "async-think")


@pytest.mark.parametrize("name", SAME_AS_ENGINE)
def test_a_fleet_of_one_is_the_engines_closed_loop_request_by_request(name):
    """Per request bit for bit (status, first token, finish, preemptions,
    tokens; the send times, which the engine writes into its arrival
    column); the metrics row to the rounding of its integrals (the
    engine's closed loop runs no stretch of decode steps after a fast step,
    whose completions may send; a fleet's replica is open and does, so the
    same integrals are summed in other pieces)."""
    sc = scenario(**GRID[name])
    for rep in range(2):
        stream, p = _stream(sc, rep)
        whole = K.simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])
        st0 = whole[0].astype(np.int64)
        assert not np.isin(st0, (K.ST_REJECTED_TOO_LONG, K.ST_REJECTED_ADMISSION, K.ST_DROPPED)).any()
        for router in ("jsq", "random", "vllm_dp"):
            (st, first, finish, npre, g, owner, row, bal), sent = _fleet(stream, p, router, nrep=1, rep=rep)
            assert np.array_equal(st, st0)
            for x, y in ((first, whole[1]), (finish, whole[2]), (npre, whole[3]), (g, whole[4])):
                assert np.array_equal(x, y, equal_nan=True)
            np.testing.assert_allclose(row, whole[-1], rtol=1e-12, atol=0.0, equal_nan=True)
            assert (owner == 0).all()


def _seat_law(stream, p, sent, st, finish):
    """The sends recomputed from the run's own departures: R_j the sorted
    departure instants (completions at their finish; every case here has
    no rejection), request k >= c sent at R_(k-c) + Z_k (pure loop, in
    sorted order) or max(w_k, R_(k-c), a_(k-1)) (capped stream)."""
    c = int(p["ipar"][K.I_MAX_CONCURRENCY])
    n = sent.size
    assert (st == K.ST_COMPLETED).all()
    R = np.sort(finish)
    drawn = stream[0]
    if p["ipar"][K.I_ARRIVAL_KIND] == K.ARRIVAL_CLOSED:
        np.testing.assert_array_equal(sent[:c], drawn[:c])
        np.testing.assert_array_equal(sent[c:], np.sort(R[:n - c] + drawn[c:]))
    else:
        want = drawn.copy()
        for k in range(c, n):
            want[k] = max(drawn[k], R[k - c], want[k - 1])
        np.testing.assert_array_equal(sent, want)
    # at most c requests in the fleet at once: at each send, those sent before and not yet finished
    for k in range(n):
        assert np.sum((sent[:k] <= sent[k]) & (finish[:k] > sent[k])) <= c - 1


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", ["closed-think", "closed-exponential-think", "closed-many-seats", "capped-sjf",
                                  "async-think"])
def test_the_sends_are_the_departures_seat_by_seat(name, router):
    """An independent check of the client (no simulation shared): from the
    finish times the fleet produced, the seat rule gives back every send
    time exactly, and no more than c requests are ever in the fleet; over
    fleets of 2-4 replicas, live and stale views, a routing latency."""
    sc = scenario(**GRID[name], n=120)
    used = set()
    for rep, (nrep, staleness, latency) in enumerate(((3, 0.0, 0.0), (2, 0.25, 0.01), (4, 0.0, 0.003))):
        stream, p = _stream(sc, rep)
        (st, first, finish, npre, g, owner, row, bal), sent = _fleet(stream, p, router, nrep, staleness, latency,
                                                                       rep)
        _seat_law(stream, p, sent, st, finish)
        assert (first >= sent + latency - 1e-12).all()   # (first tokens after the hand)
        used |= set(owner.tolist())
    assert len(used) >= 2


def _prefix_scenario(**kw):
    """A closed loop over prefix groups with prefix caching (prefix affinity's case)."""
    sc = scenario({"enable_prefix_caching": True, "num_gpu_blocks": 120, **kw.pop("engine", {})}, **kw)
    return sc.replace(**{"workload.prefix_groups": 3, "workload.prefix_len": 48})


#: The reference's cases: pure loops, a capped stream, async scheduling, each
#: kind of departure (too long, queue limit, abandonment, KV reservation),
#: prefix groups cached by block hash and by group.
REFERENCE_CASES = {
    "closed-think": lambda: scenario(**GRID["closed-think"], n=120),
    "capped-stream": lambda: scenario(**GRID["capped-stream"], n=120),
    "async": lambda: scenario(**GRID["async"], n=120),
    "too-long": lambda: scenario(**GRID["too-long"], n=120),
    "queue-limit": lambda: scenario(**GRID["queue-limit"], n=120),
    "async-abandonment": lambda: scenario(**GRID["async-abandonment"], n=120),
    "async-kv-reservation": lambda: scenario(**GRID["async-kv-reservation"], n=120),
    "prefix-groups-hash": lambda: _prefix_scenario(
        engine={"block_hash_caching": True, "scheduler_reserve_full_isl": True, "null_block": True}, c=12, n=120),
    "prefix-groups-plain": lambda: _prefix_scenario(engine={"block_hash_caching": False}, c=12, n=120),
    # (a lattice of step times: instants shared across replicas, steps one roundoff apart)
    "lattice-static-too-long": lambda: scenario({"scheduler": "static", "num_gpu_blocks": 200, "max_model_len": 260,
                                                 "async_scheduling": False}, c=20, think=0.3,
                                                latency=fastsim.LatencyModel.constant(0.02), n=120),
    "lattice-abandonment": lambda: scenario({"max_queue_delay_s": 0.1, "max_model_len": 260}, c=25,
                                            latency=fastsim.LatencyModel.constant(0.02), n=120),
}


def _status_of_reference(ref_status):
    return ref_status.astype(np.int64) + K.ST_COMPLETED


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", list(REFERENCE_CASES))
def test_kernel_closed_loop_fleet_is_the_reference_bit_for_bit(name, router):
    """The kernel (replicas keyed by lower bounds of their next departure,
    stretches in closed form) against the reference fleet
    (`_reference_cluster.simulate_fleet_reference` with ``max_concurrency``:
    every replica advanced to every instant, step by step): per request,
    status, first token, finish, preemptions, tokens, replica and send time,
    bit for bit; live and stale views, a routing latency, 1-4 replicas."""
    sc = REFERENCE_CASES[name]()
    pure = sc.workload.arrival_rate is None
    for rep, (nrep, staleness, latency) in enumerate(((3, 0.0, 0.0), (2, 0.25, 0.01), (4, 0.0, 0.0), (1, 0.0, 0.0))):
        stream, p = _stream(sc, rep)
        (st, first, finish, npre, g, owner, row, bal), sent = _fleet(stream, p, router, nrep, staleness, latency,
                                                                       rep)
        ref = simulate_fleet_reference(*(x.copy() for x in stream), sc.engine, sc.latency, nrep, router,
                                       staleness_s=staleness, routing_latency_s=latency, load_cap=2,
                                       seed_keys=(11, 12, rep), max_concurrency=sc.workload.max_concurrency,
                                       pure=pure)
        assert np.array_equal(st, _status_of_reference(ref["status"]))
        assert np.array_equal(sent, ref["arrival_s"])
        assert np.array_equal(owner, ref["replica"])
        assert np.array_equal(first, ref["first_token_s"], equal_nan=True)
        assert np.array_equal(finish, ref["finish_s"], equal_nan=True)
        assert np.array_equal(npre, ref["num_preemptions"]) and np.array_equal(g, ref["num_tokens"])


@pytest.mark.parametrize("c", [1, 5, 17])
@pytest.mark.parametrize("engine", [{"async_scheduling": False}, {"async_scheduling": True}], ids=["sync", "async"])
def test_littles_law_holds_on_the_fleets_sample_path(c, engine):
    """Zero think time, no rejection: the client keeps c requests in the
    fleet (in transit to a replica or in it) until its last send at T, so
    the area under the number in the fleet over [0, T] is c T exactly (up
    to the rounding of the sums), and at every departure instant before T
    the fleet holds c (over 3 replicas behind JSQ, with a routing latency)."""
    sc = scenario({**engine, "num_gpu_blocks": 400}, c=c, n=150)
    stream, p = _stream(sc, c)
    (st, first, finish, *_), a = _fleet(stream, p, "jsq", 3, latency=0.004, rep=c)
    assert (st == K.ST_COMPLETED).all()
    T = a.max()
    area = np.sum(np.minimum(finish, T) - np.minimum(a, T))
    assert area == pytest.approx(c * T, rel=1e-12)
    for t in np.unique(finish[finish < T]):
        assert np.sum((a <= t) & (finish > t)) == c


def test_a_schedule_that_frees_seats_waits_for_every_replica_at_its_instant():
    """Regression (found by a reviewer's fuzzing: 1 of 80 random fleets): on
    a lattice of step times (a constant step, static batches) a replica's
    step can end one unit of roundoff after an instant at which other
    replicas' schedules reject requests. Their sends at that instant come
    after the schedules of the replicas that act there, and not after that
    later step's: a replica in flight past the instant is left as it is
    (`fleet_client._schedule_at`). Before the fix request 59's send was
    2.700000000000001, the reference's 2.7000000000000015."""
    sc = scenario({"max_num_seqs": 10, "num_gpu_blocks": 200, "scheduler": "static", "max_model_len": 260,
                   "async_scheduling": False}, c=25, think=0.3, latency=fastsim.LatencyModel.constant(0.02), n=78)
    stream, p = _stream(sc, 2)
    (st, first, finish, npre, g, owner, row, bal), sent = _fleet(stream, p, "session_affinity", 4, rep=2)
    ref = simulate_fleet_reference(*(x.copy() for x in stream), sc.engine, sc.latency, 4, "session_affinity",
                                   load_cap=2, seed_keys=(11, 12, 2), max_concurrency=25, pure=True)
    assert (st == K.ST_REJECTED_TOO_LONG).any()
    assert np.array_equal(sent, ref["arrival_s"])
    assert np.array_equal(st, _status_of_reference(ref["status"]))
    assert np.array_equal(finish, ref["finish_s"], equal_nan=True)


def test_every_request_is_accounted_for_once_with_rejections_and_abandonment():
    """Rejections (too long, admission) and abandonment free seats too: every
    request of the stream is sent once, in order, and ends completed,
    rejected or dropped; none is left in a replica; the replicas' requests
    handed sum to the stream. (Each kind of departure occurs: a queue limit
    rejects where one replica serves the seats.)"""
    seen = set()
    for name, nrep in (("too-long", 3), ("queue-limit", 1), ("abandonment", 2), ("async-abandonment", 2),
                       ("async-kv-reservation", 2), ("async-too-long", 3)):
        sc = scenario(**GRID[name])
        stream, p = _stream(sc, 0)
        (st, first, finish, npre, g, owner, row, bal), sent = _fleet(stream, p, "jsq", nrep)
        assert np.isfinite(sent).all() and (np.diff(sent) >= 0).all()
        assert np.isin(st, (K.ST_COMPLETED, K.ST_REJECTED_TOO_LONG, K.ST_REJECTED_ADMISSION, K.ST_DROPPED)).all()
        assert np.bincount(owner, minlength=nrep).sum() == stream[0].size
        assert row[K.C_N_ARRIVED] == stream[0].size
        seen |= set(st.tolist())
    assert seen == {K.ST_COMPLETED, K.ST_REJECTED_TOO_LONG, K.ST_REJECTED_ADMISSION, K.ST_DROPPED}


def test_sends_are_in_order_and_the_loop_never_goes_back():
    """Send times never decrease (request k is the k-th send), and every
    first token comes after the request's send, over the whole grid; the
    kernel's invariant codes (`fleet_client.CLOSED_*`) never fire (the run
    would raise)."""
    for name in GRID:
        stream, p = _stream(scenario(**GRID[name]), 1)
        (st, first, finish, *_), sent = _fleet(stream, p, "power_of_two", 3)
        assert (np.diff(sent) >= 0).all(), name
        ok = np.isfinite(first)
        assert (first[ok] >= sent[ok]).all(), name


def test_more_replicas_at_the_same_concurrency_cut_the_wait():
    """At a concurrency one replica queues (KV for about 8 requests, 24
    clients), three replicas behind JSQ serve the same clients with far
    less queueing: mean TTFT falls and throughput rises (common random
    numbers: the same streams)."""
    sc = scenario(c=24, n=300)
    one = fastsim.replicate(sc, n_replications=6, seed=5)
    three = fastsim.replicate(sc.replace(fleet=fastsim.Fleet(3, router="jsq")), n_replications=6, seed=5)
    d = three.per_replication["ttft_mean"] - one.per_replication["ttft_mean"]
    assert (d < 0).all()
    assert (three.per_replication["request_throughput"] > one.per_replication["request_throughput"]).all()
    assert (three.per_replication["n_completed"] + three.per_replication["n_rejected"] == 300).all()


def test_replicate_runs_a_closed_loop_fleet_the_same_on_one_and_two_threads():
    sc = scenario(c=10, think=0.2, dist="exponential", n=120).replace(
        fleet=fastsim.Fleet(3, router="power_of_two"))
    a = fastsim.replicate(sc, n_replications=6, seed=9, n_threads=1).per_replication
    b = fastsim.replicate(sc, n_replications=6, seed=9, n_threads=2).per_replication
    assert a.equals(b)
    assert (a["n_completed"] > 0).all()


def test_a_mixed_fleet_takes_a_closed_loop():
    e = fastsim.EngineConfig(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48)
    small = fastsim.EngineConfig(max_num_seqs=4, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48)
    lat = fastsim.LatencyModel.default()
    sc = scenario(c=12, n=150).replace(fleet=fastsim.Fleet(replicas=[(e, lat), (small, lat)], router="jsq"))
    res = fastsim.replicate(sc, n_replications=4, seed=2)
    assert (res.per_replication["n_completed"] + res.per_replication["n_rejected"] == 150).all()
    assert res.per_replication["requests_per_replica_max_ratio"].between(1.0, 2.0).all()


def test_per_class_rows_of_a_closed_loop_fleet_pool_to_the_replication():
    """Per-class rows serve each replication's stream again on the fleet's
    closed loop (the same sends); pooled over the classes they give the
    replication's counts."""
    w = fastsim.Workload(num_requests=120, max_concurrency=8, think_time_s=0.1, prompt_len=fastsim.LogNormal(80, 0.6),
                         output_len=fastsim.LogNormal(30, 0.6), classes=("prompt_len", [80]))
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=200), workload=w,
                          fleet=fastsim.Fleet(2, router="jsq"))
    res = fastsim.replicate(sc, n_replications=3, seed=4)
    pooled = _pooled(res.per_class, res.per_replication)
    np.testing.assert_allclose(pooled[:, :, 0], pooled[:, :, 1], rtol=1e-9)


def test_closed_loops_are_refused_where_not_modelled():
    w = fastsim.Workload(max_concurrency=4, num_requests=40)
    with pytest.raises(ValueError, match=r"workload.max_concurrency must be None with an autoscaler"):
        fastsim.Scenario(workload=w, fleet=fastsim.Fleet(autoscaler=fastsim.Autoscaler(
            metric="queue_depth", target=4.0, max_replicas=3)))
    with pytest.raises(ValueError, match=r"workload.max_concurrency must be None for a disaggregated server"):
        fastsim.replicate(fastsim.Scenario(workload=w, fleet=fastsim.Disaggregated(prefill=1, decode=1)),
                          n_replications=2, seed=0)


def test_a_pure_closed_loops_frame_without_think_times_is_refused():
    """The per-request entry of a fleet (the per-class rows' and the stability
    check's) takes `sample_requests`' frame; a pure closed loop's without
    its ``think_s`` column names it, as one replica's entry does."""
    from fastsim._replicate import served_requests
    sc = scenario(c=4, think=0.2, n=30).replace(fleet=fastsim.Fleet(2))
    req = fastsim.sample_requests(sc, seed=1)
    got = served_requests(sc, req, 1, 0)
    assert (np.diff(got["arrival"]) >= 0).all() and got["arrival"][-1] > 0.0
    with pytest.raises(ValueError, match="think_s"):
        served_requests(sc, req.drop(columns="think_s"), 1, 0)
    with pytest.raises(ValueError, match="pure closed loop"):
        fastsim.fleet_capacity(sc, {"ttft_mean": 1.0})
