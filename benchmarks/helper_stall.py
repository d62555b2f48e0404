"""Cold start with the compile helper stalled (issue 43, item 4).

Runs ``fastsim.compile_kernels("common")`` in a fresh process with an empty
temporary ``NUMBA_CACHE_DIR``, and (``--stall``) SIGSTOPs the compile helper
as soon as it appears, so that it stays alive but silent. Prints the wall
time of the cold start and the warnings it gave. Run with ``PYTHONPATH``
pointing at the checkout to measure::

    python benchmarks/helper_stall.py            # a normal cold start
    python benchmarks/helper_stall.py --stall    # the helper stalled

Linux only (reads /proc to find the helper).
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, signal, threading, time, warnings
warnings.simplefilter("always")
stall = {stall}

def stopper():
    me = str(os.getpid())
    while True:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{{pid}}/stat") as f:
                    ppid = f.read().rsplit(")", 1)[1].split()[1]
            except OSError:
                continue
            if ppid == me:
                os.kill(int(pid), signal.SIGSTOP)
                print("stopped helper", pid, flush=True)
                return
        time.sleep(0.01)

if stall:
    threading.Thread(target=stopper, daemon=True).start()
import fastsim
start = time.perf_counter()
fastsim.compile_kernels("common")
print(f"cold start {{time.perf_counter() - start:.1f}} s", flush=True)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stall", action="store_true", help="SIGSTOP the compile helper when it starts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD.format(stall=args.stall)], env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - start
    print(proc.stdout.strip())
    warned = [line for line in proc.stderr.splitlines() if "Warning" in line]
    print("\n".join(warned) if warned else "(no warning)")
    print(f"process wall time {wall:.1f} s, exit code {proc.returncode}")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
