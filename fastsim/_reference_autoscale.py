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
from ._reference import _BlockPool, _Request, prompt_block_identities, queue_key
from ._reference_cluster import ROUTERS, _PausedReplica, _replica_key, _RouterStream, _choose, fleet_status
from ._reference_noise import StepNoiseDraws, run_latency

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


# ------------------------------------------------------------------------------
# Autoscaling fleet

OFF, PROVISIONING, SERVING, DRAINING = "off", "provisioning", "serving", "draining"
AUTOSCALE_ROUTERS = tuple(r for r in ROUTERS if r not in ("prefix_affinity", "session_affinity"))


class _Policy:
    """The autoscaler's rule and its replicas, by row (``docs/engine-model.md``,
    "Autoscaling fleets")."""

    def __init__(self, rows, metric, target, interval_s, min_replicas, max_replicas, delay_s, cooldown_s,
                 initial, tolerance, spare, on_start=lambda r, tau: None):
        self.metric, self.target, self.interval = metric, target, interval_s
        self.lo, self.hi, self.delay, self.cooldown = min_replicas, max_replicas, delay_s, cooldown_s
        self.tolerance, self.spare = tolerance, spare
        self.state = [SERVING if r < initial else OFF for r in range(rows)]
        self.since = [0.0] * rows
        self.ready = [0.0] * rows
        self.held_s = [0.0] * rows
        self.last_scale = 0.0
        self.windows = []
        self.events = 0
        self.peak = min(initial, rows)
        self.on_start = on_start   # (a replica starts in row r at tau: a new server)

    def count(self, which):
        return sum(1 for s in self.state if s == which)

    def leave(self, r, tau):
        self.held_s[r] += tau - self.since[r]
        self.state[r] = OFF

    def activate(self, t):
        for r, s in enumerate(self.state):
            if s == PROVISIONING and self.ready[r] <= t:
                self.state[r] = SERVING

    def held(self):
        return [r for r, s in enumerate(self.state) if s in (SERVING, DRAINING)]

    def desired(self, total, serving, current):
        if serving > 0 and abs(total / (serving * self.target) - 1.0) <= self.tolerance:
            d = current
        else:
            d = math.ceil(total / self.target) + self.spare
        return max(self.lo, min(self.hi, d))

    def evaluate(self, tau, views, nblk, arrived, act=True):
        """views[r] = (in system, waiting, running, KV blocks) of each held row, observed at tau;
        without ``act`` (the fleet is empty after its last arrival) only the row is written."""
        queue = insys = total = 0.0
        for r, s in enumerate(self.state):
            if s == DRAINING and views[r][0] == 0 and act:
                self.leave(r, tau)
            elif s in (SERVING, DRAINING):
                queue += views[r][1]
                insys += views[r][0]
                if s == SERVING:
                    total += views[r][3] / nblk if self.metric == "kv_utilisation" else views[r][1]
        if self.metric == "rate":
            total = arrived / self.interval
        serving, prov, drain = self.count(SERVING), self.count(PROVISIONING), self.count(DRAINING)
        current = serving + prov
        d = self.desired(total, serving, current)
        self.windows.append((tau, serving, prov, drain, total, d, queue, insys, arrived))
        if not act:
            return
        if d > current:
            free = [r for r, s in enumerate(self.state) if s == OFF][:d - current]
            for r in free:
                self.on_start(r, tau)
                self.state[r] = SERVING if self.delay == 0.0 else PROVISIONING
                self.since[r], self.ready[r] = tau, tau + self.delay
            self.peak = max(self.peak, len(self.state) - self.count(OFF))
            if free:
                self.events += 1
                self.last_scale = tau
        elif d < current and tau - self.last_scale >= self.cooldown:
            k = current - d
            for r in reversed(range(len(self.state))):
                if k and self.state[r] == PROVISIONING:
                    self.leave(r, tau)
                    k -= 1
            while k:
                cands = [r for r, s in enumerate(self.state) if s == SERVING]
                if not cands:
                    break
                r = min(reversed(cands), key=lambda q: views[q][0])   # fewest; ties: the highest row
                self.state[r] = DRAINING
                if views[r][0] == 0:
                    self.leave(r, tau)
                k -= 1
            self.events += 1
            self.last_scale = tau


