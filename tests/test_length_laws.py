"""Length laws (issue 41): every law's exact mean and variance, against
independent closed forms or a direct sum of its pmf, and the kernel's draws
against them (moments within Monte Carlo intervals; the shape by a KS test
of the randomised probability integral transform, exactly uniform for a
discrete law)."""

import math
import zlib

import numpy as np
import pytest
from scipy import stats

import fastsim
from fastsim import Exponential, Gamma, Geometric, Histogram, LogNormal, Mixture, Truncated, Uniform

N = 20_000
Z = 4.0          # two-sided ~6e-5 per check: the tests pass for any seed
KS_ALPHA = 1e-4

LAWS = {
    "exponential": Exponential(50.0),
    "exponential_small": Exponential(0.7),
    "geometric": Geometric(40.0),
    "geometric_one": Geometric(1.0),
    "gamma": Gamma(100.0, 60.0),
    "gamma_bursty": Gamma(30.0, 60.0),          # shape 1/4 < 1
    "lognormal_mean_sd": LogNormal.from_mean_sd(200.0, 150.0),
    "histogram": Histogram([1, 10, 50, 200], [3.0, 5.0, 2.0]),
    "truncated_lognormal": Truncated(LogNormal(200.0, 1.0), 500),
    "truncated_exponential": Exponential(300.0).truncate(256),
    "mixture": Mixture([Exponential(20.0), Gamma(400.0, 100.0)], [0.7, 0.3]),
}


def _support(law):
    """Integers 1..K holding all but ~1e-13 of the law's mass."""
    k = 1
    while law.cdf(k) < 1.0 - 1e-13:
        k *= 2
    return np.arange(1, k + 1, dtype=float)


def _pmf_moments(law):
    k = _support(law)
    p = law.pmf(k)
    m = float(np.sum(p * k))
    c = k - m
    return m, float(np.sum(p * c ** 2)), float(np.sum(p * c ** 4)), float(p.sum())


@pytest.mark.parametrize("name", sorted(LAWS))
def test_exact_moments_agree_with_the_pmf(name):
    law = LAWS[name]
    m, v, _, mass = _pmf_moments(law)
    assert mass == pytest.approx(1.0, abs=1e-9)
    assert law.mean() == pytest.approx(m, rel=1e-7)
    assert law.variance() == pytest.approx(v, rel=1e-6)


def test_closed_forms():
    """Against scipy's own laws (code shared with nothing here)."""
    g = Geometric(40.0)
    assert g.mean() == pytest.approx(40.0, rel=1e-12)
    assert g.variance() == pytest.approx(stats.geom(1 / 40).var(), rel=1e-12)
    e = Exponential(50.0)     # ceil(Exp(mean 50)) is geometric with p = 1 - exp(-1/50)
    ref = stats.geom(-math.expm1(-1 / 50))
    assert e.mean() == pytest.approx(ref.mean(), rel=1e-12)
    assert e.variance() == pytest.approx(ref.var(), rel=1e-12)
    k = np.arange(1, 30)
    np.testing.assert_allclose(e.pmf(k), ref.pmf(k), rtol=1e-10)
    ln = LogNormal.from_mean_sd(200.0, 150.0)
    cont = stats.lognorm(s=ln.sigma, scale=ln.median)
    assert cont.mean() == pytest.approx(200.0, rel=1e-12) and cont.std() == pytest.approx(150.0, rel=1e-12)
    ga = Gamma(100.0, 60.0)
    assert stats.gamma(ga.shape, scale=ga.scale).mean() == pytest.approx(100.0)
    # ceil(X) lies in [X, X + 1): its mean in [E X, E X + 1]
    for law, mean in ((ln, 200.0), (ga, 100.0), (e, 50.0)):
        assert mean <= law.mean() <= mean + 1
    # a histogram of one-integer bins is the empirical pmf
    h = Histogram([3, 4, 5, 6], [1.0, 2.0, 1.0])
    assert h.mean() == pytest.approx(4.0) and h.variance() == pytest.approx(0.5)
    # truncation: the conditional law, moments from scipy's truncated sum
    t = Truncated(Uniform(1, 100), 10)
    assert t.mean() == pytest.approx(5.5) and t.variance() == pytest.approx(99 / 12)


def _draws(law, seed):
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=1.0, num_requests=N, prompt_len=law,
                                                    output_len=1))
    return fastsim.sample_requests(sc, seed=seed)["prompt_len"].to_numpy()


@pytest.mark.parametrize("name", sorted(LAWS))
def test_draws_match_the_law(name):
    law = LAWS[name]
    x = _draws(law, seed=zlib.crc32(name.encode()))
    m, v, mu4, _ = _pmf_moments(law)
    assert x.min() >= 1
    if isinstance(law, Truncated):
        assert x.max() <= law.high
    # mean within Z standard errors of the exact value
    assert abs(x.mean() - m) <= Z * math.sqrt(v / N) + 1e-12, (x.mean(), m)
    # sample variance: asymptotic variance (mu4 - sigma^4) / n
    if v > 0:
        assert abs(x.var(ddof=1) - v) <= Z * math.sqrt((mu4 - v * v) / N), (x.var(ddof=1), v)
        # shape: the randomised PIT F(L - 1) + V (F(L) - F(L - 1)) is exactly U(0, 1)
        rng = np.random.default_rng(7)
        u = law.cdf(x - 1) + rng.random(x.size) * law.pmf(x)
        assert stats.kstest(u, "uniform").pvalue > KS_ALPHA
    else:
        assert np.all(x == 1)


def test_toml_laws():
    sc = fastsim.Scenario.from_dict({"workload": {
        "prompt_len": {"dist": "exponential", "mean": 50},
        "output_len": {"dist": "lognormal", "mean": 200, "sd": 100, "truncate": 400}}})
    assert sc.workload.prompt_len == Exponential(50.0)
    o = sc.workload.output_len
    assert isinstance(o, Truncated) and o.high == 400 and o.law == LogNormal.from_mean_sd(200, 100)
    sc = fastsim.Scenario.from_dict({"workload": {
        "prompt_len": {"dist": "gamma", "mean": 50, "sd": 10},
        "output_len": {"dist": "histogram", "edges": [1, 5, 9], "counts": [1, 3]}}})
    assert sc.workload.prompt_len == Gamma(50, 10)
    with pytest.raises(ValueError, match="mean and sd"):
        fastsim.Scenario.from_dict({"workload": {"prompt_len": {"dist": "lognormal", "mean": 5}}})


@pytest.mark.parametrize("build, match", [
    (lambda: Geometric(0.5), "mean_len must be"),
    (lambda: Exponential(-1), "mean_len must be"),
    (lambda: Gamma(10, 0), "sd must be"),
    (lambda: Gamma(1, 1e6), "gamma shape"),
    (lambda: Histogram([1, 1], [1]), "edges must be"),
    (lambda: Histogram([1, 5], [1, 2]), "counts must be"),
    (lambda: Truncated(LogNormal(1e6, 0.01), 10), "high must leave"),
    (lambda: Truncated(Exponential(5), 0), "high must be"),
])
def test_bad_laws(build, match):
    with pytest.raises(ValueError, match=match):
        build()
