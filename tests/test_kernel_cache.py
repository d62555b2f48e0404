"""Numba's disk cache and the kernel's several modules.

Numba stamps a cached function with its own source file only, so a kernel
function that calls (or inlines, or reads a constant of) another module
would be served stale after an edit of that module. Every kernel function is
cached under a stamp over all the package's sources instead
(`fastsim._numba_options.kernel_source_stamp`); these tests edit a callee's
file in a copy of the package and run again on the same cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import fastsim
from fastsim import _numba_options as O

# Draws one request stream (`workload._draw_workload`, an entry cached in
# workload.py, whose random numbers come from rng.py) and sizes a workspace
# (`workspace._ws_need`, whose size includes layout.N_HIST); prints both and
# whether the stream's entry was loaded from the disk cache.
_RUN = """
import json, numpy as np
import fastsim
from fastsim import kernel as K
from fastsim._replicate import pack_scenario
sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=5))
p = pack_scenario(sc)
a, pr, o, c, q, grp, plen = K.draw_workload(0, 1, 2, *K.scenario_arrays(p, lat=False))
need = K._ws_need(np.int64(a.size), pr, o, grp, plen, p["ipar"])
stats = K.workload._draw_workload.stats
print(json.dumps({"arrival": a.tolist(), "prompt": pr.tolist(), "need": [int(x) for x in need],
                  "cache_hits": sum(stats.cache_hits.values())}))
"""


@pytest.fixture
def package_copy(tmp_path):
    """A copy of the fastsim package and an empty Numba cache directory."""
    src = os.path.dirname(fastsim.__file__)
    root = tmp_path / "src"
    shutil.copytree(src, root / "fastsim", ignore=shutil.ignore_patterns("__pycache__"))
    return root, tmp_path / "cache"


def _run(root, cache):
    env = dict(os.environ, PYTHONPATH=str(root), NUMBA_CACHE_DIR=str(cache), FASTSIM_COMPILE_HELPER="0")
    proc = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True, text=True, timeout=600,
                          cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _edit(path, old, new):
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} should occur once in {path.name}"
    path.write_text(text.replace(old, new))


def test_an_edit_of_any_kernel_module_is_never_served_from_the_cache(package_copy):
    root, cache = package_copy
    kernel = root / "fastsim" / "kernel"
    first = _run(root, cache)
    again = _run(root, cache)
    assert again == {**first, "cache_hits": again["cache_hits"]}
    assert again["cache_hits"] >= 1            # the second run loaded the stream's entry
    # a constant of another module (layout.py) read by `_ws_need` (workspace.py)
    _edit(kernel / "layout.py", "N_HIST = 256", "N_HIST = 300")
    edited = _run(root, cache)
    assert edited["need"][0] == first["need"][0] + 44
    assert edited["cache_hits"] == 0           # nothing of the kernel was loaded
    # a callee in another module (rng.py) of `_draw_workload` (workload.py)
    _edit(kernel / "rng.py", "0xBF58476D1CE4E5B9", "0xBF58476D1CE4E5B7")
    drawn = _run(root, cache)
    assert drawn["arrival"] != first["arrival"]
    assert drawn["cache_hits"] == 0


def test_the_stamp_covers_every_kernel_source_and_only_their_contents(package_copy):
    root, _ = package_copy
    folder = os.path.join(os.path.dirname(fastsim.__file__), "kernel")
    modules = {f for f in os.listdir(folder) if f.endswith(".py")}
    assert {"replica.py", "layout.py", "latency.py", "stretch.py"} <= modules
    code = ("import json; from fastsim import _numba_options as O; "
            "print(json.dumps(O.kernel_source_stamp()))")
    env = dict(os.environ, PYTHONPATH=str(root))

    def stamp():
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                             cwd=root)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    here = list(O.kernel_source_stamp())
    assert stamp() == here                     # the copy: the same contents, other times
    os.utime(root / "fastsim" / "kernel" / "latency.py", (0, 0))
    assert stamp() == here
    with open(root / "fastsim" / "kernel" / "latency.py", "a") as f:
        f.write("\n# an edit\n")
    assert stamp() != here


def test_every_kernel_function_is_cached_under_the_stamp():
    from numba.core.registry import CPUDispatcher

    from fastsim import kernel as K

    stamped = 0
    for obj in K.namespace().values():
        if isinstance(obj, CPUDispatcher) and getattr(obj, "_cache", None) is not None \
                and hasattr(obj._cache, "_cache_file"):
            assert obj._cache._cache_file._source_stamp == O.kernel_source_stamp(), obj.py_func.__qualname__
            stamped += 1
    assert stamped > 40
