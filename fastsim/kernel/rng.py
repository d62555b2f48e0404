"""Counter-based random numbers: SplitMix64 streams keyed by
(key0, key1, replication, purpose), uniform, normal (ziggurat), gamma and
Poisson draws. A replication's draws depend only on its keys, never on the
thread that runs it or on how replications are chunked.
"""

from __future__ import annotations

import math

import numpy as np

from .._numba_options import njit_noalloc

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


_TWO53 = 1.0 / 9007199254740992.0


# Counter-based random numbers (SplitMix64 streams)

@njit_noalloc
def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit_noalloc
def _seed_streams(key0, key1, rep, state):
    """Key one stream per purpose by (key0, key1, replication, purpose)."""
    base = _mix64(np.uint64(key0) ^ _mix64(np.uint64(rep) * _GOLDEN + np.uint64(key1)))
    for s in range(state.size):
        state[s] = _mix64(base + np.uint64(s + 1) * np.uint64(0xD1B54A32D192ED03))


@njit_noalloc
def _uniform(state, s):
    """A double in (0, 1) from stream ``s`` (never 0 or 1, so logs are safe)."""
    state[s] = state[s] + _GOLDEN
    z = _mix64(state[s])
    return (float(z >> np.uint64(11)) + 0.5) * _TWO53


# Standard normal variates by the ziggurat method (Marsaglia and Tsang, 2000):
# f(x) = exp(-x^2 / 2) on x >= 0 is covered by 256 layers of equal area V.
# Layer 0 is the rectangle [0, R] x [0, f(R)] with the tail x > R (as if it
# were a rectangle of width V / f(R)); layer i >= 1 is [0, x_i] x [f(x_i),
# f(x_{i+1})]. One 64-bit output gives the layer (bits 0-7), the sign (bit 8)
# and a 53-bit position (bits 11-63); a point left of the next layer's edge
# lies under f and is taken at once (almost every draw), the others take a
# wedge test or, in layer 0, the tail. (Box-Muller spends two outputs, a log,
# a sqrt and a cos per variate.)

_ZIG_R = 3.6541528853610088   # x_1, for which the 256th layer ends at x = 0 (Marsaglia and Tsang)


def _ziggurat_tables(r=_ZIG_R, layers=256):
    """(k, w, f) for `_normal`: k[i] = floor(2^53 * x_{i+1} / x_i) (take a
    53-bit position m at once if m < k[i]), w[i] = x_i / 2^53 (the variate
    is m * w[i]) and f[i] = f(x_i), i = 0 .. layers (x_0 = V / f(R) is layer
    0's width, x_layers = 0). Plain Python, run once at import."""
    def f(x):
        return math.exp(-0.5 * x * x)

    v = r * f(r) + math.sqrt(math.pi / 2.0) * math.erfc(r / math.sqrt(2.0))   # a layer's area
    x = [v / f(r), r]
    while len(x) < layers:
        x.append(math.sqrt(-2.0 * math.log(v / x[-1] + f(x[-1]))))
    x.append(0.0)
    x = np.array(x)
    k = np.array([int(x[i + 1] / x[i] * 2.0 ** 53) for i in range(layers)], dtype=np.uint64)
    return k, x[:layers] * 2.0 ** -53, np.exp(-0.5 * x * x)


_ZIG_K, _ZIG_W, _ZIG_F = _ziggurat_tables()


@njit_noalloc
def _normal_tail(state, s):
    """A standard normal variate conditioned on being > R (Marsaglia, 1964):
    R + a, a ~ Exp(rate R), accepted if 2b > a^2, b ~ Exp(1)."""
    while True:
        a = -math.log(_uniform(state, s)) / _ZIG_R
        b = -math.log(_uniform(state, s))
        if b + b > a * a:
            return _ZIG_R + a


@njit_noalloc
def _normal_edge(state, s, i, x):
    """`_normal` past a layer's inner rectangle: in layer 0, |Z| from the
    tail; else ``x`` if the wedge test takes it, -1.0 if it does not."""
    if i == 0:
        return _normal_tail(state, s)
    # under f with probability (f(x) - f(x_i)) / (f(x_{i+1}) - f(x_i))
    if _ZIG_F[i] + _uniform(state, s) * (_ZIG_F[i + 1] - _ZIG_F[i]) < math.exp(-0.5 * x * x):
        return x
    return -1.0


@njit_noalloc(inline="llvm")
def _normal(state, s):
    """A standard normal variate from stream ``s`` (the ziggurat method).
    Inlined where it is called; the rare edge cases are a call."""
    while True:
        state[s] = state[s] + _GOLDEN
        z = _mix64(state[s])
        i = np.int64(z & np.uint64(255))
        neg = (z >> np.uint64(8)) & np.uint64(1) == np.uint64(1)
        m = z >> np.uint64(11)
        x = float(m) * _ZIG_W[i]
        if m >= _ZIG_K[i]:
            x = _normal_edge(state, s, i, x)
        if x >= 0.0:
            return -x if neg else x


