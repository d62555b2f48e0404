"""The README and the docs as written (issue 42): the README's code blocks run,
its quick-start output is what `fastsim demo` prints, every TOML block of the
TOML reference is a valid scenario file, docs/study-tools.md runs top to
bottom, every Python block of the docs
parses, and relative links point at files that exist."""

import ast
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fastsim import _cli
from fastsim._cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: Pages that other changes add, linked from here already (none now).
PENDING_PAGES = set()

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def blocks(path, lang):
    return [body for kind, body in FENCE.findall(path.read_text()) if kind == lang]


@pytest.fixture
def shim(tmp_path):
    """A ``fastsim`` command on PATH that runs this checkout's CLI."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "fastsim"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m fastsim._cli \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["MPLBACKEND"] = "Agg"
    return env


def test_readme_is_for_a_user():
    lines = README.read_text().splitlines()
    assert 180 <= len(lines) <= 280, len(lines)
    text = README.read_text()
    for needed in ("pip install -e . && fastsim demo", 'pip install -e ".[test]" && pytest', "fastsim-llm",
                   "docs/toml-reference.md", "docs/deployment.md", "docs/architecture.md"):
        assert needed in text, needed


def test_readme_shell_blocks_run_as_written(tmp_path, shim):
    shell = blocks(README, "bash")
    setup = [b for b in shell if "pip install" in b]
    assert len(setup) == 1   # the two set-up commands: CI (.ci/run) runs them on a fresh clone
    for body in shell:
        if body in setup:
            continue
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=shim,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"{body}\n{res.stderr}"
        assert "Traceback" not in res.stderr
    assert (tmp_path / "summary.csv").is_file() and (tmp_path / "ttft.png").is_file()


def test_readme_python_blocks_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    for body in blocks(README, "python"):
        exec(compile(body, str(README), "exec"), namespace)
    assert namespace["precise"].relative_half_width("ttft_p99") <= 0.01


def test_readme_quick_start_output_is_what_demo_prints(capsys):
    shown = next(b for b in blocks(README, "text") if b.startswith("a10g-qwen2.5-1.5b"))
    assert main(["demo"]) == 0
    printed = capsys.readouterr().out.splitlines()
    # every line but the first (its wall time varies) and the closing note, as printed
    assert shown.splitlines()[1:] == printed[1:len(shown.splitlines())]
    assert shown.splitlines()[0].split(", 0.")[0] == printed[0].rsplit(", ", 1)[0]


def test_toml_reference_blocks_are_valid_scenarios(tmp_path):
    page = ROOT / "docs" / "toml-reference.md"
    (tmp_path / "lengths.csv").write_text("prompt_len,output_len\n100,20\n300,40\n50,200\n")
    (tmp_path / "prompts.csv").write_text("prompt_len\n100\n300\n50\n")
    found = blocks(page, "toml")
    assert len(found) >= 8
    for i, body in enumerate(found):
        path = tmp_path / f"b{i}.toml"
        path.write_text(body)
        scenario, run, cfg = _cli._load_config(path)
        assert set(cfg) <= {"name", "engine", "workload", "latency", "slo", "run", "fleet", "deployment"}
    # the tables' key lists are the code's
    text = page.read_text()
    from fastsim._config import table_keys

    for table in ("engine", "workload", "latency", "slo", "deployment"):
        section = text.split(f"## `[{table}]`")[1].split("\n## ")[0]
        for key in table_keys(table):
            assert f"`{key}`" in section, (table, key)
    run = text.split("## `[run]`")[1]
    for key in _cli.RUN_KEYS:
        assert f"`{key}`" in run, key


def test_docs_python_blocks_parse():
    for page in [README, *DOCS]:
        for body in blocks(page, "python"):
            ast.parse(body, str(page))


def test_relative_links_resolve():
    link = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
    missing = []
    for page in [README, *DOCS, ROOT / "benchmarks" / "README.md", ROOT / "experiments" / "README.md"]:
        for target, _ in link.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (page.parent / target).resolve()
            rel = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(resolved)
            if not resolved.exists() and rel not in PENDING_PAGES:
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_toml_reference_example_runs(tmp_path, capsys):
    body = blocks(ROOT / "docs" / "toml-reference.md", "toml")[0]
    path = tmp_path / "a.toml"
    path.write_text(body)
    assert main(["run", str(path), "--replications", "20", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "a10g, lognormal load, 6 req/s: 20 replications" in out.out and "warning" not in out.err
    assert tomllib.loads(body)["run"]["seed"] == 7


def test_study_tools_blocks_run_as_written(tmp_path, shim, monkeypatch):
    """docs/study-tools.md is a tutorial that runs top to bottom: its shell block, then its Python
    blocks in one namespace (the Dask block stays behind its ``__main__`` guard, as in an import)."""
    page = ROOT / "docs" / "study-tools.md"
    for body in blocks(page, "bash"):
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=shim,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"{body}\n{res.stderr}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": "__docs__"}
    for body in blocks(page, "python"):
        exec(compile(body, str(page), "exec"), namespace)
    assert (tmp_path / "sweep_example.png").is_file() and (tmp_path / "sweep.png").is_file()
    assert namespace["cap"].rate > 0


def test_tutorial_runs_as_written(monkeypatch, tmp_path):
    """docs/tutorial.md: its Python blocks in order, in one namespace; each printed table is the
    one on the page (the runs are seeded, so they are the same on every machine that gives the
    kernel's results)."""
    import contextlib
    import io

    page = ROOT / "docs" / "tutorial.md"
    code, shown = blocks(page, "python"), blocks(page, "text")
    assert len(code) == 4 and len(shown) == 3
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    printed = []
    for body in code:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(body, str(page), "exec"), namespace)
        if out.getvalue():
            printed.append(out.getvalue())
    assert len(printed) == 3
    for got, want in zip(printed, shown):
        assert [line.rstrip() for line in got.splitlines()] == [line.rstrip() for line in want.splitlines()]


