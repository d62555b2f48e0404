#!/usr/bin/env bash
# Set up the oracle environment: vLLM 0.22.0's V1 scheduler on a CPU-only
# machine, with fastsim, in one virtual environment (default: ./.oracle-venv).
#   bash tests/oracle/install.sh [VENV]
#   VENV/bin/python -m pytest -m oracle tests/oracle
# vLLM is installed without its dependencies (CUDA kernels, servers); the
# scheduler needs only torch (a CPU build) and the pure-Python modules of
# fastsim's optional extra "oracle" (pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.oracle-venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch first (the CPU wheel where the machine has one), then vLLM alone.
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
"$VENV/bin/python" -m pip install --quiet --no-deps "vllm==0.22.0"
"$VENV/bin/python" -m pip install --quiet -e ".[oracle]"
"$VENV/bin/python" -c "import vllm.v1.core.sched.async_scheduler, fastsim; print('oracle environment ready:', vllm.__version__)" 2>&1 | tail -1
