"""The one place where fastsim's Numba options live.

``cache=True`` stores compiled kernels on disk (``NUMBA_CACHE_DIR`` selects
where), so only the first run on a machine pays for compilation.
``error_model="numpy"`` lets division by zero give inf/nan instead of raising
(and keeps loops vectorisable); the kernels never rely on either.
``fastmath`` stays off: it would let LLVM reorder floating-point sums, and
results must be bit-identical whatever the thread count.

One specialisation per function. When jitted code calls a jitted function
with a constant argument (a stream id, a flag, a counter that starts at 0),
Numba types that argument as a literal and compiles a separate version of
the callee for each constant: the kernel had 60 such versions, about a
quarter of its cold compile time. :func:`njit` makes calls from jitted code
type their arguments by value type (``int64``, not ``Literal[int](0)``), so
each function compiles once. (Nothing in the kernels needs a literal.)

No reference counting in the engine. :func:`njit_noalloc` compiles a function
without Numba's runtime (NRT): passing, slicing and returning arrays then
costs no atomic reference-count updates. Such a function cannot allocate an
array, and need not: the engine works in a workspace that its caller
allocated and keeps alive (``fastsim/_kernel.py``), as the CUDA target
requires anyway. The update calls had been most of the cost of an engine
step with events (about 40 per step).

No Python entry for internal functions. Numba gives every compiled function
a CPython wrapper, a C wrapper and a disk-cache entry, although only the
few functions that Python calls (``entry=True``) need them: the code of the
others is linked into, and cached with, their jitted callers. For the
kernel's 60 internal functions these were about 2 s (9%) of a cold start.

Inlining by measurement. LLVM leaves a few helpers out of line in the
60 KB engine loop, where a call passes each array argument as seven words.
``njit_noalloc(inline="numba")`` has Numba inline a function's IR into its
callers (before typing); ``inline="llvm"`` marks it ``alwaysinline`` for
LLVM (Numba's ``forceinline``), which costs less compile time for a
function with several call sites. Which helpers pay, and which way, depends
on code layout, so each is A/B measured (``benchmarks/ab_interleaved.py``).

Calls through a pointer where linking costs more than it gives. When a
jitted function calls another, Numba links the callee's LLVM module into
the caller's, and LLVM optimises and generates code for all of it again.
`function_pointer` hands a compiled entry to a jitted caller as a
first-class function instead, called through its address: the driver that
loops over replications no longer compiles a second copy of the engine
(its LLVM time went from 3.8 to 0.4 s).

Two processes for a cold start. Numba compiles one function at a time (a
global lock), so a cold start is serial: the engine, then the workload
drawing and the reduction. `compile_entries` compiles the costliest entry
here and, at the same time, the others in a helper process that writes them
to Numba's disk cache, from which this process then loads them. It does so
only when the costliest entry is in neither memory nor the disk cache and a
second CPU is free; ``FASTSIM_COMPILE_HELPER=0`` turns it off. If the helper
fails, this process compiles what it left.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import threading
import time

import numba
from numba.core.registry import CPUDispatcher
from numba.core.types import WrapperAddressProtocol

NUMBA_OPTIONS = {"cache": True, "error_model": "numpy", "nogil": True}


def _one_specialisation(dispatcher):
    """Type calls to ``dispatcher`` from jitted code with non-literal argument types."""
    from numba.core.types import unliteral

    resolve = dispatcher.get_call_template

    def get_call_template(args, kws):
        return resolve(tuple(unliteral(a) for a in args), {k: unliteral(v) for k, v in kws.items()})

    dispatcher.get_call_template = get_call_template
    return dispatcher


class _InternalDispatcher(CPUDispatcher):
    """A dispatcher compiled without a Python entry: calling it from Python
    would jump to a wrapper that does not exist."""

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.py_func.__module__}.{self.py_func.__name__} is compiled for jitted callers only "
                        f"(no Python entry); call it from jitted code, or compile one with python_entry()")


def njit_noalloc(func=None, *, entry=False, inline=None):
    """:func:`njit` without Numba's runtime, for functions that allocate no array.

    By default the function is *internal*: only jitted code calls it, so it
    gets no Python entry (no CPython or C wrapper) and no disk-cache entry
    of its own (its code is compiled into the cached functions that call
    it); calling it from Python raises TypeError. ``entry=True``: also
    called from Python (cached, with its wrappers). ``inline``, for the few
    hot calls that LLVM leaves out of line in the engine loop (which then
    passes every array argument as seven words): ``"numba"`` inlines the
    function's IR into its callers (Numba's ``inline="always"``), ``"llvm"``
    has LLVM inline it (``forceinline``: the ``alwaysinline`` attribute).
    Measure before adding one: inlining the wrong ones slowed the engine down.
    """
    if func is None:
        return lambda f: njit_noalloc(f, entry=entry, inline=inline)
    if inline not in (None, "numba", "llvm"):
        raise ValueError(f"{func.__name__}: inline must be None, 'numba' or 'llvm', got {inline!r}")
    if entry and inline:
        raise ValueError(f"{func.__name__}: an entry (called from Python) cannot be inlined into its callers")
    if entry:
        return njit(func, _nrt=False)
    dispatcher = njit(func, _nrt=False, cache=False, no_cpython_wrapper=True, no_cfunc_wrapper=True,
                      inline="always" if inline == "numba" else "never", forceinline=inline == "llvm")
    dispatcher.__class__ = _InternalDispatcher   # a clear error, not a crash, when Python calls it
    return dispatcher


def python_entry(dispatcher):
    """A Python-callable compilation of an internal :func:`njit_noalloc`
    function, for tests and benchmarks that call kernel internals directly
    (not cached: the cache would not see the kernel's file change)."""
    return njit(dispatcher.py_func, _nrt=False, cache=False)


def njit(*args, **kwargs):
    """``numba.njit`` with fastsim's options (keyword arguments override)."""
    options = {**NUMBA_OPTIONS, **kwargs}
    if args and callable(args[0]):
        return _one_specialisation(numba.njit(**options)(args[0]))
    decorator = numba.njit(*args, **options)
    return lambda func: _one_specialisation(decorator(func))



class _FunctionPointer(WrapperAddressProtocol):
    """One compiled version of an entry, typed by Numba as a first-class
    function (the *wrapper address protocol*): jitted code calls it through
    its C wrapper's address."""

    def __init__(self, dispatcher, argtypes):
        dispatcher.compile(argtypes)   # loaded from Numba's cache when it is there
        self._cres = dispatcher.overloads[argtypes]

    def signature(self):
        return self._cres.signature

    def __wrapper_address__(self):
        return self._cres.library.get_pointer_to_function(self._cres.fndesc.llvm_cfunc_wrapper_name)


def function_pointer(dispatcher, argtypes):
    """Entry ``dispatcher`` compiled for ``argtypes`` (Numba types), as an
    argument for jitted code: a call through it jumps to that compiled code
    instead of linking it into the caller (which LLVM would then optimise
    and generate code for again). A caller compiles once per signature of
    the pointers it takes, so build them for fixed types."""
    if not isinstance(dispatcher, CPUDispatcher) or isinstance(dispatcher, _InternalDispatcher):
        raise TypeError(f"function_pointer needs an entry (njit or njit_noalloc(entry=True)), got {dispatcher!r}")
    return _FunctionPointer(dispatcher, tuple(argtypes))


#: `compile_entries` waits for its helper as long as its own compilation took
#: (the helper has the smaller share), and at least this long (seconds: the
#: helper's start-up), before it stops the helper and compiles the rest itself.
HELPER_GRACE_S = 10.0

_compile_lock = threading.Lock()


def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def _in_disk_cache(dispatcher, argtypes):
    """Whether Numba's disk cache holds ``dispatcher`` compiled for ``argtypes``
    (Numba's own lookup, as in ``Dispatcher.compile``; False when unsure)."""
    try:
        return dispatcher._cache.load_overload(argtypes, dispatcher.targetctx) is not None
    except Exception:
        return False


def _start_helper(entries):
    """A process that compiles ``entries`` into Numba's disk cache (the same
    modules: this process's ``sys.path``; the same cache: its ``NUMBA_CACHE_DIR``);
    None if it cannot be started."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    if numba.config.CACHE_DIR:
        env["NUMBA_CACHE_DIR"] = numba.config.CACHE_DIR
    jobs = [(d.py_func.__module__, d.py_func.__name__, argtypes) for d, argtypes in entries]
    try:
        proc = subprocess.Popen([sys.executable, "-c", f"from {__name__} import _helper_main; _helper_main()"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env)
    except OSError:   # no interpreter to start (an embedded Python): this process compiles everything
        return None
    try:
        proc.stdin.write(pickle.dumps(jobs))
        proc.stdin.close()
    except OSError:   # the helper died at once; this process compiles everything
        pass
    return proc


def _helper_main():
    """The helper process: compile each (module, function, argument types) read from stdin."""
    for module, name, argtypes in pickle.loads(sys.stdin.buffer.read()):
        getattr(importlib.import_module(module), name).compile(argtypes)


def compile_entries(entries):
    """Compile entries ``[(dispatcher, argtypes), ...]``, the costliest first.

    When the first is in neither this process nor Numba's disk cache (a cold
    start), at least two CPUs are usable and ``FASTSIM_COMPILE_HELPER`` is
    not ``"0"``, a helper process compiles the others into the disk cache
    while this process compiles the first; this process then loads them from
    the cache (or compiles whatever the helper did not finish). The compiled
    code is the same either way.
    """
    entries = [(d, tuple(argtypes)) for d, argtypes in entries]
    with _compile_lock:   # threads of one run: one of them compiles, the others then find it done
        (first, first_types), rest = entries[0], entries[1:]
        rest = [(d, a) for d, a in rest if a not in d.overloads]
        helper = None
        if (rest and first_types not in first.overloads and os.environ.get("FASTSIM_COMPILE_HELPER", "1") != "0"
                and _usable_cpus() >= 2 and not _in_disk_cache(first, first_types)):
            helper = _start_helper(rest)
        start = time.perf_counter()
        try:
            first.compile(first_types)
        except BaseException:
            if helper is not None:
                helper.kill()
                helper.wait()
            raise
        if helper is not None:
            try:
                helper.wait(max(HELPER_GRACE_S, time.perf_counter() - start))
            except subprocess.TimeoutExpired:   # safe: Numba replaces each cache file atomically
                helper.kill()
                helper.wait()
        for d, argtypes in rest:
            d.compile(argtypes)
