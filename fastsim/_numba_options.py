"""The one place where fastsim's Numba options live.

``cache=True`` stores compiled kernels on disk (``NUMBA_CACHE_DIR`` selects
where), so only the first run on a machine pays for compilation.
``error_model="numpy"`` lets division by zero give inf/nan instead of raising
(and keeps loops vectorisable); the kernels never rely on either.
``fastmath`` stays off: it would let LLVM reorder floating-point sums, and
results must be bit-identical whatever the thread count.
"""

from __future__ import annotations

import numba

NUMBA_OPTIONS = {"cache": True, "error_model": "numpy", "nogil": True}


def njit(*args, **kwargs):
    """``numba.njit`` with fastsim's options (keyword arguments override)."""
    options = {**NUMBA_OPTIONS, **kwargs}
    if args and callable(args[0]):
        return numba.njit(**options)(args[0])
    return numba.njit(*args, **options)

