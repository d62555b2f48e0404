"""Where a cold start's compile time goes (a script, not a test).

    python benchmarks/compile_profile.py [--top 12] [--full] [--callees]

Compiles the kernels behind ``replicate`` into an empty Numba cache, in one
thread and one process (no compile helper; for the issue-7 workload: the common engine; ``--full``: the same
with prefix caching, the engine with every option), and prints

* each compiled function's own compile time (exclusive of the functions it
  calls, which compile while it is type-inferred), from Numba's compile
  events (``numba.core.event``), and the functions compiled for more than
  one signature (argument types), each of which is compiled on its own;
* the time of each compiler pass summed over all functions, from each
  compile result's ``pipeline_times``: ``native_lowering`` is Numba's
  lowering plus LLVM's optimisation and machine-code generation,
  ``nopython_type_inference`` its own share (without the callees that
  compile while a function is typed);
* LLVM's share of each of the costliest functions (``NUMBA_LLVM_PASS_TIMINGS``):
  function passes, module passes (the whole module, with every function it
  links in) and code generation.

With ``--callees`` it does what a cold start's helper process does first
instead: it compiles the internal functions the engine calls
(`kernel.callees.TABLE`), in order, into the disk cache, and prints the
time each took (with the functions it calls that were not compiled yet),
their total and LLVM's share: the helper must be done with them about when
the engine's compilation asks for them (``cold_trace.py`` shows when it does).

``startup_memory.py`` gives the end-to-end cold and warm start figures.
"""

import argparse
import collections
import os
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=12, help="functions to list")
    ap.add_argument("--full", action="store_true", help="compile the engine with every option")
    ap.add_argument("--callees", action="store_true", help="compile the engine's callees only, as the helper does")
    args = ap.parse_args()
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastsim_compile_")   # before numba is imported
    os.environ["FASTSIM_COMPILE_HELPER"] = "0"   # every function compiled (and timed) in this process
    os.environ["NUMBA_LLVM_PASS_TIMINGS"] = "1"
    if args.callees:
        return callees(args.full)
    from numba.core import event

    stack, own, signatures = [], collections.Counter(), collections.defaultdict(list)

    class Timer(event.Listener):
        def on_start(self, ev):
            name = ev.data["dispatcher"].py_func.__name__
            signatures[name].append(ev.data["args"])
            stack.append([name, time.perf_counter(), 0.0])

        def on_end(self, ev):
            name, t0, inner = stack.pop()
            dt = time.perf_counter() - t0
            own[name] += dt - inner
            if stack:
                stack[-1][2] += dt

    event.register("numba:compile", Timer())
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fastsim
    from fastsim import kernel
    from benchmarks.common import full_engine_workload, reference_workload

    t = time.perf_counter()
    workload = full_engine_workload if args.full else reference_workload
    fastsim.replicate(workload(20), n_replications=2, seed=0, n_threads=1, progress=False)
    total = time.perf_counter() - t
    print(f"cold replicate: {total:.1f} s, {len(own)} functions compiled, "
          f"{sum(own.values()):.1f} s of it compiling")
    print("own compile time (s):")
    for name, s in own.most_common(args.top):
        print(f"  {name:28s} {s:6.2f}")
    rest = sum(own.values()) - sum(s for _, s in own.most_common(args.top))
    print(f"  {'(the other functions)':28s} {rest:6.2f}")
    # each signature of a function is typed, lowered and optimised on its own
    several = {name: sigs for name, sigs in signatures.items() if len(sigs) > 1}
    print(f"signatures compiled: {sum(map(len, signatures.values()))} for {len(signatures)} functions; "
          f"{len(several)} compiled for more than one:")
    for name, sigs in sorted(several.items(), key=lambda item: -own[item[0]]):
        print(f"  {name:28s} x{len(sigs)} ({own[name]:.2f} s): " + "; ".join(str(a) for a in sigs[:3]))
    passes = collections.Counter()
    for obj in kernel.namespace().values():
        for cres in getattr(obj, "overloads", {}).values():
            for key, timing in cres.metadata.get("pipeline_times", {}).get("nopython", {}).items():
                passes[key.split("_", 1)[1]] += timing.run
    # type inference's time includes the callees compiled during it: its own
    # share is what the other passes leave of the functions' own times
    typing = sum(own.values()) - sum(s for name, s in passes.items() if name != "nopython_type_inference")
    passes["nopython_type_inference"] = typing
    print("compiler passes, summed over all functions (s):")
    for name, s in passes.most_common(8):
        print(f"  {name:40s} {s:6.2f}")
    print("LLVM, by library (s): function passes, module passes, code generation")
    shown = [name for name, _ in own.most_common(4)]
    for name in shown + [n for n in ("_run_chunk",) if n not in shown]:   # and the driver (see its comment)
        for cres in getattr(kernel.namespace().get(name), "overloads", {}).values():
            llvm = collections.Counter()
            for key, timing in cres.library.recorded_timings:
                kind = ("function" if key.startswith("Function passes") else
                        "module" if key.startswith("Module passes") else "codegen")
                llvm[kind] += timing.get_total_time()
            print(f"  {name:28s} {llvm['function']:6.2f} {llvm['module']:6.2f} {llvm['codegen']:6.2f}")


def callees(full):
    """Compile the engine's callees in the helper's order, saving them as the helper does."""
    from fastsim import kernel

    t0 = time.perf_counter()
    jobs = kernel.drivers._callee_types(1 if full else None)
    for dispatcher, argtypes in jobs:
        dispatcher._cache.saving.add(tuple(argtypes))
    print(f"{len(jobs)} callees of the {'full' if full else 'common'} engine "
          f"(seconds each, with what it calls that was not compiled yet):")
    for dispatcher, argtypes in jobs:
        t = time.perf_counter()
        dispatcher.compile(argtypes)
        print(f"  {dispatcher.py_func.__name__:28s} {time.perf_counter() - t:6.3f}")
    total = time.perf_counter() - t0
    llvm = sum(timing.get_total_time() for dispatcher in {d for d, _ in jobs}
               for cres in dispatcher.overloads.values() for _, timing in cres.library.recorded_timings)
    print(f"all callees: {total:.2f} s, of which LLVM {llvm:.2f} s in their own libraries "
          f"(the first one's time includes setting up Numba's target)")


if __name__ == "__main__":
    main()
