"""Scenarios shared by the benchmarks, and the performance issue's drawing floor."""

import math
import time

import numpy as np

import fastsim
from fastsim._numba_options import njit

#: The synchronous engine the speed targets are stated against (commit
#: 108cbbe's: vLLM V1's four rules off). `EngineConfig`'s defaults are vLLM
#: 0.22's since the defaults switch; ``benchmarks/v1_rules.py`` times those.
SYNC = dict(async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False,
            enable_prefix_caching=False)


#: The workload of the performance targets (issue "Performance"): Poisson
#: 4 req/s, lognormal prompt (median 256, sigma 0.55) and output (median 128,
#: sigma 0.70), KV-reservation admission over 16,384 tokens, batch 32.
def reference_workload(num_requests=1000):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=32, block_size=16, num_gpu_blocks=1024,
                                    admission="kv_reservation", **SYNC),
        workload=fastsim.Workload(arrival_rate=4.0, num_requests=num_requests,
                                  prompt_len=fastsim.LogNormal(256, 0.55),
                                  output_len=fastsim.LogNormal(128, 0.70)),
        latency=fastsim.LatencyModel.default())


def full_engine_workload(num_requests=1000):
    """The reference workload with prefix caching by block hash (vLLM V1's):
    its first run compiles the engine with every option
    (`kernel.replica._simulate`'s ``full``), not the common one. (The
    prefix-group cache with no group to share runs as caching off.)"""
    return reference_workload(num_requests).replace(**{"engine.enable_prefix_caching": True,
                                                       "engine.block_hash_caching": True})


def sharegpt_vllm_defaults(num_requests=1000):
    """`sharegpt_80pct` at vLLM 0.22's serving defaults (`EngineConfig`'s):
    async scheduling, the full-input gate, the null block, caching by block hash."""
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=6822, max_model_len=2048),
        workload=fastsim.Workload(arrival_rate=12.0, num_requests=num_requests,
                                  lengths=fastsim.sharegpt_lengths("sample")),
        latency=fastsim.LatencyModel.default())


def output_length_scenario(median, num_requests=1000):
    """The issue-7 workload with the output median scaled and the arrival rate
    scaled inversely (the same decode load), the KV budget with the lengths
    (`benchmarks/output_length.py` and the asv `OutputLength` benchmarks)."""
    scale = median / 128
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=32, block_size=16, num_gpu_blocks=int(1024 * max(1.0, scale)),
                                    admission="kv_reservation", **SYNC),
        workload=fastsim.Workload(arrival_rate=4.0 / scale, num_requests=num_requests,
                                  prompt_len=fastsim.LogNormal(256, 0.55),
                                  output_len=fastsim.LogNormal(median, 0.70)),
        latency=fastsim.LatencyModel.default())


def sharegpt_80pct(num_requests=1000):
    """ShareGPT lengths, max_num_seqs=64, A10G latency model, ~80% of capacity."""
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=6822, max_model_len=2048, **SYNC),
        workload=fastsim.Workload(arrival_rate=12.0, num_requests=num_requests,
                                  lengths=fastsim.sharegpt_lengths("sample")),
        latency=fastsim.LatencyModel.default())


def sharegpt_static(num_requests=1000):
    """`sharegpt_80pct` with static batching (the full engine): the static
    batching baseline's cost against the common engine's."""
    return sharegpt_80pct(num_requests).replace(**{"engine.scheduler": "static"})


def _fleet(replicas, router, num_requests):
    """The reference workload's server, ``replicas`` of them behind ``router``, at ``replicas`` times its
    rate (`bench_fleet.fleet_scenario`'s fleet, ``num_requests`` in all)."""
    sc = reference_workload(num_requests)
    return sc.replace(**{"workload.arrival_rate": 4.0 * replicas},
                      fleet=fastsim.Fleet(replicas=replicas, router=router))


def fleet_jsq_8(num_requests=2000):
    """8 replicas behind join the shortest queue (`benchmarks/fleet_throughput.py`'s)."""
    return _fleet(8, "jsq", num_requests)


