"""Peak memory of large runs (issue 43, "Scale").

Each case runs in a fresh process and prints its wall time, its peak RSS
(``resource.getrusage``'s ``ru_maxrss``, compilation or cache loading
included), fastsim's memory estimate for it (`fastsim._memory.estimate`)
and a result check::

    python benchmarks/scale_memory.py long      # 1 replication of 10**7 requests
    python benchmarks/scale_memory.py many      # 10**6 replications of 1,000 requests
    python benchmarks/scale_memory.py many --replications 100000   # a shorter version

Both on 2 threads (``--threads``), the default scenario's engine and
latency model at 2 requests/s (the README's reference workload).
``replicate`` takes 2 replications at least, so ``long`` holds two
replications of 10**7 requests at once, one a thread. The figures, and what
holds the memory, are in ``benchmarks/HISTORY.md`` ("Hardening").
"""

import argparse
import subprocess
import sys

CHILD = r"""
import resource, time
import fastsim
from fastsim import _memory
case, nrep, threads = {case!r}, {nrep}, {threads}
n = 10 ** 7 if case == "long" else 1000
sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=n))
est = sum(b for b, _, _ in _memory.estimate(sc, nrep, threads))
start = time.perf_counter()
res = fastsim.replicate(sc, nrep, seed=1, n_threads=threads, progress=False)
wall = time.perf_counter() - start
pr = res.per_replication
assert (pr["n_arrived"] == pr["n_completed"] + pr["n_rejected"] + pr["n_dropped"] + pr["n_unfinished"]).all()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(f"{{case}}: {{nrep}} replications x {{n}} requests on {{threads}} threads: {{wall:.1f}} s, "
      f"peak RSS {{peak / 2**30:.2f}} GiB, estimate {{est / 2**30:.2f}} GiB, "
      f"ttft_mean {{res.estimate('ttft_mean'):.5g}} s, {{int(pr['n_arrived'].sum())}} requests")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=["long", "many"])
    ap.add_argument("--replications", type=int, default=None, help="default: 2 (long), 10**6 (many)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    nrep = args.replications or (2 if args.case == "long" else 10 ** 6)
    proc = subprocess.run([sys.executable, "-c", CHILD.format(case=args.case, nrep=nrep, threads=args.threads)],
                          capture_output=True, text=True)
    print(proc.stdout.strip() or proc.stderr[-3000:])
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
