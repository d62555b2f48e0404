"""Event skipping in closed form (``kernel._stretch_*``) against step-by-step loops.

A stretch is a run of engine steps in which only token counts change; the
kernel advances the clock alone (a running sum, as the reference,
``_stretch_steps``) and does the bookkeeping (blocks, time integrals,
inter-token gaps) in closed form. Each closed form is
checked here against the loop it replaces, on random inputs (the loops are
the slow reference implementations); the whole engine with long outputs,
ties between step ends and arrivals or the horizon included, is checked
against the reference simulator at the end.
"""

import numpy as np
import pandas as pd
import pytest

import fastsim
from conftest import kernel_as_python, patch_kernel
from fastsim import kernel as K
from fastsim._numba_options import python_entry

# internal kernel functions have no Python entry of their own
stretch_blocks = python_entry(K.stretch._stretch_blocks)
stretch_kv = python_entry(K.stretch._stretch_kv)
stretch_steps = python_entry(K.stretch._stretch_steps)


def stretch_clock(t, kmax, next_a, has_h, horizon, d):
    """`_stretch_steps` with no blocks to allocate: (steps, clock)."""
    ph = np.zeros(4, np.int64)
    limit = min(next_a, horizon) if has_h else next_a   # (as the engine passes them)
    plan = K.stretch.Stretch(kmax, limit, np.inf, d, 0.0, 1, 0, 0, ph, 0, 4, 0, np.inf)
    kk, clock, nb, s1, s2, _last = stretch_steps(t, t, plan)
    assert (nb, s1, s2) == (0, 0.0, 0.0)
    return kk, clock


def test_internal_kernel_functions_refuse_python_calls():
    """Internal functions have no Python entry: a call from Python is a clear
    error (not a jump into a wrapper that does not exist); python_entry
    compiles a callable twin."""
    ph = np.array([1, 0, 2, 1], np.int64)
    with pytest.raises(TypeError, match=r"kernel\.stretch\._stretch_kv is compiled for jitted callers only"):
        K.stretch._stretch_kv(ph, 0, 4, 7, 0.1, 0.0)
    assert stretch_kv(ph, 0, 4, 7, 0.1, 0.0) == (8, 0.1 * 26)   # (S1 = 1 * 1 + 2 * 2 + 1 * 4 + 1 * 5 + 2 * 6)


def test_an_entry_cannot_be_inlined():
    from fastsim._numba_options import njit_noalloc

    with pytest.raises(ValueError, match="cannot be inlined"):
        njit_noalloc(lambda x: x, entry=True, inline="llvm")


@pytest.mark.parametrize("inline", [True, "numba", "always"])
def test_inline_names_its_allowed_values(inline):
    from fastsim._numba_options import njit_noalloc

    with pytest.raises(ValueError, match=f"inline must be None, 'llvm' or 'never', got {inline!r}"):
        njit_noalloc(lambda x: x, inline=inline)


def test_never_keeps_a_function_out_of_line():
    """``inline="never"``: the callee stays a function of its own in the
    caller's code (called, marked noinline), where LLVM would otherwise
    inline a small function with one call site; the results are the same."""
    from fastsim._numba_options import njit_noalloc

    def body(x):
        return x * 3 + 1

    out_of_line = njit_noalloc(inline="never")(body)
    inlined = njit_noalloc(body)

    @njit_noalloc(entry=True)
    def call_both(x):
        return out_of_line(x) + 2 * inlined(x)

    assert call_both(4) == 13 + 26
    ir = next(iter(call_both.overloads.values())).library.get_llvm_str()
    calls = [line for line in ir.splitlines() if " call " in line and "body" in line]
    assert len(calls) == 1   # (the out-of-line one; the other inlined)
    defined = [line for line in ir.splitlines() if line.startswith("define") and "body" in line]
    assert len(defined) == 1
    attrs = defined[0].split(")")[-1]
    if "#" in attrs:   # (an attribute group: its attributes)
        group = attrs.split("#")[1].split()[0]
        attrs = " ".join(line for line in ir.splitlines() if line.startswith(f"attributes #{group} "))
    assert "noinline" in attrs


