"""Request-length laws and arrival processes.

Lengths are integer token counts >= 1. Every law here is encoded into flat
arrays that the kernel samples from with its own counter-based generator
(`fastsim/kernel/`), so the laws are defined once, here, and sampled the
same way by every backend.
"""

from __future__ import annotations

import csv
import functools
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._validation import (MAX_TOKENS, check_choice, check_float, check_int, check_int_array,
                          check_probabilities)

# Component kinds understood by the kernel's length sampler.
KIND_FIXED, KIND_LOGNORMAL, KIND_UNIFORM, KIND_EMPIRICAL, KIND_REPLAY = 0, 1, 2, 3, 4
KIND_GEOMETRIC, KIND_GAMMA = 5, 6
#: Most rows of the exact table a truncated law is drawn from (`Truncated`).
MAX_TABLE_ROWS = 2 ** 22


class LengthDistribution:
    """Base class of the token-length laws."""

    def _components(self):
        """Return ``[(weight, kind, p0, p1, values, cdf), ...]``."""
        raise NotImplementedError

    def mean(self) -> float:
        """The exact mean of the (integer) length."""
        return float(sum(w * _component_moment(k, p0, p1, v, c, 1)
                         for w, k, p0, p1, v, c in self._components()))

    def second_moment(self) -> float:
        """The exact second moment ``E[L^2]`` of the (integer) length."""
        return float(sum(w * _component_moment(k, p0, p1, v, c, 2)
                         for w, k, p0, p1, v, c in self._components()))

    def variance(self) -> float:
        """The exact variance of the (integer) length."""
        m = self.mean()
        return max(self.second_moment() - m * m, 0.0)

    def cdf(self, k) -> np.ndarray:
        """``P(L <= k)`` of the (integer) length, elementwise for an array ``k``."""
        k = np.floor(np.asarray(k, dtype=float))
        return sum(w * _component_cdf(kind, p0, p1, v, c, k) for w, kind, p0, p1, v, c in self._components())

    def pmf(self, k) -> np.ndarray:
        """``P(L = k)`` of the (integer) length, elementwise for an array ``k``."""
        k = np.floor(np.asarray(k, dtype=float))
        return self.cdf(k) - self.cdf(k - 1)

    def truncate(self, high: int) -> "Truncated":
        """This law conditioned on ``L <= high`` (e.g. ``max_model_len``): see :class:`Truncated`."""
        return Truncated(self, high)


@dataclass(frozen=True)
class Fixed(LengthDistribution):
    """Every request has the same length ``value``."""

    value: int

    def __post_init__(self):
        object.__setattr__(self, "value", check_int("value", self.value, low=1, high=MAX_TOKENS))

    def _components(self):
        return [(1.0, KIND_FIXED, float(self.value), 0.0, None, None)]


@dataclass(frozen=True)
class LogNormal(LengthDistribution):
    """``ceil(X)`` with ``X = median * exp(sigma * Z)``, ``Z ~ N(0, 1)``.

    The ceiling makes the length an integer >= 1 without clipping: the law is
    ``P(L = k) = P(k - 1 < X <= k)``. (A draw above 2**40 tokens is taken as
    2**40: the KV cache holds fewer tokens, so such a request is rejected as
    too long either way.)
    """

    median: float
    sigma: float

    def __post_init__(self):
        object.__setattr__(self, "median", check_float("median", self.median, low=0, low_open=True,
                                                       high=MAX_TOKENS))
        object.__setattr__(self, "sigma", check_float("sigma", self.sigma, low=0))

    @classmethod
    def from_mean_sd(cls, mean_len: float, sd: float) -> "LogNormal":
        """The lognormal whose continuous ``X`` has mean ``mean_len`` and standard
        deviation ``sd`` (``sigma**2 = log(1 + sd**2 / mean_len**2)``,
        ``median = mean_len / sqrt(1 + sd**2 / mean_len**2)``); the integer
        length ``ceil(X)`` has mean about ``mean_len + 1/2`` (exactly :meth:`mean`)."""
        mean_len = check_float("mean_len", mean_len, low=0, low_open=True, high=MAX_TOKENS)
        sd = check_float("sd", sd, low=0)
        cv = sd / mean_len
        if not cv <= 1e6:   # (sigma above ~5.3: ``(sd / mean_len) ** 2`` overflowed for sd=1e300)
            raise ValueError(f"sd must be at most 1e6 times mean_len (a lognormal of that coefficient of variation "
                             f"has sigma {math.sqrt(math.log1p(1e12)):.3g}), got sd={sd!r} with mean_len={mean_len!r}")
        r = 1.0 + cv * cv
        return cls(median=mean_len / math.sqrt(r), sigma=math.sqrt(math.log(r)))

    def _components(self):
        return [(1.0, KIND_LOGNORMAL, self.median, self.sigma, None, None)]


