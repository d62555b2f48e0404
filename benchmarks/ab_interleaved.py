"""Interleaved A/B timing of fastsim source trees (a script, not a test).

    git worktree add /tmp/base <rev>
    python benchmarks/ab_interleaved.py /tmp/base . [--workload reference|sharegpt|full]
        [--rounds 4] [--replications 1500] [--requests 1000] [--cold | --small | --same-process [--cpu-time]]

On a shared machine single runs vary by 20-40%, so a change is measured
against its parent in alternation: each round runs every tree once, in a
fresh process that imports that tree's ``fastsim`` (``PYTHONPATH``).

* Default: one-thread throughput of ``replicate`` on the benchmark workload
  (``--requests`` a replication, 1,000 by default), best of 3 runs after a
  warm-up. Each tree
  has its own Numba cache directory, kept across rounds (compiled once).
* ``--cold``: the cold start, with an empty cache per run: ``replicate``,
  ``sample_requests`` and ``simulate_requests`` on a 20-request workload
  (``--workload full``: with prefix caching, the full engine).
* ``--small``: the overhead of a small call, the median time of 30
  ``replicate`` calls of 8 x 250 requests (default threads), after a warm-up.
* ``--same-process``: the throughput, with every tree's ``fastsim`` imported
  into one process (each package copied under its own name) and its
  ``replicate`` calls alternated there, the order reversed every other round.
  A change to the kernels is then measured against the same interpreter,
  memory layout and moment, not against another process: one run gives the
  ratio of each tree's time to the first tree's, round by round (their
  median, with a distribution-free 95 % interval for it,
  `common.median_interval`, which takes the rounds as independent draws: a
  machine whose speed drifts within the run makes it too narrow), of the
  trees' fastest calls and of their 10th percentiles, and
  checks that every tree gives the first tree's results (per replication,
  to the bit). The workload is built by this checkout's
  ``benchmarks/common.py``. On a noisy VM, many short calls resolve best,
  by the ratio of the fastest: ``--rounds 150 --replications 100`` (20-40 s
  a tree) told two copies of one tree apart by 0.05-0.5% in ten runs of
  eleven (2.1% in the eleventh), where 9 rounds of 600 replications gave
  medians of 0.94-1.02 (`benchmarks/HISTORY.md`).
* ``--cpu-time`` (with ``--same-process``): each call timed by the process's
  CPU time instead of the wall clock. With other processes on the machine
  (helpers' compilations, test suites on 2 cores), a call's wall time
  includes the time it waited for a core; its CPU time does not
  (`benchmarks/HISTORY.md` compares the two).
  Not for the fleet workloads: with two fastsim packages compiled in one
  process, the second one's fleet kernels run 1.3-1.45x slower (an identical
  copy of the first tree included), so a fleet change is timed in a fresh
  process per tree and round (the default mode), or by `fleet_throughput.py`.

Which build is timed: each tree's kernels are compiled as a cold start on
this machine compiles them, with the compile helper where two cores are
usable; ``FASTSIM_COMPILE_HELPER=0`` in the environment (the children
inherit it) times the one-core build instead, whose engine can differ in
speed (`perf_profile.py`'s ``--helper``, `benchmarks/HISTORY.md`, stop 53).

Prints each round, then the median and range per tree.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from benchmarks import common  # noqa: E402  (workload names only: nothing is timed in this process)

_WARM = r"""
import sys, time
sys.path.insert(0, "benchmarks")
import fastsim
from benchmarks import common
sc = getattr(common, sys.argv[1])(int(sys.argv[3]))
nrep = int(sys.argv[2])
fastsim.replicate(sc, n_replications=2, seed=0, progress=False)
best = float("inf")
for _ in range(3):
    t = time.perf_counter()
    fastsim.replicate(sc, n_replications=nrep, seed=0, n_threads=1, progress=False)
    best = min(best, time.perf_counter() - t)
