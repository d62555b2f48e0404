"""What per-step noise costs in simulation speed (a script, not a test).

    python benchmarks/noise_speed.py [--replications 100] [--rounds 7] [--requests 1000] [--cpu-time]

One-thread ``replicate`` on the ShareGPT benchmark workload
(`benchmarks/common.py: sharegpt_80pct`) in one process, variants alternated
round by round: the deterministic A10G model, its calibrated preset (per-run
effects only), and the preset with the per-step jitter fitted on the TPOT
traces (``jitter_sd=0.0119``) and with rare stalls too. Prints each one's
median time and its ratio to the deterministic model's. ``--cpu-time``
times the process's CPU time rather than the wall clock (less swayed by
other work on a shared machine).
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastsim  # noqa: E402
from benchmarks.common import sharegpt_80pct  # noqa: E402


def variants(n):
    sc = sharegpt_80pct(n)
    preset = fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b")
    jit = dataclasses.replace(preset, noise=dataclasses.replace(preset.noise, jitter_sd=0.0119))
    stalls = dataclasses.replace(jit, noise=dataclasses.replace(jit.noise, stall_prob=0.001, stall_mean_s=0.05))
    return {"deterministic": sc.replace(latency=preset.deterministic()),
            "preset (per-run effects)": sc.replace(latency=preset),
            "preset + per-step jitter": sc.replace(latency=jit),
            "preset + jitter + stalls": sc.replace(latency=stalls)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replications", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--cpu-time", action="store_true", help="time CPU time, not the wall clock")
    args = ap.parse_args()
    vs = variants(args.requests)
    for sc in vs.values():   # compile / load, outside the timing
        fastsim.replicate(sc, n_replications=2, seed=0, n_threads=1)
    clock = time.process_time if args.cpu_time else time.perf_counter
    times = {k: [] for k in vs}
    for r in range(args.rounds):
        for k in (list(vs) if r % 2 == 0 else list(vs)[::-1]):
            t0 = clock()
            fastsim.replicate(vs[k], n_replications=args.replications, seed=r, n_threads=1)
            times[k].append(clock() - t0)
    base = statistics.median(times["deterministic"])
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"{k:28s} {m:.3f} s (fastest {min(ts):.3f})   x{m / base:.2f} of deterministic")


if __name__ == "__main__":
    main()
