"""`plot_sweep`: one metric of a sweep against one parameter, with confidence bands."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._replicate import metric_unit

__all__ = ["plot_sweep", "axis_label"]


def axis_label(metric: str) -> str:
    """``metric`` with its unit, e.g. ``ttft_p99 (ms)``."""
    unit, _ = metric_unit(metric)
    return f"{metric} ({unit})" if unit else metric


def plot_sweep(frame: pd.DataFrame, x: str, y: str, hue: str | None = None, ax=None, *, band: bool = True,
               logy: bool = False):
    """Plot metric ``y`` of a sweep against parameter ``x``, one line per value of ``hue``.

    Parameters
    ----------
    frame : pandas.DataFrame
        A :attr:`fastsim.SweepResult.frame` (or the table it was saved as):
        columns ``metric``, ``estimate``, ``ci_low``, ``ci_high`` and the
        parameter columns.
    x : str
        A numeric parameter column (e.g. ``"workload.arrival_rate"``).
    y : str
        A metric in ``frame["metric"]`` (e.g. ``"ttft_p99"``). Latencies are
        drawn in ms, as in the CLI's table.
    hue : str, optional
        A parameter column: one line per value. Without it, every other
        parameter must be constant (one line).
    ax : matplotlib.axes.Axes, optional
        Draw here (default: a new figure).
    band : bool
        Shade the confidence interval (``ci_low`` to ``ci_high``); False:
        error bars.
    logy : bool
        Logarithmic y axis (latencies past saturation grow by orders of magnitude).

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        If a column or the metric is missing, or the lines would mix points.
    """
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"frame must be a pandas DataFrame (a SweepResult.frame), got {type(frame).__name__}")
    needed = {"metric", "estimate", "ci_low", "ci_high"}
    missing = needed - set(frame.columns)
    if missing:
        raise ValueError(f"frame lacks column(s) {sorted(missing)}: not a sweep table")
    params = [c for c in frame.columns if c not in needed | {"point", "std_error", "n"}]
    for name, col in (("x", x), ("hue", hue)):
        if col is not None and col not in params:
            raise ValueError(f"{name}={col!r} is not a parameter column of the sweep; parameters: "
                             f"{', '.join(params)}")
    if hue is not None and hue == x:
        raise ValueError("hue must differ from x")
    metrics = list(dict.fromkeys(frame["metric"]))
    if y not in metrics:
        raise ValueError(f"y={y!r} is not a metric of the sweep; metrics: {', '.join(metrics)}")
    data = frame[frame["metric"] == y]
    if not pd.api.types.is_numeric_dtype(data[x]):
        raise ValueError(f"x={x!r} must be a numeric parameter, got values like {data[x].iloc[0]!r}")
    others = [p for p in params if p not in (x, hue)]
    varying = [p for p in others if data[p].astype(str).nunique() > 1]
    if varying:
        raise ValueError(f"parameter(s) {varying} vary too; pass one as hue, or filter the frame first")

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6.4, 4.2))
    _, scale = metric_unit(y)
    groups = [(None, data)] if hue is None else list(data.groupby(hue, sort=True))
    for value, part in groups:
        part = part.sort_values(x)
        xs = part[x].to_numpy(dtype=float)
        est = part["estimate"].to_numpy(dtype=float) * scale
        lo = part["ci_low"].to_numpy(dtype=float) * scale
        hi = part["ci_high"].to_numpy(dtype=float) * scale
        label = None if hue is None else f"{hue.split('.')[-1]} = {value}"
        line, = ax.plot(xs, est, marker="o", label=label)
        if band:
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.25, linewidth=0)
        else:
            ax.errorbar(xs, est, yerr=[np.maximum(est - lo, 0), np.maximum(hi - est, 0)], fmt="none",
                        ecolor=line.get_color(), capsize=3)
    ax.set_xlabel(f"{x} (req/s)" if x.endswith("arrival_rate") else x)
    ax.set_ylabel(axis_label(y))
    ax.set_title(f"{y}: mean over replications, shaded: confidence interval" if band else
                 f"{y}: mean over replications with confidence intervals", fontsize=10)
    if hue is not None:
        ax.legend(title=None, fontsize=9)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3, which="both" if logy else "major")
    return ax
