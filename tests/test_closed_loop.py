"""Closed-loop load (``Workload(max_concurrency=c)``, docs/engine-model.md,
"Closed-loop load"): the kernel against the reference simulator bit for bit,
Little's law as a sample-path identity, a single seat against its exact
cycle time, the cap on an open-loop stream as a semaphore, and the inputs
refused."""

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._replicate import pack_scenario

BASE_ENGINE = dict(max_num_seqs=12, max_num_batched_tokens=192, block_size=16, num_gpu_blocks=48)
A10G = fastsim.LatencyModel.default()
CONSTANT = fastsim.LatencyModel.constant(0.02)
FULL = fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5,
                            ctx_per_token_s=2e-7)   # (no per-run noise: the reference backend of replicate has none)


def scenario(engine=None, *, c=6, rate=None, think=0.0, dist="fixed", latency=A10G, n=200):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**{**BASE_ENGINE, **(engine or {})}),
        workload=fastsim.Workload(
            arrival_rate=rate, num_requests=n, max_concurrency=c, think_time_s=think, think_time_dist=dist,
            prompt_len=fastsim.Mixture([fastsim.LogNormal(60, 0.8), fastsim.Uniform(150, 250)], [0.7, 0.3]),
            output_len=fastsim.LogNormal(40, 0.9), priorities=(0, 1, 2), priority_probs=(0.2, 0.3, 0.5)),
        latency=latency)


ASYNC = {"async_scheduling": True}
GRID = {
    "closed": dict(),
    "closed-think": dict(think=0.3),
    "closed-exponential-think": dict(think=0.3, dist="exponential", c=10),
    "closed-one-seat": dict(c=1, latency=CONSTANT),
    "closed-many-seats": dict(c=20),
    "capped-stream": dict(rate=8.0, c=6),
    "capped-sjf": dict(engine={"policy": "sjf"}, rate=6.0, c=16),
    "priority": dict(engine={"policy": "priority"}, c=16),
    "swap": dict(engine={"preemption_mode": "swap", "swap_space_blocks": 64}, c=16),
    "static": dict(engine={"scheduler": "static", "num_gpu_blocks": 200}, c=16),
    "too-long": dict(engine={"max_model_len": 260}, c=16),
    "queue-limit": dict(engine={"admission": "queue_limit", "max_waiting": 1}, c=20),
    "abandonment": dict(engine={"max_queue_delay_s": 0.4}, c=30),
    "async": dict(engine=ASYNC, c=16),
    "async-think": dict(engine=ASYNC, c=16, think=0.2),
    "async-exponential-think": dict(engine={**ASYNC, "max_model_len": 260}, c=16, think=0.2, dist="exponential"),
    "async-too-long": dict(engine={**ASYNC, "max_model_len": 260}, c=16),
    "async-abandonment": dict(engine={**ASYNC, "max_queue_delay_s": 0.4}, c=30),
    "async-kv-reservation": dict(engine={**ASYNC, "admission": "kv_reservation", "num_gpu_blocks": 80}, c=16),
}


def both(sc, seed=1):
    stream = fastsim.sample_requests(sc, seed=seed)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    return stream, fast, ref


@pytest.mark.parametrize("name", list(GRID))
def test_kernel_and_reference_agree_request_by_request(name):
    stream, fast, ref = both(scenario(**GRID[name]))
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert (fast["status"] == "completed").any()
    # the stream holds what each request wanted; the run, when it was sent
    assert (fast["arrival_s"].to_numpy() >= stream["arrival_s"].to_numpy()).all()


def test_the_grid_exercises_each_departure():
    """Every kind of departure frees a seat somewhere in the grid (with async
    scheduling too), so the agreement test covers each."""
    def statuses(name):
        return set(both(scenario(**GRID[name]))[1]["status"].astype(str))
    assert "rejected_too_long" in statuses("too-long") and "rejected_too_long" in statuses("async-too-long")
    assert "rejected_admission" in statuses("queue-limit")
    assert "rejected_admission" in statuses("async-kv-reservation")
    assert "dropped" in statuses("abandonment") and "dropped" in statuses("async-abandonment")
    _, fast, _ = both(scenario(**GRID["swap"]))
    assert fast["num_swaps"].sum() > 0


def in_system(out, t):
    """Requests in the system at ``t`` (arrived at or before it, left after it)."""
    a, d = out["arrival_s"].to_numpy(), out["finish_s"].to_numpy()
    return int(np.sum((a <= t) & (d > t)))


@pytest.mark.parametrize("c", [1, 4, 13])
@pytest.mark.parametrize("engine", [{}, ASYNC], ids=["sync", "async"])
def test_littles_law_holds_on_the_sample_path(c, engine):
    """Zero think time: every departure but the last c sends a request at
    its instant, so the number in system is c until the last request is
    sent. Over [0, T] (T that send), the area under the number in system is
    the sum of the times in system clipped to T, and that area is c * T:
    throughput x mean time in system = c, exactly (up to the rounding of the
    sums)."""
    _, out, _ = both(scenario({**engine, "num_gpu_blocks": 400}, c=c, n=150), seed=c)
    assert (out["status"] == "completed").all()
    a, d = out["arrival_s"].to_numpy(), out["finish_s"].to_numpy()
    T = a.max()
    area = np.sum(np.minimum(d, T) - np.minimum(a, T))
    assert area == pytest.approx(c * T, rel=1e-12)
    # ... and pointwise: c in system at every departure instant before T
    for t in np.unique(d[d < T]):
        assert in_system(out, t) == c
    # the sends are the departures: request k >= c at the (k - c)-th departure
    np.testing.assert_array_equal(a[c:], np.sort(d)[:a.size - c])


