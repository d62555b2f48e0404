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

By source line (the samples inside one kernel function, the code LLVM
inlined into it included):

    perf record -e cpu-clock -F 10000 -o perf.data \
        python benchmarks/perf_profile.py --workload sharegpt --replications 8000 --lines DIR
    python benchmarks/perf_profile.py --report perf.data --lines DIR [--function _simulate] [--top 40]

A fleet's routing loop: ``--workload fleet-jsq-8 --requests 2000 --replications 1500`` (a replication's
requests, the fleet's), then ``--report ... --function _simulate_fleet_rows`` (or ``_simulate``, the
replicas' resumed calls). A disaggregated server's: ``--workload disagg-jsq-2p4d``, then ``--function
_simulate_disagg`` (its decode pool's routing loop; the prefill pool's is ``_simulate_fleet_rows``).

With ``--lines``, the kernels are compiled with line tables and no other
debug information (`_line_tables_only`: the optimisation of a normal build) and
each entry's object code is written to DIR with the address it was loaded
at. ``--report`` then reads the samples' addresses (``perf script``), finds
each one's source line in the object code's line table (binutils'
``readelf --debug-dump=decodedline``, which gives an inlined instruction the
line of the innermost function it came from; line 0, code LLVM merged from
several lines, is reported as "(no line)"), and prints the lines that hold
the most samples.

