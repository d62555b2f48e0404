"""The kernel's random streams sample the laws they claim to (exact moments,
goodness of fit)."""

import numba
import numpy as np
import pytest
from scipy import stats

import fastsim
from conftest import within
from fastsim import kernel as K

N = 200_000


def stream(**workload):
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=N, **workload))
    return fastsim.sample_requests(sc, seed=None, replication=0)


@pytest.mark.parametrize("law", [
    fastsim.LogNormal(median=256, sigma=0.55),
    fastsim.Uniform(3, 40),
    fastsim.Empirical([5, 10, 400], weights=[0.5, 0.3, 0.2]),
    fastsim.Mixture([fastsim.Fixed(20), fastsim.LogNormal(2000, 0.3)], [0.8, 0.2]),
], ids=["lognormal", "uniform", "empirical", "mixture"])
def test_length_laws_have_their_exact_mean(law):
    x = stream(prompt_len=law)["prompt_len"].to_numpy()
    assert x.min() >= 1
    var = law.second_moment() - law.mean() ** 2
    within(x.mean(), law.mean(), np.sqrt(var / x.size))


def test_discrete_laws_pass_chi_square():
    law = fastsim.Empirical([5, 10, 400], weights=[0.5, 0.3, 0.2])
    x = stream(output_len=law)["output_len"].to_numpy()
    counts = np.array([(x == v).sum() for v in (5, 10, 400)])
    assert counts.sum() == x.size
    assert stats.chisquare(counts, law.weights * x.size).pvalue > 1e-6
    u = stream(output_len=fastsim.Uniform(1, 10))["output_len"].to_numpy()
    assert stats.chisquare(np.bincount(u, minlength=11)[1:]).pvalue > 1e-6


@numba.njit
def _normals(n, key, tail):
    """n variates of the kernel's standard normal sampler (``tail``: of its
    tail beyond R alone), from one stream."""
    state = np.zeros(1, dtype=np.uint64)
    K.rng._seed_streams(key, np.uint64(0), 0, state)
    out = np.empty(n)
    for j in range(n):
        out[j] = K.rng._normal_tail(state, 0) if tail else K.rng._normal(state, 0)
    return out


def _key():
    return np.uint64(np.random.SeedSequence().entropy % 2 ** 64)


def test_ziggurat_layers_have_equal_areas_and_exact_thresholds():
    """Every layer of `kernel.rng._normal` holds the same area of the unnormalised
    density f(x) = exp(-x^2 / 2), layer 0's being the rectangle [0, R] x
    [0, f(R)] plus the tail (scipy's normal sf); the immediate-acceptance
    thresholds are the layers' width ratios in units of 2^-53."""
    x = K.rng._ZIG_W * 2.0 ** 53
    f = K.rng._ZIG_F
    assert x.size == 256 and f.size == 257 and f[-1] == 1.0 and f[1] == np.exp(-0.5 * K.rng._ZIG_R ** 2)
    area0 = K.rng._ZIG_R * f[1] + np.sqrt(2 * np.pi) * stats.norm.sf(K.rng._ZIG_R)
    np.testing.assert_allclose(x[0] * f[1], area0, rtol=1e-13)
    np.testing.assert_allclose(x[1:] * (f[2:] - f[1:-1]), area0, rtol=1e-12)   # layers 1 .. 255
    np.testing.assert_array_equal(K.rng._ZIG_K, np.floor(np.append(x[1:], 0.0) / x * 2.0 ** 53).astype(np.uint64))


def test_normal_sampler_fits_the_normal_law_layer_by_layer():
    """The ziggurat sampler (`kernel.rng._normal`), checked where it could go
    wrong: bins that split each of its 256 layers in four (a wrong table
    entry or wedge test shows as a misfit within a layer), the mass beyond
    +-R and symmetry; the tail's own algorithm, `_normal_tail`, on a
    million draws of it."""
    x = _normals(8_000_000, _key(), False)
    edges = np.append(0.0, K.rng._ZIG_W[:0:-1] * 2.0 ** 53)          # 0 = x_256 < x_255 < ... < x_1 = R
    half = np.append(np.concatenate([np.linspace(a, b, 4, endpoint=False) for a, b in zip(edges, edges[1:])]),
                     edges[-1])
    cuts = np.concatenate([-half[:0:-1], half])                 # 0, +-R and three cuts inside each layer
    cdf = np.concatenate([[0.0], stats.norm.cdf(cuts), [1.0]])
    counts = np.bincount(np.searchsorted(cuts, x, side="right"), minlength=cuts.size + 1)
    assert stats.chisquare(counts, np.diff(cdf) * x.size).pvalue > 1e-6
    r = K.rng._ZIG_R
    assert stats.binomtest(int((x < -r).sum()), int((np.abs(x) > r).sum())).pvalue > 1e-6
    tail = _normals(1_000_000, _key(), True)
    assert tail.min() > r
    assert stats.kstest(tail, lambda t: 1.0 - stats.norm.sf(t) / stats.norm.sf(r)).pvalue > 1e-6