print(nrep * sc.workload.num_requests / best / 1e6)
"""

_COLD = r"""
import sys, time
sys.path.insert(0, "benchmarks")
import fastsim
from benchmarks import common
sc = getattr(common, sys.argv[1])(20)
t = time.perf_counter()
fastsim.replicate(sc, n_replications=2, seed=0, progress=False)
fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=0))
print(time.perf_counter() - t)
"""

_SMALL = r"""
import sys, time, statistics
sys.path.insert(0, "benchmarks")
import fastsim
from benchmarks.common import reference_workload
sc = reference_workload(250)
fastsim.replicate(sc, n_replications=8, seed=0, progress=False)
times = []
for _ in range(30):
    t = time.perf_counter()
    fastsim.replicate(sc, n_replications=8, seed=0, progress=False)
    times.append(time.perf_counter() - t)
print(statistics.median(times) * 1e3)
"""


# --workload: a name of benchmarks/common.py's WORKLOADS; each tree's process
# looks its function up by the function's name, so an older tree needs only
# the function it runs.
WORKLOADS = {name: f.__name__ for name, f in common.WORKLOADS.items()}


# One process, every tree's package (copied as fastsim_ab0, fastsim_ab1, ...):
# the scenario, built by this checkout's `common`, is pickled once and
# unpickled with each package's classes.
_SAME = r"""
import importlib, io, json, pickle, sys, time
pkgs, workload, nrep, nreq, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
clock = time.process_time if sys.argv[6] == "cpu" else time.perf_counter
names = sys.argv[7:]
sys.path.insert(0, "benchmarks")
sys.path.insert(0, pkgs)
from benchmarks import common
blob = pickle.dumps(getattr(common, workload)(nreq))

class Remap(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "fastsim" or module.startswith("fastsim."):
            module = self.package + module[len("fastsim"):]
        return super().find_class(module, name)

def scenario_for(package):
    u = Remap(io.BytesIO(blob))
    u.package = package
    return u.load()

runs = []
for name in names:
    pkg = importlib.import_module(name)
    sc = scenario_for(name)
    pkg.replicate(sc, n_replications=2, seed=0, progress=False)   # compile (or load), outside the timing
    runs.append((pkg, sc))
times = [[] for _ in names]
first = [None] * len(names)
for r in range(rounds):
    for j in (range(len(names)) if r % 2 == 0 else reversed(range(len(names)))):
        pkg, sc = runs[j]
        t = clock()
        res = pkg.replicate(sc, n_replications=nrep, seed=0, n_threads=1, progress=False)
        times[j].append(clock() - t)
        if first[j] is None:
            first[j] = res.per_replication
    print(json.dumps([t[-1] for t in times]), flush=True)   # a round's seconds, per tree
print(json.dumps([bool(f.equals(first[0])) for f in first]))   # each tree's results equal the first's
"""


def _child_env(cache, **more):
    """This environment for a child process, with its own Numba cache and none of the settings that
    would make it import another fastsim or compile differently."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_OPT")}
    env.update(NUMBA_CACHE_DIR=cache, **more)
    return env


def run_same_process(trees, root, args):
    """`_SAME` in a child process for ``trees``: yield each round's seconds per tree, then (the
    last item) whether each tree's results equal the first tree's."""
    pkgs = os.path.join(root, "packages")
    names = [f"fastsim_ab{i}" for i in range(len(trees))]
    for tree, name in zip(trees, names):
        shutil.copytree(os.path.join(tree, "fastsim"), os.path.join(pkgs, name),
                        ignore=shutil.ignore_patterns("__pycache__"))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-c", _SAME, pkgs, WORKLOADS[args.workload], str(args.replications),
           str(args.requests), str(args.rounds), "cpu" if args.cpu_time else "wall", *names]
    with subprocess.Popen(cmd, cwd=here, env=_child_env(os.path.join(root, "cache")), stdout=subprocess.PIPE,
                          text=True) as child:
        for line in child.stdout:
            yield json.loads(line)
    if child.returncode != 0:
        raise SystemExit(f"the same-process run failed (exit status {child.returncode}; its error is above)")


