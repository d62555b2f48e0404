"""The vLLM A10G validation experiment (experiments/vllm_a10g_validation.py) in --quick mode.

Runs it as a subprocess and checks its qualitative claims on its own outputs:
every row, metric and variant is present, bands contain the predicted means,
the replicate() per-run values agree with simulate_requests on the same stream,
the client-side TTFT overhead (LatencyModel.default()'s ttft_overhead_s) shifts
TTFT by exactly that constant and leaves TPOT alone, predicted TPOT grows with
the arrival rate as measured TPOT does, normalize_arrivals=True (vllm bench
serve's rescaled arrivals) gives a far narrower throughput band than Poisson
arrivals, and the linear context-cost sensitivity variant over-predicts TPOT
increasingly with load. No numbers from one seed are pinned.
"""

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim._calibration import NOISE_PRESETS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "vllm_a10g_validation.py"
METRICS = ["ttft_mean", "ttft_p50", "ttft_p95", "ttft_p99", "request_throughput", "tpot_mean", "tpot_p99",
           "output_throughput"]
VARIANTS = ["poisson", "poisson+overhead", "vllm", "vllm+overhead", "vllm+overhead+ctx", "v1, before fit", "v1",
            "v1+warm"]
COLUMNS = ["row", "arrival_rate", "gpu_memory_utilization", "variant", "metric", "measured", "pred_mean",
           "pred_lo", "pred_hi", "rel_error", "inside_band"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("validation")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_csv(out / "vllm_a10g_validation_quick.csv")
    summary = pd.read_csv(out / "vllm_a10g_validation_quick_summary.csv", index_col="variant")
    return proc.stdout, table, summary, out


@pytest.fixture(scope="module")
def script_module():
    spec = importlib.util.spec_from_file_location("vllm_a10g_validation", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_outputs_complete(quick_run):
    stdout, table, summary, out = quick_run
    assert (out / "vllm_a10g_validation_quick.png").stat().st_size > 0
    assert (out / "vllm_a10g_validation_quick_diagnostics.csv").stat().st_size > 0
    assert set(COLUMNS) <= set(table.columns)
    rows = table.row.unique()
    assert len(rows) == 4
    assert table.arrival_rate.nunique() == 4
    # one line per row x variant x metric, nothing missing or duplicated
    assert len(table) == len(rows) * len(VARIANTS) * len(METRICS)
    assert set(table.variant) == set(VARIANTS) and set(table.metric) == set(METRICS)
    assert not table.duplicated(["row", "variant", "metric"]).any()
    assert (table.n_replications == 30).all()
    assert np.isfinite(table[["measured", "pred_mean", "pred_lo", "pred_hi", "rel_error"]].to_numpy()).all()
    assert set(summary.index) == set(VARIANTS)
    assert "=== targets" in stdout and "=== diagnostics" in stdout


def test_cross_check_reported(quick_run):
    """The script compares replicate()'s per-run values with simulate_requests on
    sample_requests' stream (metrics computed as vllm bench serve does) and says by how much."""
    stdout = quick_run[0]
    m = re.search(r"per-replication values to ([0-9.e+-]+) \(relative\)", stdout)
    assert m, stdout[:2000]
    assert float(m.group(1)) < 1e-9


def test_bands_and_errors_consistent(quick_run):
    _, table, summary, _ = quick_run
    assert (table.pred_lo <= table.pred_mean).all() and (table.pred_mean <= table.pred_hi).all()
    inside = (table.pred_lo <= table.measured) & (table.measured <= table.pred_hi)
    assert (inside == table.inside_band).all()
    np.testing.assert_allclose(table.rel_error, table.pred_mean / table.measured - 1, rtol=1e-9, atol=1e-12)
    for var, t in table.groupby("variant"):
        cov = t[t.metric == "tpot_mean"].inside_band.mean()
        assert summary.loc[var, "tpot_mean_coverage"] == pytest.approx(cov)
        err = t[t.metric == "ttft_mean"].rel_error.abs().median()
        assert summary.loc[var, "ttft_mean_median_abs_rel_error"] == pytest.approx(err)


def _pivot(table, variant, metric):
    t = table[(table.variant == variant) & (table.metric == metric)].sort_values("arrival_rate")
    return t.set_index("row")


def test_overhead_shifts_ttft_only(quick_run, script_module):
    """The client overhead is added to every TTFT of a run and to nothing else. With the
    fitted per-run overhead law N(over, sd^2), floored at 0, a replication's overhead is
    max(over + sd z, 0) with the variant and max(sd z, 0) without it (the same z: common
    random numbers), so their difference lies in (over + sd min(z, 0), over]: the mean shift is
    at most ``over`` and, over 30 replications, far above over - sd."""
    _, table, _, _ = quick_run
    model = script_module.before_model()
    over, sd = model.ttft_overhead_s, model.noise.overhead_sd
    assert over == script_module.BEFORE_FIT["ttft_overhead_s"] and sd > 0
    assert fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b").ttft_overhead_s == NOISE_PRESETS["a10g-qwen2.5-1.5b"]["ttft_overhead_s"]
    for arr in ("poisson", "vllm"):
        for m in ("ttft_mean", "ttft_p50", "ttft_p99"):
            a, b = _pivot(table, arr, m), _pivot(table, arr + "+overhead", m)
            shift = (b.pred_mean - a.pred_mean).to_numpy()
            assert np.all(shift <= over * (1 + 1e-9)) and np.all(shift > over - sd), (arr, m, shift)
        for m in ("tpot_mean", "tpot_p99"):
            a, b = _pivot(table, arr, m), _pivot(table, arr + "+overhead", m)
            np.testing.assert_allclose(b.pred_mean, a.pred_mean, rtol=1e-12)
        # the overhead lengthens the benchmark by one constant: throughput slightly lower
        a, b = _pivot(table, arr, "request_throughput"), _pivot(table, arr + "+overhead", "request_throughput")
        assert (b.pred_mean < a.pred_mean).all()
    # the fitted overhead brings the predicted mean TTFT closer to the measurement
    a, b = _pivot(table, "vllm", "ttft_mean"), _pivot(table, "vllm+overhead", "ttft_mean")
    assert (b.rel_error.abs() < a.rel_error.abs()).all()


def test_load_trends_follow_measurement(quick_run):
    _, table, _, _ = quick_run
    for var in ("poisson+overhead", "vllm+overhead"):
        for m in ("tpot_mean", "request_throughput", "output_throughput", "ttft_mean"):
            t = _pivot(table, var, m)
            assert np.all(np.diff(t.measured.to_numpy()) > 0), (var, m)
            assert np.all(np.diff(t.pred_mean.to_numpy()) > 0), (var, m)


def test_vllm_arrivals_narrow_the_throughput_band(quick_run):
    """vllm bench serve sends the last request at exactly num_prompts / rate, so its
    throughput is nearly deterministic; Poisson arrivals spread it over a wide band."""
    _, table, _, _ = quick_run
    width = {}
    for arr in ("poisson", "vllm"):
        t = _pivot(table, arr, "request_throughput")
        width[arr] = ((t.pred_hi - t.pred_lo) / t.pred_mean).to_numpy()
    assert np.all(width["vllm"] * 5 < width["poisson"])


def test_linear_context_cost_overshoots_with_load(quick_run):
    """The sensitivity variant's linear KV-context cost makes TPOT grow too fast with load."""
    _, table, _, _ = quick_run
    head, ctx = _pivot(table, "vllm+overhead", "tpot_mean"), _pivot(table, "vllm+overhead+ctx", "tpot_mean")
    assert np.all(np.diff(ctx.rel_error.to_numpy()) > 0)
    assert (ctx.pred_mean > head.pred_mean).all()
    assert ctx.rel_error.iloc[-1] > abs(head.rel_error.iloc[-1])


def test_rows_at_one_rate_share_the_arrival_stream(script_module):
    """The scenarios the script builds for two gmu rows at one rate draw the same
    vllm-style arrival stream (only the KV capacity differs), last arrival at n / rate."""
    sweep = pd.read_csv(script_module.SWEEP)
    g = sweep[sweep.arrival_rate == 2.0]
    assert g.kv_cache_blocks.nunique() > 1
    lm = dataclasses.replace(fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b"), ttft_overhead_s=0.0)
    streams = [fastsim.sample_requests(script_module.scenario_for(r, lm, True), seed=3, replication=2)
               for _, r in g.iloc[:2].iterrows()]
    np.testing.assert_array_equal(streams[0].arrival_s, streams[1].arrival_s)
    a = streams[0].arrival_s.to_numpy()
    assert a[0] > 0 and a[-1] == pytest.approx(script_module.NUM_REQUESTS / 2.0, rel=1e-12)