@pytest.mark.parametrize("think", [0.0, 0.25])
def test_a_single_seat_with_deterministic_service_has_its_exact_cycle(think):
    """One client, prompts that fit one step, a step time of base + prefill
    per token: request k is sent at k * C and finishes at k * C + S with
    S = (base + P * prefill) + (O - 1) * base the service time and C = S +
    think the cycle."""
    P, O, base, per_tok = 100, 12, 0.015, 2e-5
    lat = fastsim.LatencyModel(base_s=base, decode_scale_s=0.0, decode_alpha=1.0,
                               prefill_per_token_s=per_tok, ctx_per_token_s=0.0)
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(**BASE_ENGINE),
                          workload=fastsim.Workload(num_requests=40, max_concurrency=1, think_time_s=think,
                                                    prompt_len=P, output_len=O),
                          latency=lat)
    out = fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=0))
    S = (base + P * per_tok) + (O - 1) * base
    C = S + think
    k = np.arange(40)
    np.testing.assert_allclose(out["arrival_s"], k * C, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["finish_s"], k * C + S, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["e2e_s"], S, rtol=1e-12)
    # throughput over the whole run: N / (N C - think)
    res = fastsim.replicate(sc, n_replications=2, seed=0)
    assert res.estimate("request_throughput") == pytest.approx(40 / (40 * C - think), rel=1e-9)


def test_exponential_think_times_are_the_gaps_after_each_departure():
    """A pure closed loop with exponential think times: the j-th departure's
    client sends again think_s[j + c] later, so the sends are the sorted
    departure instants plus their think times; the think times are
    exponential of the stated mean (mean within its 99.9 % interval, and a
    KS test)."""
    from scipy import stats

    c, mean = 5, 0.4
    sc = scenario({"num_gpu_blocks": 400}, c=c, think=mean, dist="exponential", n=400)
    stream, out, _ = both(sc, seed=11)
    assert (out["status"] == "completed").all()
    z = stream["think_s"].to_numpy()
    assert (z[:c] == 0).all() and (stream["arrival_s"] == 0).all()
    d = out["finish_s"].to_numpy()
    # (the j-th departure instant is the j-th smallest finish time, ties included)
    want = np.sort(np.sort(d)[:d.size - c] + z[c:])
    np.testing.assert_array_equal(out["arrival_s"].to_numpy()[c:], want)
    x = z[c:]
    half = stats.norm.ppf(0.9995) * mean / np.sqrt(x.size)
    assert abs(x.mean() - mean) < half
    assert stats.kstest(x, "expon", args=(0, mean)).pvalue > 1e-3


@pytest.mark.parametrize("c", [3, 8])
def test_a_cap_on_an_open_stream_is_a_fifo_semaphore(c):
    """``vllm bench serve --max-concurrency``: request k goes at its own
    arrival time, or, beyond the cap, when the (k - c)-th request leaves,
    in order: a_k = max(w_k, D_(k-c), a_(k-1)); never more than c inside."""
    sc = scenario({"num_gpu_blocks": 400}, rate=12.0, c=c, n=200)
    stream, out, _ = both(sc, seed=3)
    assert (out["status"] == "completed").all()   # (a finish time for every departure)
    w = stream["arrival_s"].to_numpy()
    a, d = out["arrival_s"].to_numpy(), out["finish_s"].to_numpy()
    dep = np.sort(d)
    want = w.copy()
    for k in range(c, w.size):
        want[k] = max(w[k], dep[k - c], want[k - 1])
    np.testing.assert_array_equal(a, want)
    assert (a > w).any()                       # the cap binds somewhere
    assert max(in_system(out, t) for t in np.concatenate([a, d])) <= c


def test_a_cap_above_the_request_count_changes_nothing():
    sc = scenario(rate=8.0, c=6)
    open_sc = sc.replace(**{"workload.max_concurrency": None})
    wide = sc.replace(**{"workload.max_concurrency": 10_000})
    stream = fastsim.sample_requests(open_sc, seed=5)
    np.testing.assert_array_equal(stream["arrival_s"], fastsim.sample_requests(wide, seed=5)["arrival_s"])
    pd.testing.assert_frame_equal(fastsim.simulate_requests(open_sc, stream),
                                  fastsim.simulate_requests(wide, stream), check_exact=True)


@pytest.mark.parametrize("kw", [dict(c=8), dict(c=8, think=0.2), dict(c=8, rate=5.0)],
                         ids=["closed", "think", "capped"])
def test_replications_agree_with_the_reference_backend_on_every_metric(kw):
    sc = scenario(latency=FULL, **kw)
    fast = fastsim.replicate(sc, n_replications=3, seed=8).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=8, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)


