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
allocated and keeps alive (``fastsim/kernel/workspace.py``), as the CUDA target
requires anyway. The update calls had been most of the cost of an engine
step with events (about 40 per step).

No Python entry for internal functions. Numba gives every compiled function
a CPython wrapper and a C wrapper, although only the few functions that
Python calls (``entry=True``) need them: the code of the others is linked
into, and cached with, their jitted callers. For the kernel's many
internal functions these (with their disk-cache entries) were a noticeable
share of a cold start. Internal functions are read from the disk cache, but written
there only by a cold start's helper process (below).

Inlining by measurement. LLVM leaves a few helpers out of line in the
60 KB engine loop, where a call passes each array argument as seven words.
``njit_noalloc(inline="llvm")`` marks such a helper ``alwaysinline`` for
LLVM (Numba's ``forceinline``). Which helpers pay depends on code layout, so
each is A/B measured (``benchmarks/ab_interleaved.py``). Numba's own IR
inlining (``inline="always"``) is not offered: it types and lowers the
helper again at every call site, which cost much compile time for no speed
that LLVM's inlining does not give as well (`benchmarks/HISTORY.md`).
``inline="never"`` keeps a function out of line (``noinline``); an entry's
module makes such functions internal before its module passes
(`_EntryLibrary`), so that LLVM may call them by its own convention and
drop the arguments they do not read.

Internal functions are linked, not built. Numba builds every compiled
function as a library of its own: LLVM optimises it with everything it
links in, at the full level, then generates its machine code, although an
internal function's code only ever runs linked into (and optimised again
in) the entries that call it. An internal function is therefore a
*link-only* library (`_LinkOnlyLibrary`): its LLVM IR after Numba's
function passes, linked with its callees' and nothing more; the entry that
links it in optimises the whole once and generates its code. The helper
process saves them so, as that IR (`_InternalCacheImpl`), so the engine is
the same machine code whether a cold start had a helper or not. Only the
debug mode builds them in full.

Typing without repeated work. Numba types a call of a function it
implements (an array's ``getitem``, ``min``, ...) by trying that function's
templates in turn, every time it meets the call; on a cold start most of
these are repeats of one already typed (`benchmarks/HISTORY.md`). While one of
fastsim's functions compiles (`_FastsimCompiler`, every fastsim dispatcher's
pipeline), `_typing_memo` returns the signature found the first time, keyed
by everything the result depends on. Two costs of Numba's that grow with the
number of typed operations are taken out as well (`_quicker_typing`): the
compiler flags' values and hash, built through a property per option, and
the highlighting of error messages (almost all of them for candidates that
do not match, and discarded). The compiled code is the same. The first two
are installed in the whole process at import (value-preserving: Numba's own
values and an equal hash; outside fastsim's compilations the memo passes
every call through); the highlighting is off only while fastsim's functions
compile.

Calls through a pointer where linking costs more than it gives. When a
jitted function calls another, Numba links the callee's LLVM module into
the caller's, and LLVM optimises and generates code for all of it again.
`function_pointer` hands a compiled entry to a jitted caller as a
first-class function instead, called through its address: the driver that
loops over replications does not compile a second copy of the engine.

A debug mode with bounds checks. ``FASTSIM_KERNEL_DEBUG=1`` compiles every
function with Numba's bounds checks, cached apart, and runs the replications
through a path on which the resulting IndexError reaches the caller
(`KERNEL_DEBUG`; ``docs/testing.md``).

Two processes for a cold start. Numba compiles one function at a time (a
global lock), so a cold start is serial: the engine, then the workload
drawing, the reduction and the driver. `compile_entries` compiles the costliest entry
here and, at the same time, the others in a helper process that writes them
to Numba's disk cache, from which this process then loads them. The
helper first compiles the internal functions the engine's phases call
and two of its late phases (`kernel.callees.TABLE`, `callees.HELPER_PHASES`),
which the engine's compilation then loads as
it asks for them, waiting for the helper where it must; at the end, this
process takes the jobs the helper has not begun, from the last back (a
process claims a job by creating a file). It does so only when the
costliest entry is in neither memory nor the disk cache and two CPUs are
usable; ``FASTSIM_COMPILE_HELPER=0`` turns it off. If the helper fails or
is stopped, this process compiles what it left.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
import time
import types
import warnings

import numba
from llvmlite import binding as llvm
from numba.core import sigutils
from numba.core.caching import CompileResultCacheImpl, FunctionCache, IndexDataCacheFile
from numba.core.codegen import JITCodeLibrary
from numba.core.compiler import CompileResult, Compiler
from numba.core.compiler_lock import require_global_compiler_lock
from numba.core.registry import CPUDispatcher
from numba.core.types import FunctionType, WrapperAddressProtocol
from numba.extending import typeof_impl

#: The environment variable that turns on the kernel's debug mode (`KERNEL_DEBUG`).
KERNEL_DEBUG_ENV = "FASTSIM_KERNEL_DEBUG"


