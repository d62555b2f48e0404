"""Per-class estimates through `sweep` and the CLI (`fastsim run FILE --by
class`, `fastsim sweep ... --by class --out`), and the TOML tables
``[workload] classes = {...}`` and ``sessions = {...}``: each equals the
per-point `ReplicateResult.summary(by="class")` it is made of."""

import tomllib

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim._cli import main

TOML = """
[engine]
num_gpu_blocks = 400
block_size = 16
max_num_seqs = 8
[workload]
arrival_rate = 3.0
num_requests = 60
prompt_len = {dist = "lognormal", median = 80, sigma = 0.7}
output_len = 20
classes = {by = "prompt_len", edges = [64, 128], names = ["short", "mid", "long"]}
[latency]
step_s = 0.02
"""


def _scenario():
    return fastsim.Scenario.from_dict({
        "engine": {"num_gpu_blocks": 400, "block_size": 16, "max_num_seqs": 8},
        "workload": {"arrival_rate": 3.0, "num_requests": 60, "output_len": 20,
                     "prompt_len": {"dist": "lognormal", "median": 80, "sigma": 0.7},
                     "classes": {"by": "prompt_len", "edges": [64, 128], "names": ["short", "mid", "long"]}},
        "latency": {"step_s": 0.02}})


def test_sweep_summary_by_class_is_each_points_class_summary():
    sc = _scenario()
    res = fastsim.sweep(sc, {"workload.arrival_rate": [2.0, 4.0]}, n_replications=6, seed=3)
    out = res.summary(by="class")
    assert list(out.columns[:3]) == ["point", "workload.arrival_rate", "class"]
    for i, r in enumerate(res.results):
        part = out[out["point"] == i].drop(columns=["point", "workload.arrival_rate"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(part, r.summary(by="class").reset_index(drop=True))
        assert (out.loc[out["point"] == i, "workload.arrival_rate"] == [2.0, 4.0][i]).all()
    assert set(out["class"]) == {"short", "mid", "long"}
    with pytest.raises(ValueError, match="by"):
        res.summary(by="replica")


def test_cli_run_and_sweep_by_class(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    out = tmp_path / "classes.csv"
    assert main(["run", str(path), "--replications", "5", "--seed", "2", "--no-progress", "--by", "class",
                 "--format", "csv", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = pd.read_csv(out)
    want = fastsim.replicate(_scenario(), n_replications=5, seed=2).summary(by="class")
    np.testing.assert_allclose(saved["estimate"], want["estimate"], rtol=1e-12)
    assert list(saved["class"]) == list(want["class"]) and "short" in printed
    sw = tmp_path / "sweep.csv"
    assert main(["sweep", str(path), "--grid", "workload.arrival_rate=2,4", "--replications", "5", "--seed", "2",
                 "--no-progress", "--by", "class", "--out", str(sw)]) == 0
    table = pd.read_csv(sw)
    assert set(table["class"]) == {"short", "mid", "long"} and set(table["point"]) == {0, 1}


def test_cli_by_class_without_classes_is_an_error(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(TOML.replace('classes = {by = "prompt_len", edges = [64, 128], names = ["short", "mid", "long"]}\n',
                                 ""))
    assert main(["run", str(path), "--replications", "3", "--no-progress", "--by", "class"]) == 2
    assert "classes" in capsys.readouterr().err


def test_toml_sessions_table(tmp_path):
    text = TOML.replace("arrival_rate = 3.0", "max_concurrency = 3").replace(
        'classes = {by = "prompt_len", edges = [64, 128], names = ["short", "mid", "long"]}',
        'sessions = {turns = {dist = "geometric", mean = 3.0}, think_time_s = 0.5, think_time_dist = "exponential"}')
    path = tmp_path / "s.toml"
    path.write_text(text)
    sc = fastsim.Scenario.from_dict(tomllib.loads(text))
    assert sc.workload.sessions == fastsim.Sessions(turns=fastsim.Geometric(mean_len=3.0), think_time_s=0.5,
                                                    think_time_dist="exponential")
    assert main(["run", str(path), "--replications", "3", "--no-progress"]) == 0
    bad = tmp_path / "b.toml"
    bad.write_text(text.replace("think_time_dist", "think_dist"))
    with pytest.raises(ValueError, match="think_dist"):
        fastsim.Scenario.from_dict(tomllib.loads(bad.read_text()))