def test_block_arithmetic_by_shifts_is_division():
    """Blocks for a token count and phases mod block_size: by shifts and masks
    for powers of two, by division otherwise, as Python's // and %."""
    log2_exact = python_entry(K.kv_cache._log2_exact)
    blocks_of = python_entry(K.kv_cache._blocks_of)
    phase = python_entry(K.kv_cache._phase)
    for bs in range(1, 70):
        bsh = log2_exact(bs)
        assert bsh == (int(np.log2(bs)) if bs & (bs - 1) == 0 else -1)
        for x in range(-3 * bs - 1, 5 * bs + 2):
            if x >= 0:
                assert blocks_of(x, bs, bsh) == -(-x // bs)
            assert phase(x, bs, bsh) == x % bs
    assert log2_exact(0) == -1 and log2_exact(1 << 40) == 40


def random_ph(rng, bs):
    ph = rng.integers(0, 4, bs)
    ph[rng.random(bs) < 0.4] = 0
    return ph.astype(np.int64)


@pytest.mark.parametrize("seed", range(3))
def test_stretch_blocks_is_the_step_by_step_count(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        bs = int(rng.choice([1, 2, 16, 32]))
        ph = random_ph(rng, bs)
        sph = int(rng.integers(bs))
        free = int(rng.integers(0, 200))
        got = stretch_blocks(ph, sph, bs, free, ph.sum())
        if ph.sum() == 0:
            assert got == K.stretch._UNBOUNDED
            continue
        j, idx, left = 0, sph, free          # the loop: a step runs while its new blocks fit
        while ph[idx] <= left:
            left -= ph[idx]
            j += 1
            idx = (idx - 1) % bs
        assert got == j, (ph, sph, free)


@pytest.mark.parametrize("seed", range(3))
def test_steps_left_fit_where_each_decoders_blocks_for_them_do(seed):
    """A paused replica's stretch end (`replica._stretches`) counts its
    steps left as fitting, without `_stretch_blocks`' scan, where every
    decoder's new blocks for them do: at most ``left // bs + 1`` each, as
    `kv_cache._blocks_of` of ``left + 1`` gives (the same bound the fleet's
    kept stretch end uses, `cluster._keep_end`)."""
    log2_exact = python_entry(K.kv_cache._log2_exact)
    blocks_of = python_entry(K.kv_cache._blocks_of)
    rng = np.random.default_rng(200 + seed)
    fit = short = 0
    for _ in range(400):
        bs = int(rng.choice([1, 2, 3, 16, 32, 48]))   # (3, 48: the division's branch)
        ph = random_ph(rng, bs)
        n_d = int(ph.sum())
        if n_d == 0:
            continue
        sph = int(rng.integers(bs))
        left = int(rng.choice([0, 1, bs - 1, bs, bs + 1, int(rng.integers(0, 10 * bs))]))
        free = int(rng.integers(0, 12 * n_d))
        assert blocks_of(left + 1, bs, log2_exact(bs)) == left // bs + 1
        if n_d * (left // bs + 1) <= free:
            assert stretch_blocks(ph, sph, bs, free, n_d) >= left, (ph, sph, bs, free, left)
            fit += 1
        else:
            short += 1
    assert fit > 50 and short > 30   # (both sides of the test were drawn)


@pytest.mark.parametrize("seed", range(3))
def test_stretch_kv_sums_blocks_and_weighted_times(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        bs = int(rng.choice([1, 4, 16]))
        ph = random_ph(rng, bs)
        sph = int(rng.integers(bs))
        k = int(rng.integers(0, 400))
        d0 = float(rng.uniform(1e-3, 0.05))
        dlt = float(rng.choice([0.0, rng.uniform(0, 1e-4)]))
        blocks, w = stretch_kv(ph, sph, bs, k, d0, dlt)
        b = np.array([ph[(sph - i) % bs] for i in range(k)], dtype=np.int64)
        el = np.array([K.stretch._elapsed.py_func(i, d0, dlt) for i in range(k)])
        assert blocks == b.sum()
        assert w == pytest.approx(float(b @ el), rel=1e-12, abs=1e-300)
        # ... which gives the KV integral sum_j d_j * (used0 + b_0 + ... + b_j)
        used0 = 7
        d = d0 + dlt * np.arange(k)
        direct = float(d @ (used0 + np.cumsum(b)))
        assert (used0 + blocks) * K.stretch._elapsed.py_func(k, d0, dlt) - w == pytest.approx(direct, rel=1e-11)


def clock_by_steps(t, kmax, next_a, has_h, horizon, d):
    """The step loop `_stretch_steps` replaces, on whole arrays: step i starts at
    the running sum of i durations (np.add.accumulate adds in order, as the
    loop), runs if it starts before the arrival and the horizon; the first
    step that does not run ends the stretch."""
    ends = np.add.accumulate(np.concatenate(([t], np.full(kmax, d))))
    ok = ends[:-1] < next_a
    if has_h:
        ok &= ends[:-1] < horizon
    kk = int(np.argmin(ok)) if not ok.all() else kmax
    return kk, float(ends[kk])


@pytest.mark.parametrize("seed", range(4))
def test_stretch_clock_is_the_running_sum_bit_for_bit(seed):
    """Steps taken many at once inside a binade (`_binade_steps`) give the same
    step count and the same clock, bit for bit, as adding the duration step by
    step: starts near a power of two (the binade's top), durations halfway
    between two doubles of the binade (ties), arrivals and horizons exactly on
    a step's end or one ulp either side."""
    rng = np.random.default_rng(seed)
    for _ in range(1500):
        kind = rng.integers(4)
        if kind == 0:
            t = float(rng.uniform(0.0, 1000.0))
        elif kind == 1:   # just below a binade's top
            top = 2.0 ** int(rng.integers(-3, 12))
            t = top - float(rng.integers(1, 4000)) * np.spacing(top / 2)
        elif kind == 2:
            t = 0.0
        else:
            t = float(rng.uniform(1.0, 2.0)) * 2.0 ** int(rng.integers(-10, 20))
        d = float(rng.choice([rng.uniform(1e-4, 0.05), 2.0 ** -7, 0.01, 0.025]))
        if t > 0 and rng.random() < 0.3:   # d halfway between two multiples of the spacing at t
            u = np.spacing(t)
            d = (np.floor(d / u) + 0.5) * u
        kmax = int(rng.integers(0, 700))
        path = clock_by_steps(t, kmax, np.inf, False, 0.0, d)
        ends = np.add.accumulate(np.concatenate(([t], np.full(kmax, d))))
        next_a, horizon, has_h = np.inf, 0.0, False
        if rng.random() < 0.6 and kmax > 0:
            next_a = float(ends[int(rng.integers(1, kmax + 1))])
            next_a = float(rng.choice([next_a, np.nextafter(next_a, np.inf), np.nextafter(next_a, -np.inf)]))
        if rng.random() < 0.5:
            has_h = True
            horizon = float(ends[int(rng.integers(0, kmax + 1))]) if kmax > 0 else t + d
            horizon = float(rng.choice([horizon, np.nextafter(horizon, np.inf), np.nextafter(horizon, -np.inf)]))
            if horizon <= t:
                horizon = np.nextafter(t, np.inf)
        want = clock_by_steps(t, kmax, next_a, has_h, horizon, d)
        got = stretch_clock(t, kmax, next_a, has_h, horizon, d)
        assert got == want, (t, d, kmax, next_a, has_h, horizon, path)


@pytest.mark.parametrize("seed", range(3))
def test_stretch_steps_count_the_blocks_of_the_steps_they_take(seed):
    """The blocks a stretch allocates, and S1 and S2, against a step loop: a
    step runs while its new blocks fit in the free ones (and it starts before
    the arrival); with a constant duration, steps beyond the first 32 go
    binade by binade (their blocks in closed form); with a context term,
    step by step."""
    rng = np.random.default_rng(seed)
    for _ in range(400):
        bs = int(rng.choice([1, 4, 16]))
        ph = random_ph(rng, bs)
        sph = int(rng.integers(bs))
        n_d = int(ph.sum())
        kmax = int(rng.integers(1, 600))
        free = int(rng.choice([rng.integers(0, 60), 10 ** 6]))
        t = float(rng.uniform(0.0, 1000.0))
        d = float(rng.uniform(1e-3, 0.05))
        c_ctx = float(rng.choice([0.0, 1e-7]))
        next_a = t + d * float(rng.uniform(0, 1.2 * kmax)) if rng.random() < 0.5 else np.inf
        ksum, S = int(rng.integers(0, 5000)), int(rng.integers(0, 100))
        quad = c_ctx != 0.0 and n_d > 0
        plan = K.stretch.Stretch(kmax, next_a, np.inf, d, c_ctx, n_d, ksum, S, ph, sph, bs, free, np.inf)
        kk, clock, nb, s1, s2, _last = stretch_steps(t, t, plan)
        # the loop
        j, x, left = 0, t, free
        while j < kmax and x < next_a and ph[(sph - j) % bs] <= left:
            left -= ph[(sph - j) % bs]
            x = x + (d + c_ctx * (ksum + n_d * (S + j + 1))) if c_ctx != 0.0 else x + d
            j += 1
        b = np.array([ph[(sph - i) % bs] for i in range(j)], dtype=np.int64)
        i = np.arange(j)
        assert (kk, clock, nb) == (j, x, b.sum()), (bs, ph, sph, kmax, free, next_a, c_ctx)
        assert s1 == float(b @ i)
        assert s2 == (float(b @ (i * i)) if quad else 0.0)


def test_stretch_clock_at_the_ends_of_the_double_range():
    """Subnormal clocks (the binade's spacing would underflow) and the top
    binade (its top overflows) step one by one, as the loop."""
    with np.errstate(over="ignore"):
        for t in (5e-324, 1e-310, 2.0 ** -1022, 1.5 * 2.0 ** 1023, 1.7e308):
            for d in (1e-3, 3 * 5e-324, 2.0 ** -1060, 1e300, 1e308):
                want = clock_by_steps(t, 100, np.inf, False, 0.0, d)
                assert stretch_clock(t, 100, np.inf, False, 0.0, d) == want, (t, d)


# --- the whole engine: long stretches, against the reference simulator ---------

LONG = {
    "a10g": fastsim.LatencyModel.default(),                            # constant step within a stretch
    "context-term": fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3,
                                         prefill_per_token_s=3e-5, ctx_per_token_s=2e-7),
}
LONG_ENGINES = {
    "roomy": dict(max_num_seqs=8, num_gpu_blocks=4000),
    "tight-kv": dict(max_num_seqs=8, num_gpu_blocks=150),               # blocks end stretches, preemption
    "kv-reservation": dict(max_num_seqs=8, num_gpu_blocks=600, admission="kv_reservation"),
}


def long_scenario(engine, latency, horizon_s=None):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(block_size=16, **engine),
        workload=fastsim.Workload(arrival_rate=0.8, num_requests=40, horizon_s=horizon_s, warmup_requests=3,
                                  prompt_len=fastsim.LogNormal(100, 0.5), output_len=fastsim.LogNormal(300, 0.6)),
        latency=latency, ttft_slo_s=0.5, tpot_slo_s=0.05)


@pytest.mark.parametrize("latency", list(LONG))
@pytest.mark.parametrize("engine", list(LONG_ENGINES))
@pytest.mark.parametrize("horizon_s", [None, 30.0])
def test_long_outputs_agree_with_the_reference(engine, latency, horizon_s):
    """Every request's times bit for bit; the run-level figures that the
    closed form sums in another order (time integrals, gaps) to rounding."""
    sc = long_scenario(LONG_ENGINES[engine], LONG[latency], horizon_s)
    stream = fastsim.sample_requests(sc, seed=5)
    fast = fastsim.simulate_requests(sc, stream)
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert (fast["status"] == "completed").sum() >= 3
    a = fastsim.replicate(sc, n_replications=2, seed=3).per_replication
    b = fastsim.replicate(sc, n_replications=2, seed=3, backend="reference").per_replication
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("step", [0.01, 0.025, 0.0078125])
def test_ties_with_arrivals_and_the_horizon_go_as_in_the_reference(step):
    """Arrivals every second and a horizon on a whole second, with a constant
    step: many fall exactly on a step end (for 0.0078125 = 2^-7 exactly, for
    0.01 up to the rounding of the running sum). The clock is the same running
    sum as the reference's, so each tie is decided the same way."""
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=2000),
        workload=fastsim.Workload(arrival_times=np.arange(0.0, 60.0, 1.0), num_requests=60, horizon_s=60.0,
                                  prompt_len=fastsim.LogNormal(100, 0.5), output_len=fastsim.LogNormal(300, 0.6)),
        latency=fastsim.LatencyModel.constant(step))
    for seed in range(3):
        stream = fastsim.sample_requests(sc, seed=seed)
        fast = fastsim.simulate_requests(sc, stream)
        pd.testing.assert_frame_equal(fast, fastsim.simulate_requests(sc, stream, backend="reference"),
                                      check_exact=True)
        assert (fast["status"] == "unfinished").any()
    # one long request and a horizon on a step boundary: the tokens emitted by then
    one = pd.DataFrame({"arrival_s": [0.0], "prompt_len": [10], "output_len": [5000]})
    for horizon in (2.08, 5.0, 10.0, 20.0):
        sc1 = sc.replace(**{"workload.horizon_s": horizon})
        assert (fastsim.simulate_requests(sc1, one)["num_tokens"].tolist()
                == fastsim.simulate_requests(sc1, one, backend="reference")["num_tokens"].tolist())


