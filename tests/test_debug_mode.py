"""The kernel's debug mode (``FASTSIM_KERNEL_DEBUG=1``): every kernel
function compiled with Numba's bounds checks, cached apart, the
replications run on a path where the IndexError reaches the caller
(`fastsim._numba_options.KERNEL_DEBUG`, docs/testing.md).

The mode is read at import, so each test runs it in a subprocess (on the
session's Numba cache directory: the mode's files have names of their own,
so a second run is warm). Its results are compared with this process's,
which runs the ordinary compiled kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fastsim
from fastsim import _numba_options as O

COMMON = fastsim.Scenario(
    engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=120, max_num_batched_tokens=256),
    workload=fastsim.Workload(arrival_rate=8.0, num_requests=150, prompt_len=fastsim.LogNormal(60, 0.8),
                              output_len=fastsim.LogNormal(40, 0.9), warmup_requests=10),
    latency=fastsim.LatencyModel.default())

# Scenarios of the full engine (`replica.engine_variant`): static batching,
# prefix caching, swap, priority preemption, each with a tight KV cache.
FULL = {
    "static": dict(scheduler="static", num_gpu_blocks=200),
    "prefix-caching": dict(enable_prefix_caching=True, num_gpu_blocks=150),
    "swap": dict(preemption_mode="swap", swap_space_blocks=60, num_gpu_blocks=60),
    "priority-preemption": dict(policy="priority", priority_preemption=True, num_gpu_blocks=60),
}


#: The per-request results compared (`simulate_requests`' columns).
COLUMNS = ("status", "first_token_s", "finish_s", "num_preemptions", "num_tokens")


def full_scenario(name):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, **FULL[name]),
        workload=fastsim.Workload(arrival_rate=8.0, num_requests=150, prompt_len=fastsim.LogNormal(60, 0.8),
                                  output_len=fastsim.LogNormal(40, 0.9), priorities=(0, 1, 2),
                                  priority_probs=(0.2, 0.3, 0.5), prefix_groups=3, prefix_len=48),
        latency=fastsim.LatencyModel.default())


def run_debug(code, tmp_path):
    """Run ``code`` (which imports this module's scenarios from ``test_debug_mode``)
    with the debug mode on; returns its JSON output."""
    env = dict(os.environ, FASTSIM_KERNEL_DEBUG="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(fastsim.__file__)),
                                           os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_RUNS = """
import json, numpy as np
import fastsim
from fastsim import _numba_options as O, kernel as K
from test_debug_mode import COLUMNS, COMMON, FULL, full_scenario
out = {"debug": O.KERNEL_DEBUG, "stamp": list(O.kernel_source_stamp()),
       "index": K.replica._simulate._cache._cache_file._index_name}
rows = fastsim.replicate(COMMON, 4, seed=3, n_threads=2).per_replication   # (JSON keeps floats exact)
out["replicate"] = {c: rows[c].to_numpy(float).tolist() for c in rows}
for name in FULL:
    sc = full_scenario(name)
    res = fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=5))
    out[name] = {c: res[c].astype(str).tolist() if c == "status" else res[c].to_numpy(float).tolist()
                 for c in COLUMNS}
print(json.dumps(out))
"""


def test_debug_mode_runs_both_engines_with_the_same_bits(tmp_path):
    """Under the debug mode, `replicate` (the common engine, on 2 threads,
    through the debug driver) and `simulate_requests` (the full engine:
    static batching, prefix caching, swap) give this process's results to
    the bit, from code cached apart from it."""
    out = run_debug(_RUNS, tmp_path)
    assert out["debug"] is True and not O.KERNEL_DEBUG
    assert out["stamp"] != list(O.kernel_source_stamp()) and out["stamp"][-1] == "boundscheck"
    assert out["index"].startswith(O.DEBUG_CACHE_PREFIX)
    here = fastsim.replicate(COMMON, 4, seed=3, n_threads=2).per_replication
    assert list(out["replicate"]) == list(here.columns)
    for col in here:
        np.testing.assert_array_equal(out["replicate"][col], here[col].to_numpy(float), err_msg=col)
    for name in FULL:
        sc = full_scenario(name)
        mine = fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=5))
        assert (mine["status"] == "completed").any(), name
        assert out[name]["status"] == mine["status"].astype(str).tolist(), name
        for col in COLUMNS[1:]:
            np.testing.assert_array_equal(out[name][col], mine[col].to_numpy(float), err_msg=f"{name}: {col}")


_UNDERSIZED = """
import json
import fastsim
from fastsim import _memory
from test_debug_mode import COMMON

class Short(_memory.CheckedBuffers):   # request arrays one entry short of the stream the draw writes
    def __init__(self, num_requests, scenario):
        super().__init__(num_requests - 1, scenario)

_memory.CheckedBuffers = Short   # (`replicate`'s buffers)
try:
    fastsim.replicate(COMMON, 3, seed=1, n_threads=1)
    out = {"raised": None}
except Exception as exc:
    out = {"raised": type(exc).__name__, "message": str(exc), "cause": repr(exc.__cause__)}
print(json.dumps(out))
"""


def test_debug_mode_catches_an_out_of_bounds_access(tmp_path):
    """Buffers too small for the stream, handed to a kernel entry (the
    draw, through `replicate`'s debug driver): the bounds checks raise, and
    the error says what happened and where. (Without the debug mode the
    draw would write past the array. An undersized *workspace* is no such
    case: the engine refuses it itself, `replica._simulate` returns -1.)"""
    out = run_debug(_UNDERSIZED, tmp_path)
    assert out["raised"] == "IndexError", out
    assert "out of its bounds" in out["message"] and "FASTSIM_KERNEL_DEBUG=1" in out["message"]
    assert "replications 0..2" in out["message"] and "_run_chunk" in out["message"]
    assert "index is out of bounds" in out["cause"]


def test_debug_error_names_the_call():
    with pytest.raises(IndexError, match=r"bounds in the call \(IndexError: boom"):
        raise O.debug_error(IndexError("boom"), "the call")
    # outside the debug mode the block's IndexError passes unchanged
    with pytest.raises(IndexError, match="^boom$"):
        with O.debug_errors("the call"):
            raise IndexError("boom")