@dataclass(frozen=True)
class Uniform(LengthDistribution):
    """Integer uniform on ``low, low + 1, ..., high`` (both included)."""

    low: int
    high: int

    def __post_init__(self):
        low = check_int("low", self.low, low=1, high=MAX_TOKENS)
        high = check_int("high", self.high, low=1, high=MAX_TOKENS)
        if high < low:
            raise ValueError(f"high must be >= low ({low}), got {high}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    def _components(self):
        return [(1.0, KIND_UNIFORM, float(self.low), float(self.high), None, None)]


@dataclass(frozen=True)
class Geometric(LengthDistribution):
    """The geometric law on ``1, 2, ...`` with mean ``mean``:
    ``P(L = k) = (1 - p) ** (k - 1) * p`` with ``p = 1 / mean``, so
    ``E[L] = mean`` and ``Var[L] = (1 - p) / p ** 2`` exactly. The integer
    counterpart of an exponential length (``mean=1``: every length is 1).
    """

    mean_len: float

    def __post_init__(self):
        object.__setattr__(self, "mean_len", check_float("mean_len", self.mean_len, low=1, high=MAX_TOKENS))

    def _components(self):
        p = 1.0 / self.mean_len
        # the kernel draws ceil(-log(U) / q), q = -log(1 - p): P(L > k) = (1 - p) ** k
        q = math.inf if p >= 1.0 else -math.log1p(-p)
        return [(1.0, KIND_GEOMETRIC, q, 0.0, None, None)]


@dataclass(frozen=True)
class Exponential(LengthDistribution):
    """``ceil(X)`` with ``X`` exponential of mean ``mean`` (tokens), the law of
    the vLLM scheduler study's lengths. ``ceil`` makes it the geometric law
    with ``p = 1 - exp(-1 / mean)``: ``E[L] = 1 / p``, about ``mean + 1/2``
    (use :class:`Geometric` for an integer law of mean exactly ``mean``).
    """

    mean_len: float

    def __post_init__(self):
        object.__setattr__(self, "mean_len", check_float("mean_len", self.mean_len, low=0, low_open=True,
                                                         high=MAX_TOKENS))

    def _components(self):
        return [(1.0, KIND_GEOMETRIC, 1.0 / self.mean_len, 0.0, None, None)]


@dataclass(frozen=True)
class Gamma(LengthDistribution):
    """``ceil(X)`` with ``X`` gamma of mean ``mean_len`` and standard deviation
    ``sd`` (shape ``(mean_len / sd) ** 2``, scale ``sd ** 2 / mean_len``); the
    ceiling makes the length an integer >= 1 without clipping.
    """

    mean_len: float
    sd: float

    def __post_init__(self):
        object.__setattr__(self, "mean_len", check_float("mean_len", self.mean_len, low=0, low_open=True,
                                                         high=MAX_TOKENS))
        object.__setattr__(self, "sd", check_float("sd", self.sd, low=0, low_open=True, high=MAX_TOKENS))
        ratio = self.mean_len / self.sd   # (squared only within range: sd=1e-300 overflowed the power)
        shape = ratio * ratio if ratio < 1e10 else math.inf
        if not 1e-3 <= shape <= 1e8:
            raise ValueError(f"sd must give a gamma shape (mean_len / sd) ** 2 in [1e-3, 1e8], got sd={self.sd!r} "
                             f"with mean_len={self.mean_len!r} (shape {shape:.3g})")

    @property
    def shape(self) -> float:
        return (self.mean_len / self.sd) ** 2

    @property
    def scale(self) -> float:
        return self.sd ** 2 / self.mean_len

    def _components(self):
        return [(1.0, KIND_GAMMA, self.shape, self.scale, None, None)]


@dataclass(frozen=True, eq=False)
class Empirical(LengthDistribution):
    """Observed lengths: sampled (with optional weights) or replayed in order.

    Parameters
    ----------
    values : array_like of int
    weights : array_like of float, optional
        Sampling probabilities (``order="sample"`` only).
    order : {"sample", "replay"}
        ``"sample"``: independent draws; ``"replay"``: request ``i`` gets
        ``values[i mod len(values)]`` in every replication. (For paired
        prompt/output rows use :class:`LengthTrace`.)
    """

    values: np.ndarray
    weights: np.ndarray | None = None
    order: str = "sample"

    def __post_init__(self):
        check_choice("order", self.order, ("sample", "replay"))
        values = check_int_array("values", self.values, low=1)
        if self.order == "replay" and self.weights is not None:
            raise ValueError("weights must be None when order='replay' (values are replayed in order)")
        weights = (np.full(values.size, 1.0 / values.size) if self.weights is None
                   else check_probabilities("weights", self.weights, values.size))
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "weights", weights)

    @classmethod
    def from_csv(cls, path, column: str, order: str = "sample") -> "Empirical":
        """Read one integer column of a CSV file."""
        return cls(_read_csv_columns(path, [column])[column], order=order)

    def _components(self):
        cdf = np.cumsum(self.weights)
        cdf[-1] = 1.0
        kind = KIND_REPLAY if self.order == "replay" else KIND_EMPIRICAL
        return [(1.0, kind, 0.0, 0.0, self.values.astype(float), cdf)]


