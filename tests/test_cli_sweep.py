"""`fastsim sweep` and `fastsim plot` from the command line, and `plot_sweep` from Python."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import fastsim  # noqa: E402
from fastsim._cli import main, parse_grid, parse_value  # noqa: E402
from fastsim._plot import axis_label, plot_sweep  # noqa: E402

CONFIG = """
name = "tiny"
[engine]
max_num_seqs = 8
[workload]
arrival_rate = 2.0
num_requests = 60
prompt_len = 32
output_len = 16
[slo]
ttft_s = 0.5
[run]
n_replications = 5
seed = 3
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(CONFIG)
    return path


def test_parse_value_types():
    assert parse_value("4") == 4 and isinstance(parse_value("4"), int)
    assert parse_value("2.5") == 2.5
    assert parse_value("1e3") == 1000.0
    assert parse_value("true") is True and parse_value("False") is False
    assert parse_value("sjf") == "sjf"
    assert parse_grid(["workload.arrival_rate=1,2.5", "engine.policy=fcfs,sjf"]) == {
        "workload.arrival_rate": [1, 2.5], "engine.policy": ["fcfs", "sjf"]}


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_sweep_writes_the_same_table_as_python(config, tmp_path, capsys, suffix):
    out = tmp_path / f"res{suffix}"
    rc = main(["sweep", str(config), "--grid", "workload.arrival_rate=1,3", "--grid", "engine.max_num_seqs=4,16",
               "--replications", "6", "--seed", "11", "--out", str(out), "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "4 points x 6 replications" in printed and "ttft_p99" in printed
    table = pd.read_parquet(out) if suffix == ".parquet" else pd.read_csv(out)
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=8),
                          workload=fastsim.Workload(arrival_rate=2.0, num_requests=60, prompt_len=32,
                                                    output_len=16), ttft_slo_s=0.5, name="tiny")
    expected = fastsim.sweep(sc, {"workload.arrival_rate": [1, 3], "engine.max_num_seqs": [4, 16]},
                             n_replications=6, seed=11).frame
    assert list(table.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(table, expected, check_dtype=False, rtol=1e-12 if suffix == ".csv" else 0)


def test_sweep_uses_run_section_and_cache(config, tmp_path, capsys):
    cache = tmp_path / "cache"
    args = ["sweep", str(config), "--grid", "engine.max_num_seqs=2,8", "--cache-dir", str(cache), "--no-progress"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "5 replications" in first and "seed 3" in first and "(0 points from the cache)" in first
    assert main(args) == 0
    assert "(2 points from the cache)" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    ([], "at least one --grid"),
    (["--grid", "workload.arrival_rate"], "PARAM=V1,V2"),
    (["--grid", "workload.arrival_rate=1,,2"], "empty value"),
    (["--grid", "engine.bogus=1,2"], "not a scenario parameter"),
    (["--grid", "engine.max_num_seqs=0,4"], "max_num_seqs"),
    (["--grid", "engine.max_num_seqs=4", "--out", "x.txt"], "--out must end"),
    (["--grid", "engine.max_num_seqs=4", "--out", "no/such/dir/x.csv"], "--out: directory 'no/such/dir' does not"),
    (["--grid", "engine.max_num_seqs=4", "--jobs", "0"], "n_jobs"),
    (["--grid", "engine.max_num_seqs=4", "--grid", "engine.max_num_seqs=8"], "given twice"),
])
def test_sweep_errors_exit_2(config, capsys, extra, message):
    assert main(["sweep", str(config), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastsim: error:") and message in err


def test_sweep_refuses_run_settings_it_would_ignore(config, capsys):
    """[run] precision, max_replications and n_threads are `fastsim run`
    settings: a sweep says so instead of running without them."""
    config.write_text(config.read_text() + "precision = {ttft_p99 = 0.0001}\nmax_replications = 20\n")
    assert main(["sweep", str(config), "--no-progress", "--grid", "engine.max_num_seqs=4,8"]) == 2
    assert "[run] max_replications, precision: not used by sweep" in capsys.readouterr().err


def test_sweep_missing_config_exits_2(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "none.toml"), "--grid", "engine.max_num_seqs=4"]) == 2
    assert "fastsim: error:" in capsys.readouterr().err


@pytest.fixture(scope="module")
def frame():
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=60, prompt_len=32,
                                                    output_len=16))
    return fastsim.sweep(sc, {"workload.arrival_rate": [1.0, 2.0, 4.0], "engine.max_num_seqs": [2, 8]},
                         n_replications=5, seed=0, metrics=["ttft_p99", "goodput"]).frame


def test_plot_sweep_one_line_per_hue_in_ms(frame):
    ax = plot_sweep(frame, "workload.arrival_rate", "ttft_p99", hue="engine.max_num_seqs")
    lines = ax.get_lines()
    assert len(lines) == 2
    rows = frame[(frame["metric"] == "ttft_p99") & (frame["engine.max_num_seqs"] == 2)]
    assert list(lines[0].get_xdata()) == [1.0, 2.0, 4.0]
    assert lines[0].get_ydata() == pytest.approx(rows["estimate"].to_numpy() * 1000)
    assert ax.get_ylabel() == "ttft_p99 (ms)" == axis_label("ttft_p99")
    assert "req/s" in ax.get_xlabel()
    assert len(ax.collections) == 2  # one shaded band per line
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["max_num_seqs = 2", "max_num_seqs = 8"]
    plt.close(ax.figure)


def test_plot_sweep_error_bars_on_given_axes(frame):
    fig, ax = plt.subplots()
    sub = frame[frame["engine.max_num_seqs"] == 8]
    out = plot_sweep(sub, "workload.arrival_rate", "goodput", ax=ax, band=False)
    assert out is ax and len(ax.get_lines()) >= 1 and ax.get_ylabel() == "goodput (req/s)"
    plt.close(fig)


@pytest.mark.parametrize("kwargs, match", [
    (dict(x="workload.nope", y="ttft_p99", hue="engine.max_num_seqs"), "not a parameter"),
    (dict(x="workload.arrival_rate", y="ttft_p98", hue="engine.max_num_seqs"), "not a metric"),
    (dict(x="workload.arrival_rate", y="ttft_p99"), "vary too"),
    (dict(x="workload.arrival_rate", y="ttft_p99", hue="workload.arrival_rate"), "differ"),
])
def test_plot_sweep_errors(frame, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plot_sweep(frame, **kwargs)


def test_plot_cli(frame, tmp_path, capsys):
    table = tmp_path / "t.parquet"
    frame.to_parquet(table, index=False)
    out = tmp_path / "p.png"
    rc = main(["plot", str(table), "--x", "workload.arrival_rate", "--y", "ttft_p99",
               "--hue", "engine.max_num_seqs", "--out", str(out)])
    assert rc == 0 and out.stat().st_size > 1000
    assert main(["plot", str(table), "--x", "workload.arrival_rate", "--y", "nope", "--out", str(out)]) == 2
    assert "fastsim: error:" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing.csv"), "--x", "a", "--y", "b"]) == 2
    assert main(["plot", str(table), "--x", "workload.arrival_rate", "--y", "ttft_p99",
                 "--out", str(tmp_path / "no" / "p.png")]) == 2
    assert "--out: directory" in capsys.readouterr().err
