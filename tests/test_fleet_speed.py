"""The fleet's departure bound (`kernel.cluster._departs`): routers that read
only each replica's requests in the system (JSQ, least outstanding, prefix
and session affinity; power of two choices by its two draws) leave a
replica paused until a request can leave it.
That must change no bit: the fleet with the bound is the fleet without it
(and the reference fleet) per request, over engines where requests queue,
are preempted, are rejected by admission control, with async scheduling and
caching by block hash on and off. The bound rests on `_min_step` being a
lower bound of every step's duration, checked here against the step-time
model itself. (The speed is measured by benchmarks/fleet_kernel.py and
benchmarks/fleet_throughput.py, figures in benchmarks/HISTORY.md.)"""

import dataclasses

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._numba_options import python_entry
from fastsim._replicate import pack_scenario
from fastsim.kernel import cluster as C
from fastsim.kernel import latency as KL
from test_fleet_reference import _agree, _fleet_record, _link_record
from test_replica import LAT, _stream

#: vLLM 0.22's switches, stated (the defaults are about to change), on and off.
V1_ON = dict(async_scheduling=True, scheduler_reserve_full_isl=True, null_block=True)
V1_OFF = dict(async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False)
NO_CACHE = dict(enable_prefix_caching=False, block_hash_caching=False)
HASH = dict(enable_prefix_caching=True, block_hash_caching=True)


def _scenario(v1, cache, **engine):
    eng = dict(max_num_seqs=6, num_gpu_blocks=90, max_num_batched_tokens=256)
    eng.update(engine)
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**v1, **cache, **eng),
        workload=fastsim.Workload(arrival_rate=14.0, num_requests=120, prompt_len=fastsim.Uniform(20, 300),
                                  output_len=fastsim.Uniform(1, 160), prefix_groups=4, prefix_len=64),
        latency=LAT)


CASES = {
    # queues and preemptions (tight KV), no admission control
    "tight-sync": _scenario(V1_OFF, NO_CACHE),
    "tight-async": _scenario(V1_ON, NO_CACHE),
    # admission control rejects at ingestion: the bound must not pass over a rejection
    "kv-reservation-sync": _scenario(V1_OFF, NO_CACHE, admission="kv_reservation"),
    "kv-reservation-async": _scenario(V1_ON, NO_CACHE, admission="kv_reservation"),
    "queue-limit": _scenario(V1_OFF, NO_CACHE, admission="queue_limit", max_waiting=2),
    # the full engine: caching by block hash, shared prefixes (slow steps), both ways
    "block-hash-sync": _scenario(V1_OFF, HASH),
    "block-hash-async": _scenario(V1_ON, HASH),
}

min_step, after = python_entry(C._min_step), python_entry(C._after)
step_time, fill_decode_costs = python_entry(KL._step_time), python_entry(KL._fill_decode_costs)

ROUTERS = ("jsq", "least_outstanding", "prefix_affinity", "session_affinity", "power_of_two")


def _run(sc, rep, router, nrep, staleness, latency, bound):
    stream, p = _stream(sc, rep)
    return C.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(staleness, latency),
                                   K.ROUTER_CODES[router], nrep, 11, 12, 3, bound=bound)


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("name", list(CASES))
def test_the_departure_bound_changes_no_bit(name, router):
    sc = CASES[name]
    statuses = set()
    for rep, (nrep, staleness, latency) in enumerate(((3, 0.0, 0.0), (4, 0.3, 0.0), (2, 0.0, 0.01))):
        on = _run(sc, rep, router, nrep, staleness, latency, True)
        off = _run(sc, rep, router, nrep, staleness, latency, False)
        for x, y in zip(on, off):
            assert np.array_equal(x, y, equal_nan=True)
        statuses |= set(on[0].tolist())
    if name.startswith("kv-reservation") or name == "queue-limit":
        assert K.ST_REJECTED_ADMISSION in statuses   # (the case the bound must not pass over happened)


@pytest.mark.parametrize("name", ["tight-sync", "tight-async", "kv-reservation-sync", "block-hash-sync"])
def test_the_bounded_fleet_is_the_reference_fleet(name):
    sc = CASES[name]
    for rep, (nrep, staleness, latency) in enumerate(((3, 0.0, 0.0), (4, 0.3, 0.01))):
        stream, p = _stream(sc, rep)
        _agree(sc, stream, p, "jsq", nrep, staleness, latency)


def test_min_step_is_a_lower_bound_of_every_step():
    """`_min_step` against `latency._step_time` over many batch compositions,
    for deterministic models (with per-run effects drawn) and 0.0 with
    per-step noise."""
    rng = np.random.default_rng(0)
    models = [LAT, fastsim.LatencyModel.default(), fastsim.LatencyModel(base_s=0.01, decode_scale_s=0.0,
                                                                         decode_alpha=1.0)]
    for model in models:
        sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=64, **V1_OFF, **NO_CACHE),
                              workload=fastsim.Workload(num_requests=10), latency=model)
        p = pack_scenario(sc)
        for rep in range(3):
            lat, _fpar = K.run_records(p["lat"], p["fpar"], 5, 6, rep)
            dmin = min_step(lat)
            assert dmin > 0.0
            dec = np.empty(65)
            fill_decode_costs(lat, dec, 1)   # (``extras``: the full engine's, every term read)
            for _ in range(300):
                nd, npf, nctx, nsw = (int(x) for x in rng.integers(0, [65, 5000, 200000, 50]))
                npfs = int(rng.integers(0, min(npf, 64) + 1))          # sequences prefilling
                pairs2 = float(rng.integers(0, npf * (npf + 1) + 1))   # twice their causal pairs
                assert step_time(lat, dec, nd, npf, nctx, nsw, 0.0, pairs2, npfs, 1) >= dmin
    noisy = np.array(pack_scenario(sc)["lat"])
    noisy[K.L_NOISE] = 1.0
    assert min_step(noisy) == 0.0


