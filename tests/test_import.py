"""``import fastsim`` compiles nothing (the performance issue's start-up rule).

Checked in a fresh interpreter with an empty Numba cache: after the import, no
kernel function of any fastsim module has a compiled version, and nothing was
written to the cache. Nor does the import load SciPy's subpackages or
matplotlib (about 1.3 s of a 2.3 s import on the development VM): the
functions that need them import them.
"""

import json
import os
import subprocess
import sys

import pytest

_CODE = r"""
import json, sys
import fastsim
from numba.core.dispatcher import Dispatcher
found, compiled = [], []
for name, mod in list(sys.modules.items()):
    if name == "fastsim" or name.startswith("fastsim."):
        for attr, obj in vars(mod).items():
            if isinstance(obj, Dispatcher):
                found.append(name + "." + attr)
                if obj.overloads:
                    compiled.append(name + "." + attr)
heavy = [m for m in ("scipy.special", "scipy.stats", "scipy.optimize", "scipy.signal", "scipy.sparse",
                      "matplotlib")
         if m in sys.modules]
print(json.dumps({"found": sorted(set(found)), "compiled": sorted(set(compiled)), "heavy": heavy,
                  "file": fastsim.__file__}))
"""


@pytest.fixture(scope="module")
def fresh_import(tmp_path_factory):
    """What one fresh interpreter saw after ``import fastsim``, and its Numba cache directory."""
    cache = tmp_path_factory.mktemp("numba_cache")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    # From the repository root, so that the fastsim under test is the one imported.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _CODE], env=env, cwd=root, capture_output=True, text=True,
                         check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1]), cache


def test_import_compiles_nothing(fresh_import):
    seen, cache = fresh_import
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    assert os.path.dirname(os.path.realpath(seen["file"])) == os.path.join(here, "fastsim")
    # The check is only as good as what it looks at: the engine must be among the kernels seen.
    assert "fastsim.kernel._simulate" in seen["found"]
    assert len(seen["found"]) > 20
    assert seen["compiled"] == []
    assert [p.name for p in cache.rglob("*") if p.is_file()] == []


def test_import_leaves_heavy_modules_out(fresh_import):
    seen, _cache = fresh_import
    assert seen["heavy"] == []


def _import_graph():
    """fastsim's modules and, for each, the fastsim modules it imports
    (anywhere in it, functions included). ``from . import x`` imports the
    submodule x when there is one, else the package."""
    import ast
    import pathlib

    import fastsim

    root = pathlib.Path(fastsim.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    graph = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
                edges.update(subs if subs else ([target] if target in modules else []))
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def test_no_import_circles():
    """No module of fastsim imports, directly or through others, a module
    that imports it (a package's ``__init__`` importing its own modules
    aside: they never import it back)."""
    graph = _import_graph()
    assert "fastsim.kernel.replica" in graph and "fastsim._numba_options" in graph
    circles = []
    state = {}

    def visit(v, path):
        state[v] = "open"
        for w in sorted(graph[v]):
            if state.get(w) == "open":
                circles.append(path[path.index(w):] + [w])
            elif w not in state:
                visit(w, path + [w])
        state[v] = "done"

    for v in sorted(graph):
        if v not in state:
            visit(v, [v])
    # Known, and left for their own work: LatencyModel's constructors from
    # calibration data (preset, from_tpot_traces, from_vllm_bench) call the
    # fitting module, which builds LatencyModel objects; a scenario file's
    # [deployment] table (`Scenario.from_dict`) builds a Deployment, which
    # builds an EngineConfig. Any other circle fails.
    known = [{"fastsim._latency", "fastsim._calibration"}, {"fastsim._config", "fastsim._deployment"}]
    assert [c for c in circles if set(c) not in known] == []
