"""Disaggregated serving throughput, one thread: requests/s of a prefill
pool of P replicas and a decode pool of D replicas (the reference
workload's server in both, at D times its rate by default, so that each
decode replica carries one replica's load, or at P + D times it; a 100 Gb/s link and
Llama-3.1-8B's 128 KiB of KV a token) against one replica over as many
requests a replication (target for 2P+4D: at least 0.5x; figures in
benchmarks/HISTORY.md).

    python benchmarks/disagg_throughput.py [--splits 2x4 1x1] [--requests 500] [--replications 4] [--cpu-time]

``--cpu-time`` times the process's CPU time, not the wall clock (as
`fleet_throughput.py`'s).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks.bench_fleet import requests_per_second  # noqa: E402
from benchmarks.common import reference_workload  # noqa: E402


def disagg_scenario(prefill, decode, requests_per_replica, router="jsq", per="decode"):
    """The reference workload's server in both pools, at D times its rate (``per="decode"``: each decode
    replica at one replica's load, the prefill replicas' work being one step a request) or (P + D) times."""
    n = prefill + decode
    sc = reference_workload(requests_per_replica * n)
    k = decode if per == "decode" else n
    dis = fastsim.Disaggregated(prefill=fastsim.Fleet(prefill, router=router),
                                decode=fastsim.Fleet(decode, router=router), link_bandwidth_gbps=100.0,
                                link_latency_s=0.0005, kv_bytes_per_token=131072.0)
    return sc.replace(**{"workload.arrival_rate": 4.0 * k}, fleet=dis)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", nargs="+", default=["2x4", "1x1", "4x8"], help="PxD pool sizes")
    ap.add_argument("--routers", nargs="+", default=["jsq", "round_robin"])
    ap.add_argument("--requests", type=int, default=500, help="requests per replica per replication")
    ap.add_argument("--replications", type=int, default=4)
    ap.add_argument("--per", choices=["decode", "all"], default="decode",
                    help="the rate: the reference rate times D (decode) or times P + D (all)")
    ap.add_argument("--cpu-time", action="store_true", help="time the process's CPU time, not the wall clock")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    fastsim.replicate(disagg_scenario(1, 1, 10), n_replications=2, seed=0)   # compile
    for split in args.splits:
        p, d = (int(x) for x in split.split("x"))
        n = args.requests * (p + d)
        one = requests_per_second(reference_workload(n), args.replications, clock=clock)
        print(f"one replica, {n} requests: {one:,.0f} req/s")
        for router in args.routers:
            rate = requests_per_second(disagg_scenario(p, d, args.requests, router, args.per), args.replications,
                                       clock=clock)
            print(f"  {p}P{d}D, {router}: {rate:,.0f} req/s = {rate / one:.2f}x")


if __name__ == "__main__":
    main()