def _kernel_debug():
    value = os.environ.get(KERNEL_DEBUG_ENV, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


#: The kernel's debug mode (``FASTSIM_KERNEL_DEBUG=1``, read once, at import):
#: every function is compiled with Numba's bounds checks, so an index out of
#: an array's bounds raises IndexError instead of reading or writing past it.
#: An exception cannot cross a function pointer's C wrapper (`_FunctionPointer`),
#: so in this mode the replications' driver runs as Python and calls the
#: compiled entries through their Python wrappers (`kernel.drivers.chunk_runner`),
#: which pass it on (`debug_error` names it). Its compiled code is cached apart
#: from the ordinary code: under other file names (`DEBUG_CACHE_PREFIX`), and,
#: for the kernel, under a source stamp that names the mode (Numba's cache key
#: holds no compiler flag). The results are the same bits; the engine is
#: slower (the bounds checks, and one Python call per replication).
KERNEL_DEBUG = _kernel_debug()

#: The prefix of the debug mode's cache file names.
DEBUG_CACHE_PREFIX = "boundscheck-"


def _quicker_typing():
    """Take three costs out of Numba's typing that grow with the number of
    typed operations, not with anything the kernel needs (idempotent; the
    compiled code is the same).

    * Compiler flags compared and hashed option by option. Typing an
      operation that an ``@overload`` implements looks the implementation
      up in a cache keyed by the current compiler flags
      (``templates._get_impl``): each lookup hashes the flags and compares
      them, and `TargetConfig` builds the dict of every option's value
      through a property per option for each (many lookups on a cold
      start). Here that dict is the class's defaults
      updated with the options set, the same dict; the hash, which depends
      only on the option names (``hash(tuple(sorted(self.values())))``
      sorts the dict's keys), is computed from the names.
    * Highlighted messages for failed overload candidates. Typing tries
      candidates that do not match, and each failure's message is
      highlighted (colorama set up and torn down around every string)
      although almost all are discarded. While fastsim's own functions
      compile, Numba's error messages are written without highlighting
      (`_plain_error_messages`, as ``NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING=1``
      has Numba do); a user's own jitted code keeps them as they are.
    * The same call typed again and again. Numba types a call of a
      function it implements (``operator.getitem`` of an array by an
      integer, ``min`` of two integers, ...) by trying the function's
      templates one by one, each time it meets one (most of a cold start's
      calls are repeats): `_typing_memo`.
    """
    from numba.core import targetconfig
    from numba.core.types import functions

    config = targetconfig.TargetConfig
    if not getattr(config, "_fastsim_quick", False):
        defaults = {}

        def values(self):
            kind = type(self)
            base = defaults.get(kind)
            if base is None:
                base = defaults[kind] = {name: option.default for name, option in kind.options.items()}
            out = dict(base)
            out.update((name, value) for name, value in self._values.items() if name in base)
            return out

        hashes = {}

        def hash_(self):
            kind = type(self)
            h = hashes.get(kind)
            if h is None:
                h = hashes[kind] = hash(tuple(sorted(kind.options)))
            return h

        config.values, config.__hash__, config._fastsim_quick = values, hash_, True
    if not getattr(functions.BaseFunction.get_call_type, "_fastsim_memo", False):
        functions.BaseFunction.get_call_type = _typing_memo(functions.BaseFunction.get_call_type)


#: The methods of Numba's highlighting colour scheme (`_plain_error_messages`).
_HIGHLIGHTS = ("code", "errmsg", "filename", "indicate", "highlight", "reset")


def _unmarked(msg):
    return msg


def _plain_error_messages():
    """Numba's error messages without highlighting from now until
    `_restore_error_messages` (its colour scheme's methods shadowed by the
    identity, as ``NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING=1`` has it);
    what to restore. Only while fastsim's own functions compile
    (`_FastsimCompiler`): a user's own jitted code keeps Numba's messages."""
    from numba.core import errors

    scheme = errors.termcolor()
    if type(scheme).__name__ != "HighlightColorScheme":   # (no colorama, or highlighting off)
        return None
    saved = {name: scheme.__dict__[name] for name in _HIGHLIGHTS if name in scheme.__dict__}
    for name in _HIGHLIGHTS:
        setattr(scheme, name, _unmarked)
    return scheme, saved


def _restore_error_messages(plain):
    """Undo `_plain_error_messages` (``plain``: what it returned)."""
    if plain is None:
        return
    scheme, saved = plain
    for name in _HIGHLIGHTS:
        if name in saved:
            setattr(scheme, name, saved[name])
        else:
            scheme.__dict__.pop(name, None)


#: How many compilations of fastsim's own functions (`_FastsimCompiler`)
#: are under way in this thread: `_typing_memo` serves only them.
_fastsim_compiling = threading.local()


def _typing_memo(get_call_type):
    """Numba's ``BaseFunction.get_call_type`` (type a call of a function
    Numba implements, by its templates), remembered, while one of fastsim's
    own functions compiles (`_FastsimCompiler`): a call typed before returns
    the signature found then. The key is what the result depends on: the
    function (its key holds its templates), the typing context, the argument types (literal ones included), the compiler flags
    in force (as Numba's own cache of ``@overload`` implementations keys
    them) and the target. Only successes are kept (a failure raises, with
    its message). The implementation key that lowering looks the call up
    by is recorded with the signature and set again on each hit. Other
    code in the process (the user's own jitted functions) is typed as
    Numba types it, unless it is compiled from inside one of fastsim's
    compilations (the count is per thread). The memo keeps its keys (types,
    contexts, flags) for the life of the process."""
    from numba.core.target_extension import get_local_target
    from numba.core.targetconfig import ConfigStack

    memo = {}

    def remembered(self, context, args, kws):
        if not getattr(_fastsim_compiling, "depth", 0):
            return get_call_type(self, context, args, kws)
        try:
            key = (self, context, tuple(args), tuple(kws.items()), ConfigStack.top_or_none(),
                   get_local_target(context))
            hit = memo.get(key)
        except TypeError:   # (an unhashable type: typed as Numba types it)
            return get_call_type(self, context, args, kws)
        if hit is not None:
            sig, impl = hit
            self._impl_keys[sig.args] = impl
            return sig
        sig = get_call_type(self, context, args, kws)
        if sig is not None:
            memo[key] = sig, self._impl_keys[sig.args]
        return sig

    remembered._fastsim_memo = True
    remembered.__wrapped__ = get_call_type
    return remembered


# Numba's per-process version in a mangled name (``...B3v54B...``).
_VERSION = re.compile(r"B\d+v\d+B")


class _EntryLibrary(JITCodeLibrary):
    """An entry's code library (one that Python or another entry calls), in
    which the functions kept out of line (``noinline``: `_OutOfLine`) that
    it links in are made internal before its module passes. Nothing outside
    the module calls its copies of them (each entry links its own), and
    LLVM's interprocedural passes may then drop their unused arguments and
    call them by its fast convention. (Made internal, every linked function
    would be: LLVM then inlined much more, and the engine ran 17 % slower.)"""

    def add_llvm_module(self, ll_module):
        # (the entry's own functions and wrappers: they stay as Numba made them)
        self.__dict__.setdefault("_own", set()).update(fn.name for fn in ll_module.functions
                                                       if not fn.is_declaration)
        super().add_llvm_module(ll_module)

    def _optimize_final_module(self):
        own = self.__dict__.get("_own", ())
        # The JIT resolves a name across the modules it has loaded, internal ones included: a later
        # module's linked copy of the function (``linkonce_odr``, Numba's convention) would be bound to
        # this module's internal one, whose arguments LLVM may have changed. So the internal copies get
        # names of their own, the same in every build of this entry (Numba's version numbers left out).
        tag = hashlib.sha1("".join(sorted(_VERSION.sub("B", name) for name in own)).encode()).hexdigest()[:16]
        for fn in self._final_module.functions:
            if not fn.is_declaration and fn.name not in own and b"noinline" in set(fn.attributes):
                fn.linkage = "internal"
                fn.name = f"{fn.name}.in.{tag}"
        super()._optimize_final_module()


class _FastsimCompiler(Compiler):
    """Numba's compiler for fastsim's functions (entries and internal ones):
    while it runs, `_typing_memo` serves the typing and Numba's error
    messages are not highlighted (`_plain_error_messages`); an entry's
    library is an `_EntryLibrary` (outside the debug mode)."""

    def compile_extra(self, func):
        if self.state.library is None and not KERNEL_DEBUG:   # (an entry: internal functions set theirs)
            library = self.state.targetctx.codegen().create_library(func.__qualname__)
            library.__class__ = _EntryLibrary
            library.enable_object_caching()   # (as Numba's lowering does for the library it makes)
            self.state.library = library
        depth = getattr(_fastsim_compiling, "depth", 0)
        _fastsim_compiling.depth = depth + 1
        plain = _plain_error_messages() if depth == 0 else None
        try:
            return super().compile_extra(func)
        finally:
            _fastsim_compiling.depth = depth
            _restore_error_messages(plain)


_quicker_typing()

NUMBA_OPTIONS = {"cache": True, "error_model": "numpy", "nogil": True, "pipeline_class": _FastsimCompiler}
if KERNEL_DEBUG:
    NUMBA_OPTIONS["boundscheck"] = True


@contextlib.contextmanager
def debug_errors(where):
    """In debug mode, turn an IndexError raised by a kernel entry called in
    the block into one that says what it is (`debug_error`); ``where``
    describes the call. (Outside it, the block runs as it is.)"""
    try:
        yield
    except IndexError as exc:
        if not KERNEL_DEBUG:
            raise
        raise debug_error(exc, where) from exc


def debug_error(exc, where):
    """The IndexError to raise for ``exc``, an IndexError that a kernel entry
    compiled in debug mode raised in ``where`` (a description of the call):
    Numba's own message says neither where nor why."""
    return IndexError(f"fastsim's kernel read or wrote an array out of its bounds in {where} "
                      f"({type(exc).__name__}: {exc}; caught by the debug mode, {KERNEL_DEBUG_ENV}=1). "
                      f"This is a bug in fastsim (or a workspace too small for its stream, if a kernel "
                      f"entry was called directly): please report it with the scenario")

#: The package whose functions are cached under `kernel_source_stamp`.
KERNEL_PACKAGE = f"{__package__}.kernel"


@functools.lru_cache(maxsize=None)
def kernel_source_stamp():
    """A stamp over every source file of the kernel package (and of this
    module, whose options shape the compiled code): their names and
    contents, hashed.

    Numba's disk cache stamps an entry with its own source file's time and
    size only, so an entry whose function calls, inlines or reads a
    constant of another module would be served stale after an edit of that
    module. Every function of the kernel package is cached under this stamp
    instead (`_stamp`): an edit of any kernel file drops every cached
    kernel function. (Contents, not times: a checkout that touches the
    files without changing them keeps the cache.)"""
    root = os.path.dirname(os.path.abspath(__file__))
    folder = os.path.join(root, "kernel")
    paths = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py"))
    digest = hashlib.sha256()
    for path in paths + [os.path.abspath(__file__)]:
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    # the mode too: Numba's cache key does not hold the bounds-check flag
    return ("fastsim-kernel-sources", digest.hexdigest(), "boundscheck" if KERNEL_DEBUG else "")


def _stamp(dispatcher):
    """Cache ``dispatcher`` under `kernel_source_stamp` if its function is
    the kernel package's (Numba's own stamp otherwise); in debug mode, under
    file names of its own (`_debug_names`)."""
    cache = getattr(dispatcher, "_cache", None)
    _debug_names(cache)
    module = getattr(dispatcher.py_func, "__module__", "") or ""
    if cache is not None and hasattr(cache, "_cache_file") and (
            module == KERNEL_PACKAGE or module.startswith(KERNEL_PACKAGE + ".")):
        cache._cache_file._source_stamp = kernel_source_stamp()
    return dispatcher


def _debug_names(cache):
    """In debug mode, give ``cache``'s index and data files names of their
    own (`DEBUG_CACHE_PREFIX`), so that the two modes do not overwrite each
    other's entries (the stamp alone would keep them correct, but each mode
    would drop the other's entries at every switch). Idempotent."""
    cache_file = getattr(cache, "_cache_file", None)
    if not KERNEL_DEBUG or cache_file is None or cache_file._index_name.startswith(DEBUG_CACHE_PREFIX):
        return
    cache_file._index_name = DEBUG_CACHE_PREFIX + cache_file._index_name
    cache_file._index_path = os.path.join(cache_file._cache_path, cache_file._index_name)
    cache_file._data_name_pattern = DEBUG_CACHE_PREFIX + cache_file._data_name_pattern


def _one_specialisation(dispatcher):
    """Type calls to ``dispatcher`` from jitted code with non-literal argument types."""
    from numba.core.types import unliteral

    resolve = dispatcher.get_call_template

    def get_call_template(args, kws):
        return resolve(tuple(unliteral(a) for a in args), {k: unliteral(v) for k, v in kws.items()})

    dispatcher.get_call_template = get_call_template
    return dispatcher


#: The serialisation kind of a link-only library in Numba's disk cache (its
#: IR for linking; Numba's own kinds are "object" and "bitcode").
_LINK_ONLY_KIND = "fastsim-link-only"


class _EnvlessCodegen:
    """The codegen as a link-only library shows it: it has no code in the
    JIT engine, so no environment to point at (`set_env`: Numba's call
    would write through a null address); otherwise the codegen itself."""

    def __init__(self, codegen):
        self._codegen = codegen

    def set_env(self, env_name, env):
        pass   # (the kernel's internal functions never read their environment: nothing raises with data)

    def __getattr__(self, name):
        return getattr(self._codegen, name)


class _LinkOnlyLibrary(JITCodeLibrary):
    """An internal function's code library that is only ever linked into
    its callers: finalising it links its callees' modules in and stops
    there, without the module passes and the machine code that Numba's
    library would make (the caller's own finalisation optimises and
    generates the linked code). It has no function pointers (an internal
    function has no Python or C wrapper to point at). In the disk cache it
    is its module for linking (`serialize_using_object_code`, read back by
    `from_cache`)."""

    def serialize_using_object_code(self):
        # (the name Numba's cache calls: a link-only library has no object code)
        return self.name, _LINK_ONLY_KIND, self._get_module_for_linking().as_bitcode()

    @classmethod
    def from_cache(cls, codegen, state):
        """The library `serialize_using_object_code` wrote, finalised:
        its module ready to link, nothing added to the JIT engine."""
        name, kind, bitcode = state
        if kind != _LINK_ONLY_KIND:
            raise ValueError(f"not a link-only library: {kind!r}")
        library = codegen.create_library(name)
        library.__class__ = cls
        library._final_module = library._shared_module = llvm.parse_bitcode(bitcode)
        library._finalize_dynamic_globals()
        library._finalized = True
        return library

    def finalize(self):
        require_global_compiler_lock()
        self._raise_if_finalized()
        seen = set()
        for library in self._linking_libraries:   # (as Numba's `CodeLibrary.finalize` links them)
            if library not in seen:
                self._reload_init.update(library._reload_init)
                seen.add(library)
                self._final_module.link_in(library._get_module_for_linking(), preserve=True)
        self._final_module.verify()
        self._finalize_dynamic_globals()
        self._verify_declare_only_symbols()
        self._finalized = True

    def get_pointer_to_function(self, name):
        self._ensure_finalized()
        return 0

    @property
    def codegen(self):
        return _EnvlessCodegen(self._codegen)


class _OutOfLine:
    """A code library whose function LLVM keeps out of line (``noinline``)
    in the callers it is linked into (`njit_noalloc`'s ``inline="never"``).
    Every definition of the module is marked: compiled without a Python or C
    wrapper, the module defines the function itself and nothing else."""

    def add_ir_module(self, ir_module):
        for fn in ir_module.functions:
            if not fn.is_declaration and "alwaysinline" not in fn.attributes:
                fn.attributes.add("noinline")
        super().add_ir_module(ir_module)


@functools.lru_cache(maxsize=None)
def _out_of_line(library_class):
    """``library_class`` with `_OutOfLine`'s ``noinline``."""
    return type(f"_OutOfLine{library_class.__name__}", (_OutOfLine, library_class), {})


class _InternalCompiler(_FastsimCompiler):
    """Numba's compiler, with a link-only library (`_LinkOnlyLibrary`) for
    the function (in the debug mode, Numba's own); kept out of line
    (`_OutOfLine`) where the function asks for it."""

    out_of_line = False

    def compile_extra(self, func):
        if not KERNEL_DEBUG and self.state.library is None:
            library = self.state.targetctx.codegen().create_library(func.__qualname__)
            library.__class__ = _LinkOnlyLibrary
            self.state.library = library
        if self.out_of_line:
            if self.state.library is None:
                self.state.library = self.state.targetctx.codegen().create_library(func.__qualname__)
            self.state.library.__class__ = _out_of_line(type(self.state.library))
        return super().compile_extra(func)


class _OutOfLineCompiler(_InternalCompiler):
    """`_InternalCompiler` for a function kept out of line (``inline="never"``)."""

    out_of_line = True


class _InternalDispatcher(CPUDispatcher):
    """A dispatcher compiled without a Python entry: calling it from Python
    would jump to a wrapper that does not exist."""

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.py_func.__module__}.{self.py_func.__name__} is compiled for jitted callers only "
                        f"(no Python entry); call it from jitted code, or compile one with python_entry()")


