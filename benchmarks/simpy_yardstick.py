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
from collections import deque

import numpy as np
import simpy

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from benchmarks.common import reference_workload, warm_up  # noqa: E402


def simpy_run(num_requests, seed, latency, max_num_seqs=32, kv_tokens=16384, block_size=16,
              max_num_batched_tokens=2048, arrival_rate=4.0):
    """Simulate ``num_requests`` requests in SimPy; return (TTFTs of completed, rejected count)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / arrival_rate, num_requests)
    gaps[0] = 0.0
    prompts = np.ceil(256 * np.exp(0.55 * rng.standard_normal(num_requests))).astype(int)
    outputs = np.ceil(128 * np.exp(0.70 * rng.standard_normal(num_requests))).astype(int)
    env = simpy.Environment()
    waiting, running = deque(), []
    state = {"reserved": 0, "rejected": 0, "wake": env.event()}
    ttft = []

    class Req:
        __slots__ = ("arrival", "prompt", "output", "k", "g")

    def source():
        for i in range(num_requests):
            yield env.timeout(gaps[i])
            r = Req()
            r.arrival, r.prompt, r.output, r.k, r.g = env.now, int(prompts[i]), int(outputs[i]), 0, 0
            if state["reserved"] + r.prompt + r.output > kv_tokens:
                state["rejected"] += 1
                continue
            state["reserved"] += r.prompt + r.output
            waiting.append(r)
            if not state["wake"].triggered:
                state["wake"].succeed()

    def engine():
        base, dscale, dalpha, c_pf = (latency.base_s, latency.decode_scale_s, latency.decode_alpha,
                                      latency.prefill_per_token_s)
        while True:
            if not running and not waiting:
                state["wake"] = env.event()
                yield state["wake"]
            budget = max_num_batched_tokens
            sched = []
            for r in running:                      # running requests first, in order
                s = min(r.prompt + r.g - r.k, budget)
                if s > 0:
                    sched.append((r, s))
                    budget -= s
            while waiting and budget > 0 and len(running) < max_num_seqs:
                r = waiting.popleft()                # fcfs admission (KV reserved at arrival)
                s = min(r.prompt + r.g - r.k, budget)
                running.append(r)
                sched.append((r, s))
                budget -= s
            n_dec = sum(1 for r, s in sched if r.g >= 1 and s == 1)
            n_pf = sum(s for r, s in sched if not (r.g >= 1 and s == 1))
            d = base + (dscale * (n_dec - 1.0) ** dalpha if n_dec > 1 else 0.0) + c_pf * n_pf
            yield env.timeout(d)
            for r, s in sched:
                r.k += s
                if r.k == r.prompt + r.g:
                    r.g += 1
                    if r.g == 1:
                        ttft.append(env.now - r.arrival)
            done = [r for r in running if r.g == r.output]
            for r in done:
                running.remove(r)
                state["reserved"] -= r.prompt + r.output

    env.process(source())
    env.process(engine())
    env.run()
    return np.asarray(ttft), state["rejected"]


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
