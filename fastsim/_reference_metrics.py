"""``backend="reference"``: replications run by the pure-Python reference
simulator, with metrics computed here in plain NumPy from its per-request
output, independently of the kernel's own reduction (``kernel.metrics._reduce``).

Only the workload sampling is shared with the kernel (by design: the two
backends must simulate the same request streams).
"""

from __future__ import annotations

import numpy as np

from . import kernel as K
from ._reference import (COMPLETED, DROPPED, REJECTED_ADMISSION, REJECTED_TOO_LONG, UNFINISHED,
                         simulate_reference)


def reference_row(res: dict, arrival, output, scenario, prompt=None) -> dict:
    """The per-replication metrics (``docs/engine-model.md``, "Metrics") of one reference run."""
    e, w = scenario.engine, scenario.workload
    n = arrival.size
    warm = w.warmup_requests
    status = res["status"]
    meas = np.arange(n) >= warm
    done = meas & (status == COMPLETED)
    c = scenario.latency.ttft_overhead_s
    ttft = res["first_token_s"][done] - arrival[done] + c
    e2e = res["finish_s"][done] - arrival[done] + c
    o = output[done]
    multi = o > 1
    tpot = (res["finish_s"][done][multi] - res["first_token_s"][done][multi]) / (o[multi] - 1)
    gaps = [res["itl_gaps_s"][i] for i in np.flatnonzero(meas)]
    itl = np.concatenate(gaps) if gaps else np.zeros(0)
    good = np.ones(ttft.size, bool)
    if scenario.ttft_slo_s is not None:
        good &= ttft <= scenario.ttft_slo_s
    if scenario.tpot_slo_s is not None:
        tp_all = np.full(ttft.size, -np.inf)
        tp_all[multi] = tpot
        good &= tp_all <= scenario.tpot_slo_s

    def stat(x, fn):
        return float(fn(x)) if x.size else np.nan

    end = res["end_s"]
    nm = max(n - warm, 0)   # (a horizon can stop arrivals before the warm-up ends)
    ws = 0.0 if warm == 0 else (arrival[warm] if nm > 0 else np.inf)
    horizon = w.horizon_s
    we = horizon if horizon is not None else np.inf
    window = ((horizon if horizon is not None else end + c) - ws) if nm > 0 else 0.0
    log = res["step_log"]
    t0, t1 = log[:, 0], log[:, 1]
    overlap = np.clip(np.minimum(t1, we) - np.maximum(t0, ws), 0.0, None)
    accepted = np.isin(status, (COMPLETED, DROPPED, UNFINISHED))
    late = accepted & (res["ingested_s"] > arrival)
    queue_extra = np.clip(np.minimum(res["ingested_s"][late], we) - np.maximum(arrival[late], ws),
                          0.0, None).sum()
    row = {
        "ttft_mean": stat(ttft, np.mean), "ttft_p50": stat(ttft, lambda x: np.percentile(x, 50)),
        "ttft_p90": stat(ttft, lambda x: np.percentile(x, 90)),
        "ttft_p95": stat(ttft, lambda x: np.percentile(x, 95)),
        "ttft_p99": stat(ttft, lambda x: np.percentile(x, 99)),
        "tpot_mean": stat(tpot, np.mean), "tpot_p50": stat(tpot, lambda x: np.percentile(x, 50)),
        "tpot_p99": stat(tpot, lambda x: np.percentile(x, 99)),
        "itl_mean": stat(itl, np.mean), "itl_p50": stat(itl, lambda x: np.percentile(x, 50)),
        "itl_p99": stat(itl, lambda x: np.percentile(x, 99)),
        "e2e_mean": stat(e2e, np.mean), "e2e_p50": stat(e2e, lambda x: np.percentile(x, 50)),
        "e2e_p99": stat(e2e, lambda x: np.percentile(x, 99)),
    }
    if window > 0:
        row.update(request_throughput=done.sum() / window, output_throughput=o.sum() / window,
                   goodput=good.sum() / window,
                   batch_occupancy_mean=(overlap * log[:, 2]).sum() / e.max_num_seqs / window,
                   queue_depth_mean=((overlap * log[:, 3]).sum() + queue_extra) / window,
                   kv_utilization_mean=(overlap * log[:, 4]).sum() / e.usable_gpu_blocks / window)
    else:
        row.update(dict.fromkeys(("request_throughput", "output_throughput", "goodput",
                                  "batch_occupancy_mean", "queue_depth_mean", "kv_utilization_mean"), np.nan))
    st_m = status[meas]
    pre = res["num_preemptions"]
    row.update(
        blocking_probability=np.isin(st_m, (REJECTED_TOO_LONG, REJECTED_ADMISSION)).mean() if nm else np.nan,
        drop_probability=(st_m == DROPPED).mean() if nm else np.nan,
        preemptions_per_request=pre[meas].sum() / nm if nm else np.nan,
    )
    # Issue-10 metrics (docs/engine-model.md), columns of the kernel's row too.
    swaps = res["num_swaps"]
    queried = res["prefix_queried"] & meas
    query = prompt[queried].sum() if prompt is not None and queried.any() else 0
    row.update(
        swaps_per_request=swaps[meas].sum() / nm if nm else np.nan,
        prefix_hit_rate=res["cached_tokens"][queried].sum() / query if query else np.nan,
        n_swaps=swaps.sum(),
    )
    finish = np.where(status == UNFINISHED, end, res["finish_s"])
    sojourn = np.where(accepted, finish - arrival, 0.0)
    row.update(
        n_arrived=n, n_completed=(status == COMPLETED).sum(),
        n_rejected=np.isin(status, (REJECTED_TOO_LONG, REJECTED_ADMISSION)).sum(),
        n_rejected_too_long=(status == REJECTED_TOO_LONG).sum(),
        n_rejected_admission=(status == REJECTED_ADMISSION).sum(),
        n_dropped=(status == DROPPED).sum(), n_unfinished=(status == UNFINISHED).sum(),
        n_preemptions=pre.sum(), n_measured=nm, n_steps=res["num_steps"],
        max_blocks_used=res["max_blocks_used"], blocks_used_at_end=res["blocks_used_at_end"],
        max_swap_blocks_used=res["max_swap_blocks_used"],
        window_s=window, end_s=end,
        # by its definition, each accepted request from its arrival to its departure (the kernel
        # counts the requests in the system step by step: this checks that count)
        time_in_system_integral=(np.minimum(finish, end) - arrival)[accepted].sum(),
        sojourn_sum=sojourn.sum(),
    )
    return row


