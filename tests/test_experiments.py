"""The four study experiments of experiments/ (issue 9) in --quick mode.

Each script's ``main(argv)`` is run once (module-scoped fixtures, in this
process) with its ``--quick`` sizes, and the qualitative finding it states is
checked on the confidence intervals the script itself computed (never on
numbers pinned from one seed). The quick sizes make each checked effect many
standard errors wide, so the checks hold for any seed (set
``FASTSIM_EXPERIMENT_SEED`` to run them with another one).
"""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("FASTSIM_EXPERIMENT_SEED", "20260611"))


def _load(name):
    spec = importlib.util.spec_from_file_location(f"exp_{name}", ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    mod, t = static_vs_continuous
    load = t[t.part == "load"]
    hi, lo = load.arrival_rate.max(), load.arrival_rate.min()
    for kind in ("spread", "sharegpt"):
        sel = dict(part="load", workload=kind)
        r = mod.get(t, **sel, scheduler="continuous/static", arrival_rate=hi, metric="ratio_request_throughput")
        assert r.ci_low > 1, r                     # continuous throughput > static under overload
        # the gain grows with load: the overload ratio is above the low-load ratio
        r_lo = mod.get(t, **sel, scheduler="continuous/static", arrival_rate=lo, metric="ratio_request_throughput")
        assert r.ci_low > r_lo.ci_high
        # p50 E2E is not "similar": continuous is far lower even at low load
        p50 = mod.get(t, **sel, scheduler="continuous/static", arrival_rate=lo, metric="ratio_e2e_p50")
        assert p50.ci_high < 1
        # static batches hold their slots (padding) but few of them emit real tokens
        u_s = mod.get(t, **sel, scheduler="static", arrival_rate=hi, metric="useful_slot_fraction")
        u_c = mod.get(t, **sel, scheduler="continuous", arrival_rate=hi, metric="useful_slot_fraction")
        assert u_c.ci_low > u_s.ci_high
        occ = mod.get(t, **sel, scheduler="static", arrival_rate=hi, metric="batch_occupancy_mean")
        assert occ.ci_low > u_s.ci_high


def test_static_gap_needs_spread_output_lengths(static_vs_continuous):
    """Equal output lengths leave nothing for continuous batching to win (offline capacity)."""
    mod, t = static_vs_continuous
    off = t[(t.part == "offline") & (t.metric == "ratio_request_throughput") & (t.scheduler == "continuous/static")]
    for seqs in off.max_num_seqs.unique():
        spread = off[(off.workload == "spread") & (off.max_num_seqs == seqs)].iloc[0]
        fixed = off[(off.workload == "fixed_300") & (off.max_num_seqs == seqs)].iloc[0]
        assert spread.ci_low > fixed.ci_high


# ------------------------------------------------------------------------------------------
# 2. scheduling policies

def test_sjf_and_priority_cut_short_request_ttft(policies):
    mod, t = policies
    for server in t.server.unique():
        for name in t[t.server == server].scenario.unique():
            for p in ("sjf", "priority"):
                d = mod.get(t, server, name, f"{p}-fcfs", "<500", "ttft_mean")
                assert d.ci_high < 0, d


def test_sjf_favours_short_over_long_requests(policies):
    """SJF's TTFT change is far better for short requests than for long ones (which it
    makes wait longer in the quick regime, by a few seconds: too small to assert for any seed)."""
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
    mod, t = kv_budget
    budgets = sorted(t.kv_budget_tokens.unique())
    b0, b1 = budgets[0], budgets[-1]
    for rate in t.arrival_rate.unique():
        # a larger budget lowers blocking ...
        assert mod.get(t, rate, b0, "blocking_probability").ci_low > mod.get(t, rate, b1,
                                                                            "blocking_probability").ci_high
        # ... and raises the tail TTFT (more admitted load)
        assert mod.get(t, rate, b1, "ttft_p99").ci_low > mod.get(t, rate, b0, "ttft_p99").ci_high
    # above capacity goodput peaks at an interior budget, sure by the paired intervals
    opt = mod.goodput_optimum(t, max(t.arrival_rate))
    assert opt["interior"], opt
    assert b0 < opt["best"] < b1


# ------------------------------------------------------------------------------------------
# 4. preemption under memory pressure

def test_preemptions_grow_as_kv_shrinks(preemption):
    mod, t = preemption
    blocks = sorted(t.num_gpu_blocks.unique())
    for rate in t.arrival_rate.unique():
        pre = [mod.get(t, rate, b, "preemptions_per_request") for b in blocks]
        assert pre[-1].estimate == 0                        # the A10G cache never preempts
        for small, large in zip(pre, pre[1:]):             # fewer blocks, more preemptions
            assert small.ci_low > large.ci_high or (small.estimate == large.estimate == 0)
        assert pre[0].ci_low > 0
        # the cost at the smallest cache, paired against the full cache
        assert mod.get(t, rate, blocks[0], "diff_tpot_mean").ci_low > 0
        assert mod.get(t, rate, blocks[0], "diff_ttft_mean").ci_low > 0
        assert mod.get(t, rate, blocks[0], "diff_request_throughput").ci_high < 0
        # a preempted request's own TPOT is above its run-mates'
        assert mod.get(t, rate, blocks[0], "tpot_gap_preempted").ci_low > 0
