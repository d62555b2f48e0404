"""The four study experiments of experiments/ (issue 9) in --quick mode.

Each script's ``main(argv)`` is run once (module-scoped fixtures, in this
process) with its ``--quick`` sizes, and the qualitative finding it states is
checked on the confidence intervals the script itself computed (never on
numbers pinned from one seed). Where the measured margins allow, a difference
must exceed the one-sided normal-``Z`` tail point of Student t times its
standard error (recovered from the 95 % interval); the few effects too small
for that at the quick sizes are checked on the 95 % intervals, with their
margins over fresh seeds in a comment. Either way the checks hold for any seed
(set ``FASTSIM_EXPERIMENT_SEED`` to run them with another one).

Margins below: the script's quick run (``run(QUICK, seed)``) on 100 to 195
fresh seeds, as t = difference / standard error ("in log t": how many standard
deviations of log t the mean log t lies above the threshold's log), and for the
smaller effects a bootstrap (1e6 draws) of 1,500 to 1,600 pooled replications.
"""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from conftest import t_point

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("FASTSIM_EXPERIMENT_SEED", "20260611"))


def _load(name):
    spec = importlib.util.spec_from_file_location(f"exp_{name}", ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LEVEL = _load("_common").LEVEL


def se(row):
    """The standard error behind a table row's Student-t interval (experiments/_common.py, level LEVEL)."""
    return (row.ci_high - row.ci_low) / (2 * stats.t.ppf(0.5 + LEVEL / 2, row.n - 1))


def assert_sure_above(hi, lo):
    """``hi - lo`` exceeds the one-sided normal-Z tail point of Student t times its standard error: each of
    ``hi``, ``lo`` is a table row or a number, and for two rows se(hi) + se(lo) bounds the difference's
    standard error whatever their correlation."""
    (a, sa, na), (b, sb, nb) = [(x, 0.0, np.inf) if np.isscalar(x) else (x.estimate, se(x), x.n) for x in (hi, lo)]
    crit = t_point(min(na, nb) - 1)
    assert a - b > crit * (sa + sb), (f"{a:.6g} - {b:.6g}: {(a - b) / (sa + sb):.2f} standard errors, "
                                      f"needs {crit:.2f}", hi, lo)


def _run(name, tmp_path_factory):
    mod = _load(name)
    out = tmp_path_factory.mktemp(name)
    res = mod.main(["--quick", "--seed", str(SEED), "--out", str(out)])
    assert res["csv"].stat().st_size > 0 and res["png"].stat().st_size > 0
    assert res["findings"]
    t = res["table"]
    assert {"metric", "estimate", "ci_low", "ci_high", "n"} <= set(t.columns)
    ok = np.isfinite(t.ci_low) & np.isfinite(t.ci_high)
    assert ok.mean() > 0.9
    assert ((t.ci_low[ok] <= t.estimate[ok] + 1e-12) & (t.estimate[ok] <= t.ci_high[ok] + 1e-12)).all()
    return mod, t


@pytest.fixture(scope="module")
def static_vs_continuous(tmp_path_factory):
    return _run("static_vs_continuous", tmp_path_factory)


@pytest.fixture(scope="module")
def kv_budget(tmp_path_factory):
    return _run("kv_budget_tradeoff", tmp_path_factory)


@pytest.fixture(scope="module")
def preemption(tmp_path_factory):
    return _run("preemption_pressure", tmp_path_factory)


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    return _run("scheduling_policies", tmp_path_factory)


# ------------------------------------------------------------------------------------------
# 1. static vs continuous batching

def test_continuous_beats_static_at_high_load(static_vs_continuous):
    """On 100 seeds each difference was 38 to 189 standard errors on average and never below 28 (threshold
    6.37), at least 12 sd above the threshold in log t."""
    mod, t = static_vs_continuous
    load = t[t.part == "load"]
    hi, lo = load.arrival_rate.max(), load.arrival_rate.min()
    for kind in ("spread", "sharegpt"):
        sel = dict(part="load", workload=kind)
        r = mod.get(t, **sel, scheduler="continuous/static", arrival_rate=hi, metric="ratio_request_throughput")
        assert_sure_above(r, 1)                    # continuous throughput > static under overload
        # the gain grows with load: the overload ratio is above the low-load ratio
        r_lo = mod.get(t, **sel, scheduler="continuous/static", arrival_rate=lo, metric="ratio_request_throughput")
        assert_sure_above(r, r_lo)
        # p50 E2E is not "similar": continuous is far lower even at low load
        p50 = mod.get(t, **sel, scheduler="continuous/static", arrival_rate=lo, metric="ratio_e2e_p50")
        assert_sure_above(1, p50)
        # static batches hold their slots (padding) but few of them emit real tokens
        u_s = mod.get(t, **sel, scheduler="static", arrival_rate=hi, metric="useful_slot_fraction")
        u_c = mod.get(t, **sel, scheduler="continuous", arrival_rate=hi, metric="useful_slot_fraction")
        assert_sure_above(u_c, u_s)
        occ = mod.get(t, **sel, scheduler="static", arrival_rate=hi, metric="batch_occupancy_mean")
        assert_sure_above(occ, u_s)


def test_static_gap_needs_spread_output_lengths(static_vs_continuous):
    """Equal output lengths leave nothing for continuous batching to win (offline capacity). On 100 seeds
    the gap was 65 standard errors on average (sd 12, min 46; threshold 7.35 with 20 replications)."""
    mod, t = static_vs_continuous
    off = t[(t.part == "offline") & (t.metric == "ratio_request_throughput") & (t.scheduler == "continuous/static")]
    for seqs in off.max_num_seqs.unique():
        spread = off[(off.workload == "spread") & (off.max_num_seqs == seqs)].iloc[0]
        fixed = off[(off.workload == "fixed_300") & (off.max_num_seqs == seqs)].iloc[0]
        assert_sure_above(spread, fixed)


# ------------------------------------------------------------------------------------------
# 2. scheduling policies

def test_sjf_and_priority_cut_short_request_ttft(policies):
    """Checked on the 95 % intervals: on 187 seeds the cut was 9.8 standard errors (sd 1.3, min 6.7) for
    both policies, 12 sd above 2.05 in log t but only 3 above the 1e-6 point 6.37 (bootstrap: min 5.5,
    P(t <= 6.37) = 2e-4; every one of 1,500 replications had a cut)."""
    mod, t = policies
    for server in t.server.unique():
        for name in t[t.server == server].scenario.unique():
            for p in ("sjf", "priority"):
                d = mod.get(t, server, name, f"{p}-fcfs", "<500", "ttft_mean")
                assert d.ci_high < 0, d


def test_sjf_favours_short_over_long_requests(policies):
    """SJF's TTFT change is far better for short requests than for long ones (which it
    makes wait longer in the quick regime, by a few seconds: too small to assert for any seed).
    Checked on the 95 % intervals: on 187 seeds the gap was 9.1 standard errors (se(short) + se(long);
    sd 1.1, min 6.5), 13 sd above 2.05 in log t but only 3 above the 1e-6 point 6.37 (bootstrap: min 5.2)."""
    mod, t = policies
    for server in t.server.unique():
        for name in t[t.server == server].scenario.unique():
            short = mod.get(t, server, name, "sjf-fcfs", "<500", "ttft_mean")
            long_ = mod.get(t, server, name, "sjf-fcfs", ">5000", "ttft_mean")
            assert short.ci_high < long_.ci_low, (short, long_)


def test_policies_share_streams(policies):
    """Common random numbers: every policy saw the same requests in each band."""
    _, t = policies
    n = t[(t.metric == "n_requests") & t.policy.isin(["fcfs", "sjf", "priority"])]
    for _, g in n.groupby(["server", "scenario", "band"]):
        assert g.estimate.nunique() == 1


# ------------------------------------------------------------------------------------------
# 3. KV budget vs blocking and tail latency

def test_kv_budget_tradeoff_shape(kv_budget):
    """On 191 seeds (80 replications, threshold 5.44): blocking fell by 170 and 88 standard errors (min 137
    and 73), p99 TTFT at 8 req/s rose by 211 (min 164); the best budget was 4,096 tokens every time, its
    goodput 107 and 175 standard errors (min 72 and 125) above the two ends (1.88, 4.72 and 0.002 req/s)."""
    mod, t = kv_budget
    budgets = sorted(t.kv_budget_tokens.unique())
    b0, b1 = budgets[0], budgets[-1]
    for rate in t.arrival_rate.unique():
        # a larger budget lowers blocking ...
        assert_sure_above(mod.get(t, rate, b0, "blocking_probability"), mod.get(t, rate, b1, "blocking_probability"))
        # ... and raises the tail TTFT (more admitted load): below capacity (2 req/s) by only 6.6 standard
        # errors (sd 0.8, min 4.2; 9.5 sd above 1.99 in log t, 1.5 above 5.44), so on the 95 % intervals.
        # (The roomy budget's per-run p99 has a long upper tail, 0.17 s on average but up to 1.8 s in 1,600
        # runs; bootstrap min 3.1. Only a run near 8 s would take t below 1.99.)
        p99_b0, p99_b1 = mod.get(t, rate, b0, "ttft_p99"), mod.get(t, rate, b1, "ttft_p99")
        if rate == max(t.arrival_rate):
            assert_sure_above(p99_b1, p99_b0)
        assert p99_b1.ci_low > p99_b0.ci_high
    # above capacity goodput peaks at an interior budget, sure by the paired intervals (the argmax never
    # moved, so choosing it does not bias the paired differences)
    opt = mod.goodput_optimum(t, max(t.arrival_rate))
    assert opt["interior"], opt
    assert b0 < opt["best"] < b1
    assert_sure_above(opt["vs_smallest"], 0)
    assert_sure_above(opt["vs_largest"], 0)


# ------------------------------------------------------------------------------------------
# 4. preemption under memory pressure

def test_preemptions_grow_as_kv_shrinks(preemption):
    """Margins on 195 seeds (30 replications: thresholds 6.37, or 2.05 on the 95 % intervals)."""
    mod, t = preemption
    blocks = sorted(t.num_gpu_blocks.unique())
    for rate in t.arrival_rate.unique():
        pre = [mod.get(t, rate, b, "preemptions_per_request") for b in blocks]
        assert pre[-1].estimate == 0                        # the A10G cache never preempts (195 x 30 runs)
        # fewer blocks, more preemptions, on the 95 % intervals: 192 vs 320 blocks by 13.1 standard errors
        # (sd 2.0, min 7.8), 320 vs 6,822 by 9.3 (sd 1.3, min 6.9): 11 sd above 2.05 in log t, < 5 above 6.37
        # (bootstrap: min 6.9 and 4.9, P(t <= 6.37) = 2e-3 for the second)
        for small, large in zip(pre, pre[1:]):
            assert small.ci_low > large.ci_high or (small.estimate == large.estimate == 0)
        assert_sure_above(pre[0], 0)                        # 41 standard errors (min 30)
        # the cost at the smallest cache, paired against the full cache: TTFT up by 13.7 standard errors
        # (sd 1.9, min 9.6; 5.7 sd above 6.37 in log t), throughput down by 17.5 (sd 2.6, min 12.5; 6.9 sd);
        # TPOT up by 19.6 (sd 4.1, min 10.1) but with a heavy lower tail (5.1 sd above 6.37 in log t, skew
        # -0.55; per-run differences skewed, kurtosis 4.9), so on the 95 % interval (10 sd above 2.05).
        # Bootstrap: min 7.8 (TTFT), 9.5 (throughput), 8.5 (TPOT).
        assert mod.get(t, rate, blocks[0], "diff_tpot_mean").ci_low > 0
        assert_sure_above(mod.get(t, rate, blocks[0], "diff_ttft_mean"), 0)
        assert_sure_above(0, mod.get(t, rate, blocks[0], "diff_request_throughput"))


def test_preempted_requests_run_slower(preemption):
    """A preempted request's own TPOT is above its run-mates'. The script's quick row (8 replications) is
    no sure check: the per-replication gap has a heavy upper tail (0.011 s, sd 0.003, but up to 0.07 s in
    3,000 replications on 100 seeds) and one such outlier inflates the standard error, so a bootstrap of
    those replications fails ``ci_low > 0`` with probability 7e-4 (and a t test at the 1e-6 point on 30
    replications failed on 1 of those 100 seeds). The gap was positive in every one of them (min
    0.0044 s), so the test redoes 30 replications and counts the positive ones: 28 or more of 30 has
    probability 4.3e-7 under a median of 0 (on those 100 seeds: 30 of 30 each time)."""
    mod, t = preemption
    n = 30
    for rate in t.arrival_rate.unique():
        blocks = min(t.num_gpu_blocks.unique())
        sc = mod.scenario(rate, mod.QUICK["requests"]).replace(**{"engine.num_gpu_blocks": blocks})
        gap = mod.per_request_detail(sc, SEED, n)["tpot_gap_preempted"]
        assert (gap > 0).sum() > stats.binom.isf(1e-6, n, 0.5), gap      # 28 or more
