"""`compare`: scenarios run on common random numbers, with paired confidence intervals."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import save_table
from . import kernel as K
from ._config import Scenario
from ._parallel import check_n_jobs, run_parallel
from ._replicate import _check_backend, _seed_keys, pack_scenario, replicate
from ._stats import ConfidenceInterval, check_confidence_level, mean_interval
from ._validation import check_bool, check_choice, check_int, check_metric_names

__all__ = ["CompareResult", "compare", "paired_difference", "same_workload"]

#: Columns of :attr:`CompareResult.frame`.
COLUMNS = ("scenario", "metric", "estimate", "baseline_estimate", "difference", "ci_low", "ci_high",
           "std_error", "n", "std_error_independent", "variance_reduction", "significant")

# The kernel inputs that shape the request stream (and the measured set).
_WORKLOAD_IPAR = (K.I_ARRIVAL_KIND, K.I_TRACE_MODE, K.I_NUM_REQUESTS, K.I_NORMALIZE_ARRIVALS, K.I_WARMUP,
                  K.I_HAS_HORIZON, K.I_USERS_LO, K.I_USERS_HI, K.I_USER_CAP, K.I_PREFIX, K.I_PRIO_BAND,
                  K.I_MAX_CONCURRENCY, K.I_THINK_EXP, K.I_SESSIONS)
_WORKLOAD_FPAR = (K.F_RATE, K.F_BURSTINESS, K.F_HORIZON, K.F_USER_REQUESTS, K.F_TRACE_WINDOW, K.F_THINK)
_WORKLOAD_ARRAYS = ("arr_times", "lcomp", "lpar", "ltab", "lrange", "trace", "prio_val", "prio_cdf")


def same_workload(a: Scenario, b: Scenario) -> bool:
    """Whether two scenarios' workloads are the same as the kernel sees them.

    Compares every workload input of the kernel: arrival law or times, length
    laws or trace, priorities, ``num_requests``, ``warmup_requests``,
    ``horizon_s`` and ``normalize_arrivals`` (so ``output_len=128`` and
    ``output_len=Fixed(128)`` are the same). With the same seed, two such
    scenarios draw identical request streams in every replication.
    """
    pa, pb = pack_scenario(a), pack_scenario(b)
    if not np.array_equal(pa["ipar"][list(_WORKLOAD_IPAR)], pb["ipar"][list(_WORKLOAD_IPAR)]):
        return False
    if not np.array_equal(pa["fpar"][list(_WORKLOAD_FPAR)], pb["fpar"][list(_WORKLOAD_FPAR)]):
        return False
    return all(pa[k].shape == pb[k].shape and np.array_equal(pa[k], pb[k]) for k in _WORKLOAD_ARRAYS)


def paired_difference(a, b, confidence_level: float = 0.95) -> dict:
    """Paired comparison of per-replication values ``a`` (scenario) and ``b`` (baseline).

    Only replications where both values are finite are used (``n`` of them).

    Returns
    -------
    dict
        ``estimate`` and ``baseline_estimate`` (means of ``a`` and ``b`` over
        those replications), ``difference`` (= ``estimate - baseline_estimate``),
        ``ci_low``/``ci_high`` (Student-t interval of the mean of ``a - b``,
        from :func:`fastsim._stats.mean_interval`), ``std_error`` (of the
        paired difference), ``n``, ``std_error_independent`` (the standard
        error the difference would have with independent streams and the same
        per-replication variances, ``sqrt((var(a) + var(b)) / n)``),
        ``variance_reduction`` (``(var(a) + var(b)) / var(a - b)``: > 1 when
        common random numbers help; ``inf`` when the difference is constant
        but the values vary, ``nan`` when nothing varies) and ``significant``
        (the interval excludes 0).
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-d arrays of the same length (one value per replication), "
                         f"got shapes {a.shape} and {b.shape}")
    both = np.isfinite(a) & np.isfinite(b)
    a, b = a[both], b[both]
    n = int(a.size)
    nan = math.nan
    row = dict(estimate=nan, baseline_estimate=nan, difference=nan, ci_low=nan, ci_high=nan, std_error=nan,
               n=n, std_error_independent=nan, variance_reduction=nan, significant=False)
    if n == 0:
        return row
    est_a, est_b = float(a.mean()), float(b.mean())
    # mean(a - b) and mean(a) - mean(b) agree up to rounding; report the latter so that
    # the table is exactly self-consistent, with the interval's width from the paired
    # differences.
    diff = est_a - est_b
    row.update(estimate=est_a, baseline_estimate=est_b, difference=diff)
    if n < 2:
        return row
    d_est, d_low, _, d_se, _ = mean_interval(a - b, confidence_level)
    half = d_est - d_low
    var_indep = float(a.var(ddof=1) + b.var(ddof=1))
    var_paired = float((a - b).var(ddof=1))
    if var_paired > 0:
        vrf = var_indep / var_paired
    else:
        vrf = math.inf if var_indep > 0 else nan
    low, high = diff - half, diff + half
    row.update(ci_low=low, ci_high=high, std_error=d_se, std_error_independent=math.sqrt(var_indep / n),
               variance_reduction=vrf, significant=bool(low > 0 or high < 0))
    return row


