"""Shared fixtures.

Compiled kernels are module-level Numba functions, so they compile once per
test session (and are cached on disk under ``NUMBA_CACHE_DIR``, which
``.ci/run`` points at a fresh directory per run). Expensive simulations that
several tests inspect are session-scoped fixtures.
"""

import contextlib

import numpy as np
import pandas as pd
import pytest
from numba.core.dispatcher import Dispatcher

import fastsim
from fastsim import kernel as K

# Multiplier of the standard error used by statistical assertions: a correct
# implementation fails one of them with probability ~1e-6, so the suite passes
# for any seed.
Z = 5.0

#: The synchronous engine of the exact queueing checks: vLLM V1's four rules off
#: (`EngineConfig`'s defaults are vLLM 0.22's, all on).
SYNC = dict(async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False,
            enable_prefix_caching=False)
#: `EngineConfig`'s defaults before they became vLLM 0.22's: the synchronous
#: loop, no null block, and (with ``enable_prefix_caching=True``) the
#: prefix-group cache: the model the hand-computed cases were derived in.
LEGACY = {**SYNC, "block_hash_caching": False}


def legacy_engine(**kw):
    """An `EngineConfig` with `LEGACY`'s switches unless ``kw`` sets them."""
    from fastsim import EngineConfig

    return EngineConfig(**{**LEGACY, **kw})


def t_point(dof):
    """The point of Student's t with ``dof`` degrees of freedom whose upper tail is the normal tail
    beyond Z: the multiplier of a standard error estimated from few replications."""
    from scipy import stats

    return stats.t.isf(stats.norm.sf(Z), dof)


@pytest.fixture(scope="session")
def tight_kv_scenario():
    """Heavy load on a small KV cache: preemptions happen."""
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=16, max_num_batched_tokens=256, block_size=16,
                                    num_gpu_blocks=64),
        workload=fastsim.Workload(arrival_rate=6.0, num_requests=300,
                                  prompt_len=fastsim.LogNormal(median=120, sigma=0.6),
                                  output_len=fastsim.LogNormal(median=90, sigma=0.7)),
    )


@pytest.fixture(scope="session")
def tight_kv_result(tight_kv_scenario):
    return fastsim.replicate(tight_kv_scenario, n_replications=64, seed=11)


def within(estimate, truth, std_error, z=Z):
    """|estimate - truth| <= z * std_error, with a readable failure message."""
    assert np.isfinite(estimate) and np.isfinite(std_error)
    assert abs(estimate - truth) <= z * std_error, (
        f"estimate {estimate:.6g} differs from {truth:.6g} by {abs(estimate - truth) / std_error:.2f} "
        f"standard errors (allowed {z})")


def assert_same(sc, seed, replication=0):
    """The kernel's per-request frame for the stream drawn with ``seed`` and
    ``replication``, after checking it equals the reference simulator's bit
    for bit."""
    stream = fastsim.sample_requests(sc, seed=seed, replication=replication)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    return fast


@contextlib.contextmanager
def kernel_as_python():
    """Every compiled function of the kernel package replaced by its Python
    source in every kernel module (then NumPy bounds-checks every access);
    yields the MonkeyPatch."""
    with pytest.MonkeyPatch.context() as mp:
        for module in (K,) + K.MODULES:
            for name, obj in list(vars(module).items()):
                if isinstance(obj, Dispatcher):
                    mp.setattr(module, name, obj.py_func)
        yield mp


def patch_kernel(mp, name, value):
    """Bind ``name`` to ``value`` in every kernel module that binds it
    (a function is looked up in the globals of the module that calls it)."""
    found = False
    for module in (K,) + K.MODULES:
        if name in vars(module):
            mp.setattr(module, name, value)
            found = True
    assert found, f"no kernel module binds {name!r}"
