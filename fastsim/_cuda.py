"""GPU backend: the CPU kernel's own functions, compiled as CUDA device functions.

One source of truth. Every engine function of ``fastsim/kernel/`` is
written without allocation (the replication state is carved out of a flat
workspace, see ``kernel.workspace._ws_need``), so the same Python source compiles with
``numba.njit`` for the CPU and with ``numba.cuda.jit(device=True)`` here. The
CUDA copies are built by re-binding each function's code to a namespace in
which its callees are the CUDA versions; only the two ``__global__`` entry
points below are GPU-specific, and they are a few lines each.

Execution, per chunk of replications (one GPU thread per replication):

1. ``_draw_kernel`` draws each replication's request stream into device
   arrays (the same counter-based streams as the CPU: replication ``r``
   depends only on the seed and ``r``) and reports the workspace it needs;
2. the host turns those sizes into offsets (a prefix sum) and allocates one
   flat workspace, in groups that fit a memory budget;
3. the simulate kernel (of the common or the full engine, as on the CPU:
   `replica.engine_variant`) simulates and reduces each replication into its
   row of metrics; only the ``(replications, columns)`` table comes back.

Arrays are CuPy arrays (numba-cuda takes them through the CUDA Array
Interface). Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, no GPU
needed) the same code runs on NumPy arrays: that is how CI tests it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import types
import warnings

import numpy as np

from . import kernel as K


__all__ = ["BackendUnavailableError", "cuda_unavailable_reason", "check_cuda_available", "compile_ptx",
           "run_replications_cuda"]

#: Compiled functions of the kernel package that allocate (the CPU driver): never compiled for the GPU.
_CPU_ONLY = frozenset({"_run_chunk"})

#: Threads per block: one warp. Replications are independent and divergent,
#: and how many run at once is set by device memory (a replication's workspace
#: holds every inter-token gap), not by the SM's thread slots: the smallest
#: blocks spread those replications over the most SMs.
THREADS_PER_BLOCK = 32

#: Share of the device's free memory (CuPy's pool counted as free) that a call's
#: request arrays and workspaces may take when no budget is given: the number of
#: replications simulated at once, and so the GPU's occupancy, grows with it.
DEFAULT_MEMORY_FRACTION = 0.8

#: The budget (bytes) where free memory cannot be read (Numba's CUDA simulator).
FALLBACK_MEMORY_BUDGET = 2 * 1024 ** 3


def _simulator() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


class BackendUnavailableError(RuntimeError):
    """``backend="cuda"`` was selected where it cannot run (the message says what is missing)."""


def cuda_unavailable_reason() -> str | None:
    """Why ``backend="cuda"`` cannot run here (``None`` when it can).

    Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) only numba's
    CUDA target is needed; otherwise numba-cuda, CuPy and a usable GPU
    (``cupy.cuda.is_available()``; ``import cupy`` alone succeeds without one).
    """
    try:
        from numba import cuda  # noqa: F401
    except Exception as exc:  # numba-cuda missing or broken
        return (f"numba's CUDA target could not be imported ({exc}); install the GPU extra: "
                f"pip install 'fastsim-llm[gpu]'")
    if _simulator():
        return None
    try:
        import cupy
    except Exception as exc:
        return f"CuPy could not be imported ({exc}); install the GPU extra: pip install 'fastsim-llm[gpu]'"
    try:
        ok = bool(cupy.cuda.is_available())
    except Exception as exc:  # driver or runtime errors
        return f"cupy.cuda.is_available() failed ({exc})"
    if not ok:
        return ("no usable NVIDIA GPU: cupy.cuda.is_available() is False (no device, or no CUDA 12 "
                "driver); use backend='numba', or NUMBA_ENABLE_CUDASIM=1 to run the CUDA code on the "
                "CPU simulator")
    return None


def check_cuda_available() -> None:
    """Raise :class:`BackendUnavailableError` (a ``RuntimeError``) saying what is
    missing when ``backend="cuda"`` cannot run."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(f"backend='cuda' is not available: {reason}")


# ------------------------------------------------------------------------------
# The two entry points (each thread: one replication). `cuda`, `_draw_workload`,
# `_ws_need`, `_simulate` and `_reduce` resolve in the namespace built by
# `_build`, where they are the CUDA device functions.