def run(tree, code, args, cache):
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=_child_env(cache, PYTHONPATH=tree),
                         capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+", help="fastsim checkouts to compare")
    ap.add_argument("--workload", choices=tuple(WORKLOADS), default="reference",
                    help="full: the reference workload with prefix caching (the full engine)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--replications", type=int, default=1500, help="per timed run (throughput mode)")
    ap.add_argument("--requests", type=int, default=1000, help="a replication (throughput mode)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--cold", action="store_true", help="time cold starts instead of throughput")
    mode.add_argument("--small", action="store_true", help="time small replicate calls (8 x 250 requests)")
    mode.add_argument("--same-process", action="store_true",
                      help="time the throughput with every tree in one process, alternating calls")
    ap.add_argument("--cpu-time", action="store_true",
                    help="with --same-process: time each call by the process's CPU time, not the wall clock "
                         "(other processes on the machine then slow the calls less)")
    args = ap.parse_args()
    if args.cpu_time and not args.same_process:
        ap.error("--cpu-time needs --same-process")
    if args.same_process and args.workload in common.FLEET_WORKLOADS:
        ap.error(f"--same-process cannot time --workload {args.workload}: in one process, the fleet kernels of "
                 f"every tree after the first run 1.3-1.45x slower (an identical copy included; "
                 f"benchmarks/HISTORY.md, stop 53); leave --same-process out (a fresh process per tree and round)")
    for name in ("rounds", "replications", "requests"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    trees = [os.path.abspath(t) for t in args.trees]
    names = [f"{i}:{os.path.basename(t) or t}" for i, t in enumerate(trees)]
    unit = (f"s (cold start, {args.workload})" if args.cold else "ms (replicate of 8 x 250 requests)" if args.small
            else f"M requests/s ({args.workload}, 1 thread)")
    results = {n: [] for n in names}
    if args.same_process:
        size = args.replications * args.requests
        times = []
        with tempfile.TemporaryDirectory(prefix="fastsim_ab_") as root:
            for r, got in enumerate(run_same_process(trees, root, args)):
                if r == args.rounds:
                    same = got
                    break
                times.append(got)
                print(f"round {r + 1}: " + ", ".join(f"{n} {size / t / 1e6:.3f}" for n, t in zip(names, got)),
                      flush=True)
        for j, n in enumerate(names):
            mine = sorted(t[j] for t in times)
            line = (f"{n}: median {size / statistics.median(mine) / 1e6:.3f} {unit}, fastest call "
                    f"{size / mine[0] / 1e6:.3f}")
            if j > 0:
                ratios = [t[j] / t[0] for t in times]
                first = sorted(t[0] for t in times)
                ci = common.median_interval(ratios)
                line += (f"; time / {names[0]}'s, by round: median {statistics.median(ratios):.4f}"
                         + (f" (95 % interval {ci[0]:.4f}-{ci[1]:.4f})" if ci else "") + ", range "
                         f"{min(ratios):.3f}-{max(ratios):.3f}; of the fastest calls {mine[0] / first[0]:.4f}, "
                         f"of the 10th percentiles {common.decile(mine) / common.decile(first):.4f}; "
                         f"{'the same' if same[j] else 'DIFFERENT'} results")
            print(line)
        return
    with tempfile.TemporaryDirectory(prefix="fastsim_ab_") as root:
        for r in range(args.rounds):
            for name, tree in zip(names, trees):
                if args.cold:
                    with tempfile.TemporaryDirectory(dir=root) as cache:
                        results[name].append(run(tree, _COLD, [WORKLOADS[args.workload]], cache))
                else:
                    cache = os.path.join(root, name.replace(":", "_"))
                    code, extra = ((_SMALL, []) if args.small
                                   else (_WARM, [WORKLOADS[args.workload], str(args.replications),
                                                    str(args.requests)]))
                    results[name].append(run(tree, code, extra, cache))
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.3f}" for n, v in results.items()), flush=True)
    for n, v in results.items():
        print(f"{n}: median {statistics.median(v):.3f} {unit}, range {min(v):.3f}-{max(v):.3f}")


if __name__ == "__main__":
    main()
