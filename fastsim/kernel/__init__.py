"""The replication kernel: the CPU engine, one module per concept.

What is simulated is specified in ``docs/engine-model.md``; this package is
one implementation of that text (``fastsim/_reference.py`` is another,
written independently for clarity, and the tests hold the two to each
other bit for bit). ``docs/architecture.md`` is the reading guide: which
module holds a request, a KV block, a step and a replication.

The kernel sees arrays and scalars only. It does no validation: the Python
layer (``fastsim/_replicate.py``; ``fastsim/_pack.py``) validates the scenario, packs it into the
parameter vectors whose slots `layout` names, and allocates the outputs.

Randomness is counter-based (`rng`): replication ``r`` of a run keyed by
``(key0, key1)`` draws from independent SplitMix64 streams keyed by
``(key0, key1, r, purpose)``, one stream per purpose. A replication's
workload therefore depends only on the seed, its index and the workload
laws: never on the thread that runs it, on how replications are chunked, or
on the engine settings (common random numbers across engine configurations
come for free).

Memory is bounded by (threads x requests per replication): the engine
allocates nothing (its state is carved out of a `workspace`; its functions
are compiled without Numba's runtime, `njit_noalloc`); each CPU thread
reuses one workspace for its replications and reduces each replication to
one row of `metrics`. The same functions run as CUDA device functions
(``fastsim/_cuda.py`` compiles every function of `namespace`), one GPU
thread per replication.

The engine is compiled in two versions (`replica.engine_variant`): the
common one, in which Numba prunes static batching, active priority
preemption, swap preemption, prefix caching, async scheduling, closed
loops, sessions, the roofline and per-step noise before typing (a shorter
cold start), and the full one.

Modules, in reading order: `layout` (parameter slots, codes, streams,
metric columns), `rng`, `workload`, `waiting_queue`, `kv_cache`,
`prefix_cache`, `block_pool` (prefix caching by block hash), `arrivals`, `scheduler`, `decoders`, `latency`, `stretch`,
`accounting`, `workspace`, `replica` (the engine loop), `metrics` (the
reduction), `drivers` (chunks of replications, from Python).

Numba's disk cache checks the source file of the function it stores only;
every function of this package is cached under a stamp over all of its
source files (`fastsim._numba_options.kernel_source_stamp`), so an edit of
any module invalidates every cached kernel function.
"""

from __future__ import annotations

from . import (accounting, arrivals, block_pool, callees, decoders, drivers, kv_cache, latency, layout,  # noqa: F401
               metrics, pipeline, prefix_cache, replica, rng, scheduler, stretch, waiting_queue, workload, workspace)
from .drivers import (SCENARIO_ARRAYS, ChunkBuffers, _run_chunk, chunk_runner, draw_workload,  # noqa: F401
                      engine_pointers, run_chunk, run_on, run_records, scenario_arrays, simulate_stream,
                      trace_window)
from .layout import *  # noqa: F401,F403  (the shared vocabulary: slots, codes, columns)
from .metrics import _reduce  # noqa: F401
from .replica import WHOLE_RUN, _simulate, engine_variant  # noqa: F401
from .workload import _draw_workload  # noqa: F401
from .workspace import (WF_FINISH, WF_FIRST, WF_HEAD, WF_LAST, WF_SWAPPED, WI_BLOCKS,  # noqa: F401
                        WI_CTOK, WI_G, WI_HEAD, WI_K, WI_NPRE, WI_NSWAP, WI_ONES, WI_STATUS, _ws_need,
                        _fleet_sizes, _ws_need_compact, _ws_need_handed)

#: The kernel's modules, in reading order.
MODULES = (layout, rng, workload, waiting_queue, kv_cache, block_pool, prefix_cache, arrivals, scheduler, decoders,
           pipeline, latency, stretch, accounting, workspace, replica, metrics, drivers)


def namespace():
    """Every name defined or imported at the top of a kernel module, in one
    dict: the globals a kernel function may refer to. Names are unique
    across the package (a name bound by two modules is the same object), so
    one namespace serves every function (``fastsim/_cuda.py`` rebinds each
    function to its CUDA version in a copy of it)."""
    ns = {}
    for module in MODULES:
        for name, obj in vars(module).items():
            if name.startswith("__"):
                continue
            if name in ns and ns[name] is not obj:
                raise RuntimeError(f"fastsim.kernel: {name!r} names two different objects "
                                   f"({module.__name__} and another module)")
            ns[name] = obj
    return ns

