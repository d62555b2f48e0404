"""Fleets of replicas behind a router: requests/s per thread against one
replica at the same per-replica load (targets: 8 replicas with JSQ at least
0.5x, 64 at least 0.25x; figures in benchmarks/HISTORY.md)."""

import time

import fastsim

from .common import reference_workload


def fleet_scenario(replicas, router, num_requests=1000):
    """The reference workload's server, ``replicas`` of them, at ``replicas``
    times its rate (the same load per replica)."""
    sc = reference_workload(num_requests * replicas)
    return sc.replace(**{"workload.arrival_rate": 4.0 * replicas}, fleet=fastsim.Fleet(replicas=replicas,
                                                                                    router=router))


def requests_per_second(sc, n_replications, repeat=3, clock=time.perf_counter, min_time=0.25):
    """Requests simulated per second by ``replicate`` on one thread, the
    best of at least ``repeat`` calls after one untimed (its kernels
    compiled or loaded), more while they have taken less than ``min_time``
    seconds in all (one replica's call in `fleet_throughput.py` takes a few
    milliseconds, and a process's first calls are slower: the best of its
    first three moved the fleet's ratio by a tenth, `benchmarks/HISTORY.md`,
    stop 63); ``clock``: `time.process_time` counts the process's CPU time,
    not the time other processes take the core."""
    fastsim.replicate(sc, n_replications=n_replications, seed=0, n_threads=1)
    best = float("inf")
    calls, spent = 0, 0.0
    while calls < repeat or spent < min_time:
        t = clock()
        fastsim.replicate(sc, n_replications=n_replications, seed=0, n_threads=1)
        took = clock() - t
        best = min(best, took)
        calls, spent = calls + 1, spent + took
    return n_replications * sc.workload.num_requests / best


class Fleet:
    params = ([8, 64], ["jsq", "round_robin", "power_of_two", "weighted"])
    param_names = ["replicas", "router"]
    timeout = 600

    def setup(self, replicas, router):
        self.sc = fleet_scenario(replicas, router, num_requests=250)
        self.one = reference_workload(250 * replicas)
        fastsim.replicate(fleet_scenario(2, router, 20), n_replications=2, seed=0)   # compile
        fastsim.replicate(reference_workload(20), n_replications=2, seed=0)

    def time_replicate(self, replicas, router):
        fastsim.replicate(self.sc, n_replications=4, seed=0, n_threads=1)

    def track_ratio_to_one_replica(self, replicas, router):
        """Fleet requests/s per thread over one replica's (the same requests per replication)."""
        return requests_per_second(self.sc, 4) / requests_per_second(self.one, 4)

    track_ratio_to_one_replica.unit = "ratio"