def test_lognormal_is_the_ceiling_of_a_lognormal():
    x = stream(prompt_len=fastsim.LogNormal(median=50, sigma=0.8))["prompt_len"].to_numpy()
    k = np.arange(1, 400)
    cdf = stats.lognorm(s=0.8, scale=50).cdf(k)  # P(ceil(X) <= k) = P(X <= k)
    emp = np.searchsorted(np.sort(x), k, side="right") / x.size
    assert np.max(np.abs(emp - cdf)) < stats.kstwobign.isf(1e-6) / np.sqrt(x.size)  # KS critical value at 1e-6


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_arrival_gaps_have_the_requested_rate_and_cv(burstiness):
    t = stream(arrival_rate=4.0, burstiness=burstiness)["arrival_s"].to_numpy()
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    dist = stats.gamma(a=burstiness, scale=1 / (4.0 * burstiness))
    assert stats.kstest(gaps, dist.cdf).pvalue > 1e-6


def test_priority_classes_and_trace_replay():
    s = stream(priorities=(0, 1, 2), priority_probs=(0.1, 0.3, 0.6))
    counts = s["priority"].value_counts().sort_index().to_numpy()
    assert stats.chisquare(counts, np.array([0.1, 0.3, 0.6]) * N).pvalue > 1e-6
    trace = fastsim.sharegpt_lengths(order="replay")
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=7000, lengths=trace))
    r = fastsim.sample_requests(sc, seed=0)
    n = len(trace)
    np.testing.assert_array_equal(r["prompt_len"][:n], trace.prompt_len)
    np.testing.assert_array_equal(r["output_len"][n:], trace.output_len[:7000 - n])  # wraps around


def test_given_arrival_times_are_used_as_is():
    times = np.array([0.0, 0.5, 0.5, 2.0])
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=None, arrival_times=times))
    np.testing.assert_array_equal(fastsim.sample_requests(sc, seed=1)["arrival_s"], times)


def test_from_trace_replays_first_rows(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("prompt_len,gen_len\n5,7\n8,9\n3,4\n")
    w = fastsim.Workload.from_trace(path, num_requests=2, arrival_rate=4.0)
    r = fastsim.sample_requests(fastsim.Scenario(workload=w), seed=0)
    assert r["prompt_len"].tolist() == [5, 8] and r["output_len"].tolist() == [7, 9]


def test_normalized_arrivals_end_exactly_at_n_over_rate():
    """As `vllm bench serve`: the n-th request is sent at exactly n / rate."""
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=4.0, num_requests=300, normalize_arrivals=True))
    for rep in range(5):
        t = fastsim.sample_requests(sc, seed=rep, replication=rep)["arrival_s"].to_numpy()
        assert t[-1] == pytest.approx(300 / 4.0, rel=1e-12)
        assert t[0] > 0 and np.all(np.diff(t) >= 0)
    # The scaled gaps keep the rate: over many runs the first arrival averages 1/rate.
    big = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=4.0, num_requests=2, normalize_arrivals=True))
    first = np.array([fastsim.sample_requests(big, seed=1, replication=r)["arrival_s"][0] for r in range(4000)])
    # With 2 requests a_0 = 2/rate * U, U = G1 / (G1 + G2) ~ Uniform(0, 1).
    within(first.mean(), 0.25, first.std() / np.sqrt(first.size))
    with pytest.raises(ValueError, match="normalize_arrivals must be False when arrival_times is given"):
        fastsim.Workload(arrival_rate=None, arrival_times=[0.0, 1.0], normalize_arrivals=True)


def test_empirical_replay_in_order():
    values = [7, 3, 9]
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=7,
                                                    prompt_len=fastsim.Empirical(values, order="replay"),
                                                    output_len=fastsim.Uniform(1, 5)))
    for rep in range(3):
        assert fastsim.sample_requests(sc, seed=rep, replication=rep)["prompt_len"].tolist() == [7, 3, 9, 7, 3, 9, 7]
    with pytest.raises(ValueError, match="weights must be None when order='replay'"):
        fastsim.Empirical(values, weights=[0.2, 0.3, 0.5], order="replay")
    with pytest.raises(ValueError, match=r"components\[0\] must not replay in order inside a Mixture"):
        fastsim.Mixture([fastsim.Empirical(values, order="replay"), fastsim.Fixed(3)], [0.5, 0.5])


# --- multi-user arrivals (Workload.multi_user) --------------------------------

def multi_user_counts(users, m, rate, reps=4000, **kw):
    sc = fastsim.Scenario(workload=fastsim.Workload.multi_user(users, requests_per_user=m, user_rate=rate,
                                                               prompt_len=8, output_len=2, **kw),
                          engine=fastsim.EngineConfig(max_num_seqs=64))
    res = fastsim.replicate(sc, n_replications=reps, seed=None, progress=False)
    return res.per_replication["n_arrived"].to_numpy().astype(float)