@pytest.mark.parametrize("latency", list(LONG))
def test_long_stretches_take_the_closed_form(latency):
    """The scenarios above do exercise event skipping: long stretches, with
    blocks allocated inside them, and with a constant step, steps taken many
    at once inside a binade, their blocks in closed form (`_stretch_kv`) (the
    engine run as plain Python, counting calls)."""
    from fastsim._replicate import pack_scenario

    stretches, closed = [], []
    steps, closed_form = K.stretch._stretch_steps.py_func, K.stretch._stretch_kv.py_func

    def counting_steps(*args):
        out = steps(*args)
        stretches.append((out[0], out[2]))
        return out

    def counting_kv(ph, sph, bs, k, d0, dlt):
        blocks, w = closed_form(ph, sph, bs, k, d0, dlt)
        closed.append((k, blocks))
        return blocks, w

    sc = long_scenario(LONG_ENGINES["tight-kv"], LONG[latency])
    p = pack_scenario(sc)
    a, pr, o, c, q, grp, plen = K.draw_workload(0, 1, 2, *K.scenario_arrays(p, lat=False))
    ni, nf = K._ws_need(a.size, pr, o, grp, plen, p["ipar"])
    wi, wf = np.zeros(ni, np.int64), np.zeros(nf)
    with kernel_as_python() as mp:
        patch_kernel(mp, "_stretch_steps", counting_steps)
        patch_kernel(mp, "_stretch_kv", counting_kv)
        K._simulate(a.size, a, pr, o, c, q, grp, plen, p["ipar"], p["fpar"], p["lat"], wi, wf,
                    K.engine_variant(p["ipar"]), np.inf, K.WHOLE_RUN)
    k = np.array([c[0] for c in stretches])
    assert len(stretches) > 10 and k.max() > 4 * 16                  # long stretches ...
    assert any(blocks > 0 for kk, blocks in stretches)                 # ... that allocate blocks
    if LONG[latency].ctx_per_token_s == 0.0:
        assert any(kk > 16 and blocks > 0 for kk, blocks in closed)   # ... also binade by binade
    else:
        assert not closed                                             # (only with a constant step)


