"""Fleets: which router, and how many replicas.

1. **Router comparison on common random numbers.** A fleet of replicas of the
   A10G server (``LatencyModel.default()``) at about 80% of its capacity, on
   ShareGPT lengths and on a prefix-heavy workload (prefix caching on, a few
   shared prefixes); and on a replayed Mooncake conversation trace (its
   block hashes keying vLLM's prefix caching by block hash in each replica;
   windows resampled per replication; ``session_affinity`` left out: a
   trace names no sessions; ``weighted``: llm-d's scorers, at its default
   weights and at prefix 1, queue 2, no KV). Every router sees the same
   fleet streams (one seed), so each router's difference from ``random``
   is paired per replication (a Student-t interval on the mean difference).
2. **Replicas needed vs rate.** `fastsim.fleet_capacity` (JSQ) at several
   fleet rates, beside the naive answer ``ceil(rate / one replica's
   capacity)`` (`fastsim.capacity` of one replica, divided into the rate),
   which ignores that pooling behind a router shortens queues.

    python experiments/fleet_routing.py [--quick] [--out DIR] [--trace PATH]

``--trace``: Mooncake-style JSON lines (default: the bundled first 300
requests of the Mooncake conversation trace, which share little beyond a
system prompt; the whole trace, ``conversation_trace.jsonl`` of the
Mooncake FAST'25 release, shares about 37 % of its prompt tokens with an
earlier request).

Outputs: ``routers.csv`` (workload, router, metric, estimate, interval,
paired difference from random and its interval) and ``replicas_vs_rate.csv``.
"""

import argparse
import math
import os
import sys

import numpy as np
import pandas as pd

import fastsim
from fastsim._stats import t_quantile

#: Routers by name; ``weighted:a,b,c`` is the weighted router with ``scorer_weights=(a, b, c)`` (plain
#: ``weighted``: llm-d's default profile, 3, 2, 2).
ROUTERS = ("random", "round_robin", "least_outstanding", "vllm_dp", "jsq", "power_of_two", "least_kv",
           "prefix_affinity", "session_affinity", "weighted", "weighted:1,2,0")
METRICS = ("ttft_mean", "ttft_p99", "e2e_mean", "prefix_hit_rate", "requests_per_replica_cv")


def sharegpt(replicas, num_requests, rate_per_replica=10.0):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=6822, max_model_len=2048),
        workload=fastsim.Workload(arrival_rate=rate_per_replica * replicas, num_requests=num_requests,
                                  lengths=fastsim.sharegpt_lengths("sample"),
                                  warmup_requests=num_requests // 10),
        latency=fastsim.LatencyModel.default(), fleet=fastsim.Fleet(replicas=replicas))


def prefix_heavy(replicas, num_requests, rate_per_replica=8.0):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=2000, enable_prefix_caching=True),
        workload=fastsim.Workload(arrival_rate=rate_per_replica * replicas, num_requests=num_requests,
                                  prompt_len=fastsim.Uniform(600, 1200), output_len=fastsim.LogNormal(128, 0.7),
                                  prefix_groups=4 * replicas, prefix_len=512, warmup_requests=num_requests // 10),
        latency=fastsim.LatencyModel.default(), fleet=fastsim.Fleet(replicas=replicas))


#: The bundled Mooncake conversation trace's first 300 requests (``fastsim/data/traces``, Apache-2.0).
MOONCAKE = os.path.join(os.path.dirname(fastsim.__file__), "data", "traces", "mooncake_conversation_head300.jsonl")


def mooncake(replicas, trace=MOONCAKE, rate_per_replica=0.3, window_s=300.0):
    """A fleet replaying windows of a Mooncake trace (``window_s`` of its
    time, at most a third of its span, so that windows differ) at
    ``rate_per_replica`` requests a second a replica (its recorded gaps
    scaled), caching by block hash keyed by the trace's hashes."""
    from fastsim._traces import read_trace

    tr = read_trace(trace)
    span = float(tr.arrival_s[-1] - tr.arrival_s[0])
    rate = (len(tr) - 1) / span   # (the trace's own mean rate)
    window_s = min(window_s, span / 3)
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=6822, max_model_len=32768,
                                    enable_prefix_caching=True, block_hash_caching=True),
        workload=fastsim.Workload.from_trace(trace, rate_scale=rate_per_replica * replicas / rate, resample=True,
                                             duration_s=window_s),
        latency=fastsim.LatencyModel.default(), fleet=fastsim.Fleet(replicas=replicas))


