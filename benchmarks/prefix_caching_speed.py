"""What prefix caching by block hash costs in simulation speed (a script, not a test).

    python benchmarks/prefix_caching_speed.py [--replications 40] [--rounds 5] [--requests 1000] [--async]

One-thread ``replicate`` throughput on the ShareGPT benchmark workload
(`benchmarks/common.py: sharegpt_80pct`) in one process, the variants
alternated round by round (the order reversed every other round), the median
time of each and its ratio to caching off:

* ``off``: ``enable_prefix_caching=False``;
* ``hash, nothing shared``: vLLM's cache by block hash, no prefix groups (the
  block pool is counted, `kernel/block_pool.py`, until a preemption);
* ``hash, tight KV``: the same with a KV cache small enough to preempt (the
  pool laid out while preempted requests are in the system);
* ``hash, shared prefixes``: 8 prefix groups, prefixes of 1-64 tokens (the pool
  laid out throughout: every step a slow one);
* ``off, tight KV`` and ``off, shared prefixes``: their baselines.

``--async``: every variant with async scheduling (vLLM V1's default; the
counted pool keeps each request's count of cached blocks there).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks.common import sharegpt_80pct  # noqa: E402

HASH = {"engine.enable_prefix_caching": True, "engine.block_hash_caching": True}
TIGHT = {"engine.num_gpu_blocks": 900}
SHARED = {"workload.prefix_groups": 8, "workload.prefix_len": fastsim.Uniform(1, 64)}


def variants(n, async_scheduling=False):
    sc = sharegpt_80pct(n)
    if async_scheduling:
        sc = sc.replace(**{"engine.async_scheduling": True})
    return {
        "off": sc,
        "hash, nothing shared": sc.replace(**HASH),
        "off, tight KV": sc.replace(**TIGHT),
        "hash, tight KV": sc.replace(**TIGHT, **HASH),
        "off, shared prefixes": sc.replace(**SHARED),
        "hash, shared prefixes": sc.replace(**SHARED, **HASH),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replications", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--async", dest="async_scheduling", action="store_true", help="async scheduling in every variant")
    args = ap.parse_args()
    vs = variants(args.requests, args.async_scheduling)
    for sc in vs.values():   # compile / load, outside the timing
        fastsim.replicate(sc, n_replications=2, seed=0, n_threads=1)
    times = {k: [] for k in vs}
    for r in range(args.rounds):
        order = list(vs) if r % 2 == 0 else list(vs)[::-1]
        for k in order:
            t0 = time.perf_counter()
            res = fastsim.replicate(vs[k], n_replications=args.replications, seed=1, n_threads=1)
            times[k].append(time.perf_counter() - t0)
            if r == 0:
                pr = res.per_replication
                print(f"  {k:24s} preemptions/request {pr['preemptions_per_request'].mean():.3f}, "
                      f"prefix hit rate {pr['prefix_hit_rate'].mean():.3f}")
    base = {"hash, nothing shared": "off", "hash, tight KV": "off, tight KV",
            "hash, shared prefixes": "off, shared prefixes"}
    for k, ts in times.items():
        med = statistics.median(ts)
        line = f"{k:24s} {med:7.3f} s ({min(ts):.3f}-{max(ts):.3f})"
        if k in base:
            line += f"   x{med / statistics.median(times[base[k]]):.2f} of {base[k]}"
        print(line)


if __name__ == "__main__":
    main()
