"""The kernel's weighted-sample statistics equal numpy's on the expanded sample.

Inter-token gaps are stored as (value, multiplicity) pairs (one pair per fast
step for all plain decoders) and their percentiles found by selection, not by
sorting; they must be exactly numpy's linear-interpolation percentiles.
"""

import numpy as np
import pytest

from fastsim import kernel as K
from fastsim._numba_options import python_entry

# internal kernel functions have no Python entry of their own
_weighted_stats = python_entry(K.metrics._weighted_stats)
_percentiles = python_entry(K.metrics._percentiles)
_percentile_into = python_entry(K.metrics._percentile_into)


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "many-ties"])
def test_weighted_percentiles_equal_numpy_on_the_expanded_sample(ties):
    rng = np.random.default_rng()
    for _ in range(300):
        m = int(rng.integers(1, 80)) if rng.random() < 0.5 else int(rng.integers(16, 3000))
        v = rng.integers(0, 6, m) * 0.25 if ties else rng.random(m)
        w = rng.integers(1, 6, m) if rng.random() < 0.7 else rng.integers(1, 3000, m)
        x = np.repeat(v, w)
        row = np.zeros(3)
        _weighted_stats(v.copy(), w.copy(), m, row, 0, np.empty(16, np.int64))
        assert row[1] == np.percentile(x, 50) and row[2] == np.percentile(x, 99)
        assert row[0] == pytest.approx(x.mean(), rel=1e-12)


def test_empty_weighted_sample_gives_nan():
    row = np.zeros(3)
    _weighted_stats(np.zeros(2), np.zeros(2, np.int64), 2, row, 0, np.empty(16, np.int64))
    assert np.isnan(row).all()


def test_unweighted_percentiles_by_selection_equal_numpy():
    """TTFT/TPOT/E2E percentiles (unit weights), each alone and for an empty sample."""
    rng = np.random.default_rng()
    hist = np.empty(16, np.int64)
    row = np.zeros(1)
    for _ in range(300):
        m = int(rng.integers(1, 200))
        x = rng.integers(0, 5, m) * 0.5 if m % 2 else rng.random(m)
        for q in (50.0, 90.0, 95.0, 99.0):
            _percentiles(x.copy(), np.ones(m, np.int64), m, hist, q, 0.0, 0.0, 0.0, 1, row, 0)
            assert row[0] == np.percentile(x, q)
    _percentiles(np.zeros(3), np.ones(3, np.int64), 0, hist, 50.0, 0.0, 0.0, 0.0, 1, row, 0)
    assert np.isnan(row[0])


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "many-ties"])
def test_ascending_percentiles_searched_from_the_previous_equal_numpy(ties):
    """Each percentile searched only above the previous one (as the reduction
    does for TTFT p50/p90/p95/p99) is still exactly numpy's."""
    rng = np.random.default_rng()
    for _ in range(300):
        m = int(rng.integers(1, 120))
        v = rng.integers(0, 6, m) * 0.25 if ties else rng.random(m)
        w = rng.integers(1, 4, m) if rng.random() < 0.5 else np.ones(m, np.int64)
        x = np.repeat(v, w)
        qs = np.sort(rng.choice([0.0, 1.0, 25.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0], size=4))
        row = np.zeros(4)
        lo, below = 0, 0
        vv, ww = v.copy(), w.copy()
        for j, q in enumerate(qs):
            lo, below = _percentile_into(vv, ww, m, int(w.sum()), q, lo, below, row, j)
        np.testing.assert_array_equal(row, np.percentile(x, qs))


@pytest.mark.parametrize("shape", ["uniform", "sorted", "reversed", "heavy-tail", "one-heavy", "ties", "all-equal",
                                   "narrow", "two-clusters"])
def test_histogram_narrowed_percentiles_equal_numpy_whatever_the_data(shape):
    """`_percentiles` (equal-width buckets between min and max, then selection
    within the target buckets; plain selection for small or unscalable samples)
    is exactly numpy's for data that crowd one bucket or defeat the buckets.
    Sizes around the paths' boundaries (32 entries; m // 2 buckets below
    twice the scratch's size) come up half the time."""
    rng = np.random.default_rng()
    for _ in range(30):
        m = int(rng.integers(1, 600)) if rng.random() < 0.5 else int(rng.integers(1, 4000))
        v = {"uniform": rng.random(m), "sorted": np.sort(rng.random(m)), "reversed": np.sort(rng.random(m))[::-1],
             "heavy-tail": rng.pareto(0.5, m), "one-heavy": rng.random(m), "ties": rng.integers(0, 4, m) * 1.0,
             "all-equal": np.full(m, 0.3), "narrow": 1.0 + rng.integers(0, 3, m) * 2.0 ** -52,
             "two-clusters": np.where(rng.random(m) < 0.5, rng.random(m), 1e12 + rng.random(m))}[shape].copy()
        w = rng.integers(1, 5, m) if rng.random() < 0.5 else np.ones(m, np.int64)
        if shape == "one-heavy":
            w[int(rng.integers(m))] = 10 * m
        x = np.repeat(v, w)
        qs = np.sort(rng.choice([0.0, 1.0, 25.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0], size=4))
        nq = int(rng.integers(1, 5))   # (one gathering pass serves all nq percentiles)
        row = np.zeros(4)
        _percentiles(v.copy(), w.copy(), m, np.empty(int(rng.choice([16, 40, 256])), np.int64),
                     qs[0], qs[1], qs[2], qs[3], nq, row, 0)
        np.testing.assert_array_equal(row[:nq], np.percentile(x, qs[:nq]))
