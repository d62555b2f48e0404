"""Replications per second on the GPU vs the CPU kernel (a script, not a test).

    python benchmarks/gpu_vs_cpu.py [--requests 1000] [--replications 1000 10000 100000]

Runs the issue-7 reference workload (and ShareGPT at ~80% load) with
``backend="numba"`` (all cores) and ``backend="cuda"``, after compilation,
and prints replications/s for each count, the GPU/CPU ratio and the GPU
model. Needs ``pip install 'fastsim-llm[gpu]'`` and an NVIDIA GPU; without one it
says what is missing and exits with status 2.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from fastsim._cuda import cuda_unavailable_reason  # noqa: E402
from benchmarks.common import reference_workload, sharegpt_80pct  # noqa: E402


def rate(sc, nrep, backend):
    t = time.perf_counter()
    fastsim.replicate(sc, n_replications=nrep, seed=0, backend=backend, progress=False)
    return nrep / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--replications", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--cpu-max", type=int, default=10_000,
                    help="time the CPU up to this many replications and extrapolate linearly beyond")
    args = ap.parse_args()
    reason = cuda_unavailable_reason()
    if reason is not None:
        print(f"no GPU backend here: {reason}")
        return 2
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    print(f"GPU: {props['name'].decode()}; CPU threads: {fastsim._replicate._thread_count(None)}")
    for name, factory in (("reference workload", reference_workload), ("ShareGPT 80%", sharegpt_80pct)):
        sc = factory(args.requests)
        for backend in ("numba", "cuda"):
            rate(sc, 64, backend)   # compile / first launch
        print(f"{name}, {args.requests} requests per replication")
        print("replications | CPU rep/s | GPU rep/s | GPU / CPU")
        for nrep in args.replications:
            cpu = rate(sc, min(nrep, args.cpu_max), "numba")
            gpu = rate(sc, nrep, "cuda")
            print(f"{nrep:>12,} | {cpu:>9,.0f} | {gpu:>9,.0f} | {gpu / cpu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
