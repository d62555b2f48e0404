"""Is the offered load more than the engine serves? A check beside the
estimates (``ReplicateResult.stability``), from the per-request results of a
few replications (their streams drawn and simulated again).

Over the second half of each run's arrivals ``(t1, t2]`` (``t2`` the last
arrival): the arrivals ``A`` and completions ``C`` there, pooled over the
replications checked. A stable engine completes about what arrives (the
number in system at ``t1`` and ``t2`` has the same law), so ``C / A`` is near
1 and the backlog growth ``A - C`` is within a few ``sqrt(A)``; an
overloaded one falls behind at the rate ``lambda - mu``. The scenario is
called overloaded when ``C / A < 0.9`` and ``A - C > 3 sqrt(A)``; the rate
it sustains is then ``C / (t2 - t1)``, the completions per second while
saturated. (A run with a horizon is cut there: ``t2`` is the horizon.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Replications whose requests the check simulates again.
CHECK_REPLICATIONS = 5


@dataclass(frozen=True)
class StabilityCheck:
    """Offered and served rates over the second half of the runs' arrivals.

    Attributes
    ----------
    offered_rate : float
        Arrivals per second there (req/s).
    served_rate : float
        Completions per second there (req/s): what the engine sustains when overloaded.
    backlog_growth : float
        Arrivals less completions there, per replication.
    overloaded : bool
    replications : int
        Replications checked.
    capped : bool
        A capped stream (``max_concurrency`` with ``arrival_rate``): the
        backlog waits client-side, outside the latencies.
    """

    offered_rate: float
    served_rate: float
    backlog_growth: float
    overloaded: bool
    replications: int
    capped: bool = False

    @property
    def message(self) -> str:
        if not self.overloaded:
            return ""
        return (f"overloaded: {self.offered_rate:.4g} req/s arrive but the engine completes only "
                f"{self.served_rate:.4g} req/s (the queue grew by {self.backlog_growth:.0f} requests over the "
                f"second half of the arrivals); it sustains about {self.served_rate:.4g} req/s. "
                + ("The backlog waits client-side under max_concurrency, outside the latencies: they describe "
                   "the requests sent, not the wait to send them." if self.capped else
                   "Latency estimates here grow with the run's length rather than estimate a steady state."))


def check_stability(scenario, seed, replications, sample_requests, simulate_requests,
                    backend="numba") -> StabilityCheck:
    """`StabilityCheck` from the per-request results of ``replications``
    (their streams from ``sample_requests``, simulated by ``simulate_requests``:
    `fastsim._replicate`'s, passed in so that this module imports neither)."""
    w = scenario.workload
    arrived = done = span = 0.0
    growth = []
    checked = 0
    for rep in replications:
        req = sample_requests(scenario, seed=seed, replication=int(rep))
        a = req["arrival_s"].to_numpy()[w.warmup_requests:]
        if a.size < 4:
            continue
        res = simulate_requests(scenario, req, backend="reference" if backend == "reference" else "numba",
                                seed=seed, replication=int(rep))   # (the replication's own noise)
        fin = res["finish_s"].to_numpy()[w.warmup_requests:]
        ok = (res["status"] == "completed").to_numpy()[w.warmup_requests:]
        t2 = w.horizon_s if w.horizon_s is not None else a[-1]
        t1 = a[0] + 0.5 * (t2 - a[0])
        if not t2 > t1:
            continue
        na = int(((a > t1) & (a <= t2)).sum())
        nc = int((ok & (fin > t1) & (fin <= t2)).sum())
        arrived += na
        done += nc
        span += t2 - t1
        growth.append(na - nc)
        checked += 1
    capped = w.max_concurrency is not None and w.arrival_rate is not None
    if checked == 0 or span == 0.0:
        return StabilityCheck(math.nan, math.nan, math.nan, False, checked, capped)
    over = done < 0.9 * arrived and arrived - done > 3.0 * math.sqrt(arrived)
    return StabilityCheck(arrived / span, done / span, float(np.mean(growth)), bool(over), checked, capped)
