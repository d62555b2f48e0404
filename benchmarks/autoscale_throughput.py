"""Autoscaled fleet throughput, one thread: requests/s of an autoscaled
fleet (`fastsim.Autoscaler`) against the static JSQ fleet of the same size
and one replica, on `bench_fleet`'s workload (a script; figures in
benchmarks/HISTORY.md).

    python benchmarks/autoscale_throughput.py
"""

import sys, time
sys.path.insert(0, "benchmarks")
import fastsim
from benchmarks.bench_fleet import fleet_scenario, requests_per_second
from benchmarks.common import reference_workload
for n in (8, 64):
    per = 250 if n == 64 else 500
    static = fleet_scenario(n, "jsq", per)
    one = requests_per_second(reference_workload(per * n), 4)
    pinned = static.replace(fleet=fastsim.Fleet(router="jsq", autoscaler=fastsim.Autoscaler(
        metric="rate", target=4.0, interval_s=15.0, min_replicas=n, max_replicas=n)))
    active = static.replace(fleet=fastsim.Fleet(router="jsq", autoscaler=fastsim.Autoscaler(
        metric="rate", target=4.0, interval_s=15.0, min_replicas=1, max_replicas=n, scale_in_cooldown_s=60.0,
        provisioning_delay_s=30.0)))
    for sc in (pinned, active):
        fastsim.replicate(sc.replace(**{"workload.num_requests": 50}), n_replications=2, seed=0)
    rs, rp, ra = (requests_per_second(sc, 4) for sc in (static, pinned, active))
    print(f"{n} replicas, {per * n} requests: one replica {one:,.0f} req/s; static JSQ {rs:,.0f} ({rs / one:.2f}x); "
          f"autoscaler pinned at {n} {rp:,.0f} ({rp / one:.2f}x, {rp / rs:.2f}x static); "
          f"autoscaler 1..{n} {ra:,.0f} ({ra / one:.2f}x)", flush=True)
