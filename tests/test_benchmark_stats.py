"""The statistics the benchmark scripts report (benchmarks/benchmarks/common.py)."""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from benchmarks.common import median_interval  # noqa: E402


def _below(n, k):
    """P(Binomial(n, 1/2) < k), exactly."""
    return sum(math.comb(n, i) for i in range(k)) / 2 ** n


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_the_median_interval_has_its_coverage_and_no_more_order_statistics_than_needed(level):
    for n in range(1, 80):
        values = [float(v) for v in range(n, 0, -1)]   # (unsorted on purpose)
        ci = median_interval(values, level)
        # the largest k with P(B < k) <= (1 - level) / 2: coverage 1 - 2 P(B < k) >= level
        ks = [k for k in range(1, n + 1) if _below(n, k) <= (1 - level) / 2]
        if not ks:
            assert ci is None
            continue
        k = max(ks)
        assert ci == (float(k), float(n + 1 - k))
        assert 1 - 2 * _below(n, k) >= level - 1e-12
        assert k == n or 1 - 2 * _below(n, k + 1) < level   # one more order statistic in would fall short


def test_the_median_interval_needs_six_values_at_95_percent():
    assert median_interval([1.0] * 5) is None
    assert median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)
