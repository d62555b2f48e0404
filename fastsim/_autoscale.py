"""Autoscaling fleets (`Fleet(autoscaler=Autoscaler(...))`, the policy in
`fastsim._autoscaler`), run by `replicate`/`compare` like a static fleet
(`run_autoscaled`, the compiled `kernel.autoscale`); one replication over
time: `fastsim._autoscale_run`.
"""

from __future__ import annotations


import numpy as np

from . import kernel as K
from .kernel import autoscale as A
from .kernel import cluster
from ._fleet import _FleetWorker, run_replications, trace_block_size

__all__ = ["run_autoscaled", "check_autoscaled"]

#: Routers an autoscaled fleet takes (the affinity routers' tables would
#: name replicas that come and go).
ROUTERS = ("random", "round_robin", "least_outstanding", "vllm_dp", "jsq", "power_of_two", "least_kv")


def check_autoscaled(scenario) -> None:
    """What an autoscaled fleet refuses, before any kernel runs."""
    f = scenario.fleet
    if f.router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)} with an autoscaler (an affinity or weighted "
                         f"router's table would name replicas that come and go), got {f.router!r}")
    if f.router_staleness_s != 0.0:
        raise ValueError(f"router_staleness_s must be 0 with an autoscaler (live state), got {f.router_staleness_s!r}")
    e = scenario.engine
    if e.enable_prefix_caching and not e.block_hash_caching:
        # (a new replica's cache is cold: the block pool is laid out empty when one
        # starts in a row; the prefix-group cache has no such reset)
        raise ValueError("block_hash_caching must be True with an autoscaler and enable_prefix_caching (prefix "
                         "caching by block hash; the prefix-group cache is not supported), got False")
    if scenario.workload.closed_loop:
        raise ValueError("max_concurrency must be None with an autoscaler (an open-loop stream), got "
                         f"{scenario.workload.max_concurrency!r}")


def _violation_minutes(windows, nwin, interval, attainment):
    arr = windows[:nwin, K.W_ARRIVALS]
    met = windows[:nwin, K.W_SLO_MET]
    bad = (arr > 0) & (met < attainment * arr)
    return float(bad.sum()) * interval / 60.0


class _Worker:
    """One thread's buffers (as `_fleet._FleetWorker`, and the policy's)."""

    def __init__(self, num_requests, nrep, trace_block_size=None):
        self.fleet = _FleetWorker(num_requests, nrep, 0, trace_block_size)
        self.nrep = nrep
        self.ab = None

    def give_back(self):
        """Hand the fleet's buffers on to a later run (`_fleet._FleetWorker.give_back`)."""
        self.fleet.give_back()

    def policy_buffers(self, nwin):
        if self.ab is None or self.ab.windows.shape[0] < nwin:
            self.ab = A.autoscale_buffers(self.nrep, nwin)
        return self.ab


def _one_run(worker, rep, k0, k1, packed, full):
    """One replication; returns (stream, fleet buffers, policy buffers, wm_i, wm_f, lat, fpar)."""
    buf = worker.fleet.buf
    n = K._draw_workload(np.int64(rep), np.uint64(k0), np.uint64(k1), *worker.fleet.arrays(packed), buf.state,
                         *buf.requests)
    stream = tuple(c[:n] for c in buf.requests)
    ipar = packed["ipar"]
    lat, fpar = K.run_records(packed["lat"], packed["fpar"], k0, k1, rep)
    need_i, need_f = K._ws_need_handed(np.int64(n), stream[1], stream[2], stream[5], stream[6], ipar)
    fb, wm_i, wm_f = worker.fleet.uniform_buffers(n, need_i, need_f, prompt=stream[1])
    apar = packed["apar"]
    nwin = A._window_guess(stream[0], apar)
    while True:
        ab = worker.policy_buffers(nwin)
        rc = A._simulate_autoscaled(np.int64(n), *stream, ipar, fpar, lat, packed["fleet"],
                                    np.int64(packed["router"]), apar, np.uint64(k0), np.uint64(k1),
                                    np.int64(rep), fb, ab, full)
        if rc != K.AS_WINDOWS_FULL:
            break
        nwin = 2 * ab.windows.shape[0]
    if rc < 0:
        raise RuntimeError(f"the autoscaled fleet could not be simulated (code {rc})")
    nw = int(ab.out[A.O_NWIN])
    A._window_slo(np.int64(n), stream[0], stream[2], ipar, fpar, float(apar[K.AS_INTERVAL]), fb, ab.windows, nw)
    return n, stream, fb, ab, wm_i, wm_f, fpar