def test_after_is_below_the_clock_sums():
    """`_after` against the sums the engine's clock makes, step by step, of
    steps exactly ``dmin`` long (the tightest case), from large clocks."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        c = float(rng.uniform(0, 1e6))
        d = float(rng.uniform(1e-4, 0.05))
        m = int(rng.integers(1, 3000))
        t = c
        for _k in range(m):
            t += d
        assert after(c, m, d) <= t
        assert after(c, m, d) <= c + m * d


def test_the_compiled_segment_view_is_the_slice():
    """`workspace._take` compiled (`_segment_view`: a view built without a
    slice's bounds normalisation, which every call of `replica._simulate`
    takes some 80 of) is ``w[o:o + size]``: the same memory, length and
    strides, a write reaching the array, for int and float arrays,
    contiguous and strided, at random segments inside them."""
    import numba

    from fastsim.kernel.workspace import _take

    @numba.njit
    def take(w, o, size, value):
        v, o2 = _take(w, o, size)
        if size > 0:
            v[size - 1] = value
        return v, o2

    rng = np.random.default_rng(2)
    for dtype in (np.int64, np.float64):
        for step in (1, 3):
            for _ in range(50):
                w = np.arange(400, dtype=dtype)[::step]
                o = int(rng.integers(0, w.size + 1))
                size = int(rng.integers(0, w.size - o + 1))
                expect = w[o:o + size].copy()
                if size > 0:
                    expect[-1] = -7
                v, o2 = take(w, o, size, dtype(-7))
                assert o2 == o + size and v.shape == (size,) and v.strides == w.strides
                assert v.__array_interface__["data"][0] == w.__array_interface__["data"][0] + o * w.strides[0]
                assert np.array_equal(v, expect)
                assert np.array_equal(w[o:o + size], expect)   # (a view: the write reached the array)


# The stretch end kept across a hand (`cluster._keep_end`): the event queue's routers key a replica
# just handed a request by the end of the stretch it was paused before, pushed by the handed request's
# prefill and decode terms, where that end stays a lower bound of its next departure. That must change no
# bit either: the fleet that keeps ends is the fleet that does not, and the fleet without any bound, per
# request, over random fleets of random engines (roomy and tight KV, chunked and not, small budgets, FCFS,
# priority and SJF, swap, admission control, vLLM 0.22's switches on and off, caching by block hash,
# step-time models with and without a context term), live and stale views, with and without routing
# latency.

LAT_FLAT = fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5)
V1_SYNC = dict(async_scheduling=False, scheduler_reserve_full_isl=True, null_block=True)
KEEP_ROUTERS = ("jsq", "least_outstanding", "prefix_affinity", "session_affinity")


#: Per-run latency effects only (no per-step noise): each replication draws its own speed and prefill
#: factors, so the prefill term the departure bound reads is the run's own (`latency._draw_run_latency`).
LAT_RUN_EFFECTS = dataclasses.replace(LAT, noise=fastsim.StepNoise(speed_sd=0.2, prefill_sd=0.3))


def _keep_scenario(rng):
    """A random engine and workload (the kept end's conditions met in some, broken in others); drawn
    again where the combination is refused."""
    while True:
        try:
            return _draw_keep_scenario(rng)
        except ValueError:
            pass


def _draw_keep_scenario(rng):
    v1 = [V1_OFF, V1_SYNC, V1_ON][int(rng.choice(3, p=[0.45, 0.35, 0.2]))]
    cache = HASH if rng.random() < 0.15 else NO_CACHE
    eng = dict(max_num_seqs=int(rng.integers(2, 9)),
               num_gpu_blocks=int(rng.choice([40, 90, 400, 4000])),
               max_num_batched_tokens=int(rng.choice([48, 128, 512, 2048])),
               enable_chunked_prefill=bool(rng.random() < 0.8),
               policy=str(rng.choice(["fcfs", "fcfs", "fcfs", "priority", "sjf"])))
    if not eng["enable_chunked_prefill"]:
        eng["max_num_batched_tokens"] = 2048
    r = rng.random()
    if r < 0.1:
        eng.update(admission="kv_reservation")
    elif r < 0.2:
        eng.update(admission="queue_limit", max_waiting=2)
    elif r < 0.3:
        eng.update(preemption_mode="swap", num_gpu_blocks=40)
    lat = [LAT_FLAT, LAT_FLAT, fastsim.LatencyModel.default(), LAT,
           LAT_RUN_EFFECTS][int(rng.integers(5))]   # (the last: each run's own prefill cost, `rlat`)
    rate = float(rng.uniform(4.0, 30.0))
    wl = fastsim.Workload(arrival_rate=rate, num_requests=int(rng.integers(60, 160)),
                          prompt_len=fastsim.Uniform(1, int(rng.choice([40, 300, 900]))),
                          output_len=fastsim.Uniform(1, int(rng.choice([20, 160, 400]))),
                          prefix_groups=4, prefix_len=32,
                          **(dict(priorities=(0, 1, 2), priority_probs=(0.3, 0.3, 0.4)) if eng["policy"] == "priority" else {}))
    return fastsim.Scenario(engine=fastsim.EngineConfig(**v1, **cache, **eng), workload=wl, latency=lat)


def _fleet_runs(sc, rep, router, nrep, staleness, latency):
    stream, p = _stream(sc, rep)
    args = (*stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(staleness, latency), K.ROUTER_CODES[router],
            nrep, 11, 12, 3)
    kept = np.empty(stream[0].size)
    on = C.simulate_fleet_stream(*args, kept=kept)
    return on, C.simulate_fleet_stream(*args, keep=False), C.simulate_fleet_stream(*args, bound=False), kept


@pytest.mark.parametrize("seed", range(10))
def test_the_kept_stretch_end_changes_no_bit(seed):
    rng = np.random.default_rng(100 + seed)
    n_kept = 0
    for k in range(8):
        # (the first of each seed meets the rule's conditions: roomy, synchronous, no context term,
        # busy replicas, a live view)
        sc = _keep_scenario(rng) if k > 0 else fastsim.Scenario(
            engine=fastsim.EngineConfig(**V1_SYNC, **NO_CACHE, max_num_seqs=int(rng.integers(4, 17)),
                                        num_gpu_blocks=4000, max_num_batched_tokens=int(rng.choice([64, 512]))),
            workload=fastsim.Workload(arrival_rate=float(rng.uniform(15.0, 30.0)), num_requests=150,
                                      prompt_len=fastsim.Uniform(1, 400), output_len=fastsim.Uniform(1, 200)),
            latency=LAT_FLAT)
        router = KEEP_ROUTERS[(seed + k) % len(KEEP_ROUTERS)] if k > 0 else KEEP_ROUTERS[seed % 2]
        nrep = int(rng.integers(2, 7)) if k > 0 else 2 + seed % 2
        staleness = float(rng.choice([0.0, 0.0, 0.3])) if k > 0 else 0.0
        latency = float(rng.choice([0.0, 0.01]))
        on, off, none, kept = _fleet_runs(sc, k, router, nrep, staleness, latency)
        for x, y, z in zip(on, off, none):
            assert np.array_equal(x, y, equal_nan=True)
            assert np.array_equal(x, z, equal_nan=True)
        n_kept += int(np.isfinite(kept).sum())
    assert n_kept > 0   # (the rule fired in these fleets)


def test_the_kept_stretch_end_is_not_idle():
    """On roomy synchronous FCFS engines with a step time without a context term (the benchmarks'
    case) hands keep an end (a replica busy at the hand: most over 2 replicas, fewer over 8 at the
    same fleet rate), live and stale, with and without routing latency; none where a condition is broken:
    async scheduling, caching by block hash, a context term, priority preemption."""
    def share(sc, router, nrep, staleness=0.0, latency=0.0):
        total = 0
        kept_n = 0
        for rep in range(3):
            on, off, _none, kept = _fleet_runs(sc, rep, router, nrep, staleness, latency)
            for x, y in zip(on, off):
                assert np.array_equal(x, y, equal_nan=True)
            total += kept.size
            kept_n += int(np.isfinite(kept).sum())
        return kept_n / total

    roomy = dict(max_num_seqs=16, num_gpu_blocks=4000, max_num_batched_tokens=512)
    for v1 in (V1_OFF, V1_SYNC):
        for lat in (LAT_FLAT, fastsim.LatencyModel.default()):
            sc = _scenario(v1, NO_CACHE, **roomy)
            sc = fastsim.Scenario(engine=sc.engine, workload=sc.workload, latency=lat)
            shares = (share(sc, "jsq", 2), share(sc, "least_outstanding", 8, 0.0, 0.01), share(sc, "jsq", 3, 0.3))
            assert min(shares) > 0.05
    off_cases = [_scenario(V1_ON, NO_CACHE, **roomy), _scenario(V1_OFF, HASH, **roomy),
                 _scenario(V1_OFF, NO_CACHE, **roomy)]   # (the last: LAT, with its context term)
    prio = _scenario(V1_OFF, NO_CACHE, **roomy, policy="priority", priority_preemption=True)
    for sc in off_cases + [fastsim.Scenario(engine=prio.engine, workload=prio.workload, latency=LAT_FLAT)]:
        assert share(sc, "jsq", 3) == 0.0


# The disaggregated server's decode router looks by the fleet's event queue (`cluster._look_due`): only the
# decode replicas whose state can change by a hand-off are advanced, with the departure bound where the
# router reads requests in the system only. That must change no bit: the server that looks so is the one
# that advances and observes every decode replica at every hand-off (`cluster._look`), per request, over
# random engines on both sides (vLLM 0.22's switches on and off, caching by block hash, tight and roomy KV,
# FCFS, priority and SJF, swap, admission control), every decode router, finite and instant links, stale
# prefill routers and routing latency.

def _disagg_runs(pe, de, router_p, router_d, n_p, n_d, stream, link, stale, lag, rep):
    from fastsim.kernel import disagg as D
    pp, pd_ = pack_scenario(pe), pack_scenario(de)
    prefill = (pp["ipar"], pp["fpar"], pp["lat"], _fleet_record(stale, lag), K.ROUTER_CODES[router_p], n_p)
    decode = (pd_["ipar"], pd_["fpar"], pd_["lat"], K.ROUTER_CODES[router_d], n_d)
    return tuple(D.simulate_disagg_stream(*stream, prefill, decode, link, 11, 12, rep, queue=q) for q in (True, False))


@pytest.mark.parametrize("seed", range(6))
def test_the_decode_pools_event_queue_changes_no_bit(seed):
    rng = np.random.default_rng(300 + seed)
    routers = tuple(K.ROUTER_CODES)
    for k in range(6):
        sc_p, sc_d = _keep_scenario(rng), _keep_scenario(rng)
        router_d = routers[(seed * 6 + k) % len(routers)]
        router_p = str(rng.choice(routers))
        n_p, n_d = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        link = _link_record(float(rng.choice([np.inf, 2e6, 2e7])), float(rng.choice([0.0, 0.003])), 1000.0)
        stale, lag = float(rng.choice([0.0, 0.0, 0.3])), float(rng.choice([0.0, 0.01]))
        stream, _p = _stream(sc_p, k)
        de = fastsim.Scenario(engine=sc_d.engine, workload=sc_p.workload, latency=sc_d.latency)
        (per, row, extra), (per0, row0, extra0) = _disagg_runs(sc_p, de, router_p, router_d, n_p, n_d, stream,
                                                               link, stale, lag, k)
        for key in per:
            assert np.array_equal(per[key], per0[key], equal_nan=True), (router_d, key)
        assert np.array_equal(row, row0, equal_nan=True) and np.array_equal(extra, extra0, equal_nan=True)


def test_the_decode_pools_event_queue_is_taken(monkeypatch):
    """With a decode router that reads the replicas' state, the event queue keys the decode replicas (their
    due times written); with the short queue buffer asked for by ``queue=False`` it is not used."""
    from fastsim.kernel import disagg as D
    made = []
    fleet_buffers = C.fleet_buffers

    def buffers(*args):
        fb = fleet_buffers(*args)
        fb.due[:] = np.nan   # (only the event queue writes them)
        made.append(fb)
        return fb

    monkeypatch.setattr(C, "fleet_buffers", buffers)
    sc = _scenario(V1_OFF, NO_CACHE, max_num_seqs=16, num_gpu_blocks=4000)
    stream, p = _stream(sc, 0)
    link = _link_record(np.inf, 0.0, 1000.0)
    prefill = (p["ipar"], p["fpar"], p["lat"], np.zeros(3), K.ROUTER_CODES["jsq"], 2)
    for router in ("jsq", "least_kv", "power_of_two"):
        decode = (p["ipar"], p["fpar"], p["lat"], K.ROUTER_CODES[router], 3)
        for queue in (True, False):
            made.clear()
            D.simulate_disagg_stream(*stream, prefill, decode, link, 11, 12, 0, queue=queue)
            fbd = made[1]   # (the prefill pool's first, then the decode pool's)
            assert np.isnan(fbd.due).all() != queue, (router, queue)


# The hand-offs' order (`disagg._sort_by_time`): an insertion sort for the nearly sorted first tokens of the
# prefill side, a merge sort finishing past ``4 m`` moves. Either way the order must be the one by first
# token, ties by request index: numpy's stable sort of the same keys.

def test_the_hand_off_sort_is_the_stable_sort():
    from fastsim.kernel import disagg as D
    sort = python_entry(D._sort_by_time)
    rng = np.random.default_rng(7)
    paths = set()
    for case in range(64):
        m = int(rng.integers(0, 400)) if case >= 4 else case   # (m = 0 .. 3 first: the edges)
        n = m + int(rng.integers(0, 20))
        kind = case % 4
        if kind == 0:     # nearly in index order, as the prefill side's first tokens come
            key = np.arange(n) * 0.05 + rng.exponential(0.08, n)
        elif kind == 1:   # many ties
            key = rng.integers(0, 6, n).astype(float)
        elif kind == 2:   # reversed: past the insertion sort's budget
            key = -np.arange(n, dtype=float)
        else:
            key = rng.random(n)
        idx = np.sort(rng.choice(n, m, replace=False)) if n else np.zeros(0, np.int64)
        order, scratch = np.zeros(n, np.int64), np.zeros(n, np.int64)
        order[:m] = idx
        sort(np.int64(m), key, order, scratch)
        expect = idx[np.argsort(key[idx], kind="stable")]
        assert np.array_equal(order[:m], expect), (case, m)
        inversions = sum(int((key[idx[e + 1:]] < key[idx[e]]).sum()) for e in range(m))
        paths.add(inversions > 4 * m)
    assert paths == {True, False}   # (both the insertion sort alone and the merge sort after it were run)


# A handed request's departure bound counts its prompt's prefill (`cluster._after_prefill`): it leaves no
# earlier than its arrival plus its output times the shortest step plus the prefill term of the prompt tokens
# it still has to compute (the regression model, no prefix caching). That bound must be below every
# request's real departure, and it must change no bit of a fleet or a disaggregated server (whose prefill
# pool it keys: one step a request there).

after_prefill = python_entry(C._after_prefill)


def test_after_prefill_is_below_every_departure():
    """Over random engines without prefix caching (vLLM 0.22's switches on and off, chunked prefill with
    small budgets, tight KV, swap, priority), each completed request's finish, its stream simulated on one
    replica, is at or after the bound of its arrival, output and whole prompt; and the tightest case (one
    prefill step, then steps of exactly the base) from large clocks."""
    from fastsim.kernel.drivers import simulate_stream
    rng = np.random.default_rng(17)
    checked = 0
    for k in range(24):
        sc = _keep_scenario(rng)
        if sc.engine.enable_prefix_caching:
            sc = sc.replace(**{"engine.enable_prefix_caching": False, "engine.block_hash_caching": False})
        stream, p = _stream(sc, k)
        status, _first, finish = simulate_stream(*stream, p["ipar"], p["fpar"], p["lat"])[:3]
        dmin, pf = min_step(p["lat"]), p["lat"][K.L_PREFILL]
        assert dmin > 0.0 and pf > 0.0
        arrival, prompt, output = stream[0], stream[1], stream[2]
        done = status == K.ST_COMPLETED
        for i in np.flatnonzero(done):
            assert after_prefill(arrival[i], output[i], dmin, pf * prompt[i]) <= finish[i], (k, i)
        checked += int(done.sum())
    assert checked > 1000
    for _ in range(200):
        c = float(rng.uniform(0, 1e6))
        d, pf = float(rng.uniform(1e-4, 0.05)), float(rng.uniform(0.0, 1e-4))
        m, p = int(rng.integers(1, 3000)), int(rng.integers(1, 4000))
        t = c + (d + pf * p)
        for _k in range(m - 1):
            t += d
        assert after_prefill(c, m, d, pf * p) <= t


def test_the_prefill_bound_is_taken(monkeypatch):
    """`_departs_parts` keys a handed request by `_after_prefill` of the prompt left to compute (all of it, or
    one token where a disaggregated decode replica holds the rest), and by the output alone with prefix
    caching on: a fleet's replica after its run, its last request set back to handed and not taken in."""
    from fastsim.kernel import workspace as W
    made = []
    fleet_buffers = C.fleet_buffers

    def buffers(*args):
        made.append(fleet_buffers(*args))
        return made[-1]

    monkeypatch.setattr(C, "fleet_buffers", buffers)
    sc = _scenario(V1_OFF, NO_CACHE, max_num_seqs=16, num_gpu_blocks=4000)
    stream, p = _stream(sc, 0)
    C.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(0.0, 0.0), K.ROUTER_CODES["jsq"],
                            2, 11, 12, 3)
    fb = made[-1]
    parts = python_entry(C._departs_parts)
    n = stream[0].size
    w = fb.wi[0]
    b = fb.size[0, 0] - W.N_RI
    j = w[b + W.RI_N_KNOWN] - 1
    assert w[b + W.RI_N_RUN] + w[b + W.RI_N_WAIT] + w[b + W.RI_N_SWAPPED] == 0 and w[b + W.RI_N_HELD] == 0
    w[b + W.RI_NEXT_ARRIVAL] = j
    lat = fb.rlat[0]
    dmin, pf = min_step(lat), lat[K.L_PREFILL]
    a, pr, o = fb.rs_a[0, j], fb.rs_i[0, 0, j], fb.rs_i[1, 0, j]
    for k, want in ((0, pf * pr), (pr - 1, pf)):
        w[K.WI_K * n + j] = k
        d, h = parts(fb, np.int64(0), np.int64(n), dmin, lat)
        assert h == after_prefill(a, o, dmin, want) and h > after(a, o, dmin)
    fb.rip[0, K.I_CACHING] = 1
    d, h = parts(fb, np.int64(0), np.int64(n), dmin, lat)
    assert h == after_prefill(a, o, dmin, 0.0) <= after(a, o, dmin) + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_the_disaggregated_bound_changes_no_bit(seed):
    """A disaggregated server with the departure bound in both pools (the prefill pool's requests keyed by
    their prompts' prefill, the decode pool's by the one token left) is the server without it, per request,
    over random engines on both sides and the routers that read requests in the system only."""
    from fastsim.kernel import disagg as D
    rng = np.random.default_rng(500 + seed)
    routers = ("jsq", "least_outstanding", "prefix_affinity", "session_affinity")
    for k in range(5):
        sc_p, sc_d = _keep_scenario(rng), _keep_scenario(rng)
        router_d, router_p = routers[(seed + k) % 4], routers[int(rng.integers(4))]
        n_p, n_d = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        link = _link_record(float(rng.choice([np.inf, 2e6, 2e7])), float(rng.choice([0.0, 0.003])), 1000.0)
        stale, lag = float(rng.choice([0.0, 0.0, 0.3])), float(rng.choice([0.0, 0.01]))
        stream, _p = _stream(sc_p, k)
        de = fastsim.Scenario(engine=sc_d.engine, workload=sc_p.workload, latency=sc_d.latency)
        pp, pd_ = pack_scenario(sc_p), pack_scenario(de)
        prefill = (pp["ipar"], pp["fpar"], pp["lat"], _fleet_record(stale, lag), K.ROUTER_CODES[router_p], n_p)
        decode = (pd_["ipar"], pd_["fpar"], pd_["lat"], K.ROUTER_CODES[router_d], n_d)
        runs = [D.simulate_disagg_stream(*stream, prefill, decode, link, 11, 12, k, queue=q, bound=bd)
                for q, bd in ((True, True), (True, False), (False, False))]
        per, row, extra = runs[0]
        for per0, row0, extra0 in runs[1:]:
            for key in per:
                assert np.array_equal(per[key], per0[key], equal_nan=True), (router_d, key)
            assert np.array_equal(row, row0, equal_nan=True) and np.array_equal(extra, extra0, equal_nan=True)


