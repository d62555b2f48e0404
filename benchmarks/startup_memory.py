"""Compilation time, warm start and peak memory of fastsim (a script, not a test).

    python benchmarks/startup_memory.py [--replications 100000] [--requests 1000]

Each figure is measured in a fresh Python process:

* ``import fastsim`` (must compile nothing);
* cold start: the first ``replicate``, ``sample_requests`` and
  ``simulate_requests`` calls with an empty Numba cache (JIT of every kernel
  they need), on the issue-7 workload (the common engine) and on the same
  with prefix caching (the engine with every option, `kernel.replica._simulate`'s
  ``full``); with the compile helper (a second process compiles the
  engine's callees and the entries other than the engine) and, for the
  issue-7 workload, without it
  (``FASTSIM_COMPILE_HELPER=0``);
* warm start: the same call with the cache the cold run left (alone, and
  with the import before it);
* peak resident memory (``ru_maxrss``) of ``replications x requests`` on the
  issue-7 workload, reduced per replication inside the kernel.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import fastsim
t_import = time.perf_counter() - t0
sys.path.insert(0, {bench!r})
from benchmarks.common import {workload} as workload
nrep, nreq = {nrep}, {nreq}
t1 = time.perf_counter()
sc = workload(nreq)
res = fastsim.replicate(sc, n_replications=nrep, seed=0, progress=False)
if {every}:
    fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=0))
t_run = time.perf_counter() - t1
print(json.dumps(dict(import_s=t_import, first_call_s=t_run,
                      peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def child(cache, nrep, nreq, every=False, workload="reference_workload", helper=True):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, FASTSIM_COMPILE_HELPER="1" if helper else "0")
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), nrep=nrep, nreq=nreq, every=every,
                        workload=workload)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replications", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        cold = child(cache, 2, 20, every=True)
        warm = child(cache, 2, 20, every=True)
        big = child(cache, args.replications, args.requests)
    with tempfile.TemporaryDirectory() as cache:
        cold_full = child(cache, 2, 20, every=True, workload="full_engine_workload")
    with tempfile.TemporaryDirectory() as cache:
        cold_serial = child(cache, 2, 20, every=True, helper=False)
    print(f"import fastsim: {warm['import_s']:.2f} s")
    print(f"cold start (JIT of every kernel + tiny runs): {cold['first_call_s']:.1f} s; "
          f"with prefix caching (the full engine): {cold_full['first_call_s']:.1f} s; "
          f"without the compile helper: {cold_serial['first_call_s']:.1f} s")
    print(f"warm start (Numba cache + tiny runs): {warm['first_call_s']:.2f} s; "
          f"with the import, from a fresh interpreter: {warm['import_s'] + warm['first_call_s']:.2f} s")
    print(f"{args.replications} x {args.requests} requests: {big['first_call_s']:.1f} s, "
          f"peak RSS {big['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
