"""The public API: result objects, saving, precision targets, TOML and the CLI."""

import json

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim._cli import EXAMPLE, main

SMALL = fastsim.Scenario(
    engine=fastsim.EngineConfig(max_num_seqs=16),
    workload=fastsim.Workload(arrival_rate=3.0, num_requests=150, prompt_len=fastsim.LogNormal(200, 0.5),
                              output_len=fastsim.LogNormal(60, 0.6), warmup_requests=15),
    ttft_slo_s=0.05, tpot_slo_s=0.02)


@pytest.fixture(scope="module")
def result():
    return fastsim.replicate(SMALL, n_replications=50, seed=3)


def test_summary_is_a_tidy_frame_of_every_metric(result):
    s = result.summary()
    assert list(s.index) == list(fastsim.METRIC_DESCRIPTIONS)
    assert {"estimate", "ci_low", "ci_high", "std_error", "n", "description"} <= set(s.columns)
    finite = s.dropna(subset=["ci_low"])
    assert (finite.ci_low <= finite.estimate).all() and (finite.estimate <= finite.ci_high).all()
    # The estimate is the mean of the per-replication values.
    np.testing.assert_allclose(s.loc["ttft_p99", "estimate"], result.per_replication["ttft_p99"].mean())
    # Goodput counts only requests within the SLOs, so it cannot exceed throughput.
    assert (result.per_replication["goodput"] <= result.per_replication["request_throughput"] + 1e-12).all()
    assert s.loc["goodput", "estimate"] < s.loc["request_throughput", "estimate"]


def test_confidence_interval_api(result):
    ci95 = result.confidence_interval("ttft_mean")
    ci99 = result.confidence_interval("ttft_mean", confidence_level=0.99)
    assert ci99.low < ci95.low < ci95.high < ci99.high
    assert result.estimate("ttft_mean") in ci95
    assert ci95.half_width == pytest.approx((ci95.high - ci95.low) / 2)
    # Python floats, so that the interval prints as ConfidenceInterval(low=0.03..., high=...)
    assert type(ci95.low) is float and type(ci95.high) is float and type(result.estimate("ttft_mean")) is float
    assert "np.float64" not in repr(ci95)
    assert repr(fastsim.ConfidenceInterval(np.float64(0.25), np.float64(0.5))) == "ConfidenceInterval(low=0.25, high=0.5)"
    with pytest.raises(ValueError, match="metric must be one of"):
        result.confidence_interval("ttft_p42")


def test_per_replication_counts_are_integers(result):
    pr = result.per_replication
    for c in ("n_arrived", "n_completed", "n_rejected", "n_dropped", "n_unfinished"):
        assert pr[c].dtype == np.int64
    assert (pr["n_arrived"] == 150).all()


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_save_round_trips(result, tmp_path, suffix):
    path = result.save(tmp_path / f"summary{suffix}")
    if suffix == ".csv":
        back = pd.read_csv(path, index_col=0)
    elif suffix == ".json":
        back = pd.DataFrame(json.loads(path.read_text())).set_index("metric")
    else:
        back = pd.read_parquet(path)
    np.testing.assert_allclose(back["estimate"], result.summary()["estimate"], equal_nan=True)
    with pytest.raises(ValueError, match=r"path must end in .csv, .json or .parquet"):
        result.save(tmp_path / "x.xlsx")


def test_precision_target_adds_replications_until_reached():
    res = fastsim.replicate(SMALL, n_replications=10, seed=4, precision={"ttft_mean": 0.01},
                            max_replications=5000)
    assert res.n_replications > 10
    assert res.relative_half_width("ttft_mean") <= 0.01
    assert res.precision_achieved().loc["ttft_mean", "met"]
    # It is the same as asking for that many replications up front.
    fixed = fastsim.replicate(SMALL, n_replications=res.n_replications, seed=4)
    pd.testing.assert_frame_equal(res.per_replication, fixed.per_replication)


def test_precision_target_stops_at_the_cap():
    with pytest.warns(RuntimeWarning, match=r"precision targets not reached with max_replications=40: relative "
                                             r"half-width ttft_p99 \S+ \(target 1e-06\)"):
        res = fastsim.replicate(SMALL, n_replications=10, seed=4, precision={"ttft_p99": 1e-6},
                                max_replications=40)
    assert res.n_replications == 40
    report = res.precision_achieved()
    assert not report.loc["ttft_p99", "met"] and report.loc["ttft_p99", "reached"] > 1e-6


def test_a_metric_without_variance_meets_its_precision_target():
    """A metric equal in every replication (no blocking here) has a zero-width
    interval: replicate stops for it, and precision_achieved says it is met."""
    res = fastsim.replicate(SMALL, n_replications=5, seed=0, precision={"blocking_probability": 0.1},
                            max_replications=200)
    assert res.n_replications == 5 and (res.per_replication["blocking_probability"] == 0).all()
    report = res.precision_achieved()
    assert report.loc["blocking_probability", "reached"] == 0.0 and report.loc["blocking_probability", "met"]


