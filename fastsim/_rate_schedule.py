"""Time-varying arrival rates: `RateSchedule`, a piecewise-constant or
piecewise-linear rate lambda(t), optionally repeating (a day's shape), from
which `Workload(rate_schedule=...)` draws a non-homogeneous Poisson process
(``docs/engine-model.md``, "Time-varying arrival rate"; the kernel's draw is
`kernel.workload._schedule_arrivals`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._validation import check_bool, check_choice, check_float

__all__ = ["RateSchedule"]

SHAPES = ("constant", "linear")


#: The most bins `RateSchedule.from_arrivals` makes (a knot each).
MAX_BINS = 1e7


@dataclass(frozen=True, eq=False)
class RateSchedule:
    """An arrival rate that changes over time, lambda(t) requests/s.

    Parameters
    ----------
    times : array_like of float
        The knots (s): the first 0, strictly increasing.
    rates : array_like of float
        The rate at each knot (requests/s, finite, >= 0), as many as ``times``.
    shape : {"constant", "linear"}
        ``"constant"``: lambda(t) = ``rates[k]`` on ``[times[k], times[k+1])``;
        ``"linear"``: lambda(t) interpolates linearly between the knots. After
        the last knot the rate stays at ``rates[-1]`` (0: arrivals stop).
    repeat : bool
        Repeat the schedule with period ``times[-1]`` (a day shape, say):
        lambda(t) = lambda(t mod period). Needs two knots or more and
        ``rates[-1] == rates[0]`` (the rate at the period's end is the
        rate at its start).

    Notes
    -----
    Arrivals are the points of a Poisson process of intensity lambda(t),
    drawn exactly by inversion: with S_i the points of a unit-rate Poisson
    process (sums of unit exponentials, one uniform each from the arrival
    stream), a_i = Lambda^{-1}(S_i), Lambda(t) the integral of lambda over
    [0, t] (closed form in each piece: linear, or quadratic for a linear
    rate). So the number of arrivals in [t0, t1) is Poisson with mean
    ``cumulative(t1) - cumulative(t0)``, independently over disjoint windows.
    """

    times: object
    rates: object
    shape: str = "constant"
    repeat: bool = False

    def __post_init__(self):
        s = object.__setattr__
        check_choice("shape", self.shape, SHAPES)
        s(self, "repeat", check_bool("repeat", self.repeat))
        t = np.array(self.times, dtype=np.float64, ndmin=1) if _numeric(self.times) else None
        if t is None or t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or t[0] != 0.0 \
                or np.any(np.diff(t) <= 0):
            raise ValueError(f"times must be a non-empty 1-D sequence of finite knots (s), the first 0, strictly "
                             f"increasing, got {self.times!r}")
        r = np.array(self.rates, dtype=np.float64, ndmin=1) if _numeric(self.rates) else None
        if r is None or r.shape != t.shape or not np.all(np.isfinite(r)) or np.any(r < 0):
            raise ValueError(f"rates must be finite rates (requests/s, >= 0), one per knot ({t.size}), "
                             f"got {self.rates!r}")
        if self.repeat and (t.size < 2 or r[-1] != r[0]):
            raise ValueError(f"repeat=True needs two knots or more and rates[-1] == rates[0] (the period is "
                             f"times[-1]), got times={t.tolist()!r}, rates={r.tolist()!r}")
        t.setflags(write=False)
        r.setflags(write=False)
        s(self, "times", t)
        s(self, "rates", r)
        cum = self._knot_integrals()
        if not (cum[-1] > 0 or (not self.repeat and r[-1] > 0)):
            raise ValueError(f"rates must be positive somewhere (a schedule with no arrivals), got "
                             f"{r.tolist()!r}")

    @classmethod
    def from_arrivals(cls, arrival_s, bin_s: float, *, scale: float = 1.0, repeat: bool = False,
                      shape: str = "constant") -> "RateSchedule":
        """The rate of recorded arrivals per bin of ``bin_s`` seconds (a
        trace's hourly shape, say), times ``scale``, a knot at each bin's
        start: constant over each bin, or (``shape="linear"``) interpolated
        between the bins' rates. With ``repeat`` the bins make one period."""
        try:
            a = np.asarray(arrival_s, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"arrival_s must be a non-empty 1-D array of finite times (s), got "
                             f"{arrival_s!r}") from None
        bin_s = check_float("bin_s", bin_s, low=0, low_open=True)
        scale = check_float("scale", scale, low=0, low_open=True)
        if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
            raise ValueError(f"arrival_s must be a non-empty 1-D array of finite times, got shape {a.shape}")
        a = a - a.min()
        span = float(a.max())
        if span / bin_s > MAX_BINS:   # (1e-9 s bins over 1e6 s asked for 7 PiB)
            raise ValueError(f"bin_s must be at least the arrivals' span / {MAX_BINS:g} = {span / MAX_BINS:.3g} s "
                             f"(a knot a bin), got {bin_s!r} over {span:.6g} s")
        nb = max(1, int(math.ceil(span / bin_s)) if span > 0 else 1)
        counts = np.bincount(np.minimum((a / bin_s).astype(np.int64), nb - 1), minlength=nb)
        rates = counts * (scale / bin_s)
        times = np.arange(nb + (1 if repeat else 0)) * bin_s
        if repeat:
            rates = np.append(rates, rates[0])
        return cls(times, rates, shape=shape, repeat=repeat)

    # --- the rate and its integral ------------------------------------------------
    def _knot_integrals(self) -> np.ndarray:
        """Lambda at each knot; the kernel's and the reference's draws read these exact sums."""
        t, r = self.times, self.rates
        cum = np.zeros(t.size)
        acc = 0.0
        for k in range(t.size - 1):
            w = float(t[k + 1]) - float(t[k])
            acc = acc + (w * float(r[k]) if self.shape == "constant" else w * (float(r[k]) + float(r[k + 1])) * 0.5)
            cum[k + 1] = acc
        return cum

    @property
    def period_s(self) -> float | None:
        """The period (``times[-1]``) of a repeating schedule; None otherwise."""
        return float(self.times[-1]) if self.repeat else None

    def rate(self, t) -> np.ndarray:
        """lambda(t) (requests/s) at the times ``t``."""
        t = np.asarray(t, dtype=np.float64)
        if self.repeat:
            t = np.mod(t, self.times[-1])
        k = np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, self.times.size - 1)
        if self.shape == "constant" or self.times.size == 1:
            return self.rates[k]
        return np.interp(t, self.times, self.rates)

    def cumulative(self, t) -> np.ndarray:
        """Lambda(t), the expected number of arrivals in [0, t) (exact)."""
        t = np.asarray(t, dtype=np.float64)
        cum = self._knot_integrals()
        base = np.zeros_like(t)
        if self.repeat:
            p = self.times[-1]
            c = np.floor(t / p)
            base = c * cum[-1]
            t = t - c * p
        k = np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, self.times.size - 1)
        u = t - self.times[k]
        r0 = self.rates[k]
        if self.shape == "constant" or self.times.size == 1:
            return base + cum[k] + r0 * u
        last = k >= self.times.size - 1
        k1 = np.minimum(k + 1, self.times.size - 1)
        width = np.where(last, 1.0, self.times[k1] - self.times[k])
        slope = np.where(last, 0.0, (self.rates[k1] - r0) / width)
        return base + cum[k] + r0 * u + 0.5 * slope * u * u

    def expected_count(self, t0, t1) -> np.ndarray:
        """The expected arrivals in [t0, t1): Lambda(t1) - Lambda(t0)."""
        return self.cumulative(t1) - self.cumulative(t0)

    def mean_rate(self, t0: float, t1: float) -> float:
        """The mean rate over [t0, t1)."""
        return float(self.expected_count(t0, t1)) / (t1 - t0)

    def _table(self) -> np.ndarray:
        """The kernel's table (`kernel.layout.ARRIVAL_SCHEDULE`): shape code
        (0 constant, 1 linear), period (0: none), the knots, the rates, Lambda
        at the knots."""
        return np.concatenate(([float(self.shape == "linear"), self.period_s or 0.0], self.times, self.rates,
                               self._knot_integrals()))

    def __repr__(self):
        return (f"RateSchedule(times={self.times.tolist()!r}, rates={self.rates.tolist()!r}, "
                f"shape={self.shape!r}, repeat={self.repeat!r})")


def _numeric(x) -> bool:
    try:
        a = np.asarray(x)
    except Exception:   # (ragged input)
        return False
    return a.dtype.kind in "iuf"
