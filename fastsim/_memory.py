"""How much memory a run needs, checked before anything is allocated.

The engine (``kernel.replica._simulate``) works in two flat arrays whose sizes
``kernel.workspace._ws_dims`` and ``kernel.workspace._ws_sizes`` state, computed in int64
inside the kernel with no overflow check, and the kernel itself has no
bounds checks: a product that wraps negative leaves the workspace too small
and the engine writes past it (a segfault on valid input). This
module runs the kernel's own statement of the layout
(``kernel.workspace._int_sizes``, ``_float_sizes``) as Python, in exact
integers (`ws_sizes`, `layout`), and bounds the data-dependent dimensions
from the scenario's laws (`workspace_bound`), so that a scenario whose
sizes do not fit int64 is refused with a ValueError naming its parameters
before any kernel runs.

Then `check_run_memory` estimates what a run keeps resident (`estimate`:
per thread, the request arrays and the workspace, of which only the
segments the scenario's options write count, in the pages they touch
(`resident_segments`, `granule`: huge pages where NumPy gets them); a
fleet's replica rows (`_fleet_parts`); the result table and its DataFrame
copy) and compares it with the memory available (`available_memory`:
``FASTSIM_MEMORY_LIMIT``, else the cgroup limit and ``MemAvailable``);
too much is a ValueError naming the parameter that costs most, and the
estimate. The estimate is exact where the layout fixes the sizes and
estimated where a run decides them (the inter-token gap samples,
`gap_entries`; a block pool's caching structures, counted whole);
``tests/test_memory_estimate.py`` holds it against measured peak resident
memory. A fleet whose replica rows could not even be reserved is refused
too (`check_fleet_memory`), and a workspace that a drawn replication grows
beyond what the machine can reserve by `CheckedBuffers` (a ValueError,
where NumPy would raise MemoryError or the OS would kill the process).
"""

from __future__ import annotations

import functools
import math
import os
import weakref

import numpy as np

from . import _pages
from . import kernel as K
from ._distributions import KIND_EMPIRICAL, KIND_FIXED, KIND_LOGNORMAL, KIND_REPLAY, KIND_UNIFORM
from ._validation import MAX_TOKENS

#: Largest value of the kernel's int64 arithmetic.
INT64_MAX = 2 ** 63 - 1
#: Share of the available memory a run may plan to use (the rest: Python,
#: NumPy, pandas, Numba's compiled code, and the estimate's slack).
MEMORY_SHARE = 0.8
#: Inter-token gap entries a request is assumed to write (`gap_entries`)
#: when the latency model has no context term: they are weighted samples,
#: one per distinct step duration, so far fewer than the tokens, which only
#: bound them (the arrays are sized by that bound, but pages never written
#: cost address space only). Measured with `kernel.replica._simulate`'s
#: entry count: 0.2 to 4.4 per request over 20,000 requests (A10G default
#: model, rates 1 to 40/s, outputs 128 and lognormal up to a 609-token
#: mean); 0.1 to 1.8 over the scenarios of tests/test_memory_estimate.py.
#: With a context term every step's duration differs: up to 87 per request
#: (128-token outputs at 1 req/s), so there the estimate counts the output
#: tokens.
GAP_ENTRIES_PER_REQUEST = 5

_UNITS = {"": 1, "B": 1, "K": 2 ** 10, "KB": 2 ** 10, "KIB": 2 ** 10, "M": 2 ** 20, "MB": 2 ** 20,
          "MIB": 2 ** 20, "G": 2 ** 30, "GB": 2 ** 30, "GIB": 2 ** 30, "T": 2 ** 40, "TB": 2 ** 40,
          "TIB": 2 ** 40}


def format_bytes(b) -> str:
    """``1.5 GiB``: a byte count as a person reads it."""
    b = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(b) < 1024 or unit == "PiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.3g} {unit}"
        b /= 1024
    return f"{b:.3g} EiB"   # (not reached)


def parse_memory_limit(text: str) -> int:
    """Bytes from ``FASTSIM_MEMORY_LIMIT``'s text: an integer or a number with
    a unit (``4G``, ``512MiB``, ``1.5GB``: binary units)."""
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = math.nan
    if unit not in _UNITS or not math.isfinite(value) or value <= 0:
        raise ValueError(f"FASTSIM_MEMORY_LIMIT must be a byte count > 0, optionally with a unit "
                         f"(K, M, G, T; e.g. 4G or 512MiB), got {text!r}")
    return int(value * _UNITS[unit])


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory():
    """``(bytes, where the figure comes from)``: the memory a run may use, or
    ``(None, reason)`` when it cannot be known (then nothing is refused).

    ``FASTSIM_MEMORY_LIMIT`` (bytes, or with a unit: ``4G``) when set; else
    the smaller of ``MemAvailable`` (``/proc/meminfo``; ``os.sysconf``'s
    available pages elsewhere), the room left under a cgroup v2 limit
    (``memory.max`` less ``memory.current``: a container's limit, which
    ``/proc/meminfo`` does not show) and under the process's address-space
    limit (``ulimit -v``).
    """
    env = os.environ.get("FASTSIM_MEMORY_LIMIT", "").strip()
    if env:
        return parse_memory_limit(env), "FASTSIM_MEMORY_LIMIT"
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
            if pages > 0 and size > 0:
                found.append((pages * size, "available physical pages (os.sysconf)"))
        except (ValueError, OSError, AttributeError):
            pass
    limit, current = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and current is not None:
        found.append((max(limit - current, 0), "the cgroup's memory.max less memory.current"))
    room = _address_space_room()
    if room is not None:
        found.append((room, "the process's address-space limit (ulimit -v) less its size"))
    if not found:
        return None, "unknown (set FASTSIM_MEMORY_LIMIT to check runs against a limit)"
    return min(found)


