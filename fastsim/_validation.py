"""Input validation shared by every public entry point.

Each checker names the parameter, the offending value and what is allowed,
e.g. ``max_num_seqs must be an integer >= 1, got 0``. Nothing is clipped
silently: a value is either accepted as given or rejected.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np


#: Largest token count (lengths, budgets, the KV cache): the kernel caps a
#: drawn length at 2**40, which is exact while the KV cache holds fewer tokens
#: (such a request never fits and is rejected as too long either way).
MAX_TOKENS = 2 ** 40
#: Largest other count: headroom in the kernel's int64 arithmetic.
MAX_COUNT = 2 ** 62
#: Largest time scale (seconds, ~31,700 years) of a run: a step's longest
#: duration and the arrivals' mean span. The clock is a double: at 1e12 s its
#: spacing is 1.2e-4 s, and far beyond, times overflow to inf and metrics to
#: NaN (arrival_rate=1e-320, base_s=1e308 did).
MAX_CLOCK_S = 1e12


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value, *, low: int | None = None, high: int | None = None,
              optional: bool = False):
    """Return ``value`` as ``int`` if it is an integer in ``[low, high]``.

    A technical upper bound (``MAX_TOKENS`` or more: what the kernel's int64
    arithmetic allows) is named only to a value above it."""
    if value is None and optional:
        return None
    if high is not None and high >= MAX_TOKENS and not (_is_int(value) and int(value) > high):
        high = None
    allowed = "an integer"
    if low is not None and high is not None:
        allowed += f" in [{low}, {high}]"
    elif low is not None:
        allowed += f" >= {low}"
    elif high is not None:
        allowed += f" <= {high}"
    if optional:
        allowed += " or None"
    if not _is_int(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


def _bound(x) -> str:
    """A bound as written in a message: whole numbers in full (2**40 is 1099511627776, not 1.09951e+12)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 2 ** 53 else f"{x:g}"


