"""Replications per second on the GPU vs the CPU kernel (a script, not a test).

    python benchmarks/gpu_vs_cpu.py [--requests 1000] [--replications 1000 10000 100000]
        [--cpu-max 10000] [--time-limit 120] [--deadline 0] [--variants] [--bits] [--json PATH]

Runs the issue-7 reference workload and ShareGPT at ~80% load with
``backend="numba"`` (all cores) and ``backend="cuda"``, after compilation,
and prints replications/s for each count, the GPU/CPU ratio and the GPU
model. Before timing, it compares the two backends replication by
replication (the share of metric rows that are bit-identical, of rows with
the same counts, and the largest relative difference).

A measurement whose time, projected from the last one, would exceed
``--time-limit`` seconds is skipped (and said so), as is everything once
``--deadline`` seconds (0: none) have passed since start: the script is
meant for a short lease on a lent GPU. ``--bits`` ends with `gpu_bits.py`'s
comparisons (in this process: no second compilation). ``--variants`` also times the
simulate launch's block size (32, 64, 128 threads) and the device-memory
budget (2 and 16 GiB and the default, a share of the free memory: how many
replications are in flight at once) on ShareGPT at ``--variant-replications``.

Needs ``pip install 'fastsim-llm[gpu]'`` and an NVIDIA GPU; without one it
says what is missing and exits with status 2.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from fastsim import _cuda  # noqa: E402
from fastsim import kernel as K  # noqa: E402
from fastsim._cuda import cuda_unavailable_reason  # noqa: E402
from benchmarks.common import reference_workload, sharegpt_80pct  # noqa: E402

_START = time.perf_counter()
COUNTS = ("n_arrived", "n_completed", "n_rejected", "n_dropped", "n_preemptions")


def run(sc, nrep, backend):
    """(seconds, per-replication metrics) of one ``replicate`` call."""
    t = time.perf_counter()
    res = fastsim.replicate(sc, n_replications=nrep, seed=0, backend=backend, progress=False)
    return time.perf_counter() - t, res.per_replication.to_numpy()


def agreement(cpu, gpu):
    """Shares of bit-identical rows and of rows with the same counts; the
    largest relative difference of the metrics over rows with the same counts."""
    same_bits = np.array([np.array_equal(a, b, equal_nan=True) for a, b in zip(cpu, gpu)])
    idx = [K.COLUMNS.index(n) for n in COUNTS]
    same_counts = (cpu[:, idx] == gpu[:, idx]).all(axis=1)
    a, b = cpu[same_counts], gpu[same_counts]
    finite = np.isfinite(a) & np.isfinite(b)
    rel = np.abs(a - b)[finite] / np.maximum(np.abs(a[finite]), 1e-300)
    nan_mismatch = int((np.isnan(a) != np.isnan(b)).sum())
    return dict(rows=len(cpu), bit_identical=float(same_bits.mean()), same_counts=float(same_counts.mean()),
                max_rel_diff=float(rel.max()) if rel.size else 0.0, nan_mismatches=nan_mismatch)


class Clock:
    """Skips what would not finish in time."""

    def __init__(self, limit, deadline):
        self.limit, self.deadline = limit, deadline

    def allows(self, projected):
        if self.deadline and time.perf_counter() - _START + projected > self.deadline:
            return False
        return projected <= self.limit


def set_launch(threads_per_block, memory_budget):
    """The GPU launch's block size and memory budget (bytes; None: the
    backend's default) for the next runs (`replicate` does not expose them:
    they are the backend's tuning knobs)."""
    kw = _cuda.run_replications_cuda.__kwdefaults__
    kw["threads_per_block"] = int(threads_per_block)
    kw["memory_budget"] = None if memory_budget is None else int(memory_budget)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--replications", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--cpu-max", type=int, default=10_000,
                    help="time the CPU up to this many replications and extrapolate linearly beyond")
    ap.add_argument("--time-limit", type=float, default=float("inf"),
                    help="skip a measurement projected to take longer than this (s)")
    ap.add_argument("--deadline", type=float, default=0.0, help="stop measuring after this many s (0: never)")
    ap.add_argument("--agreement-replications", type=int, default=2000)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--variant-replications", type=int, default=100_000)
    ap.add_argument("--bits", action="store_true",
                    help="last, where the results part from the CPU's (benchmarks/gpu_bits.py, in this process)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    reason = cuda_unavailable_reason()
    if reason is not None:
        print(f"no GPU backend here: {reason}")
        return 2
    clock = Clock(args.time_limit, args.deadline)
    from numba import config as numba_config

    if numba_config.ENABLE_CUDASIM:   # (CuPy may be installed beside it, with no device to ask)
        gpu_name = "CUDA simulator"
    else:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        gpu_name = props["name"].decode()
    threads = fastsim._replicate._thread_count(None)
    print(f"GPU: {gpu_name}; CPU threads: {threads}", flush=True)
    report = dict(gpu=gpu_name, cpu_threads=threads, requests=args.requests, workloads={})
    workloads = (("reference workload", reference_workload), ("ShareGPT 80%", sharegpt_80pct))
    for name, factory in workloads:
        sc = factory(args.requests)
        entry = report["workloads"][name] = dict(rows=[])
        t0 = time.perf_counter()
        run(sc, 64, "numba")
        t1 = time.perf_counter()
        run(sc, 64, "cuda")
        entry["first_call_s"] = dict(numba=t1 - t0, cuda=time.perf_counter() - t1)
        m = args.agreement_replications
        _, cpu = run(sc, m, "numba")
        _, gpu = run(sc, m, "cuda")
        entry["agreement"] = agreement(cpu, gpu)
        print(f"{name}, {args.requests} requests per replication; first calls (compile) "
              f"{entry['first_call_s']['numba']:.1f} s CPU, {entry['first_call_s']['cuda']:.1f} s GPU", flush=True)
        print(f"agreement over {m:,} replications: {entry['agreement']}", flush=True)
        print("replications | CPU rep/s | GPU rep/s | GPU / CPU | GPU s", flush=True)
        cpu_rate = gpu_rate = None
        for nrep in args.replications:
            ncpu = min(nrep, args.cpu_max)
            if cpu_rate is not None and not clock.allows(ncpu / cpu_rate):
                print(f"{nrep:>12,} | skipped (CPU projected {ncpu / cpu_rate:.0f} s)", flush=True)
                break
            if gpu_rate is not None and not clock.allows(nrep / gpu_rate):
                print(f"{nrep:>12,} | skipped (GPU projected {nrep / gpu_rate:.0f} s)", flush=True)
                break
            s, _ = run(sc, ncpu, "numba")
            cpu_rate = ncpu / s
            s, _ = run(sc, nrep, "cuda")
            gpu_rate = nrep / s
            entry["rows"].append(dict(replications=nrep, cpu_replications=ncpu, cpu_rate=cpu_rate,
                                      gpu_rate=gpu_rate, gpu_seconds=s))
            print(f"{nrep:>12,} | {cpu_rate:>9,.0f} | {gpu_rate:>9,.0f} | {gpu_rate / cpu_rate:>9.2f} | {s:.2f}",
                  flush=True)
    if args.variants:
        sc = sharegpt_80pct(args.requests)
        n = args.variant_replications
        rows = report["variants"] = []
        print(f"ShareGPT 80%, {n:,} replications: GPU launch variants", flush=True)
        print("threads/block | budget GiB | GPU rep/s | GPU s", flush=True)
        shapes = [(tpb, gib) for gib in (None, 2, 16) for tpb in (32, 64, 128)]
        try:
            for tpb, budget_gib in shapes:
                if not clock.allows(0.0):
                    print("variants: deadline reached", flush=True)
                    break
                set_launch(tpb, budget_gib and budget_gib * 1024 ** 3)
                s, _ = run(sc, n, "cuda")
                rows.append(dict(threads_per_block=tpb, memory_budget_gib=budget_gib, gpu_rate=n / s, gpu_seconds=s))
                print(f"{tpb:>13} | {budget_gib or 'default':>10} | {n / s:>9,.0f} | {s:.2f}", flush=True)
        finally:
            set_launch(_cuda.THREADS_PER_BLOCK, None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.bits and clock.allows(0.0):
        import gpu_bits

        gpu_bits.diagnose(args.agreement_replications, args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