def test_results_compare_by_identity():
    """Result objects hold DataFrames: == is identity (no ambiguous-truth error)."""
    a, b = fastsim.replicate(SMALL, 4, seed=1), fastsim.replicate(SMALL, 4, seed=1)
    assert a == a and a != b
    pd.testing.assert_frame_equal(a.per_replication, b.per_replication)   # compare the data instead


def test_scenario_from_toml_dict_matches_python():
    cfg = {"engine": {"max_num_seqs": 16},
           "workload": {"arrival_rate": 3.0, "num_requests": 150, "warmup_requests": 15,
                        "prompt_len": {"dist": "lognormal", "median": 200, "sigma": 0.5},
                        "output_len": {"dist": "lognormal", "median": 60, "sigma": 0.6}},
           "slo": {"ttft_s": 0.05, "tpot_s": 0.02}}
    sc = fastsim.Scenario.from_dict(cfg)
    a = fastsim.replicate(sc, 5, seed=1).per_replication
    b = fastsim.replicate(SMALL, 5, seed=1).per_replication
    pd.testing.assert_frame_equal(a, b)
    mix = fastsim.Scenario.from_dict({"workload": {"output_len": {
        "dist": "mixture", "weights": [0.5, 0.5],
        "components": [{"dist": "fixed", "value": 5}, {"dist": "uniform", "low": 10, "high": 20}]}}})
    assert mix.workload.output_len.mean() == pytest.approx(0.5 * 5 + 0.5 * 15)


def test_scenario_replace_reaches_inside():
    sc = SMALL.replace(**{"engine.max_num_seqs": 4, "workload.arrival_rate": 1.0}, ttft_slo_s=1.0)
    assert (sc.engine.max_num_seqs, sc.workload.arrival_rate, sc.ttft_slo_s) == (4, 1.0, 1.0)
    assert SMALL.engine.max_num_seqs == 16
    with pytest.raises(ValueError, match="unknown scenario section 'engin'"):
        SMALL.replace(**{"engin.max_num_seqs": 4})


