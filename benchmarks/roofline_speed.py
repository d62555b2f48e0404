"""What the roofline evaluated in the kernel costs in simulation speed (a script, not a test).

    python benchmarks/roofline_speed.py [--replications 100] [--rounds 9] [--requests 1000]

One-thread ``replicate`` on the ShareGPT benchmark workload
(`benchmarks/common.py: sharegpt_80pct`) in one process, variants alternated
round by round (the order reversed every other round):

* ``regression (A10G default)``: the benchmark as it is;
* ``regression mapping``: Qwen2.5-1.5B on an A10G as ``fastsim.Deployment``
  builds it, its roofline mapped onto the regression form
  (``Deployment.regression_latency``);
* ``roofline in the kernel``: the same deployment's roofline evaluated per
  step (``Deployment.latency``, a ``RooflineLatency``);
* ``roofline, MoE``: Qwen3-30B-A3B on an H100 (the experts' expected count, a
  power per mixed step), at the same engine settings.

The roofline and its regression mapping run the same load (the same step
times within the mapping's error), so their ratio is the roofline's cost;
the issue's target is at most 1.5x. Prints each variant's median time, the
median over rounds of its ratio to the regression mapping's time in the
same round, and the mean number of steps per replication.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastsim  # noqa: E402
from benchmarks.common import sharegpt_80pct  # noqa: E402


def variants(n):
    sc = sharegpt_80pct(n)
    e = sc.engine
    kw = dict(max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
              max_model_len=e.max_model_len)
    dep = fastsim.Deployment(model="Qwen/Qwen2.5-1.5B-Instruct", gpu="A10G", **kw)
    moe = fastsim.Deployment(model="Qwen/Qwen3-30B-A3B", gpu="H100-SXM", **kw)
    return {"regression (A10G default)": sc,
            "regression mapping": sc.replace(latency=dep.regression_latency),
            "roofline in the kernel": sc.replace(latency=dep.latency),
            "roofline, MoE": sc.replace(latency=moe.latency)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replications", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args()
    vs = variants(args.requests)
    steps = {}
    for k, sc in vs.items():   # compile / load, outside the timing
        res = fastsim.replicate(sc, n_replications=4, seed=0, n_threads=1, progress=False)
        steps[k] = float(res.per_replication["n_steps"].mean())
    times = {k: [] for k in vs}
    ref = "regression mapping"
    for r in range(args.rounds):
        for k in (list(vs) if r % 2 == 0 else list(vs)[::-1]):
            t0 = time.perf_counter()
            fastsim.replicate(vs[k], n_replications=args.replications, seed=r, n_threads=1, progress=False)
            times[k].append(time.perf_counter() - t0)
        print(f"round {r}: " + ", ".join(f"{k} {times[k][-1]:.3f} s" for k in vs), flush=True)
    for k, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, times[ref]))
        print(f"{k:28s} median {statistics.median(ts):.3f} s (fastest {min(ts):.3f}), x{ratio:.3f} of the "
              f"{ref} (median of rounds' ratios), {steps[k]:.0f} steps a replication")


if __name__ == "__main__":
    main()
