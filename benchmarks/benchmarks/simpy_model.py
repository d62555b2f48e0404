"""A plain SimPy simulator of the performance issue's workload: the yardstick
that fastsim's speed is compared with (``benchmarks/simpy_yardstick.py`` and
the asv ``SimPyRatio`` benchmark)."""

from collections import deque

import numpy as np


def simpy_run(num_requests, seed, latency, max_num_seqs=32, kv_tokens=16384, block_size=16,
              max_num_batched_tokens=2048, arrival_rate=4.0):
    """Simulate ``num_requests`` requests in SimPy; return (TTFTs of completed, rejected count)."""
    import simpy  # the `bench` extra; imported here so that `asv check` works without it
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
