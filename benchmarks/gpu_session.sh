#!/usr/bin/env bash
# The GPU backend's device check, as one script to run on a lent machine with
# an NVIDIA GPU (the GPU issue): install the gpu extra, run the CUDA tests
# (the real-GPU ones included: they skip without a GPU) and time the GPU
# against the same machine's CPU cores at 10^3 .. 10^6 replications x 1,000
# requests. Prints everything it measured; writes the figures to $OUT when
# set (the device tool's output folder), else to ./gpu_session.
#
#   bash benchmarks/gpu_session.sh            # about 5-8 minutes on an H100
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_session}
mkdir -p "$out"
export NUMBA_CACHE_DIR="$out/numba_cache"
python -m pip install --quiet -e ".[test,gpu]" 2>&1 | tail -3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.csv"
python -m pytest -q -rs tests/test_cuda.py 2>&1 | tee "$out/test_cuda.log"
python benchmarks/gpu_vs_cpu.py --requests 1000 --replications 1000 10000 100000 1000000 --cpu-max 100000 \
    2>&1 | tee "$out/gpu_vs_cpu.log"