def njit_noalloc(func=None, *, entry=False, inline=None):
    """:func:`njit` without Numba's runtime, for functions that allocate no array.

    By default the function is *internal*: only jitted code calls it, so it
    gets no Python entry (no CPython or C wrapper; its code is compiled
    into the cached functions that call it), and its disk-cache entries are
    written by a cold start's helper process only (`_InternalCache`);
    calling it from Python raises TypeError. ``entry=True``: also
    called from Python (cached, with its wrappers). ``inline``, for the few
    hot calls that LLVM leaves out of line in the engine loop (which then
    passes every array argument as seven words): ``"llvm"`` has LLVM inline
    it (``forceinline``: the ``alwaysinline`` attribute); and for the rare
    paths that LLVM would inline into it (an option the run does not use):
    ``"never"`` keeps the function out of line (``noinline``), so that its
    code does not spread the engine's hot code over more cache lines.
    Measure before adding one: inlining the wrong ones slowed the engine down.

    Without the runtime, a function that returns a view of an array (such
    as `kernel.cluster._rows`) takes no reference for it; code compiled
    with the runtime (a plain ``numba.njit`` function) that calls it would
    release one it never took, and free the array under Python (seen as
    "malloc(): unaligned tcache chunk"). Call the kernel's functions from
    code compiled as they are (`njit` with ``_nrt=False``, or this).
    """
    if func is None:
        return lambda f: njit_noalloc(f, entry=entry, inline=inline)
    if inline not in (None, "llvm", "never"):
        raise ValueError(f"{func.__name__}: inline must be None, 'llvm' or 'never', got {inline!r}")
    if entry and inline:
        raise ValueError(f"{func.__name__}: an entry (called from Python) cannot be inlined into its callers")
    if entry:
        return njit(func, _nrt=False)
    # fastmath given, not inherited from the caller: the disk cache's key
    # does not hold it, and a cached copy must be what any caller would get
    dispatcher = njit(func, _nrt=False, cache=False, no_cpython_wrapper=True, no_cfunc_wrapper=True,
                      forceinline=inline == "llvm", fastmath=False,
                      pipeline_class=_OutOfLineCompiler if inline == "never" else _InternalCompiler)
    dispatcher.__class__ = _InternalDispatcher   # a clear error, not a crash, when Python calls it
    try:
        dispatcher._cache = _InternalCache(dispatcher.py_func)
    except RuntimeError as exc:
        if not _no_locator(exc):
            raise
        _warn_uncached(func, exc)   # (the dispatcher keeps its NullCache)
    return _stamp(dispatcher)