def _draw_kernel(rep0, nrep, key0, key1, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange, trace,
                 prio_val, prio_cdf, pred_edges, state, arrival, prompt, output, prio, sjfk, pgrp, plen,
                 nreq, need):
    j = cuda.grid(1)  # noqa: F821
    if j < nrep:
        n = _draw_workload(rep0 + j, key0, key1, ipar, fpar, arr_times, lcomp, lpar, ltab,  # noqa: F821
                           lrange, trace, prio_val, prio_cdf, pred_edges, state[j], arrival[j], prompt[j],
                           output[j], prio[j], sjfk[j], pgrp[j], plen[j])
        nreq[j] = n
        ni, nf = _ws_need(n, prompt[j], output[j], pgrp[j], plen[j], ipar)  # noqa: F821
        need[j, 0] = ni
        need[j, 1] = nf


def _simulate_kernel_of(full):
    """The simulate kernel of the engine `replica.engine_variant` names
    (``full``: None, the common engine, or 1), which Numba prunes by that
    constant as it does on the CPU."""

    def _simulate_kernel(j0, nrep, ipar, fpar, lat, arrival, prompt, output, prio, sjfk, pgrp, plen, nreq,
                         off_i, off_f, wi, wf, out):
        t = cuda.grid(1)  # noqa: F821
        if t < nrep:
            j = j0 + t
            n = nreq[j]
            wij = wi[off_i[t]:off_i[t + 1]]
            wfj = wf[off_f[t]:off_f[t + 1]]
            _simulate(n, arrival[j], prompt[j], output[j], prio[j], sjfk[j], pgrp[j], plen[j],  # noqa: F821
                      ipar, fpar, lat, wij, wfj, full, np.inf, WHOLE_RUN)  # noqa: F821
            _reduce(n, arrival[j], output[j], ipar, fpar, wij, wfj, out[j])  # noqa: F821

    return _simulate_kernel


@contextlib.contextmanager
def _rounded_as_on_the_cpu():
    """Compile without fused multiply-adds.

    NVVM contracts ``a * b + c`` into one FMA (a single rounding) unless told
    ``-fma=0``, and numba-cuda passes that option only as part of
    ``fastmath``; the CPU kernel rounds the product first. Held while
    `run_replications_cuda` runs (its kernels compile on their first
    launch) and in `compile_ptx`: CUDA code that another thread of the
    process compiles meanwhile gets ``-fma=0`` too, and numba-cuda's own
    function is back once the last such call ends.
    """
    from numba.cuda.cudadrv import nvvm

    with _FMA_LOCK:   # calls from several threads: the first in patches, the last out restores
        if _FMA["users"] == 0:
            saved = _FMA["saved"] = nvvm.compile_ir

            def compile_ir(llvmir, **options):
                if not options.get("fastmath"):
                    options["fma"] = False
                return saved(llvmir, **options)

            nvvm.compile_ir = compile_ir
        _FMA["users"] += 1
    try:
        yield
    finally:
        with _FMA_LOCK:
            _FMA["users"] -= 1
            if _FMA["users"] == 0:
                nvvm.compile_ir = _FMA.pop("saved")


_FMA_LOCK = threading.Lock()
_FMA = {"users": 0}


def _rebind(func, namespace):
    """``func`` with its global names looked up in ``namespace``."""
    return types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__, func.__closure__)


def _namespace():
    """A copy of the kernel package's `namespace` (the globals of all its
    modules) in which every engine function is its CUDA device-function
    version (compiled on first use)."""
    from numba import cuda
    from numba.core.registry import CPUDispatcher

    ns = K.namespace()
    for name, obj in list(ns.items()):
        if isinstance(obj, CPUDispatcher) and name not in _CPU_ONLY:
            ns[name] = cuda.jit(device=True)(_rebind(obj.py_func, ns))
    ns["cuda"] = cuda
    return ns


@functools.lru_cache(maxsize=None)
def _device_namespace():
    """`_namespace`, once a process: both engines' kernels share its device functions."""
    return _namespace()


@functools.lru_cache(maxsize=None)
def _build(full):
    """The draw kernel and the simulate kernel of engine ``full``
    (`replica.engine_variant`), each compiled on its first launch."""
    from numba import cuda

    return _build_draw(), cuda.jit(_rebind(_simulate_kernel_of(full), _device_namespace()))


@functools.lru_cache(maxsize=None)
def _build_draw():
    from numba import cuda

    return cuda.jit(_rebind(_draw_kernel, _device_namespace()))


#: `compile_ptx`'s kernels: name -> the simulate kernel's engine (`replica.engine_variant`: None, the
#: common engine; 1, the full one); the draw kernel has no engine (None).
PTX_KERNELS = {"_draw_kernel": None, "_simulate_kernel": 1, "_simulate_common_kernel": None}