Which build. Every kernel is compiled in this process
(``FASTSIM_COMPILE_HELPER=0``), whose symbols and object code this script
reads. A cold start with the compile helper (two or more cores) makes the
same machine code: the helper saves the internal functions as the IR this
process would link (`benchmarks/HISTORY.md`, stop 54; before, the helper
built them in full and the engine's code differed with the build).
"""

import argparse
import bisect
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

if "--report" not in sys.argv:   # (--report only reads a recorded run)
    # Before Numba is imported: a fresh cache, so that everything is compiled here.
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastsim_perf_")
    os.environ["FASTSIM_COMPILE_HELPER"] = "0"   # compile every kernel here (a helper's would come from the cache)
sys.path.insert(0, os.path.dirname(__file__))

import numba  # noqa: E402
from numba.core.cpu import CPUTargetOptions  # noqa: E402


def _line_tables_only():
    """Make every CPU compilation of this process emit line tables and
    nothing else of debug information. Numba's full debug information
    (``NUMBA_DEBUGINFO=1``) also marks every function ``noinline``, turns
    bounds checks on and extends variables' lifetimes: a different program
    (helpers such as `_account_step`, `_d_remove` and `_mix64` stayed calls
    that the normal build inlines), whose samples by line misled."""
    finalize = CPUTargetOptions.finalize

    def lines_only(self, flags, options):
        flags.debuginfo = True
        flags.dbg_directives_only = True   # (no noinline: Numba adds it for full debug information only)
        flags.dbg_extend_lifetimes = False
        flags.boundscheck = False
        finalize(self, flags, options)

    CPUTargetOptions.finalize = lines_only


if "--lines" in sys.argv and "--report" not in sys.argv:
    _line_tables_only()

import fastsim  # noqa: E402
from fastsim import kernel  # noqa: E402
from fastsim.kernel import autoscale, cluster, disagg  # noqa: E402
from benchmarks.common import WORKLOADS  # noqa: E402

_DEFINE = re.compile(r'^define [^@]*@"?([^"(\s]+)"?\(', re.M)
# the functions --lines writes out (a fleet's routing loop, `cluster._simulate_fleet_rows`, and a
# disaggregated server's decode pool's, `disagg._simulate_disagg`, too)
_ENTRIES = ("_simulate", "_draw_workload", "_reduce", "_simulate_fleet_rows", "_simulate_disagg")


def _nm_functions(path):
    """{name: (offset, size)} of the functions defined in the object file
    ``path`` (binutils' ``nm -S``)."""
    out = subprocess.run(["nm", "-S", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return {parts[3]: (int(parts[0], 16), int(parts[1], 16))
            for parts in (line.split() for line in out.splitlines()) if len(parts) == 4 and parts[2] in "tT"}


def _symbol_sizes(lib):
    """{name: size} of the functions in ``lib``'s object code, or None where
    that cannot be had (no ``nm``, or a Numba without the object code kept)."""
    try:
        code = lib._get_compiled_object()   # what MCJIT loaded (kept for Numba's cache)
    except Exception:
        return None
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(code)
        f.flush()
        try:
            return {name: size for name, (_, size) in _nm_functions(f.name).items()}
        except (OSError, subprocess.CalledProcessError):
            return None


def write_perf_map():
    """Write /tmp/perf-<pid>.map for every function the kernel's dispatchers
    compiled; return (functions, how many have their exact size)."""
    entries = {}
    fleets = [o for m in (cluster, disagg, autoscale) for o in vars(m).values()]   # (the fleets' entries too)
    for obj in list(kernel.namespace().values()) + fleets:
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


def write_objects(directory):
    """Write the object code of each of `_ENTRIES` (every compiled version) to
    ``directory``, with ``index.json``: {function: [object file, load address]}
    for every function defined in them (`report_lines` reads it)."""
    os.makedirs(directory, exist_ok=True)
    index = {}
    for name in _ENTRIES:
        found = kernel.namespace().get(name) or getattr(cluster, name, None) or getattr(disagg, name)
        for i, cres in enumerate(found.overloads.values()):
            path = os.path.abspath(os.path.join(directory, f"{name}_{i}.o"))
            with open(path, "wb") as f:
                f.write(cres.library._get_compiled_object())
            for fn in _DEFINE.findall(cres.library.get_llvm_str()):
                addr = cres.library.get_pointer_to_function(fn)
                if addr and fn not in index:   # (first: an entry's own, not a later caller's link to it)
                    index[fn] = [path, addr]
    with open(os.path.join(directory, "index.json"), "w") as f:
        json.dump(index, f)


def _line_table(path):
    """The object file's line table as two sorted lists: the addresses where a
    row starts, and each row's (file, line), None for line 0 (code LLVM
    merged from several lines) and for a sequence's end (``readelf
    --debug-dump=decodedline``; of rows at one address, the last holds)."""
    out = subprocess.run(["readelf", "--debug-dump=decodedline", path], capture_output=True, text=True,
                         check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"^(\S+)\s+(\d+|-)\s+(0x[0-9a-f]+|\d+)\b", line)
        if m:
            where = (m.group(1), int(m.group(2))) if m.group(2) not in ("-", "0") else None
            rows.append((int(m.group(3), 0), where))
    rows.sort(key=lambda row: row[0])   # (stable: rows at one address keep their order)
    return [a for a, _ in rows], [w for _, w in rows]


def _source_lines(name):
    """The lines of source file ``name`` (a bare name is looked up in the
    fastsim package: the line table names its own files without a directory),
    or [] where it cannot be read."""
    path = name
    if not os.path.isabs(name):   # (the package's own files, then its kernel's)
        root = os.path.dirname(fastsim.__file__)
        path = next((p for p in (os.path.join(root, name), os.path.join(root, "kernel", name))
                     if os.path.exists(p)), name)
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def report_lines(data, directory, function, top):
    """Print the source lines of ``function`` (a kernel entry) that hold the
    most of its samples in perf's ``data``."""
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    names = [fn for fn in index if re.match(rf"_ZN7fastsim6kernel\d+[A-Za-z_]+\d+{re.escape(function)}B", fn)]
    if not names:
        raise SystemExit(f"--function {function!r}: not among the functions written to {directory} "
                         f"({', '.join(_ENTRIES)})")
    path, base = index[names[0]]
    found = _nm_functions(path).get(names[0])
    if found is None:
        raise SystemExit(f"{names[0]} not found in {path}")
    start, size = found
    ips = subprocess.run(["perf", "script", "-i", data, "-F", "ip"], capture_output=True, text=True,
                         check=True).stdout.split()
    counts = collections.Counter(int(ip, 16) - base for ip in ips)
    addrs, rows = _line_table(path)
    by_line = collections.Counter()
    for off, c in counts.items():
        if 0 <= off < size:
            i = bisect.bisect_right(addrs, start + off) - 1
            by_line[rows[i] if i >= 0 else None] += c
    total = sum(by_line.values())
    if total == 0:
        raise SystemExit(f"no samples in {function} (was {data} recorded with this --lines directory?)")
    print(f"{function}: {total} samples ({total / len(ips):.1%} of all), by source line:")
    sources = {}
    for where, c in by_line.most_common(top):
        text = ""
        if where is not None:
            if where[0] not in sources:
                sources[where[0]] = _source_lines(where[0])
            lines = sources[where[0]]
            text = lines[where[1] - 1].strip() if 0 < where[1] <= len(lines) else ""
        label = f"{os.path.basename(where[0])}:{where[1]}" if where else "(no line)"
        print(f"{c / total:6.1%}  {label:<18} {text[:90]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=tuple(WORKLOADS), default="reference",
                    help="full: the reference workload with prefix caching (the full engine)")
    ap.add_argument("--replications", type=int, default=4000)
    ap.add_argument("--requests", type=int, default=1000, help="requests a replication")
    ap.add_argument("--lines", metavar="DIR", help="compile with line tables and write the entries' object "
                    "code to DIR (for --report)")
    ap.add_argument("--report", metavar="PERF_DATA", help="print the samples by source line, from a run "
                    "recorded with --lines DIR")
    ap.add_argument("--function", default="_simulate", choices=_ENTRIES, help="with --report")
    ap.add_argument("--top", type=int, default=40, help="with --report: lines to print")
    args = ap.parse_args()
    for name in ("replications", "requests", "top"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if args.report:
        if not args.lines:
            ap.error("--report needs --lines DIR, the directory the recorded run wrote")
        report_lines(args.report, args.lines, args.function, args.top)
        return
    sc = WORKLOADS[args.workload](args.requests)
    fastsim.replicate(sc, n_replications=2, seed=0, progress=False)   # compile
    n, exact = write_perf_map()
    print(f"perf map: {n} functions ({exact} with their size from the object code)")
    if args.lines:
        write_objects(args.lines)
    t = time.perf_counter()
    fastsim.replicate(sc, n_replications=args.replications, seed=0, n_threads=1, progress=False)
    wall = time.perf_counter() - t
    print(f"{args.replications} x {args.requests} requests, 1 thread: {wall:.2f} s "
          f"({args.replications * args.requests / wall:,.0f} requests/s)")


if __name__ == "__main__":
    main()
