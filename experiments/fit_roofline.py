"""Fit the roofline's kernel efficiencies to vLLM kernel microbenchmarks.

Reads ``../shared/data/gpu-kernels/<gpu>/`` (NVIDIA aiconfigurator-core
0.12.0, vLLM backend, Apache-2.0: GEMM, context and generation attention,
custom all-reduce timings in ms, with each system's ``system.yaml``) and
writes ``fastsim/data/roofline_efficiencies.json``: per microbenchmarked GPU,
the fitted efficiencies (fractions of the datasheet peaks) and fixed
latencies of the four kernel families, with the fit's median and 90th
percentile absolute relative error, and the leave-one-GPU-out errors (each
GPU predicted with the median efficiencies of the other four).

The context (prefill) attention is fitted as the engine evaluates a chunk:
its causal FLOPs at the fitted compute efficiency plus its KV bytes at the
decode attention's fitted bandwidth efficiency (the step's context term),
added: the microbenchmarks show the KV bytes adding to, not hiding under,
the compute time (``experiments/ctx_attention_form.py``).

Run: ``python experiments/fit_roofline.py`` (about a minute). Only this
script reads ../shared; the package reads the JSON.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

# The project's shared data folder beside the checkout (not shipped with the
# package), or FASTSIM_SHARED_DATA
SHARED = Path(os.environ.get("FASTSIM_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
ROOT = SHARED / "gpu-kernels"
OUT = Path(__file__).resolve().parents[1] / "fastsim" / "data" / "roofline_efficiencies.json"
GPUS = ["a100_sxm", "b200_sxm", "h100_sxm", "h200_sxm", "l40s"]
RNG = np.random.default_rng(0)
MAX_ROWS = 6000


def read_system(g):
    spec = {}
    for line in (ROOT / g / "system.yaml").read_text().splitlines():
        key, _, rest = line.strip().partition(":")
        val = rest.split("#")[0].strip()
        if key in ("mem_bw", "bfloat16_tc_flops", "fp8_tc_flops", "intra_node_bw") and val:
            spec[key] = float(val)
    return spec


def newest(g, sub, name):
    files = sorted(glob.glob(str(ROOT / g / sub / "vllm" / "*" / name)),
                   key=lambda p: tuple(int(x) for x in Path(p).parent.name.split(".")[:3]))
    return pd.read_parquet(files[-1])


def sample(df):
    return df.sample(MAX_ROWS, random_state=0) if len(df) > MAX_ROWS else df


# ---- the four kernel families: (work arrays) -> predicted seconds, parameters in log space ----------

def gemm_data(g):
    d = newest(g, "gemm", "gemm_perf.parquet")
    d = d[d.gemm_dtype == "bfloat16"]
    d = sample(d)
    m, n, k = (d[c].to_numpy(float) for c in "mnk")
    return {"flops": 2 * m * n * k, "bytes": 2.0 * (m * k + k * n + m * n)}, d.latency.to_numpy() * 1e-3


def gen_attn_data(g):
    d = newest(g, "attention", "generation_attention_perf.parquet")
    d = d[(d.kv_cache_dtype == "bfloat16") & ((d.window_size == 0) if "window_size" in d else True)]
    # one kernel per GPU: the fastest on median (what vLLM's backend selection aims at)
    best = d.groupby("kernel_source").latency.median().idxmin()
    d = sample(d[d.kernel_source == best])
    ctx = d.isl.to_numpy(float) + d.step.to_numpy(float)
    kv = (d.batch_size.to_numpy(float) * ctx * d.num_key_value_heads.to_numpy(float)
          * d.head_dim.to_numpy(float) * 2 * 2)
    return {"bytes": kv, "seqs": d.batch_size.to_numpy(float)}, d.latency.to_numpy() * 1e-3


def ctx_attn_data(g):
    d = newest(g, "attention", "context_attention_perf.parquet")
    d = d[(d.kv_cache_dtype == "bfloat16") & ((d.window_size == 0) if "window_size" in d else True)]
    d = d[~d.kernel_source.str.contains("decode")]  # B200 also lists its decode kernel here
    best = d.groupby("kernel_source").latency.median().idxmin()
    d = sample(d[d.kernel_source == best])
    s = d.isl.to_numpy(float)
    b, hd = d.batch_size.to_numpy(float), d.head_dim.to_numpy(float)
    flops = 2 * 2 * b * s * s / 2 * d.num_heads.to_numpy(float) * hd
    # the KV bytes of the chunk, which the engine's step charges apart (its context term, at the
    # decode attention's bandwidth efficiency), so that they are not counted twice
    kv = b * s * d.num_key_value_heads.to_numpy(float) * hd * 2 * 2
    return {"flops": flops, "kv_bytes": kv}, d.latency.to_numpy() * 1e-3


def allreduce_data(g):
    d = newest(g, "comm", "custom_allreduce_perf.parquet")
    d = d[d.backend == "vllm_graph"]
    # message_size counts bf16 elements; a ring all-reduce moves 2 (n - 1) / n of the message per GPU
    n = d.num_gpus.to_numpy(float)
    return {"bytes": d.message_size.to_numpy(float) * 2 * 2 * (n - 1) / n}, d.latency.to_numpy() * 1e-3


def predict(kind, p, work, spec):
    """Seconds predicted by one family's roofline; p = efficiencies and latency."""
    if kind == "gemm":
        eta_c, eta_m, t0 = p
        return t0 + np.maximum(work["flops"] / (eta_c * spec["bfloat16_tc_flops"]),
                               work["bytes"] / (eta_m * spec["mem_bw"]))
    if kind == "gen_attn":
        # a fixed time per sequence besides the KV read (each sequence's own work: its block
        # table walk, its split's reduction), which the microbenchmarks show on every GPU
        eta_m, t0, t_seq = p
        return t0 + t_seq * work["seqs"] + work["bytes"] / (eta_m * spec["mem_bw"])
    if kind == "ctx_attn":
        # compute plus the chunk's KV read at the decode attention's efficiency (spec["gen_attn_eta"]),
        # added, not overlapped: the microbenchmarks' KV-head axis says so (experiments/ctx_attention_form.py)
        eta_c, t0 = p
        return (t0 + work["flops"] / (eta_c * spec["bfloat16_tc_flops"])
                + work["kv_bytes"] / (spec["gen_attn_eta"] * spec["mem_bw"]))
    eta, t0 = p
    return t0 + work["bytes"] / (eta * spec["intra_node_bw"])