def test_multi_user_request_count_is_compound_poisson():
    # U ~ uniform{12..16} users, each Poisson(10) requests:
    # E[N] = E[U] m, Var[N] = E[U] m + m^2 Var[U].
    n = multi_user_counts((12, 16), 10.0, 0.5)
    users = np.arange(12, 17)
    mean, var = users.mean() * 10.0, users.mean() * 10.0 + 100.0 * users.var()
    within(n.mean(), mean, np.sqrt(var / n.size))
    # the sample variance of n iid draws has standard error about var * sqrt(2 / n) (near-normal counts)
    within(n.var(ddof=1), var, var * np.sqrt(2.5 / n.size))


def test_single_user_stream_is_a_poisson_process_of_given_rate():
    # One user, Poisson(m) requests at exponential gaps: given N = k the last
    # arrival is Gamma(k, rate); E[T_N] = m / rate.
    sc = fastsim.Scenario(workload=fastsim.Workload.multi_user(1, requests_per_user=30.0, user_rate=2.0,
                                                               prompt_len=8, output_len=2))
    last, gaps = [], []
    for r in range(400):
        a = fastsim.sample_requests(sc, seed=3, replication=r)["arrival_s"].to_numpy()
        assert np.all(np.diff(a) >= 0)
        if a.size:
            last.append(a[-1])
            gaps.append(np.diff(np.concatenate([[0.0], a])))
    gaps = np.concatenate(gaps)
    within(gaps.mean(), 0.5, 0.5 / np.sqrt(gaps.size))          # Exp(2) gaps: mean = sd = 0.5
    assert stats.kstest(gaps, "expon", args=(0, 0.5)).pvalue > 1e-6


def test_multi_user_horizon_truncates_arrivals():
    sc = fastsim.Scenario(workload=fastsim.Workload.multi_user(8, requests_per_user=20, user_rate=1.0,
                                                               prompt_len=8, output_len=2, horizon_s=5.0))
    a = fastsim.sample_requests(sc, seed=0, replication=0)["arrival_s"].to_numpy()
    assert a.size > 0 and a.max() < 5.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(users=0, requests_per_user=1, user_rate=1), "users must be an integer in [1, 16777216], got 0"),
    (dict(users=(5, 3), requests_per_user=1, user_rate=1), "users[1] must be an integer in [5, 16777216], got 3"),
    (dict(users=4, requests_per_user=0, user_rate=1), "requests_per_user must be"),
    (dict(users=4, requests_per_user=2, user_rate=-1), "user_rate must be"),
    (dict(users=4, requests_per_user=2, user_rate=1, arrival_rate=3.0), "arrival_rate must be None"),
    (dict(users=4, requests_per_user=2, user_rate=1, num_requests=7), "num_requests must be left out"),
])
def test_multi_user_validation(kwargs, message):
    users = kwargs.pop("users")
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        fastsim.Workload.multi_user(users, **kwargs)


def test_requests_per_user_needs_users():
    with pytest.raises(ValueError, match="need users"):
        fastsim.Workload(requests_per_user=3)


def test_one_component_lognormal_fast_path_draws_as_the_general_path():
    """The kernel draws a one-component lognormal law without its general
    sampler (`kernel.workload._draw_workload`); a mixture of copies of the same law
    takes the general path (its component uniforms come from a stream of
    their own) and must give the very same lengths, with or without the SJF
    length predictor, whose key is drawn by the same function."""
    ln_p, ln_o = fastsim.LogNormal(200, 0.6), fastsim.LogNormal(90, 0.9)
    fast = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=2),   # a queue, for SJF to order
                            workload=fastsim.Workload(arrival_rate=3.0, num_requests=400,
                                                      prompt_len=ln_p, output_len=ln_o))
    general = fast.replace(**{"workload.prompt_len": fastsim.Mixture([ln_p, ln_p], [0.5, 0.5]),
                              "workload.output_len": fastsim.Mixture([ln_o, ln_o], [0.3, 0.7])})
    for rep in (0, 5):
        a = fastsim.sample_requests(fast, seed=1, replication=rep)
        b = fastsim.sample_requests(general, seed=1, replication=rep)
        assert a.equals(b)
    sjf = {"engine.policy": "sjf", "engine.length_predictor": fastsim.LogNormalPredictor(0.7)}
    a = fastsim.replicate(fast.replace(**sjf), 6, seed=2, progress=False).per_replication
    b = fastsim.replicate(general.replace(**sjf), 6, seed=2, progress=False).per_replication
    assert a.equals(b)
    assert not a.equals(fastsim.replicate(fast, 6, seed=2, progress=False).per_replication)  # the keys matter