def _steps_one_by_one(t, t_prev, plan):
    """`stretch._stretch_steps`'s steps as a per-step loop states them: each
    step starts before ``limit``, its previous step before ``lag_limit``,
    its blocks fit (plain Python, no bound folded, no binade)."""
    kmax, limit, lag_limit, d, c_ctx, n_d, ksum, S, ph, sph, bs, free, _stop = plan
    kk = nb = 0
    s1 = s2 = 0.0
    idx = sph
    while kk < kmax and t < limit and t_prev < lag_limit:
        c = int(ph[idx])
        if nb + c > free:
            break
        nb += c
        s1 += float(c * kk)
        if c_ctx * n_d != 0.0:
            s2 += float(c * kk) * kk
        t_prev = t
        t = t + (d + c_ctx * (ksum + n_d * (S + kk + 1))) if c_ctx != 0.0 else t + d
        kk += 1
        idx = idx - 1 if idx > 0 else bs - 1
    return kk, t, nb, s1, s2, t_prev


def _random_decoders(rng):
    """A stretch's decoders drawn for the tests below: block size, new blocks
    by phase, decoders, step duration, context term, clock."""
    bs = int(rng.choice([1, 4, 16]))
    ph = rng.integers(0, 3, bs).astype(np.int64)
    d = float(rng.choice([0.01, 0.0123, 1 / 3]))
    c_ctx = 0.0 if rng.random() < 0.6 else float(rng.choice([1e-6, 2.5e-7]))
    return bs, ph, int(ph.sum()), d, c_ctx, float(rng.uniform(0.0, 50.0))


