"""Every script under experiments/ takes --quick (issue 42); the ones that
tests/test_experiments.py does not cover run with it here (quick runs only
check that a script runs and prints; their findings are checked elsewhere)."""

import ast
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "experiments").glob("*.py") if not p.name.startswith("_"))


def _module(name):
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        spec = importlib.util.spec_from_file_location(f"expq_{name}", ROOT / "experiments" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "experiments"))


def _takes_quick(path) -> bool:
    """The script's parser has ``--quick``: its own ``add_argument("--quick", ...)``, or
    ``_common.parse_args`` (or ``run_experiment``, which calls it), which adds it."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "add_argument" and node.args and getattr(node.args[0], "value", None) == "--quick":
                return True
        if isinstance(node, ast.ImportFrom) and node.module == "_common" and any(
                a.name in ("parse_args", "run_experiment") for a in node.names):
            return True
    return False


def test_every_experiment_takes_quick():
    # (reading the parsers, not running 10 interpreters: the quick runs are below and in
    # test_experiments.py, test_validation_experiment.py and test_analytical.py)
    assert len(SCRIPTS) >= 10
    assert [p.name for p in SCRIPTS if not _takes_quick(p)] == []


def test_theory_checks_quick(capsys):
    rows = _module("theory_checks").main(["--quick"])
    assert len(rows) == 10 and rows["estimate"].notna().all()
    assert "M/G/1 mean TTFT" in capsys.readouterr().out


def test_ci_coverage_p99_check_quick(capsys):
    hits, calls = _module("ci_coverage_p99_check").main(["--quick"])
    assert calls == 10 and 0 <= hits <= calls
    assert "coverage of per-run estimand" in capsys.readouterr().out


def test_calibrate_a10g_quick(tmp_path, capsys):
    _module("calibrate_a10g").main(["--quick", "--out", str(tmp_path)])
    assert (tmp_path / "calibration_a10g.png").is_file()
    assert "matches this fit: True" in capsys.readouterr().out


def test_markdown_table_needs_no_tabulate():
    table = _module("analytical_vs_simulation").markdown_table(
        pd.DataFrame({"a": [1, 22], "b": [0.5, float("nan")]}, index=pd.Index(["x", "y"], name="k")))
    assert table.splitlines() == ["| k |  a |   b |", "|---|----|-----|", "| x |  1 | 0.5 |", "| y | 22 |     |"]


@pytest.mark.slow
def test_analytical_vs_simulation_quick(tmp_path):   # about 70 s on 2 cores, nearly all in the models
    _module("analytical_vs_simulation").main(["--quick", "--out-dir", str(tmp_path)])
    assert list(tmp_path.glob("*.csv"))


def test_scheduler_study_quick(tmp_path):
    """The scheduler study per class: every (class, policy, metric) row, no
    measured figure invented, and SJF's short requests ahead of FCFS's (a
    difference of forty-fold, far outside both intervals)."""
    t = _module("scheduler_study").main(["--quick", "--out", str(tmp_path)])["table"]
    assert len(t) == 3 * 3 * 5 and t["measured"].isna().all()
    short = t[(t["class"] == "<500") & (t.metric == "ttft_mean")].set_index("policy")
    assert short.at["sjf", "ci_high"] < short.at["fcfs", "ci_low"]


def test_fleet_routing_quick(tmp_path):
    """The router comparison (ShareGPT, prefix-heavy, and the bundled
    Mooncake trace replayed with its block hashes, where session affinity
    is left out: a trace names no sessions) and replicas vs rate: every
    row, each router's paired difference from ``random`` exactly 0 for
    ``random`` itself, and a fleet sized for every rate."""
    routers, need = _module("fleet_routing").main(["--quick", "--out", str(tmp_path)])
    n_metrics = routers.metric.nunique()
    assert routers.groupby("workload").size().to_dict() == {"sharegpt": 11 * n_metrics,
                                                           "prefix_heavy": 11 * n_metrics,
                                                           "mooncake": 10 * n_metrics}
    assert set(routers.router) >= {"weighted", "weighted:1,2,0"}
    measured = routers[(routers.workload != "sharegpt") | (routers.metric != "prefix_hit_rate")]   # (no cache)
    assert measured.estimate.notna().all()
    assert (measured[measured.router == "random"].diff_vs_random == 0).all()
    assert (need.replicas >= 1).all() and {p.name for p in tmp_path.iterdir()} == {"routers.csv",
                                                                                   "replicas_vs_rate.csv"}
