"""Validate Deployment (KV capacity), the roofline step time and Deployment.latency
against the measured vLLM runs (docs/deployment.md, docs/validation.md).

1. KV capacity: ``Deployment(...).num_gpu_blocks`` against the six counts vLLM
   reported (``fastsim/data/vllm_kv_cache_reports.csv``).
2. A10G / Qwen2.5-1.5B decode steps per batch size, predicted WITHOUT fitting on
   the A10G (datasheet figures + the L40S-class kernel efficiencies, and the
   median over the five microbenchmarked GPUs), then with the two corrections
   (per-step and per-sequence overhead) calibrated on the A10G TPOT traces.
3. The A10G serving sweep (32 runs, ``experiments/data/serving_sweep.csv``):
   mean TPOT, mean TTFT and request throughput, simulated with the
   deployment's engine and (a) the uncalibrated roofline latency, (b) the
   A10G-calibrated roofline (+ the preset's fitted client overhead), (c) the
   regression preset ``LatencyModel.preset("a10g-qwen2.5-1.5b")`` for reference.
4. The RTX 4090 / Llama-3.1-8B run (vLLM 0.19, 300 ShareGPT requests at ~10
   req/s): the same arrivals and lengths replayed through the deployment's
   engine and uncalibrated roofline latency, with prefix caching (shared
   prefixes found in the prompts' token ids, :func:`prefix_groups`) and without; TTFT/TPOT/E2E mean and
   percentiles against the measured ones, and the running/waiting series
   (figure ``experiments/output/rtx4090_series.png``).

Run: ``NUMBA_CACHE_DIR=/tmp/nbcache python experiments/deployment_validation.py [--reps 50]``
(reads ../shared/data, or FASTSIM_SHARED_DATA, for the RTX 4090 run; a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import time
import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import fastsim  # noqa: E402
from fastsim._roofline import Roofline, efficiencies  # noqa: E402

OUT = ROOT / "experiments" / "output"
# The project's shared data folder beside the checkout (not shipped), or FASTSIM_SHARED_DATA
RTX = Path(os.environ.get("FASTSIM_SHARED_DATA", ROOT.parent / "shared" / "data")) / "vllm-rtx4090-llama3.1-8b"
QWEN = "Qwen/Qwen2.5-1.5B-Instruct"


def kv_table():
    rep = pd.read_csv(resources.files("fastsim").joinpath("data/vllm_kv_cache_reports.csv"))
    rows = []
    for r in rep.itertuples():
        d = fastsim.Deployment(model=r.model, gpu=r.gpu, gpu_memory_utilization=r.gpu_memory_utilization,
                               max_num_seqs=r.max_num_seqs, max_num_batched_tokens=r.max_num_batched_tokens,
                               max_model_len=r.max_model_len, block_size=r.block_size)
        rows.append({"gpu": r.gpu, "vllm": r.vllm_version, "util": r.gpu_memory_utilization,
                     "max_num_seqs": r.max_num_seqs, "vllm_blocks": r.num_gpu_blocks,
                     "fastsim_blocks": d.num_gpu_blocks,
                     "rel_error": d.num_gpu_blocks / r.num_gpu_blocks - 1})
    return pd.DataFrame(rows)


def a10g_deployment(util=0.9, seqs=64):
    return fastsim.Deployment(model=QWEN, gpu="A10G", gpu_memory_utilization=util, max_num_seqs=seqs,
                              max_num_batched_tokens=2048, max_model_len=2048, enable_prefix_caching=False)


def decode_table():
    tr = json.loads((ROOT / "fastsim" / "data" / "tpot_traces.json").read_text())["measurements"]
    b = np.array([m["batch_size"] for m in tr], float)
    meas = np.array([m["mean_step_latency_s"] for m in tr])
    dep = a10g_deployment()
    ctx = 20 + 24  # prompt (~20 tokens) + mean generated tokens of the 48-token traces
    r_cls = dep.roofline
    r_med = Roofline(model=dep.spec, gpu=dep.gpu, eff=efficiencies(None))
    r_cal = r_cls.calibrated(b, meas, ctx)
    t = pd.DataFrame({"batch": b.astype(int), "measured_ms": meas * 1e3,
                      "roofline_l40s_class_ms": r_cls.decode_step(b, ctx) * 1e3,
                      "roofline_median_eff_ms": r_med.decode_step(b, ctx) * 1e3,
                      "roofline_calibrated_ms": r_cal.decode_step(b, ctx) * 1e3})
    for c in ("roofline_l40s_class_ms", "roofline_median_eff_ms", "roofline_calibrated_ms"):
        t[c.replace("_ms", "_err")] = t[c] / t.measured_ms - 1
    return t, r_cal


def sweep_table(r_cal, reps):
    """The sweep under vLLM 0.22's V1 rules, warm prefix cache where the server's previous run left
    the prompts cached (as ``vllm_a10g_validation``'s headline), each deployment's own KV blocks."""
    import dataclasses

    from vllm_a10g_validation import SWEEP, V1_RULES, scenario_for, warm_prefix_cache

    sweep = pd.read_csv(SWEEP)
    preset = fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b")   # the noisy preset, by name
    rows = []
    for row in sweep.itertuples(index=False):
        s = pd.Series(row._asdict())
        dep = a10g_deployment(util=float(s.gpu_memory_utilization), seqs=int(s.max_num_seqs))
        rng = dict(max_num_seqs=dep.max_num_seqs, max_num_batched_tokens=2048, max_context=2048,
                   ttft_overhead_s=preset.ttft_overhead_s)
        models = (("roofline", dep.latency), ("roofline, regression mapping", dep.regression_latency),
                  ("roofline+A10G corrections", r_cal.to_kernel_latency(**rng)),
                  ("roofline+A10G corrections, regression mapping", r_cal.to_latency_model(**rng)),
                  ("preset", preset))
        for name, lat in models:
            sc = scenario_for(s, lat, True, v1=True, warm=warm_prefix_cache(s, sweep))
            sc = sc.replace(engine=dataclasses.replace(dep.engine, **V1_RULES))
            res = fastsim.replicate(sc, reps, seed=1, n_threads=1, progress=False)
            for m, col in (("tpot_mean", "mean_tpot_s"), ("ttft_mean", "mean_ttft_s"),
                           ("request_throughput", "request_throughput")):
                rows.append({"rate": s.arrival_rate, "util": s.gpu_memory_utilization, "model": name, "metric": m,
                             "measured": getattr(s, col), "predicted": res.estimate(m)})
    t = pd.DataFrame(rows)
    t["rel_error"] = t.predicted / t.measured - 1
    return t


def prefix_groups(token_ids):
    """Shared prefixes from the prompts' token ids: requests whose first 16-token block is equal form a
    group; a member's prefix_len is its longest common prefix with another member (the kernel counts
    the full blocks of it), capped below its prompt length."""
    ids = [np.asarray(t) for t in token_ids]
    by_first = {}
    for i, t in enumerate(ids):
        by_first.setdefault(tuple(t[:16]), []).append(i)
    group = np.full(len(ids), -1)
    plen = np.zeros(len(ids), dtype=int)
    g = 0
    for members in by_first.values():
        if len(members) < 2:
            continue
        for i in members:
            best = 0
            for j in members:
                if j != i:
                    a, b = ids[i], ids[j]
                    n = min(len(a), len(b))
                    best = max(best, int(np.argmin(np.r_[a[:n] == b[:n], False])))
            group[i], plen[i] = g, min(best, len(ids[i]) - 1)
        g += 1
    return group, plen


def block_hashes(token_ids, block_size=16):
    """vLLM's block identities from the prompts' token ids: block ``j`` of a prompt is identified by
    its tokens and all tokens before it (a chained hash, as vLLM's ``hash_block_tokens``), so two
    prompts share block ``j`` exactly when their first ``(j + 1) * block_size`` tokens are equal.
    Only full blocks get one (a partial last block is never cached)."""
    import hashlib

    out = []
    for t in token_ids:
        t = np.asarray(t, dtype=np.int64)
        hs = []
        for j in range(t.size // block_size):
            d = hashlib.blake2b(t[:(j + 1) * block_size].tobytes(), digest_size=8).digest()
            hs.append(int.from_bytes(d, "little", signed=True))
        out.append(np.asarray(hs, dtype=np.int64))
    return out


#: The RTX 4090 replay's engine variants: name -> (V1 rules, prefix caching, backend). "sync": the
#: synchronous loop (the replay as first reported); "v1": vLLM's V1 rules (async scheduling, the
#: full-input gate, the null block), caching off; "v1+cache": and prefix caching by block hash on the
#: prompts' token ids, as vLLM 0.19 served the run (the reference simulator: the kernel has no caching
#: by block hash yet); "sync+groups": the kernel's prefix-group model (:func:`prefix_groups`);
#: "v1+cache, vLLM's blocks": "v1+cache" with the block count vLLM reported (``meta.json``), not
#: ``Deployment``'s.
RTX_VARIANTS = {"sync": (False, False, "numba"), "sync+groups": (False, "groups", "numba"),
                "v1": (True, False, "numba"), "v1+cache": (True, "hash", "reference"),
                "v1+cache, vLLM's blocks": (True, "hash", "reference"),
                "v1+cache, regression mapping": (True, "hash", "reference")}
#: Every variant runs the roofline evaluated per step (``Deployment.latency``) but the one named
#: "regression mapping" (``Deployment.regression_latency``, the roofline mapped onto the regression form).


def rtx_replay(variant="v1+cache"):
    """Replay the RTX 4090 run under ``RTX_VARIANTS[variant]`` (one deterministic run)."""
    import dataclasses

    from fastsim._reference import simulate_reference

    v1, caching, backend = RTX_VARIANTS[variant]
    wl = pd.read_json(RTX / "workload.jsonl", lines=True)
    rq = pd.read_json(RTX / "requests.jsonl", lines=True)
    dep = fastsim.Deployment(model="meta-llama/Llama-3.1-8B", gpu="RTX-4090", gpu_memory_utilization=0.9,
                             max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=32768, block_size=16,
                             enable_prefix_caching=bool(caching))
    engine = dep.engine
    if v1:
        # vLLM 0.19's resolved config (meta.json): async_scheduling and scheduler_reserve_full_isl on; its
        # block pool keeps the null block as 0.22's does. num_gpu_blocks is then the count vLLM reports.
        engine = dataclasses.replace(engine, async_scheduling=True, scheduler_reserve_full_isl=True,
                                     null_block=True, block_hash_caching=caching == "hash")
    else:
        # the synchronous loop as first reported: the V1 rules off explicitly (they are the defaults)
        engine = dataclasses.replace(engine, async_scheduling=False, scheduler_reserve_full_isl=False,
                                     null_block=False, block_hash_caching=False)
    if variant.endswith("vLLM's blocks"):
        meta = json.loads((RTX / "meta.json").read_text())
        engine = dataclasses.replace(engine, num_gpu_blocks=int(meta["kv_cache"]["num_gpu_blocks"]))
    reqs = pd.DataFrame({"arrival_s": wl.arrival_time_ns.to_numpy() / 1e9, "prompt_len": wl.input_toks,
                         "output_len": wl.output_toks})
    if caching == "groups":
        reqs["prefix_group"], reqs["prefix_len"] = prefix_groups(wl.input_tok_ids)
    lat = dep.regression_latency if variant.endswith("regression mapping") else dep.latency
    sc = fastsim.Scenario(engine=engine, latency=lat,
                          workload=fastsim.Workload(arrival_rate=10.0, num_requests=len(reqs)))
    step_log = None
    if backend == "reference":
        a, p, o = (reqs[c].to_numpy() for c in ("arrival_s", "prompt_len", "output_len"))
        res = simulate_reference(a, p, o, np.zeros(a.size, np.int64), engine, lat,
                                 block_hashes=block_hashes(wl.input_tok_ids, engine.block_size),
                                 hash_block_size=engine.block_size)
        c0 = dep.latency.ttft_overhead_s
        first, fin = np.asarray(res["first_token_s"]), np.asarray(res["finish_s"])
        sim = pd.DataFrame({"first_token_s": first, "finish_s": fin, "ttft_s": first - a + c0,
                            "e2e_s": fin - a + c0, "num_preemptions": res["num_preemptions"],
                            "cached_tokens": res["cached_tokens"]})
        step_log = np.asarray(res["step_log"])
    else:
        sim = fastsim.simulate_requests(sc, reqs)
    meas = pd.DataFrame({"ttft": rq.first_token_ts - rq.queued_ts,
                         "tpot": (rq.last_token_ts - rq.first_token_ts) / (rq.output_toks - 1).clip(lower=1),
                         "e2e": rq.last_token_ts - rq.queued_ts})
    simm = pd.DataFrame({"ttft": sim.ttft_s, "e2e": sim.e2e_s,
                         "tpot": (sim.e2e_s - sim.ttft_s) / (reqs.output_len - 1).clip(lower=1)})
    ok = rq.output_toks > 1
    rows = []
    for m in ("ttft", "tpot", "e2e"):
        for stat, f in (("mean", np.mean), ("p50", lambda x: np.percentile(x, 50)),
                        ("p90", lambda x: np.percentile(x, 90)), ("p99", lambda x: np.percentile(x, 99))):
            a_, b_ = f(meas[m][ok]), f(simm[m][ok])
            rows.append({"metric": f"{m}_{stat}", "measured_s": a_, "simulated_s": b_, "rel_error": b_ / a_ - 1})
    info = {"preemptions": int(np.sum(sim.num_preemptions)), "cached_tokens": int(np.sum(sim.cached_tokens)),
            "usable_blocks": engine.usable_gpu_blocks, "num_gpu_blocks": engine.num_gpu_blocks}
    series = _series(reqs, sim, rq, step_log, engine.usable_gpu_blocks)
    return pd.DataFrame(rows), series, dep, info


def _series(reqs, sim, rq, step_log=None, usable_blocks=None):
    ts = pd.read_csv(RTX / "timeseries.csv")
    t = ts.t.to_numpy(float)
    out = {"t": t, "running_measured": ts.running, "waiting_measured": ts.waiting,
           "kv_pct_measured": ts.kv_cache_pct}
    if step_log is not None:
        # the reference's own per-step state (start, end, running, waiting, allocated blocks, ...), read at
        # the last step started by each second; KV % = allocated / usable blocks (vLLM's usage excludes
        # the null block too)
        k = np.clip(np.searchsorted(step_log[:, 0], t, side="right") - 1, 0, None)
        idle = t > step_log[-1, 1]
        out["running_sim"] = np.where(idle, 0, step_log[k, 2])
        out["waiting_sim"] = np.where(idle, 0, step_log[k, 3])
        out["kv_pct_sim"] = np.where(idle, 0.0, 100.0 * step_log[k, 4] / usable_blocks)
    else:
        arr = reqs.arrival_s.to_numpy()
        first, fin = sim.first_token_s.to_numpy(), sim.finish_s.to_numpy()
        # from per-request times only: waiting = arrived, no first token yet (a prefill chunk is short
        # next to the queueing); running = first token out, not finished
        out["waiting_sim"] = [(np.sum((arr <= x) & (first > x))) for x in t]
        out["running_sim"] = [(np.sum((first <= x) & (fin > x))) for x in t]
    return pd.DataFrame(out)


def plot_series(series, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 3.8))
    ax.plot(series.t, series.running_measured, "C0-", label="running (vLLM)")
    ax.plot(series.t, series.running_sim, "C0--", label="running (fastsim)")
    ax.plot(series.t, series.waiting_measured, "C1-", label="waiting (vLLM)")
    ax.plot(series.t, series.waiting_sim, "C1--", label="waiting (fastsim)")
    ax.set_xlabel("time since the first request (s)")
    ax.set_ylabel("requests")
    ax.legend(fontsize=8)
    ax2.plot(series.t, series.kv_pct_measured, "C2-", label="KV cache use (vLLM)")
    if "kv_pct_sim" in series:
        ax2.plot(series.t, series.kv_pct_sim, "C2--", label="KV cache use (fastsim)")
    ax2.set_xlabel("time since the first request (s)")
    ax2.set_ylabel("KV cache use (%)")
    ax2.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="3 replications a run (a smoke test)")
    ap.add_argument("--rtx-only", action="store_true", help="only the RTX 4090 replay (section 4)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps = 3
    if not RTX.is_dir():
        raise SystemExit(f"needs the RTX 4090 run at {RTX} (set FASTSIM_SHARED_DATA)")
    OUT.mkdir(exist_ok=True)
    pd.set_option("display.width", 200)
    if not args.rtx_only:
        kv = kv_table()
        print("KV capacity\n", kv.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        dec, r_cal = decode_table()
        print(f"\nA10G decode step (corrections: step_overhead_s={r_cal.step_overhead_s:.4g}, "
              f"per_seq_overhead_s={r_cal.per_seq_overhead_s:.4g})\n", dec.round(4).to_string(index=False))
        lm = a10g_deployment().latency
        print("\nA10G mapping onto the kernel form:", lm, "\n", lm.calibration)
        sw = sweep_table(r_cal, args.reps)
        sw.to_csv(OUT / "deployment_validation_a10g_sweep.csv", index=False)
        summ = sw.groupby(["model", "metric"]).rel_error.agg(
            mean_abs=lambda x: np.mean(np.abs(x)), max_abs=lambda x: np.max(np.abs(x)), mean="mean")
        print("\nA10G sweep (32 runs): relative error of the simulated metric\n", summ.round(4).to_string())
        sub = sw[sw.rate <= 4.0].groupby(["model", "metric"]).rel_error.agg(mean_abs=lambda x: np.mean(np.abs(x)))
        print("\n  rates <= 4 req/s:\n", sub.round(4).to_string())
    # the replay under each engine variant; the headline is vLLM's own rules with prefix caching by block hash
    tabs, infos = {}, {}
    for name in RTX_VARIANTS:
        t0 = time.perf_counter()
        tabs[name], series, dep, infos[name] = rtx_replay(name)
        infos[name]["seconds"] = round(time.perf_counter() - t0, 1)
        if name == "v1+cache":
            head_series = series
    print("\nRTX 4090 replay:", dep.summary(), "\nlatency:", dep.latency, "\n", dep.latency.calibration)
    rtx = tabs["v1+cache"][["metric", "measured_s"]].copy()
    for name, t in tabs.items():
        rtx[f"sim_{name}"] = t.simulated_s
        rtx[f"err_{name}"] = t.rel_error
    print(rtx.round(4).to_string(index=False))
    print("per variant:", infos)
    rtx.to_csv(OUT / "rtx4090_replay.csv", index=False)
    head_series.to_csv(OUT / "rtx4090_series.csv", index=False)
    plot_series(head_series, OUT / "rtx4090_series.png",
                "RTX 4090 / Llama-3.1-8B, vLLM 0.19, replayed with the uncalibrated roofline, vLLM's V1 rules "
                "and prefix caching by block hash")
    return 0


if __name__ == "__main__":
    sys.exit(main())