#: The helper `compile_entries` runs (a `_Helper`), None when none runs.
_helper = None


class _DataFirstCacheFile(IndexDataCacheFile):
    """Numba's index and data files, the data file written before the index
    names it. (Numba writes the index first: until the data file follows,
    and for good if the writer is killed in between, the index can name a
    stale data file of an older version of the source, as numbering starts
    again at 1.)"""

    def save(self, key, data):
        overloads = self._load_index()
        name = overloads.get(key)
        if name is None:
            taken = set(overloads.values())
            name = next(n for n in map(self._data_name, range(1, len(taken) + 2)) if n not in taken)
        self._save_data(name, data)
        overloads = self._load_index()   # as it is now
        overloads[key] = name
        self._save_index(overloads)


# ------------------------------------------------------------------------------
# Cache faults. Simulation needs no disk cache, so no fault of
# it may stop a run: an entry that fails to load (a truncated or corrupted
# file: UnpicklingError, EOFError, an LLVM or object-code parsing error) is
# dropped and its function compiled again, with a warning that names the
# cache directory; a cache that cannot be written (a full disk, no
# permission) leaves the function compiled in memory, with one warning per
# directory; and a function for which Numba finds no writable cache
# location at all (its "no locator available" error, raised when the
# function is defined, i.e. at ``import fastsim``) is compiled uncached.

