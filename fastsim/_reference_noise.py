"""The noise of the step time, stated again in plain Python for the reference
simulator (``fastsim/_reference.py``): the per-run effects of a replication
and the per-step jitter and stalls, from the same counter-based streams as
the kernel (``fastsim/kernel/latency.py``), with no code shared with it.

The streams: SplitMix64 keyed by (key0, key1, replication, purpose), as
``kernel/rng.py`` states them; the purposes are the run effects and the
step noise. Python integers are masked to 64 bits where the kernel's
``uint64`` arithmetic wraps around; every float operation is the kernel's,
in its order, so the two agree to the last bit.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ._latency import LatencyModel

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_TWO_PI = 6.283185307179586

# stream purposes (as `kernel.layout` numbers them: the run effects, then the step noise)
_PURPOSE_RUN = 11
_PURPOSE_STEP = 12


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _stream_start(key0: int, key1: int, rep: int, purpose: int) -> int:
    """The seeded state of stream ``purpose`` of a replication."""
    base = _mix64(key0 ^ _mix64((rep * _GOLDEN + key1) & _M64))
    return _mix64((base + (purpose + 1) * 0xD1B54A32D192ED03) & _M64)


def _unit(z: int) -> float:
    """A double in (0, 1) from 64 random bits."""
    return (float(z >> 11) + 0.5) * (1.0 / 9007199254740992.0)


class _RunStream:
    """The per-run stream: uniforms by a counter, normals by Box-Muller."""

    def __init__(self, state: int):
        self.state = state

    def uniform(self) -> float:
        self.state = (self.state + _GOLDEN) & _M64
        return _unit(_mix64(self.state))

    def normal(self) -> float:
        u1 = self.uniform()
        u2 = self.uniform()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(_TWO_PI * u2)


# The standard normal by the ziggurat method (Marsaglia and Tsang, 2000), as
# the kernel's counter-based draw states it (``kernel/rng.py``, `_normal_at`):
# 256 layers of equal area under f(x) = exp(-x^2 / 2), x >= 0; layer 0 is
# [0, R] x [0, f(R)] with the tail beyond R, layer i >= 1 [0, x_i] x [f(x_i),
# f(x_{i+1})]. The tables are computed here again by the same formula.
_ZIG_LAYERS = 256
_ZIG_R = 3.6541528853610088   # x_1 (Marsaglia and Tsang)


def _ziggurat_tables(r: float = _ZIG_R, layers: int = _ZIG_LAYERS):
    """(k, w, f): take a 53-bit position m in layer i at once if m < k[i];
    its abscissa is m * w[i]; f[i] = f(x_i), i = 0 .. layers."""
    def f(x):
        return math.exp(-0.5 * x * x)

    v = r * f(r) + math.sqrt(math.pi / 2.0) * math.erfc(r / math.sqrt(2.0))   # a layer's area
    x = [v / f(r), r]
    while len(x) < layers:
        x.append(math.sqrt(-2.0 * math.log(v / x[-1] + f(x[-1]))))
    x.append(0.0)
    k = [int(x[i + 1] / x[i] * 2.0 ** 53) for i in range(layers)]
    w = [x[i] * 2.0 ** -53 for i in range(layers)]
    return k, w, [f(xi) for xi in x]


_ZIG_K, _ZIG_W, _ZIG_F = _ziggurat_tables()


def _normal_at(c: int, c2: int) -> float:
    """A standard normal variate from 64-bit counters ``c`` and ``c2``: the
    output _mix64(c) gives the layer (bits 0-7), the sign (bit 8) and a
    53-bit position (bits 11-63); inside the layer's inner rectangle it is
    taken, else the wedge test, the tail (Marsaglia, 1964) and any retry take
    their uniforms and outputs in turn from the stream started at _mix64(c2)
    and advanced by the golden gamma."""
    z = _mix64(c)
    s = None
    while True:
        i = z & 255
        neg = (z >> 8) & 1 == 1
        m = z >> 11
        x = float(m) * _ZIG_W[i]
        if m >= _ZIG_K[i]:
            if s is None:
                s = _mix64(c2)
            if i == 0:   # the tail: R + a, a ~ Exp(rate R), taken if 2b > a^2, b ~ Exp(1)
                while True:
                    s = (s + _GOLDEN) & _M64
                    a = -math.log(_unit(_mix64(s))) / _ZIG_R
                    s = (s + _GOLDEN) & _M64
                    b = -math.log(_unit(_mix64(s)))
                    if b + b > a * a:
                        x = _ZIG_R + a
                        break
            else:   # the wedge
                s = (s + _GOLDEN) & _M64
                u = _unit(_mix64(s))
                if not _ZIG_F[i] + u * (_ZIG_F[i + 1] - _ZIG_F[i]) < math.exp(-0.5 * x * x):
                    x = -1.0
        if x >= 0.0:
            return -x if neg else x
        if s is None:
            s = _mix64(c2)
        s = (s + _GOLDEN) & _M64   # rejected: a fresh output for a fresh try
        z = _mix64(s)


class StepNoiseDraws:
    """The per-step noise of one run: ``apply(d, k)`` is the duration of step
    ``k`` (from 0) whose deterministic duration is ``d``."""

    def __init__(self, key: int, jitter_sd: float, stall_prob: float, stall_mean_s: float):
        self.key = key
        self.sd = jitter_sd
        self.shift = -0.5 * jitter_sd * jitter_sd
        self.p = stall_prob if stall_mean_s > 0 else 0.0
        self.mean = stall_mean_s

    def apply(self, d: float, k: int) -> float:
        c = (self.key + ((k * 4) & _M64) * _GOLDEN) & _M64
        z = _normal_at((c + _GOLDEN) & _M64, (c + 2 * _GOLDEN) & _M64)
        d = d * math.exp(self.sd * z + self.shift)
        if self.p > 0.0:
            u3 = _unit(_mix64((c + 3 * _GOLDEN) & _M64))
            if u3 < self.p:
                u4 = _unit(_mix64((c + 4 * _GOLDEN) & _M64))
                d = d + self.mean * -math.log(u4)
        return d


def run_latency(latency: LatencyModel, key0: int, key1: int, rep: int):
    """The deterministic model replication ``rep`` runs with (its per-run
    effects drawn) and its per-step noise (a `StepNoiseDraws`, or None).

    The draws, in the kernel's order: five normals z and the coefficients
    ``theta_i + sum_j chol[i, j] * z_j`` (summed from j = 0 up, each term
    added to the coefficient), then the log speed, the log prefill factor and
    the overhead."""
    noise = latency.noise
    if noise is None or not (noise.per_step or noise.per_run):
        return latency, None
    key0, key1 = int(key0), int(key1)
    steps = None
    if noise.per_step:
        steps = StepNoiseDraws(_stream_start(key0, key1, rep, _PURPOSE_STEP), noise.jitter_sd,
                               noise.stall_prob, noise.stall_mean_s)
    if not noise.per_run:   # (the model itself: a roofline stays one, `fastsim.RooflineLatency`)
        return replace(latency, noise=None), steps
    base, scale, alpha = latency.base_s, latency.decode_scale_s, latency.decode_alpha
    prefill, over = latency.prefill_per_token_s, latency.ttft_overhead_s
    ctx, swap = latency.ctx_per_token_s, latency.swap_s_per_block
    if noise.per_run:
        chol = noise.cholesky()
        rs = _RunStream(_stream_start(key0, key1, rep, _PURPOSE_RUN))
        theta = [base, scale, alpha, prefill, over]
        for j in range(5):
            z = rs.normal()
            for i in range(j, 5):
                theta[i] += float(chol[i, j]) * z
        base, scale, alpha, prefill, over = theta
        speed = math.exp(noise.speed_log_mean + noise.speed_sd * rs.normal())
        pf = math.exp(noise.prefill_log_mean + noise.prefill_sd * rs.normal())
        over += noise.overhead_sd * rs.normal()
        base = max(base, 1e-9) * speed
        scale = max(scale, 0.0) * speed
        alpha = max(alpha, 1e-3)
        prefill = max(prefill, 0.0) * speed * pf
        ctx = ctx * speed
        swap = swap * speed
        over = max(over, 0.0)
    run = LatencyModel(base_s=base, decode_scale_s=scale, decode_alpha=alpha, prefill_per_token_s=prefill,
                       ctx_per_token_s=ctx, ttft_overhead_s=over, swap_s_per_block=swap)
    return replace(run, noise=None), steps