def compile_ptx(cc=(9, 0), kernels=tuple(PTX_KERNELS)):
    """PTX of the kernels for compute capability ``cc``; needs numba-cuda and
    NVVM but no GPU (a check that the GPU code compiles, e.g. in CI).

    Parameters
    ----------
    cc : tuple of int
        The compute capability, e.g. ``(9, 0)`` for an H100.
    kernels : sequence of str
        Names from `PTX_KERNELS`: the draw kernel, the full engine's simulate
        kernel and the common engine's.

    Returns
    -------
    dict
        ``{name: ptx}`` for each kernel asked for.
    """
    from numba import cuda
    from numba.cuda import types as t
    import numba.cuda.dispatcher as dispatcher

    unknown = [k for k in kernels if k not in PTX_KERNELS]
    if unknown:
        raise ValueError(f"kernels={unknown!r}: not a kernel; allowed: {sorted(PTX_KERNELS)}")

    class _Target:
        compute_capability = tuple(cc)

    # Device functions ask the current device for its compute capability;
    # with no GPU, answer for the requested target (only while compiling).
    saved = dispatcher.get_current_device
    dispatcher.get_current_device = _Target
    try:
        ns = _namespace()
        i1, f1 = t.int64[::1], t.float64[::1]
        i2, f2, u2 = t.int64[:, ::1], t.float64[:, ::1], t.uint64[:, ::1]
        tables = (i1, f1, f1, i2, f2, f2, i1, i2, i1, f1, i1)   # ipar ... pred_edges (pack_scenario)
        draw_sig = (t.int64, t.int64, t.uint64, t.uint64) + tables + (u2, f2) + (i2,) * 6 + (i1, i2)
        sim_sig = (t.int64, t.int64, i1, f1, f1, f2) + (i2,) * 6 + (i1, i1, i1, i1, f1, f2)
        out = {}
        with _rounded_as_on_the_cpu():
            for name in kernels:
                func, sig = ((_draw_kernel, draw_sig) if name == "_draw_kernel"
                             else (_simulate_kernel_of(PTX_KERNELS[name]), sim_sig))
                out[name] = cuda.compile_ptx(_rebind(func, ns), sig, cc=tuple(cc))[0]
        return out
    finally:
        dispatcher.get_current_device = saved


# ------------------------------------------------------------------------------
# Host side

class _Arrays:
    """CuPy on a GPU; NumPy through Numba's device arrays under the simulator."""

    def __init__(self):
        self.sim = _simulator()
        if not self.sim:
            import cupy

            self.xp = cupy
        else:
            self.xp = np

    def to_device(self, a):
        if self.sim:
            from numba import cuda

            return cuda.to_device(np.ascontiguousarray(a))
        return self.xp.asarray(np.ascontiguousarray(a))

    def empty(self, shape, dtype):
        if self.sim:
            from numba import cuda

            return cuda.device_array(shape, dtype=dtype)
        return self.xp.empty(shape, dtype=dtype)

    def to_host(self, a):
        if self.sim:
            return a.copy_to_host()
        return self.xp.asnumpy(a)

    def synchronize(self):
        if not self.sim:
            self.xp.cuda.runtime.deviceSynchronize()

    def default_budget(self):
        """`DEFAULT_MEMORY_FRACTION` of the device's free memory, in bytes."""
        if self.sim:
            return FALLBACK_MEMORY_BUDGET
        free, _ = self.xp.cuda.runtime.memGetInfo()
        free += self.xp.get_default_memory_pool().free_bytes()
        return int(DEFAULT_MEMORY_FRACTION * free)


def _groups(need_i, need_f, budget):
    """Split replications ``0..m-1`` into consecutive groups whose workspaces
    fit ``budget`` bytes (at least one replication each)."""
    per = 8 * (need_i + need_f)
    groups = []
    lo = 0
    total = 0
    for j in range(per.size):
        if j > lo and total + per[j] > budget:
            groups.append((lo, j))
            lo = j
            total = 0
        total += per[j]
    groups.append((lo, per.size))
    return groups


