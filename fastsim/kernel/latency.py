"""The step-time model: the duration of an engine step from its batch
composition (docs/engine-model.md, "Step time").
"""

from __future__ import annotations

from .._numba_options import njit_noalloc

@njit_noalloc
def _plain_step(base, dec_cost, b):
    """Duration of a step of ``b`` decoders and nothing else. dec_cost[0] and
    dec_cost[1] are 0.0, so these are the bits of a step's
    ``d = base; if b > 1: d += dec_cost[b]`` (with 0.0 prefill and context terms)."""
    return base + dec_cost[b]