def fleet_jsq_64(num_requests=16000):
    """64 replicas behind join the shortest queue."""
    return _fleet(64, "jsq", num_requests)


def disagg_jsq_2p4d(num_requests=1500):
    """2 prefill and 4 decode replicas behind join the shortest queue (`benchmarks/disagg_throughput.py`'s)."""
    sc = reference_workload(num_requests)
    dis = fastsim.Disaggregated(prefill=fastsim.Fleet(2, router="jsq"), decode=fastsim.Fleet(4, router="jsq"),
                                link_bandwidth_gbps=100.0, link_latency_s=0.0005, kv_bytes_per_token=131072.0)
    return sc.replace(**{"workload.arrival_rate": 4.0 * 4}, fleet=dis)


def _autoscaled(replicas, num_requests, pinned):
    """`fleet_jsq_64`'s fleet with an autoscaler by rate (`benchmarks/autoscale_throughput.py`'s): pinned
    at ``replicas``, or from 1 to ``replicas`` with a provisioning delay and a cool-down."""
    if pinned:
        policy = fastsim.Autoscaler(metric="rate", target=4.0, interval_s=15.0, min_replicas=replicas,
                                    max_replicas=replicas)
    else:
        policy = fastsim.Autoscaler(metric="rate", target=4.0, interval_s=15.0, min_replicas=1,
                                    max_replicas=replicas, scale_in_cooldown_s=60.0, provisioning_delay_s=30.0)
    return _fleet(replicas, "jsq", num_requests).replace(fleet=fastsim.Fleet(router="jsq", autoscaler=policy))


def autoscale_pinned_64(num_requests=16000):
    """An autoscaler pinned at 64 replicas behind join the shortest queue (against `fleet_jsq_64`).
    (`ab_interleaved.py --requests 16000`: its default, 1,000, arrive before the first evaluation.)"""
    return _autoscaled(64, num_requests, pinned=True)


def autoscale_64(num_requests=16000):
    """An autoscaler of 1 to 64 replicas behind join the shortest queue (`ab_interleaved.py --requests
    16000`: fewer arrive before the first evaluation, 15 s in, and never scale the fleet out)."""
    return _autoscaled(64, num_requests, pinned=False)


#: The workloads the benchmark scripts' ``--workload`` option names.
WORKLOADS = {"reference": reference_workload, "sharegpt": sharegpt_80pct, "full": full_engine_workload,
             "static": sharegpt_static, "sharegpt-vllm": sharegpt_vllm_defaults,
             # fleets (for `ab_interleaved.py`, a process per tree: a fleet's `replicate` against a parent's)
             "fleet-jsq-8": fleet_jsq_8, "fleet-jsq-64": fleet_jsq_64, "disagg-jsq-2p4d": disagg_jsq_2p4d,
             "autoscale-pinned-64": autoscale_pinned_64, "autoscale-64": autoscale_64}

#: Of `WORKLOADS`, those with several replicas (a fleet's kernels, not one replica's).
FLEET_WORKLOADS = tuple(name for name, f in WORKLOADS.items()
                        if f in (fleet_jsq_8, fleet_jsq_64, disagg_jsq_2p4d, autoscale_pinned_64, autoscale_64))


def warm_up():
    """Compile every kernel (or load it from Numba's cache) outside the timed body."""
    fastsim.replicate(reference_workload(20), n_replications=2, seed=0)


@njit(cache=False)
def numpy_floor(rep0, nrep, n, rate, prompt_median, prompt_sigma, output_median, output_sigma, out):
    """The performance issue's floor, as the issue words it: per request an
    arrival gap and two lognormal lengths from Numba's ``np.random`` (seeded
    per replication), nothing else; ``out[j]`` gets a sum, so that nothing
    is optimised away. The issue's target is a simulator within about 2x."""
    for j in range(nrep):
        np.random.seed(rep0 + j)
        t = 0.0
        p = 0
        o = 0
        for _ in range(n):
            t += np.random.exponential(1.0 / rate)
            p += np.int64(np.ceil(prompt_median * np.random.lognormal(0.0, prompt_sigma)))
            o += np.int64(np.ceil(output_median * np.random.lognormal(0.0, output_sigma)))
        out[j] = t + p + o