@njit_noalloc
def _gamma(state, s, shape):
    """Gamma(shape, 1) by Marsaglia and Tsang (boosted for shape < 1)."""
    if shape < 1.0:
        g = _gamma(state, s, shape + 1.0)
        return g * _uniform(state, s) ** (1.0 / shape)
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = _normal(state, s)
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = _uniform(state, s)
        if u < 1.0 - 0.0331 * x * x * x * x:
            return d * v
        if math.log(u) < 0.5 * x * x + d * (1.0 - v + math.log(v)):
            return d * v


@njit_noalloc
def _poisson(state, s, mean, cap):
    """Poisson(mean) by sequential inversion (one uniform), truncated at ``cap``."""
    # Split large means so that exp(-mean) cannot underflow (a sum of
    # independent Poissons is Poisson).
    total = 0
    left = mean
    while left > 0.0:
        m = min(left, 500.0)
        left -= m
        u = _uniform(state, s)
        p = math.exp(-m)
        c = p
        k = 0
        while u > c and k < cap:
            k += 1
            p *= m / k
            c += p
        total += k
    return min(total, cap)


# A counter-based normal variate: the same ziggurat, its 64-bit outputs from
# counters rather than a stream's state, so that draw k of a key is a function
# of the key and k alone (`latency._step_noise`). The first output is
# _mix64(c) and serves almost every draw (layer, sign and position, as in
# `_normal`); a draw that falls outside its layer's inner rectangle continues
# on a stream of its own, started at _mix64(c2) (c2: a second counter of the
# draw's, given by the caller) and advanced by the golden gamma as `_uniform`.
# Its f(x_i) are Python's math.exp of the same x_i (recovered exactly from
# `_ZIG_W`, a power-of-two scaling): the reference simulator computes the
# tables again in plain Python, and NumPy's exp may differ in the last bit.

_ZIG_FX = np.array([math.exp(-0.5 * x * x) for x in [float(w) * 2.0 ** 53 for w in _ZIG_W] + [0.0]])

@njit_noalloc
def _normal_at_edge(z, c2):
    """`_normal_at` past the first output ``z``'s inner rectangle: the
    ziggurat's wedge test, tail and retries (as `_normal`, `_normal_edge` and
    `_normal_tail` state them), their uniforms and further outputs taken in
    turn from the stream started at ``_mix64(c2)``."""
    s = _mix64(c2)
    while True:
        i = np.int64(z & np.uint64(255))
        neg = (z >> np.uint64(8)) & np.uint64(1) == np.uint64(1)
        m = z >> np.uint64(11)
        x = float(m) * _ZIG_W[i]
        if m >= _ZIG_K[i]:
            if i == 0:   # the tail beyond R (Marsaglia, 1964)
                while True:
                    s = s + _GOLDEN
                    a = -math.log((float(_mix64(s) >> np.uint64(11)) + 0.5) * _TWO53) / _ZIG_R
                    s = s + _GOLDEN
                    b = -math.log((float(_mix64(s) >> np.uint64(11)) + 0.5) * _TWO53)
                    if b + b > a * a:
                        x = _ZIG_R + a
                        break
            else:   # the wedge: under f with probability (f(x) - f(x_i)) / (f(x_{i+1}) - f(x_i))
                s = s + _GOLDEN
                u = (float(_mix64(s) >> np.uint64(11)) + 0.5) * _TWO53
                if not _ZIG_FX[i] + u * (_ZIG_FX[i + 1] - _ZIG_FX[i]) < math.exp(-0.5 * x * x):
                    x = -1.0
        if x >= 0.0:
            return -x if neg else x
        s = s + _GOLDEN   # rejected: a fresh output for a fresh try
        z = _mix64(s)


@njit_noalloc(inline="llvm")
def _normal_at(c, c2):
    """A standard normal variate from counters ``c`` and ``c2`` alone (the
    ziggurat method; the same law as `_normal`): ``_mix64(c)`` gives the
    layer (bits 0-7), the sign (bit 8) and the position (bits 11-63), taken
    at once inside the layer's inner rectangle (about 99 % of draws); the
    rest is `_normal_at_edge` (a call). Inlined where it is called."""
    z = _mix64(c)
    i = np.int64(z & np.uint64(255))
    m = z >> np.uint64(11)
    if m >= _ZIG_K[i]:
        return _normal_at_edge(z, c2)
    x = float(m) * _ZIG_W[i]
    return -x if (z >> np.uint64(8)) & np.uint64(1) == np.uint64(1) else x