@dataclass(eq=False)
class CompareResult:
    """Result of :func:`compare`.

    Attributes
    ----------
    frame : pandas.DataFrame
        Tidy: one row per (non-baseline scenario, metric), columns
        ``scenario``, ``metric``, ``estimate`` (the scenario's mean),
        ``baseline_estimate``, ``difference`` (scenario - baseline),
        ``ci_low``/``ci_high`` (paired Student-t interval of the difference),
        ``std_error`` (paired), ``n`` (replications where both values are
        finite; all estimates use these), ``std_error_independent`` (what the
        difference's standard error would be from independent streams),
        ``variance_reduction`` (``(var(a) + var(b)) / var(a - b)``) and
        ``significant`` (the interval excludes 0). See :func:`paired_difference`.
    results : dict of str to ReplicateResult
        Every scenario's result, baseline included, all with the same seed.
    baseline : str
    seed : int or numpy.random.SeedSequence
        The seed every scenario was run with (pass it back to reproduce).
    confidence_level : float
    elapsed_s : float
    """

    frame: pd.DataFrame
    results: dict
    baseline: str
    seed: object
    confidence_level: float
    elapsed_s: float = 0.0

    def to_frame(self) -> pd.DataFrame:
        """A copy of :attr:`frame`."""
        return self.frame.copy()

    def summary(self, by: str | None = None) -> pd.DataFrame:
        """The paired differences: :attr:`frame`, or with ``by="class"`` (a
        workload with ``classes``) one row per (scenario, class, per-class
        metric, `fastsim._classes.CLASS_METRICS`), a ``class`` column after
        ``scenario``, each difference paired over the replications in which
        both runs have the class."""
        if by is None:
            return self.to_frame()
        check_choice("by", by, ("class",))
        from ._classes import CLASS_METRICS

        base = self.results[self.baseline].per_class
        if base is None:
            raise ValueError("summary(by='class') needs a workload with classes (Workload(classes=...)), "
                             "got one without")
        rows = []
        for name, res in self.results.items():
            if name == self.baseline:
                continue
            for cls, part in res.per_class.groupby("class", sort=False):
                b = base[base["class"] == cls].set_index("replication")
                p = part.set_index("replication")
                common = p.index.intersection(b.index)
                for m in CLASS_METRICS:
                    row = paired_difference(p.loc[common, m].to_numpy(dtype=float),
                                            b.loc[common, m].to_numpy(dtype=float), self.confidence_level)
                    rows.append({"scenario": name, "class": cls, "metric": m, **row})
        return pd.DataFrame(rows, columns=["scenario", "class"] + list(COLUMNS[1:]))

    def _row(self, scenario: str, metric: str) -> pd.Series:
        rows = self.frame[(self.frame["scenario"] == scenario) & (self.frame["metric"] == metric)]
        if rows.empty:
            names = [s for s in self.results if s != self.baseline]
            check_choice("scenario", scenario, names)
            check_choice("metric", metric, tuple(self.frame["metric"].unique()))
        return rows.iloc[0]

    def difference(self, scenario: str, metric: str) -> float:
        """Mean difference ``scenario - baseline`` of one metric."""
        return float(self._row(scenario, metric)["difference"])

    def confidence_interval(self, scenario: str, metric: str) -> ConfidenceInterval:
        """The paired interval of ``scenario - baseline`` for one metric."""
        row = self._row(scenario, metric)
        return ConfidenceInterval(row["ci_low"], row["ci_high"])

    def save(self, path) -> Path:
        """Write :attr:`frame` to ``.csv``, ``.json`` or ``.parquet`` (by suffix)."""
        return save_table(self.frame, path)

    def _repr_html_(self) -> str:
        """A notebook's view: each scenario's difference from the baseline with its paired interval."""
        from ._replicate import metric_unit

        f = self.frame
        rows = []
        for r in f.itertuples():
            unit, k = metric_unit(r.metric)
            diff = (f"{r.difference * k:+.4g} [{r.ci_low * k:+.4g}, {r.ci_high * k:+.4g}]"
                    if np.isfinite(r.difference) else "n/a")
            rows.append(f"<tr><td>{r.scenario}</td><td>{r.metric}</td><td>{r.baseline_estimate * k:.4g}</td>"
                        f"<td>{r.estimate * k:.4g}</td><td>{diff}</td><td>{unit}</td>"
                        f"<td>{'yes' if r.significant else ''}</td></tr>")
        return (f"<div><p>baseline <b>{self.baseline}</b>, paired {self.confidence_level:.0%} intervals "
                f"(common random numbers)</p><table><thead><tr><th>scenario</th><th>metric</th><th>baseline</th>"
                f"<th>scenario</th><th>difference</th><th>unit</th><th>interval excludes 0</th></tr></thead>"
                f"<tbody>{''.join(rows)}</tbody></table></div>")

    def __repr__(self):
        others = [s for s in self.results if s != self.baseline]
        return (f"CompareResult(baseline={self.baseline!r}, scenarios={others}, "
                f"confidence_level={self.confidence_level})")


