"""Shared plumbing of the study experiments in ``experiments/``.

The scripts ``static_vs_continuous.py``, ``scheduling_policies.py``,
``kv_budget_tradeoff.py`` and ``preemption_pressure.py`` share one command
line (``--quick``, ``--seed``, ``--out``), one driver (run, time, write the
tidy CSV, plot, copy the full-mode figure to ``docs/img/exp_<name>.png``,
print the findings) and a few interval estimators. They live here.

The scripts are run as files (``python experiments/<name>.py``) and loaded
by path in ``tests/test_experiments.py``, so each one puts its own directory
on ``sys.path`` before ``import _common``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd
from scipy import stats

#: The repository root (the parent of ``experiments/``).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Confidence level of every interval the experiments report.
LEVEL = 0.95

QUICK_HELP = "small run (seconds) for the test suite"

#: The engine of the measured vLLM runs (``experiments/data``: A10G, 6,822 KV blocks of 16 tokens).
MEASURED_ENGINE = dict(max_num_seqs=64, max_num_batched_tokens=2048, block_size=16, num_gpu_blocks=6822,
                       max_model_len=2048)


# ------------------------------------------------------------------------------------------
# Statistics

def mean_ci(x, level=LEVEL):
    """Mean of the finite values with a Student-t interval.

    Parameters
    ----------
    x : array_like
        Per-replication values; NaN and infinite values are left out.
    level : float, optional
        Two-sided confidence level (default 0.95).

    Returns
    -------
    tuple
        ``(estimate, low, high, n)``: the mean, the interval's bounds (NaN
        when fewer than two finite values remain) and the number of finite
        values used.
    """
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    n = x.size
    est = float(x.mean()) if n else np.nan
    if n < 2:
        return est, np.nan, np.nan, n
    half = stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / np.sqrt(n)
    return est, est - half, est + half, n


def paired_diff_ci(a, b, level=LEVEL):
    """Mean of the paired differences ``a - b`` with a Student-t interval.

    Parameters
    ----------
    a, b : array_like
        Per-replication values of two configurations run on common random
        numbers (replication ``i`` of ``a`` pairs with replication ``i`` of
        ``b``); pairs with a non-finite difference are left out.
    level : float, optional
        Two-sided confidence level (default 0.95).

    Returns
    -------
    tuple
        ``(estimate, low, high, n)`` as in :func:`mean_ci`, of ``a - b``.
    """
    return mean_ci(np.asarray(a, float) - np.asarray(b, float), level)


def ratio_ci(a, b, level=LEVEL):
    """Ratio of paired means ``mean(a) / mean(b)`` with a delta-method interval.

    Parameters
    ----------
    a, b : array_like
        Per-replication values on common random numbers; pairs where either
        value is non-finite are left out.
    level : float, optional
        Two-sided confidence level (default 0.95).

    Returns
    -------
    tuple
        ``(estimate, low, high, n)``: the ratio ``r``, the Student-t interval
        whose standard error is that of the residuals ``a - r b`` divided by
        ``sqrt(n) |mean(b)|``, and the number of pairs used.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    n = a.size
    r = a.mean() / b.mean()
    resid = a - r * b
    se = resid.std(ddof=1) / (np.sqrt(n) * abs(b.mean()))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * se
    return float(r), float(r - half), float(r + half), n


def fmt(row, scale=1.0, digits=3) -> str:
    """Format a table row as ``estimate [ci_low, ci_high]``.

    Parameters
    ----------
    row : pandas.Series
        A row with ``estimate``, ``ci_low`` and ``ci_high``.
    scale : float, optional
        Factor applied to all three values (e.g. ``1e3`` for seconds to ms).
    digits : int, optional
        Significant digits (``g`` format).

    Returns
    -------
    str
    """
    return (f"{row.estimate * scale:.{digits}g} [{row.ci_low * scale:.{digits}g}, "
            f"{row.ci_high * scale:.{digits}g}]")