def test_a_workers_rows_stay_in_place_and_change_no_bit():
    """A thread's fleet buffers (`_fleet._FleetWorker`) keep each replica's
    row where it was, whatever a replication's workspace size (the rows are
    as wide as the allocation), so that the pages a replica wrote are
    written again, not faulted in afresh; and replications run one after
    the other in one worker's dirty rows give the bits of each run alone."""
    from fastsim import _fleet as F

    sc = _scenario(V1_OFF, NO_CACHE).replace(fleet=fastsim.Fleet(replicas=3, router="jsq"))
    packed = pack_scenario(sc)
    together = F.run_fleet(sc, packed, 5, 6, 0, 6)
    alone = np.vstack([F.run_fleet(sc, packed, 5, 6, j, 1) for j in range(6)])
    assert np.array_equal(together, alone, equal_nan=True)

    worker = F._FleetWorker(120, 3, 0)
    sizes = np.array([[5000, 4000]] * 3)
    fb = worker.buffers(120, sizes)[0]
    where = [(fb.wi[r].ctypes.data, fb.wf[r].ctypes.data) for r in range(3)]
    for shrink in (1, 7, 600):   # (smaller workspaces: no regrowth)
        fb = worker.buffers(120, sizes - shrink)[0]
        assert [(fb.wi[r].ctypes.data, fb.wf[r].ctypes.data) for r in range(3)] == where