@dataclass(frozen=True, eq=False)
class Mixture(LengthDistribution):
    """With probability ``weights[j]`` draw from ``components[j]``."""

    components: tuple
    weights: np.ndarray

    def __post_init__(self):
        comps = tuple(self.components)
        if not comps:
            raise ValueError("components must be a non-empty sequence of length laws, got ()")
        comps = tuple(as_length(f"components[{j}]", c) for j, c in enumerate(comps))
        for j, c in enumerate(comps):
            if isinstance(c, Empirical) and c.order == "replay":
                raise ValueError(f"components[{j}] must not replay in order inside a Mixture "
                                 "(a mixture draws its component at random)")
        object.__setattr__(self, "components", comps)
        object.__setattr__(self, "weights", check_probabilities("weights", self.weights, len(comps)))

    def _components(self):
        out = []
        for w, comp in zip(self.weights, self.components):
            out += [(w * cw, *rest) for cw, *rest in comp._components()]
        return out


@dataclass(frozen=True, eq=False)
class Histogram(LengthDistribution):
    """A histogram of observed lengths: bin ``j`` holds the integers
    ``edges[j] .. edges[j + 1] - 1`` and has probability proportional to
    ``counts[j]``, spread uniformly over its integers (the empirical pmf
    when every bin is one integer wide).

    Parameters
    ----------
    edges : array_like of int
        Strictly increasing bin edges, ``edges[0] >= 1`` (``len(counts) + 1`` of them).
    counts : array_like of float
        Non-negative bin counts or weights, not all zero.
    """

    edges: np.ndarray
    counts: np.ndarray

    def __post_init__(self):
        e = check_int_array("edges", self.edges, low=1)
        if e.size < 2 or np.any(np.diff(e) <= 0):
            raise ValueError(f"edges must be at least two strictly increasing integers >= 1, got {self.edges!r}")
        try:
            c = np.asarray(self.counts, dtype=float)
        except (TypeError, ValueError):   # (strings: a bare "could not convert" naming nothing)
            c = np.full(0, np.nan)
        if c.shape != (e.size - 1,) or not np.all(np.isfinite(c)) or np.any(c < 0) or c.sum() <= 0:
            raise ValueError(f"counts must be {e.size - 1} finite non-negative numbers (one per bin of edges), "
                             f"not all zero, got {self.counts!r}")
        object.__setattr__(self, "edges", e)
        object.__setattr__(self, "counts", c)

    def _components(self):
        w = self.counts / self.counts.sum()
        return [(float(wj), KIND_UNIFORM, float(lo), float(hi - 1), None, None)
                for wj, lo, hi in zip(w, self.edges[:-1], self.edges[1:]) if wj > 0]


