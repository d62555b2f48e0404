"""Disaggregated serving under vLLM V1's rules against the synchronous model,
one thread (a script, not a test): requests/s of `disagg_throughput.py`'s
servers (the reference workload's server in both pools) with every V1 switch
off and with vLLM 0.22's serving defaults (async scheduling, the full-input
gate, the null block, prefix caching by block hash), each against one
replica under the same rules, in alternating rounds (this machine's load
varies by 2-5x between minutes: one round times every configuration at
nearly the same moment). Figures in benchmarks/HISTORY.md.

    python benchmarks/disagg_v1_rules.py [--splits 2x4 1x1] [--rounds 5] [--requests 500] [--replications 4]
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks.bench_fleet import requests_per_second  # noqa: E402
from benchmarks.common import reference_workload  # noqa: E402
from disagg_throughput import disagg_scenario  # noqa: E402

SWITCHES = ("async_scheduling", "scheduler_reserve_full_isl", "null_block", "enable_prefix_caching",
            "block_hash_caching")


def with_rules(sc, on):
    """``sc`` with every vLLM V1 switch of its engine on (vLLM 0.22's defaults) or off."""
    return sc.replace(**{f"engine.{k}": on for k in SWITCHES})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", nargs="+", default=["2x4", "1x1"], help="PxD pool sizes")
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=500, help="requests per replica per replication")
    ap.add_argument("--replications", type=int, default=4)
    args = ap.parse_args()
    cases = {}
    for split in args.splits:
        p, d = (int(x) for x in split.split("x"))
        for on in (False, True):
            rules = "vllm" if on else "sync"
            one = with_rules(reference_workload(args.requests * (p + d)), on)
            dis = with_rules(disagg_scenario(p, d, args.requests, args.router), on)
            cases[(split, rules)] = (one, dis)
            for sc in (one, dis):
                fastsim.replicate(sc.replace(**{"workload.num_requests": 20}), n_replications=2, seed=0)  # compile
    ratios = {k: [] for k in cases}
    rates = {k: [] for k in cases}
    for rnd in range(args.rounds):
        for key, (one, dis) in cases.items():
            r1 = requests_per_second(one, args.replications)
            rd = requests_per_second(dis, args.replications)
            ratios[key].append(rd / r1)
            rates[key].append(rd)
            print(f"round {rnd + 1}: {key[0]} {key[1]}: one replica {r1:,.0f} req/s, disaggregated {rd:,.0f} "
                  f"req/s = {rd / r1:.2f}x", flush=True)
    for split in args.splits:
        s, v = (split, "sync"), (split, "vllm")
        print(f"{split} ({args.router}): sync {statistics.median(rates[s]):,.0f} req/s "
              f"({statistics.median(ratios[s]):.2f}x one replica), vLLM rules {statistics.median(rates[v]):,.0f} "
              f"req/s ({statistics.median(ratios[v]):.2f}x one replica); vLLM / sync, by round: "
              f"{statistics.median(a / b for a, b in zip(rates[v], rates[s])):.2f}")


if __name__ == "__main__":
    main()
