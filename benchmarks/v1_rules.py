"""Speed of vLLM V1's rules against the synchronous engine (a script, not a test).

    python benchmarks/v1_rules.py [--rounds 25] [--replications 40]

On the issue-7 (``reference``) and ShareGPT workloads of `benchmarks/benchmarks/common.py`,
one thread, the same process: ``replicate`` of the synchronous engine, of
async scheduling alone, of async scheduling with the full-input gate and
the null block, and of vLLM 0.22's defaults (those and prefix caching by
block hash), alternated round by round; prints the median ratio of each
one's time to the synchronous engine's, and the fastest calls.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastsim  # noqa: E402
from benchmarks import common  # noqa: E402

VARIANTS = {"sync": {}, "async": {"async_scheduling": True},
            "v1": {"async_scheduling": True, "scheduler_reserve_full_isl": True, "null_block": True},
            "v1+caching": {"async_scheduling": True, "scheduler_reserve_full_isl": True, "null_block": True,
                           "enable_prefix_caching": True, "block_hash_caching": True}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--replications", type=int, default=40)
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args(argv)
    for name in ("reference_workload", "sharegpt_80pct"):
        sc0 = getattr(common, name)(args.requests)
        scs = {k: dataclasses.replace(sc0, engine=dataclasses.replace(sc0.engine, **kw)) for k, kw in VARIANTS.items()}
        for sc in scs.values():
            fastsim.replicate(sc, n_replications=2, seed=0, progress=False, n_threads=1)
        best = dict.fromkeys(scs, float("inf"))
        ratios = {k: [] for k in scs if k != "sync"}
        for r in range(args.rounds):
            took = {}
            for k, sc in scs.items():
                t0 = time.perf_counter()
                fastsim.replicate(sc, n_replications=args.replications, seed=r, progress=False, n_threads=1)
                took[k] = time.perf_counter() - t0
                best[k] = min(best[k], took[k])
            for k in ratios:
                ratios[k].append(took[k] / took["sync"])
        n = args.replications * args.requests
        print(f"{name}: time / sync's, median by round: "
              + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in ratios.items())
              + "; fastest calls: " + ", ".join(f"{k} {n / v / 1e6:.2f} M req/s" for k, v in best.items()))


if __name__ == "__main__":
    main()