def _per_request(n, fb):
    """(status codes, first-token times, finish times, preemptions) of each
    of the ``n`` requests, from its replica's row (laid out for the whole
    stream)."""
    owner, local = fb.owner[:n], fb.local[:n]
    return (np.array([fb.wi[r][K.WI_STATUS * n + j] for r, j in zip(owner, local)], np.int64),
            np.array([fb.wf[r][K.WF_FIRST * n + j] for r, j in zip(owner, local)]),
            np.array([fb.wf[r][K.WF_FINISH * n + j] for r, j in zip(owner, local)]),
            np.array([fb.wi[r][K.WI_NPRE * n + j] for r, j in zip(owner, local)], np.int64))


def served_autoscaled(scenario, packed, k0, k1, replication):
    """Each request of replication ``replication`` of the seed keys ``k0``,
    ``k1`` served by the scenario's autoscaled fleet: (status codes,
    first-token and finish times, preemptions, the run's TTFT overhead),
    for the per-class table and the stability check (``packed``: its
    `_pack.pack_scenario`)."""
    worker = _Worker(scenario.workload.num_requests, scenario.fleet.autoscaler.max_replicas, trace_block_size(scenario))
    n, _, fb, _, _, _, fpar = _one_run(worker, replication, k0, k1, packed, K.engine_variant(packed["ipar"]))
    return _per_request(n, fb) + (float(fpar[K.F_TTFT_OVERHEAD]),)


def _one(worker, rep, k0, k1, packed, scaler, full, out_row):
    n, stream, fb, ab, wm_i, wm_f, fpar = _one_run(worker, rep, k0, k1, packed, full)
    m = scaler.max_replicas
    c0, c1 = K.N_COLUMNS, K.N_COLUMNS + K.N_FLEET_COLUMNS
    cluster._reduce_fleet(np.int64(n), stream[0], stream[2], packed["ipar"], fpar, np.int64(m),
                          packed["fleet"][K.FL_LATENCY], fb, wm_i, wm_f, out_row[:c0], out_row[c0:c1])
    nw = int(ab.out[A.O_NWIN])
    held_s = sum(ab.life.tolist())
    end = float(ab.out[A.O_END])
    out_row[c1:] = (held_s * scaler.gpus_per_replica / 3600.0,
                    _violation_minutes(ab.windows, nw, scaler.interval_s, scaler.window_attainment),
                    held_s / end if end > 0 else np.nan, ab.out[A.O_PEAK], ab.out[A.O_EVENTS])


def run_autoscaled(scenario, packed, k0, k1, rep0, nrep, threads=1):
    """Rows (``nrep`` x (`COLUMNS` + `FLEET_COLUMNS` + `AUTOSCALE_COLUMNS`))
    of replications ``rep0 ..`` of an autoscaled fleet, on ``threads``
    threads; each replication keyed by its index alone. The fleet's means
    over replicas (batch occupancy, KV use) and its load balance are over
    the ``max_replicas`` rows."""
    scaler = scenario.fleet.autoscaler
    full = K.engine_variant(packed["ipar"])
    out = np.empty((nrep, K.N_COLUMNS + K.N_FLEET_COLUMNS + K.N_AUTOSCALE_COLUMNS))
    trace_bs = trace_block_size(scenario)
    run_replications(nrep, threads, lambda: _Worker(scenario.workload.num_requests, scaler.max_replicas, trace_bs),
                     lambda w, j: _one(w, rep0 + j, k0, k1, packed, scaler, full, out[j]), out=out)
    return out