#: Cache directories already warned about, so that each fault is said once.
_cache_warned = set()


def _warn_cache(key, message):
    if key not in _cache_warned:
        _cache_warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class _SafeFunctionCache(FunctionCache):
    """Numba's disk cache of one function, with faults turned into a
    recompilation or an in-memory compilation and a warning (above)."""

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except Exception as exc:   # any fault of a file read back: compile it again
            try:
                self._cache_file.flush()   # an empty index: the entry is gone for every process
                dropped = "it was dropped"
            except Exception:
                self.disable()             # (cannot rewrite the index: stop reading it here)
                dropped = "it could not be removed (the directory is not writable)"
            _warn_cache(("load", self._cache_path),
                        f"fastsim: an entry of Numba's disk cache in {self._cache_path} could not be loaded "
                        f"({self._name}: {type(exc).__name__}: {str(exc)[:200]}); {dropped} and the function "
                        f"is compiled again. If this repeats, delete that directory (or point NUMBA_CACHE_DIR "
                        f"elsewhere)")
            return None

    def save_overload(self, sig, data):
        try:
            super().save_overload(sig, data)
        except Exception as exc:   # a full disk, no permission: the compiled code serves this process
            self.disable()
            _warn_cache(("save", self._cache_path),
                        f"fastsim: cannot write Numba's disk cache in {self._cache_path} ({type(exc).__name__}: "
                        f"{str(exc)[:200]}); compiling in memory, so the next process compiles again. Free space "
                        f"there, or set NUMBA_CACHE_DIR to a writable directory")


def _no_locator(exc):
    return isinstance(exc, RuntimeError) and "no locator available" in str(exc)


def _warn_uncached(func, exc):
    _warn_cache(("locator",), f"fastsim: Numba finds no writable location for its disk cache ({exc}); "
                              f"compiling in memory, so every process compiles again. Set NUMBA_CACHE_DIR "
                              f"to a writable directory")


def _safe_dispatcher(dispatcher):
    """``dispatcher`` with its disk cache (if any) made fault-tolerant."""
    if type(dispatcher._cache) is FunctionCache:
        dispatcher._cache.__class__ = _SafeFunctionCache
    return dispatcher


class _InternalCacheImpl(CompileResultCacheImpl):
    """Numba's cache of compile results, which also reads a link-only
    library back (`_LinkOnlyLibrary.from_cache`); other kinds (a debug
    build's object code) as Numba reads them."""

    def rebuild(self, target_context, payload):
        libdata = payload[0]
        if libdata[1] != _LINK_ONLY_KIND:
            return super().rebuild(target_context, payload)
        # (`CompileResult._rebuild`, with the library made here)
        _, fndesc, env, signature, objectmode, lifted, typeann, reload_init, referenced_envs = payload
        for fn in reload_init or ():
            fn()
        library = _LinkOnlyLibrary.from_cache(target_context.codegen(), libdata)
        return CompileResult(target_context=target_context, typing_context=target_context.typing_context,
                             library=library, environment=env,
                             entry_point=target_context.get_executable(library, fndesc, env), fndesc=fndesc,
                             type_annotation=typeann, signature=signature, objectmode=objectmode, lifted=lifted,
                             typing_error=None, call_helper=None, metadata=None, reload_init=reload_init,
                             referenced_envs=referenced_envs)


class _InternalCache(_SafeFunctionCache):
    """Numba's disk cache for an internal function: every process reads it,
    but only a cold start's helper process writes it, and only the argument
    types it was given as jobs (``saving``). Data files are written before
    the index names them (`_DataFirstCacheFile`). While a helper runs, this
    process loads only what the helper has reported saved, and waits for
    what it is about to save (`_Helper.ready`)."""

    _impl_class = _InternalCacheImpl

    def __init__(self, py_func):
        super().__init__(py_func)
        self._cache_file.__class__ = _DataFirstCacheFile
        self.saving = set()

    def load_overload(self, sig, target_context):
        helper = _helper
        if helper is not None and not helper.ready(self, sigutils.normalize_signature(sig)[0]):
            return None
        return super().load_overload(sig, target_context)

    def save_overload(self, sig, data):
        if sigutils.normalize_signature(sig)[0] in self.saving:
            super().save_overload(sig, data)