@pytest.mark.parametrize("seed", range(4))
def test_the_stretch_takes_the_steps_a_per_step_loop_takes(seed):
    """The stretch's bounds (the clock against min(limit, lag_limit), then
    async's one step more; binades after 32 steps) take the steps that the
    per-step tests take, to the bit: lag limits before, inside and after
    long stretches (a binade's chunk crossing it, the crossing at the 32nd
    step), a previous step at or after the lag limit, NaN lag limits, the
    free blocks running out, with and without a context term."""
    rng = np.random.default_rng(seed)
    long_runs = crossings = 0
    for _ in range(400):
        bs, ph, n_d, d, c_ctx, t = _random_decoders(rng)
        kmax = int(rng.choice([0, 1, 2, 31, 32, 33, 200, 5000]))
        limit = t + d * float(rng.uniform(0, 300)) if rng.random() < 0.8 else np.inf
        u = rng.random()
        lag = (np.inf if u < 0.3 else np.nan if u < 0.35 else t - d if u < 0.45
               else t + d * float(rng.choice([32, 31.5, 33, rng.uniform(0, 300)])))
        t_prev = t if lag == np.inf else t - d * float(rng.uniform(0.0, 2.0))
        free = int(rng.choice([0, 1, 5, 100, 10**6]))
        plan = K.stretch.Stretch(kmax, limit, lag, d, c_ctx, n_d, int(rng.integers(0, 1000)),
                                 int(rng.integers(0, 1000)), ph, int(rng.integers(0, bs)), bs, free, np.inf)
        got = stretch_steps(t, t_prev, plan)
        want = _steps_one_by_one(t, t_prev, plan)
        assert got[0] == want[0] and got[2] == want[2], (plan, got, want)
        assert [float(x).hex() for x in (got[1], got[3], got[4], got[5])] == \
            [float(x).hex() for x in (want[1], want[3], want[4], want[5])], (plan, got, want)
        long_runs += want[0] > 40 and c_ctx == 0.0   # (binades)
        crossings += want[0] > 0 and want[5] >= lag   # (async's step after the lag limit)
    assert long_runs > 5 and crossings > 5   # (the cases this test is for were drawn)