@dataclass(frozen=True, eq=False)
class Truncated(LengthDistribution):
    """``law`` conditioned on ``L <= high``: ``P(L = k) = P_law(L = k) / P_law(L <= high)``
    for ``k <= high`` (e.g. ``high = max_model_len`` less the other length, so
    that no request is rejected as too long). Drawn from the exact table of
    those probabilities (at most `MAX_TABLE_ROWS` lengths).
    """

    law: LengthDistribution
    high: int

    def __post_init__(self):
        law = as_length("law", self.law)
        high = check_int("high", self.high, low=1, high=MAX_TABLE_ROWS)
        if isinstance(law, Empirical) and law.order == "replay":
            raise ValueError("law must not replay in order inside Truncated (a truncated law is sampled)")
        mass = float(law.cdf(high))
        if not mass > 0.0:
            raise ValueError(f"high must leave the law some probability (P(L <= high) > 0), got high={high} "
                             f"for {law!r}")
        object.__setattr__(self, "law", law)
        object.__setattr__(self, "high", high)

    @functools.cached_property
    def _table(self):
        k = np.arange(1, self.high + 1, dtype=float)
        c = np.minimum(self.law.cdf(k), 1.0)
        p = np.diff(np.concatenate([[0.0], c]))
        keep = p > 0
        values, probs = k[keep], p[keep] / c[-1]
        cdf = np.cumsum(probs)
        cdf[-1] = 1.0
        return values, cdf

    def _components(self):
        values, cdf = self._table
        return [(1.0, KIND_EMPIRICAL, 0.0, 0.0, values, cdf)]


def as_length(name: str, value) -> LengthDistribution:
    """Accept an int (a fixed length) or a length law; reject anything else."""
    if isinstance(value, LengthDistribution):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1:
        return Fixed(int(check_int(name, value, low=1, high=MAX_TOKENS)))
    raise ValueError(f"{name} must be an integer >= 1 or a length distribution "
                     f"(Fixed, LogNormal, Uniform, Geometric, Exponential, Gamma, Histogram, "
                     f"Empirical, Mixture, Truncated), got {value!r}")


@dataclass(frozen=True, eq=False)
class LengthTrace:
    """Paired (prompt, output) lengths taken row by row from a trace.

    Parameters
    ----------
    prompt_len, output_len : array_like of int
        One row per recorded request.
    order : {"replay", "sample"}
        ``"replay"``: request ``i`` gets row ``i mod n`` (in order, as
        ``vllm bench serve --disable-shuffle``); ``"sample"``: each request
        gets an independent uniformly drawn row.
    """

    prompt_len: np.ndarray
    output_len: np.ndarray
    order: str = "replay"

    def __post_init__(self):
        p = check_int_array("prompt_len", self.prompt_len)
        o = check_int_array("output_len", self.output_len)
        if p.size != o.size:
            raise ValueError(f"prompt_len and output_len must have the same length, "
                             f"got {p.size} and {o.size}")
        object.__setattr__(self, "prompt_len", p)
        object.__setattr__(self, "output_len", o)
        check_choice("order", self.order, ("replay", "sample"))

    @classmethod
    def from_csv(cls, path, *, order: str = "replay", nrows: int | None = None) -> "LengthTrace":
        """Read a CSV with columns ``prompt_len`` and ``output_len`` (or ``gen_len``)."""
        cols = _read_csv_columns(path, ["prompt_len", ("output_len", "gen_len")])
        p, o = cols["prompt_len"], cols["output_len"]
        if nrows is not None:
            nrows = check_int("nrows", nrows, low=1)
            if nrows > p.size:
                raise ValueError(f"nrows must be <= the {p.size} rows of {path}, got {nrows}")
            p, o = p[:nrows], o[:nrows]
        return cls(p, o, order)

    def __len__(self):
        return int(self.prompt_len.size)


