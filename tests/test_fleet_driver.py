"""The compiled fleet driver (`kernel.cluster._run_fleet_chunk`): a fleet's
replications run in compiled code, as the Python layer runs each one
(`_fleet._one`), must give the same bits, and hand back to `_one` every
replication the worker's buffers do not fit (another stream size, larger
workspaces, a compact row overfilled). (Its speed: benchmarks/HISTORY.md.)"""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim import _fleet as F
from fastsim import kernel as K
from fastsim._pages import Spares
from fastsim._replicate import pack_scenario
from fastsim.kernel import cluster as C
from test_fleet_speed import CASES, NO_CACHE, V1_OFF
from test_traces import MOONCAKE


def _runs(monkeypatch, sc, nrep, threads=1, seed=(5, 6)):
    """The rows `run_fleet` gives with the compiled driver and without it,
    and how many replications the driver ran, in how many calls."""
    packed = pack_scenario(sc)
    ran = []
    real = F._compiled

    def counted(*args):
        done = real(*args)
        ran.append(done)
        return done

    monkeypatch.setattr(F, "_compiled", counted)
    driven = F.run_fleet(sc, packed, *seed, 0, nrep, threads)
    monkeypatch.setattr(F, "compiled_fleet", lambda members: False)
    alone = F.run_fleet(sc, packed, *seed, 0, nrep, threads)
    return driven, alone, ran


@pytest.mark.parametrize("router", ("jsq", "round_robin", "power_of_two", "prefix_affinity"))
@pytest.mark.parametrize("name", ["tight-sync", "kv-reservation-async", "queue-limit", "block-hash-async"])
def test_the_compiled_driver_gives_the_bits_of_each_replication_by_python(monkeypatch, name, router):
    sc = CASES[name].replace(fleet=fastsim.Fleet(replicas=3, router=router), **{"workload.warmup_requests": 10})
    driven, alone, ran = _runs(monkeypatch, sc, 6)
    assert np.array_equal(driven, alone, equal_nan=True)
    assert sum(ran) >= 1   # (the driver ran replications: the first is `_one`'s)


def test_the_driver_runs_a_listed_fleet_on_its_replicas_records(monkeypatch):
    """A fleet listed replica by replica, all of one kind (`compiled_fleet`
    takes it), under a scenario whose engine and latency differ: the
    scenario's records draw the stream, the replicas' run it. (The driver
    ran the scenario's engine until stop 66: prefix caching off there and
    on in the replicas gave NaN hit rates from the second replication.)
    Each replication as by Python, and as the same fleet of the replicas'
    engine stated as the scenario's."""
    e = dataclasses.replace(CASES["tight-sync"].engine, enable_prefix_caching=True, block_hash_caching=False)
    lat = dataclasses.replace(CASES["tight-sync"].latency, base_s=CASES["tight-sync"].latency.base_s * 1.5)
    sc = CASES["tight-sync"].replace(engine=dataclasses.replace(e, enable_prefix_caching=False),
                                     fleet=fastsim.Fleet(replicas=[(e, lat)] * 3, router="jsq"),
                                     **{"workload.prefix_groups": 4, "workload.prefix_len": fastsim.Fixed(64)})
    driven, alone, ran = _runs(monkeypatch, sc, 6)
    assert np.array_equal(driven, alone, equal_nan=True) and sum(ran) >= 4
    stated = sc.replace(engine=e, latency=lat, fleet=fastsim.Fleet(replicas=3, router="jsq"))
    assert np.array_equal(driven, F.run_fleet(stated, pack_scenario(stated), 5, 6, 0, 6), equal_nan=True)
    assert (driven[:, K.COLUMNS.index("prefix_hit_rate")] > 0).all()


def test_the_compiled_driver_on_two_threads(monkeypatch):
    sc = CASES["tight-sync"].replace(fleet=fastsim.Fleet(replicas=4, router="jsq"))
    driven, alone, ran = _runs(monkeypatch, sc, 16, threads=2)
    assert np.array_equal(driven, alone, equal_nan=True) and sum(ran) >= 8


def test_the_driver_hands_a_stream_of_another_size_to_python(monkeypatch):
    """A trace replayed in random windows: each replication's stream has its
    own size, so the driver stops before a replication whose size differs
    from the last one's, and `_one` runs it."""
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=400, **V1_OFF, **NO_CACHE),
                          workload=fastsim.Workload.from_trace(MOONCAKE, resample=True, duration_s=20.0),
                          latency=fastsim.LatencyModel.default(), fleet=fastsim.Fleet(replicas=2, router="jsq"))
    driven, alone, ran = _runs(monkeypatch, sc, 8)
    assert np.array_equal(driven, alone, equal_nan=True)
    assert len(set(alone[:, K.COLUMNS.index("n_arrived")])) > 1   # (sizes differ)
    assert ran.count(0) >= 1   # (a stop at once: the next stream's size differs)


