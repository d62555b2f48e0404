"""Autoscaled fleet throughput, one thread: requests/s of an autoscaled
fleet (`fastsim.Autoscaler`) against the static JSQ fleet of the same size
and one replica, on `bench_fleet`'s workload (a script; figures in
benchmarks/HISTORY.md); and the autoscaler with prefix caching by block
hash (the full engine; each replica that starts has a cold cache) against
it without, on the same workload with shared prefixes.

    python benchmarks/autoscale_throughput.py [--caching-only]
"""

import sys
sys.path.insert(0, "benchmarks")
import fastsim
from benchmarks.bench_fleet import fleet_scenario, requests_per_second
from benchmarks.common import reference_workload
CACHING = {"engine.enable_prefix_caching": True, "engine.block_hash_caching": True,
           "workload.prefix_groups": 8, "workload.prefix_len": 128}
only_caching = "--caching-only" in sys.argv
for n in (8, 64):
    per = 250 if n == 64 else 500
    static = fleet_scenario(n, "jsq", per)
    pinned = static.replace(fleet=fastsim.Fleet(router="jsq", autoscaler=fastsim.Autoscaler(
        metric="rate", target=4.0, interval_s=15.0, min_replicas=n, max_replicas=n)))
    active = static.replace(fleet=fastsim.Fleet(router="jsq", autoscaler=fastsim.Autoscaler(
        metric="rate", target=4.0, interval_s=15.0, min_replicas=1, max_replicas=n, scale_in_cooldown_s=60.0,
        provisioning_delay_s=30.0)))
    grouped = active.replace(**{"workload.prefix_groups": 8, "workload.prefix_len": 128})
    cached = active.replace(**CACHING)
    static_cached = static.replace(**CACHING)
    for sc in (pinned, active, grouped, cached, static_cached):
        fastsim.replicate(sc.replace(**{"workload.num_requests": 50}), n_replications=2, seed=0)
    rg, rc, rsc = (requests_per_second(sc, 4) for sc in (grouped, cached, static_cached))
    print(f"{n} replicas, {per * n} requests, 8 prefix groups of 128 tokens: autoscaler 1..{n} without caching "
          f"{rg:,.0f} req/s; with prefix caching by block hash {rc:,.0f} ({rc / rg:.2f}x); static JSQ with "
          f"caching {rsc:,.0f}", flush=True)
    if only_caching:
        continue
    one = requests_per_second(reference_workload(per * n), 4)
    rs, rp, ra = (requests_per_second(sc, 4) for sc in (static, pinned, active))
    print(f"{n} replicas, {per * n} requests: one replica {one:,.0f} req/s; static JSQ {rs:,.0f} ({rs / one:.2f}x); "
          f"autoscaler pinned at {n} {rp:,.0f} ({rp / one:.2f}x, {rp / rs:.2f}x static); "
          f"autoscaler 1..{n} {ra:,.0f} ({ra / one:.2f}x)", flush=True)