def _address_space_room():
    """Bytes of address space left under ``RLIMIT_AS`` (``ulimit -v``), or
    None without such a limit: an allocation beyond it fails with
    MemoryError whatever memory the machine has."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft == resource.RLIM_INFINITY or soft <= 0:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (ImportError, OSError, ValueError, IndexError):
        return None
    return None


def reservable_memory():
    """Bytes of memory and swap this machine has (``MemTotal + SwapTotal``;
    physical pages by ``os.sysconf`` elsewhere), or None: the most one
    allocation may reserve. (Pages reserved but never written cost address
    space only, which is why a workspace may exceed `available_memory`; but
    one larger than the machine is refused by the OS under its default
    overcommit heuristic, or, with overcommit always on, would be a gamble.)"""
    total = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "SwapTotal"):
                    total[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if "MemTotal" in total:
        return total["MemTotal"] + total.get("SwapTotal", 0)
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size if pages > 0 and size > 0 else None
    except (ValueError, OSError, AttributeError):
        return None


# ------------------------------------------------------------------------------
# The engine's workspace, in exact integers

def ws_sizes(n, bs, cap, ncnt, nheld, nitl, nbp=0, nbt=0):
    """The workspace's int64 and float64 entries for ``n`` requests, block
    size ``bs`` and the dimensions `kernel.workspace._ws_dims` gives: the
    kernel's own statement of the layout (`kernel.workspace._ws_sizes`)
    run as Python, in Python integers (no wrap-around)."""
    return _python_ws_sizes()(int(n), int(bs), int(cap), int(ncnt), int(nheld), int(nitl), int(nbp), int(nbt))


@functools.lru_cache(maxsize=None)
def _python_ws_sizes():
    from ._numba_options import python_version

    return python_version(K.workspace._ws_sizes)


def gap_room(nitl):
    """The gap samples' room of a replica handed its requests (a fleet's) for
    a bound of ``nitl`` (`kernel.workspace._gap_room`, run as Python: exact
    integers)."""
    return _python_gap_room()(int(nitl))


@functools.lru_cache(maxsize=None)
def _python_gap_room():
    from ._numba_options import python_version

    return python_version(K.workspace._gap_room)


def ws_dims(n, prompt, output, pgrp, plen, ipar, handed=False, capacity=None):
    """``kernel.workspace._ws_dims`` of given requests, in Python integers: (seats,
    prefix-cache entries, prefix references, gap samples, most prefix blocks
    of a request, blocks of the block pool, entries of the requests' block lists);
    ``handed``: of a replica handed its requests (`kernel.workspace._handed_dims`);
    ``capacity``: of a fleet's compact row of that many of them
    (`kernel.workspace._compact_dims`)."""
    bs = int(ipar[K.I_BLOCK_SIZE])
    cap = max(1, min(int(ipar[K.I_MAX_NUM_SEQS]), n))
    kv_tokens = int(ipar[K.I_NUM_GPU_BLOCKS]) * bs
    warmup = int(ipar[K.I_WARMUP])
    out = np.minimum(np.asarray(output[warmup:n], np.int64), kv_tokens)   # each < 2**40
    n_tok = int(out.sum()) if out.size < 2 ** 22 else int(out.sum(dtype=object))
    ngrp = jmax = nheld = 0
    if int(ipar[K.I_CACHING]) == 1 and n:
        g, f = np.asarray(pgrp[:n], np.int64), np.asarray(plen[:n], np.int64) // bs
        grouped = g >= 0
        if grouped.any():
            ngrp = int(g[grouped].max()) + 1
            jmax = int(f[grouped].max())
            nheld = int(f[grouped].sum(dtype=object))
    nbp = nbt = 0
    if int(ipar[K.I_CACHING]) == 1 and int(ipar[K.I_BLOCK_HASH]) >= 1:
        nbp = int(ipar[K.I_NUM_GPU_BLOCKS])
        tok = np.asarray(prompt[:n], dtype=object) + np.asarray(output[:n], dtype=object)
        nbt = int(sum(min((int(x) + bs - 1) // bs, nbp) for x in tok))
    nitl = max(n_tok, 1)
    handed = handed or capacity is not None   # (a compact row is a replica handed its requests)
    if capacity is not None and capacity < n:
        cap = max(1, min(int(ipar[K.I_MAX_NUM_SEQS]), capacity))
        nitl = _python_gap_share()(int(capacity), n, nitl)
    return cap, max(ngrp * jmax, 1), max(nheld, 1), gap_room(nitl) if handed else nitl, jmax, nbp, nbt


def law_max(law) -> int:
    """The largest length a law can draw (a lognormal's: the kernel's cap, 2**40)."""
    hi = 1
    for _, kind, p0, p1, values, _ in law._components():
        if kind == KIND_FIXED:
            top = int(p0)
        elif kind == KIND_UNIFORM:
            top = int(p1)
        elif kind in (KIND_EMPIRICAL, KIND_REPLAY):
            top = int(np.max(values))
        elif kind == KIND_LOGNORMAL and p1 == 0:
            top = int(math.ceil(p0))
        else:
            top = MAX_TOKENS
        hi = max(hi, min(top, MAX_TOKENS))
    return hi


#: `_lengths` of each workload alive (a workload is frozen; a run's memory
#: check asks for its lengths on every call, a trace's over all its rows).
_LENGTHS = weakref.WeakKeyDictionary()


def _lengths(workload):
    """(largest prompt, largest output, mean output, mean prompt) the workload can draw."""
    try:
        return _LENGTHS[workload]
    except (KeyError, TypeError):
        pass
    got = _lengths_of(workload)
    try:
        _LENGTHS[workload] = got
    except TypeError:   # (not weakly referable)
        pass
    return got


def _lengths_of(workload):
    if workload.lengths is not None:
        p, o = workload.lengths.prompt_len, workload.lengths.output_len
        return int(p.max()), int(o.max()), float(o.mean()), float(p.mean())
    p_hi, o_hi = law_max(workload.prompt_len), law_max(workload.output_len)
    return p_hi, o_hi, _law_mean(workload.output_len, o_hi), _law_mean(workload.prompt_len, p_hi)


def _law_mean(law, hi):
    """A length law's mean, at most ``hi`` (its largest draw); ``hi`` where
    the mean overflows (a lognormal of an extreme sigma)."""
    try:
        return min(float(law.mean()), float(hi))
    except (OverflowError, ValueError):
        return float(hi)


def workspace_bound(scenario):
    """Upper bounds of `ws_dims` for any replication of ``scenario``, and the
    parameters each depends on: ``{dimension: (bound, parameters)}`` with
    the dimensions ``n`` (requests), ``ncnt`` (the dense prefix table:
    groups x prefix blocks), ``nheld`` (prefix references), ``nitl``
    (gap samples: the output tokens of measured requests, each capped at
    the KV cache), ``cap`` (seats), ``nbp`` (the block pool's blocks) and
    ``nbt`` (the entries of the requests' block lists)."""
    e, w = scenario.engine, scenario.workload
    n = w.num_requests
    bs = e.block_size
    kv = e.num_gpu_blocks * bs
    p_hi, o_hi, _, _ = _lengths(w)
    nreq = "num_requests" if w.users is None else "users (num_requests = users x per-user cap)"
    dims = {"n": (n, nreq), "cap": (max(1, min(e.max_num_seqs, n)), "max_num_seqs"),
            "nitl": (gap_room(max((n - w.warmup_requests) * min(o_hi, kv), 1)),
                     f"{nreq}, output_len and num_gpu_blocks * block_size")}
    ncnt = nheld = 1
    if e.enable_prefix_caching and w.prefix_groups > 0:
        jmax = min(law_max(w.prefix_len), p_hi - 1) // bs
        ncnt = max(w.prefix_groups * jmax, 1)
        nheld = max(n * jmax, 1)
    dims["ncnt"] = (ncnt, "prefix_groups, prefix_len and block_size (the dense prefix table: groups x "
                          "prefix blocks)")
    dims["nheld"] = (nheld, f"{nreq}, prefix_len and block_size (prefix references: requests x prefix blocks)")
    nbp = nbt = 0
    if e.enable_prefix_caching and e.block_hash_caching:
        nbp = e.usable_gpu_blocks
        nbt = n * min(-(-(p_hi + o_hi) // bs), nbp)
    dims["nbp"] = (nbp, "num_gpu_blocks (the block pool of caching by block hash)")
    dims["nbt"] = (nbt, f"{nreq}, prompt_len, output_len and block_size (each request's block list)")
    return dims


def check_int64(scenario):
    """Raise ValueError, naming the parameters, when a replication of
    ``scenario`` could need workspace sizes beyond int64 (where the
    kernel's arithmetic would wrap around and the engine write past its
    workspace)."""
    d = workspace_bound(scenario)
    bs = scenario.engine.block_size
    need_i, need_f = ws_sizes(d["n"][0], bs, d["cap"][0], d["ncnt"][0], d["nheld"][0], d["nitl"][0],
                              d["nbp"][0], d["nbt"][0])
    if max(need_i, need_f) * 8 <= INT64_MAX:
        return
    # the term that overflows: the largest of the data-dependent ones (as the layout counts them)
    weight = {"ncnt": 3, "nbp": 14}
    name = max(("ncnt", "nheld", "nitl", "n", "nbp", "nbt"), key=lambda k: d[k][0] * weight.get(k, 1))
    bound, params = d[name]
    advice = {"ncnt": "reduce prefix_groups or prefix_len, or raise block_size",
              "nheld": "reduce num_requests or prefix_len, or raise block_size",
              "nitl": "reduce num_requests or output_len (its largest draw), or the KV cache "
                      "(num_gpu_blocks * block_size)",
              "n": "reduce num_requests",
              "nbp": "reduce num_gpu_blocks",
              "nbt": "reduce num_requests, prompt_len or output_len, or raise block_size"}[name]
    raise ValueError(f"this scenario's engine workspace is too large for the kernel's 64-bit sizes: "
                     f"{params} allow up to {bound} entries (workspace up to {format_bytes(8 * max(need_i, need_f))}); "
                     f"{advice}")


def _typical_prefix(scenario, n=None):
    """(dense prefix table entries, prefix references of ``n`` requests:
    ``num_requests`` by default) estimated: the groups
    at their number, the prefix blocks at the prefix law's mean (its bound
    for an unbounded law would be 2**40 tokens: a lognormal's tail, which
    the draws reach only as often as the law says)."""
    e, w = scenario.engine, scenario.workload
    if not (e.enable_prefix_caching and w.prefix_groups > 0):
        return 1, 1
    p_hi, _, _, _ = _lengths(w)
    jmax = max(1, int(math.ceil(min(w.prefix_len.mean(), p_hi - 1))) // e.block_size)
    return max(w.prefix_groups * jmax, 1), max((w.num_requests if n is None else n) * jmax, 1)


# ------------------------------------------------------------------------------
# What a replication keeps resident

#: Bytes of a memory page.
PAGE = 4096
#: NumPy advises the kernel to back arrays of this many bytes or more with
#: transparent huge pages (where the kernel's THP mode is ``madvise``).
HUGEPAGE_MIN_ARRAY = 4 * 2 ** 20

#: The segments of the workspace (`kernel.workspace`'s ``WI_*`` and ``WF_*``
#: names, in their order; their sizes: `layout`).
WI_SEGMENTS = tuple(sorted((k for k in vars(K.workspace) if k.startswith("WI_") and k != "WI_HEAD"),
                           key=lambda k: getattr(K.workspace, k)))
WF_SEGMENTS = tuple(sorted((k for k in vars(K.workspace) if k.startswith("WF_") and k != "WF_HEAD"),
                           key=lambda k: getattr(K.workspace, k)))

#: Segments the engine writes only when the scenario uses an option (by
#: name: `_options`); the others it may write in any run. A workspace is
#: ``np.empty``: the pages of a segment never written cost address space
#: only. (`tests/test_memory_estimate.py` fills a workspace with a sentinel
#: and checks that no run writes a segment this table leaves out.)
WRITTEN_ONLY_WITH = {
    "WI_NSWAP": "full", "WI_CTOK": "full", "WI_FPRE": "full", "WI_HOFF": "full", "WI_PRIVATE": "full",
    "WI_NENT": "full", "WF_SWAPPED": "full", "WF_SKEY": "full",   # the full engine (`replica.engine_variant`)
    "WI_SWAPQ": "swap", "WF_SWAPPED_SINCE": "swap",               # preemption_mode="swap"
    "WF_KEY": "keyed",                                            # a keyed waiting queue (priority, SJF, aging)
}
#: The inter-token gap samples: of their room (the output tokens, the
#: layout's bound) a run writes far fewer (`gap_entries`).
GAP_SEGMENTS = ("WI_ITL_W", "WF_ITL_V")
#: Segments by the part of the estimate they belong to (the rest: the engine workspace).
PREFIX_TABLE_SEGMENTS = ("WI_CNT", "WI_LPREV", "WI_LNEXT")
BLOCK_POOL_SEGMENTS = ("WI_QPREV", "WI_QNEXT", "WI_REF", "WI_BHASH", "WI_DPREV", "WI_DNEXT",
                       "WI_HUSED", "WI_HKEY", "WI_HHEAD", "WI_HTAIL")


@functools.lru_cache(maxsize=None)
def _python_layout():
    from ._numba_options import python_version

    return python_version(K.workspace._int_sizes), python_version(K.workspace._float_sizes)


@functools.lru_cache(maxsize=256)   # (a run's memory check asks for the same dimensions on every call)
def layout(n, bs, cap, ncnt, nheld, nitl, nbp=0, nbt=0):
    """``({segment: entries} of wi, of wf)`` for the dimensions
    `kernel.workspace._ws_dims` gives, in the layout's order: the kernel's
    own statement of the layout (`kernel.workspace._int_sizes`,
    `_float_sizes`) run as Python, in Python integers."""
    int_sizes, float_sizes = _python_layout()
    si = int_sizes(int(n), int(bs), int(cap), int(ncnt), int(nheld), int(nitl), int(nbp), int(nbt))
    sf = float_sizes(int(n), int(cap), int(nitl))
    return dict(zip(WI_SEGMENTS, si)), dict(zip(WF_SEGMENTS, sf))


@functools.lru_cache(maxsize=None)
def _huge_page():
    """The transparent huge page's bytes where NumPy's large arrays get them
    (THP ``always``, or ``madvise`` and NumPy's advice on), else None."""
    thp = _pages.thp_mode()
    if thp is None:
        return None
    mode, size = thp
    try:
        from numpy._core.multiarray import _get_madvise_hugepage
    except ImportError:
        try:   # (NumPy 1)
            from numpy.core.multiarray import _get_madvise_hugepage
        except ImportError:
            def _get_madvise_hugepage():
                return True   # (the larger figure: an estimate that errs high)
    if mode == "always" or (mode == "madvise" and _get_madvise_hugepage()):
        return size
    return None


def granule(nbytes, workspace=False):
    """The bytes in which an array of ``nbytes`` becomes resident: a huge
    page (`_huge_page`) for a large one where they apply, else a page;
    ``workspace``: a thread's engine workspace (`_pages.huge_pages`: on
    huge pages from `_pages.HUGE_WORKSPACE_MIN` bytes where the system
    grants them on request)."""
    if workspace:
        huge = _pages.thp_size()
        return huge if huge is not None and nbytes >= _pages.HUGE_WORKSPACE_MIN else PAGE
    huge = _huge_page()
    return huge if huge is not None and nbytes >= HUGEPAGE_MIN_ARRAY else PAGE


#: Rows of a fleet's workspaces `_written_bytes` walks (more: scaled from these).
ROWS_WALKED = 256


def _written_bytes(sizes, written, unit, leave_out=(), rows=1):
    """Resident bytes of an array of ``rows`` rows (one by default), each
    laid out as ``sizes`` (``{segment: entries}``, in order), whose segments
    have their first ``written[segment]`` entries written (those named in
    ``leave_out`` not counted): the pages of ``unit`` bytes (the array's
    `granule`) that the written stretches touch, the array starting on a
    page (of many rows, the first `ROWS_WALKED` counted, the rest in proportion)."""
    stretches, o = [], 0
    for k, s in sizes.items():
        w = written.get(k, 0)
        if w > 0 and k not in leave_out:
            stretches.append((8 * o, 8 * (o + w)))
        o += s
    pages, last, walked = 0, -1, min(rows, ROWS_WALKED)
    for r in range(walked):
        base = 8 * o * r
        for a, b in stretches:
            first, end = (base + a) // unit, (base + b - 1) // unit
            if end > last:
                pages += end - max(first, last + 1) + 1
                last = end
    return pages * unit * rows // walked


def _options(scenario):
    """The options of `WRITTEN_ONLY_WITH` the scenario may use. "full": it
    may run the full engine, by the scenario's fields, before anything is
    packed: never False where `replica.engine_variant` picks the full
    engine (prefix caching counts even where the stream may turn out to
    share no prefix: an estimate may count a segment that is not written,
    never leave out one that is; tests/test_memory_estimate.py)."""
    engine, w = scenario.engine, scenario.workload
    lat = scenario.latency._params()
    full = (engine.scheduler == "static" or engine.priority_preemption or engine.preemption_mode == "swap"
            or engine.enable_prefix_caching or engine.async_scheduling or w.max_concurrency is not None
            or w.sessions is not None or lat[K.L_ROOF] != 0.0 or lat[K.L_NOISE] != 0.0)
    keyed = engine.policy != "fcfs" or engine.priority_aging_s is not None or engine.priority_preemption
    return {"full": full, "swap": engine.preemption_mode == "swap", "keyed": keyed}


def gap_entries(scenario, n):
    """The inter-token gap samples a replication of ``n`` requests writes,
    estimated: `GAP_ENTRIES_PER_REQUEST` per measured request when the
    latency model has no context term, else the mean output tokens (each
    step's duration differs; never more than the output tokens)."""
    w = scenario.workload
    tokens = _output_tokens(scenario, n)
    if scenario.latency.ctx_per_token_s > 0:
        return tokens
    return min(tokens, GAP_ENTRIES_PER_REQUEST * max(n - w.warmup_requests, 0) + 1)


def _output_tokens(scenario, n):
    """The output tokens of the measured requests of ``n``, at the mean output length (each capped at the KV cache)."""
    e, w = scenario.engine, scenario.workload
    _, _, o_mean, _ = _lengths(w)
    return max(1, int(min(o_mean, e.kv_capacity_tokens) * max(n - w.warmup_requests, 0)))


def _gap_room(scenario, n, handed=False):
    """The gap samples' room (the layout's ``nitl``) of ``n`` requests at the
    mean output length; ``handed``: of a fleet's replica (`gap_room`)."""
    tokens = _output_tokens(scenario, n)
    return gap_room(tokens) if handed else tokens


def _dims(scenario, n, handed=False, capacity=None):
    """The layout's dimensions (`kernel.workspace._ws_dims`'s, with ``n``
    and the block size) of a replication of ``n`` requests, estimated: the
    gap samples' room and the block lists at the mean lengths, the prefix
    dimensions at `_typical_prefix`; ``handed``: of a fleet's replica
    (`kernel.workspace._handed_dims`); ``capacity``: of a fleet's compact
    row of that many of the ``n`` requests (`kernel.workspace._compact_dims`;
    its per-request columns the first of the dimensions)."""
    e, w = scenario.engine, scenario.workload
    bs = e.block_size
    ncnt, nheld = _typical_prefix(scenario, n)
    nbp = nbt = 0
    if e.enable_prefix_caching and e.block_hash_caching:
        _, _, o_mean, p_mean = _lengths(w)
        nbp = e.usable_gpu_blocks
        nbt = n * min(int(math.ceil((p_mean + o_mean) / bs)) + 1, nbp)
    m = n if capacity is None else min(capacity, n)
    if m < n:
        nitl = gap_room(_python_gap_share()(m, n, _output_tokens(scenario, n)))
    else:
        nitl = _gap_room(scenario, n, handed or capacity is not None)
    return m, bs, max(1, min(e.max_num_seqs, m)), ncnt, nheld, nitl, nbp, nbt


@functools.lru_cache(maxsize=None)
def _python_gap_share():
    from ._numba_options import python_version

    return python_version(K.workspace._gap_share)


def resident_segments(scenario, n=None):
    """``({segment: entries} of wi, of wf)`` a replication of ``scenario``
    (``n`` requests: ``num_requests`` by default) writes, estimated: the
    layout's sizes (`layout`) at `_dims`, less the segments its options
    never write (`WRITTEN_ONLY_WITH`), the gap samples at `gap_entries`.
    (The engine writes each segment from its start.)"""
    n = scenario.workload.num_requests if n is None else n
    used = _options(scenario)
    si, sf = layout(*_dims(scenario, n))
    gaps = gap_entries(scenario, n) if n else 0
    out = []
    for seg in (si, sf):
        out.append({k: (gaps if k in GAP_SEGMENTS else v) for k, v in seg.items()
                    if used.get(WRITTEN_ONLY_WITH.get(k), True)})
    return tuple(out)


def _workspace_bytes(scenario, n_layout, n_written, rows=1, small_pages=False, capacity=None):
    """Resident bytes of ``rows`` workspaces laid out for ``n_layout``
    requests, each written by a replica of ``n_written`` requests (a
    fleet's rows: laid out for the whole stream, on ordinary pages,
    `_pages.small_pages`; or compact, for ``capacity`` of its requests,
    on huge pages where they apply); in one allocation each for ``wi``
    and ``wf`` (their `granule`)."""
    total = 0
    handed = small_pages   # (a fleet's rows, laid out for its replicas, `kernel.workspace._handed_dims`)
    dims = layout(*_dims(scenario, n_layout, handed, capacity))
    huge = not small_pages
    if capacity is not None:   # (compact fleet rows: on huge pages up to a size, `_fleet.huge_rows`)
        from ._fleet import huge_rows
        huge = huge_rows(rows * max(sum(sizes.values()) for sizes in dims), True)
    for sizes, written in zip(dims, resident_segments(scenario, n_written)):
        unit = granule(8 * rows * sum(sizes.values()), workspace=True) if huge else PAGE
        total += _written_bytes(sizes, written, unit, rows=rows)
    return total


def _column_bytes(entries, columns=1):
    """Resident bytes of ``columns`` arrays of ``entries`` int64 or float64 entries, each written in full."""
    return columns * (8 * entries + granule(8 * entries)) if entries else 0


#: `estimate`'s parts for each scenario alive, by (replications, threads): a
#: scenario is frozen, and a run's memory check asks again on every call.
_ESTIMATES = weakref.WeakKeyDictionary()


def estimate(scenario, n_replications=0, threads=1):
    """Bytes a run keeps resident, by part: ``[(bytes, part, parameter), ...]``.

    Per thread: the request arrays (7 columns of ``num_requests``) and the
    engine's workspace (`_workspace_bytes`: the layout's exact sizes, of
    the segments the scenario's options write, the inter-token gap
    samples estimated, in whole pages), its dense prefix table and its block
    pool parts of their own; for the run: the result table
    (``n_replications`` x the kernel's columns, float64) and its DataFrame
    copy. A fleet (`Scenario.fleet`): `_fleet_parts`."""
    key = (n_replications, threads)
    try:
        return list(_ESTIMATES[scenario][key])
    except (KeyError, TypeError):
        pass
    parts = _estimate(scenario, n_replications, threads)
    try:
        _ESTIMATES.setdefault(scenario, {})[key] = tuple(parts)
    except TypeError:   # (not weakly referable)
        pass
    return parts


def _estimate(scenario, n_replications, threads):
    w = scenario.workload
    n = w.num_requests
    nreq = "num_requests" if w.users is None else "users"
    parts = []
    if n_replications:
        ncol = K.N_COLUMNS + (len(K.FLEET_COLUMNS) if scenario.fleet is not None else 0)
        parts.append((2 * 8 * n_replications * ncol, "result tables", "n_replications"))
    threads = max(1, min(threads, n_replications or 1))
    parts.append((threads * _column_bytes(n, 7), "request arrays", nreq))
    if scenario.fleet is not None:
        return parts + [(threads * b, part, param) for b, part, param in _fleet_parts(scenario)]
    whole = _workspace_bytes(scenario, n, n)
    # (the parts of their own at their entries' bytes: they may share pages with the rest)
    wi, _ = resident_segments(scenario, n)
    prefix, pool = (8 * sum(wi[k] for k in names if k in wi) for names in (PREFIX_TABLE_SEGMENTS,
                                                                            BLOCK_POOL_SEGMENTS))
    parts.append((threads * (whole - prefix - pool), "engine workspace", nreq))
    if scenario.engine.enable_prefix_caching:
        parts.append((threads * prefix, "prefix-cache table", "prefix_groups"))
        if scenario.engine.block_hash_caching:
            parts.append((threads * pool, "block pool", "num_gpu_blocks"))
    return parts


def _fleet_replicas(fleet) -> int:
    """The replica rows a fleet's run holds: its replicas (a mixed fleet's
    listed ones), an autoscaler's most, a disaggregated server's two pools."""
    if hasattr(fleet, "prefill") and hasattr(fleet, "decode"):   # (`fastsim.Disaggregated`)
        return _fleet_replicas(fleet.prefill) + _fleet_replicas(fleet.decode)
    scaler = getattr(fleet, "autoscaler", None)
    if scaler is not None:
        return int(scaler.max_replicas)
    return int(getattr(fleet, "n_replicas", fleet.replicas))


def _fleet_parts(scenario):
    """A fleet's parts of one thread (`_fleet._FleetWorker`, each pool's of
    a disaggregated server): each replica a row of workspaces, compact
    (`kernel.cluster.compact_capacity`, on huge pages up to a size) or laid
    out for the whole stream (an autoscaled fleet's; on ordinary pages), of
    which it writes each segment's first entries as a replica of its share
    of the requests would (the routers balance the load: an equal share);
    the rows' streams; and the workspace of the stream's merged results
    (`cluster._reduce_fleet`: the per-request columns, gap samples and
    reduction scratch)."""
    from .kernel.cluster import compact_capacity, table_size
    w, fleet = scenario.workload, scenario.fleet
    n = w.num_requests
    if hasattr(fleet, "prefill") and hasattr(fleet, "decode"):   # (`fastsim.Disaggregated`: two pools)
        pools = [(_fleet_replicas(fleet.prefill), True), (_fleet_replicas(fleet.decode), True)]
    else:   # (an autoscaled fleet's rows are for the whole stream)
        pools = [(_fleet_replicas(fleet), getattr(fleet, "autoscaler", None) is None)]
    records = _pool_records(scenario) if pools[0][1] else [None] * len(pools)
    rows = streams = 0
    for (nrep, compact), ipars in zip(pools, records):
        share = -(-n // nrep)
        m = compact_capacity(n, nrep, ipars) if compact else n   # (`_fleet._one`'s rows)
        if m < n:
            rows += _workspace_bytes(scenario, n, share, rows=nrep, capacity=m)
        else:
            rows += _workspace_bytes(scenario, n, share, rows=nrep, small_pages=True)
        # the replicas' streams: rows of m entries (in the first entries of an allocation for the whole stream)
        # in two arrays (arrival; the six integer columns), each replica writing its share of its rows; the
        # stream's owner and local index columns
        streams += sum(_written_bytes({"row": m}, {"row": share}, granule(8 * c * nrep * n), rows=c * nrep)
                       for c in (1, 6)) + _column_bytes(n, 2)
    nrep = _fleet_replicas(fleet)
    merged = _trace_map_bytes(scenario, n)
    # the routers' tables of prefix groups (`cluster.table_size`: the weighted router's, each group's replicas)
    for f in ((fleet.prefill, fleet.decode) if hasattr(fleet, "prefill") else (fleet,)):
        merged += 8 * max(table_size(int(w.prefix_groups or 0), _fleet_replicas(f), K.ROUTER_CODES[f.router]), 1)
    if w.closed_loop:   # (the fleet's client: its scratch, `kernel.fleet_client.closed_scratch`, a quarter spare)
        merged += 16 * (n + n // 4 + 2 * nrep)
    for sizes, written in zip(layout(*_dims(scenario, n, True)), resident_segments(scenario, n)):
        head = K.workspace.WI_HEAD if next(iter(sizes)).startswith("WI") else K.workspace.WF_HEAD
        keep = {k: v for k, v in written.items() if getattr(K.workspace, k) < head
                or k in GAP_SEGMENTS or k in ("WI_HIST", "WF_ACC")}
        merged += _written_bytes(sizes, keep, granule(8 * sum(sizes.values())))
    return [(merged + streams + 8 * nrep * (K.N_IPAR + K.N_LOAD), "fleet's streams and results", "num_requests"),
            (rows, "replica workspaces", "replicas")]


def _trace_map_bytes(scenario, n):
    """Where a replayed trace's block identities key caching by block hash
    (`_fleet.trace_hashing`): each hashing pool's map of them into its
    replicas (`kernel.trace_blocks`: `TMAP_ROWS` int64 rows of `cluster.tmap_size`
    slots for the stream's full prompt blocks, all written at every
    replication); else 0."""
    from ._fleet import _is, running_engines, trace_hashing
    from .kernel.cluster import tmap_size
    from .kernel.trace_blocks import TMAP_ROWS
    if not trace_hashing(scenario):
        return 0
    fleet = scenario.fleet
    hashing = [e.enable_prefix_caching and e.block_hash_caching for _, e in running_engines(scenario)]
    pools = sum(hashing) if _is(fleet, "Disaggregated") else 1
    bs = scenario.engine.block_size
    blocks = math.ceil(n * float(np.mean(np.asarray(scenario.workload.request_trace.prompt_len) // bs)))
    # (`_fleet._FleetWorker.buffers` allocates a quarter more than the first replication asks)
    return pools * 8 * TMAP_ROWS * tmap_size(blocks + blocks // 4)


def _pool_records(scenario):
    """Each compact pool's integer records (a row per replica of a fleet, one
    for each pool of a disaggregated server: its replicas' own), as its run
    packs them (`_pack.pack_scenario`; a mixed fleet's replicas,
    `_fleet.fleet_members`; a disaggregated server's prefill and decode
    pools, ``Disaggregated.pool_scenarios``): what
    `kernel.cluster.compact_capacity` reads (the warm-up, sessions, caching
    by block hash)."""
    from ._fleet import fleet_members
    from ._pack import pack_scenario
    fleet = scenario.fleet
    if hasattr(fleet, "pool_engines"):
        # (each pool as its own scenario, unvalidated: ``pool_scenarios`` builds and checks Scenarios, which
        # `engine_variants`' copies, a pool's engine as the scenario's, need not pass; only the records count)
        return [pack_scenario(_unchecked(scenario, engine=e, fleet=pool))["ipar"][None]
                for pool, e in zip((fleet.prefill, fleet.decode), fleet.pool_engines(scenario.engine))]
    return [fleet_members(scenario, pack_scenario(scenario))[0]]


def fleet_address_space(scenario):
    """Bytes of address space one thread of a fleet's run reserves in its
    larger allocation (``wi``'s or ``wf``'s rows, `_fleet._FleetWorker`):
    each of the ``replicas`` rows a workspace laid out for the whole stream
    (the gap samples' room at the mean output tokens, rounded as a
    replica handed its requests rounds it), with the quarter to
    spare the worker grows by. (Pages never written cost address space
    only; but an allocation larger than the machine's memory and swap is
    refused by the OS's default overcommit heuristic.)"""
    n = scenario.workload.num_requests
    si, sf = layout(*_dims(scenario, n, True))
    return _fleet_replicas(scenario.fleet) * 8 * max(sum(si.values()), sum(sf.values())) * 5 // 4


def _unchecked(scenario, **fields):
    """A shallow copy of a validated ``scenario`` with ``fields`` set, not
    validated again (a pool's or a listed replica's engine as the
    scenario's: the memory checks read ``scenario.engine``)."""
    import copy

    out = copy.copy(scenario)
    for name, value in fields.items():
        object.__setattr__(out, name, value)
    return out


def engine_variants(scenario):
    """The scenario once for each distinct engine that serves its requests
    (`_fleet.running_engines`: a listed fleet's replicas, a disaggregated
    server's pools), that engine as its ``engine`` (a shallow copy: the
    scenario was validated): the checks below size every replica as each in
    turn and keep the largest, a bound for a mixed fleet. (They read
    ``scenario.engine``; a listed fleet's was sized alone, its replicas'
    ignored, in stop 66's review.)"""
    from ._fleet import running_engines
    engines = []
    for _, e in running_engines(scenario):
        if e not in engines:
            engines.append(e)
    if engines == [scenario.engine]:
        return [scenario]
    return [_unchecked(scenario, engine=e) for e in engines]


def _largest(estimates):
    return max(estimates, key=lambda parts: sum(b for b, _, _ in parts))


def check_fleet_memory(scenario, n_replications, threads, what="replicate"):
    """`check_int64`; then refuse a fleet whose replicas' rows cannot be
    reserved (`fleet_address_space` beyond this machine's memory and swap,
    where NumPy would raise MemoryError), or whose `estimate` exceeds the
    memory available (`check_memory`)."""
    variants = engine_variants(scenario)
    for v in variants:
        check_int64(v)
    space, limit = max(fleet_address_space(v) for v in variants), reservable_memory()
    if limit is not None and space > limit:
        f = scenario.fleet
        from ._fleet import _is
        raise ValueError(f"{what}: a fleet of {_fleet_replicas(f)} replicas over {scenario.workload.num_requests} "
                         f"requests reserves an array of about {format_bytes(space)} (each replica a "
                         f"workspace laid out for the whole stream), more than this machine's memory and swap "
                         f"({format_bytes(limit)}); reduce "
                         f"{'prefill or decode' if _is(f, 'Disaggregated') else 'replicas'} or num_requests")
    return check_memory(_largest([estimate(v, n_replications, threads) for v in variants]), what)


def check_memory(parts, what="this run"):
    """Raise ValueError when the parts (`estimate`) add up to more than
    `MEMORY_SHARE` of `available_memory`, naming the costliest part's
    parameter and the estimate."""
    total = sum(b for b, _, _ in parts)
    avail, source = available_memory()
    if avail is None or total <= MEMORY_SHARE * avail:
        return total
    b, part, param = max(parts)
    detail = ", ".join(f"{p} {format_bytes(x)}" for x, p, _ in sorted(parts, reverse=True) if x > 0)
    raise ValueError(f"{what} needs about {format_bytes(total)} of memory ({detail}), more than "
                     f"{MEMORY_SHARE:.0%} of the {format_bytes(avail)} available ({source}); "
                     f"the {part} ({format_bytes(b)}) grows with {param}: reduce {param}"
                     + (" or n_threads" if part in ("request arrays", "engine workspace") else ""))


def check_run_memory(scenario, n_replications=0, threads=1, what="this run"):
    """`check_int64`, then `check_memory` of the `estimate` (a fleet's
    replications: `check_fleet_memory`); the estimate in bytes."""
    if scenario.fleet is not None and n_replications:
        return check_fleet_memory(scenario, n_replications, threads, what)
    variants = engine_variants(scenario)
    for v in variants:
        check_int64(v)
    return check_memory(_largest([estimate(v, n_replications, threads) for v in variants]), what)


def check_stream_memory(n, prompt, output, pgrp, plen, ipar):
    """For `simulate_requests`: raise ValueError when the workspace of the
    given requests has sizes beyond int64, or needs more memory than is
    available (exact sizes: the requests are known)."""
    cap, ncnt, nheld, nitl, _, nbp, nbt = ws_dims(n, prompt, output, pgrp, plen, ipar)
    need_i, need_f = ws_sizes(n, int(ipar[K.I_BLOCK_SIZE]), cap, ncnt, nheld, nitl, nbp, nbt)
    if max(need_i, need_f) * 8 > INT64_MAX:
        big = "prefix_group x prefix_len (the dense prefix table)" if 3 * ncnt > nitl else "output_len"
        raise ValueError(f"requests: the engine workspace for these {n} requests is too large for the "
                         f"kernel's 64-bit sizes ({need_i} int64 entries); reduce {big}")
    # zeroed (the stream's workspace is written in full): all of it is resident
    parts = [(8 * need_i + 8 * need_f, "engine workspace",
              "output_len" if nitl >= 3 * ncnt else "prefix_group and prefix_len"),
             (8 * 16 * n, "request and result columns", "the number of requests")]
    return check_memory(parts, "simulate_requests")


class CheckedBuffers(K.ChunkBuffers):
    """`kernel.drivers.ChunkBuffers` whose workspace growth is refused with a
    ValueError (naming the parameters that size it) where NumPy cannot
    reserve it, or where the kernel's sizes wrapped around, instead of a
    MemoryError or a crash."""

    def __init__(self, num_requests, scenario):
        super().__init__(num_requests)
        self.scenario = scenario

    def grow(self):
        need_i, need_f = (int(x) for x in self.need)
        if need_i < 0 or need_f < 0:
            raise ValueError(f"a replication asked for a workspace beyond the kernel's 64-bit sizes "
                             f"({need_i}, {need_f}); reduce num_requests, output_len or prefix_len")
        limit = reservable_memory()
        try:
            if limit is not None and 8 * (need_i + need_f) > limit:
                raise MemoryError
            super().grow()
        except (MemoryError, ValueError):   # (NumPy: ValueError "array is too big" beyond intp)
            e = self.scenario.engine
            raise ValueError(f"a replication needs an engine workspace of {format_bytes(8 * (need_i + need_f))}, "
                             f"more than this machine can reserve (its memory and swap): its inter-token gap "
                             f"samples are bounded "
                             f"by the measured requests' output tokens, each capped at the KV cache "
                             f"(num_gpu_blocks * block_size = {e.num_gpu_blocks * e.block_size}); reduce "
                             f"num_requests, output_len or num_gpu_blocks") from None