def sharegpt_lengths(order: str = "sample") -> LengthTrace:
    """The built-in ShareGPT length trace (5,000 requests, Qwen2.5 tokens).

    Shipped in ``fastsim/data/sharegpt_lengths.csv``; see ``fastsim/data/README.md``
    for its origin.
    """
    return LengthTrace.from_csv(Path(__file__).parent / "data" / "sharegpt_lengths.csv", order=order)


def _read_csv_columns(path, columns):
    """Read integer columns; an entry may be a tuple of accepted aliases."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must be an existing CSV file, got {str(path)!r}")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        names = {}
        for col in columns:
            aliases = col if isinstance(col, tuple) else (col,)
            found = next((a for a in aliases if a in header), None)
            if found is None:
                raise ValueError(f"{path} must have a column {' or '.join(map(repr, aliases))}; "
                                 f"its columns are {header}")
            names[aliases[0]] = found
        rows = list(reader)
    out = {}
    for key, col in names.items():
        try:
            values = [_csv_integer(r[col], f"row {i + 2}") for i, r in enumerate(rows)]
            out[key] = check_int_array(f"{path}:{col}", values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"column {col!r} of {path} must hold integers >= 1: {exc}") from None
    return out


def _csv_integer(text, where):
    """An integer written in a CSV cell (``12``, ``12.0``, ``1e3``); anything
    else, ``2.9`` included, is refused (it was read as 2)."""
    text = (text or "").strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a number") from None
    if not (math.isfinite(x) and x == math.floor(x)):
        raise ValueError(f"{where}: {text!r} is not an integer")
    return int(x)


def _component_moment(kind, p0, p1, values, cdf, order):
    """E[L^order] (order 1 or 2) of one component, exactly or to ~1e-12."""
    if kind == KIND_FIXED:
        return p0 ** order
    if kind == KIND_UNIFORM:
        lo, hi = int(p0), int(p1)
        n = hi - lo + 1
        if order == 1:
            return (lo + hi) / 2.0
        # sum of k^2 over [lo, hi] from the closed form of sum_{k<=m} k^2
        sq = (hi * (hi + 1) * (2 * hi + 1) - (lo - 1) * lo * (2 * lo - 1)) / 6.0
        return sq / n
    if kind in (KIND_EMPIRICAL, KIND_REPLAY):
        # (for a replay: the long-run average over requests)
        probs = np.diff(np.concatenate([[0.0], cdf]))
        return float(np.sum(probs * values ** order))
    if kind == KIND_GEOMETRIC:
        p = -math.expm1(-p0)      # P(L = 1)
        return 1.0 / p if order == 1 else (2.0 - p) / (p * p)
    if kind == KIND_GAMMA:
        return _ceil_gamma_moment(p0, p1, order)
    return _ceil_lognormal_moment(p0, p1, order)


def _component_cdf(kind, p0, p1, values, cdf, k):
    """P(L <= k) of one component for integer-valued float arrays ``k``."""
    from scipy import stats

    if kind == KIND_FIXED:
        return (k >= p0).astype(float)
    if kind == KIND_UNIFORM:
        return np.clip((k - p0 + 1.0) / (p1 - p0 + 1.0), 0.0, 1.0)
    if kind in (KIND_EMPIRICAL, KIND_REPLAY):
        probs = np.diff(np.concatenate([[0.0], cdf]))
        order = np.argsort(values, kind="stable")
        cum = np.concatenate([[0.0], np.cumsum(probs[order])])
        return np.minimum(cum[np.searchsorted(values[order], k, side="right")], 1.0)
    kpos = np.maximum(k, 0.0)
    if kind == KIND_GEOMETRIC:
        # P(L <= k) = 1 - exp(-q k); L >= 1 also when q = inf (mean 1)
        return np.where(k >= 1, -np.expm1(-p0 * np.maximum(k, 1.0)), 0.0)
    # ceil(X) <= k  <=>  X <= k (X continuous, > 0); ceil(X) >= 1 always
    if kind == KIND_GAMMA:
        c = stats.gamma.cdf(kpos, p0, scale=p1)
    else:
        c = stats.lognorm.cdf(kpos, s=p1, scale=p0) if p1 > 0 else (kpos >= math.ceil(p0)).astype(float)
    return np.where(k >= 1, c, 0.0)


@functools.lru_cache(maxsize=1024)
def _ceil_gamma_moment(shape, scale, order, terms=200_000):
    """E[ceil(X)^order] for X ~ Gamma(shape, scale): summed exactly over the
    integer support up to ``K``, plus the tail beyond K from the gamma's
    partial moments with ceil(X) ~ X + 1/2 there (as `_ceil_lognormal_moment`)."""
    from scipy import special, stats

    dist = stats.gamma(shape, scale=scale)
    hi = int(min(max(np.ceil(dist.isf(1e-17)), 1), terms))
    k = np.arange(1, hi + 1, dtype=float)
    probs = np.diff(np.concatenate([[0.0], dist.cdf(k)]))
    head = float(np.sum(probs * k ** order))

    def partial(j):  # E[X^j; X > hi] = scale^j Gamma(shape + j) / Gamma(shape) P(Gamma(shape + j) > hi / scale)
        return scale ** j * math.exp(special.gammaln(shape + j) - special.gammaln(shape)) * \
            special.gammaincc(shape + j, hi / scale)

    tail = partial(1) + 0.5 * partial(0) if order == 1 else partial(2) + partial(1) + 0.25 * partial(0)
    return head + tail


@functools.lru_cache(maxsize=1024)   # (pure; a run's memory check asks for the same law on every call)
def _ceil_lognormal_moment(median, sigma, order, terms=200_000):
    """E[ceil(X)^order] for X = median * exp(sigma Z).

    Summed exactly over the integer support up to ``K`` (at most ``terms``
    values), plus the tail beyond K from the lognormal partial moments with
    ceil(X) ~ X + 1/2 there (relative error below ~1/K of the tail).
    """
    # (scipy.special's normal law, as scipy.stats.lognorm computes it, to the
    # bit: scipy.stats takes half a second to import, on a cold start's way)
    from scipy import special

    if sigma == 0:
        return float(math.ceil(median)) ** order
    with np.errstate(over="ignore"):   # (a quantile beyond the doubles: the sum stops at ``terms``)
        hi = int(min(np.ceil(np.exp(sigma * special.ndtri(1 - 1e-15)) * median), terms))
    k = np.arange(1, hi + 1, dtype=float)
    probs = np.diff(np.concatenate([[0.0], special.ndtr(np.log(k / median) / sigma)]))
    head = float(np.sum(probs * k ** order))
    mu = math.log(median)

    def partial(j):  # E[X^j; X > hi]
        return math.exp(j * mu + 0.5 * (j * sigma) ** 2) * special.ndtr((mu + j * sigma**2 - math.log(hi)) / sigma)

    tail = partial(1) + 0.5 * partial(0) if order == 1 else partial(2) + partial(1) + 0.25 * partial(0)
    return head + tail


# ----------------------------------------------------------------------------
# Arrival processes

@dataclass(frozen=True)
class _ArrivalSpec:
    """Arrival process as the kernel sees it (built by `Workload`)."""

    kind: int  # 0 = renewal (gamma gaps; shape 1 is Poisson), 1 = given times, 2 = multi-user
    rate: float = 0.0
    users: tuple = (0, 0)
    requests_per_user: float = 0.0
    user_cap: int = 0
    burstiness: float = 1.0
    times: np.ndarray = field(default_factory=lambda: np.zeros(0))
