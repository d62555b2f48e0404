"""One replica's throughput in fresh processes, one tree after the other
(a script): the spread of a tree's speed between processes, which a
same-process comparison (`ab_interleaved.py --same-process`) cannot show,
since its trees share the process's fate.

    python benchmarks/process_spread.py TREE [TREE ...] [--processes 8] [--workload reference]
                                        [--requests 1000] [--replications 60]

Each process imports the tree's ``fastsim`` (``PYTHONPATH=TREE``; this
checkout's scenarios, so trees with today's API), holds a block of
``k * --shift`` bytes (process k), runs one warm-up call, then six calls of
``--replications`` on one thread, and prints the fastest (CPU time). Even
processes run the program with ``python -c``, odd ones from a file: the C
heap's history up to the run (even the interpreter's start: ``sys.path``
differs) decides where a workspace on ordinary pages lands, which moved the
parent of stop 57 between 4.3 M requests/s (``-c``) and 3.7 M (a file) on
the reference workload, every time (`benchmarks/HISTORY.md`); a workspace
on huge pages (`fastsim._pages`) starts on one wherever the heap stands.
"""

import argparse
import os
import subprocess
import sys
import tempfile

_CHILD = """
import sys, time
sys.path.insert(0, {bench!r})
from benchmarks.common import WORKLOADS
import fastsim
shift = bytearray({shift})   # (held: the C heap's later blocks land elsewhere)
sc = WORKLOADS[{workload!r}]({requests})
fastsim.replicate(sc, n_replications=4, seed=0, n_threads=1)
best = 0.0
for k in range(6):
    t = time.process_time()
    fastsim.replicate(sc, n_replications={replications}, seed=0, n_threads=1)
    best = max(best, {replications} * sc.workload.num_requests / (time.process_time() - t))
print(best)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+", help="checkouts with fastsim/ (today's API)")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--workload", default="reference", choices=("reference", "sharegpt"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--replications", type=int, default=60)
    ap.add_argument("--shift", type=int, default=1000, help="bytes held before the run, times the process's index")
    args = ap.parse_args()
    bench = os.path.dirname(os.path.abspath(__file__))
    speeds = {tree: [] for tree in args.trees}
    for k in range(args.processes):
        code = _CHILD.format(bench=bench, workload=args.workload, requests=args.requests,
                             replications=args.replications, shift=k * args.shift)
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(code)
        program = ["-c", code] if k % 2 == 0 else [f.name]
        try:
            for tree in args.trees:
                env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
                out = subprocess.run([sys.executable, *program], env=env, capture_output=True, text=True,
                                     check=True)
                speeds[tree].append(float(out.stdout.split()[-1]) / 1e6)
        finally:
            os.unlink(f.name)
    for tree, s in speeds.items():
        print(f"{tree}: {args.workload}, M requests/s by process (-c, file, -c, ...): "
              + " ".join(f"{x:.2f}" for x in s) + f" (median {sorted(s)[len(s) // 2]:.2f})")


if __name__ == "__main__":
    main()