def run_replications_cuda(packed, k0, k1, rep0, nrep, out, *, chunk=None, memory_budget=None,
                          threads_per_block=THREADS_PER_BLOCK):
    """Simulate replications ``rep0 .. rep0 + nrep - 1`` on the GPU into ``out``.

    ``chunk`` replications are drawn at a time (default: as many as an eighth
    of ``memory_budget`` bytes holds of request arrays); their workspaces are
    then simulated in groups that fit the rest of ``memory_budget`` (default:
    `DEFAULT_MEMORY_FRACTION` of the device's free memory), one launch of
    ``threads_per_block``-thread blocks a group. None of them changes results:
    each replication is keyed by its global index and writes its own row.
    """
    if memory_budget is not None and not int(memory_budget) > 0:
        raise ValueError(f"memory_budget={memory_budget!r}: must be a positive number of bytes, or None (a share "
                         f"of the device's free memory)")
    if not 1 <= int(threads_per_block) <= 1024:
        raise ValueError(f"threads_per_block={threads_per_block!r}: must be 1 to 1024 (CUDA's limit a block)")
    check_cuda_available()
    draw, simulate = _build(K.engine_variant(packed["ipar"]))
    mem = _Arrays()
    with contextlib.ExitStack() as stack:
        if mem.sim:
            # Simulated, the uint64 random-number arithmetic is NumPy scalar
            # arithmetic, which warns when it wraps around (as intended).
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
        else:
            stack.enter_context(_rounded_as_on_the_cpu())
        _run(draw, simulate, mem, packed, k0, k1, rep0, nrep, out, chunk, memory_budget, threads_per_block)
    return out


def _bytes_per_replication(cap):
    """Device bytes of one replication's request arrays (1 float + 6 int64
    columns per request), stream states, count, needs and metrics row."""
    return 8 * (7 * cap + K.N_STREAMS + 3 + K.N_COLUMNS)


def _run(draw, simulate, mem, packed, k0, k1, rep0, nrep, out, chunk, memory_budget, threads_per_block):
    budget = int(memory_budget or mem.default_budget())
    cap = max(int(packed["ipar"][K.I_NUM_REQUESTS]), 1)
    bytes_req = _bytes_per_replication(cap)
    # an eighth of the budget for the request arrays (a user's chunk is capped too):
    # a replication's workspace is tens of times its request arrays, and the
    # replications whose workspaces fit at once are those that run in parallel
    cap_chunk = max(1, budget // (8 * bytes_req))
    chunk = max(1, min(nrep, cap_chunk if chunk is None else min(int(chunk), cap_chunk)))
    tables = [mem.to_device(a) for a in K.scenario_arrays(packed, lat=False)]
    d_lat = mem.to_device(packed["lat"])
    tpb = int(threads_per_block)
    for lo in range(0, nrep, chunk):
        m = min(chunk, nrep - lo)
        requests, nreq, need_h = _draw_chunk(draw, mem, tables, k0, k1, rep0 + lo, m, cap, tpb)
        d_out = _simulate_chunk(simulate, mem, tables[0], tables[1], d_lat, requests, nreq, need_h,
                                max(budget - m * bytes_req, 1), tpb)
        out[lo:lo + m] = mem.to_host(d_out)
    mem.synchronize()


def _draw_chunk(draw, mem, tables, k0, k1, rep0, m, cap, tpb):
    """Draw replications ``rep0 .. rep0 + m - 1`` on the device: their request
    columns ``(arrival, prompt, output, prio, sjfk, pgrp, plen)``, counts, and
    workspace needs (on the host)."""
    state = mem.empty((m, K.N_STREAMS), np.uint64)
    requests = [mem.empty((m, cap), np.float64)] + [mem.empty((m, cap), np.int64) for _ in range(6)]
    nreq = mem.empty(m, np.int64)
    need = mem.empty((m, 2), np.int64)
    draw[-(-m // tpb), tpb](np.int64(rep0), np.int64(m), k0, k1, *tables, state, *requests, nreq, need)
    return requests, nreq, mem.to_host(need)


def _simulate_chunk(simulate, mem, d_ipar, d_fpar, d_lat, requests, nreq, need_h, budget, tpb):
    """Simulate and reduce a drawn chunk, in groups whose workspaces fit
    ``budget`` bytes; the ``(m, N_COLUMNS)`` metrics on the device."""
    d_out = mem.empty((need_h.shape[0], K.N_COLUMNS), np.float64)
    for g0, g1 in _groups(need_h[:, 0], need_h[:, 1], budget):
        off_i = np.concatenate(([0], np.cumsum(need_h[g0:g1, 0]))).astype(np.int64)
        off_f = np.concatenate(([0], np.cumsum(need_h[g0:g1, 1]))).astype(np.int64)
        wi = mem.empty(int(off_i[-1]), np.int64)
        wf = mem.empty(int(off_f[-1]), np.float64)
        simulate[-(-(g1 - g0) // tpb), tpb](np.int64(g0), np.int64(g1 - g0), d_ipar, d_fpar, d_lat, *requests,
                                            nreq, mem.to_device(off_i), mem.to_device(off_f), wi, wf, d_out)
        del wi, wf
    return d_out