def _compare_iv(scenarios, n_replications, baseline, confidence_level, metrics, allow_different_workloads,
                n_jobs):
    if not isinstance(scenarios, dict) or len(scenarios) < 2:
        raise ValueError(f"scenarios must be a dict {{name: Scenario}} with at least 2 entries, got {scenarios!r}")
    for name, sc in scenarios.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"scenario names must be non-empty strings, got {name!r}")
        if not isinstance(sc, Scenario):
            raise ValueError(f"scenarios[{name!r}] must be a fastsim.Scenario, got {type(sc).__name__}")
    names = tuple(scenarios)
    baseline = names[0] if baseline is None else check_choice("baseline", baseline, names)
    n_replications = check_int("n_replications", n_replications, low=2)
    confidence_level = check_confidence_level(confidence_level)
    allowed = K.METRICS
    if all(sc.fleet is not None and getattr(sc.fleet, "autoscaler", None) is not None for sc in scenarios.values()):
        allowed += K.AUTOSCALE_COLUMNS   # (autoscaled fleets: GPU-hours and SLO-violation minutes too)
    metrics = check_metric_names(metrics, allowed)
    allow_different_workloads = check_bool("allow_different_workloads", allow_different_workloads)
    n_jobs = check_n_jobs(n_jobs)
    if not allow_different_workloads:
        base = scenarios[baseline]
        differ = [name for name in names if name != baseline and not same_workload(scenarios[name], base)]
        if differ:
            raise ValueError(f"the workloads of {differ} differ from the baseline {baseline!r}'s, so their "
                             f"request streams are not common random numbers; compare scenarios that differ "
                             f"only in engine, latency or SLO settings, or pass allow_different_workloads=True")
    _warn_unserved(scenarios, baseline)
    return baseline, n_replications, confidence_level, metrics, n_jobs


def _warn_unserved(scenarios, baseline) -> None:
    """Warn (UserWarning) of scenarios that differ from the baseline only in
    an engine or latency model their fleet does not run (it lists its own
    servers: the scenario's engine only draws the stream)."""
    from ._fleet import serves_scenario_engine

    base = scenarios[baseline]
    same = [name for name, sc in scenarios.items()
            if name != baseline and sc.fleet is not None and sc.fleet == base.fleet
            and (sc.engine != base.engine or sc.latency != base.latency)
            and not serves_scenario_engine(sc)]
    if same:
        import warnings

        warnings.warn(f"scenarios {same} differ from the baseline {baseline!r} in the scenario's engine or latency "
                      f"only, which their fleet does not run (it lists its own servers; the scenario's engine only "
                      f"draws the stream): change the fleet's entries instead", UserWarning, stacklevel=4)


