"""Shared fixtures.

Compiled kernels are module-level Numba functions, so they compile once per
test session (and are cached on disk under ``NUMBA_CACHE_DIR``, which
``.ci/run`` points at a fresh directory per run). Expensive simulations that
several tests inspect are session-scoped fixtures.
"""

import numpy as np
import pytest

import fastsim

# Multiplier of the standard error used by statistical assertions: a correct
# implementation fails one of them with probability ~1e-6, so the suite passes
# for any seed.
Z = 5.0


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


# Kernel and reference sum a stretch of identical decode steps in different
# orders (the kernel in closed form, `_kernel._stretch_len`), so their times
# differ by rounding: at most about (steps in a stretch) x ulp(t), below
# 1e-11 s in these tests. Any scheduling difference moves a time by at least
# one step (milliseconds), so 1e-9 s still tells a wrong schedule from rounding.
TIME_ATOL = 1e-9


def assert_requests_agree(fast, ref):
    """Per-request frames of the kernel and the reference: every discrete
    column identical, every time equal up to rounding (``TIME_ATOL``)."""
    import pandas as pd

    assert list(fast.columns) == list(ref.columns)
    floats = [c for c in fast.columns if pd.api.types.is_float_dtype(fast[c])]
    pd.testing.assert_frame_equal(fast.drop(columns=floats), ref.drop(columns=floats), check_exact=True)
    for c in floats:
        np.testing.assert_allclose(fast[c].to_numpy(), ref[c].to_numpy(), rtol=0, atol=TIME_ATOL,
                                   equal_nan=True, err_msg=c)


def within(estimate, truth, std_error, z=Z):
    """|estimate - truth| <= z * std_error, with a readable failure message."""
    assert np.isfinite(estimate) and np.isfinite(std_error)
    assert abs(estimate - truth) <= z * std_error, (
        f"estimate {estimate:.6g} differs from {truth:.6g} by {abs(estimate - truth) / std_error:.2f} "
        f"standard errors (allowed {z})")
