"""`sweep`: :func:`~fastsim.replicate` over a grid of scenario changes, as one tidy table."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import check_table_path, save_table
from . import kernel as K
from ._config import Scenario
from ._parallel import TasksInterrupted, check_n_jobs, run_parallel
from ._replicate import Interrupted, _check_backend, as_seed_sequence, replicate, reproducible_seed
from ._stats import check_confidence_level, summary_frame
from ._validation import check_int, check_metric_names

__all__ = ["SweepResult", "sweep", "sweep_points", "point_seeds"]

#: Columns of :attr:`SweepResult.frame` after the parameter columns.
STAT_COLUMNS = ("metric", "estimate", "ci_low", "ci_high", "std_error", "n")

_SECTIONS = ("engine", "workload", "latency")


# ------------------------------------------------------------------------------
# Points and seeds

def _check_key(scenario: Scenario, key, where: str) -> str:
    """``key`` if ``scenario.replace(**{key: ...})`` can set it, else a ValueError naming it."""
    top = [f.name for f in dataclasses.fields(Scenario)]
    if not isinstance(key, str):
        raise ValueError(f"{where} {key!r} must be a string such as 'engine.max_num_seqs'")
    head, dot, rest = key.partition(".")
    if not dot:
        if key not in top:
            raise ValueError(f"{where} {key!r} is not a scenario parameter; use one of "
                             f"{', '.join(top)}, or a dotted name such as 'engine.max_num_seqs'")
        return key
    if head not in _SECTIONS:
        raise ValueError(f"{where} {key!r}: unknown scenario section {head!r}; use engine, workload or "
                         f"latency (e.g. 'workload.arrival_rate')")
    names = [f.name for f in dataclasses.fields(type(getattr(scenario, head))) if f.init]
    if rest not in names:
        raise ValueError(f"{where} {key!r} is not a scenario parameter; {head} parameters are "
                         f"{', '.join(names)}")
    return key


def _grid_points(scenario: Scenario, grid) -> list[dict]:
    if not isinstance(grid, dict) or not grid:
        raise ValueError(f"grid must be a non-empty dict {{parameter: list of values}}, got {grid!r}")
    axes = []
    for key, values in grid.items():
        _check_key(scenario, key, "grid key")
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            raise ValueError(f"grid[{key!r}] must be a non-empty list of values, got {values!r}")
        values = list(values)
        if not values:
            raise ValueError(f"grid[{key!r}] must be a non-empty list of values, got an empty one")
        axes.append(values)
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*axes)]


def _explicit_points(scenario: Scenario, points) -> list[dict]:
    if isinstance(points, dict) or not hasattr(points, "__iter__"):
        raise ValueError(f"points must be a non-empty list of dicts {{parameter: value}}, got {points!r}")
    points = list(points)
    if not points:
        raise ValueError("points must be a non-empty list of dicts {parameter: value}, got an empty one")
    for i, point in enumerate(points):
        if not isinstance(point, dict):
            raise ValueError(f"points[{i}] must be a dict {{parameter: value}}, got {point!r}")
        for key in point:
            _check_key(scenario, key, f"points[{i}] key")
    return [dict(p) for p in points]


def sweep_points(scenario: Scenario, grid=None, points=None, *, _stacklevel=3) -> tuple[list[dict], list[Scenario]]:
    """The changes and the scenario of every point of a sweep, validated.

    Parameters
    ----------
    scenario : Scenario
        The base scenario.
    grid : dict, optional
        ``{parameter: values}``; the points are the cartesian product in the
        dict's order (the last parameter varies fastest).
    points : list of dict, optional
        An explicit list of ``{parameter: value}`` changes instead of ``grid``.

    Returns
    -------
    changes : list of dict
    scenarios : list of Scenario
        ``scenario.replace(**changes[i])`` for every point.

    Raises
    ------
    ValueError
        Naming the bad parameter name, or the point and the bad value.
    """
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    if (grid is None) == (points is None):
        raise ValueError("give exactly one of grid (a dict of value lists) and points (a list of dicts)")
    changes = _grid_points(scenario, grid) if grid is not None else _explicit_points(scenario, points)
    _warn_unserved(scenario, changes, _stacklevel)   # (the caller's line: sweep's is two frames further)
    scenarios = []
    for i, change in enumerate(changes):
        try:
            scenarios.append(scenario.replace(**change))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"sweep point {i} {change!r}: {exc}") from exc
    return changes, scenarios


def _warn_unserved(scenario: Scenario, changes, stacklevel=3) -> None:
    """Warn (UserWarning) of a swept ``engine.*`` or ``latency.*`` where the
    scenario's fleet lists its replicas or gives both pools their servers:
    its own engine then serves no request (only the stream's draws read it),
    so the points differ only by chance."""
    from ._fleet import serves_scenario_engine

    fleet = scenario.fleet
    if fleet is None or serves_scenario_engine(scenario):
        return
    keys = sorted({k for change in changes for k in change if k.split(".")[0] in ("engine", "latency")})
    if keys:
        import warnings

        warnings.warn(f"sweep of {', '.join(keys)}: the scenario's fleet runs its own listed servers "
                      f"({type(fleet).__name__}), not the scenario's engine and latency (which only draw the "
                      f"stream); change the fleet's entries instead", UserWarning, stacklevel=stacklevel)


def point_seeds(seed, n_points: int) -> list[np.random.SeedSequence]:
    """The seed of each sweep point: child ``i`` of ``SeedSequence(seed)``.

    For an integer ``seed`` this is ``numpy.random.SeedSequence(seed).spawn(n_points)[i]``,
    i.e. ``SeedSequence(seed, spawn_key=(i,))``. For a ``SeedSequence`` it is
    that sequence's spawn key extended by ``(i,)``, whatever children it has
    spawned before (so the same object always gives the same sweep). Point
    ``i``'s seed depends only on ``seed`` and ``i``: not on ``n_jobs``, the
    cache or the other points.
    """
    root = as_seed_sequence(seed)
    n_points = check_int("n_points", n_points, low=0)
    return [np.random.SeedSequence(root.entropy, spawn_key=tuple(root.spawn_key) + (i,),
                                   pool_size=root.pool_size) for i in range(n_points)]


def _resolve(scenario: Scenario, key: str):
    obj = scenario
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


# ------------------------------------------------------------------------------
# One point (module level: runs in worker processes and is cached by joblib.Memory)

@functools.lru_cache(maxsize=4)
def _code_fingerprint(root=None) -> str:
    """Hash of fastsim's source (the package at ``root``, this one by
    default): part of the cache key, so that cached points are recomputed
    after the simulator changes."""
    h = hashlib.sha256()
    root = Path(__file__).parent if root is None else Path(root)
    # (the kernel's package too, and the packaged data a scenario may read: models, GPUs, calibration, traces)
    for path in sorted([*root.rglob("*.py"), *(p for p in root.glob("data/**/*") if p.is_file())]):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


#: Points `_run_point` simulated in this process: a point that joblib's cache
#: lists but cannot load (a damaged file) is simulated again by joblib, and
#: must not be reported as loaded from the cache.
_points_run = [0]


def _run_point(scenario, n_replications, seed, code_fingerprint, backend="numba"):
    """``replicate`` one point (``code_fingerprint`` only keys the cache)."""
    _points_run[0] += 1
    return replicate(scenario, n_replications, seed=seed, backend=backend, progress=False)


# ------------------------------------------------------------------------------
# Result

@dataclass(eq=False)
class SweepResult:
    """Result of :func:`sweep`.

    Attributes
    ----------
    frame : pandas.DataFrame
        Tidy: one row per (point, metric). Columns ``point`` (the point's
        index), one column per swept parameter (named as in the grid, e.g.
        ``workload.arrival_rate``, holding the value it was set to; with
        explicit ``points`` a parameter a point does not set shows the base
        scenario's value), then ``metric``, ``estimate``, ``ci_low``,
        ``ci_high``, ``std_error`` and ``n`` as in
        :meth:`ReplicateResult.summary`.
    points : list of dict
        The changes of each point (``scenario.replace(**points[i])``).
    results : list of ReplicateResult
        Each point's full result (``results[i].per_replication``,
        ``results[i].scenario``, ``results[i].seed`` = the point's child seed).
    seed : int or numpy.random.SeedSequence
        Pass it as ``seed`` to reproduce the sweep (the drawn entropy when
        ``seed=None`` was given).
    confidence_level : float
    cached : list of bool
        Whether each point was loaded from ``cache_dir`` rather than simulated.
    elapsed_s : float
        Wall time of the sweep.
    interrupted : bool
        True for the partial result of an interrupted sweep
        (:class:`~fastsim.Interrupted`): ``points``, ``results``, ``cached``
        and ``frame`` then cover only the finished points (the frame's
        ``point`` column keeps their index in the full grid), and :meth:`save`
        adds a ``partial`` column.
    """

    frame: pd.DataFrame
    points: list
    results: list
    seed: object
    confidence_level: float
    cached: list
    elapsed_s: float = 0.0
    interrupted: bool = False

    @property
    def n_points(self) -> int:
        return len(self.points)

    @property
    def parameters(self) -> list[str]:
        """The swept parameter names (the frame's parameter columns)."""
        return [c for c in self.frame.columns if c != "point" and c not in STAT_COLUMNS]

    def to_frame(self) -> pd.DataFrame:
        """A copy of :attr:`frame`."""
        return self.frame.copy()

    def summary(self, by: str | None = None) -> pd.DataFrame:
        """The estimates: :attr:`frame`, or with ``by="class"`` (a workload
        with ``classes``) one row per (point, class, metric) of the per-class
        metrics, each point's :meth:`ReplicateResult.summary` ``(by="class")``
        after its ``point`` and parameter columns."""
        if by is None:
            return self.to_frame()
        from ._validation import check_choice

        check_choice("by", by, ("class",))
        params = self.parameters
        parts = []
        for i, res in zip(sorted(set(self.frame["point"].tolist())), self.results):
            part = res.summary(by="class")
            head = self.frame[self.frame["point"] == i].iloc[0]
            for j, key in enumerate(["point"] + params):
                part.insert(j, key, [head[key]] * len(part))
            parts.append(part)
        return pd.concat(parts, ignore_index=True)

    def save(self, path, by: str | None = None) -> Path:
        """Write :attr:`frame` (with ``by="class"``: :meth:`summary` by class)
        to ``.csv``, ``.json`` or ``.parquet`` (by suffix).

        Parameter values that are not plain numbers, strings or booleans
        (e.g. a ``LogNormal`` length law) are written as their ``repr``.
        """
        check_table_path(path)
        frame = self.summary(by)
        for col in self.parameters:
            if frame[col].dtype == object:
                plain = frame[col].map(lambda v: v is None or isinstance(v, (str, bool, int, float,
                                                                              np.integer, np.floating)))
                if not plain.all():
                    frame[col] = frame[col].map(repr)
        if self.interrupted:
            frame["partial"] = True
        return save_table(frame, path)

    def plot(self, x: str, y: str, *, hue: str | None = None, band: bool = True, logy: bool = False, ax=None):
        """A metric against a swept parameter, with confidence bands (:func:`~fastsim.plot_sweep`).

        Parameters
        ----------
        x : str
            A swept parameter, e.g. ``"workload.arrival_rate"``.
        y : str
            A metric of the frame, e.g. ``"ttft_p99"``.
        hue : str, optional
            Another swept parameter: one line per value.
        band : bool
            Shaded bands (else error bars).
        logy : bool
            Logarithmic y axis.
        ax : matplotlib Axes, optional

        Returns
        -------
        matplotlib.axes.Axes
        """
        from ._plot import plot_sweep

        return plot_sweep(self.frame, x, y, hue=hue, band=band, logy=logy, ax=ax)

    def _repr_html_(self) -> str:
        """A notebook's view: one row per point, one column per metric as ``estimate [low, high]``."""
        from ._replicate import metric_unit

        cells = self.frame.copy()
        scale = cells["metric"].map(lambda m: metric_unit(m)[1])
        cells["value"] = [f"{e * k:.4g} [{lo * k:.4g}, {hi * k:.4g}]" if np.isfinite(e) else "n/a"
                          for e, lo, hi, k in zip(cells["estimate"], cells["ci_low"], cells["ci_high"], scale)]
        cells["metric"] = [f"{m} ({metric_unit(m)[0]})" if metric_unit(m)[0] else m for m in cells["metric"]]
        wide = cells.pivot(index=["point", *self.parameters], columns="metric", values="value")
        wide = wide[list(dict.fromkeys(cells["metric"]))]
        note = " <b>(partial: interrupted)</b>" if self.interrupted else ""
        return (f"<div><p>sweep of {self.n_points} points, {self.confidence_level:.0%} confidence intervals"
                f"{note}</p>{wide.to_html()}</div>")

    def __repr__(self):
        part = ", interrupted=True" if self.interrupted else ""
        return (f"SweepResult(n_points={self.n_points}, parameters={self.parameters}, "
                f"confidence_level={self.confidence_level}{part})")


# ------------------------------------------------------------------------------
# sweep

def _sweep_iv(scenario, grid, points, n_replications, n_jobs, confidence_level, metrics, cache_dir):
    n_replications = check_int("n_replications", n_replications, low=2)
    n_jobs = check_n_jobs(n_jobs)
    confidence_level = check_confidence_level(confidence_level)
    if cache_dir is not None and not isinstance(cache_dir, (str, Path)):
        import joblib

        if not isinstance(cache_dir, joblib.Memory):
            raise ValueError(f"cache_dir must be a path or a joblib.Memory, got {cache_dir!r}")
    if isinstance(cache_dir, (str, Path)) and "://" not in str(cache_dir):
        path = Path(cache_dir).expanduser()
        if path.exists() and not path.is_dir():
            raise ValueError(f"cache_dir must be a directory (made if missing), got the file {str(cache_dir)!r}")
        anc = next((a for a in (path, *path.parents) if a.exists()), None)
        if anc is not None and not anc.is_dir():
            raise ValueError(f"cache_dir {str(cache_dir)!r} cannot be made: {str(anc)!r} is a file")
    changes, scenarios = sweep_points(scenario, grid, points, _stacklevel=5)
    allowed = K.METRICS
    if all(sc.fleet is not None and getattr(sc.fleet, "autoscaler", None) is not None for sc in scenarios):
        allowed += K.AUTOSCALE_COLUMNS   # (autoscaled fleets: GPU-hours and SLO-violation minutes too, as compare's)
    metrics = check_metric_names(metrics, allowed)
    return changes, scenarios, n_replications, n_jobs, confidence_level, metrics


def sweep(scenario: Scenario, grid: dict | None = None, n_replications: int = 1000, *, seed=None,
          n_jobs: int = 1, confidence_level: float = 0.95, points: list | None = None,
          metrics=None, cache_dir=None, progress: bool | None = None, backend: str = "numba") -> SweepResult:
    """Run :func:`~fastsim.replicate` at every point of a parameter grid.

    Parameters
    ----------
    scenario : Scenario
        The base scenario; each point is ``scenario.replace(**point)``.
    grid : dict
        ``{parameter: list of values}`` with :meth:`Scenario.replace` names:
        dotted for fields of a section (``"workload.arrival_rate"``,
        ``"engine.max_num_seqs"``, ``"latency.base_s"``) or top-level
        (``"ttft_slo_s"``, ``"engine"``). The points are the cartesian
        product, in the dict's order with the last parameter varying fastest.
    n_replications : int
        Replications per point.
    seed : None, int, numpy.random.SeedSequence or numpy.random.Generator
        Point ``i`` is run with ``replicate(..., seed=child_i)``, where
        ``child_i = numpy.random.SeedSequence(seed).spawn(n_points)[i]``
        (see :func:`point_seeds`): independent streams per point, and results
        that do not depend on ``n_jobs``, on the cache or on which points ran
        before. (For common random numbers across scenarios, use
        :func:`~fastsim.compare`.)
    n_jobs : int
        Worker processes (-1: all cores); on a local joblib backend (loky by
        default) each runs Numba with ``cores // n_jobs`` threads; on a
        Dask cluster, the workers' own thread counts apply
        (:mod:`fastsim._parallel`). Does not change the results. The
        default, 1, is usually fastest on one machine: each point's
        replications already use every core (``docs/study-tools.md``).
    confidence_level : float
        Level of the intervals.
    points : list of dict, optional
        An explicit list of ``{parameter: value}`` points instead of ``grid``.
    metrics : list of str, optional
        Metrics in the frame (default: all of :data:`~fastsim.METRIC_DESCRIPTIONS`).
    cache_dir : str, pathlib.Path or joblib.Memory, optional
        Cache each finished point on disk (``joblib.Memory``), keyed by the
        point's scenario, ``n_replications``, its seed and a hash of fastsim's
        source code. Re-running an interrupted sweep with the same arguments
        loads the finished points and simulates only the rest. (A point's seed
        depends on its index, so a grid with values added or reordered is a
        new sweep; points that keep their index and seed are reused.)
    progress : bool, optional
        A progress bar over points (default: when points x replications x
        requests >= 5 million).
    backend : {"numba", "cuda", "reference"}
        Passed to :func:`~fastsim.replicate` (with ``"cuda"``, keep
        ``n_jobs=1``: the points then share the GPU one after another).

    Returns
    -------
    SweepResult
        ``.frame``: one row per (point, metric) with the parameters as columns.

    Raises
    ------
    ValueError
        For a bad argument, an unknown parameter name or a value the scenario
        rejects (naming it), before any simulation runs.

    Examples
    --------
    >>> import fastsim
    >>> sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=100))
    >>> res = fastsim.sweep(sc, {"workload.arrival_rate": [1.0, 2.0], "engine.max_num_seqs": [8, 16]},
    ...             n_replications=20, seed=0, metrics=["ttft_mean", "goodput"])
    >>> res.frame.shape
    (8, 9)
    >>> list(res.frame.columns[:3])
    ['point', 'workload.arrival_rate', 'engine.max_num_seqs']
    """
    start = time.perf_counter()
    changes, scenarios, n_replications, n_jobs, confidence_level, metrics = _sweep_iv(
        scenario, grid, points, n_replications, n_jobs, confidence_level, metrics, cache_dir)
    n_points = len(scenarios)
    root = as_seed_sequence(seed)
    seeds = point_seeds(root, n_points)
    fingerprint = _code_fingerprint()
    _check_backend(backend)
    tasks = [(sc, n_replications, s, fingerprint, backend) for sc, s in zip(scenarios, seeds)]

    func = _run_point
    results: list = [None] * n_points
    cached = [False] * n_points
    if cache_dir is not None:
        import joblib

        memory = cache_dir if isinstance(cache_dir, joblib.Memory) else joblib.Memory(str(cache_dir), verbose=0)
        func = memory.cache(_run_point)
        for i, task in enumerate(tasks):
            if func.check_call_in_cache(*task):
                ran = _points_run[0]
                results[i] = func(*task)
                cached[i] = _points_run[0] == ran   # (False: joblib could not load it and ran it here)
    todo = [i for i in range(n_points) if not cached[i]]
    if progress is None:
        work = len(todo) * n_replications * max(sc.workload.num_requests for sc in scenarios)
        progress = len(todo) > 1 and work >= 5_000_000
    try:
        for i, res in zip(todo, run_parallel(func, [tasks[i] for i in todo], n_jobs, progress=bool(progress),
                                             desc="sweep points")):
            results[i] = res
    except TasksInterrupted as stop:
        # Keep the finished points (and those from the cache); a point cut short is dropped.
        for j, res in stop.done.items():
            results[todo[j]] = res
        keep = [i for i in range(n_points) if results[i] is not None]
        kept = [dataclasses.replace(results[i], confidence_level=confidence_level) for i in keep]
        frame = (_tidy_frame(scenario, [changes[i] for i in keep], kept, metrics, confidence_level, keep)
                 if keep else pd.DataFrame(columns=["point", *STAT_COLUMNS]))
        partial = SweepResult(frame=frame, points=[changes[i] for i in keep], results=kept,
                              seed=reproducible_seed(root), confidence_level=confidence_level,
                              cached=[cached[i] for i in keep], elapsed_s=time.perf_counter() - start,
                              interrupted=True)
        raise Interrupted(partial) from None
    # The confidence level only shapes the summaries, so it is not part of the cache key.
    results = [dataclasses.replace(r, confidence_level=confidence_level) for r in results]

    frame = _tidy_frame(scenario, changes, results, metrics, confidence_level)
    return SweepResult(frame=frame, points=changes, results=results,
                       seed=reproducible_seed(root), confidence_level=confidence_level,
                       cached=cached, elapsed_s=time.perf_counter() - start)


def _tidy_frame(base, changes, results, metrics, confidence_level, indices=None) -> pd.DataFrame:
    params = list(dict.fromkeys(k for change in changes for k in change))
    blocks = []
    indices = range(len(changes)) if indices is None else indices
    for i, change, res in zip(indices, changes, results):
        summary = summary_frame(res.per_replication, metrics, confidence_level).reset_index()
        block = {"point": np.full(len(summary), i)}
        for key in params:
            value = change[key] if key in change else _resolve(base, key)
            block[key] = [value] * len(summary)
        for col in STAT_COLUMNS:
            block[col] = summary[col].to_numpy()
        blocks.append(pd.DataFrame(block))
    frame = pd.concat(blocks, ignore_index=True)
    frame["n"] = frame["n"].astype(np.int64)
    return frame
