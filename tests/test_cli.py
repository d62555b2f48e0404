"""The command line (issue 42): --version, compare/capacity/calibrate, TOML
errors, warnings, the demo table, interruption (SIGINT/SIGTERM), a closed
pipe and output paths that cannot be written (issue 43)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim import _cli
from fastsim._cli import EXAMPLE, main

ROOT = Path(__file__).resolve().parents[1]

SMALL_TOML = """
name = "small"
[engine]
max_num_seqs = 16
num_gpu_blocks = 4000
[workload]
arrival_rate = 3.0
num_requests = 200
warmup_requests = 20
prompt_len = {dist = "lognormal", median = 200, sigma = 0.5}
output_len = {dist = "lognormal", median = 60, sigma = 0.6}
[slo]
ttft_s = 0.5
tpot_s = 0.05
[run]
n_replications = 20
seed = 3
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL_TOML)
    return path


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _spawn(*args, cwd):
    return subprocess.Popen([sys.executable, "-m", "fastsim._cli", *args], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ------------------------------------------------------------------------------
# --version, TOML errors, warnings, the table

def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fastsim {fastsim.__version__} ") and "fastsim-llm" in out


@pytest.mark.parametrize("text, message", [
    ("[engine]\nmax_num_seq = 4\n", "[engine]: unknown key 'max_num_seq' (did you mean 'max_num_seqs'?); "
                                    "allowed keys: max_num_seqs, max_num_batched_tokens, block_size"),
    ("[engine]\nmax_num_seqs = 0\n", "[engine] max_num_seqs must be an integer >= 1, got 0"),
    ("[workload]\narival_rate = 2\n", "[workload]: unknown key 'arival_rate' (did you mean 'arrival_rate'?); "
                                      "allowed keys: arrival_rate, num_requests"),
    ("[workload]\narrival_rate = -2\n", "[workload] arrival_rate must be"),
    ("[latency]\nbase = 0.01\n", "[latency]: unknown key 'base' (did you mean 'base_s'?); allowed keys: base_s,"),
    ("[slo]\nttft = 0.5\n", "[slo]: unknown key 'ttft' (did you mean 'ttft_s'?); allowed keys: ttft_s, tpot_s"),
    ("[slo]\nttft_s = -1\n", "[slo] ttft_s must be a finite number > 0"),
    ("[run]\nreplications = 5\n", "[run]: unknown key 'replications' (did you mean 'n_replications'?); "
                                  "allowed keys: n_replications, seed"),
    ("workload = 3\n", "[workload] must be a table of key = value settings, got 3"),
    ("[engin]\n", "TOML top level: unknown key 'engin' (did you mean 'engine'?)"),
    # issue 43: clear errors, not tracebacks
    ("[workload]\ntrace = 5\n", "[workload] trace must be a CSV file name, or a table"),
    ("[workload]\ntrace = {order = \"sample\"}\n", "[workload] trace needs path = \"file.csv\""),
    ("[workload]\ntrace = {path = \"t.csv\", ordr = \"sample\"}\n",
     "[workload] [trace]: unknown key 'ordr' (did you mean 'order'?); allowed keys: path, order, nrows"),
    ("[workload]\nprompt_len = {dist = \"mixture\", components = 5}\n",
     "[workload] prompt_len.components must be a non-empty list of length laws"),
    ("[workload]\nprompt_len = {dist = \"lognormal\", median = 100, sigmaa = 1}\n",
     "[workload] prompt_len: unknown key(s) ['sigmaa'] for dist = 'lognormal'; allowed: dist, median, sigma"),
    ("[engine]\npolicy = \"sjf\"\nlength_predictor = {sigm = 1}\n",
     "[engine] [length_predictor]: unknown key 'sigm' (did you mean 'sigma'?)"),
])
def test_toml_errors_name_the_table_and_key(tmp_path, capsys, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["run", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastsim: error: ") and message in err, err
    assert "Traceback" not in err


def test_every_table_lists_its_allowed_keys():
    from fastsim._config import table_keys

    for table in ("engine", "workload", "latency", "slo"):
        keys = table_keys(table)
        with pytest.raises(ValueError, match=rf"^\[{table}\]: unknown key 'qqq'; allowed keys: "
                                             rf"{', '.join(keys)}$"):
            fastsim.Scenario.from_dict({table: {"qqq": 1}})   # (no key near it: no "did you mean")
        # every key listed is accepted as a key (a bad value may still be refused, by name)
        for key in keys:
            try:
                fastsim.Scenario.from_dict({table: {key: None}})
            except ValueError as exc:
                assert "unknown key" not in str(exc), (table, key, exc)


@pytest.mark.parametrize("text, warning", [
    ("", "the file sets no [engine], [workload], [latency] or [slo] value"),
    ("[run]\nseed = 1\n", "the file sets no [engine], [workload], [latency] or [slo] value"),
    ("[engine]\nmax_num_seqs = 256\n[workload]\narrival_rate = 1.0\n", "every value in the file is a default"),
    ("[slo]\nttft_s = 500\n", "[slo] ttft_s = 500 is in seconds (500 s); if you meant 500 ms, write ttft_s = 0.5"),
    ("[slo]\ntpot_s = 50\n", "[slo] tpot_s = 50 is in seconds (50 s); if you meant 50 ms, write tpot_s = 0.05"),
    ("[engine]\nenable_prefix_caching = false\n[workload]\nprefix_groups = 4\nprefix_len = 32\n",
     "[workload] prefix_groups is set but [engine] enable_prefix_caching = false"),
])
def test_warnings(tmp_path, capsys, text, warning):
    path = tmp_path / "w.toml"
    path.write_text(text + "[run]\nn_replications = 3\n" if "[run]" not in text else text)
    assert main(["run", str(path), "--no-progress", "--replications", "3", "--format", "csv"]) == 0
    err = capsys.readouterr().err
    assert f"fastsim: warning: {warning}" in err, err


def test_no_warning_for_a_sound_scenario(small, capsys):
    assert main(["run", str(small), "--no-progress"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_demo_table_has_no_nan_or_pointless_zero_rows(capsys):
    assert main(["demo", "--replications", "20"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out
    assert "[0, 0]" not in out
    assert "not applicable here: prefix_hit_rate (no prefix_groups)" in out
    assert "zero in every replication: " in out and "preemptions_per_request" in out
    goodput = next(line for line in out.splitlines() if line.startswith("goodput"))
    assert goodput.endswith("req/s  (TTFT <= 500 ms and TPOT <= 50 ms)")
    # machine-readable formats keep every metric
    assert main(["demo", "--replications", "5", "--format", "csv"]) == 0
    frame = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out), index_col=0)
    assert set(fastsim.METRIC_DESCRIPTIONS) <= set(frame.index)


def test_compiling_is_announced_only_when_it_compiles(capsys, monkeypatch):
    assert main(["demo", "--replications", "5"]) == 0          # loaded (or compiled) now
    err = capsys.readouterr().err
    assert main(["demo", "--replications", "5"]) == 0
    err = capsys.readouterr().err
    assert "compiling" not in err and "compilation" not in err, err

    def slow(scenario):   # stands in for a compilation (over the 1 s threshold)
        time.sleep(1.5)

    monkeypatch.setattr("fastsim._replicate._prepare_kernel", slow)
    assert main(["demo", "--replications", "5"]) == 0
    err = capsys.readouterr().err
    assert "compiling the simulation kernel (one-off, about" in err and "compiled in 2 s" in err


# ------------------------------------------------------------------------------
# compare, capacity, calibrate

def test_compare(tmp_path, small, capsys):
    other = tmp_path / "sjf.toml"
    other.write_text(SMALL_TOML.replace('name = "small"', 'name = "sjf"')
                     .replace("[engine]\n", "[engine]\npolicy = \"sjf\"\n"))
    out = tmp_path / "cmp.csv"
    assert main(["compare", str(small), str(other), "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "baseline: small" in text and "sjf " in text and "e2e_mean" in text
    # the CLI's numbers are fastsim.compare's on the same seed and replications
    sc = {n: _cli._load(p)[0] for n, p in (("small", small), ("sjf", other))}
    ref = fastsim.compare(sc, n_replications=20, seed=3).frame
    saved = pd.read_csv(out)
    pd.testing.assert_series_equal(saved["difference"], ref["difference"], check_names=False)
    assert main(["compare", str(small), "--no-progress"]) == 2
    assert "compare needs two or more TOML files" in capsys.readouterr().err
    assert main(["compare", str(small), str(other), "--baseline", "nope", "--no-progress"]) == 2
    assert "--baseline must be one of 'small', 'sjf', got 'nope'" in capsys.readouterr().err
    assert main(["compare", str(small), str(other), "--metrics", "ttft_mean,prefix_hit_rate",
                 "--no-progress", "--format", "json"]) == 0
    res = capsys.readouterr()
    assert [r["metric"] for r in json.loads(res.out)] == ["ttft_mean", "prefix_hit_rate"]
    assert "--metrics prefix_hit_rate: cannot apply to this scenario (no prefix_groups)" in res.err


def test_capacity(small, tmp_path, capsys):
    out = tmp_path / "probes.csv"
    args = ["capacity", str(small), "--slo", "ttft_p99=0.3", "--rate-bounds", "1,64", "--replications", "20",
            "--max-replications", "80", "--tol", "0.1"]
    assert main(args + ["--out", str(out)]) == 0
    res = capsys.readouterr()
    text = res.out
    assert "largest rate proven to meet it:" in text
    # ([run] n_replications is `fastsim run`'s: said, not silently dropped)
    assert "note: [run] n_replications not used by capacity (its flags --replications" in res.err
    ref = fastsim.capacity(_cli._load(small)[0], {"ttft_p99": 0.3}, rate_bounds=(1, 64), n_replications=20,
                           max_replications=80, tol=0.1, seed=3)
    assert f"{ref.rate:.4g} req/s" in text
    assert len(pd.read_csv(out)) == len(ref.probes)
    assert main(["capacity", str(small)]) == 2
    assert "give at least one --slo METRIC=LIMIT" in capsys.readouterr().err
    assert main(["capacity", str(small), "--slo", "ttft_p99"]) == 2
    assert "--slo must look like METRIC=LIMIT" in capsys.readouterr().err
    assert main(args[:2] + ["--slo", "ttft_p99=500", "--rate-bounds", "1,2", "--replications", "5",
                            "--max-replications", "5", "--format", "json"]) == 0
    assert "--slo ttft_p99=500 is in seconds; if you meant 500 ms, write ttft_p99=0.5" in capsys.readouterr().err


def test_calibrate_traces_and_bench(tmp_path, capsys):
    from fastsim._calibration import PACKAGED_TRACES, fit_bench_serve, fit_tpot_traces

    out = tmp_path / "lat.toml"
    assert main(["calibrate", str(PACKAGED_TRACES), "--out", str(out)]) == 0
    assert "[latency]" in capsys.readouterr().out
    fit = fit_tpot_traces(PACKAGED_TRACES).latency_model()
    model = fastsim.Scenario.from_dict(__import__("tomllib").loads(out.read_text())).latency
    assert model == fit     # the written table gives back the fitted model exactly

    from test_calibration import simulate_bench

    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(simulate_bench(np.random.default_rng(3), n=200)))
    assert main(["calibrate", str(bench)]) == 0
    text = capsys.readouterr().out
    want = fit_bench_serve(bench).latency_model()
    assert f"base_s = {want.base_s!r}" in text
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    assert main(["calibrate", str(other)]) == 2
    assert "neither a `vllm bench serve" in capsys.readouterr().err
    assert main(["calibrate", str(bench), "--out", str(tmp_path / "x.csv")]) == 2
    assert "--out must end in .toml" in capsys.readouterr().err


# ------------------------------------------------------------------------------
# Output paths (issue 43), cache dir

def test_out_is_probed_and_a_failing_write_falls_back(tmp_path, capsys, monkeypatch, small):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["run", str(small), "--no-progress", "--out", str(blocker / "o.csv")]) == 2
    assert "--out: directory" in capsys.readouterr().err
    assert main(["run", str(small), "--no-progress", "--out", str(tmp_path)]) == 2
    assert "--out must end in .csv" in capsys.readouterr().err

    real = fastsim.ReplicateResult.save
    target = tmp_path / "o.csv"

    def failing(self, path):
        if Path(path) == target:
            raise OSError(28, "No space left on device")
        return real(self, path)

    monkeypatch.setattr(fastsim.ReplicateResult, "save", failing)
    assert main(["run", str(small), "--no-progress", "--out", str(target)]) == 1
    err = capsys.readouterr().err
    assert "No space left on device; written to " in err
    alt = Path(err.split("written to ")[1].split(" instead")[0])
    try:
        assert len(pd.read_csv(alt)) == len(fastsim.METRIC_DESCRIPTIONS)
    finally:
        alt.unlink()


def test_tables_are_written_atomically(tmp_path):
    from fastsim._io import save_table

    path = tmp_path / "t.csv"
    path.write_text("old\n")
    bad = pd.DataFrame({"a": [1]})
    bad.to_csv = None   # a write that fails midway
    with pytest.raises(TypeError):
        save_table(bad, path)
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
    save_table(pd.DataFrame({"a": [1, 2]}), path)
    assert list(pd.read_csv(path)["a"]) == [1, 2]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_cache_dir_that_is_a_file(tmp_path, small, capsys):
    f = tmp_path / "cache"
    f.write_text("x")
    for path in (f, f / "sub"):
        assert main(["sweep", str(small), "--grid", "workload.arrival_rate=1,2", "--cache-dir", str(path),
                     "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "cache_dir" in err and "is a file" in err or "got the file" in err, err


# ------------------------------------------------------------------------------
# Interruption and pipes (subprocesses)

def _wait_for_start(proc, timeout=300.0):
    """Read stderr until the run announces itself (after loading or compiling the kernel)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if "Ctrl-C" in line:
            return seen
    proc.kill()
    raise AssertionError(f"the run never started: {''.join(seen)}")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_a_run_and_keeps_the_finished_replications(tmp_path, signum, code):
    out, per = tmp_path / "summary.csv", tmp_path / "per.parquet"
    proc = _spawn("demo", "--replications", "10000000", "--seed", "5", "--out", str(out),
                  "--per-replication", str(per), cwd=tmp_path)
    seen = _wait_for_start(proc)
    time.sleep(0.5)
    start = time.monotonic()
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=30)
    took = time.monotonic() - start
    assert proc.returncode == code, stderr
    assert took < 5.0, took   # (it stops within a chunk; the bound leaves room for a loaded machine)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "fastsim: interrupted; kept the " in stderr
    assert "PARTIAL: interrupted after " in stdout
    summary = pd.read_csv(out)
    assert summary["partial"].all()
    reps = pd.read_parquet(per)
    n = int(summary.loc[summary.metric == "ttft_mean", "n"].iloc[0])
    assert reps["partial"].all() and len(reps) == n > 0
    # the finished replications are exactly those of an uninterrupted run with the same seed
    ids = reps["replication"].to_numpy()
    sc = _cli._load(EXAMPLE)[0]
    full = fastsim.replicate(sc, int(ids[:50].max()) + 1, seed=5).per_replication
    pd.testing.assert_frame_equal(full.loc[ids[:50]].reset_index(drop=True),
                                  reps.iloc[:50][full.columns].reset_index(drop=True))
    del seen


def test_sigint_stops_a_sweep_and_keeps_the_finished_points(tmp_path):
    config = tmp_path / "demo.toml"
    config.write_text(EXAMPLE.read_text())
    out, cache = tmp_path / "sweep.csv", tmp_path / "cache"
    proc = _spawn("sweep", str(config), "--grid", "workload.arrival_rate=1,2,3,4,5,6,7,8,9,10,11,12",
                  "--replications", "8000", "--out", str(out), "--cache-dir", str(cache), cwd=tmp_path)
    _wait_for_start(proc)
    # wait until a point has finished (joblib.Memory has stored it)
    deadline = time.monotonic() + 300
    while not list(cache.rglob("output.pkl")) and time.monotonic() < deadline:
        time.sleep(0.1)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert time.monotonic() - start < 2.0
    assert "Traceback" not in stderr, stderr
    assert "PARTIAL: interrupted" in stdout
    frame = pd.read_csv(out)
    assert frame["partial"].all()
    points = sorted(frame["point"].unique())
    assert points == list(range(len(points))) and 0 < len(points) < 12   # in process: in order


def test_closed_pipe_ends_quietly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "fastsim._cli", "demo", "--replications", "20", "--format",
                             "json"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()           # the reader is gone before anything is written (`| head -0`)
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    assert proc.returncode == 128 + signal.SIGPIPE


def test_head_reads_the_first_lines(tmp_path):
    cmd = (f"{sys.executable} -m fastsim._cli demo --replications 20 --format csv | head -n 2")
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.stdout.splitlines()[0].startswith("metric,estimate,ci_low,ci_high")
    assert "Traceback" not in res.stderr, res.stderr


def test_interrupted_replicate_keeps_a_prefix_free_subset():
    """Library level: ``fastsim.Interrupted.partial`` holds finished rows, equal to an uninterrupted run's."""
    import threading

    sc = _cli._load(EXAMPLE)[0]
    fastsim.replicate(sc, 4, seed=1)   # load the kernel
    # (2 s: at 0.5 s a loaded CI machine had finished no replication yet; 10 million take hours)
    timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(fastsim.Interrupted) as stop:
        fastsim.replicate(sc, 10_000_000, seed=1, n_threads=2)
    part = stop.value.partial
    assert part.interrupted and 0 < part.n_replications < 10_000_000
    ids = part.per_replication.index.to_numpy()
    some = ids[np.linspace(0, ids.size - 1, 20).astype(int)]
    full = fastsim.replicate(sc, int(some.max()) + 1, seed=1).per_replication
    pd.testing.assert_frame_equal(full.loc[some], part.per_replication.loc[some])


def _children(pid):
    """PIDs whose parent is ``pid`` (Linux /proc)."""
    out = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat_file.parent.name))
    return out


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_sweep_workers_do_not_outlive_a_killed_parent(tmp_path):
    config = tmp_path / "demo.toml"
    config.write_text(EXAMPLE.read_text())
    proc = _spawn("sweep", str(config), "--grid", "workload.arrival_rate=1,2,3,4", "--replications", "200000",
                  "--jobs", "2", cwd=tmp_path)
    _wait_for_start(proc)
    deadline = time.monotonic() + 120
    workers = []
    while time.monotonic() < deadline:
        workers = [c for c in _children(proc.pid)
                   if "LokyProcess" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]
        if len(workers) == 2:
            break
        time.sleep(0.2)
    assert len(workers) == 2, "the loky workers never started"
    time.sleep(3.0)   # they are simulating their points now
    others = [c for c in _children(proc.pid) if c not in workers]
    proc.kill()       # SIGKILL: no handler, no clean-up in the parent
    proc.wait(timeout=10)
    deadline = time.monotonic() + 5.0
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [w for w in workers + others if _alive(w)]
    for pid in left:           # do not leave them behind if the assertion fails
        os.kill(pid, signal.SIGKILL)
    assert not [w for w in workers if w in left], "loky workers outlived their killed parent"


def test_a_signal_delivered_twice_still_keeps_the_finished_replications(tmp_path):
    """`timeout` and process managers signal the process and its group: two SIGTERMs at once are
    one request (a second signal only quits at once, unsaved, a second or more later)."""
    out = tmp_path / "summary.csv"
    proc = _spawn("demo", "--replications", "10000000", "--out", str(out), cwd=tmp_path)
    _wait_for_start(proc)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert "PARTIAL: interrupted after " in stdout and "Traceback" not in stderr
    assert pd.read_csv(out)["partial"].all()