FAMILIES = {"gemm": (gemm_data, [0.6, 0.7, 5e-6]), "gen_attn": (gen_attn_data, [0.5, 5e-6, 1e-7]),
            "ctx_attn": (ctx_attn_data, [0.4, 5e-6]), "allreduce": (allreduce_data, [0.5, 5e-6])}


def fit(kind, work, y, spec):
    x0 = np.log(FAMILIES[kind][1])

    def resid(lp):
        return np.log(predict(kind, np.exp(lp), work, spec)) - np.log(y)

    r = least_squares(resid, x0, loss="soft_l1", f_scale=0.1)
    return np.exp(r.x)


def errors(kind, p, work, y, spec):
    e = np.abs(predict(kind, p, work, spec) / y - 1)
    return {"median_abs_rel_error": float(np.median(e)), "p90_abs_rel_error": float(np.percentile(e, 90)),
            "n": int(y.size)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fit on 500 rows a family and print the table without writing the package's JSON")
    args = ap.parse_args(argv)
    if not ROOT.is_dir():
        raise SystemExit(f"needs the vLLM kernel microbenchmarks at {ROOT} (set FASTSIM_SHARED_DATA)")
    global MAX_ROWS
    if args.quick:
        MAX_ROWS = 500
    specs = {g: read_system(g) for g in GPUS}
    data = {g: {k: FAMILIES[k][0](g) for k in FAMILIES} for g in GPUS}
    params = {g: {} for g in GPUS}
    for g in GPUS:
        for k in FAMILIES:   # (gen_attn before ctx_attn: the latter reads the former's efficiency)
            params[g][k] = fit(k, *data[g][k], specs[g])
            if k == "gen_attn":
                specs[g]["gen_attn_eta"] = float(params[g][k][0])
    out = {"source": "fit by experiments/fit_roofline.py to ../shared/data/gpu-kernels (aiconfigurator-core "
                     "0.12.0 vLLM microbenchmarks, Apache-2.0); efficiencies are fractions of the system.yaml "
                     "peaks, latencies in seconds",
           "parameters": {"gemm": ["eta_compute", "eta_memory", "latency_s"],
                          "gen_attn": ["eta_memory", "latency_s", "per_seq_s"],
                          "ctx_attn": ["eta_compute", "latency_s"], "allreduce": ["eta_link", "latency_s"]},
           "gpus": {}}
    for g in GPUS:
        entry = {"peaks": {k: v for k, v in specs[g].items() if k != "gen_attn_eta"}}
        # left out: the GPU predicted with the others' median efficiencies (the decode
        # attention's too, which the context attention's form reads)
        loo = dict(specs[g], gen_attn_eta=float(np.median([params[o]["gen_attn"][0] for o in GPUS if o != g])))
        for k in FAMILIES:
            others = np.median([params[o][k] for o in GPUS if o != g], axis=0)
            entry[k] = {"params": [float(v) for v in params[g][k]],
                        "fit": errors(k, params[g][k], *data[g][k], specs[g]),
                        "leave_one_gpu_out": errors(k, others, *data[g][k], loo)}
        out["gpus"][g] = entry
    out["median_of_gpus"] = {k: [float(v) for v in np.median([params[g][k] for g in GPUS], axis=0)] for k in FAMILIES}
    if not args.quick:
        OUT.write_text(json.dumps(out, indent=1) + "\n")
    rows = []
    for g in GPUS:
        for k in FAMILIES:
            e = out["gpus"][g][k]
            rows.append((g, k, *np.round(e["params"], 6), e["fit"]["median_abs_rel_error"],
                         e["leave_one_gpu_out"]["median_abs_rel_error"]))
    for r in rows:
        print(*r, sep="\t")
    return 0


if __name__ == "__main__":
    sys.exit(main())