@pytest.mark.parametrize("seed", range(4))
def test_a_stretch_summed_until_it_passes_stop_is_bounded_below(seed):
    """A stretch summed while its clock is not past ``t_stop`` (``stop`` just
    above it, as `replica._stretches` sets it for a paused replica): one
    that ends by ``t_stop`` is the one summed to the end, to the bit; one
    that ends after it is reported so (its clock past ``t_stop``), and its
    end's lower bound (`stretch._end_bound`, where the clock reached
    ``stop``) is not above the end the per-step loop reaches, and without a
    context term within a few units in the last place of it (or ``limit``,
    where that cuts the stretch): the key a fleet's event queue waits on.
    Synchronous scheduling (no lag limit), as `replica._stretches` asks."""
    end_bound = python_entry(K.stretch._end_bound)
    rng = np.random.default_rng(100 + seed)
    cut = close = 0
    for _ in range(400):
        bs, ph, n_d, d, c_ctx, t = _random_decoders(rng)
        kmax = int(rng.choice([1, 2, 31, 32, 33, 200, 5000]))
        limit = t + d * float(rng.uniform(0, 300)) if rng.random() < 0.6 else np.inf
        free = int(rng.choice([0, 1, 5, 100, 10**6]))
        sph = int(rng.integers(0, bs))
        t_stop = t + d * float(rng.choice([0.0, 0.5, 1.0, 31.5, 32.0, 40.0, rng.uniform(0, 400)]))
        stop = t_stop + (abs(t_stop) * 2.3e-16 + 1e-300)
        fields = (kmax, limit, np.inf, d, c_ctx, n_d, int(rng.integers(0, 1000)), int(rng.integers(0, 1000)), ph,
                  sph, bs, free)
        want = _steps_one_by_one(t, t, K.stretch.Stretch(*fields, np.inf))
        got = stretch_steps(t, t, K.stretch.Stretch(*fields, stop))
        if want[1] <= t_stop:   # taken: the same bits
            assert got[0] == want[0] and got[2] == want[2], (fields, t_stop, got, want)
            assert [float(x).hex() for x in got[1:]] == [float(x).hex() for x in want[1:]], (fields, t_stop, got, want)
            continue
        end = got[1]
        assert end > t_stop, (fields, t_stop, got, want)   # (not taken)
        if not end < stop:
            end = end_bound(end, kmax - got[0], limit, d, stretch_blocks(ph, (sph - got[0]) % bs, bs, free - got[2],
                                                                         n_d))
            cut += 1
        assert t_stop < end <= want[1], (fields, t_stop, got, want, end)   # (a lower bound)
        if c_ctx == 0.0:   # steps of d each: the bound is the end, up to its shrink, or limit
            assert end >= min(limit, want[1]) * (1 - 1e-11), (fields, t_stop, got, want, end)
            close += got[0] < want[0]
    assert cut > 50 and close > 20   # (the cases this test is for were drawn)