def test_a_fleet_runs_buffers_are_handed_to_the_next_run(monkeypatch):
    """`run_replications` hands each worker's buffers on (`_FleetWorker.give_back`):
    the next run of as many replicas takes them, dirty, and gives the same
    results; a spare serves only as many replicas and prefix groups, and
    only a worker that maps a trace's block identities (or not) as it did."""
    from fastsim import _fleet as F
    from fastsim._pages import Spares

    spares = Spares(max_bytes=2 ** 32, max_items=4)
    monkeypatch.setattr(F, "SPARES", spares)
    sc = _scenario(V1_OFF, NO_CACHE).replace(fleet=fastsim.Fleet(replicas=3, router="jsq"))
    first = fastsim.replicate(sc, n_replications=3, seed=0, n_threads=1).to_frame()
    assert [key for key, _, _ in spares._items] == [(3, 4, False)]
    rows = spares._items[0][1][0]
    again = fastsim.replicate(sc, n_replications=3, seed=0, n_threads=2).to_frame()
    assert first.equals(again)
    assert any(arrays[0] is rows for _, arrays, _ in spares._items) and len(spares) <= 2
    w = F._FleetWorker(120, 2, 0)
    assert w.fb is None   # (no spare for 2 replicas)
    w.uniform_buffers(120, 500, 400)
    given = w._wi
    w.give_back()
    assert w.fb is None and spares._items[-1][0] == (2, 0, False)
    assert F._FleetWorker(120, 2, 0, trace_block_size=16).fb is None   # (its table and map: another layout)
    w = F._FleetWorker(120, 2, 0)
    assert w.fb is not None and w._wi is given and w.size[1] >= 500 and len(spares) <= 2