def floor_args(scenario):
    """``numpy_floor``'s law arguments for a scenario with lognormal lengths and Poisson arrivals."""
    w = scenario.workload
    return (w.num_requests, w.arrival_rate, w.prompt_len.median, w.prompt_len.sigma, w.output_len.median,
            w.output_len.sigma)


def seconds(fn, *args):
    """Wall seconds of one call ``fn(*args)``."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def timed_replicate(scenario, n_replications, n_threads=1, seed=1):
    """Wall seconds of one ``replicate`` call (compiled beforehand by the caller)."""
    return seconds(lambda: fastsim.replicate(scenario, n_replications=n_replications, seed=seed,
                                             n_threads=n_threads, progress=False))


def cost_exponent(sizes, seconds):
    """The exponent b of ``seconds ~ sizes ** b``: the least-squares slope of
    log time on log size (1 for a cost linear in the size)."""
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


def scaling_points(factory, axis, sizes, budget, n_requests=1000):
    """The points ``(size, scenario, n_replications, per)`` of a scaling
    sweep of the workload ``factory(num_requests)``, where a run's time
    divided by ``per`` is the time that scales with ``size``: along
    ``"replications"``, ``size`` replications of ``n_requests`` requests
    (the whole run's time, ``per`` = 1); along ``"requests"``, ``size``
    requests a replication in ``max(2, budget // size)`` replications (the
    time of one replication, ``per`` = the replications), about ``budget``
    requests in all at every size."""
    if axis == "replications":
        scenario = factory(n_requests)
        return [(s, scenario, s, 1) for s in sizes]
    return [(s, factory(s), max(2, budget // s), max(2, budget // s)) for s in sizes]


def interleaved_ratios(numerator, denominator, rounds=3):
    """``numerator() / denominator()`` in each of ``rounds`` rounds. A round
    runs them in the order A B B A and takes (A + A) / (B + B): a shared
    VM's speed drifts between runs, and a drift steady over the round cancels."""
    ratios = []
    for _ in range(rounds):
        a = numerator()
        b = denominator()
        b += denominator()
        a += numerator()
        ratios.append(a / b)
    return ratios


def alternating_seconds(first, second, calls):
    """Wall seconds of ``calls`` calls of each of ``first()`` and ``second()``,
    alternated, the order reversed every other call: two lists. On a shared
    VM, the ratio of their fastest calls reads a speed ratio most steadily."""
    times = ([], [])
    for c in range(calls):
        for j in ((0, 1) if c % 2 == 0 else (1, 0)):
            times[j].append(seconds(first if j == 0 else second))
    return times


def decile(times):
    """The 10th percentile of ``times``: the sorted values' lower neighbour,
    not interpolated (the figure `ab_interleaved.py` and
    `profile_breakdown.py` give beside the fastest call)."""
    ordered = sorted(times)
    return ordered[(len(ordered) - 1) // 10]


def median_interval(values, level=0.95):
    """A distribution-free interval for the median of the distribution that
    ``values`` (independent draws, e.g. the rounds' time ratios of
    `ab_interleaved.py`) come from: the order statistics x_(k) and
    x_(n+1-k), with k the largest such that P(Binomial(n, 1/2) < k) <=
    (1 - level) / 2. For any continuous distribution it covers the median
    with probability at least ``level``. None when ``values`` are too few for
    any k (fewer than 6 at 95 %)."""
    xs = sorted(values)
    n = len(xs)
    tail = (1.0 - level) / 2.0
    below = 0.0   # P(B < k)
    k = 0
    while k < n:
        nxt = below + math.comb(n, k) / 2.0 ** n   # P(B < k + 1)
        if nxt > tail:
            break
        below = nxt
        k += 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def median_ratio(numerator, denominator, rounds=3):
    """The median of `interleaved_ratios`."""
    return float(np.median(interleaved_ratios(numerator, denominator, rounds)))