def save_figure(fig, path: Path, title: str, top: float = 0.96, dpi: int = 100) -> None:
    """Title, lay out, write and close a figure.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure to finish.
    path : Path
        Where to write it.
    title : str
        The figure's suptitle (font size 11).
    top : float, optional
        Top of the tight-layout rectangle, leaving room for the title.
    dpi : int, optional
        Resolution of the written image.
    """
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


# ------------------------------------------------------------------------------------------
# Command line and driver

def parse_args(name: str, doc: str, argv=None, quick_help: str = QUICK_HELP) -> argparse.Namespace:
    """Parse an experiment's command line: ``[--quick] [--seed S] [--out DIR]``.

    Parameters
    ----------
    name : str
        The experiment's name; ``--out`` defaults to
        ``experiments/output/<name>``.
    doc : str
        The script's module docstring; its first paragraph is the description.
    argv : list of str, optional
        Arguments (default: ``sys.argv[1:]``).
    quick_help : str, optional
        Help text of ``--quick``.

    Returns
    -------
    argparse.Namespace
        With ``quick`` (bool), ``seed`` (int) and ``out`` (Path).
    """
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "output" / name)
    return ap.parse_args(argv)


def run_experiment(name: str, doc: str, argv, *, full: dict, quick: dict,
                   run: Callable[[dict, int], pd.DataFrame],
                   plot: Callable[[pd.DataFrame, Path, str], None],
                   findings: Callable[[pd.DataFrame], list],
                   title: Callable[[dict, str, int], str],
                   wrap_indent: Optional[str] = "    ", quick_help: str = QUICK_HELP) -> dict:
    """Run one experiment end to end: the body of every script's ``main(argv)``.

    Parses the command line (:func:`parse_args`), runs ``run(cfg, seed)`` with
    the quick or full sizes (timed), writes ``<out>/<name>.csv`` and
    ``<out>/<name>.png``, copies the figure to ``docs/img/exp_<name>.png`` in
    full mode, and prints a summary line and the findings.

    Parameters
    ----------
    name : str
        The experiment's name (file stem of its outputs).
    doc : str
        The script's module docstring (for ``--help``).
    argv : list of str or None
        Command-line arguments.
    full, quick : dict
        The sizes of the full and ``--quick`` modes, passed to ``run``.
    run : callable
        ``run(cfg, seed) -> DataFrame``: the tidy result table.
    plot : callable
        ``plot(table, path, title)``: writes the figure.
    findings : callable
        ``findings(table) -> list of str``: the printed statements.
    title : callable
        ``title(cfg, mode, seed) -> str``: the figure's title; ``mode`` is
        ``"quick"`` or ``"full"``.
    wrap_indent : str or None, optional
        Continuation indent of findings wrapped at 160 characters (each
        finding is indented by two spaces); ``None`` prints each finding on
        one line.
    quick_help : str, optional
        Help text of ``--quick``.

    Returns
    -------
    dict
        ``table`` (DataFrame), ``findings`` (list of str), ``csv`` and ``png``
        (Path) and ``elapsed_s`` (float, the time spent in ``run``).
    """
    args = parse_args(name, doc, argv, quick_help)
    cfg = quick if args.quick else full
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    table = run(cfg, args.seed)
    elapsed = time.perf_counter() - start
    csv, png = args.out / f"{name}.csv", args.out / f"{name}.png"
    table.to_csv(csv, index=False)
    mode = "quick" if args.quick else "full"
    plot(table, png, title(cfg, mode, args.seed))
    if not args.quick:
        shutil.copyfile(png, ROOT / "docs" / "img" / f"exp_{name}.png")
    lines = findings(table)
    print(f"{name} ({mode}, seed {args.seed}): {len(table)} rows in {elapsed:.1f} s -> {csv}", flush=True)
    for line in lines:
        if wrap_indent is None:
            print("  " + line, flush=True)
        else:
            print("\n".join(textwrap.wrap(line, 160, initial_indent="  ", subsequent_indent=wrap_indent)),
                  flush=True)
    return {"table": table, "findings": lines, "csv": csv, "png": png, "elapsed_s": elapsed}
