"""The vLLM A10G validation experiment (experiments/vllm_a10g_validation.py) in --quick mode.

Runs it as a subprocess and checks its qualitative claims on its own outputs:
every row, metric and variant is present, bands contain the predicted means,
the client-side TTFT overhead shifts TTFT by exactly the preset's constant and
leaves TPOT alone, predicted TPOT grows with the arrival rate as measured TPOT
does, and vllm bench serve's rescaled arrivals give a far narrower throughput
band than Poisson arrivals. No numbers from one seed are pinned.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fastsim._calibration import PRESETS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "vllm_a10g_validation.py"
METRICS = ["ttft_mean", "ttft_p50", "ttft_p95", "ttft_p99", "request_throughput", "tpot_mean", "tpot_p99",
           "output_throughput"]
VARIANTS = ["poisson", "poisson+overhead", "vllm", "vllm+overhead", "vllm+overhead+ctx"]
COLUMNS = ["row", "arrival_rate", "gpu_memory_utilization", "variant", "metric", "measured", "pred_mean",
           "pred_lo", "pred_hi", "rel_error", "inside_band"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("validation")
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out-dir", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_csv(out / "vllm_a10g_validation_quick.csv")
    summary = pd.read_csv(out / "vllm_a10g_validation_quick_summary.csv", index_col="variant")
    return proc.stdout, table, summary, out


def test_outputs_complete(quick_run):
    stdout, table, summary, out = quick_run
    assert (out / "vllm_a10g_validation_quick.png").stat().st_size > 0
    assert set(COLUMNS) <= set(table.columns)
    rows = table.row.unique()
    assert len(rows) == 4
    assert table.arrival_rate.nunique() == 4
    # one line per row x variant x metric, nothing missing or duplicated
    assert len(table) == len(rows) * len(VARIANTS) * len(METRICS)
    assert set(table.variant) == set(VARIANTS) and set(table.metric) == set(METRICS)
    assert not table.duplicated(["row", "variant", "metric"]).any()
    assert np.isfinite(table[["measured", "pred_mean", "pred_lo", "pred_hi", "rel_error"]].to_numpy()).all()
    assert set(summary.index) == set(VARIANTS)
    # the experiment checks its own metric code against replicate() and says so
    assert "agree to" in stdout and "=== targets" in stdout and "=== diagnostics" in stdout


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


def test_overhead_shifts_ttft_only(quick_run):
    _, table, _, _ = quick_run
    over = PRESETS["a10g-qwen2.5-1.5b"]["ttft_overhead_s"]
    for arr in ("poisson", "vllm"):
        for m in ("ttft_mean", "ttft_p50", "ttft_p99"):
            a, b = _pivot(table, arr, m), _pivot(table, arr + "+overhead", m)
            np.testing.assert_allclose(b.pred_mean - a.pred_mean, over, rtol=1e-6)
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