def _mean_ci(x, level=0.95):
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return (float(x.mean()) if x.size else math.nan), math.nan, math.nan
    m, se = x.mean(), x.std(ddof=1) / math.sqrt(x.size)
    q = t_quantile(x.size - 1, 0.5 + level / 2)
    return float(m), float(m - q * se), float(m + q * se)


def compare_routers(name, sc, n_replications, seed=0, routers=ROUTERS):
    rows, base = [], None
    for router in routers:
        policy, _, weights = router.partition(":")
        kw = dict(scorer_weights=tuple(float(w) for w in weights.split(","))) if weights else {}
        s = sc.replace(fleet=fastsim.Fleet(replicas=sc.fleet.replicas, router=policy, **kw))
        pr = fastsim.replicate(s, n_replications=n_replications, seed=seed).per_replication
        if base is None:
            base = pr
        for m in METRICS:
            est, lo, hi = _mean_ci(pr[m])
            d, dlo, dhi = _mean_ci(pr[m] - base[m])
            rows.append(dict(workload=name, router=router, metric=m, estimate=est, ci_low=lo, ci_high=hi,
                             diff_vs_random=d, diff_ci_low=dlo, diff_ci_high=dhi))
    return rows


def replicas_vs_rate(rates, slo, num_requests, n_replications, seed=0):
    one = sharegpt(1, num_requests).replace(fleet=None)
    cap1 = fastsim.capacity(one, slo, n_replications=n_replications, seed=seed, tol=0.05)
    rows = []
    for rate in rates:
        sc = sharegpt(1, num_requests).replace(**{"workload.arrival_rate": rate},
                                              fleet=fastsim.Fleet(replicas=1, router="jsq"))
        res = fastsim.fleet_capacity(sc, slo, confidence=0.95, n_replications=n_replications, seed=seed)
        rows.append(dict(rate=rate, replicas=res.replicas, replicas_low=res.replicas_interval[0],
                         naive=math.ceil(rate / cap1.rate) if cap1.rate > 0 else math.nan,
                         one_replica_capacity=cap1.rate))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small runs (minutes -> seconds), for a smoke test")
    ap.add_argument("--out", default=os.path.join("experiments", "output", "fleet_routing"))
    ap.add_argument("--trace", default=MOONCAKE, help="a Mooncake-style trace to replay (default: the bundled one)")
    args = ap.parse_args(argv)
    reps, nreq, replicas = (6, 400, 3) if args.quick else (100, 4000, 8)
    rows = compare_routers("sharegpt", sharegpt(replicas, nreq), reps)
    rows += compare_routers("prefix_heavy", prefix_heavy(replicas, nreq), reps)
    rows += compare_routers("mooncake", mooncake(replicas, args.trace, window_s=30.0 if args.quick else 300.0), reps,
                            routers=[r for r in ROUTERS if r != "session_affinity"])
    routers = pd.DataFrame(rows)
    rates = (20.0, 40.0) if args.quick else (10.0, 20.0, 40.0, 80.0, 160.0)
    need = pd.DataFrame(replicas_vs_rate(rates, {"ttft_p99": 1.0}, nreq // 2 if args.quick else nreq,
                                         4 if args.quick else 40))
    os.makedirs(args.out, exist_ok=True)
    routers.to_csv(os.path.join(args.out, "routers.csv"), index=False)
    need.to_csv(os.path.join(args.out, "replicas_vs_rate.csv"), index=False)
    print(routers[routers.metric == "ttft_p99"].to_string(index=False))
    print(need.to_string(index=False))
    return routers, need


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