def test_the_driver_hands_a_full_compact_row_to_python(monkeypatch):
    """Compact rows some replications overfill (`cluster.ROW_FULL`): the
    driver stops before such a replication, `_one` runs it again on whole
    rows, and the driver goes on with those. (Fresh spares: an earlier
    test's buffers of as many replicas, handed on, would be whole rows.)"""
    sc = CASES["tight-sync"].replace(fleet=fastsim.Fleet(replicas=3, router="round_robin"))
    monkeypatch.setattr(C, "compact_capacity", lambda n, nrep, ipars: n // nrep + 3)
    monkeypatch.setattr(F, "SPARES", Spares(max_bytes=2 ** 32, max_items=4))
    full = []
    real = C._simulate_fleet_rows

    def recorded(*args):
        rc = real(*args)
        full.append(rc == C.ROW_FULL)
        return rc

    driven, alone, ran = _runs(monkeypatch, sc, 8)
    assert np.array_equal(driven, alone, equal_nan=True)
    monkeypatch.setattr(C, "_simulate_fleet_rows", recorded)
    F.run_fleet(sc, pack_scenario(sc), 5, 6, 0, 8)
    # (a replication after the first overfills a row of n / 3 + 3 seats: replication 0, by `_one`, would
    # leave whole rows to the driver)
    assert not full[0] and any(full)
    assert len(ran) >= 2 and ran[0] > 0   # (the driver stopped, and went on after `_one`)


def test_the_driver_stops_before_a_replication_its_buffers_do_not_fit():
    """The driver leaves a replication whose workspaces exceed the worker's
    buffers to `_one` (which grows them): here the reduction's workspace."""
    sc = CASES["tight-sync"].replace(fleet=fastsim.Fleet(replicas=3, router="jsq"))
    packed = pack_scenario(sc)
    members = F.fleet_members(sc, packed)
    assert F.compiled_fleet(members)
    w = F._FleetWorker(sc.workload.num_requests, 3, 0)
    out = np.zeros((4, K.N_COLUMNS + K.N_FLEET_COLUMNS))
    F._one(w, 0, 5, 6, packed, members, None, out[0, :K.N_COLUMNS], out[0, K.N_COLUMNS:])
    assert F._compiled(w, 1, 3, 5, 6, packed, members, None, out[1:]) == 3
    w.wm = (w.wm[0][:10], w.wm[1][:10])
    out[1:] = 0.0
    assert F._compiled(w, 1, 3, 5, 6, packed, members, None, out[1:]) == 0
    assert not out[1:].any()


@pytest.mark.parametrize("router", ("jsq", "round_robin"))
def test_the_driver_keys_each_replicas_step_noise_as_python(monkeypatch, router):
    """Per-step noise and per-run effects: the driver gives each replica its own step-noise stream
    (`kernel.cluster._noise_keys`), the bits `_one` gives (until stop 70 such fleets ran in Python)."""
    noise = fastsim.StepNoise(jitter_sd=0.3, stall_prob=0.05, stall_mean_s=0.02, speed_sd=0.1)
    sc = CASES["tight-sync"].replace(fleet=fastsim.Fleet(replicas=3, router=router))
    sc = sc.replace(latency=dataclasses.replace(sc.latency, noise=noise))
    driven, alone, ran = _runs(monkeypatch, sc, 6)
    assert np.array_equal(driven, alone, equal_nan=True) and sum(ran) >= 4
    det = sc.replace(latency=sc.latency.deterministic())
    quiet = F.run_fleet(det, pack_scenario(det), 5, 6, 0, 6)
    assert not np.array_equal(driven, quiet, equal_nan=True)   # (the noise is in the bits)


def test_the_driver_takes_uniform_fleets_only():
    sc = CASES["tight-sync"].replace(fleet=fastsim.Fleet(replicas=3, router="jsq"))
    assert F.compiled_fleet(F.fleet_members(sc, pack_scenario(sc)))
    noisy = sc.replace(latency=dataclasses.replace(sc.latency, noise=fastsim.StepNoise(jitter_sd=0.3)))
    assert F.compiled_fleet(F.fleet_members(noisy, pack_scenario(noisy)))
    other = dataclasses.replace(sc.engine, max_num_seqs=3)
    mixed = sc.replace(fleet=fastsim.Fleet(replicas=[(sc.engine, sc.latency), (other, sc.latency)], router="jsq"))
    assert not F.compiled_fleet(F.fleet_members(mixed, pack_scenario(mixed)))


def test_a_workers_buffers_have_one_numba_type_whatever_their_sizes():
    """`kernel.cluster.fleet_pointers` looks its pointers up by the
    scenario's arrays alone: the worker's buffers (compact or whole rows, on
    huge pages or not, any size) and the reduction's rows keep one Numba
    type."""
    import numba

    w = F._FleetWorker(4000, 3, 0)
    types = set()
    for n, m, need in ((4000, 4000, 900_000), (4000, 1400, 300), (120, 120, 5000), (120, 50, 40)):
        sizes = np.array([[need, need // 2]] * 3)
        fb, wm_i, wm_f = w.buffers(n, sizes, m)
        types.add(tuple(numba.typeof(x) for x in (fb, wm_i, wm_f, w.wm[0], w.wm[1])))
    assert len(types) == 1