def python_version(dispatcher):
    """A jitted function as plain Python: its source run by the interpreter,
    with every jitted function it calls (through its module's globals,
    recursively) plain Python too: Python's exact integers and NumPy's
    bounds-checked indexing, for sizes computed without overflow, types
    read off real values, and tests."""
    versions = {}

    def version(d):
        if d not in versions:
            f = d.py_func
            namespace = dict(f.__globals__)
            versions[d] = types.FunctionType(f.__code__, namespace, f.__name__, f.__defaults__, f.__closure__)
            for key, obj in list(namespace.items()):
                if isinstance(obj, CPUDispatcher):
                    namespace[key] = version(obj)
        return versions[d]

    return version(dispatcher)


def python_caller(dispatcher):
    """A jitted function run as Python, the jitted functions it calls
    (through its globals) compiled: entries as they are, internal
    functions through `python_entry`. An exception they raise reaches the
    caller (the debug mode's driver, `KERNEL_DEBUG`), where through a
    function pointer it would be lost."""
    f = dispatcher.py_func
    namespace = dict(f.__globals__)
    for key, obj in list(namespace.items()):
        if isinstance(obj, _InternalDispatcher):
            namespace[key] = python_entry(obj)
    return types.FunctionType(f.__code__, namespace, f.__name__, f.__defaults__, f.__closure__)


def python_entry(dispatcher):
    """A Python-callable compilation of an internal :func:`njit_noalloc`
    function, for tests and benchmarks that call kernel internals directly
    (not cached: the cache would not see the kernel's file change)."""
    return njit(dispatcher.py_func, _nrt=False, cache=False)


def njit(*args, **kwargs):
    """``numba.njit`` with fastsim's options (keyword arguments override)."""
    options = {**NUMBA_OPTIONS, **kwargs}
    if args and callable(args[0]):
        return _stamp(_one_specialisation(_cached_njit(args[0], (), options)))
    return lambda func: _stamp(_one_specialisation(_cached_njit(func, args, options)))


def _cached_njit(func, args, options):
    """``numba.njit(*args, **options)(func)`` with a fault-tolerant disk cache,
    or none (and a warning) when Numba finds no writable location for one."""
    try:
        return _safe_dispatcher(numba.njit(*args, **options)(func))
    except RuntimeError as exc:
        if not (options.get("cache") and _no_locator(exc)):
            raise
        _warn_uncached(func, exc)
        return numba.njit(*args, **{**options, "cache": False})(func)


class _FunctionPointer(WrapperAddressProtocol):
    """One compiled version of an entry, typed by Numba as a first-class
    function (the *wrapper address protocol*): jitted code calls it through
    its C wrapper's address. The C wrapper cannot pass on an exception: it
    prints it ("Exception ignored") and returns zeros. The engine raises
    none (no ``raise``, NumPy's error model, no bounds checks); to look for
    out-of-bounds indexing, use the debug mode (`KERNEL_DEBUG`), whose
    driver calls the entries from Python instead of through pointers, not
    ``NUMBA_BOUNDSCHECK=1`` (its IndexError would be lost here)."""

    def __init__(self, dispatcher, argtypes):
        dispatcher.compile(argtypes)   # loaded from Numba's cache when it is there
        cres = dispatcher.overloads[argtypes]
        self._signature = cres.signature
        self._address = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
        self._library = cres.library   # keeps the code alive
        self.numba_type = FunctionType(cres.signature)   # what Numba would build again at every call

    def signature(self):
        return self._signature

    def __wrapper_address__(self):
        return self._address


@typeof_impl.register(_FunctionPointer)
def _typeof_function_pointer(val, c):
    # The pointer's type, built once: Numba's own typeof for the protocol
    # builds it on every call of a jitted function that takes the pointer
    # (a large share of `_run_chunk`'s dispatch).
    return val.numba_type


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
#: helper's start-up), before it stops the helper and compiles the rest itself;
#: and at most this long for each callee of the engine the helper is to save.
HELPER_GRACE_S = 10.0

#: Stall detection: the helper writes a heartbeat line every
#: `HEARTBEAT_S` from its start (a thread of its own, before it imports
#: anything heavy), and this process takes a helper it has not heard from
#: for `HELPER_STALL_S` as stalled (stopped, swapped out, deadlocked): it
#: waits for it no more, for any job, says so in a warning, and compiles
#: what is left itself. (A fixed grace per job made a stalled helper cost
#: minutes, silently; ``benchmarks/helper_stall.py`` measures it, and
#: `benchmarks/HISTORY.md` has the figures.) The heartbeat thread runs while
#: the main thread compiles: LLVM's calls release the GIL, and Python's
#: switch interval (5 ms) hands it over during typing. 3 s of silence leaves
#: room for a loaded machine's scheduling delays; a shorter limit would
#: save at most those seconds once per cold start.
HEARTBEAT_S = 0.25
HELPER_STALL_S = 3.0

_compile_lock = threading.Lock()


