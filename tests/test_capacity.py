"""`capacity`: the noise-aware search for the largest rate meeting an SLO.

On an M/G/1 server (``max_num_seqs=1``, a constant step, 1-token prompts)
the mean TTFT is Pollaczek-Khinchine's ``lambda E[S^2] / (2 (1 - rho)) + d``,
so the rate where it reaches a limit is known exactly.
"""

import math

import numpy as np
import pytest
from scipy.optimize import brentq

import fastsim
from fastsim._capacity import PROBE_COLUMNS, CapacityResult, capacity
from fastsim.testing import mg1_mean_wait

STEP = 0.01
LAW = fastsim.Fixed(10)
ES, ES2 = LAW.mean() * STEP, LAW.second_moment() * STEP**2


# The interval checks below hold for any seed: every probe's decision is wrong with probability
# at most 1e-6, and probes near the truth get enough replications to be decided (with 12,800 a
# probe 0.8% below the 0.1 s limit's rate is proven ok by a margin of 6.6 standard errors).
# At the 0.95 default, 1 of 100 fresh seeds missed the analytic rate. The finite run's own bias
# (an empty start, 50 warm-up requests) is below 0.1% of the rate: 20,000 replications at the
# analytic rate give a mean TTFT within one standard error of the limit.
SURE = dict(confidence=1 - 1e-6, max_replications=12800)


def mg1(**slo):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=1),
        workload=fastsim.Workload(arrival_rate=2.0, num_requests=500, prompt_len=1, output_len=LAW,
                                  warmup_requests=50),
        latency=fastsim.LatencyModel.constant(STEP), **slo)


def analytic_rate(limit):
    """The rate where Pollaczek-Khinchine's mean TTFT equals ``limit``."""
    return brentq(lambda lam: mg1_mean_wait(lam, ES, ES2) + STEP - limit, 1e-9, 1 / ES - 1e-9)


@pytest.mark.parametrize("limit", [0.05, 0.1])
def test_rate_interval_contains_the_analytic_rate(limit):
    res = capacity(mg1(ttft_slo_s=0.2), {"ttft_mean": limit}, seed=3, rate_bounds=(0.5, 9.9), **SURE)
    assert isinstance(res, CapacityResult)
    truth = analytic_rate(limit)
    lo, hi = res.rate_interval
    assert lo <= truth <= hi, (lo, truth, hi)
    assert res.rate == lo
    # The bracket is narrow: a few percent of the rate.
    assert hi - lo < 0.15 * truth
    probes = res.probes
    assert list(probes.columns) == list(PROBE_COLUMNS)
    assert set(probes["decision"]) <= {"ok", "violates", "inconclusive"}
    assert res.total_replications == probes.drop_duplicates("probe")["replications"].sum()
    # Proven-ok probes have their upper bound below the limit; violating ones their lower bound above.
    ok = probes[probes["decision"] == "ok"]
    assert (ok["ci_high"] < limit).all() and (ok["rate"] <= lo).all()
    bad = probes[probes["decision"] == "violates"]
    assert (bad["ci_low"] > limit).all() and (bad["rate"] >= hi).all()
    # Goodput-optimal rate is one of the probed rates, with the largest goodput estimate.
    assert res.goodput_rate in set(probes["rate"])
    assert res.goodput == pytest.approx(probes["goodput"].max())
    assert len(res.summary()) == probes["probe"].nunique()


def test_larger_limit_gives_larger_capacity():
    sc = mg1()
    small = capacity(sc, {"ttft_mean": 0.05}, seed=0, rate_bounds=(0.5, 9.9))
    large = capacity(sc, {"ttft_mean": 0.1}, seed=0, rate_bounds=(0.5, 9.9))
    assert small.rate < large.rate
    assert small.rate_interval[1] <= large.rate_interval[0] or small.rate_interval[1] < large.rate_interval[1]