def test_same_seed_same_results_whatever_the_threads():
    sc = scenario(c=8, think=0.1)
    one = fastsim.replicate(sc, n_replications=6, seed=4, n_threads=1).per_replication
    two = fastsim.replicate(sc, n_replications=6, seed=4, n_threads=2, batch_size=2).per_replication
    pd.testing.assert_frame_equal(one, two, check_exact=True)


@pytest.mark.parametrize("name", ["closed", "async-too-long", "capped-stream"])
def test_a_replica_driven_in_many_calls_gives_the_bits_of_one(name):
    p = pack_scenario(scenario(**GRID[name]))
    stream = K.draw_workload(2, 11, 12, *K.scenario_arrays(p, lat=False))
    whole = K.simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])
    end = float(np.nanmax(whole[2]))
    rep = K.drivers.Replica(*stream, p["ipar"], p["fpar"], p["lat"])
    for t in np.sort(np.random.default_rng(0).uniform(0.0, 1.1 * end, 400)):
        rep.advance_until(t)
    rep.advance_until(np.inf)
    for x, y in zip(rep.finish(), whole):
        assert np.array_equal(x, y, equal_nan=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_concurrency=0), "max_concurrency"),
    (dict(max_concurrency=2.5), "max_concurrency"),
    (dict(think_time_s=1.0), "think_time_s needs max_concurrency"),
    (dict(max_concurrency=4, think_time_s=-1.0), "think_time_s"),
    (dict(max_concurrency=4, arrival_rate=2.0, think_time_s=1.0), "think_time_s must be 0"),
    (dict(max_concurrency=4, think_time_dist="gamma"), "think_time_dist must be one of"),
    (dict(think_time_dist="exponential"), "think_time_s needs max_concurrency"),
    (dict(max_concurrency=4, horizon_s=10.0), "horizon_s must be None with max_concurrency"),
    (dict(max_concurrency=4, warmup_requests=3), "warmup_requests must be 0 with max_concurrency"),
    (dict(max_concurrency=4, arrival_times=[0.0, 1.0], num_requests=2),
     "arrival_times must be None with max_concurrency"),
])
def test_bad_closed_loop_inputs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastsim.Workload(**kwargs)


def test_priority_aging_is_refused_with_a_closed_loop():
    with pytest.raises(ValueError, match="priority_aging_s must be None with workload.max_concurrency"):
        fastsim.Scenario(engine=fastsim.EngineConfig(policy="priority", priority_aging_s=5.0),
                         workload=fastsim.Workload(max_concurrency=4))


def test_the_default_rate_is_kept_for_open_loads():
    assert fastsim.Workload().arrival_rate == 1.0
    assert fastsim.Workload(max_concurrency=3).arrival_rate is None
    assert fastsim.Workload(max_concurrency=3, arrival_rate=2.0).arrival_rate == 2.0


def test_per_class_results_of_a_closed_loop_use_the_send_times():
    """``summary(by="class")`` of a closed loop: a class's mean TTFT in a
    replication is the mean over its completed requests of first token
    minus *send* time, as ``simulate_requests`` gives them."""
    sc = scenario(latency=FULL, c=8, n=120)
    sc = sc.replace(**{"workload.classes": ("output_len", [40])})
    res = fastsim.replicate(sc, n_replications=2, seed=3)
    rows = res.per_class[res.per_class["replication"] == 0].set_index("class")
    out = fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=3, replication=0))
    done = out["status"] == "completed"
    for label, sel in (("<40", out["output_len"] < 40), (">=40", out["output_len"] >= 40)):
        want = (out["first_token_s"] - out["arrival_s"])[done & sel].mean()
        assert rows.at[label, "ttft_mean"] == pytest.approx(want, rel=1e-12)


def test_compare_by_class_pairs_each_class_over_replications():
    """``compare(...).summary(by="class")``: each class's difference is the
    mean over replications of the per-class values' differences."""
    sc = scenario(latency=FULL, c=8, n=120).replace(**{"workload.classes": ("output_len", [40])})
    res = fastsim.compare({"fcfs": sc, "sjf": sc.replace(**{"engine.policy": "sjf"})}, n_replications=4, seed=2)
    table = res.summary(by="class")
    assert set(table["class"]) == {"<40", ">=40"} and (table["scenario"] == "sjf").all()
    a, b = res.results["sjf"].per_class, res.results["fcfs"].per_class
    for cls in ("<40", ">=40"):
        want = (a[a["class"] == cls]["ttft_mean"].to_numpy() - b[b["class"] == cls]["ttft_mean"].to_numpy()).mean()
        got = table[(table["class"] == cls) & (table["metric"] == "ttft_mean")]["difference"].iloc[0]
        assert got == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="by must be one of"):
        res.summary(by="user")


def test_capacity_refuses_a_pure_closed_loop():
    with pytest.raises(ValueError, match="capacity needs a rate-driven workload"):
        fastsim.capacity(fastsim.Scenario(workload=fastsim.Workload(max_concurrency=4)), slo={"ttft_p99": 1.0})
