"""The per-step jitter's normal draw, the counter-based ziggurat
(``kernel/rng.py``: `_normal_at`; ``kernel/latency.py``: `_noisy_duration`):
the kernel's and the reference's (``fastsim/_reference_noise.py``) tables and
draws agree bit for bit, fast path, wedge and tail alike; the draws are
standard normal (Kolmogorov-Smirnov, moments and the tail beyond R against
their sampling distributions at alpha = 1e-3 each, so any seed passes but
one in a thousand); and step k's draw depends on the key and k alone, not on
how the engine reached step k."""

import dataclasses
import math

import numpy as np
import pytest
from numba import njit
from scipy import stats

import fastsim
from fastsim import _reference_noise as RN
from fastsim import kernel as K
from fastsim._replicate import pack_scenario
from fastsim.kernel import rng
from fastsim.kernel.latency import _step_noise

Z999 = stats.norm.ppf(1 - 0.0005)   # two-sided alpha = 1e-3
M64 = (1 << 64) - 1
BASE = fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3, prefill_per_token_s=3e-5,
                            ttft_overhead_s=0.01)
V1_OFF = dict(async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False,
              enable_prefix_caching=False, block_hash_caching=False)
V1_ON = dict(async_scheduling=True, scheduler_reserve_full_isl=True, null_block=True,
             enable_prefix_caching=True, block_hash_caching=True)


@njit
def _kernel_normals(key, k0, n, out):
    """z of steps k0 .. k0 + n - 1 of a key, as `latency._noisy_duration` draws them."""
    for j in range(n):
        c = key + np.uint64(k0 + j) * np.uint64(4) * rng._GOLDEN
        out[j] = rng._normal_at(c + rng._GOLDEN, c + np.uint64(2) * rng._GOLDEN)


@njit
def _kernel_durations(rlat, d, out):
    """`latency._step_noise` of steps 0 .. n - 1 (durations ``d``)."""
    for k in range(out.size):
        out[k] = _step_noise(rlat, d[k], k)


def kernel_normals(key, n, k0=0):
    out = np.empty(n)
    _kernel_normals(np.uint64(key), k0, n, out)
    return out


def reference_normal(key, k):
    c = (key + ((k * 4) & M64) * RN._GOLDEN) & M64
    return RN._normal_at((c + RN._GOLDEN) & M64, (c + 2 * RN._GOLDEN) & M64)


def first_output_path(key, k):
    """Which path step k's draw takes: 'fast', 'wedge' or 'tail' (its first output's)."""
    c = (key + ((k * 4) & M64) * RN._GOLDEN) & M64
    z = RN._mix64((c + RN._GOLDEN) & M64)
    i, m = z & 255, z >> 11
    if m < RN._ZIG_K[i]:
        return "fast"
    return "tail" if i == 0 else "wedge"


def test_the_tables_are_the_references():
    """The reference computes the ziggurat's tables again by the same formula;
    they are the kernel's to the bit (f(x_i) by Python's exp in both)."""
    assert [int(k) for k in rng._ZIG_K] == RN._ZIG_K
    assert [float(w) for w in rng._ZIG_W] == RN._ZIG_W
    assert [float(f) for f in rng._ZIG_FX] == RN._ZIG_F
    # the tables describe the ziggurat: 256 layers, x_1 = R, f decreasing from f(0) = 1
    assert len(RN._ZIG_K) == 256 and RN._ZIG_W[1] * 2.0 ** 53 == RN._ZIG_R
    assert RN._ZIG_F[-1] == 1.0 and all(a < b for a, b in zip(RN._ZIG_F, RN._ZIG_F[1:]))


@pytest.mark.parametrize("key", [0, 0x9E3779B97F4A7C15, M64 - 12345])
def test_kernel_draws_are_the_references_bit_for_bit(key):
    """200,000 steps of a key, every path taken: the inner rectangles, the
    wedges (accepted or retried) and the tail beyond R."""
    n = 200_000
    z = kernel_normals(key, n)
    ref = np.array([reference_normal(key, k) for k in range(n)])
    assert np.array_equal(z, ref) and np.array_equal(np.signbit(z), np.signbit(ref))
    paths = [first_output_path(key, k) for k in range(n)]
    # the expected counts: wedges about 1 % of draws, the tail about 2.6e-4 (about 50 here)
    assert paths.count("wedge") > 500 and paths.count("tail") > 10
    assert (np.abs(z) > RN._ZIG_R).sum() > 10


@pytest.mark.parametrize("noise", [fastsim.StepNoise(jitter_sd=0.1),
                                   fastsim.StepNoise(jitter_sd=0.02, stall_prob=0.05, stall_mean_s=0.3)])
