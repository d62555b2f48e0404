"""Measure what a run keeps resident, against `fastsim._memory.estimate`
(`tests/test_memory_estimate.py` runs it in a fresh process:
``python tests/memory_rss.py NAME ...``, one JSON line per scenario).

For each scenario: a run of the same engine on 64 requests first (the
kernels compiled or loaded, so that what follows is the run's own memory),
then the peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs``) of the run less the resident set before it.
glibc's malloc is kept from serving large arrays out of its heap
(``MALLOC_MMAP_THRESHOLD_``, set by the caller), so that memory freed by an
earlier run cannot hide a later one's.
"""

import dataclasses
import gc
import json
import sys

import fastsim as F
from fastsim import _memory

W, E, S = F.Workload, F.EngineConfig, F.Scenario
N = 200_000

#: name: (scenario, n_replications, n_threads)
GRID = {
    "common engine": (S(workload=W(arrival_rate=20.0, num_requests=N)), 2, 1),
    "lognormal lengths": (S(workload=W(arrival_rate=8.0, num_requests=N, prompt_len=F.LogNormal(200, 1.0),
                                       output_len=F.LogNormal(150, 1.0))), 2, 1),
    "two threads": (S(workload=W(arrival_rate=20.0, num_requests=N)), 4, 2),
    "priority": (S(engine=E(policy="priority"),
                   workload=W(arrival_rate=20.0, num_requests=N, priorities=(0, 1), priority_probs=(0.5, 0.5))),
                 2, 1),
    "prefix cache": (S(engine=E(enable_prefix_caching=True),
                       workload=W(arrival_rate=20.0, num_requests=N, prefix_groups=16, prefix_len=200,
                                  prompt_len=400)), 2, 1),
    "block pool": (S(engine=E(enable_prefix_caching=True, block_hash_caching=True),
                     workload=W(arrival_rate=20.0, num_requests=N // 4)), 2, 1),
    "block pool, shared": (S(engine=E(enable_prefix_caching=True, block_hash_caching=True),
                             workload=W(arrival_rate=20.0, num_requests=N // 20, prefix_groups=16, prefix_len=200,
                                        prompt_len=400)), 2, 1),
    "block pool, many blocks": (S(engine=E(enable_prefix_caching=True, block_hash_caching=True,
                                           num_gpu_blocks=2_000_000),
                                  workload=W(arrival_rate=20.0, num_requests=2000)), 2, 1),
    "closed loop": (S(workload=W(num_requests=N, max_concurrency=64, think_time_s=1.0)), 2, 1),
    "static batching": (S(engine=E(scheduler="static"), workload=W(arrival_rate=5.0, num_requests=N // 4)), 2, 1),
    "swap": (S(engine=E(preemption_mode="swap", swap_space_blocks=4000, num_gpu_blocks=1000),
               workload=W(arrival_rate=20.0, num_requests=N // 4)), 2, 1),
    "fleet of 8, jsq": (S(workload=W(arrival_rate=160.0, num_requests=N), fleet=F.Fleet(replicas=8)), 2, 1),
    "fleet of 32, round robin": (S(workload=W(arrival_rate=600.0, num_requests=N // 5),
                                   fleet=F.Fleet(replicas=32, router="round_robin")), 2, 1),
}


def _status():
    with open("/proc/self/status") as f:
        d = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.startswith("Vm")}
    return d["VmHWM"], d["VmRSS"]


def measure(scenario, n_replications, n_threads):
    """(peak resident bytes of the run less those before it, the estimate)."""
    small = dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload, num_requests=64))
    F.replicate(small, 2, seed=99, n_threads=n_threads)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # (VmHWM := VmRSS)
    _, before = _status()
    F.replicate(scenario, n_replications, seed=1, n_threads=n_threads)
    peak, _ = _status()
    return peak - before, sum(b for b, _, _ in _memory.estimate(scenario, n_replications, n_threads))


if __name__ == "__main__":
    for name in sys.argv[1:] or list(GRID):
        got, est = measure(*GRID[name])
        print(json.dumps({"name": name, "measured": got, "estimate": est}), flush=True)
