"""Per-step noise and per-run effects in an autoscaled fleet: each row of
the fleet draws its step noise from a stream of its own (row r's key as a
fleet's replica r's, docs/engine-model.md, "Fleets"); a replica that starts
in a row another left takes the row's steps on from where they stand (the
row's engine, its step count included, carries on), so no draw is used
twice. Checked against the reference autoscaler bit for bit (every router,
every engine of `test_replica`, policies that scale out and in), and by the
law of the noise without it."""

import dataclasses
import math

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._autoscale import ROUTERS
from fastsim.kernel import autoscale as A
from test_autoscale_reference import CASES, POLICIES, _run_both as _compare
from test_replica import _stream

NOISE = fastsim.StepNoise(jitter_sd=0.2, stall_prob=0.04, stall_mean_s=0.03, speed_sd=0.1, prefill_sd=0.1,
                          overhead_sd=0.001)


def _noisy(sc, noise=NOISE):
    return sc.replace(latency=dataclasses.replace(sc.latency, noise=noise))


def _run_both(sc, rep, router, policy, lag=0.0, queue=True):
    """`test_autoscale_reference._run_both` on replication ``rep``'s stream: (its table, the reference's results)."""
    stream, p = _stream(sc, rep)
    refs = []
    return _compare(sc, stream, p, router, policy, lag, queue, refs), refs[0]


def _reused(ref, pol):
    """Replicas that started in a row another replica had held (the row's steps carry on)."""
    held = set(range(pol.get("initial_replicas", pol["min_replicas"])))
    n = 0
    for _, r in ref["starts"]:
        n += r in held
        held.add(r)
    return n


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", list(CASES))
def test_noisy_autoscaler_is_the_reference_bit_for_bit(name, router):
    sc = _noisy(CASES[name])
    for rep, (pname, lag) in enumerate((("queue", 0.0), ("queue-now", 0.01), ("kv", 0.0), ("rate", 0.0))):
        _run_both(sc, rep, router, POLICIES[pname], lag)


@pytest.mark.parametrize("name", ["tight-kv-context", "async", "static"])
def test_rows_taken_again_carry_their_steps_on_as_the_reference(name):
    """The cases above include replicas that start in a row another left (here, where they do: the row's
    engine and step count carry on, the reference's paused replica of that row too)."""
    reused = 0
    for router in ("jsq", "round_robin"):
        _, ref = _run_both(_noisy(CASES[name]), 1, router, POLICIES["queue-now"], 0.01)
        reused += _reused(ref, POLICIES["queue-now"])
    assert reused > 0


def test_the_event_queue_and_the_full_look_give_the_same_noisy_bits():
    sc = _noisy(CASES["stretches"])
    for pname in ("queue", "queue-now"):
        a = _run_both(sc, 0, "jsq", POLICIES[pname], queue=True)[0]
        b = _run_both(sc, 0, "jsq", POLICIES[pname], queue=False)[0]
        assert np.array_equal(a, b, equal_nan=True)


def test_rows_draw_independent_noise_by_its_law():
    """Requests 1 s apart, one output token each, round robin over a fleet pinned at three rows (constant
    steps of 0.1 s, jitter only): every request is one step of its row, step k of row r being request
    3 k + r. The log factors are N(-sd^2 / 2, sd^2) on each row (99.99 % intervals) and the rows'
    step-by-step factors are uncorrelated (a shared key would make them equal)."""
    sd, n, rows = 0.2, 2400, 3
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=400),
                          latency=fastsim.LatencyModel(base_s=0.1, noise=fastsim.StepNoise(jitter_sd=sd)),
                          workload=fastsim.Workload(arrival_rate=1.0, num_requests=n))
    p = fastsim._replicate.pack_scenario(sc)
    lat, fpar = K.run_records(p["lat"], p["fpar"], 5, 6, 0)
    stream = (np.arange(n, dtype=float), np.full(n, 16), np.ones(n, np.int64), np.zeros(n, np.int64),
              np.zeros(n, np.int64), np.full(n, -1), np.zeros(n, np.int64))
    pol = fastsim.Autoscaler(metric="queue_depth", target=1.0, interval_s=50.0, min_replicas=rows,
                             max_replicas=rows)
    st, first, finish, _, _, owner, _, _, _ = A.simulate_autoscaled_stream(
        *stream, p["ipar"], fpar, lat, np.zeros(3), K.ROUTER_CODES["round_robin"], pol._record(), 5, 6, 0)
    assert (st == K.ST_COMPLETED).all()
    assert np.array_equal(owner, np.arange(n) % rows)
    x = np.log((first - stream[0]) / 0.1).reshape(-1, rows).T
    m = x.shape[1]
    z = 3.9
    for row in x:
        assert abs(row.mean() + sd * sd / 2) <= z * sd / math.sqrt(m)
        assert abs(row.var(ddof=1) - sd * sd) <= z * sd * sd * math.sqrt(2.0 / (m - 1))
    c = np.corrcoef(x)
    for i in range(rows):
        for j in range(i):
            assert abs(c[i, j]) <= 4.5 / math.sqrt(m), (i, j, c[i, j])


def test_replicate_runs_a_noisy_autoscaled_fleet_reproducibly():
    """`replicate` no longer refuses per-step noise with an autoscaler: the same bits on one thread or two, and
    stalls lengthen every replication's mean TPOT against the deterministic model on the same streams."""
    quiet = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=6.0, num_requests=200),
                             latency=fastsim.LatencyModel.default().deterministic(),
                             fleet=fastsim.Fleet(autoscaler=fastsim.Autoscaler(max_replicas=4, interval_s=5.0,
                                                                               provisioning_delay_s=2.0)))
    noisy = _noisy(quiet, fastsim.StepNoise(jitter_sd=0.2, stall_prob=0.05, stall_mean_s=0.05))
    a = fastsim.replicate(noisy, 8, seed=1, n_threads=1)
    b = fastsim.replicate(noisy, 8, seed=1, n_threads=2)
    assert a.per_replication.equals(b.per_replication)
    q = fastsim.replicate(quiet, 8, seed=1, n_threads=1)
    assert (a.per_replication["tpot_mean"] > q.per_replication["tpot_mean"]).all()
    assert (a.per_replication["blocks_used_at_end"] == 0).all()
    run = fastsim.simulate_autoscaled(noisy, seed=1, replication=5)   # (replication 5 of the same seed)
    assert run.gpu_hours == a.per_replication["gpu_hours"].iloc[5]
    assert run.slo_violation_minutes == a.per_replication["slo_violation_minutes"].iloc[5]
