"""Side-by-side speed of fastsim and a plain SimPy simulator of the same model.

    python benchmarks/simpy_yardstick.py [--requests 20000] [--replications 2000] [--rounds 5]

The yardstick of the performance issue: a conventional discrete-event
simulator, written the way one usually writes it in SimPy (a process per
request, an engine process that runs one iteration per step), of the issue's
workload: Poisson 4 req/s, lognormal prompt (median 256, sigma 0.55) and
output (median 128, sigma 0.70), KV-reservation admission over 16,384 tokens,
batch 32, continuous batching with chunked prefill, the A10G step-time model.
Only the simulation loop is timed, for both: SimPy on one long run, fastsim
(one thread) on many replications of 1,000 requests after compilation.
Both print their mean TTFT, so the two models can be seen to agree (they are
independent implementations, so only statistically).

The speed of this shared VM drifts by 15-40% within minutes, so one run of
each gives a ratio that says as much about the moment as about the two
simulators. The script runs ``--rounds`` rounds, each one run of either,
the order alternating from round to round, and reports each round's ratio
and their median (one round: the single side-by-side run).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks.common import reference_workload, warm_up  # noqa: E402
from benchmarks.simpy_model import simpy_run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000, help="requests in the SimPy run")
    ap.add_argument("--replications", type=int, default=2000, help="fastsim replications of 1,000 requests")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of one run of each, alternating the order")
    args = ap.parse_args()
    for name in ("requests", "replications", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    lat = fastsim.LatencyModel.default()
    warm_up()
    sc = reference_workload(1000).replace(**{"latency.ttft_overhead_s": 0.0})

    def run_simpy():
        t = time.perf_counter()
        ttft, rejected = simpy_run(args.requests, 0, lat)
        rate = args.requests / (time.perf_counter() - t)
        return rate, (f"mean TTFT {ttft.mean():.4f} s without the client offset, "
                      f"blocking {rejected / args.requests:.4f}")

    def run_fastsim():
        t = time.perf_counter()
        res = fastsim.replicate(sc, n_replications=args.replications, seed=1, n_threads=1, progress=False)
        rate = args.replications * 1000 / (time.perf_counter() - t)
        est = res.summary().loc
        return rate, (f"mean TTFT {est['ttft_mean', 'estimate']:.4f} s, "
                      f"blocking {est['blocking_probability', 'estimate']:.4f}")

    ratios = []
    for i in range(args.rounds):
        if i % 2 == 0:
            simpy_rate, simpy_says = run_simpy()
            fast_rate, fast_says = run_fastsim()
        else:
            fast_rate, fast_says = run_fastsim()
            simpy_rate, simpy_says = run_simpy()
        ratios.append(fast_rate / simpy_rate)
        if i == 0:
            print(f"SimPy ({args.requests} requests): {simpy_says}")
            print(f"fastsim ({args.replications} x 1000 requests): {fast_says}")
        print(f"round {i + 1}: SimPy {simpy_rate:,.0f} requests/s, fastsim (1 thread) {fast_rate:,.0f} "
              f"requests/s, ratio {ratios[-1]:,.0f}x", flush=True)
    print(f"ratio fastsim / SimPy (one thread each): median {statistics.median(ratios):,.0f}x "
          f"over {args.rounds} rounds, range {min(ratios):,.0f}-{max(ratios):,.0f}x")


if __name__ == "__main__":
    main()