def simulate_autoscaled_reference(arrival, prompt, output, prio, sjfk, pgrp, plen, engine: EngineConfig,
                                  latency: LatencyModel, router: str, *, metric, target, interval_s, min_replicas,
                                  max_replicas, provisioning_delay_s=0.0, scale_in_cooldown_s=0.0,
                                  initial_replicas=None, tolerance=0.0, spare_replicas=0, horizon_s=None,
                                  routing_latency_s=0.0, seed_keys=(0, 0, 0), block_hashes=None,
                                  hash_block_size=512):
    """Simulate an autoscaled fleet over one request stream, slowly and literally.

    With ``block_hashes`` (a replayed trace's hash list per request, each
    hash ``hash_block_size`` tokens), caching by block hash keys prompt
    blocks by those hashes (`prompt_block_identities`; ``pgrp`` and
    ``plen`` are then ignored).

    Returns a dict of per-request arrays (``status``, ``first_token_s``,
    ``finish_s``, ``num_preemptions``, ``num_tokens``, ``cached_tokens``,
    ``replica``: its row; a replica that starts in a row starts with a cold
    prefix cache), ``windows`` (the evaluations, `kernel.layout.WINDOW_COLUMNS` but
    ``slo_met``), ``starts`` (each replica started after time 0: its time
    and row), ``replica_s`` (replica-seconds held) and ``end_s``.
    """
    if router not in AUTOSCALE_ROUTERS:
        raise ValueError(f"router must be one of {AUTOSCALE_ROUTERS}, got {router!r}")
    a = np.asarray(arrival, dtype=np.float64)
    n = a.size
    rows = max_replicas
    initial = min_replicas if initial_replicas is None else initial_replicas
    # the model as the replication runs it (its per-run effects, `run_latency`), per-step noise drawn per row:
    # row r's key as a fleet's replica r's; a replica that starts in a row reused takes its steps on
    latency, steps = run_latency(latency, *(int(x) for x in seed_keys))
    reps = [_PausedReplica(engine, latency, horizon_s, None if steps is None else
                           StepNoiseDraws(_replica_key(steps.key, r), steps.sd, steps.p, steps.mean))
            for r in range(rows)]

    starts = []

    def cold(r, tau):
        # a new vLLM server's prefix cache is empty: the row's replica (holding no
        # request) gets a fresh block pool; its finished requests stay as they are
        starts.append((tau, r))
        if reps[r].hashing:
            reps[r].pool = _BlockPool(engine.num_gpu_blocks, engine.null_block)

    pol = _Policy(rows, metric, target, interval_s, min_replicas, max_replicas, provisioning_delay_s,
                  scale_in_cooldown_s, initial, tolerance, spare_replicas, cold)
    nblk = engine.usable_gpu_blocks
    rng = _RouterStream(*(int(x) for x in seed_keys), purpose=_S_ROUTE)
    views = [(0, 0, 0, 0)] * rows
    reads = router not in ("random", "round_robin")

    def look(t):
        for r in pol.held():
            reps[r].advance_until(t)
            # (KV: blocks of the usable ones not free, as the kernel counts them; by block
            # hash, cached blocks no request holds are free, as vLLM's usage counts them)
            views[r] = reps[r].view()

    k, arrived = 1, 0
    owner, reqs = [], []
    for i in range(n):
        t = float(a[i])
        while k * interval_s <= t:
            tau = k * interval_s
            pol.activate(tau)
            look(tau)
            pol.evaluate(tau, views, nblk, arrived)
            arrived, k = 0, k + 1
        pol.activate(t)
        serving = [r for r, s in enumerate(pol.state) if s == SERVING]
        if reads and len(serving) > 1:
            look(t)
        r = serving[_choose(router, i, int(pgrp[i]), [views[q] for q in serving], [], rng, 0)]
        rep = reps[r]
        j = rep.handed
        at = t + routing_latency_s
        req = _Request(idx=j, arrival=at, P=int(prompt[i]), O=int(output[i]), prio=int(prio[i]),
                       sjf_key=int(sjfk[i]), group=int(pgrp[i]), prefix_len=int(plen[i]),
                       qkey=queue_key(engine.policy, j, at, int(prio[i]), int(sjfk[i]), engine.priority_aging_s))
        if rep.hashing and block_hashes is not None:   # (its prompt's blocks by the trace's hashes)
            req.group, req.prefix_len = -1, 0
            req.idents = prompt_block_identities(j, req.P, engine.block_size, block_hashes=block_hashes[i],
                                                 hash_block_size=hash_block_size)
        elif rep.hashing:   # (its prompt's block identities, as the kernel's `block_pool._block_id`)
            req.idents = prompt_block_identities(j, req.P, engine.block_size, req.group, req.prefix_len)
        rep.hand(req)
        owner.append(r)
        reqs.append(req)
        arrived += 1
    while horizon_s is None or k * interval_s < horizon_s:   # after the last arrival: until the fleet is empty
        tau = k * interval_s
        pol.activate(tau)
        look(tau)
        if sum(views[r][0] for r in pol.held()) == 0:
            if arrived:
                pol.evaluate(tau, views, nblk, arrived, act=False)
            break
        pol.evaluate(tau, views, nblk, arrived)
        arrived, k = 0, k + 1
    for rep in reps:
        rep.advance_until(math.inf)
        rep.finish()
    finish = np.array([q.finish for q in reqs], dtype=np.float64)
    end = float(a[-1]) + routing_latency_s if n else 0.0
    if np.any(~np.isnan(finish)):
        end = max(end, float(np.nanmax(finish)))
    if horizon_s is not None:
        end = horizon_s
    for r, s in enumerate(pol.state):
        if s != OFF:
            pol.held_s[r] += max(end - pol.since[r], 0.0)
    return {
        "status": fleet_status(reqs, a, horizon_s),
        "first_token_s": np.array([q.first_token for q in reqs], dtype=np.float64),
        "finish_s": finish,
        "num_preemptions": np.array([q.num_preemptions for q in reqs], dtype=np.int64),
        "num_tokens": np.array([q.g for q in reqs], dtype=np.int64),
        "cached_tokens": np.array([q.cached_tokens for q in reqs], dtype=np.int64),
        "replica": np.array(owner, dtype=np.int64),
        "windows": np.array(pol.windows, dtype=np.float64).reshape(-1, 9),
        "replica_s": float(sum(pol.held_s)),
        "end_s": end,
        "events": pol.events,
        "starts": starts,
        "peak": pol.peak,
    }
