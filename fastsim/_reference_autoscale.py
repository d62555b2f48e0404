"""A slow, plain-Python reference of time-varying arrivals and of an
autoscaling fleet.

It checks the compiled draw of a rate schedule
(`kernel.workload._schedule_arrivals`) and the compiled autoscaling fleet
(`kernel.autoscale`) bit for bit per request, sharing no simulation code
with them: the schedule's inversion is written again from
``docs/engine-model.md`` ("Time-varying arrival rate"), the random numbers
are the reference fleet's SplitMix64 streams, each replica is
`_reference_cluster._PausedReplica` and the routers are the reference
fleet's (`_reference_cluster._choose`), over the replicas in service.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ._config import EngineConfig
from ._latency import LatencyModel
from ._reference import _Request, queue_key
from ._reference_cluster import ROUTERS, _PausedReplica, _RouterStream, _choose

#: The kernel's random-stream purposes, by the specification's numbering.
_S_ARRIVAL = 0
_S_ROUTE = 13


# ------------------------------------------------------------------------------
# Time-varying arrival rate

def _integrals(times, rates, linear):
    cum = [0.0]
    for k in range(len(times) - 1):
        w = times[k + 1] - times[k]
        cum.append(cum[-1] + (w * (rates[k] + rates[k + 1]) * 0.5 if linear else w * rates[k]))
    return cum


def schedule_inverse(times, rates, linear, period, s):
    """The first t with integral of the rate over [0, t] >= s (inf: never)."""
    cum = _integrals(times, rates, linear)
    total = cum[-1]
    base = 0.0
    if period > 0.0:
        c = math.floor(s / total)
        s -= c * total
        if s < 0.0:
            c, s = c - 1.0, s + total
        elif s >= total:
            c, s = c + 1.0, s - total
        base = c * period
    elif s >= total:
        if rates[-1] <= 0.0:
            return math.inf
        return times[-1] + (s - total) / rates[-1]
    k = bisect.bisect_left(cum, s, 1, len(cum) - 1) - 1
    d = s - cum[k]
    width = times[k + 1] - times[k]
    if d <= 0.0:
        u = 0.0
    elif not linear:
        u = d / rates[k]
    else:
        slope = (rates[k + 1] - rates[k]) / width
        u = 2.0 * d / (rates[k] + math.sqrt(max(rates[k] * rates[k] + 2.0 * slope * d, 0.0)))
    return base + times[k] + min(u, width)


def schedule_arrivals_reference(schedule, num_requests, horizon_s=None, seed_keys=(0, 0, 0)):
    """The arrival times a `Workload(rate_schedule=schedule)` draws in the
    replication keyed ``seed_keys`` = (key0, key1, replication)."""
    times = [float(x) for x in schedule.times]
    rates = [float(x) for x in schedule.rates]
    linear = schedule.shape == "linear"
    period = float(schedule.times[-1]) if schedule.repeat else 0.0
    rng = _RouterStream(*(int(k) for k in seed_keys), purpose=_S_ARRIVAL)
    out = []
    s = 0.0
    for _ in range(num_requests):
        s += -math.log(rng.uniform())
        t = schedule_inverse(times, rates, linear, period, s)
        if out:
            t = max(t, out[-1])
        if t == math.inf or (horizon_s is not None and t >= horizon_s):
            break
        out.append(t)
    return np.array(out, dtype=np.float64)