def _compact_run(stream, p, router, nrep, m):
    """The fleet kernel on rows of capacity ``m`` (`cluster.compact_capacity`'s
    rows, any ``m``): its return code and buffers."""
    ipars, fpars, lats, _, _, full = C.fleet_records(p["ipar"], p["fpar"], p["lat"], nrep)
    n = stream[0].size
    sizes = np.array([K._ws_need_compact(np.int64(m), np.int64(n), stream[1], stream[2], stream[5], stream[6], row)
                      for row in ipars], np.int64).reshape(nrep, 2)
    fb = C.fleet_buffers(n, nrep, *sizes.max(axis=0), C._ngroups(stream[5]), m)
    C.fill_records(fb, ipars, fpars, lats, sizes)
    rc = C._simulate_fleet_rows(np.int64(n), *stream, _fleet_record(0.0, 0.0), np.int64(K.ROUTER_CODES[router]),
                                np.int64(nrep), np.uint64(11), np.uint64(12), np.int64(3), fb, full)
    return rc, fb


@pytest.mark.parametrize("router", ("jsq", "round_robin", "power_of_two", "least_kv", "prefix_affinity",
                                    "session_affinity"))
def test_compact_rows_change_no_bit(router):
    """A fleet's replicas on compact rows (`cluster.compact_capacity`: rows
    for a share of the stream) give the bits of rows for the whole stream;
    a row a request would overfill stops the run (`cluster.ROW_FULL`), and
    `simulate_fleet_stream` runs it again on whole rows."""
    full_rows = 0
    for name in ("tight-sync", "tight-async", "block-hash-async"):
        sc = CASES[name]
        for rep, nrep in enumerate((3, 5)):
            stream, p = _stream(sc, rep)
            n = stream[0].size
            whole = C.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(0.0, 0.0),
                                            K.ROUTER_CODES[router], nrep, 11, 12, 3, capacity=n)
            for m in (n // 2, n // nrep + 8, 5):
                rc, _ = _compact_run(stream, p, router, nrep, m)
                assert rc in (0, C.ROW_FULL)
                full_rows += rc == C.ROW_FULL
                got = C.simulate_fleet_stream(*stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(0.0, 0.0),
                                              K.ROUTER_CODES[router], nrep, 11, 12, 3, capacity=m)
                for x, y in zip(got, whole):
                    assert np.array_equal(x, y, equal_nan=True), (name, rep, m)
    assert full_rows >= 6   # (a capacity of 5 overfills in every case: the run again on whole rows was taken)


def test_a_compact_row_is_full_by_its_gap_room():
    """A compact row is full when the measured output tokens handed to it
    would overfill its gap samples' room (`workspace._compact_dims`), not
    only its seats: round robin hands replica 0 every long output."""
    sc = CASES["tight-sync"]
    stream, p = _stream(sc, 0)
    stream = tuple(x[:40].copy() for x in stream)
    stream[2][0::2], stream[2][1::2] = 150, 1
    n, m = 40, 30   # (seats to spare: 20 requests each)
    rc, fb = _compact_run(stream, p, "round_robin", 2, m)
    room = fb.wi[0, fb.size[0, 0] - K.workspace.N_RI + K.workspace.RI_DIM_NITL]
    assert rc == C.ROW_FULL and fb.tok[0] <= room < 20 * 150
    assert _compact_run(stream, p, "round_robin", 2, n)[0] == 0
    args = (*stream, p["ipar"], p["fpar"], p["lat"], _fleet_record(0.0, 0.0), K.ROUTER_CODES["round_robin"], 2)
    for x, y in zip(C.simulate_fleet_stream(*args, capacity=m), C.simulate_fleet_stream(*args, capacity=n)):
        assert np.array_equal(x, y, equal_nan=True)
    with pytest.raises(ValueError, match="capacity must be an int in 1 .. 40"):
        C.simulate_fleet_stream(*args, capacity=0)


def test_replicate_on_compact_rows_is_replicate_on_whole_rows(monkeypatch):
    """`replicate` of a fleet on compact rows (the default where they apply),
    on rows too small for any replication (each run again on whole rows,
    `_fleet._FleetWorker.compact`), and on whole rows: the same results."""
    from fastsim import _fleet as F

    sc = _scenario(V1_OFF, NO_CACHE).replace(
        workload=fastsim.Workload(arrival_rate=40.0, num_requests=600, prompt_len=fastsim.Uniform(20, 300),
                                  output_len=fastsim.Uniform(1, 160)),
        fleet=fastsim.Fleet(replicas=6, router="jsq"))
    assert C.compact_capacity(600, 6, pack_scenario(sc)["ipar"]) == 264
    compact = fastsim.replicate(sc, n_replications=4, seed=1, n_threads=2).to_frame()
    real = C.compact_capacity
    monkeypatch.setattr(C, "compact_capacity", lambda n, nrep, ipars: min(n, 5))
    tiny = fastsim.replicate(sc, n_replications=4, seed=1, n_threads=1).to_frame()
    monkeypatch.setattr(C, "compact_capacity", lambda n, nrep, ipars: n)
    whole = fastsim.replicate(sc, n_replications=4, seed=1, n_threads=1).to_frame()
    assert compact.equals(whole) and tiny.equals(whole)
    monkeypatch.setattr(C, "compact_capacity", real)
    w = F._FleetWorker(600, 6, 0)
    assert w.capacity(600, np.zeros((6, K.N_IPAR), np.int64)) == 264
    w.compact = False   # (after a row overfilled: whole rows for the rest of the worker's run)
    assert w.capacity(600, np.zeros((6, K.N_IPAR), np.int64)) == 600


@pytest.mark.parametrize("name", ["tight-sync", "queue-limit", "block-hash-sync"])
def test_the_fleet_sizes_from_one_scan_are_the_compact_and_the_handed_ones(name):
    """`workspace._fleet_sizes` (a fleet replication's sizes from one scan of
    its stream) gives `_ws_need_compact` of ``m`` seats and `_ws_need_handed`
    of the stream, for compact rows and rows for the whole stream."""
    stream, p = _stream(CASES[name], 0)
    n = stream[0].size
    out = np.empty(4, np.int64)
    for m in sorted({1, 5, n // 3 + 1, n - 1, n} - {0}):
        args = (stream[1], stream[2], stream[5], stream[6], p["ipar"])
        K._fleet_sizes(np.int64(m), np.int64(n), *args, out)
        assert tuple(out[:2]) == tuple(K._ws_need_compact(np.int64(m), np.int64(n), *args))
        assert tuple(out[2:]) == tuple(K._ws_need_handed(np.int64(n), *args))


def test_a_workers_buffers_keep_their_views_while_their_shape_holds():
    """`_fleet._FleetWorker.buffers` hands out the same views for the same
    stream size and capacity (a replication's Python kept short), new ones
    for another capacity or after the rows grew."""
    from fastsim import _fleet as F

    w = F._FleetWorker(100, 3, 0)
    sizes = np.full((3, 2), 50, np.int64)
    fb1 = w.buffers(100, sizes, 40, (60, 60))[0]
    assert w.buffers(100, sizes, 40, (60, 60))[0] is fb1
    fb2 = w.buffers(100, sizes, 50, (60, 60))[0]
    assert fb2 is not fb1 and fb2.rs_a.shape == (3, 50) and fb2.rs_i.shape == (6, 3, 50)
    fb3 = w.buffers(100, np.full((3, 2), 5000, np.int64), 50, (60, 60))[0]   # (rows grown)
    assert fb3 is not fb2 and fb3.wi.shape[1] >= 5000 and fb3.wf.shape[1] >= 5000


def test_until_rows_fit_tries_whole_rows_once_after_a_full_row():
    """`cluster.until_rows_fit`: compact rows first; whole rows once, only after `ROW_FULL`; the last result."""
    for codes, want in (((0,), [True]), ((C.ROW_FULL, 0), [True, False]), ((-2,), [True]),
                        ((C.ROW_FULL, C.ROW_FULL), [True, False])):
        asked = []

        def attempt(compact):
            asked.append(compact)
            return codes[len(asked) - 1], len(asked)

        assert C.until_rows_fit(attempt) == (codes[len(want) - 1], len(want)) and asked == want


@pytest.mark.parametrize("seed", range(3))
def test_a_disaggregated_servers_compact_rows_change_no_bit(seed):
    """Both pools of a disaggregated server on compact rows of several
    capacities (`cluster.compact_capacity`'s rows, any capacity) give the
    bits of rows for the whole stream, over random engines and routers; a
    row that would overfill (`cluster.ROW_FULL`, a capacity of 4 always)
    has the run again on whole rows."""
    from fastsim.kernel import disagg as D
    rng = np.random.default_rng(700 + seed)
    routers = tuple(K.ROUTER_CODES)
    for k in range(4):
        sc_p, sc_d = _keep_scenario(rng), _keep_scenario(rng)
        router_p, router_d = (str(x) for x in rng.choice(routers, 2))
        n_p, n_d = int(rng.integers(2, 4)), int(rng.integers(2, 6))
        link = _link_record(float(rng.choice([np.inf, 2e7])), float(rng.choice([0.0, 0.003])), 1000.0)
        stream, _p = _stream(sc_p, k)
        n = stream[0].size
        de = fastsim.Scenario(engine=sc_d.engine, workload=sc_p.workload, latency=sc_d.latency)
        pp, pd_ = pack_scenario(sc_p), pack_scenario(de)
        prefill = (pp["ipar"], pp["fpar"], pp["lat"], np.array([0.0, 0.0, 2.0]), K.ROUTER_CODES[router_p], n_p)
        decode = (pd_["ipar"], pd_["fpar"], pd_["lat"], K.ROUTER_CODES[router_d], n_d)
        per0, row0, extra0 = D.simulate_disagg_stream(*stream, prefill, decode, link, 11, 12, k, capacity=(n, n))
        # (swaps: each pool's column read only where it swaps; this test found the prefill pool's unwritten
        # column read when the decode pool swapped)
        swaps = row0[K.COLUMNS.index("n_swaps")]
        assert np.isnan(swaps) or (swaps >= 0 and swaps == int(swaps))
        for cap in ((n // n_p + 8, n // n_d + 8), (n // 2, n), (n, n // 2), (4, 4)):
            per, row, extra = D.simulate_disagg_stream(*stream, prefill, decode, link, 11, 12, k, capacity=cap)
            for key in per:
                assert np.array_equal(per[key], per0[key], equal_nan=True), (cap, key)
            assert np.array_equal(row, row0, equal_nan=True) and np.array_equal(extra, extra0, equal_nan=True)


def test_replicate_of_a_disaggregated_server_on_compact_rows(monkeypatch):
    """`replicate` of a disaggregated server with both pools on compact rows,
    on rows too small (each replication run again on whole rows), and on
    whole rows: the same results."""
    sc = _scenario(V1_OFF, NO_CACHE).replace(
        workload=fastsim.Workload(arrival_rate=30.0, num_requests=500, prompt_len=fastsim.Uniform(20, 300),
                                  output_len=fastsim.Uniform(1, 160)),
        fleet=fastsim.Disaggregated(prefill=2, decode=5))
    ipar = pack_scenario(sc)["ipar"]
    assert C.compact_capacity(500, 5, ipar) < 500 and C.compact_capacity(500, 2, ipar) == 500
    compact = fastsim.replicate(sc, n_replications=3, seed=2, n_threads=1).to_frame()
    monkeypatch.setattr(C, "compact_capacity", lambda n, nrep, ipars: min(n, 5))
    tiny = fastsim.replicate(sc, n_replications=3, seed=2, n_threads=1).to_frame()
    monkeypatch.setattr(C, "compact_capacity", lambda n, nrep, ipars: n)
    whole = fastsim.replicate(sc, n_replications=3, seed=2, n_threads=1).to_frame()
    assert compact.equals(whole) and tiny.equals(whole)


def test_compact_rows_only_where_a_replicas_set_up_reads_its_share():
    """A replica's set-up reads the stream's first measured arrival (its
    measurement window) and, with caching by block hash, whether any
    request of the stream shares a block: compact rows are laid out past
    the warm-up and never with caching by block hash or sessions
    (`cluster.compact_capacity`, by the kernel's own rule, which refuses
    any other: `cluster._compact_ok`, `ROW_FULL`, the run again on whole rows)."""
    sc = CASES["tight-sync"]
    stream, p = _stream(sc, 0)
    n = stream[0].size
    ipar = p["ipar"].copy()
    ipar[K.I_WARMUP] = 70   # (past twice an even share of 3 replicas: 2 * 40 + 64 = 144 > 120, so n)
    assert C.compact_capacity(n, 3, p["ipar"]) == n and C.compact_capacity(400, 8, ipar) == 164
    ipar[K.I_WARMUP] = 200
    assert C.compact_capacity(400, 8, ipar) == 201
    assert C.compact_capacity(400, 8, pack_scenario(CASES["block-hash-sync"])["ipar"]) == 400
    assert C.compact_capacity(400, 8, pack_scenario(CASES["block-hash-async"])["ipar"]) == 400
    ipar[K.I_WARMUP] = 70
    q = dict(p, ipar=ipar)
    args = (*stream, ipar, p["fpar"], p["lat"], _fleet_record(0.0, 0.0), K.ROUTER_CODES["jsq"], 3, 11, 12, 3)
    whole = C.simulate_fleet_stream(*args, capacity=n)
    assert np.isfinite(whole[-2][K.COLUMNS.index("window_s")])
    for m, rc in ((60, C.ROW_FULL), (70, C.ROW_FULL), (71, 0)):   # (the window's arrival: index 70)
        assert _compact_run(stream, q, "jsq", 3, m)[0] == rc
        for x, y in zip(C.simulate_fleet_stream(*args, capacity=m), whole):
            assert np.array_equal(x, y, equal_nan=True), m
    stream_h, p_h = _stream(CASES["block-hash-sync"], 0)
    assert _compact_run(stream_h, p_h, "jsq", 3, 100)[0] == C.ROW_FULL
