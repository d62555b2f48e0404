#!/usr/bin/env bash
# The GPU backend's device check, as one script for a short lease on a lent
# machine with an NVIDIA GPU: run the real-GPU tests of tests/test_cuda.py,
# then, in the same process, time the GPU against the same machine's CPU
# cores at 10^3 .. 10^6 replications x 1,000 requests
# (benchmarks/gpu_vs_cpu.py), with launch
# variants if time is left. Prints everything it measured; writes the logs
# and a JSON of the figures to $OUT when set (the device tool's output
# folder), else to ./gpu_session.
#
#   bash benchmarks/gpu_session.sh [seconds]     # a time budget, default 480
#
# Uses the machine's own numba, numba-cuda and CuPy when they import (a lent
# machine may have no network); else installs the gpu extra. Wheels in .whl/
# are installed first, over the machine's own (a lent H100 had numpy 2.5,
# which numba-cuda 0.30 cannot import: carry numpy 2.4 there).
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${1:-480}
start=$(date +%s)
out=${OUT:-gpu_session}
mkdir -p "$out"
export NUMBA_CACHE_DIR=/tmp/fastsim_numba_cache PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
    if $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/fastsim_wheels .whl/*.whl; then
        export PYTHONPATH=/tmp/fastsim_wheels
    fi
fi
if ! $py -c "import numba, numba.cuda, cupy, scipy, pandas, joblib, tqdm, pyarrow, matplotlib" 2>/dev/null; then
    $py -m pip install --quiet -e ".[test,gpu]" 2>&1 | tail -3
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$py - <<'EOF' 2>&1 | tee "$out/versions.txt"
import sys, numpy, numba, scipy
print("python", sys.version.split()[0], "numpy", numpy.__version__, "numba", numba.__version__, "scipy", scipy.__version__)
for name in ("numba_cuda", "cupy", "llvmlite"):
    try:
        print(name, __import__(name).__version__)
    except Exception as exc:
        print(name, "missing:", exc)
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.csv"
nproc | tee -a "$out/gpu.csv"
# The real-GPU tests (the CUDA-simulator ones run in CI on every change), then
# the timings, in one process: the kernels the tests compile (minutes, on the
# CPU) are the ones the timings launch, not compiled a second time.
# (`timeout`: a hung test or launch must not hold the lease past the budget)
timeout $(( budget + 60 )) $py - "$budget" "$start" "$out" <<'EOF' 2>&1 | tee "$out/session.log"
import runpy, sys, time
import pytest

budget, start, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
t0 = time.time()
rc = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "--durations=8", "tests/test_cuda.py",
                  "-k", "real_gpu_agrees or unknown_backend or groups_fit"])
print(f"pytest exit code {int(rc)}, {time.time() - t0:.0f} s", flush=True)
left = budget - (time.time() - start)
print(f"seconds left for timing: {left:.0f}", flush=True)
sys.argv = ["gpu_vs_cpu.py", "--requests", "1000", "--replications", "1000", "10000", "100000", "1000000",
            "--cpu-max", "100000", "--time-limit", "90", "--deadline", str(max(left - 20, 20)),
            "--variants", "--bits", "--json", f"{out}/gpu_vs_cpu.json"]
runpy.run_path("benchmarks/gpu_vs_cpu.py", run_name="__main__")
EOF
echo "total: $(( $(date +%s) - start )) s"