def _run_scenario(scenario, n_replications, seed, confidence_level, backend="numba"):
    return replicate(scenario, n_replications, seed=seed, confidence_level=confidence_level, backend=backend,
                     progress=False)


def compare(scenarios: dict, n_replications: int = 1000, *, seed=None, baseline: str | None = None,
            confidence_level: float = 0.95, metrics=None, allow_different_workloads: bool = False,
            n_jobs: int = 1, progress: bool | None = None, backend: str = "numba") -> CompareResult:
    """Compare scenarios on common random numbers: paired differences with intervals.

    Every scenario is run with the same ``seed``, so replication ``r`` of every
    scenario simulates the same request stream (arrivals, lengths,
    priorities): streams are keyed by the seed, the replication and the
    workload only, never by engine, latency or SLO settings. The difference
    ``scenario - baseline`` of each metric is then estimated from the
    per-replication differences, whose variance is usually far smaller than
    that of two independent runs' values (``variance_reduction``).

    Parameters
    ----------
    scenarios : dict of str to Scenario
        At least two named scenarios with the same workload.
    n_replications : int
        Replications per scenario.
    seed : None, int, numpy.random.SeedSequence or numpy.random.Generator
        The seed every scenario is run with (``replicate(sc, n, seed=seed)``
        gives the same per-replication values).
    baseline : str, optional
        The scenario the others are compared with (default: the first).
    confidence_level : float
        Level of the paired intervals.
    metrics : list of str, optional
        Metrics to compare (default: all of :data:`~fastsim.METRIC_DESCRIPTIONS`).
    allow_different_workloads : bool
        Compare scenarios whose workloads differ (their streams are then only
        partly common, and the paired interval is still valid but the variance
        reduction may be small).
    n_jobs : int
        Worker processes for the scenarios (-1: all cores); does not change
        the results.
    progress : bool, optional
        A progress bar over scenarios (default: when the total work is
        >= 5 million request-replications).
    backend : {"numba", "cuda", "reference"}
        Passed to :func:`~fastsim.replicate`.

    Returns
    -------
    CompareResult
        ``.frame``: one row per (non-baseline scenario, metric).

    Raises
    ------
    ValueError
        For bad arguments, an unknown ``baseline``, or (unless
        ``allow_different_workloads=True``) scenarios whose workloads differ.

    Examples
    --------
    >>> import fastsim
    >>> sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=3.0, num_requests=150,
    ...                                                 output_len=fastsim.LogNormal(60, 0.8)))
    >>> res = fastsim.compare({"fcfs": sc, "sjf": sc.replace(**{"engine.policy": "sjf"})},
    ...               n_replications=20, seed=0, metrics=["ttft_mean", "e2e_mean"])
    >>> list(res.frame["scenario"]), list(res.frame["metric"])
    (['sjf', 'sjf'], ['ttft_mean', 'e2e_mean'])
    """
    start = time.perf_counter()
    baseline, n_replications, confidence_level, metrics, n_jobs = _compare_iv(
        scenarios, n_replications, baseline, confidence_level, metrics, allow_different_workloads, n_jobs)
    _check_backend(backend)
    _, _, seed_value = _seed_keys(seed)   # one seed for all (a Generator or None is drawn once)
    names = list(scenarios)
    if progress is None:
        progress = (len(names) * n_replications * max(s.workload.num_requests for s in scenarios.values())
                    >= 5_000_000)
    runs = run_parallel(_run_scenario, [(scenarios[n], n_replications, seed_value, confidence_level, backend)
                                        for n in names], n_jobs, progress=bool(progress), desc="scenarios")
    results = dict(zip(names, runs))
    base = results[baseline].per_replication
    rows = []
    for name in names:
        if name == baseline:
            continue
        per = results[name].per_replication
        for m in metrics:
            row = paired_difference(per[m].to_numpy(), base[m].to_numpy(), confidence_level)
            rows.append({"scenario": name, "metric": m, **row})
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["n"] = frame["n"].astype(np.int64)
    frame["significant"] = frame["significant"].astype(bool)
    return CompareResult(frame=frame, results=results, baseline=baseline, seed=seed_value,
                         confidence_level=confidence_level, elapsed_s=time.perf_counter() - start)