def test_mkdocs_site_lists_every_page():
    """mkdocs.yml's nav names every page of docs/ that exists (the strict build, in .ci/run,
    checks links and the API reference; pages still to come from other changes are exempt)."""
    config = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS:
        assert f" {page.name}" in config, page.name


def test_deployment_page_first_block_runs_as_written(capsys):
    """docs/deployment.md's first Python block (a deployment described as vLLM
    is launched, and a scenario from it) runs as written. (Its second block
    reads the user's own benchmark files: parsed only, above.)"""
    first = blocks(ROOT / "docs" / "deployment.md", "python")[0]
    namespace = {}
    exec(compile(first, "docs/deployment.md", "exec"), namespace)
    dep, sc = namespace["dep"], namespace["sc"]
    assert dep.num_gpu_blocks > 0 and sc.engine.num_gpu_blocks == dep.num_gpu_blocks
    assert f"{dep.num_gpu_blocks} blocks" in capsys.readouterr().out   # the printed memory breakdown


def test_fleets_page_runs_as_written_and_gives_its_figures():
    """docs/fleets.md: its Python blocks in order, in one namespace, and the
    figures its text quotes are the ones they give (seeded runs: the same on
    every machine that gives the kernel's results)."""
    page = ROOT / "docs" / "fleets.md"
    namespace = {"__name__": "__docs__"}
    for body in blocks(page, "python"):
        exec(compile(body, str(page), "exec"), namespace)
    text = page.read_text()
    est = namespace["res"].summary()["estimate"]
    assert f"p99 TTFT {est['ttft_p99']:.3f} s" in text and f"CV of {est['requests_per_replica_cv']:.3f}" in text
    d = namespace["cmp"].summary().set_index(["scenario", "metric"])["difference"]
    for scen, metric, fmt in (("weighted", "ttft_mean", "{:+.4f}"), ("weighted", "ttft_p99", "{:+.4f}"),
                              ("weighted", "prefix_hit_rate", "{:+.3f}"), ("jsq", "ttft_p99", "{:+.3f}"),
                              ("prefix_affinity", "prefix_hit_rate", "{:+.3f}")):
        assert fmt.format(d[scen, metric]) in text, (scen, metric)
    assert namespace["cap"].replicas == 6 and "needs **6** replicas" in text
    closed = namespace["closed"].summary()["estimate"]
    assert f"{closed['request_throughput']:.1f} req/s" in text and f"p99 TTFT {closed['ttft_p99']:.3f} s" in text
    split = namespace["split"].summary()["estimate"]
    assert (f"p99 TTFT {split['ttft_p99']:.3f} s, mean TPOT {1e3 * split['tpot_mean']:.1f} ms, "
            f"{1e3 * split['kv_transfer_mean']:.1f} ms a KV transfer") in text