def test_search_without_bounds_brackets_from_the_scenario_rate():
    res = capacity(mg1(), {"ttft_mean": 0.1}, seed=1, **SURE)  # starts at 2 req/s and doubles
    lo, hi = res.rate_interval
    assert lo <= analytic_rate(0.1) <= hi


def test_two_slos_the_tighter_one_binds():
    sc = mg1()
    both = capacity(sc, {"ttft_mean": 0.05, "e2e_mean": 10.0}, seed=0, rate_bounds=(0.5, 9.9), **SURE)
    lo, hi = both.rate_interval
    assert lo <= analytic_rate(0.05) <= hi
    assert set(both.probes["metric"]) == {"ttft_mean", "e2e_mean"}


def test_low_bound_failing_gives_nan_rate_and_high_bound_passing_gives_inf():
    sc = mg1()
    res = capacity(sc, {"ttft_mean": 0.05}, seed=0, rate_bounds=(8.0, 9.0))
    assert math.isnan(res.rate)
    res = capacity(sc, {"ttft_mean": 0.05}, seed=0, rate_bounds=(0.5, 1.0))
    assert res.rate == 1.0 and res.rate_interval[1] == math.inf


def test_same_seed_same_search():
    sc = mg1()
    a = capacity(sc, {"ttft_mean": 0.1}, seed=5, rate_bounds=(1.0, 9.0))
    b = capacity(sc, {"ttft_mean": 0.1}, seed=a.seed, rate_bounds=(1.0, 9.0))
    assert a.rate_interval == b.rate_interval
    assert np.array_equal(a.probes["estimate"], b.probes["estimate"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(slo={"ttft_p98": 0.5}), "not a fastsim metric"),
    (dict(slo={"goodput": 3.0}), r"slo metric 'goodput' is higher-is-better"),
    (dict(slo={"request_throughput": 3.0}), r"'request_throughput' is higher-is-better"),
    (dict(slo={"ttft_p99": 0.0}), "slo"),
    (dict(slo={"ttft_p99": -1}), "slo"),
    (dict(slo={}), "non-empty dict"),
    (dict(slo=[("ttft_p99", 0.5)]), "non-empty dict"),
    (dict(slo={"ttft_p99": 0.5}, rate_bounds=(4.0, 2.0)), "low < high"),
    (dict(slo={"ttft_p99": 0.5}, rate_bounds=(0.0, 2.0)), "rate_bounds"),
    (dict(slo={"ttft_p99": 0.5}, rate_bounds=(1.0,)), "pair"),
    (dict(slo={"ttft_p99": 0.5}, confidence=1.0), "confidence"),
    (dict(slo={"ttft_p99": 0.5}, n_replications=1), "n_replications"),
    (dict(slo={"ttft_p99": 0.5}, n_replications=100, max_replications=50), "max_replications"),
    (dict(slo={"ttft_p99": 0.5}, tol=0), "tol"),
    (dict(slo={"ttft_p99": 0.5}, tol=1e-16), r"tol must be a finite number >= 2\.22045e-16 and < 1, got 1e-16"),
])
def test_invalid_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        capacity(mg1(), **kwargs)


def test_smallest_tol_terminates():
    # issue 43: tol=1e-16 looped for ever (`hi - lo > tol * hi` between adjacent
    # floats); the smallest allowed tol bisects down to adjacent floats and stops
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=1),
                          workload=fastsim.Workload(arrival_rate=2.0, num_requests=20, prompt_len=1, output_len=LAW),
                          latency=fastsim.LatencyModel.constant(STEP))
    res = capacity(sc, {"ttft_mean": 0.05}, seed=1, rate_bounds=(1.0, 80.0), n_replications=2,
                   max_replications=2, tol=2.0 ** -52)
    lo, hi = res.rate, res.probes.loc[res.probes["decision"] != "ok", "rate"].min()
    assert hi - lo <= 2.0 ** -52 * hi
    assert res.probes["probe"].nunique() < 80   # about 52 + 6 bisections, not thousands
