"""Estimators and confidence intervals over independent replications."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import check_float


@dataclass(frozen=True)
class ConfidenceInterval:
    """A two-sided confidence interval ``[low, high]``."""

    low: float
    high: float

    def __post_init__(self):
        # Python floats, however computed (a NumPy scalar would print as np.float64(...))
        object.__setattr__(self, "low", float(self.low))
        object.__setattr__(self, "high", float(self.high))

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0

    def __contains__(self, value) -> bool:
        return bool(self.low <= value <= self.high)


def t_quantile(df, p):
    """Student's t quantile (``scipy.stats.t.ppf``); SciPy is imported here,
    on first use, not by ``import fastsim`` (``scipy.special`` alone is about
    0.3 s of the import)."""
    from scipy import special

    return special.stdtrit(df, p)


def check_confidence_level(value) -> float:
    return check_float("confidence_level", value, low=0, high=1, low_open=True, high_open=True)


def mean_interval(x, confidence_level: float = 0.95):
    """Mean of the finite entries of ``x`` with a Student-t interval.

    Replications are independent and identically distributed, so the
    t-interval on their mean is exact for normal data and asymptotically
    exact otherwise (replication/deletion method).

    Returns
    -------
    estimate, low, high, std_error, n : float, float, float, float, int
    """
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    n = x.size
    if n == 0:
        return np.nan, np.nan, np.nan, np.nan, 0
    est = float(x.mean())
    if n == 1:
        return est, np.nan, np.nan, np.nan, 1
    se = float(x.std(ddof=1) / np.sqrt(n))
    q = t_quantile(n - 1, 0.5 + confidence_level / 2.0)
    return est, est - q * se, est + q * se, se, n


def prediction_band(x, level: float = 0.95):
    """The central ``level`` band of the finite entries of ``x``: its
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles (linear
    interpolation). Over replications, where one more run (one benchmark
    run) falls with probability about ``level``: it does not shrink with more
    replications, as the confidence interval of the mean does.

    Returns
    -------
    low, high : float
    """
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return np.nan, np.nan
    lo, hi = np.quantile(x, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def summary_frame(per_replication, metrics, confidence_level: float = 0.95, bands: bool = False):
    """Tidy summary: one row per metric with estimate, CI, standard error, n
    and, with ``bands``, the single-run prediction band at the same level
    (``band_low``, ``band_high``: `prediction_band`)."""
    import pandas as pd

    rows = {m: mean_interval(per_replication[m].to_numpy(), confidence_level) for m in metrics}
    frame = pd.DataFrame.from_dict(rows, orient="index",
                                   columns=["estimate", "ci_low", "ci_high", "std_error", "n"])
    frame.index.name = "metric"
    frame["n"] = frame["n"].astype(int)
    if bands:
        b = [prediction_band(per_replication[m].to_numpy(), confidence_level) for m in metrics]
        frame["band_low"] = [x[0] for x in b]
        frame["band_high"] = [x[1] for x in b]
    return frame