def reference_sessions(scenario, latency, step_noise, arrival, p, o, c, sjfk, pgrp) -> dict:
    """`simulate_reference` of the kernel's columns of a workload of sessions
    (`workload._draw_sessions`), on the run's ``latency`` and ``step_noise``."""
    first = pgrp >= 0
    a0 = np.where(first, arrival, np.inf)
    with np.errstate(invalid="ignore"):   # (inf - inf in the check that arrivals do not decrease)
        res = simulate_reference(a0, p, o, c, scenario.engine, latency, horizon_s=scenario.workload.horizon_s,
                                  step_noise=step_noise, sessions=dict(
                                      users=scenario.workload.max_concurrency is not None, first=int(first.sum()),
                                      think=arrival, turns=np.where(first, sjfk + 1, -pgrp)))
    # the turns sent (the first ones: a send is made before any later one arrives)
    m = int((res["status"] != -1).sum())
    return {k: (v[:m] if isinstance(v, (np.ndarray, list)) and len(v) == arrival.size else v)
            for k, v in res.items()}


def run_reference_replications(scenario, packed, k0, k1, rep0, out, progress=None):
    """Fill ``out[j]`` with replication ``rep0 + j`` simulated by the reference."""
    p = packed
    w = scenario.workload
    rows = range(out.shape[0])
    if progress:
        from tqdm.auto import tqdm

        rows = tqdm(rows, desc="reference replications", unit="rep", leave=False)
    from dataclasses import replace

    from ._reference_noise import run_latency

    for j in rows:
        a, pr, o, c, q, grp, plen = K.draw_workload(rep0 + j, k0, k1, *K.scenario_arrays(p, lat=False))
        if w.sessions is not None:
            run, steps = run_latency(scenario.latency, k0, k1, rep0 + j)
            res = reference_sessions(scenario, run, steps, a, pr, o, c, q, grp)
            row = reference_row(res, res["arrival_s"], res["output_len"], replace(scenario, latency=run),
                                prompt=res["prompt_len"])
            out[j] = [row[name] for name in K.COLUMNS]
            continue
        think = None
        if w.closed_loop and w.arrival_rate is None:   # (the kernel's column: think times; `sample_requests`)
            think, a = a[w.max_concurrency:], np.zeros(a.size)
        # the replication's latency: its per-run effects and step noise (none when deterministic)
        run, steps = run_latency(scenario.latency, k0, k1, rep0 + j)
        extra = {}
        if p["ipar"][K.I_TRACE_HASH] == 1:   # (the trace's block identities; the kernel's columns: parents)
            tr = w.request_trace
            row0 = 0 if w.trace_window_s is None else K.trace_window(rep0 + j, k0, k1, tr.arrival_s,
                                                                     w.trace_window_s)[1]
            extra = dict(block_hashes=[tr.blocks(r) for r in range(row0, row0 + a.size)],
                         hash_block_size=tr.block_size)
            grp, plen = np.full(a.size, -1, np.int64), np.zeros(a.size, np.int64)
        res = simulate_reference(a, pr, o, c, scenario.engine, run,
                                 horizon_s=scenario.workload.horizon_s, sjf_key=q, prefix_group=grp,
                                 prefix_len=plen, step_noise=steps, max_concurrency=w.max_concurrency,
                                 think_time_s=think, **extra)
        # (a closed loop's arrivals: when each request was sent)
        row = reference_row(res, res["arrival_s"], o, replace(scenario, latency=run), prompt=pr)
        out[j] = [row[name] for name in K.COLUMNS]
