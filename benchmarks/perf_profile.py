"""Profile the compiled kernels with Linux ``perf`` (a script).

    perf record -e cpu-clock -F 5000 -o perf.data \\
        python benchmarks/perf_profile.py [--workload reference|sharegpt|full] [--replications 4000] [--requests 1000]
    perf report -i perf.data --no-children --sort sym

perf cannot name code that Numba compiled at run time. This script compiles
the kernels afresh (into a temporary ``NUMBA_CACHE_DIR``: code loaded from the
cache carries no symbol table), writes ``/tmp/perf-<pid>.map``, which perf
reads to name each kernel function (its extent from the object code Numba
keeps, read by binutils' ``nm``; without them, up to the next function), and
then times one ``replicate`` call on
one thread. Functions that LLVM inlined are counted in their caller. The
compilation itself shows up in the profile as LLVM and Python frames; only the
``fastsim...`` symbols and libm (``__ieee754_exp_fma``, ``__ieee754_log_fma``, ...)
belong to the timed run.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

# Before Numba is imported: a fresh cache, so that everything is compiled here.
os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastsim_perf_")
os.environ["FASTSIM_COMPILE_HELPER"] = "0"   # compile every kernel here (a helper's would come from the cache)
sys.path.insert(0, os.path.dirname(__file__))

import numba  # noqa: E402

import fastsim  # noqa: E402
from fastsim import _kernel  # noqa: E402
from benchmarks.common import WORKLOADS  # noqa: E402

_DEFINE = re.compile(r'^define [^@]*@"?([^"(\s]+)"?\(', re.M)


def _symbol_sizes(lib):
    """{name: size} of the functions in ``lib``'s object code (``nm -S``),
    or None where that cannot be had (no ``nm``, or a Numba without the
    object code kept)."""
    try:
        code = lib._get_compiled_object()   # what MCJIT loaded (kept for Numba's cache)
    except Exception:
        return None
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(code)
        f.flush()
        try:
            out = subprocess.run(["nm", "-S", "--defined-only", f.name], capture_output=True, text=True,
                                 check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
    sizes = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT":
            sizes[parts[3]] = int(parts[1], 16)
    return sizes


def write_perf_map():
    """Write /tmp/perf-<pid>.map for every function the kernel's dispatchers
    compiled; return (functions, how many have their exact size)."""
    entries = {}
    for obj in vars(_kernel).values():
        if not isinstance(obj, numba.core.registry.CPUDispatcher):
            continue
        for cres in obj.overloads.values():
            lib = cres.library
            sizes = _symbol_sizes(lib) or {}
            for name in _DEFINE.findall(lib.get_llvm_str()):
                addr = lib.get_pointer_to_function(name)
                if addr:
                    entries[addr] = (re.sub(r"^_ZN\d+", "", name)[:100], sizes.get(name))
    if not entries:
        raise SystemExit("no compiled kernel functions found (loaded from a cache?)")
    addrs = sorted(entries)
    # Without its size from the object code, a function is taken to end where
    # the next begins (which charges it with whatever lies in between).
    with open(f"/tmp/perf-{os.getpid()}.map", "w") as f:
        for a, b in zip(addrs, addrs[1:] + [addrs[-1] + 65536]):
            name, size = entries[a]
            f.write(f"{a:x} {size if size else min(b - a, 1 << 20):x} {name}\n")
    return len(entries), sum(1 for _, size in entries.values() if size)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=tuple(WORKLOADS), default="reference",
                    help="full: the reference workload with prefix caching (the full engine)")
    ap.add_argument("--replications", type=int, default=4000)
    ap.add_argument("--requests", type=int, default=1000, help="requests a replication")
    args = ap.parse_args()
    sc = WORKLOADS[args.workload](args.requests)
    fastsim.replicate(sc, n_replications=2, seed=0, progress=False)   # compile
    n, exact = write_perf_map()
    print(f"perf map: {n} functions ({exact} with their size from the object code)")
    t = time.perf_counter()
    fastsim.replicate(sc, n_replications=args.replications, seed=0, n_threads=1, progress=False)
    wall = time.perf_counter() - t
    print(f"{args.replications} x {args.requests} requests, 1 thread: {wall:.2f} s "
          f"({args.replications * args.requests / wall:,.0f} requests/s)")


if __name__ == "__main__":
    main()