def test_step_durations_are_the_references_bit_for_bit(noise):
    """The kernel's `_step_noise` (the engine's step one by one) and the
    reference's `StepNoiseDraws.apply`, jitter and stalls, for the records a
    replication runs on."""
    lat = dataclasses.replace(BASE, noise=noise)
    fpar = np.zeros(K.N_FPAR)
    for rep in (0, 5):
        rlat, _ = K.run_records(lat._params(), fpar, 21, 22, rep)
        _, steps = RN.run_latency(lat, 21, 22, rep)
        d = 0.004 + 1e-6 * (np.arange(20000) % 97)
        out = np.empty(d.size)
        _kernel_durations(rlat, d, out)
        ref = np.array([steps.apply(float(d[k]), k) for k in range(d.size)])
        assert np.array_equal(out, ref)
        if noise.stall_prob > 0:   # the stalls drawn: about 1,000 of them
            assert (out > 2 * d * 1.1).sum() > 500


def test_the_draws_are_standard_normal():
    """A million steps' z: Kolmogorov-Smirnov against N(0, 1); the mean and
    the variance within their sampling distributions (normal, and chi-square
    with n - 1 degrees of freedom); the signs binomial(n, 1/2); the count
    beyond R binomial(n, P(|Z| > R)), and those draws distributed as |Z|
    given |Z| > R."""
    n = 1_000_000
    z = kernel_normals(0x5DEECE66D, n)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < Z999 / math.sqrt(n)
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], n - 1) / (n - 1)
    assert lo < z.var(ddof=1) < hi
    assert abs((z < 0).mean() - 0.5) < Z999 * 0.5 / math.sqrt(n)
    p_tail = math.erfc(RN._ZIG_R / math.sqrt(2.0))
    tail = np.abs(z[np.abs(z) > RN._ZIG_R])
    assert abs(tail.size - n * p_tail) < Z999 * math.sqrt(n * p_tail * (1 - p_tail))
    cdf = stats.truncnorm(RN._ZIG_R, np.inf).cdf
    assert stats.kstest(tail, cdf).pvalue > 1e-3


def test_neighbouring_steps_and_replications_are_uncorrelated():
    """The counters of steps k and k + 1, and of one step k in two runs (two
    keys), give uncorrelated draws: correlations within Z / sqrt(n)."""
    n = 200_000
    a = kernel_normals(1234567, n + 1)
    b = kernel_normals(7654321, n)
    for x, y in ((a[:-1], a[1:]), (a[:-1], b)):
        assert abs(np.corrcoef(x, y)[0, 1]) < Z999 / math.sqrt(n)
    assert abs(np.corrcoef(a[:-1] ** 2, a[1:] ** 2)[0, 1]) < Z999 / math.sqrt(n)


def test_a_steps_draw_is_its_counters_alone():
    """Step k's draw does not depend on the draws before it: the kernel's
    from any k0, and the reference's visited in any order, are the same."""
    key = 0xDEADBEEF
    whole = kernel_normals(key, 5000)
    assert np.array_equal(kernel_normals(key, 1000, k0=3000), whole[3000:4000])
    order = np.random.default_rng(1).permutation(5000)
    assert np.array_equal(np.array([reference_normal(key, int(k)) for k in order]), whole[order])


@pytest.mark.parametrize("v1", [False, True])
def test_how_the_engine_reaches_a_step_does_not_change_it(v1):
    """The engine driven to the end in one call or paused at many times
    (a stretch paused is started again, its noisy steps drawn again from their
    counters) gives the same bits (`kernel.drivers.Replica`)."""
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=12, max_num_batched_tokens=192, block_size=16,
                                    num_gpu_blocks=400, **(V1_ON if v1 else V1_OFF)),
        workload=fastsim.Workload(arrival_rate=3.0, num_requests=60, prompt_len=fastsim.LogNormal(60, 0.8),
                                  output_len=fastsim.LogNormal(120, 0.9)),
        latency=dataclasses.replace(BASE, ctx_per_token_s=1e-7,
                                    noise=fastsim.StepNoise(jitter_sd=0.05, stall_prob=0.02, stall_mean_s=0.02)))
    p = pack_scenario(sc)
    for rep in range(2):
        stream = K.draw_workload(rep, 11, 12, *K.scenario_arrays(p, lat=False))
        rlat, rfpar = K.run_records(p["lat"], p["fpar"], 11, 12, rep)
        whole = K.simulate_stream(*stream, p["ipar"], rfpar, rlat)
        end = float(np.nanmax(np.where(np.isfinite(whole[2]), whole[2], np.nan)))
        times = np.sort(np.random.default_rng(rep).uniform(0.0, 1.1 * end, 400))
        one = K.drivers.Replica(*stream, p["ipar"], rfpar, rlat)
        for t in times:
            one.advance_until(t)
        one.advance_until(np.inf)
        for x, y in zip(one.finish(), whole):
            assert np.array_equal(x, y, equal_nan=True)