def test_cli_run_writes_formats(tmp_path, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text(EXAMPLE.read_text().replace("num_requests = 1000", "num_requests = 120")
                   .replace("warmup_requests = 100", "warmup_requests = 10"))
    assert main(["run", str(cfg), "--replications", "8", "--seed", "1", "--format", "json",
                 "--out", str(tmp_path / "o.csv"), "--per-replication", str(tmp_path / "p.parquet"),
                 "--no-progress"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["metric"] for r in rows} == set(fastsim.METRIC_DESCRIPTIONS)
    per_rep = pd.read_parquet(tmp_path / "p.parquet")
    assert per_rep["replication"].tolist() == list(range(8))
    assert main(["run", str(cfg), "--replications", "8", "--seed", "1", "--format", "csv",
                 "--per-replication", str(tmp_path / "p.json"), "--no-progress"]) == 0
    pd.testing.assert_frame_equal(pd.read_json(tmp_path / "p.json", orient="records"), per_rep, check_dtype=False)
    assert pd.read_csv(tmp_path / "o.csv", index_col=0).shape[0] == len(fastsim.METRIC_DESCRIPTIONS)
    assert main(["run", str(cfg), "--replications", "4", "--format", "table", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "ttft_p99" in out and "95% confidence interval" in out


def test_cli_reports_bad_input_clearly(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine]\nmax_num_seqs = 0\n")
    assert main(["run", str(bad), "--no-progress"]) == 2
    assert "max_num_seqs must be an integer >= 1, got 0" in capsys.readouterr().err
    for text, message in (("engine = 5\n", "[engine] must be a table of key = value settings, got 5"),
                          ("run = [1, 2]\n", "[run] must be a table"),
                          ("[workload]\nsharegpt = \"false\"\n", "[workload] sharegpt must be True or False"),
                          ("[workload]\nsharegpt = false\nsharegpt_order = \"sample\"\n",
                           "sharegpt_order needs sharegpt = true"),
                          ("[workload]\nsharegpt = true\nprompt_len = 100\n",
                           "prompt_len must be left at its default (256) when lengths gives")):
        bad.write_text(text)
        assert main(["run", str(bad), "--no-progress"]) == 2
        assert message in capsys.readouterr().err, text
    # output paths are checked before the run: a bad one loses no results
    for flag, path in (("--out", tmp_path / "no" / "o.csv"), ("--per-replication", tmp_path / "no" / "p.csv"),
                       ("--per-replication", tmp_path / "p.xlsx")):
        assert main(["demo", flag, str(path), "--no-progress"]) == 2
        assert f"fastsim: error: {flag}" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.toml")]) == 2
    assert main(["demo", "--show-config"]) == 0
    assert capsys.readouterr().out == EXAMPLE.read_text()   # the file as shipped, to redirect and edit


def test_cli_compile_leaves_both_engines_compiled(capsys):
    from fastsim import kernel as K

    assert main(["compile"]) == 0
    out = capsys.readouterr().out
    assert "common engine: ready in" in out and "full engine: ready in" in out
    # What a later run needs is there: the entries for either engine, and the driver for both.
    assert {sig[13] for sig in K._simulate.signatures} >= {K.drivers.nb_types.none, K.drivers.nb_types.int64}   # (full)
    assert {sig[-5] for sig in K._run_chunk.signatures} >= {K.drivers.nb_types.none, K.drivers.nb_types.int64}


def test_compile_kernels_one_engine_and_bad_input():
    frame = fastsim.compile_kernels("common")
    assert list(frame["engine"]) == ["common"] and (frame["seconds"] >= 0).all()
    with pytest.raises(ValueError, match="engine must be one of.*got 'gpu'"):
        fastsim.compile_kernels("gpu")


def test_example_config_is_the_demo_scenario():
    from fastsim._cli import _load

    sc, run = _load(EXAMPLE)
    assert run["n_replications"] >= 1000
    assert sc.engine.num_gpu_blocks == 6822 and sc.workload.lengths is not None


def test_client_overhead_shifts_ttft_and_e2e_only():
    import dataclasses

    c = 0.0125
    with_c = SMALL.replace(latency=dataclasses.replace(SMALL.latency, ttft_overhead_s=c))
    without = SMALL.replace(latency=dataclasses.replace(SMALL.latency, ttft_overhead_s=0.0))
    a = fastsim.replicate(with_c, 6, seed=2).per_replication
    b = fastsim.replicate(without, 6, seed=2).per_replication
    for m in ("ttft_mean", "ttft_p99", "e2e_mean", "e2e_p50"):
        np.testing.assert_allclose(a[m], b[m] + c, rtol=1e-12)
    for m in ("tpot_mean", "itl_p99", "n_steps", "max_blocks_used"):
        np.testing.assert_allclose(a[m], b[m], rtol=1e-9)
    # The throughput window closes at the last completion as the client sees it.
    np.testing.assert_allclose(a["window_s"], b["window_s"] + c, rtol=1e-12)
    assert fastsim.LatencyModel.default().ttft_overhead_s > 0
    assert fastsim.LatencyModel.constant(0.01).ttft_overhead_s == 0


def test_results_display_in_a_notebook():
    """`_repr_html_` of the results: every metric with its interval in display units."""
    res = fastsim.replicate(SMALL, 5, seed=1)
    page = res._repr_html_()
    ci = res.confidence_interval("ttft_mean")
    assert f"[{ci.low * 1000:.4g}, {ci.high * 1000:.4g}]" in page
    for metric in fastsim.METRIC_DESCRIPTIONS:
        assert f"<td>{metric}</td>" in page
    assert "'>n/a<" in page and ">nan" not in page   # the prefix hit rate, without caching
    sw = fastsim.sweep(SMALL, {"workload.arrival_rate": [1.0, 2.0]}, n_replications=4, seed=0,
                       metrics=["ttft_mean", "goodput"])
    page = sw._repr_html_()
    row = sw.frame[(sw.frame.point == 1) & (sw.frame.metric == "goodput")].iloc[0]
    assert "goodput (req/s)" in page and f"{row.estimate:.4g} [{row.ci_low:.4g}, {row.ci_high:.4g}]" in page
    cmp_ = fastsim.compare({"a": SMALL, "b": SMALL.replace(**{"engine.max_num_seqs": 4})}, 4, seed=0,
                           metrics=["ttft_mean"])
    page = cmp_._repr_html_()
    r = cmp_.frame.iloc[0]
    assert "baseline <b>a</b>" in page and f"{r.difference * 1000:+.4g}" in page


def test_sweep_result_plot_draws_the_estimates():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sw = fastsim.sweep(SMALL, {"workload.arrival_rate": [1.0, 2.0, 3.0]}, n_replications=4, seed=0,
                       metrics=["ttft_mean"])
    ax = sw.plot("workload.arrival_rate", "ttft_mean")
    xs, ys = ax.get_lines()[0].get_data()
    est = sw.frame.sort_values("workload.arrival_rate")["estimate"].to_numpy()
    assert list(xs) == [1.0, 2.0, 3.0] and np.allclose(np.asarray(ys) / est, np.asarray(ys)[0] / est[0])
    plt.close(ax.figure)
