"""Side-by-side speed of fastsim and a plain SimPy simulator of the same model.

    python benchmarks/simpy_yardstick.py [--requests 20000] [--replications 2000]

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
"""

import argparse
import os
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
    args = ap.parse_args()
    lat = fastsim.LatencyModel.default()

    t = time.perf_counter()
    ttft, rejected = simpy_run(args.requests, 0, lat)
    simpy_s = time.perf_counter() - t
    simpy_rate = args.requests / simpy_s
    print(f"SimPy: {args.requests} requests in {simpy_s:.2f} s = {simpy_rate:,.0f} requests/s "
          f"(mean TTFT {ttft.mean():.4f} s without the client offset, blocking {rejected / args.requests:.4f})")

    warm_up()
    sc = reference_workload(1000).replace(**{"latency.ttft_overhead_s": 0.0})
    t = time.perf_counter()
    res = fastsim.replicate(sc, n_replications=args.replications, seed=1, n_threads=1, progress=False)
    fast_s = time.perf_counter() - t
    fast_rate = args.replications * 1000 / fast_s
    est = res.summary().loc
    print(f"fastsim, 1 thread: {args.replications} x 1000 requests in {fast_s:.2f} s = {fast_rate:,.0f} "
          f"requests/s (mean TTFT {est['ttft_mean', 'estimate']:.4f} s, "
          f"blocking {est['blocking_probability', 'estimate']:.4f})")
    print(f"ratio fastsim / SimPy (one thread each): {fast_rate / simpy_rate:,.0f}x")


if __name__ == "__main__":
    main()