def _helper_wanted():
    """The helper is on unless ``FASTSIM_COMPILE_HELPER`` says off, there is
    no second usable core (affinity and cgroup quotas, as joblib counts), or
    ``sys.executable`` is not a Python interpreter (a frozen application or
    an embedding host would start itself again)."""
    if os.environ.get("FASTSIM_COMPILE_HELPER", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if any(key[0] in ("locator", "save") for key in _cache_warned):
        return False   # the helper hands its work over through the disk cache
    if getattr(sys, "frozen", False) or not os.path.basename(sys.executable or "").lower().startswith("python"):
        return False
    from ._parallel import available_cores

    return available_cores() >= 2


def _in_disk_cache(dispatcher, argtypes):
    """Whether the index of Numba's disk cache lists ``dispatcher`` compiled
    for ``argtypes`` (the key ``Dispatcher.compile`` looks up; False when unsure)."""
    try:
        cache = dispatcher._cache
        return cache._index_key(argtypes, dispatcher.targetctx.codegen()) in cache._cache_file._load_index()
    except Exception:
        return False


def _cache_path(dispatcher):
    try:
        return dispatcher._cache._cache_path
    except AttributeError:
        return None


_HELPER_CODE = f"""
import importlib.util, pickle, sys, types
sys.path[:] = pickle.load(sys.stdin.buffer)
# {__package__} without its __init__ (pandas and the rest): the helper needs
# the kernel only, and importing all of it would take about half a second
# more of the time the engine's compilation waits for its callees
spec = importlib.util.find_spec({__package__!r})
package = sys.modules[spec.name] = types.ModuleType(spec.name)
package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
import os, threading, time
report = os.fdopen(os.dup(1), "w")   # the reports: what else prints goes to stderr
os.dup2(2, 1)
lock = threading.Lock()   # one line at a time on the report pipe
orphaned = threading.Event()   # the parent is gone: begin no further job
parent = os.getppid()
def beat():   # the heartbeat: alive, whatever the main thread is doing
    try:
        while os.getppid() == parent:
            with lock:
                report.write("beat\\n")
                report.flush()
            time.sleep({HEARTBEAT_S!r})
    except (OSError, ValueError):   # the report's reader is gone, or the report closed
        pass
    orphaned.set()
threading.Thread(target=beat, daemon=True).start()
from {__name__} import _helper_main
_helper_main(report, lock, orphaned)
"""


def _start_helper(jobs, log, claims):
    """A process that compiles ``jobs`` into Numba's disk cache, in order,
    or None if it cannot be started. It imports the modules this process
    imported (its ``sys.path``) and writes where this process's dispatchers
    read. It claims each job before it begins it (`_claim` in the
    directory ``claims``) and leaves the jobs this process has claimed; on
    its stdout it reports each job's index when that job is saved, or
    "skip" and the index for one it leaves (a job for another cache path,
    or an internal function that failed to compile). Everything else it
    writes goes to the file ``log``."""
    env = dict(os.environ)
    env.pop("NUMBA_CACHE_DIR", None)
    if numba.config.CACHE_DIR:
        env["NUMBA_CACHE_DIR"] = numba.config.CACHE_DIR
    jobs = [(d.py_func.__module__, _name_in_module(d), argtypes, _cache_path(d)) for d, argtypes in jobs]
    try:
        data = pickle.dumps(list(sys.path)) + pickle.dumps((claims, jobs))
        proc = subprocess.Popen([sys.executable, "-c", _HELPER_CODE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, env=env)
    except Exception:   # nothing to start, or types that do not pickle: this process compiles everything
        return None
    try:
        proc.stdin.write(data)
    except OSError:   # the helper died at once
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
    return proc


def _name_in_module(dispatcher):
    """The name under which ``dispatcher`` is found in its module (not
    always its function's name)."""
    module = sys.modules[dispatcher.py_func.__module__]
    return next((k for k, v in vars(module).items() if v is dispatcher), dispatcher.py_func.__name__)


def _claim(claims, i):
    """Claim job ``i``: create its file in the directory ``claims``,
    exclusively. False if the other process has it (or the directory is
    gone)."""
    try:
        os.close(os.open(os.path.join(claims, str(i)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return False
    return True


def _helper_main(report, lock=None, orphaned=None):
    """The helper process: compile each job read from stdin that it can
    claim, in order, and write its index to the file ``report`` when it is
    saved ("skip" and the index for a job it leaves to the parent process,
    or could not compile: an internal function; its traceback goes to
    stderr). An internal function's job signature is saved even when it is
    compiled for an earlier job. When ``orphaned`` is set (the parent
    process died: a worker that outlives its parent exits by itself), it
    begins no further job; the one it is at finishes, so that no cache file
    is left half-written."""
    lock = lock or threading.Lock()
    orphaned = orphaned or threading.Event()

    def say(*words):
        with lock:
            print(*words, file=report, flush=True)

    claims, jobs = pickle.load(sys.stdin.buffer)
    dispatchers = [getattr(importlib.import_module(module), name) for module, name, _, _ in jobs]
    for d, (_, _, argtypes, _) in zip(dispatchers, jobs):
        if isinstance(d._cache, _InternalCache):
            d._cache.saving.add(tuple(argtypes))
    for i, (dispatcher, (_, _, argtypes, path)) in enumerate(zip(dispatchers, jobs)):
        if orphaned.is_set():
            return
        if not _claim(claims, i):   # the parent process has it
            continue
        if _cache_path(dispatcher) != path:   # another cache than the parent's: of no use to it
            say("skip", i)
            continue
        try:
            dispatcher.compile(argtypes)
        except Exception:
            if not isinstance(dispatcher._cache, _InternalCache):
                raise   # an entry: the parent compiles it again and says why
            import traceback

            traceback.print_exc()   # a stale `kernel.callees.TABLE` line: the engine compiles its own
            say("skip", i)
            continue
        say(i)


class _Helper:
    """A running helper process as this one sees it: its ``jobs``, the
    claims directory, the jobs this process claimed (``mine``) and those
    the helper reported done (``done``, read as they come by a thread)."""

    def __init__(self, proc, jobs, claims):
        self.proc, self.jobs, self.claims = proc, jobs, claims
        self.index = {(d._cache, argtypes): i for i, (d, argtypes) in enumerate(jobs)}
        self.mine, self.done, self.skipped, self.exited = set(), set(), set(), False
        self.heard, self.stalled = time.monotonic(), False   # the last line read (a report or a heartbeat)
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        try:
            self._reader.start()
        except BaseException:   # no thread to read its reports: no helper
            proc.kill()
            proc.wait()
            proc.stdout.close()
            raise

    def _read(self):
        try:
            for line in self.proc.stdout:
                words = line.split()
                self.heard = time.monotonic()
                if not words or not words[-1].isdigit():
                    continue
                with self._changed:
                    (self.skipped if len(words) > 1 else self.done).add(int(words[-1]))
                    self._changed.notify_all()
        finally:
            with self._changed:
                self.exited = True
                self._changed.notify_all()

    def claim(self, i):
        """Claim job ``i`` for this process (False: the helper has it)."""
        if _claim(self.claims, i):
            self.mine.add(i)
            return True
        return False

    def ready(self, cache, argtypes):
        """Whether this process may load an internal function from the disk
        cache: no if it is not a job; yes once the helper has reported it
        saved, which this waits for (at most `HELPER_GRACE_S`; the helper
        compiles the callees first, in the order they are asked for). Not
        compiling it here while the helper does keeps one copy of each
        callee in the engine: a callee the helper compiled holds its own
        copies of the functions it calls."""
        i = self.index.get((cache, argtypes))
        if i is None:
            return False
        deadline = time.monotonic() + HELPER_GRACE_S
        with self._changed:
            while not (i in self.done or i in self.skipped or self.exited or self.check_stalled()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(HEARTBEAT_S, left))
            return i in self.done

    def check_stalled(self):
        """Whether the helper is stalled: running, but silent (no report and
        no heartbeat) for `HELPER_STALL_S`; once stalled, always."""
        if not self.stalled and not self.exited and time.monotonic() - self.heard > HELPER_STALL_S:
            self.stalled = True
        return self.stalled

    def stop(self, timeout):
        """Wait up to ``timeout`` s for the helper and stop it if it is still
        running. Unless it exited normally, empty the cache index of each
        entry it did not report done and this process did not claim: a
        helper stopped between writing an entry's index and its data would
        leave an index that points at an older data file. (Internal
        functions write their data first.) Returns the helper's exit code,
        None if it was stopped."""
        proc = self.proc
        deadline = time.monotonic() + timeout
        try:
            # in slices: a helper that stalls meanwhile is stopped at once
            while proc.poll() is None and not self.check_stalled():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    proc.wait(min(HEARTBEAT_S, left))
                except subprocess.TimeoutExpired:
                    pass
        finally:   # on an interrupt too
            stopped = proc.poll() is None
            if stopped:
                proc.kill()
                proc.wait()
            self._reader.join()   # to the end of its output
            proc.stdout.close()
            if stopped or proc.returncode != 0:
                for i, (d, _) in enumerate(self.jobs):
                    if i not in self.done and i not in self.mine and not isinstance(d._cache, _InternalCache):
                        try:
                            d._cache.flush()
                        except Exception:
                            pass
        return None if stopped else proc.returncode


#: Name prefix of a cold start's claims directory, followed by its process id.
_CLAIMS_PREFIX = "fastsim-claims-"


def _remove_stale_claims():
    """Remove the claims directories that killed cold starts left in the
    temporary directory (a killed process removes nothing): those whose
    process no longer runs. (One whose id was reused is left: it is small.)"""
    import shutil

    try:
        names = os.listdir(tempfile.gettempdir())
    except OSError:
        return
    for name in names:
        if not name.startswith(_CLAIMS_PREFIX):
            continue
        pid = name[len(_CLAIMS_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue   # still running (or not ours to signal): leave it
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)


def _compile_with_helper(first, first_types, rest, callees):
    """`compile_entries` on a cold start: a helper compiles ``callees`` and
    then ``rest`` while this process compiles ``first``, which loads each
    callee when the helper has saved it. Then this process claims the jobs
    the helper has not begun, from the last back, and compiles the entries
    among them, until it reaches the one the helper is at; it waits for
    that one as long as ``first`` took (at least `HELPER_GRACE_S`).
    Whatever is left, `compile_entries` compiles."""
    global _helper
    jobs = callees + rest
    _remove_stale_claims()
    with tempfile.TemporaryFile() as log, \
            tempfile.TemporaryDirectory(prefix=f"{_CLAIMS_PREFIX}{os.getpid()}-") as claims:
        proc = _start_helper(jobs, log, claims)
        if proc is None:
            first.compile(first_types)
            return
        helper = _Helper(proc, jobs, claims)
        timeout = 0.0   # on an error or an interrupt: stop the helper at once
        try:
            _helper = helper
            start = time.perf_counter()
            first.compile(first_types)
            took = time.perf_counter() - start
            for i in reversed(range(len(jobs))):
                if not helper.claim(i):
                    if i >= len(callees):   # an entry the helper is at: wait for it
                        timeout = max(HELPER_GRACE_S, took)
                    break
                if i >= len(callees):   # (a callee left is of no use now)
                    d, argtypes = jobs[i]
                    d.compile(argtypes)
        finally:
            try:
                rc = helper.stop(timeout)
            finally:
                _helper = None
        if helper.stalled:
            warnings.warn(f"fastsim's compile helper stopped responding (no heartbeat for {HELPER_STALL_S:g} s); "
                          f"it was stopped and this process compiles what it left (FASTSIM_COMPILE_HELPER=0 "
                          f"turns the helper off)", RuntimeWarning, stacklevel=4)
        elif rc:   # it failed by itself
            log.seek(0)
            tail = log.read()[-2000:].decode(errors="replace").strip()
            warnings.warn(f"fastsim's compile helper exited with code {rc}; compiling here instead "
                          f"(FASTSIM_COMPILE_HELPER=0 turns it off): {tail}", RuntimeWarning, stacklevel=4)


def compile_entries(entries, callees=()):
    """Compile entries ``[(dispatcher, argtypes), ...]``, the costliest first.

    When the first is in neither this process nor Numba's disk cache (a cold
    start), two cores are usable and ``FASTSIM_COMPILE_HELPER`` is not
    ``0``/``false``/``no``/``off``, a helper process compiles the others
    into the disk cache while this process compiles the first. ``callees``
    (``[(internal function, argtypes), ...]``, in the order the first
    entry's compilation asks for them) are the helper's first jobs: the
    first entry's compilation loads each from the disk cache when it asks
    for it (waiting for the helper to save it) instead of compiling it.
    When this process is done with the first entry, it takes the entries
    the helper has not begun, from the last back, so that the two finish
    about together; it waits for the one the helper is at as long as the
    first took (at least `HELPER_GRACE_S`), then compiles whatever the
    helper did not finish, with a warning if the helper failed. The results
    are the same either way.
    """
    entries = [(d, tuple(argtypes)) for d, argtypes in entries]
    with _compile_lock:   # threads of one run: one of them compiles, the others then find it done
        (first, first_types), rest = entries[0], entries[1:]
        rest = [(d, a) for d, a in rest if a not in d.overloads]
        if rest and first_types not in first.overloads and _helper_wanted() \
                and not _in_disk_cache(first, first_types):
            callees = [(d, tuple(a)) for d, a in callees if tuple(a) not in d.overloads]
            _compile_with_helper(first, first_types, rest, callees)
        else:
            first.compile(first_types)
        for d, argtypes in rest:
            d.compile(argtypes)
