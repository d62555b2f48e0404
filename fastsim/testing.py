"""Statistical assertions for fastsim results.

Helpers for tests that compare simulation output with something else:

* :func:`compare_results` / :func:`assert_equivalent`: are two sets of
  independent replications (two backends, two versions of the kernel, a
  refactoring before and after) draws from the same distribution? Each metric
  gets a two-sample Welch t-test on the per-replication values (its mean) and
  a two-sample Kolmogorov-Smirnov test (its whole run-to-run distribution);
  the p-values of all metric x test pairs are corrected together (Holm or
  Bonferroni), so ``alpha`` bounds the probability that *any* metric is
  reported as different when none is (the family-wise error rate).
* :func:`assert_matches_theory`: does a metric's estimate agree with a known
  exact value within ``z`` standard errors?

The two sides of a comparison must be *independent*: two calls of
:func:`fastsim.replicate` with the same seed simulate the same request streams
(common random numbers), so their results are correlated (identical, for two
correct backends) and the tests below would be meaningless. Give each side its
own seed.

Every function accepts a :class:`fastsim.ReplicateResult` or a
:class:`pandas.DataFrame` with one row per replication (such as
``result.per_replication``).

Examples
--------
>>> import fastsim
>>> from fastsim.testing import assert_equivalent
>>> sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=100))
>>> a = fastsim.replicate(sc, n_replications=30, seed=1)
>>> b = fastsim.replicate(sc, n_replications=30, seed=2)
>>> table = assert_equivalent(a, b, metrics=["ttft_mean", "e2e_p99"])
>>> bool(table["equivalent"].all())
True
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
import pandas as pd

from ._queueing import erlang_b, mg1_mean_wait  # noqa: F401  (exact references for checks)
from ._validation import check_choice, check_float

__all__ = ["compare_results", "assert_equivalent", "assert_matches_theory", "erlang_b", "mg1_mean_wait"]

TESTS = ("welch", "ks")
CORRECTIONS = ("holm", "bonferroni", "none")

#: Status values of :func:`compare_results`'s ``status`` column.
STATUSES = {
    "tested": "both sides vary: tested with the requested tests",
    "constant_equal": "every finite value on both sides is the same number: equal, not tested",
    "constant_different": "each side is constant but the constants differ: a difference, not tested",
    "missing_a": "no finite value in result_a but some in result_b: a difference",
    "missing_b": "no finite value in result_b but some in result_a: a difference",
    "skipped": "no finite value on either side (e.g. TPOT with 1-token outputs): skipped",
    "too_few": "fewer than 2 finite values on a side: cannot be tested, skipped",
}


def _per_replication(name, result) -> pd.DataFrame:
    """The per-replication table of a ReplicateResult or a DataFrame."""
    if isinstance(result, pd.DataFrame):
        return result
    frame = getattr(result, "per_replication", None)
    if isinstance(frame, pd.DataFrame):
        return frame
    raise ValueError(f"{name} must be a fastsim.ReplicateResult or a pandas.DataFrame of per-replication "
                     f"values, got {type(result).__name__}")


def _default_metrics(result, frame):
    names = getattr(result, "metrics", None)
    if names is None:
        from .kernel import METRICS

        known = [m for m in METRICS if m in frame.columns]
        names = known or [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])]
    return list(names)


def _check_metrics(metrics, frame_a, frame_b, result_a):
    if metrics is None:
        names = [m for m in _default_metrics(result_a, frame_a) if m in frame_b.columns]
        if not names:
            raise ValueError("metrics must be given: result_a and result_b have no metric column in common")
        return names
    if isinstance(metrics, str):
        metrics = [metrics]
    try:
        names = list(metrics)
    except TypeError:
        raise ValueError(f"metrics must be None, a metric name or a sequence of metric names, "
                         f"got {metrics!r}") from None
    if not names:
        raise ValueError("metrics must not be empty")
    for m in names:
        if not isinstance(m, str):
            raise ValueError(f"metrics must contain column names (str), got {m!r}")
        for side, frame in (("result_a", frame_a), ("result_b", frame_b)):
            if m not in frame.columns:
                raise ValueError(f"metrics: {m!r} is not a column of {side}'s per-replication table")
    if len(set(names)) != len(names):
        raise ValueError(f"metrics must not repeat a name, got {names!r}")
    return names


def _check_tests(tests):
    if isinstance(tests, str):
        tests = (tests,)
    try:
        tests = tuple(tests)
    except TypeError:
        raise ValueError(f"tests must be a sequence of 'welch' and/or 'ks', got {tests!r}") from None
    if not tests:
        raise ValueError("tests must name at least one of 'welch', 'ks'")
    for t in tests:
        check_choice("tests", t, TESTS)
    if len(set(tests)) != len(tests):
        raise ValueError(f"tests must not repeat a name, got {tests!r}")
    return tests


def _finite(frame, metric):
    x = pd.to_numeric(frame[metric], errors="coerce").to_numpy(dtype=float)
    return x[np.isfinite(x)]


def adjust_pvalues(p, method: str = "holm") -> np.ndarray:
    """Family-wise-error corrected p-values.

    Parameters
    ----------
    p : array_like
        Raw p-values (NaN entries are ignored and stay NaN).
    method : {"holm", "bonferroni", "none"}
        Holm's step-down procedure (uniformly more powerful than Bonferroni,
        same guarantee), Bonferroni, or no correction.

    Returns
    -------
    numpy.ndarray
        Adjusted p-values, capped at 1: reject the hypotheses whose adjusted
        p-value is ``<= alpha`` and the family-wise error rate is at most
        ``alpha`` under any dependence between the tests.
    """
    check_choice("method", method, CORRECTIONS)
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    q = p[ok]
    m = q.size
    if m == 0 or method == "none":
        out[ok] = q
        return out
    if method == "bonferroni":
        out[ok] = np.minimum(q * m, 1.0)
        return out
    order = np.argsort(q, kind="stable")
    adj = np.minimum(np.maximum.accumulate((m - np.arange(m)) * q[order]), 1.0)
    res = np.empty(m)
    res[order] = adj
    out[ok] = res
    return out


def compare_results(result_a, result_b, metrics=None, alpha: float = 0.001, *, tests=TESTS,
                    correction: str = "holm") -> pd.DataFrame:
    """Per-metric two-sample tests between two sets of independent replications.

    Parameters
    ----------
    result_a, result_b : ReplicateResult or pandas.DataFrame
        The two samples (one row per replication). They must come from
        independent random streams (different seeds): see the module notes.
    metrics : str or sequence of str, optional
        Columns to compare. Default: every metric of ``result_a``
        (:data:`fastsim.METRIC_DESCRIPTIONS`) present in both; for a plain
        DataFrame without fastsim metric columns, every numeric column.
    alpha : float
        Family-wise error rate in (0, 1): the probability that some metric is
        reported as different when the two samples come from the same
        distribution is at most ``alpha`` (exactly for Bonferroni/Holm with
        valid p-values; the Welch p-value is asymptotic, the KS p-value is
        conservative for discrete metrics).
    tests : sequence of {"welch", "ks"}
        ``"welch"``: Welch's unequal-variance t-test on the means (the
        estimates :meth:`ReplicateResult.summary` reports). ``"ks"``:
        two-sample Kolmogorov-Smirnov test on the per-replication values
        (their whole run-to-run distribution).
    correction : {"holm", "bonferroni", "none"}
        Correction over all metric x test pairs that are tested.

    Returns
    -------
    pandas.DataFrame
        One row per metric (index ``metric``) with ``estimate_a``,
        ``estimate_b`` (means of the finite values), ``difference``
        (``b - a``), ``relative_difference`` (difference / ``|estimate_a|``),
        ``std_error`` (of the difference), ``n_a``, ``n_b``, raw and adjusted
        p-values ``p_welch``, ``p_ks``, ``p_welch_adj``, ``p_ks_adj`` (NaN
        where not tested), ``status`` (see :data:`STATUSES`) and
        ``equivalent`` (False when the metric differs at level ``alpha``).
    """
    from scipy import stats   # here, not at module level: ~1 s of `import fastsim`
    frame_a = _per_replication("result_a", result_a)
    frame_b = _per_replication("result_b", result_b)
    names = _check_metrics(metrics, frame_a, frame_b, result_a)
    alpha = check_float("alpha", alpha, low=0, high=1, low_open=True, high_open=True)
    tests = _check_tests(tests)
    check_choice("correction", correction, CORRECTIONS)

    rows = []
    for m in names:
        x, y = _finite(frame_a, m), _finite(frame_b, m)
        row = {"metric": m, "n_a": x.size, "n_b": y.size,
               "estimate_a": x.mean() if x.size else np.nan, "estimate_b": y.mean() if y.size else np.nan,
               "std_error": np.nan, "p_welch": np.nan, "p_ks": np.nan}
        if x.size == 0 and y.size == 0:
            row["status"] = "skipped"
        elif x.size == 0:
            row["status"] = "missing_a"
        elif y.size == 0:
            row["status"] = "missing_b"
        elif np.ptp(x) == 0 and np.ptp(y) == 0:
            row["status"] = "constant_equal" if x[0] == y[0] else "constant_different"
            row["std_error"] = 0.0
        elif x.size < 2 or y.size < 2:
            row["status"] = "too_few"
        else:
            row["status"] = "tested"
            row["std_error"] = math.sqrt(x.var(ddof=1) / x.size + y.var(ddof=1) / y.size)
            with warnings.catch_warnings():
                # Ties make the exact KS p-value fail (the asymptotic one is fine
                # here), and metrics equal up to rounding in every replication
                # (e.g. TPOT on a one-seat server) make scipy warn about
                # cancellation: both harmless.
                warnings.filterwarnings("ignore", "ks_2samp: Exact calculation unsuccessful")
                warnings.filterwarnings("ignore", "Precision loss occurred in moment calculation")
                if "welch" in tests:
                    row["p_welch"] = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
                if "ks" in tests:
                    row["p_ks"] = float(stats.ks_2samp(x, y).pvalue)
        rows.append(row)
    table = pd.DataFrame(rows).set_index("metric")
    table["difference"] = table["estimate_b"] - table["estimate_a"]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = table["difference"] / table["estimate_a"].abs()
    table["relative_difference"] = rel.where(table["difference"] != 0, 0.0).where(table["difference"].notna())

    raw = table[["p_welch", "p_ks"]].to_numpy().ravel()
    adj = adjust_pvalues(raw, correction).reshape(-1, 2)
    table["p_welch_adj"], table["p_ks_adj"] = adj[:, 0], adj[:, 1]
    rejected = (table["p_welch_adj"] <= alpha) | (table["p_ks_adj"] <= alpha)
    failed = table["status"].isin(["constant_different", "missing_a", "missing_b"])
    table["equivalent"] = ~(rejected | failed)
    table.attrs.update(alpha=alpha, correction=correction, tests=tests,
                       n_tests=int(np.isfinite(raw).sum()))
    cols = ["estimate_a", "estimate_b", "difference", "relative_difference", "std_error", "n_a", "n_b",
            "p_welch", "p_ks", "p_welch_adj", "p_ks_adj", "status", "equivalent"]
    return table[cols]


def _fmt(v):
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and not np.isfinite(v):
        return "nan" if np.isnan(v) else str(v)
    return f"{v:.6g}"


def format_differences(table: pd.DataFrame) -> str:
    """The failure message of :func:`assert_equivalent` for a table from :func:`compare_results`."""
    bad = table[~table["equivalent"]]
    a = table.attrs
    lines = [f"{len(bad)} of {len(table)} metrics differ (family-wise alpha={a.get('alpha', float('nan')):g}, "
             f"{a.get('correction', '?')} correction over {a.get('n_tests', '?')} tests):"]
    for m, r in bad.iterrows():
        lines.append(
            f"  {m}: a={_fmt(r.estimate_a)} (n={r.n_a}), b={_fmt(r.estimate_b)} (n={r.n_b}), "
            f"difference={_fmt(r.difference)} ({_fmt(100 * r.relative_difference)}%), "
            f"se={_fmt(r.std_error)}, p_welch={_fmt(r.p_welch)} (adj {_fmt(r.p_welch_adj)}), "
            f"p_ks={_fmt(r.p_ks)} (adj {_fmt(r.p_ks_adj)}) [{r.status}]")
    return "\n".join(lines)


def assert_equivalent(result_a, result_b, metrics=None, alpha: float = 0.001, *, tests=TESTS,
                      correction: str = "holm") -> pd.DataFrame:
    """Assert that two sets of independent replications have the same distribution, metric by metric.

    Runs :func:`compare_results` and raises if any metric differs at
    family-wise level ``alpha``: a Welch t-test or KS test rejects after the
    correction, the two sides are different constants, or one side has no
    finite value where the other has some. Metrics with no finite value on
    either side are skipped; metrics that are the same constant on both
    sides are equal.

    Parameters
    ----------
    result_a, result_b : ReplicateResult or pandas.DataFrame
        Independent samples (different seeds).
    metrics : str or sequence of str, optional
        See :func:`compare_results`.
    alpha : float
        Family-wise false-alarm probability of the whole assertion.
    tests : sequence of {"welch", "ks"}
    correction : {"holm", "bonferroni", "none"}

    Returns
    -------
    pandas.DataFrame
        The table of :func:`compare_results` (when nothing differs).

    Raises
    ------
    AssertionError
        Listing every metric that differs with both estimates, the
        difference, the relative difference and the raw and adjusted
        p-values.
    """
    table = compare_results(result_a, result_b, metrics, alpha, tests=tests, correction=correction)
    if not table["equivalent"].all():
        raise AssertionError(format_differences(table))
    return table


def assert_matches_theory(result, metric: str, value, z: float = 5.0, *, rtol: float = 1e-9) -> float:
    """Assert that a metric's estimate is within ``z`` standard errors of an exact value.

    Parameters
    ----------
    result : ReplicateResult or pandas.DataFrame
        Independent replications.
    metric : str
        A column of the per-replication table, e.g. ``"ttft_mean"``.
    value : float
        The exact value of the metric's estimand (e.g. from queueing theory).
        Remember that a percentile's estimand is the expected per-run
        percentile of a run of ``num_requests`` requests, not the steady-state
        percentile.
    z : float
        Allowed distance in standard errors of the mean (5: a correct
        simulator fails with probability ~6e-7 for near-normal estimates).
    rtol : float
        Floating-point tolerance: an estimate within ``rtol * |value|`` of
        ``value`` always passes (metrics that are exact up to rounding, such
        as TPOT on a one-seat server, have a standard error of ~1e-17).

    Returns
    -------
    float
        The distance ``(estimate - value) / std_error``, or 0 when the
        estimate equals ``value`` within ``rtol``.

    Raises
    ------
    AssertionError
        If the estimate is farther than ``z`` standard errors and ``rtol``
        from ``value``, or fewer than two replications have a finite value.
    """
    frame = _per_replication("result", result)
    if not isinstance(metric, str) or metric not in frame.columns:
        raise ValueError(f"metric must be a column of the per-replication table, got {metric!r}")
    value = check_float("value", value)
    z = check_float("z", z, low=0, low_open=True)
    rtol = check_float("rtol", rtol, low=0)
    x = _finite(frame, metric)
    if x.size < 2:
        raise AssertionError(f"{metric}: only {x.size} finite per-replication value(s); need at least 2")
    est = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(x.size))
    if abs(est - value) <= rtol * abs(value) or est == value:
        return 0.0
    if se == 0:
        raise AssertionError(f"{metric}: every replication gives {est:.10g}, expected {value:.10g} "
                             f"(difference {est - value:.3g})")
    dist = (est - value) / se
    if not abs(dist) <= z:
        rel = f"{100 * (est - value) / abs(value):.3g}%" if value != 0 else "n/a"
        raise AssertionError(
            f"{metric}: estimate {est:.6g} (n={x.size}, std. error {se:.3g}) differs from the exact value "
            f"{value:.6g} by {est - value:.3g} (relative {rel}), {dist:.2f} standard errors "
            f"(allowed {z:g})")
    return float(dist)