def check_float(name: str, value, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False, optional: bool = False):
    """Return ``value`` as a finite ``float`` inside the given interval (a
    technical upper bound, >= ``MAX_TOKENS``, named only to a value above it)."""
    if value is None and optional:
        return None
    if (high is not None and high >= MAX_TOKENS
            and not (isinstance(value, numbers.Real) and not isinstance(value, bool) and value > high)):
        high = None
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {_bound(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {_bound(high)}")
    allowed = "a finite number" + (" " + " and ".join(parts) if parts else "")
    if optional:
        allowed += " or None"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    value = float(value)
    bad = not math.isfinite(value)
    if low is not None:
        bad |= value <= low if low_open else value < low
    if high is not None:
        bad |= value >= high if high_open else value > high
    if bad:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


def check_choice(name: str, value, choices):
    """Return ``value`` if it is one of ``choices`` (strings)."""
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_bool(name: str, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_probabilities(name: str, values, size: int | None = None) -> np.ndarray:
    """Return a float array of probabilities that are >= 0 and sum to 1."""
    try:
        raw = np.asarray(values) if not isinstance(values, str) else None
        # (complex: NumPy would drop the imaginary part, or raise TypeError)
        arr = raw.astype(float) if raw is not None and raw.dtype.kind in "biuf" else None
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of probabilities, got {values!r}")
    if size is not None and arr.size != size:
        raise ValueError(f"{name} must have {size} entries (one per component), got {arr.size}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be finite and >= 0, got {values!r}")
    if not math.isclose(float(arr.sum()), 1.0, rel_tol=0, abs_tol=1e-9):
        raise ValueError(f"{name} must sum to 1, got {values!r} (sum {arr.sum():.12g})")
    return arr


def check_int_array(name: str, values, *, low: int = 1, high: int = MAX_TOKENS,
                    allow_empty: bool = False) -> np.ndarray:
    """Return a non-empty (or, with ``allow_empty``, possibly empty) 1-d int64
    array whose entries are integers in [low, high]."""
    arr = np.asarray(values)
    if allow_empty and arr.ndim == 1 and arr.size == 0:
        return arr.astype(np.int64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of integers >= {low}, "
                         f"got shape {arr.shape}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            bad = arr[~np.isfinite(arr) | (arr != np.round(arr))][0]
            raise ValueError(f"{name} must contain integers >= {low}, got {bad!r}")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must contain integers >= {low}, got dtype {arr.dtype}")
    if np.any(arr > high):           # (before the cast: a uint64 above int64's range would wrap)
        raise ValueError(f"{name} must contain integers in [{low}, {high}], got {int(arr.max())}")
    arr = arr.astype(np.int64)
    if np.any(arr < low):
        raise ValueError(f"{name} must contain integers >= {low}, got {int(arr.min())}")
    return arr


#: A first arrival this late (11.6 days) is taken to be an absolute timestamp.
LATE_START_S = 1e6


def check_arrival_times(name: str, values, *, stacklevel: int = 3, allow_empty: bool = False) -> np.ndarray:
    """Return a non-empty (or, with ``allow_empty``, possibly empty) 1-d
    float64 array of finite, non-negative, non-decreasing arrival times;
    warn when they look like absolute timestamps (the first at or after
    `LATE_START_S`)."""
    raw = np.asarray(values)
    if allow_empty and raw.ndim == 1 and raw.size == 0:
        return np.zeros(0)
    if raw.ndim != 1 or raw.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence, got shape {raw.shape}")
    numbers_only = raw.dtype.kind in "iuf" or (raw.dtype.kind == "O" and all(
        isinstance(x, numbers.Real) and not isinstance(x, bool) for x in raw))
    if not numbers_only:
        raise ValueError(f"{name} must hold numbers (seconds), got dtype {raw.dtype}")
    t = np.ascontiguousarray(raw, dtype=np.float64)
    bad = ~np.isfinite(t) | (t < 0)
    bad[1:] |= np.diff(t) < 0
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name} must be finite, >= 0 and non-decreasing, got {float(t[i])!r} at index {i}"
                         + (f" (after {float(t[i - 1])!r})" if i > 0 and np.isfinite(t[i]) and t[i] >= 0 else ""))
    if t[0] >= LATE_START_S:
        warnings.warn(f"{name} start at {t[0]:.6g} s, which looks like an absolute timestamp: times are "
                      f"measured from the start of the run, so the engine idles until the first arrival, "
                      f"the throughput window includes that wait, and the clock's rounding grows with its "
                      f"value (ulp(t) = {np.spacing(t[0]):.2g} s here); subtract the first arrival time",
                      UserWarning, stacklevel=stacklevel)
    return t


def check_metric_names(metrics, allowed):
    """``None`` (all of ``allowed``) or a non-empty list of names from ``allowed``; a tuple."""
    if metrics is None:
        return tuple(allowed)
    if (isinstance(metrics, str) or not hasattr(metrics, "__iter__")
            or (isinstance(metrics, np.ndarray) and metrics.ndim != 1)):
        raise ValueError(f"metrics must be a list of metric names, got {metrics!r}")
    metrics = tuple(str(m) if isinstance(m, str) else m for m in metrics)   # (np.str_ as str)
    if not metrics:
        raise ValueError("metrics must be a non-empty list of metric names")
    for m in metrics:
        check_choice("metric", m, allowed)
    return metrics


#: Scheduler options of ``docs/engine-model.md`` that the Numba kernel does not
#: implement yet, with their "off" values (the reference simulator,
#: ``backend="reference"``, implements them all). Remove an entry when the
#: kernel implements that option.
KERNEL_PENDING_OPTIONS: dict = {}


def check_kernel_supports(engine) -> None:
    """Raise ``NotImplementedError`` naming the first option of ``engine`` (an
    ``EngineConfig``) that is on but not implemented by the Numba kernel yet
    (:data:`KERNEL_PENDING_OPTIONS`). The reference backend supports them."""
    if (getattr(engine, "async_scheduling", False) and getattr(engine, "enable_prefix_caching", False)
            and not getattr(engine, "block_hash_caching", False)):
        raise NotImplementedError("async_scheduling=True with the synthetic prefix-group cache "
                                  "(enable_prefix_caching=True, block_hash_caching=False) is not implemented "
                                  "by the numba backend (allowed there: block_hash_caching=True, vLLM's cache); "
                                  "use backend='reference'")
    for name, off in KERNEL_PENDING_OPTIONS.items():
        value = getattr(engine, name, off)
        if value != off:
            raise NotImplementedError(
                f"{name}={value!r} is not implemented by the numba backend yet "
                f"(allowed there: {name}={off!r}); use backend='reference'")
