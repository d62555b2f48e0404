"""`capacity`: the largest arrival rate that meets latency SLOs, found by a noise-aware search.

The question "how much load can this server take with p99 TTFT under 500 ms?"
is a root-finding problem on a noisy, monotone function of the arrival rate.
:func:`capacity` answers it by bisection on ``workload.arrival_rate`` where
every probe is a sequential test:

* At a probe rate it runs ``n_replications`` replications, then for every SLO
  metric forms one-sided Student-t bounds on the metric's mean. The probe is
  **ok** when every metric's upper bound is below its limit, **violates** when
  some metric's lower bound is above its limit, and otherwise it doubles the
  replications (extending the same streams) and looks again, up to
  ``max_replications``; a probe still undecided then is **inconclusive** and is
  treated conservatively (as not ok: the search continues below it).
* The error level ``1 - confidence`` is split (Bonferroni) over the SLO
  metrics and over the looks a probe may take, so each probe's decision is
  wrong with probability at most ``1 - confidence`` despite the repeated looks.
* All probes use the same seed: common random numbers. Replication ``r`` at
  every rate sees the same uniforms, so its arrival times are one path
  rescaled by the rate and its lengths are identical; the metrics' monotone
  dependence on the rate is kept in every replication, and neighbouring
  probes differ by little noise.

The search keeps the largest rate proven ok (``lo``) and the smallest rate not
proven ok (``hi``) and stops when ``hi - lo <= tol * hi``. The result's
``rate`` is ``lo``; ``rate_interval`` is ``[lo, smallest proven violating
rate]``, which contains the rate where a mean crosses its limit (when each
decision is right).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import kernel as K
from ._config import Scenario
from ._replicate import METRIC_DESCRIPTIONS, _check_replicate_memory, _run, _seed_keys, check_runnable, pack_scenario
from ._stats import t_quantile
from ._validation import check_float, check_int

__all__ = ["CapacityResult", "capacity"]

#: Columns of :attr:`CapacityResult.probes`.
PROBE_COLUMNS = ("probe", "rate", "metric", "limit", "estimate", "ci_low", "ci_high", "metric_decision",
                 "decision", "replications", "goodput")

_MAX_BRACKET_STEPS = 30


@dataclass(eq=False)
class CapacityResult:
    """Result of :func:`capacity`.

    Attributes
    ----------
    rate : float
        The largest probed arrival rate (req/s) proven to meet every SLO
        (``nan`` when no probed rate was, e.g. even ``rate_bounds[0]`` fails).
    rate_interval : tuple of float
        ``(largest proven ok, smallest proven violating)``: the bracket of the
        rate where the first SLO metric's mean reaches its limit (``inf`` as
        the upper end when no probe was proven violating, ``nan`` as the lower
        end when none was proven ok).
    probes : pandas.DataFrame
        One row per (probe, SLO metric), in probing order: ``probe``,
        ``rate``, ``metric``, ``limit``, ``estimate`` (mean over the probe's
        replications), ``ci_low``/``ci_high`` (the one-sided lower and upper
        bounds used for the decision, at the Bonferroni-adjusted level of the
        last look), ``metric_decision`` (``ok``, ``violates``, ``undecided``),
        ``decision`` (of the probe: ``ok``, ``violates``, ``inconclusive``),
        ``replications`` and ``goodput`` (the probe's mean goodput, req/s).
    total_replications : int
        Replications simulated over all probes.
    goodput_rate : float
        The probed rate with the largest estimated mean goodput (goodput as
        the scenario's ``ttft_slo_s``/``tpot_slo_s`` define it).
    goodput : float
        That goodput estimate (req/s).
    slo : dict
    confidence : float
    seed : int or numpy.random.SeedSequence
        Pass it back as ``seed`` to reproduce the search.
    elapsed_s : float
    """

    rate: float
    rate_interval: tuple
    probes: pd.DataFrame
    total_replications: int
    goodput_rate: float
    goodput: float
    slo: dict
    confidence: float
    seed: object
    elapsed_s: float = 0.0

    def summary(self) -> pd.DataFrame:
        """One row per probe (sorted by rate): rate, decision, replications,
        goodput and each SLO metric's estimate and bounds as columns."""
        wide = self.probes.pivot_table(index=["probe", "rate", "decision", "replications", "goodput"],
                                       columns="metric", values=["estimate", "ci_low", "ci_high"],
                                       sort=False)
        metrics = list(dict.fromkeys(self.probes["metric"]))
        wide = wide[[(stat, m) for m in metrics for stat in ("estimate", "ci_low", "ci_high")]]
        wide.columns = [f"{m}_{stat}" for stat, m in wide.columns]
        return wide.reset_index().sort_values("rate").reset_index(drop=True)

    def __repr__(self):
        lo, hi = self.rate_interval
        return (f"CapacityResult(rate={self.rate:.4g}, rate_interval=({lo:.4g}, {hi:.4g}), "
                f"probes={self.probes['probe'].nunique() if len(self.probes) else 0}, "
                f"total_replications={self.total_replications}, goodput_rate={self.goodput_rate:.4g})")


#: Metrics that an upper limit cannot bound sensibly: a lower rate gives less of them.
HIGHER_IS_BETTER = ("request_throughput", "output_throughput", "goodput", "prefix_hit_rate")


#: Smallest ``tol``: the relative spacing of doubles (``numpy.finfo(float).eps``).
MIN_TOL = 2.0 ** -52
#: Bisections of a bracket: from any two positive doubles to adjacent ones
#: takes at most about 2100 halvings (exponent range 2098, 52 mantissa bits).
_MAX_BISECTIONS = 2200


def _check_slo(slo) -> dict:
    if not isinstance(slo, dict) or not slo:
        raise ValueError(f"slo must be a non-empty dict {{metric: upper limit}}, e.g. {{'ttft_p99': 0.5}}, "
                         f"got {slo!r}")
    out = {}
    allowed = ", ".join(m for m in METRIC_DESCRIPTIONS if m not in HIGHER_IS_BETTER)
    for metric, limit in slo.items():
        if metric not in METRIC_DESCRIPTIONS:
            raise ValueError(f"slo metric {metric!r} is not a fastsim metric; use one of {allowed}")
        if metric in HIGHER_IS_BETTER:
            raise ValueError(f"slo metric {metric!r} is higher-is-better, but capacity's limits are upper "
                             f"limits on metrics that grow with load (latencies, blocking, utilisation): any "
                             f"low enough rate would meet a limit on it; use one of {allowed}")
        out[metric] = check_float(f"slo[{metric!r}]", limit, low=0, low_open=True)
    return out


def _check_bounds(rate_bounds):
    if rate_bounds is None:
        return None
    if isinstance(rate_bounds, (str, bytes)) or not hasattr(rate_bounds, "__len__") or len(rate_bounds) != 2:
        raise ValueError(f"rate_bounds must be None or a pair (low, high) of rates in req/s, got {rate_bounds!r}")
    lo = check_float("rate_bounds[0]", rate_bounds[0], low=0, low_open=True)
    hi = check_float("rate_bounds[1]", rate_bounds[1], low=0, low_open=True)
    if lo < 1e-9:   # (a probe's arrival_rate, which a rate this low would make refuse, naming itself)
        raise ValueError(f"rate_bounds[0] must be >= 1e-09 req/s (a probe's arrival rate), got {lo!r}")
    if not hi > lo:
        raise ValueError(f"rate_bounds must have low < high, got {rate_bounds!r}")
    return lo, hi


class _Prober:
    """Runs and decides probes on common random numbers; remembers every probe."""

    def __init__(self, scenario, slo, confidence, n_replications, max_replications, seed):
        self.scenario, self.slo = scenario, slo
        self.n0, self.nmax = n_replications, max_replications
        self.k0, self.k1, self.seed = _seed_keys(seed)
        n_looks = 1 + max(0, math.ceil(math.log2(max_replications / n_replications)))
        # One-sided error per (metric, look): Bonferroni over both.
        self.alpha = (1.0 - confidence) / (len(slo) * n_looks)
        self.cols = [K.COLUMNS.index(m) for m in slo]
        self.goodput_col = K.COLUMNS.index("goodput")
        self.rows, self.total, self.cache = [], 0, {}

    def _decide(self, data):
        per_metric = []
        for (metric, limit), col in zip(self.slo.items(), self.cols):
            x = data[:, col]
            x = x[np.isfinite(x)]
            n = x.size
            if n < 2:
                est, low, high = (float(x.mean()) if n else math.nan), -math.inf, math.inf
            else:
                est = float(x.mean())
                se = float(x.std(ddof=1) / math.sqrt(n))
                q = t_quantile(n - 1, 1.0 - self.alpha)
                low, high = est - q * se, est + q * se
            d = "ok" if high < limit else ("violates" if low > limit else "undecided")
            per_metric.append((metric, limit, est, low, high, d))
        if any(p[-1] == "violates" for p in per_metric):
            decision = "violates"
        elif all(p[-1] == "ok" for p in per_metric):
            decision = "ok"
        else:
            decision = "undecided"
        return decision, per_metric

    def probe(self, rate: float) -> str:
        rate = float(rate)
        if rate in self.cache:
            return self.cache[rate]
        sc = self.scenario.replace(**{"workload.arrival_rate": rate})
        # (what `replicate` refuses, refused here too: every probe runs `_run` directly)
        check_runnable(sc, "numba")
        # (its probes use Numba's threads)
        _check_replicate_memory(sc, self.nmax, "numba", None, "capacity", count="max_replications")
        packed = pack_scenario(sc)
        blocks, done, n = [], 0, self.n0
        while True:
            blocks.append(_run(sc, packed, self.k0, self.k1, done, n - done, "numba", None, None, False))
            self.total += n - done
            done = n
            data = np.concatenate(blocks)
            decision, per_metric = self._decide(data)
            if decision != "undecided":
                break
            if done >= self.nmax:
                decision = "inconclusive"
                break
            n = min(2 * done, self.nmax)
        g = data[:, self.goodput_col]
        g = g[np.isfinite(g)]
        goodput = float(g.mean()) if g.size else math.nan
        index = len(self.cache)
        for metric, limit, est, low, high, d in per_metric:
            self.rows.append((index, rate, metric, limit, est, low, high, d, decision, done, goodput))
        self.cache[rate] = decision
        return decision


def _refuse_capped_stream(what, workload):
    """Refuse a capped stream (``max_concurrency`` with ``arrival_rate``) in a
    rate or fleet-size search: a request beyond the cap waits client-side,
    outside its latencies, so an overloaded client's backlog grows while no
    latency SLO sees it (`ReplicateResult.stability` does)."""
    c = workload.max_concurrency
    if c is not None:
        raise ValueError(f"{what}; workload.max_concurrency={c} caps the stream: a request beyond {c} in the "
                         f"system waits client-side, outside its latencies (measured from its send, as vllm "
                         f"bench serve measures them), so they do not grow with the load while the client's "
                         f"backlog does. Give max_concurrency=None (open-loop arrivals); for a capped client's "
                         f"throughput, run replicate and read request_throughput and its stability check")


def capacity(scenario: Scenario, slo: dict, *, confidence: float = 0.95, rate_bounds=None,
             n_replications: int = 100, seed=None, tol: float = 0.02,
             max_replications: int = 3200) -> CapacityResult:
    """The largest arrival rate at which every SLO metric's mean is below its limit.

    Parameters
    ----------
    scenario : Scenario
        The server and workload; only ``workload.arrival_rate`` is changed
        (its ``arrival_rate`` is the starting guess when ``rate_bounds`` is
        None). The workload must be rate-driven (not ``arrival_times``).
    slo : dict
        ``{metric: upper limit}`` with names from
        :data:`~fastsim.METRIC_DESCRIPTIONS` and limits > 0, in the metric's
        unit (seconds for latencies), e.g. ``{"ttft_p99": 0.5, "tpot_mean": 0.05}``.
        Throughputs, goodput and the prefix hit rate are refused: they fall
        with the rate, so an upper limit on them says nothing about capacity.
        Every limit is an upper limit on the metric's mean over replications
        (for a percentile: the expected per-run percentile).
    confidence : float
        A rate is *proven ok* when, for every metric, the one-sided upper
        confidence bound on its mean is below the limit, and *proven
        violating* when some metric's lower bound is above its limit. The
        error ``1 - confidence`` is split over metrics and the looks of the
        sequential test, so each probe's decision holds at this level.
    rate_bounds : (float, float), optional
        The bracket to search, in req/s. ``low`` should meet the SLO and
        ``high`` violate it; if not, the result says so (``rate`` is ``nan``
        when ``low`` is not proven ok; ``rate_interval[1]`` is ``inf`` when
        ``high`` is not proven violating). None: start at the scenario's
        rate and double or halve it until the SLO's crossing is bracketed.
    n_replications : int
        Replications of a probe's first look; each further look doubles them.
    seed : None, int, numpy.random.SeedSequence or numpy.random.Generator
        One seed for all probes (common random numbers).
    tol : float
        Stop when the bracket ``hi - lo`` is at most ``tol * hi`` (or its
        ends are adjacent floats); in ``[2**-52, 1)``.
    max_replications : int
        Cap on a probe's replications; a probe still undecided is
        *inconclusive* (its mean is within noise of the limit) and is treated
        as not ok.

    Returns
    -------
    CapacityResult

    Raises
    ------
    ValueError
        For an unknown or higher-is-better metric, a limit <= 0, bad bounds or
        counts; a workload without one arrival rate, or a capped stream
        (``max_concurrency`` with ``arrival_rate``: its backlog waits
        client-side, outside the latencies).

    Examples
    --------
    >>> import fastsim
    >>> sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=200))
    >>> res = fastsim.capacity(sc, {"ttft_mean": 0.2}, seed=0, rate_bounds=(0.5, 64.0))  # doctest: +SKIP
    >>> res.rate_interval                                                             # doctest: +SKIP
    """
    start = time.perf_counter()
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    if scenario.workload.arrival_times is not None:
        raise ValueError("capacity needs a rate-driven workload (arrival_rate), not given arrival_times")
    if scenario.workload.arrival_rate is None:
        raise ValueError("capacity needs a rate-driven workload (arrival_rate), got arrival_rate=None (a pure "
                         "closed loop, multi-user or trace arrivals)")
    _refuse_capped_stream("capacity searches the largest arrival_rate at which the SLOs hold",
                          scenario.workload)
    slo = _check_slo(slo)
    confidence = check_float("confidence", confidence, low=0, high=1, low_open=True, high_open=True)
    bounds = _check_bounds(rate_bounds)
    n_replications = check_int("n_replications", n_replications, low=2)
    max_replications = check_int("max_replications", max_replications, low=n_replications)
    # below one ulp of the rate (relative 2**-52) a bracket cannot shrink:
    # `hi - lo > tol * hi` would hold for adjacent floats, for ever
    tol = check_float("tol", tol, low=MIN_TOL, high=1, high_open=True)

    prober = _Prober(scenario, slo, confidence, n_replications, max_replications, seed)
    lo = math.nan       # largest rate proven ok
    hi = math.inf       # smallest rate not proven ok (violating or inconclusive)
    if bounds is not None:
        if prober.probe(bounds[0]) == "ok":
            lo = bounds[0]
            d = prober.probe(bounds[1])
            if d == "ok":
                lo = bounds[1]
            else:
                hi = bounds[1]
        else:
            hi = bounds[0]
    else:
        r = float(scenario.workload.arrival_rate)
        if prober.probe(r) == "ok":
            lo = r
            for _ in range(_MAX_BRACKET_STEPS):
                r *= 2.0
                if prober.probe(r) == "ok":
                    lo = r
                else:
                    hi = r
                    break
        else:
            hi = r
            for _ in range(_MAX_BRACKET_STEPS):
                r /= 2.0
                if prober.probe(r) == "ok":
                    lo = r
                    break
                hi = r
    if math.isfinite(lo) and math.isfinite(hi):
        for _ in range(_MAX_BISECTIONS):   # (bounded: the loop also ends at adjacent floats)
            if not hi - lo > tol * hi:
                break
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi:
                break
            if prober.probe(mid) == "ok":
                lo = mid
            else:
                hi = mid

    probes = pd.DataFrame(prober.rows, columns=list(PROBE_COLUMNS))
    probes["replications"] = probes["replications"].astype(np.int64)
    violating = probes.loc[probes["decision"] == "violates", "rate"]
    upper = float(violating.min()) if len(violating) else math.inf
    per_probe = probes.drop_duplicates("probe")
    if per_probe["goodput"].notna().any():
        best = per_probe.loc[per_probe["goodput"].idxmax()]
        goodput_rate, goodput = float(best["rate"]), float(best["goodput"])
    else:
        goodput_rate = goodput = math.nan
    return CapacityResult(rate=lo, rate_interval=(lo, upper), probes=probes,
                          total_replications=int(prober.total), goodput_rate=goodput_rate, goodput=goodput,
                          slo=dict(slo), confidence=confidence, seed=prober.seed,
                          elapsed_s=time.perf_counter() - start)
