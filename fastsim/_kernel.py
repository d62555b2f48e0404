"""The replication kernel: every ``@njit`` function of the CPU engine.

What is simulated is specified in ``docs/engine-model.md``; this module is one
implementation of that text (``fastsim/_reference.py`` is another, written
independently for clarity, and the tests hold the two to each other).

The kernel sees arrays and scalars only. It does no validation: the Python
layer (``fastsim/_replicate.py``) validates the scenario, packs it with
:func:`pack_scenario`-style helpers into the ``ipar``/``fpar`` vectors and
flat distribution tables described below, and allocates the outputs.

Randomness is counter-based: replication ``r`` of a run keyed by
``(key0, key1)`` draws from independent SplitMix64 streams keyed by
``(key0, key1, r, purpose)``, one stream per purpose (arrival gaps, prompt
lengths, output lengths, ...). A replication's workload therefore depends only
on the seed, its index and the workload laws: never on the thread that runs
it, on how replications are chunked, or on the engine settings (common random
numbers across engine configurations come for free). The one engine-side
draw, the SJF key of a ``length_predictor``, has a stream of its own, so it
leaves every other column unchanged.

Memory is bounded by (threads x requests per replication): the engine
allocates nothing (its state is carved out of a workspace, see `_ws_need`;
its functions are compiled without Numba's runtime, `njit_noalloc`);
each CPU thread reuses one workspace for its replications and reduces each
replication to one row of metrics. The same functions run as CUDA device
functions (``fastsim/_cuda.py``), one GPU thread per replication.

The engine is compiled in two versions (`_simulate`'s ``full`` argument,
chosen by `engine_variant`): the common one, in which Numba prunes static
batching, active priority preemption, swap preemption and prefix caching
before typing (a shorter cold start), and the full one. On the CPU a
scenario compiles only the version it needs; the GPU backend builds the
full one for every scenario.
"""

from __future__ import annotations

import functools
import math
import queue

import numba
import numpy as np
from numba.core import types as nb_types

from ._numba_options import compile_entries, function_pointer, njit, njit_noalloc

# --- layout of the integer parameter vector ``ipar`` -------------------------
I_MAX_NUM_SEQS = 0
I_MAX_BATCHED_TOKENS = 1
I_BLOCK_SIZE = 2
I_NUM_GPU_BLOCKS = 3
I_CHUNKED = 4
I_POLICY = 5          # 0 fcfs, 1 priority, 2 sjf
I_STATIC = 6          # 0 continuous, 1 static batching
I_ADMISSION = 7       # 0 none, 1 queue_limit, 2 kv_reservation
I_MAX_WAITING = 8
I_MAX_MODEL_LEN = 9   # 0 = no limit
I_WARMUP = 10
I_HAS_DELAY = 11
I_HAS_HORIZON = 12
I_ARRIVAL_KIND = 13   # 0 renewal (gamma gaps), 1 given times
I_TRACE_MODE = 14     # 0 independent laws, 1 replay rows, 2 sample rows
I_NUM_REQUESTS = 15   # arrivals to generate (buffer capacity with a horizon)
I_HAS_TTFT_SLO = 16
I_HAS_TPOT_SLO = 17
I_NORMALIZE_ARRIVALS = 18  # 1: rescale as `vllm bench serve` (last arrival at N / rate)
I_USERS_LO = 19       # multi-user arrivals (I_ARRIVAL_KIND 2): user count range
I_USERS_HI = 20
I_USER_CAP = 21       # per-user request cap (Poisson quantile of 1 - 1e-15)
I_PREDICTOR = 22      # SJF key: 0 the true output length, 1 lognormal prediction error, 2 buckets
I_PRIO_PREEMPT = 23   # 1: active priority preemption (phase 0)
I_HAS_AGING = 24      # 1: queue keys c_i + a_i / A (F_AGING = A)
I_SWAP = 25           # 1: preemption_mode="swap"
I_SWAP_BLOCKS = 26    # swap_space_blocks
I_PREFIX = 27         # 1: the workload has prefix groups (laws at lrange[4:8])
I_CACHING = 28        # 1: enable_prefix_caching
N_IPAR = 29

# --- layout of the float parameter vector ``fpar`` ---------------------------
F_RATE = 0
F_BURSTINESS = 1
F_MAX_DELAY = 2
F_HORIZON = 3
F_TTFT_SLO = 4
F_TPOT_SLO = 5
F_TTFT_OVERHEAD = 6   # client-side offset of observed first-token and completion times
F_USER_REQUESTS = 7   # multi-user arrivals: mean requests per user (F_RATE is the per-user rate)
F_PRED_SIGMA = 8      # lognormal length predictor: sigma of the log error
F_AGING = 9           # priority_aging_s
F_PRED_ACCURACY = 10  # bucket length predictor: probability of the right bucket
N_FPAR = 11

POLICY_CODES = {"fcfs": 0, "priority": 1, "sjf": 2}
ADMISSION_CODES = {"none": 0, "queue_limit": 1, "kv_reservation": 2}

# --- request status codes ------------------------------------------------------
ST_PENDING = 0
ST_WAITING = 1
ST_RUNNING = 2
ST_COMPLETED = 3
ST_REJECTED_TOO_LONG = 4
ST_REJECTED_ADMISSION = 5
ST_DROPPED = 6
ST_UNFINISHED = 7
ST_SWAPPED = 8        # preempted by swap (in the swapped queue); internal

# --- random stream purposes ----------------------------------------------------
S_ARRIVAL = 0
S_PROMPT_COMPONENT = 1
S_PROMPT_VALUE = 2
S_OUTPUT_COMPONENT = 3
S_OUTPUT_VALUE = 4
S_PRIORITY = 5
S_TRACE_ROW = 6
S_USERS = 7           # multi-user arrivals: user count and per-user request counts
S_PREDICT = 8         # SJF key prediction errors (a stream of its own: the other draws do not change)
S_PREFIX_GROUP = 9    # prefix group of each request
S_PREFIX_LEN = 10     # prefix length of each request
N_STREAMS = 11

# --- per-replication output row -------------------------------------------------
METRICS = (
    "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p95", "ttft_p99",
    "tpot_mean", "tpot_p50", "tpot_p99",
    "itl_mean", "itl_p50", "itl_p99",
    "e2e_mean", "e2e_p50", "e2e_p99",
    "request_throughput", "output_throughput", "goodput",
    "blocking_probability", "drop_probability", "preemptions_per_request", "swaps_per_request",
    "prefix_hit_rate", "batch_occupancy_mean", "queue_depth_mean", "kv_utilization_mean",
)
COUNTS = (
    "n_arrived", "n_completed", "n_rejected", "n_rejected_too_long", "n_rejected_admission",
    "n_dropped", "n_unfinished", "n_preemptions", "n_swaps", "n_measured", "n_steps",
    "max_blocks_used", "blocks_used_at_end", "max_swap_blocks_used", "window_s", "end_s",
    "time_in_system_integral", "sojourn_sum",
)
COLUMNS = METRICS + COUNTS
N_COLUMNS = len(COLUMNS)
_COL = {name: j for j, name in enumerate(COLUMNS)}
C_TTFT_MEAN = _COL["ttft_mean"]
C_TPOT_MEAN = _COL["tpot_mean"]
C_ITL_MEAN = _COL["itl_mean"]
C_E2E_MEAN = _COL["e2e_mean"]
C_REQ_TPUT = _COL["request_throughput"]
C_OUT_TPUT = _COL["output_throughput"]
C_GOODPUT = _COL["goodput"]
C_BLOCKING = _COL["blocking_probability"]
C_DROP = _COL["drop_probability"]
C_PREEMPT = _COL["preemptions_per_request"]
C_SWAPS = _COL["swaps_per_request"]
C_HIT = _COL["prefix_hit_rate"]
C_OCC = _COL["batch_occupancy_mean"]
C_QUEUE = _COL["queue_depth_mean"]
C_KV = _COL["kv_utilization_mean"]
C_N_ARRIVED = _COL["n_arrived"]

# Run-level accumulators returned by `_simulate` (indices into `acc`).
A_OCC_INT = 0       # integral over the window of running / max_num_seqs
A_QUEUE_INT = 1     # integral over the window of waiting
A_KV_INT = 2        # integral over the window of used blocks / num_gpu_blocks
A_L_INT = 3         # integral over the whole run of the number in system
A_WINDOW_START = 4
A_END = 5
A_STEPS = 6
A_MAX_BLOCKS = 7
A_BLOCKS_END = 8
A_N_ITL = 9
A_HIT_TOK = 10      # prefix caching: cached tokens of measured requests that queried the cache
A_QUERY_TOK = 11    # ... and their prompt tokens
A_MAX_SWAP = 12     # most blocks held in CPU swap space
N_ACC = 13
N_HIST = 256       # buckets of the histogram that narrows percentile searches (`_percentiles`)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TWO53 = 1.0 / 9007199254740992.0
_MAX_LEN_FLOAT = 2.0 ** 40  # longer draws are rejected as too long anyway


# ==============================================================================
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
# lies under f and is taken at once (98.5% of draws), the others take a wedge
# test or, in layer 0, the tail. Box-Muller, which this replaced, spends two
# outputs, a log, a sqrt and a cos per variate: the reference workload's
# drawing took ~75 ns per request with it, ~36 ns with the ziggurat and
# ~25 ns with its common case inlined (`benchmarks/profile_breakdown.py`).

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
def _search_cdf(cdf, lo, hi, u):
    """First index j in [lo, hi) with cdf[j] >= u (cdf[hi - 1] == 1 >= u)."""
    hi -= 1  # the last entry is always a valid answer
    while lo < hi:
        mid = (lo + hi) // 2
        if cdf[mid] >= u:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit_noalloc
def _lognormal_length(state, s, median, sigma):
    """ceil(median * exp(sigma * Z)), Z standard normal from stream ``s``."""
    x = median * math.exp(sigma * _normal(state, s))
    # X > 0, so ceil(X) >= 1; max() only guards against exp() underflowing.
    return max(np.int64(1), np.int64(math.ceil(min(x, _MAX_LEN_FLOAT))))


@njit_noalloc
def _one_lognormal(lo, hi, lcomp, lpar):
    """(median, sigma) of the law in components [lo, hi) if it is one
    lognormal component, else (-1.0, 0.0)."""
    if hi - lo == 1 and lcomp[lo, 0] == 1:
        return lpar[lo, 0], lpar[lo, 1]
    return -1.0, 0.0


@njit_noalloc
def _sample_length(state, s_comp, s_val, lo, hi, lcomp, lpar, ltab, i):
    """The length of request ``i`` from the law stored in components [lo, hi)."""
    j = lo
    if hi - lo > 1:
        u = _uniform(state, s_comp)
        while j < hi - 1 and lpar[j, 2] < u:
            j += 1
    kind = lcomp[j, 0]
    if kind == 0:  # fixed
        return np.int64(lpar[j, 0])
    if kind == 1:
        return _lognormal_length(state, s_val, lpar[j, 0], lpar[j, 1])
    if kind == 2:  # integer uniform on [low, high]
        low = np.int64(lpar[j, 0])
        width = np.int64(lpar[j, 1]) - low + 1
        k = np.int64(_uniform(state, s_val) * width)
        return low + min(k, width - 1)
    # tables: rows [start, start + n) of ltab hold (value, cdf)
    start = lcomp[j, 1]
    if kind == 4:  # replayed in order
        return np.int64(ltab[start + i % lcomp[j, 2], 0])
    row = _search_cdf(ltab[:, 1], start, start + lcomp[j, 2], _uniform(state, s_val))
    return np.int64(ltab[row, 0])


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


@njit_noalloc
def _heapsort(x, n):
    """Sort ``x[:n]`` in place (no allocation, so that GPU threads can use it too)."""
    for start in range(n // 2 - 1, -1, -1):
        _sift_down(x, start, n)
    for end in range(n - 1, 0, -1):
        tmp = x[0]
        x[0] = x[end]
        x[end] = tmp
        _sift_down(x, 0, end)


@njit_noalloc
def _sift_down(x, pos, end):
    while True:
        c = 2 * pos + 1
        if c >= end:
            return
        if c + 1 < end and x[c + 1] > x[c]:
            c += 1
        if x[c] <= x[pos]:
            return
        tmp = x[c]
        x[c] = x[pos]
        x[pos] = tmp
        pos = c


@njit_noalloc
def _multi_user_arrivals(ipar, fpar, state, arrival):
    """Merged arrival times of a multi-user workload; return their count."""
    lo = ipar[I_USERS_LO]
    width = ipar[I_USERS_HI] - lo + 1
    users = lo + min(np.int64(_uniform(state, S_USERS) * width), width - 1)
    rate = fpar[F_RATE]
    n = 0
    for _u in range(users):
        m = _poisson(state, S_USERS, fpar[F_USER_REQUESTS], ipar[I_USER_CAP])
        t = 0.0
        for _j in range(m):
            t += -math.log(_uniform(state, S_ARRIVAL)) / rate
            arrival[n] = t
            n += 1
    _heapsort(arrival, n)
    if ipar[I_HAS_HORIZON] == 1:
        m = 0
        while m < n and arrival[m] < fpar[F_HORIZON]:
            m += 1
        n = m
    return n


@njit_noalloc(entry=True)
def _draw_workload(rep, key0, key1, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange,
                   trace, prio_val, prio_cdf, pred_edges, state, arrival, prompt, output, prio, sjfk, pgrp, plen):
    """Fill the request arrays of replication ``rep``; return the arrival count.

    ``sjfk`` gets the SJF keys q_i: the true output length, or with a
    lognormal length predictor ceil(O_i * exp(sigma * Z_i)), Z_i standard
    normal from the dedicated stream S_PREDICT (so the other columns do not
    depend on the predictor). ``pgrp`` and ``plen`` get the prefix group
    (-1: none) and the prefix length min(L, P_i - 1) (streams of their own)."""
    _seed_streams(key0, key1, rep, state)
    n_cap = ipar[I_NUM_REQUESTS]
    has_h = ipar[I_HAS_HORIZON] == 1
    horizon = fpar[F_HORIZON]
    n = 0
    if ipar[I_ARRIVAL_KIND] == 1:
        for i in range(n_cap):
            if has_h and arr_times[i] >= horizon:
                break
            arrival[i] = arr_times[i]
            n += 1
    elif ipar[I_ARRIVAL_KIND] == 2:
        n = _multi_user_arrivals(ipar, fpar, state, arrival)
    else:
        rate = fpar[F_RATE]
        shape = fpar[F_BURSTINESS]
        normalize = ipar[I_NORMALIZE_ARRIVALS] == 1
        t = 0.0
        # Gaps ~ Gamma(shape=burstiness, mean=1/rate) (exponential if 1). By
        # default the first request arrives at time 0. `vllm bench serve`
        # instead sums n gaps (the first included) and rescales them so that
        # the last request is sent at exactly n / rate.
        for i in range(n_cap):
            if i > 0 or normalize:
                if shape == 1.0:
                    t += -math.log(_uniform(state, S_ARRIVAL)) / rate
                else:
                    t += _gamma(state, S_ARRIVAL, shape) / (shape * rate)
            if has_h and t >= horizon and not normalize:
                break
            arrival[i] = t
            n += 1
        if normalize:
            # As vLLM, rescale only when the last delay is positive (very
            # bursty gamma gaps can all underflow to 0: everything at t = 0).
            factor = (n_cap / rate) / arrival[n_cap - 1] if arrival[n_cap - 1] > 0.0 else 1.0
            n = 0
            for i in range(n_cap):
                arrival[i] = arrival[i] * factor
                if has_h and arrival[i] >= horizon:
                    break
                n += 1
    mode = ipar[I_TRACE_MODE]
    nrows = trace.shape[0]
    npri = prio_val.size
    # A law of one lognormal component (the usual case) is drawn here, from
    # the same stream as `_sample_length` would: that call, with its table
    # arguments, made the drawing a third slower (96 vs 73 ns per request).
    p_med, p_sig, o_med, o_sig = -1.0, 0.0, -1.0, 0.0
    if mode == 0:
        p_med, p_sig = _one_lognormal(lrange[0], lrange[1], lcomp, lpar)
        o_med, o_sig = _one_lognormal(lrange[2], lrange[3], lcomp, lpar)
    for i in range(n):
        if mode == 0:
            if p_med > 0.0:
                prompt[i] = _lognormal_length(state, S_PROMPT_VALUE, p_med, p_sig)
            else:
                prompt[i] = _sample_length(state, S_PROMPT_COMPONENT, S_PROMPT_VALUE,
                                           lrange[0], lrange[1], lcomp, lpar, ltab, i)
            if o_med > 0.0:
                output[i] = _lognormal_length(state, S_OUTPUT_VALUE, o_med, o_sig)
            else:
                output[i] = _sample_length(state, S_OUTPUT_COMPONENT, S_OUTPUT_VALUE,
                                           lrange[2], lrange[3], lcomp, lpar, ltab, i)
        else:
            if mode == 1:
                row = i % nrows
            else:
                row = min(np.int64(_uniform(state, S_TRACE_ROW) * nrows), nrows - 1)
            prompt[i] = trace[row, 0]
            output[i] = trace[row, 1]
        if npri > 1:
            prio[i] = prio_val[_search_cdf(prio_cdf, 0, npri, _uniform(state, S_PRIORITY))]
        else:
            prio[i] = prio_val[0]
        if ipar[I_PREDICTOR] == 1:
            sjfk[i] = _lognormal_length(state, S_PREDICT, float(output[i]), fpar[F_PRED_SIGMA])
        elif ipar[I_PREDICTOR] == 2:
            # bucket classifier: buckets [e_b, e_{b+1}) with e_0 = 1 (pred_edges =
            # e_0 .. e_{B-1}); right with probability F_PRED_ACCURACY, else a
            # uniformly drawn other bucket; the key is its lower edge
            nb = pred_edges.size
            b = 0
            while b + 1 < nb and output[i] >= pred_edges[b + 1]:
                b += 1
            if nb > 1 and _uniform(state, S_PREDICT) >= fpar[F_PRED_ACCURACY]:
                o = min(np.int64(_uniform(state, S_PREDICT) * (nb - 1)), nb - 2)
                b = o + 1 if o >= b else o
            sjfk[i] = np.int64(pred_edges[b])
        else:
            sjfk[i] = output[i]
        if ipar[I_PREFIX] == 1:
            pgrp[i] = _sample_length(state, S_PREFIX_GROUP, S_PREFIX_GROUP, lrange[6], lrange[7],
                                     lcomp, lpar, ltab, i)
            ln = _sample_length(state, S_PREFIX_LEN, S_PREFIX_LEN, lrange[4], lrange[5], lcomp, lpar, ltab, i)
            plen[i] = min(ln, prompt[i] - 1)
        else:
            pgrp[i] = -1
            plen[i] = 0
    return n


# ==============================================================================
# Waiting queue: a ring-buffer deque (fcfs) or a binary heap (priority, sjf),
# both with lazy deletion of requests that abandoned.

@njit_noalloc
def _before(a, b, key):
    """Heap order: smaller key first, ties by arrival index."""
    return key[a] < key[b] or (key[a] == key[b] and a < b)


@njit_noalloc
def _heap_push(heap, qs, key, i):
    pos = qs[0]
    heap[pos] = i
    qs[0] = pos + 1
    while pos > 0:
        parent = (pos - 1) // 2
        if _before(heap[pos], heap[parent], key):
            tmp = heap[parent]
            heap[parent] = heap[pos]
            heap[pos] = tmp
            pos = parent
        else:
            break


@njit_noalloc
def _heap_pop(heap, qs, key):
    top = heap[0]
    last = qs[0] - 1
    qs[0] = last
    if last > 0:
        heap[0] = heap[last]
        pos = 0
        while True:
            left = 2 * pos + 1
            if left >= last:
                break
            best = left
            right = left + 1
            if right < last and _before(heap[right], heap[left], key):
                best = right
            if _before(heap[best], heap[pos], key):
                tmp = heap[best]
                heap[best] = heap[pos]
                heap[pos] = tmp
                pos = best
            else:
                break
    return top


@njit_noalloc
def _q_push(q, qs, key, policy, i, front):
    """Append request ``i`` (to the front for a preempted fcfs request)."""
    if policy != 0:
        _heap_push(q, qs, key, i)
        return
    # (0 <= head < cap and size < cap: a conditional wrap, not an integer division)
    if front:
        qs[1] = qs[1] - 1 if qs[1] > 0 else q.size - 1
        q[qs[1]] = i
    else:
        e = qs[1] + qs[0]
        q[e - q.size if e >= q.size else e] = i
    qs[0] += 1


# _q_peek, _q_pop and _arrivals_during_step are inlined into the engine loop: together
# +5% (reference workload) and +15% (ShareGPT) requests/s (benchmarks/ab_interleaved.py);
# each alone, or the queue pair alone, was no faster or slower (code layout). LLVM
# inlines them (and _complete_decoders): as fast as Numba's IR inlining, and 6 s less compiling.
@njit_noalloc(inline="llvm")
def _q_peek(q, qs, key, policy, status):
    """Head of the queue, discarding entries of requests no longer waiting; -1 if empty."""
    while qs[0] > 0:
        i = q[0] if policy != 0 else q[qs[1]]
        if status[i] == ST_WAITING:
            return i
        _q_pop(q, qs, key, policy)
    return -1


@njit_noalloc(inline="llvm")
def _q_pop(q, qs, key, policy):
    if policy != 0:
        return _heap_pop(q, qs, key)
    i = q[qs[1]]
    qs[1] = qs[1] + 1 if qs[1] + 1 < q.size else 0
    qs[0] -= 1
    return i


# ==============================================================================
# The engine

# The engine divides by block_size with a shift and a mask where it
# is a power of two (vLLM's always are): a 64-bit division takes 15-40 cycles,
# and was 6% of the engine's time. ``bsh``: log2(block_size), or -1.

@njit_noalloc
def _log2_exact(b):
    """log2(b) for b a power of two, else -1."""
    if b < 1 or b & (b - 1) != 0:
        return -1
    e = 0
    while (1 << e) < b:
        e += 1
    return e


@njit_noalloc(inline="llvm")
def _blocks_of(tokens, bs, bsh):
    """ceil(tokens / bs), the blocks that hold ``tokens`` (tokens >= 0)."""
    if bsh >= 0:
        return (tokens + bs - 1) >> bsh
    return (tokens + bs - 1) // bs


@njit_noalloc(inline="llvm")
def _phase(x, bs, bsh):
    """x mod bs, in [0, bs) for any sign of x (Python's %)."""
    if bsh >= 0:
        return x & (bs - 1)
    return x % bs


@njit_noalloc(inline="llvm")
def _arrival_status(p, o, ipar, in_system, reserved):
    """What ingestion does with an arrival (``docs/engine-model.md``, in order):
    reject it as never fitting, reject it by admission control, or queue it."""
    bs = ipar[I_BLOCK_SIZE]
    mml = ipar[I_MAX_MODEL_LEN]
    if ((mml > 0 and p + o > mml)
            or p + o - 1 > ipar[I_NUM_GPU_BLOCKS] * bs   # (more blocks than the cache: no division)
            or (ipar[I_CHUNKED] == 0 and p + o - 1 > ipar[I_MAX_BATCHED_TOKENS])):
        return ST_REJECTED_TOO_LONG
    admission = ipar[I_ADMISSION]
    if admission == 1 and in_system >= ipar[I_MAX_NUM_SEQS] + ipar[I_MAX_WAITING]:
        return ST_REJECTED_ADMISSION
    if admission == 2 and reserved + p + o > ipar[I_NUM_GPU_BLOCKS] * bs:
        return ST_REJECTED_ADMISSION
    return ST_WAITING


@njit_noalloc
def _account_step(a_occ, a_queue, a_kv, a_l, a_steps, a_max, t, t_end, d, n_run, n_wait, used, ws, we):
    """Run-level bookkeeping of one step [t, t_end) of duration d; time
    integrals count its overlap with the window [ws, we]. Return the updated
    accumulators (scalars, not an array: the call then inlines).
    The occupancy and KV integrals are of running requests and used blocks;
    `_simulate` divides them by max_num_seqs and num_gpu_blocks once at the
    end, not every step (a division costs more than the rest of a step)."""
    if used > a_max:
        a_max = used
    a_steps += 1.0
    a_l += (n_run + n_wait) * d
    overlap = min(t_end, we) - max(t, ws)
    if overlap > 0.0:
        a_occ += overlap * n_run
        a_queue += overlap * n_wait
        a_kv += overlap * used
    return a_occ, a_queue, a_kv, a_l, a_steps, a_max


@njit_noalloc(inline="llvm")
def _arrivals_during_step(nxt, n, t_end, arrival, prompt, output, ipar, n_run, n_wait, reserved,
                          status, q, qs, key, a_l, a_queue, ws, we):
    """Ingest the arrivals during a step ending at ``t_end``: they see it
    before its completions. Return the updated (next arrival, waiting,
    reserved, L integral, queue integral). (Callers skip the call, which
    passes many arrays, when no arrival falls inside the step.)"""
    while nxt < n and arrival[nxt] < t_end:
        i = nxt
        nxt += 1
        status[i] = _arrival_status(prompt[i], output[i], ipar, n_run + n_wait, reserved)
        if status[i] == ST_WAITING:
            if ipar[I_ADMISSION] == 2:
                reserved += prompt[i] + output[i]
            n_wait += 1
            _q_push(q, qs, key, ipar[I_POLICY], i, False)
            # in the system (waiting) since its arrival, not since t_end
            a_l += t_end - arrival[i]
            part = min(t_end, we) - max(arrival[i], ws)
            if part > 0.0:
                a_queue += part
    return nxt, n_wait, reserved, a_l, a_queue


@njit_noalloc
def _first_chunk(need, budget, chunked):
    """Tokens an admitted request gets this step: its need, cut to the budget
    with chunked prefill; -1 if it does not fit (no chunking)."""
    if chunked:
        return min(need, budget)
    return need if need <= budget else -1


@njit_noalloc(inline="llvm")
def _start_running(w, nb, q, qs, key, policy, status, ever, blocks):
    """Move the waiting head ``w`` to running with ``nb`` blocks (the caller
    updates its counts of waiting requests and free blocks)."""
    _q_pop(q, qs, key, policy)
    status[w] = ST_RUNNING
    ever[w] = 1
    blocks[w] = nb


@njit_noalloc
def _compact_run(run, rl, status):
    """Drop requests that are no longer running from ``run[:rl]``, keeping the order."""
    m = 0
    for j in range(rl):
        r = run[j]
        if status[r] == ST_RUNNING:
            run[m] = r
            m += 1
    return m


@njit_noalloc(inline="llvm")
def _rebuild(run, n_run, oth):
    for j in range(n_run):
        oth[j] = run[j]
    return n_run


@njit_noalloc(inline="llvm")
def _d_add(r, kk, gg, S, dmem, dpos, koff, goff, ph, hk, hr, hs, bs, bsh, warmup, output, dstate):
    """Make running request ``r`` (which emitted a token at the end of the last
    step and holds ``kk`` computed tokens, ``gg`` generated) a lazy decoder."""
    n_d = dstate[0]
    dmem[n_d] = r
    dpos[r] = n_d
    dstate[0] = n_d + 1
    koff[r] = kk - S
    goff[r] = gg - S
    ph[_phase(kk - S, bs, bsh)] += 1
    dstate[1] += kk - S
    if r >= warmup:
        dstate[2] += 1
    # completion heap keyed by the fast-step count at which g reaches output
    _heap2_push(hk, hr, hs, S + output[r] - gg, r)


@njit_noalloc
def _d_remove(r, dmem, dpos, koff, ph, bs, bsh, warmup, dstate):
    n_d = dstate[0] - 1
    pos = dpos[r]
    last = dmem[n_d]
    dmem[pos] = last
    dpos[last] = pos
    dpos[r] = -1
    dstate[0] = n_d
    ph[_phase(koff[r], bs, bsh)] -= 1
    dstate[1] -= koff[r]
    if r >= warmup:
        dstate[2] -= 1


@njit_noalloc(inline="llvm")
def _complete_decoders(t, S, free, reserved, n_run, hk, hr, hs, dmem, dpos, koff, ph, bs, bsh, warmup, dstate, k,
                       g, blocks, status, finish_t, last_t, prompt, output, admission):
    """Complete the lazy decoders whose last token came at the end of fast
    step ``S`` (at ``t``): release their blocks (and KV reservations); return
    the updated (free blocks, reserved tokens, running requests)."""
    while hs[0] > 0 and hk[0] == S:
        r = _heap2_pop(hk, hr, hs)
        _d_remove(r, dmem, dpos, koff, ph, bs, bsh, warmup, dstate)
        k[r] = koff[r] + S
        g[r] = output[r]
        free += _blocks_of(k[r], bs, bsh)
        blocks[r] = 0
        if admission == 2:
            reserved -= prompt[r] + output[r]
        status[r] = ST_COMPLETED
        finish_t[r] = t
        last_t[r] = t
        n_run -= 1
    return free, reserved, n_run


@njit_noalloc
def _heap2_push(hk, hr, hs, key, r):
    pos = hs[0]
    hs[0] = pos + 1
    while pos > 0:
        parent = (pos - 1) // 2
        if hk[parent] <= key:
            break
        hk[pos] = hk[parent]
        hr[pos] = hr[parent]
        pos = parent
    hk[pos] = key
    hr[pos] = r


@njit_noalloc(inline="llvm")
def _heap2_pop(hk, hr, hs):
    top = hr[0]
    last = hs[0] - 1
    hs[0] = last
    if last > 0:
        key = hk[last]
        r = hr[last]
        pos = 0
        while True:
            c = 2 * pos + 1
            if c >= last:
                break
            if c + 1 < last:
                # the smaller child as arithmetic, not a branch: 7% faster on
                # ShareGPT (64 seats), the same on the issue-7 workload (32)
                c += np.int64(hk[c + 1] < hk[c])
            if hk[c] >= key:
                break
            hk[pos] = hk[c]
            hr[pos] = hr[c]
            pos = c
        hk[pos] = key
        hr[pos] = r
    return top


# ==============================================================================
# Prefix cache (docs/engine-model.md, "Prefix caching"). Entry (G, j) has the
# id G * jmax + j; cnt[e] is its reference count (-1: not cached). The
# evictable entries (count 0) form a doubly linked LRU list (lprev, lnext;
# cst = [head, tail, evictable count, cached count]). Request i may use the
# entries j < f_i; held[hoff[i] + j] says whether it references (G_i, j).

@njit_noalloc
def _lru_append(e, cst, lprev, lnext):
    lprev[e] = cst[1]
    lnext[e] = -1
    if cst[1] >= 0:
        lnext[cst[1]] = e
    else:
        cst[0] = e
    cst[1] = e
    cst[2] += 1


@njit_noalloc
def _lru_remove(e, cst, lprev, lnext):
    p = lprev[e]
    q = lnext[e]
    if p >= 0:
        lnext[p] = q
    else:
        cst[0] = q
    if q >= 0:
        lprev[q] = p
    else:
        cst[1] = p
    cst[2] -= 1


@njit_noalloc
def _take_blocks(nb, free, cst, cnt, lprev, lnext):
    """Take ``nb`` blocks for private use: free ones first, then evict the
    head of the evictable list. Return the new number of free blocks."""
    while free < nb:
        e = cst[0]
        _lru_remove(e, cst, lprev, lnext)
        cnt[e] = -1
        cst[3] -= 1
        free += 1
    return free - nb


@njit_noalloc
def _release_blocks(r, free, private, nent, grp, fpre, held, hoff, jmax, cst, cnt, lprev, lnext):
    """Spec, "Release": r's private blocks become free; the counts of the
    entries it references drop in descending j (a count reaching 0 joins the
    tail of the evictable list). Return the new number of free blocks."""
    free += private[r]
    private[r] = 0
    if nent[r] > 0:
        base = grp[r] * jmax
        for j in range(fpre[r] - 1, -1, -1):
            if held[hoff[r] + j]:
                held[hoff[r] + j] = 0
                e = base + j
                cnt[e] -= 1
                if cnt[e] == 0:
                    _lru_append(e, cst, lprev, lnext)
        nent[r] = 0
    return free


@njit_noalloc
def _lookup(w, grp, fpre, jmax, cnt):
    """Spec, "Lookup": the longest run of cached entries (G_w, 0 .. h-1), h <= f_w."""
    h = 0
    if fpre[w] > 0:
        base = grp[w] * jmax
        while h < fpre[w] and cnt[base + h] >= 0:
            h += 1
    return h


@njit_noalloc
def _evictable_hits(w, h, grp, jmax, cnt):
    """How many of w's h hit entries are evictable (not free capacity for w)."""
    m = 0
    base = grp[w] * jmax
    for j in range(h):
        if cnt[base + j] == 0:
            m += 1
    return m


@njit_noalloc
def _claim_hits(w, h, grp, held, hoff, jmax, nent, cst, cnt, lprev, lnext):
    base = grp[w] * jmax
    for j in range(h):
        e = base + j
        if cnt[e] == 0:
            _lru_remove(e, cst, lprev, lnext)
        cnt[e] += 1
        held[hoff[w] + j] = 1
    nent[w] = h


@njit_noalloc
def _register(r, k0, k1, bs, grp, fpre, held, hoff, jmax, private, nent, cst, cnt):
    """Spec, "Registration": r's blocks j in [k0 // bs, min(k1 // bs, f_r))
    become entries (count 1) unless the cache already holds (G_r, j)."""
    hi = min(k1 // bs, fpre[r])
    base = grp[r] * jmax
    for j in range(k0 // bs, hi):
        e = base + j
        if cnt[e] >= 0:
            continue
        cnt[e] = 1
        cst[3] += 1
        held[hoff[r] + j] = 1
        nent[r] += 1
        private[r] -= 1


# ==============================================================================
# Workspace. A replication's whole state lives in two flat arrays, ``wi``
# (int64) and ``wf`` (float64), carved into views by `_simulate`, so that the
# engine allocates nothing: a CPU thread reuses one workspace for all its
# replications, and a GPU thread gets its slice of one device allocation.
# Layout (n requests): wi = status, k, g, blocks, npre, nswap, ctok (7n), a
# reduction scratch (n + N_HIST), the inter-token gap weights (nitl), then the
# engine's internal state; wf = first_t, last_t, finish_t, swapped_s (4n), the
# accumulators (N_ACC), a reduction scratch (3n), the gap values (nitl), then
# internal state. `_ws_sizes` is the one statement of the sizes (from the
# dimensions `_ws_dims` reads off the requests; `_ws_need` composes the two);
# the per-request columns of the heads are named below (column j of a head
# is ``a[j * n:(j + 1) * n]``; a jitted function without NRT cannot return
# the view, so each use slices).

WI_STATUS, WI_K, WI_G, WI_BLOCKS, WI_NPRE, WI_NSWAP, WI_CTOK, WI_ONES = range(8)   # WI_ONES: reduction scratch
WI_HEAD = 8          # columns before the histogram (N_HIST), the gap weights, internal state
WF_FIRST, WF_LAST, WF_FINISH, WF_SWAPPED = range(4)
WF_HEAD = 4          # columns before the accumulators (N_ACC)
WF_SCRATCH = 3       # reduction scratch after the accumulators (TTFT, E2E, TPOT), then the gap values


@njit_noalloc
def _ws_dims(n, output, pgrp, plen, ipar):
    """Data-dependent sizes: (seats, prefix-cache entries, prefix references,
    gap samples, most prefix blocks of a request)."""
    bs = ipar[I_BLOCK_SIZE]
    cap = max(1, min(ipar[I_MAX_NUM_SEQS], n))
    # Gaps come only from measured requests that can complete, whose output
    # fits the KV cache: cap each term so one huge (rejected) draw cannot
    # exhaust memory. (Gaps are stored as weighted samples, one per step for
    # the lazy decoders, so far fewer entries are used.)
    kv_tokens = ipar[I_NUM_GPU_BLOCKS] * bs
    n_tok = 0
    for i in range(ipar[I_WARMUP], n):
        n_tok += min(output[i], kv_tokens)
    ngrp = 0
    jmax = 0
    nheld = 0
    if ipar[I_CACHING] == 1:
        for i in range(n):
            if pgrp[i] >= 0:
                f = plen[i] // bs
                ngrp = max(ngrp, pgrp[i] + 1)
                jmax = max(jmax, f)
                nheld += f
    return cap, max(ngrp * jmax, 1), max(nheld, 1), max(n_tok, 1), jmax


@njit_noalloc(entry=True)
def _ws_need(n, output, pgrp, plen, ipar):
    """Sizes (int64 entries, float64 entries) of the workspace of requests ``0..n-1``."""
    cap, ncnt, nheld, nitl, _jmax = _ws_dims(n, output, pgrp, plen, ipar)
    return _ws_sizes(n, ipar[I_BLOCK_SIZE], cap, ncnt, nheld, nitl)


@njit_noalloc
def _ws_sizes(n, bs, cap, ncnt, nheld, nitl):
    """The workspace sizes from the dimensions `_ws_dims` gives (the layout `_simulate` carves)."""
    # q, qs, run, sched, ever, dmem, dpos, koff, goff, ph, hk, hr, hs, dstate,
    # oth, sq, sqs, fpre, hoff, cnt, lprev, lnext, cst, held, private, nent, gapw
    internal = ((2 * n + 2) + 2 + 2 * cap + n + n + cap + n + n + n + bs + cap + cap + 1 + 3
                + cap + (n + 1) + 1 + n + (n + 1) + 3 * ncnt + 4 + nheld + n + n + (cap + 1))
    need_i = WI_HEAD * n + N_HIST + nitl + internal
    # key, dec_cost, skey, swapped_since
    need_f = (WF_HEAD + WF_SCRATCH) * n + N_ACC + nitl + n + (cap + 1) + n + n
    return need_i, need_f


@njit_noalloc
def _gap_add(itl_v, itl_w, n_itl, x, w):
    """Record ``w`` inter-token gaps of value ``x``; return the new entry count.
    A gap equal to the last entry's value adds to its multiplicity (steps of
    one batch composition repeat their duration: 3-10x fewer entries)."""
    if n_itl > 0 and itl_v[n_itl - 1] == x:
        itl_w[n_itl - 1] += w
        return n_itl
    itl_v[n_itl] = x
    itl_w[n_itl] = w
    return n_itl + 1


# --- event skipping: a stretch's bookkeeping in closed form -------------------------
# A stretch is a run of steps in which every running request is a lazy decoder
# and nothing happens but token counts (docs/engine-model.md does not know the
# word: a stretch is ordinary steps). Step j of a stretch (j = 0, 1, ...) lasts
# d0 + j * dlt (the context term grows by one token per decoder per step), so
# its first j steps take `_elapsed(j, d0, dlt)`; step j allocates the new
# blocks of the decoders whose token count is a multiple of block_size,
# ph[(sph - j) mod block_size]. The clock gives the running sum of the
# reference bit for bit: one addition per step, or many steps at once inside a
# binade (`_binade_steps`), where that sum is exact arithmetic.

_UNBOUNDED = 1 << 62
_BINADE_AFTER = 32   # steps of a stretch summed one by one before `_binade_steps` is tried
_TINY = 2.0 ** -1022  # the smallest normal double


@njit_noalloc
def _plain_step(base, dec_cost, b):
    """Duration of a step of ``b`` decoders and nothing else. dec_cost[0] and
    dec_cost[1] are 0.0, so these are the bits of a step's
    ``d = base; if b > 1: d += dec_cost[b]`` (with 0.0 prefill and context terms)."""
    return base + dec_cost[b]


@njit_noalloc
def _steps_within(t, dd, j, limit):
    """The largest i in [0, j] with t + i * dd < limit, the sums exact
    (`_binade_steps`): estimated by a division, then corrected."""
    if t + j * dd < limit:
        return j
    i = min(max(np.int64((limit - t) / dd), np.int64(0)), j) if limit > t else np.int64(0)
    while i > 0 and t + i * dd >= limit:
        i -= 1
    while i < j and t + (i + 1) * dd < limit:
        i += 1
    return i


@njit_noalloc
def _binade_steps(t, d, jmax, limit):
    """Up to ``jmax`` steps of duration ``d`` from ``t`` at once, with the
    clock the running sum would give, bit for bit: return (steps, clock).

    In t's binade [2^(e-1), 2^e) the doubles are the multiples of
    u = 2^(e-53). While a sum x + d (x such a multiple) stays below 2^e,
    rounding it to the nearest double gives x + D, D = d rounded to a multiple
    of u; so j steps end at t + j * D exactly. Taken: the most steps whose
    sums stay in the binade, that start before ``limit`` (the next arrival
    or the horizon, as the step loop decides). 0 when none can be taken this way: t = 0
    (or subnormal), a sum leaving the binade, or a d halfway
    between two multiples of u (a tie, rounded to even: the increment
    alternates)."""
    if not t >= _TINY or jmax < 2:   # (0, or subnormal: u would underflow)
        return 0, t
    mant, ex = math.frexp(t)          # t = mant * 2^ex, 0.5 <= mant < 1
    if ex > 1023:                     # (the top binade: its top overflows)
        return 0, t
    room = math.ldexp(1.0, ex) - t    # to the binade's top (exact)
    if not d < room:
        return 0, t
    u = math.ldexp(1.0, ex - 53)
    q = d / u                         # exact (u is a power of two)
    fq = math.floor(q)
    fr = q - fq
    if fr == 0.5:
        return 0, t
    dk = np.int64(fq) + (1 if fr > 0.5 else 0)
    if dk == 0:
        return 0, t
    dd = dk * u                       # D
    # step i (1-based) adds d to t + (i - 1) * D: below the top while
    # (i - 1) * dk + fq + fr < room / u, i.e. (i - 1) * dk + fq <= room / u - 1
    j = (np.int64(room / u) - 1 - np.int64(fq)) // dk + 1
    j = min(j, jmax)
    if j <= 0:
        return 0, t
    # (t + i * D is exact for i <= j: a multiple of u, at most the top)
    # the steps that start before the limit (t is before it)
    j = _steps_within(t, dd, j - 1, limit) + 1
    return j, t + j * dd


# Inlined into the engine loop (its one call site): +5.5% requests/s on the
# reference workload and +12% on ShareGPT (benchmarks/ab_interleaved.py).
@njit_noalloc(inline="llvm")
def _stretch_steps(t, kmax, limit, d, c_ctx, n_d, ksum, S, ph, sph, bs, free):
    """The steps of a stretch, at most ``kmax``, that start before ``limit``
    (the next arrival or the horizon, whichever comes first: an arrival
    during a step does not change the step) and whose new blocks fit in
    ``free``; return (steps,
    clock at their end, blocks B they allocate, S1, S2), with S1 and S2 the
    sums over those steps i = 0, 1, ... of b_i * i and b_i * i * i (S2 only
    with a context term, dlt = c_ctx * n_d != 0, else 0), b_i the blocks step
    i allocates, ph[(sph - i) mod block_size] (`_kv_weight` turns them into
    the KV integral's W, see `_stretch_kv`).

    The clock is a running sum of the steps' durations, the terms and order
    of a fast step's (so ties go as in the reference): one addition per step,
    then, without a context term, a few operations per binade
    (`_binade_steps`, its blocks in closed form: `_stretch_kv`). ``d``:
    `_plain_step`. The blocks are counted in the step loop, which is bound by
    the latency of its additions: they come for free there."""
    kk = 0
    nb = 0
    s1 = 0.0
    s2 = 0.0
    idx = sph
    quad = c_ctx * n_d != 0.0   # (as `_kv_weight` decides)
    # Short stretches (the common case) are cheaper summed step by step;
    # after _BINADE_AFTER steps, the rest goes binade by binade (a try that
    # fails, at a binade's top or on a tie, is retried that many steps
    # later). Only with a constant duration: no context term.
    lim = min(kmax, _BINADE_AFTER) if c_ctx == 0.0 else kmax
    while True:
        # (no call inside this loop: a call would make LLVM keep t and the
        # sums in memory, which doubles the cost of a step)
        while kk < lim and t < limit:
            c = ph[idx]
            if nb + c > free:
                return kk, t, nb, s1, s2
            nb += c
            s1 += float(c * kk)   # (no test of c > 0: a branch mispredicted every few steps)
            if quad:
                s2 += float(c * kk) * kk
            if c_ctx != 0.0:   # (without a context term it would add 0.0)
                t = t + (d + c_ctx * (ksum + n_d * (S + kk + 1)))
            else:
                t = t + d
            kk += 1
            idx = idx - 1 if idx > 0 else bs - 1
        if kk == kmax or not t < limit:
            return kk, t, nb, s1, s2
        # many steps at once (a constant duration: no S2)
        j, t_j = _binade_steps(t, d, min(kmax - kk, _stretch_blocks(ph, idx, bs, free - nb, n_d)), limit)
        if j > 0:
            b, w = _stretch_kv(ph, idx, bs, j, 1.0, 0.0)   # (w: the chunk's own S1)
            nb += b
            s1 += w + float(kk) * b
            t = t_j
            kk += j
            idx = (idx - j) % bs
        lim = min(kmax, kk + _BINADE_AFTER)


@njit_noalloc
def _elapsed(j, d0, dlt):
    """Duration of the first ``j`` steps of a stretch, for its time integrals
    (the clock itself is a running sum, as the reference's)."""
    return j * d0 + dlt * (j * (j - 1.0) * 0.5)


@njit_noalloc
def _stretch_blocks(ph, sph, bs, free, per_cycle):
    """The most steps of a stretch whose new blocks fit in ``free`` blocks;
    ``per_cycle`` = sum(ph), the decoders (each needs one block per
    block_size steps)."""
    if per_cycle == 0:
        return _UNBOUNDED
    cycles = free // per_cycle
    rem = free - cycles * per_cycle
    j = 0
    idx = sph
    while j < bs and ph[idx] <= rem:
        rem -= ph[idx]
        j += 1
        idx = idx - 1 if idx > 0 else bs - 1
    return cycles * bs + j


@njit_noalloc
def _stretch_kv(ph, sph, bs, k, d0, dlt):
    """Blocks allocated by the first ``k`` steps of a stretch, B, and
    W = sum over those steps i of b_i * _elapsed(i), where b_i is the blocks
    step i allocates: with them, the KV integral over the stretch,
    sum_j d_j * (used0 + b_0 + ... + b_j), is (used0 + B) * _elapsed(k) - W.

    As _elapsed(i) = d0 * i + dlt * i * (i - 1) / 2, W needs only
    S1 = sum b_i * i and S2 = sum b_i * i * i. Step i = r + block_size * j
    (residue r) allocates c_r = ph[(sph - r) mod block_size] blocks; residues
    r < k mod block_size have m = k // block_size + 1 such steps, the others
    m = k // block_size. For each group, S1 and S2 follow from the integer
    sums of c_r, c_r * r and c_r * r * r and the sums over j of (r + bs j) and
    (r + bs j)^2: O(block_size) integer work and a few flops."""
    if k < bs:
        q = 0
        rem = k
    else:
        q = k // bs
        rem = k - q * bs
    blocks = 0
    s1 = 0.0
    s2 = 0.0
    idx = sph
    r = 0
    # Without a context term (dlt = 0, e.g. the A10G model) S2 is not needed:
    # skipping it takes 20% off this function's time (LLVM moves the
    # loop-invariant test out of the loop).
    quad = dlt != 0.0
    for grp in range(2):
        # group 0: residues r < rem (m = q + 1); group 1: the rest (m = q)
        hi = rem if grp == 0 else (bs if q > 0 else rem)
        c0 = 0
        c1 = 0
        c2 = 0
        while r < hi:
            c = ph[idx]
            c0 += c
            c1 += c * r
            if quad:
                c2 += c * r * r
            idx = idx - 1 if idx > 0 else bs - 1
            r += 1
        m = q + 1 if grp == 0 else q
        if c0 > 0 and m > 0:
            blocks += c0 * m
            mf = float(m)
            bsf = float(bs)
            tri = bsf * (mf * (mf - 1.0) * 0.5)                   # sum over j < m of bs * j
            s1 += mf * c1 + tri * c0
            if quad:
                sq = bsf * bsf * (mf * (mf - 1.0) * (2.0 * mf - 1.0) / 6.0)   # ... of (bs * j)^2
                s2 += mf * c2 + 2.0 * tri * c1 + sq * c0
    return blocks, _kv_weight(s1, s2, d0, dlt)


@njit_noalloc
def _kv_weight(s1, s2, d0, dlt):
    """W of `_stretch_kv` from S1 and S2."""
    if dlt != 0.0:
        return d0 * s1 + dlt * 0.5 * (s2 - s1)
    return d0 * s1   # (the bits of d0 * s1 + 0.0, as s1 >= 0)


# Static batching, active priority preemption, swap preemption, prefix
# caching: the options only the full engine has (`_simulate`'s ``full``).
_FULL_ENGINE_FLAGS = (I_STATIC, I_PRIO_PREEMPT, I_SWAP, I_CACHING)


def _full_engine_needed(ipar):
    """Whether ``ipar`` asks for an option of the full engine (plain
    Python: `engine_variant` calls it, `_needs_full_engine` compiles it)."""
    for i in _FULL_ENGINE_FLAGS:
        if ipar[i] == 1:
            return True
    return False


_needs_full_engine = njit_noalloc(_full_engine_needed)


def engine_variant(ipar):
    """The ``full`` argument of `_simulate` (and `run_chunk`) for ``ipar``:
    None, the common engine, unless the scenario uses an option that only
    the full engine has (then 1)."""
    return 1 if _full_engine_needed(ipar) else None


@njit_noalloc(entry=True)
def _simulate(n, arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, wi, wf, full):
    """Run one replication of the engine model over requests ``0..n-1``.

    Fills the per-request arrays (``status``, ``first_t``, ``finish_t``,
    ``npre``, ``g``), the inter-token gaps of measured requests as weighted
    samples (``itl_v`` values, ``itl_w`` multiplicities; their count in
    ``acc[A_N_ITL]``) and the run-level accumulators ``acc``.
    Semantics: ``docs/engine-model.md``.

    Two paths compute the same steps. A *fast step* applies when every
    running request can be scheduled in full (their token needs fit the
    budget and their new KV blocks fit the free blocks), so that the order of
    the running batch and preemption play no role. Then requests that are
    plainly decoding (they emitted a token at the end of the previous step)
    are handled in aggregate, O(1) per step: their computed and generated
    tokens are ``koff + S`` and ``goff + S`` with ``S`` the number of fast
    steps so far, the blocks they need this step are counted by a histogram
    of ``koff mod block_size``, their completions come from a heap keyed by
    the step at which they finish, and their inter-token gaps (all equal to
    the step duration) are one weighted sample, or, for a step with no
    prefill and no context term, a count in ``gapw`` by decoder count (entered
    once at the end, as the step duration d; the reference takes differences
    of clock readings, fl(t + d) - t, which differ from d by up to ulp(t) / 2:
    relative to d, 1e-13 for clocks below 1e3 s, but 1e-5 for a clock near
    1.7e9 s, epoch timestamps). Any other step is a *slow
    step*: the lazy decoders are materialised and the step is scheduled
    request by request in admission order (preemption included). Both paths
    add the same terms in the same order as the reference simulator, so
    every request's times are bit-identical to the reference's
    (tests/test_reference_agreement.py).
    Event skipping runs a *stretch* of fast steps in which nothing happens but
    token counts: the clock is the reference's running sum bit for bit
    (`_stretch_steps`: one addition per step, or many steps at once inside a
    binade), the blocks are counted in that loop (in closed form, O(block_size),
    for steps taken many at once), the time integrals and the inter-token
    gaps are in closed form (O(steps) for the gaps with a context term);
    those run-level figures then agree with the reference to rounding
    (tests/test_stretch.py). A stretch ends with the step of the next
    completion or during which the next request arrives, or sooner.

    The options of issue 10 that act on scheduling are implemented in the
    slow step only, and force it (correctness first): active priority
    preemption while a request waits (phase 0), and swap preemption while a
    request is swapped out (phase 2, pending transfer time), and prefix
    caching (every step; ``blocks`` then counts a request's private blocks
    plus the cache entries it references, ``free`` the blocks holding
    nothing). ``nswap`` and ``swapped_s`` get each request's preemptions by
    swap and its time in the swapped queue, ``ctok`` its cached tokens (the
    full engine only: the common engine leaves those three as they are).

    ``full`` chooses the compiled engine (`engine_variant`): ``None``, the
    *common* engine, without static batching and those three options
    (-2 is returned if ``ipar`` asks for one of them), or ``1``, the engine
    with all of them. When ``full`` is None, Numba prunes the branches of
    the options before typing, so the common engine compiles faster; both
    run the same code otherwise.
    Returns the number of inter-token gap entries, or -1 if the workspace
    is too small.
    """
    if full is None:
        # The common engine: these flags are constants, so Numba drops the
        # branches they guard (and their helpers) before typing them.
        if _needs_full_engine(ipar):
            return -2
        static = False
        prio_preempt = False
        swap = False
        caching = False
    else:
        static = ipar[I_STATIC] == 1
        prio_preempt = ipar[I_PRIO_PREEMPT] == 1
        swap = ipar[I_SWAP] == 1
        caching = ipar[I_CACHING] == 1
    mns = ipar[I_MAX_NUM_SEQS]
    mbt = ipar[I_MAX_BATCHED_TOKENS]
    bs = ipar[I_BLOCK_SIZE]
    bsh = _log2_exact(bs)
    nblk = ipar[I_NUM_GPU_BLOCKS]
    chunked = ipar[I_CHUNKED] == 1
    policy = ipar[I_POLICY]
    admission = ipar[I_ADMISSION]
    warmup = ipar[I_WARMUP]
    has_delay = ipar[I_HAS_DELAY] == 1
    has_h = ipar[I_HAS_HORIZON] == 1
    max_delay = fpar[F_MAX_DELAY]
    horizon = fpar[F_HORIZON]
    base, dscale, dalpha, c_prefill, c_ctx = lat[0], lat[1], lat[2], lat[3], lat[4]
    has_aging = ipar[I_HAS_AGING] == 1
    aging = fpar[F_AGING]
    # The victim of a preemption: the largest (key, index) for priority, and
    # for sjf with active priority preemption; else the last admitted.
    keyed_victim = policy == 1 or (policy == 2 and prio_preempt)
    swap_cap = ipar[I_SWAP_BLOCKS]
    c_swap = lat[5]

    # Carve the state out of the workspace (layout: _ws_need, which also checks the sizes).
    cap, ncnt, nheld, nitl, jmax = _ws_dims(n, output, pgrp, plen, ipar)
    need_i, need_f = _ws_sizes(n, bs, cap, ncnt, nheld, nitl)
    if need_i > wi.size or need_f > wf.size:
        return -1
    status = wi[WI_STATUS * n:(WI_STATUS + 1) * n]
    k = wi[WI_K * n:(WI_K + 1) * n]
    g = wi[WI_G * n:(WI_G + 1) * n]
    blocks = wi[WI_BLOCKS * n:(WI_BLOCKS + 1) * n]
    npre = wi[WI_NPRE * n:(WI_NPRE + 1) * n]
    nswap = wi[WI_NSWAP * n:(WI_NSWAP + 1) * n]
    ctok = wi[WI_CTOK * n:(WI_CTOK + 1) * n]
    o = WI_HEAD * n + N_HIST
    itl_w = wi[o:o + nitl]
    o += nitl
    q = wi[o:o + 2 * n + 2]
    o += 2 * n + 2
    qs = wi[o:o + 2]                    # (size incl. stale entries, ring head)
    o += 2
    run = wi[o:o + 2 * cap]             # running requests in admission order (+ completed, until compacted)
    o += 2 * cap
    sched = wi[o:o + n]                 # tokens scheduled for each request this step
    o += n
    ever = wi[o:o + n]                  # 1: ever scheduled (abandonment applies otherwise)
    o += n
    # lazy decoders (fast steps)
    dmem = wi[o:o + cap]
    o += cap
    dpos = wi[o:o + n]
    o += n
    koff = wi[o:o + n]
    o += n
    goff = wi[o:o + n]
    o += n
    ph = wi[o:o + bs]
    o += bs
    hk = wi[o:o + cap]
    o += cap
    hr = wi[o:o + cap]
    o += cap
    hs = wi[o:o + 1]
    o += 1
    dstate = wi[o:o + 3]                # (count, sum of koff, measured count)
    o += 3
    oth = wi[o:o + cap]                 # the other running requests (unordered)
    o += cap
    sq = wi[o:o + n + 1]                # swapped queue (preemption_mode="swap")
    o += n + 1
    sqs = wi[o:o + 1]
    o += 1
    fpre = wi[o:o + n]                  # prefix cache: f_i, the prefix blocks request i can share
    o += n
    hoff = wi[o:o + n + 1]
    o += n + 1
    cnt = wi[o:o + ncnt]
    o += ncnt
    lprev = wi[o:o + ncnt]
    o += ncnt
    lnext = wi[o:o + ncnt]
    o += ncnt
    cst = wi[o:o + 4]
    o += 4
    held = wi[o:o + nheld]
    o += nheld
    private = wi[o:o + n]
    o += n
    nent = wi[o:o + n]
    o += n
    gapw = wi[o:o + cap + 1]            # inter-token gaps of pure decode steps, by decoder count
    first_t = wf[WF_FIRST * n:(WF_FIRST + 1) * n]
    last_t = wf[WF_LAST * n:(WF_LAST + 1) * n]
    finish_t = wf[WF_FINISH * n:(WF_FINISH + 1) * n]
    swapped_s = wf[WF_SWAPPED * n:(WF_SWAPPED + 1) * n]
    acc = wf[WF_HEAD * n:WF_HEAD * n + N_ACC]
    o = (WF_HEAD + WF_SCRATCH) * n + N_ACC
    itl_v = wf[o:o + nitl]
    o += nitl
    key = wf[o:o + n]
    o += n
    dec_cost = wf[o:o + cap + 1]
    o += cap + 1
    skey = wf[o:o + n]
    o += n
    swapped_since = wf[o:o + n]

    # Queue keys e_i (docs/engine-model.md, "Waiting-queue order"): the
    # priority class c_i or the SJF key q_i; unused for fcfs. Doubles, so
    # that integer keys and aged keys share one heap (integers are exact).
    # The swapped queue is a heap ordered by (e_i, i), by i for fcfs.
    hoff[0] = 0
    # (one loop per array: LLVM turns each into a memset or a vector loop,
    # where one loop over all the arrays stores one element at a time)
    for i in range(n):
        status[i] = ST_PENDING
    for i in range(n):
        k[i] = 0
    for i in range(n):
        g[i] = 0
    for i in range(n):
        blocks[i] = 0
    for i in range(n):
        npre[i] = 0
    for i in range(n):
        sched[i] = 0
    for i in range(n):
        ever[i] = 0
    for i in range(n):
        dpos[i] = -1
    for i in range(n):
        first_t[i] = np.nan
    for i in range(n):
        last_t[i] = np.nan
    for i in range(n):
        finish_t[i] = np.nan
    if policy != 0 or has_aging or prio_preempt:   # (fcfs has no keys)
        for i in range(n):
            key[i] = float(prio[i]) if policy == 1 else float(sjfk[i])
            if has_aging:
                # e_i = c_i + a_i / A: a_i / A first, then added to the integer as a double
                key[i] = key[i] + arrival[i] / aging
    if full is not None:
        # The arrays of swap preemption and prefix caching: the common engine
        # has neither and leaves them as they are (a quarter less memory
        # written per request; `_reduce` reads nswap only with swap).
        for i in range(n):
            nswap[i] = 0
            ctok[i] = 0
            swapped_s[i] = 0.0
            skey[i] = key[i] if policy != 0 else float(i)
            fpre[i] = plen[i] // bs if caching and pgrp[i] >= 0 else 0
            hoff[i + 1] = hoff[i] + fpre[i]
            private[i] = 0
            nent[i] = 0
    for j in range(bs):
        ph[j] = 0
    for j in range(cap + 1):
        gapw[j] = 0
    qs[0] = 0
    qs[1] = 0
    hs[0] = 0
    sqs[0] = 0
    for j in range(3):
        dstate[j] = 0
    for j in range(ncnt):
        cnt[j] = -1
    for j in range(nheld):
        held[j] = 0
    cst[0] = -1
    cst[1] = -1
    cst[2] = 0
    cst[3] = 0
    # decode term of the step time by batch size: the same expression as below, computed once
    dec_cost[0] = 0.0
    dec_cost[1] = 0.0
    for b in range(2, cap + 1):
        dec_cost[b] = dscale * (b - 1.0) ** dalpha
    # Without a context term, a step with no prefill lasts base + dec_cost[b]
    # for b decoders (the other terms add 0.0): the inter-token gaps of such
    # steps are counted by b in `gapw` and entered once at the end, as that
    # duration (the reference takes differences of clock readings, which agree
    # to rounding). Most gaps are of this kind: far fewer entries to select from.
    pure = c_ctx == 0.0
    for j in range(N_ACC):
        acc[j] = 0.0
    n_sw = 0            # swapped requests
    swap_used = 0       # blocks they hold in CPU swap space
    pending_swap = 0    # blocks moved since the last step with a duration (charged to the next one)

    # Measurement window start: the run's start (time 0, when a benchmark
    # client starts its clock) without warm-up, else the first measured arrival.
    ws = 0.0 if warmup == 0 else (arrival[warmup] if n > warmup else np.inf)
    we = horizon if has_h else np.inf   # window end (else the end of the run)
    acc[A_WINDOW_START] = ws
    # Run-level accumulators live in registers; stored in `acc` at the end.
    a_occ = 0.0     # integral over the window of running requests
    a_queue = 0.0   # ... of waiting requests
    a_kv = 0.0      # ... of used blocks
    a_l = 0.0       # integral over the run of the number in system
    a_steps = 0.0
    a_max = 0       # most blocks used
    n_run = 0       # running requests (lazy decoders + others)
    rl = 0          # length of `run`, completed entries included
    n_oth = 0
    S = 0           # fast steps so far
    sph = 0         # (-S) mod block_size, kept incrementally (no integer division per step)
    n_wait = 0
    free = nblk
    reserved = 0
    nxt = 0
    drop_ptr = 0
    n_itl = 0
    t = 0.0

    while True:
        if n_run == 0 and n_wait == 0 and n_sw == 0:
            if nxt >= n:
                break
            if arrival[nxt] > t:
                t = arrival[nxt]   # idle: jump to the next arrival
        if has_h and t >= horizon:
            break
        # -- ingest arrivals up to and including t (engine idle or step start)
        while nxt < n and arrival[nxt] <= t:
            i = nxt
            nxt += 1
            status[i] = _arrival_status(prompt[i], output[i], ipar, n_run + n_wait + n_sw, reserved)
            if status[i] == ST_WAITING:
                if admission == 2:
                    reserved += prompt[i] + output[i]
                n_wait += 1
                _q_push(q, qs, key, policy, i, False)
        # -- abandonment, observed at step start
        if has_delay:
            while drop_ptr < nxt and arrival[drop_ptr] + max_delay <= t:
                i = drop_ptr
                drop_ptr += 1
                if status[i] == ST_WAITING and not ever[i]:
                    status[i] = ST_DROPPED
                    finish_t[i] = t
                    n_wait -= 1
                    if admission == 2:
                        reserved -= prompt[i] + output[i]
        if n_run == 0 and n_wait == 0 and n_sw == 0:
            continue

        n_d = dstate[0]
        # -- can every running request be scheduled in full? (fast step)
        fast = False
        if not static:
            need_tok = n_d
            need_blk = ph[sph]   # lazy decoders whose k is a multiple of block_size
            for jj in range(n_oth):
                r = oth[jj]
                s = prompt[r] + g[r] - k[r]
                need_tok += s
                need_blk += _blocks_of(k[r] + s, bs, bsh) - blocks[r]
            fast = need_tok <= mbt and need_blk <= free
            # Correctness first: with active priority preemption and a waiting
            # request, phase 0 may preempt, so the step is always a slow one.
            if prio_preempt and n_wait > 0:
                fast = False
            # Likewise with a swapped request (phase 2) or transfers to charge.
            if n_sw > 0 or pending_swap > 0:
                fast = False
            # And always with prefix caching (shared blocks, registration, LRU).
            if caching:
                fast = False

        if fast:
            budget = mbt - n_d
            free -= ph[sph]
            n_dec = n_d
            n_pf = 0
            n_ctx = dstate[1] + n_d * (S + 1)
            for jj in range(n_oth):
                r = oth[jj]
                s = prompt[r] + g[r] - k[r]
                nb = _blocks_of(k[r] + s, bs, bsh) - blocks[r]
                blocks[r] += nb
                free -= nb
                sched[r] = s
                budget -= s
            # admission of waiting requests, as in the slow step
            while n_wait > 0 and budget > 0 and n_run < mns:
                w = _q_peek(q, qs, key, policy, status)
                s = _first_chunk(prompt[w] + g[w], budget, chunked)
                if s < 0:
                    break
                nb = _blocks_of(s, bs, bsh)
                if nb > free:
                    break
                _start_running(w, nb, q, qs, key, policy, status, ever, blocks)
                n_wait -= 1
                free -= nb
                sched[w] = s
                budget -= s
                if rl == run.size:
                    rl = _compact_run(run, rl, status)
                run[rl] = w
                rl += 1
                oth[n_oth] = w
                n_oth += 1
                n_run += 1
            for jj in range(n_oth):
                r = oth[jj]
                s = sched[r]
                if s == 1 and g[r] >= 1 and k[r] == prompt[r] + g[r] - 1:
                    n_dec += 1
                else:
                    n_pf += s
                n_ctx += k[r] + s
            d = base
            if n_dec > 1:
                d += dec_cost[n_dec]
            d += c_prefill * n_pf
            d += c_ctx * n_ctx
            t_end = t + d
            a_occ, a_queue, a_kv, a_l, a_steps, a_max = _account_step(
                a_occ, a_queue, a_kv, a_l, a_steps, a_max, t, t_end, d, n_run, n_wait, nblk - free, ws, we)
            if nxt < n and arrival[nxt] < t_end:
                nxt, n_wait, reserved, a_l, a_queue = _arrivals_during_step(
                    nxt, n, t_end, arrival, prompt, output, ipar, n_run, n_wait, reserved, status, q, qs, key,
                    a_l, a_queue, ws, we)
            # -- apply: lazy decoders emit one token each
            if dstate[2] > 0:
                if pure and n_pf == 0:
                    gapw[n_dec] += dstate[2]
                else:
                    n_itl = _gap_add(itl_v, itl_w, n_itl, t_end - t, dstate[2])
            S += 1
            sph = sph - 1 if sph > 0 else bs - 1
            free, reserved, n_run = _complete_decoders(t_end, S, free, reserved, n_run, hk, hr, hs, dmem, dpos, koff,
                                                       ph, bs, bsh, warmup, dstate, k, g, blocks, status, finish_t,
                                                       last_t, prompt, output, admission)
            m = 0
            for jj in range(n_oth):
                r = oth[jj]
                s = sched[r]
                sched[r] = 0
                k[r] += s
                emitted = False
                if k[r] == prompt[r] + g[r]:
                    g[r] += 1
                    emitted = True
                    if g[r] == 1:
                        first_t[r] = t_end
                    elif r >= warmup:
                        n_itl = _gap_add(itl_v, itl_w, n_itl, t_end - last_t[r], 1)
                    last_t[r] = t_end
                if g[r] == output[r]:
                    status[r] = ST_COMPLETED
                    finish_t[r] = t_end
                    free += blocks[r]
                    blocks[r] = 0
                    if admission == 2:
                        reserved -= prompt[r] + output[r]
                    n_run -= 1
                elif emitted:
                    _d_add(r, k[r], g[r], S, dmem, dpos, koff, goff, ph, hk, hr, hs, bs, bsh, warmup, output,
                           dstate)
                else:
                    oth[m] = r
                    m += 1
            n_oth = m
            t = t_end
            # -- event skipping: while every running request is a lazy decoder
            # and nothing else can happen (no admission, no abandonment, enough
            # free blocks), run the next steps as one stretch, up to the step of
            # the next completion or the one during which the next request
            # arrives: the clock step by step (the same running sum as the
            # reference's), the rest in closed form. After a completion, with
            # nobody waiting and no arrival yet, the next stretch follows at once.
            # (Not with active priority preemption and a waiting request: phase 0.)
            while n_oth == 0 and n_run > 0 and n_sw == 0 and (n_wait == 0 or (n_run == mns and not has_delay
                                                                              and not prio_preempt)):
                n_d = dstate[0]
                ksum = dstate[1]
                next_a = arrival[nxt] if nxt < n else np.inf
                dp = _plain_step(base, dec_cost, n_d)
                # every running request is a lazy decoder, so the heap is not
                # empty: the stretch ends with the step of the next completion
                d0 = dp + c_ctx * (ksum + n_d * (S + 1))   # step j of the stretch lasts d0 + j * dlt
                dlt = c_ctx * n_d
                kk, t_end, nb, s1, s2 = _stretch_steps(t, hk[0] - S, min(next_a, horizon) if has_h else next_a, dp,
                                                       c_ctx, n_d, ksum, S, ph, sph, bs, free)
                if kk == 0:
                    break
                in_sys = n_run + n_wait
                nm_d = dstate[2]
                if (ws <= t and t_end <= we) or t_end <= ws or t >= we:
                    # the stretch lies inside the window or outside it
                    x = _elapsed(kk, d0, dlt)   # its duration, for the integrals
                    used0 = nblk - free
                    free -= nb
                    used = nblk - free
                    if used > a_max:
                        a_max = used
                    a_steps += kk
                    a_l += in_sys * x
                    if ws <= t and t_end <= we:
                        a_occ += x * n_run
                        a_queue += x * n_wait
                        a_kv += (used0 + nb) * x - _kv_weight(s1, s2, d0, dlt)
                    if nm_d > 0:
                        if pure:
                            gapw[n_d] += kk * nm_d
                        else:
                            for jj in range(kk):
                                n_itl = _gap_add(itl_v, itl_w, n_itl, d0 + jj * dlt, nm_d)
                    S += kk
                    sph -= _phase(kk, bs, bsh)
                    if sph < 0:
                        sph += bs
                    t = t_end
                else:
                    # a window edge falls inside: the same steps one by one
                    # (`_account_step`'s operations, on the lazy decoders)
                    for _j in range(kk):
                        free -= ph[sph]
                        used = nblk - free
                        d = dp + c_ctx * (ksum + n_d * (S + 1))
                        t_end = t + d
                        a_occ, a_queue, a_kv, a_l, a_steps, a_max = _account_step(
                            a_occ, a_queue, a_kv, a_l, a_steps, a_max, t, t_end, d, n_run, n_wait, used, ws,
                            we)
                        if nm_d > 0:
                            n_itl = _gap_add(itl_v, itl_w, n_itl, t_end - t, nm_d)
                        S += 1
                        sph = sph - 1 if sph > 0 else bs - 1
                        t = t_end
                # the stretch's last step, as a fast step ends: arrivals during
                # it (they see it before its completions), then completions
                if nxt < n and arrival[nxt] < t:
                    nxt, n_wait, reserved, a_l, a_queue = _arrivals_during_step(
                        nxt, n, t, arrival, prompt, output, ipar, n_run, n_wait, reserved, status, q, qs, key,
                        a_l, a_queue, ws, we)
                if hk[0] != S:
                    break   # the next arrival, the free blocks or the horizon ended the stretch
                free, reserved, n_run = _complete_decoders(t, S, free, reserved, n_run, hk, hr, hs, dmem, dpos, koff,
                                                           ph, bs, bsh, warmup, dstate, k, g, blocks, status,
                                                           finish_t, last_t, prompt, output, admission)
                if t >= next_a:
                    break   # an arrival to ingest first
            continue

        # -- slow step: materialise the lazy decoders, schedule in admission order
        for jj in range(n_d):
            r = dmem[jj]
            k[r] = koff[r] + S
            g[r] = goff[r] + S
            blocks[r] = _blocks_of(k[r], bs, bsh)
            last_t[r] = t
            dpos[r] = -1
        dstate[0] = 0
        dstate[1] = 0
        dstate[2] = 0
        hs[0] = 0
        for jj in range(bs):
            ph[jj] = 0
        rl = _compact_run(run, rl, status)
        budget = mbt
        preempted = False
        if static and n_run == 0:
            # Form a static batch: full KV reservation up front.
            while n_wait > 0 and n_run < mns:
                w = _q_peek(q, qs, key, policy, status)
                need_blk = _blocks_of(prompt[w] + output[w] - 1, bs, bsh)
                if need_blk > free:
                    break
                if not chunked and prompt[w] > budget:
                    break
                _start_running(w, need_blk, q, qs, key, policy, status, ever, blocks)
                n_wait -= 1
                free -= need_blk
                run[n_run] = w
                n_run += 1
                if not chunked:
                    budget -= prompt[w]
            budget = mbt
        if prio_preempt and n_wait > 0:
            # Phase 0, active priority preemption: while the waiting head w
            # could not be scheduled (a seat and the blocks of its first chunk)
            # and the victim's key is strictly larger than w's, preempt the
            # victim by recompute (nothing is scheduled yet: nothing to refund).
            w = _q_peek(q, qs, key, policy, status)
            while n_run > 0:
                vpos = n_run - 1
                for jj in range(n_run - 1):
                    a_ = run[jj]
                    b_ = run[vpos]
                    if key[a_] > key[b_] or (key[a_] == key[b_] and a_ > b_):
                        vpos = jj
                v = run[vpos]
                if not key[v] > key[w]:
                    break
                # could w be scheduled? (re-evaluated, lookup included, after each preemption)
                h_w = 0
                cap_w = free
                if caching:
                    h_w = _lookup(w, pgrp, fpre, jmax, cnt)
                    cap_w = free + cst[2] - _evictable_hits(w, h_w, pgrp, jmax, cnt)
                need_w = prompt[w] + g[w] - h_w * bs
                c_w = min(need_w, mbt) if chunked else need_w
                if n_run < mns and _blocks_of(c_w, bs, bsh) <= cap_w:
                    break
                if caching:
                    free = _release_blocks(v, free, private, nent, pgrp, fpre, held, hoff, jmax, cst, cnt,
                                           lprev, lnext)
                else:
                    free += blocks[v]
                blocks[v] = 0
                k[v] = 0
                npre[v] += 1
                status[v] = ST_WAITING
                for jj in range(vpos, n_run - 1):
                    run[jj] = run[jj + 1]
                n_run -= 1
                n_wait += 1
                _q_push(q, qs, key, policy, v, True)
        kk = 0
        while kk < n_run and budget > 0:
            r = run[kk]
            if static and g[r] == output[r]:
                sched[r] = 1   # padding token of a finished batch member
                budget -= 1
                kk += 1
                continue
            need = prompt[r] + g[r] - k[r]
            s = min(need, budget)
            new_blk = _blocks_of(k[r] + s, bs, bsh) - blocks[r]
            self_preempted = False
            while new_blk > free + cst[2]:   # free + evictable (0 without caching)
                # Preempt by recompute: fcfs/sjf the last admitted, priority
                # (and sjf with priority preemption) the largest (key, arrival index).
                vpos = n_run - 1
                if keyed_victim:
                    for jj in range(n_run - 1):
                        a_ = run[jj]
                        b_ = run[vpos]
                        if key[a_] > key[b_] or (key[a_] == key[b_] and a_ > b_):
                            vpos = jj
                v = run[vpos]
                if vpos < kk:
                    budget += sched[v]
                    kk -= 1
                sched[v] = 0
                if caching:
                    # its refunded tokens' blocks are private: release them all
                    free = _release_blocks(v, free, private, nent, pgrp, fpre, held, hoff, jmax, cst, cnt,
                                           lprev, lnext)
                else:
                    free += blocks[v]
                blocks[v] = 0
                npre[v] += 1
                m_v = _blocks_of(k[v], bs, bsh)
                if swap and m_v <= swap_cap - swap_used:
                    # by swap: k and g kept, m_v blocks moved out (charged to a step)
                    swap_used += m_v
                    if swap_used > acc[A_MAX_SWAP]:
                        acc[A_MAX_SWAP] = swap_used
                    pending_swap += m_v
                    nswap[v] += 1
                    swapped_since[v] = t
                    status[v] = ST_SWAPPED
                    _heap_push(sq, sqs, skey, v)
                    n_sw += 1
                else:
                    k[v] = 0
                    status[v] = ST_WAITING
                    n_wait += 1
                    _q_push(q, qs, key, policy, v, True)
                for jj in range(vpos, n_run - 1):
                    run[jj] = run[jj + 1]
                n_run -= 1
                preempted = True
                if v == r:
                    self_preempted = True
                    break
            if self_preempted:
                break
            if new_blk > 0:
                blocks[r] += new_blk
                if caching:
                    free = _take_blocks(new_blk, free, cst, cnt, lprev, lnext)
                    private[r] += new_blk
                else:
                    free -= new_blk
            sched[r] = s
            budget -= s
            kk += 1
        if swap and not preempted:
            # Phase 2: resume swapped requests (head first) before any new prefill.
            while n_sw > 0 and budget > 0 and n_run < mns:
                w = sq[0]
                need = prompt[w] + g[w] - k[w]
                if chunked:
                    s = min(need, budget)
                elif need > budget:
                    break
                else:
                    s = need
                nb = _blocks_of(k[w] + s, bs, bsh)
                if nb > free:
                    break
                _heap_pop(sq, sqs, skey)
                n_sw -= 1
                m_w = _blocks_of(k[w], bs, bsh)
                swap_used -= m_w
                pending_swap += m_w
                swapped_s[w] += t - swapped_since[w]
                status[w] = ST_RUNNING
                blocks[w] = nb
                free -= nb
                sched[w] = s
                budget -= s
                run[n_run] = w
                n_run += 1
        if not static and not preempted and n_sw == 0:
            while n_wait > 0 and budget > 0 and n_run < mns:
                w = _q_peek(q, qs, key, policy, status)
                h_w = _lookup(w, pgrp, fpre, jmax, cnt) if caching else 0
                s = _first_chunk(prompt[w] + g[w] - h_w * bs, budget, chunked)
                if s < 0:
                    break
                nb = _blocks_of(s, bs, bsh)
                if caching:
                    if nb > free + cst[2] - _evictable_hits(w, h_w, pgrp, jmax, cnt):
                        break
                elif nb > free:
                    break
                _q_pop(q, qs, key, policy)
                n_wait -= 1
                status[w] = ST_RUNNING
                if caching:
                    if not ever[w]:
                        ctok[w] = h_w * bs       # at its first admission
                    _claim_hits(w, h_w, pgrp, held, hoff, jmax, nent, cst, cnt, lprev, lnext)
                    k[w] = h_w * bs
                    free = _take_blocks(nb, free, cst, cnt, lprev, lnext)
                    private[w] = nb
                    blocks[w] = h_w + nb
                else:
                    blocks[w] = nb
                    free -= nb
                ever[w] = 1
                sched[w] = s
                budget -= s
                run[n_run] = w
                n_run += 1
        rl = n_run

        # -- step duration from the batch composition
        n_dec = 0
        n_pf = 0
        n_ctx = 0
        for jj in range(n_run):
            r = run[jj]
            s = sched[r]
            if s == 0:
                continue
            if s == 1 and g[r] >= 1 and (k[r] == prompt[r] + g[r] - 1 or (static and g[r] == output[r])):
                n_dec += 1
            else:
                n_pf += s
            n_ctx += k[r] + s
        if n_dec + n_pf == 0:
            # only preemptions happened; nothing ran
            n_oth = _rebuild(run, n_run, oth)
            continue
        # Same operation order as LatencyModel.step_time, so that the kernel
        # and the reference agree to the last bit.
        d = base
        if n_dec > 1:
            d += dec_cost[n_dec]
        d += c_prefill * n_pf
        d += c_ctx * n_ctx
        if pending_swap > 0:
            d += c_swap * pending_swap   # the swap term last (docs/engine-model.md)
            pending_swap = 0
        t_end = t + d
        a_occ, a_queue, a_kv, a_l, a_steps, a_max = _account_step(
            a_occ, a_queue, a_kv, a_l, a_steps, a_max, t, t_end, d, n_run, n_wait + n_sw, nblk - free - cst[2],
            ws, we)
        if nxt < n and arrival[nxt] < t_end:
            nxt, n_wait, reserved, a_l, a_queue = _arrivals_during_step(
                nxt, n, t_end, arrival, prompt, output, ipar, n_run + n_sw, n_wait, reserved, status, q, qs, key,
                a_l, a_queue, ws, we)
        # -- apply the step: token emission and completion
        for jj in range(n_run):
            r = run[jj]
            s = sched[r]
            if s == 0:
                continue
            sched[r] = 0
            if static and g[r] == output[r]:
                continue
            k[r] += s
            if caching and fpre[r] > 0:
                _register(r, k[r] - s, k[r], bs, pgrp, fpre, held, hoff, jmax, private, nent, cst, cnt)
            if k[r] == prompt[r] + g[r]:
                g[r] += 1
                if g[r] == 1:
                    first_t[r] = t_end
                elif r >= warmup:
                    n_itl = _gap_add(itl_v, itl_w, n_itl, t_end - last_t[r], 1)
                last_t[r] = t_end
            if g[r] == output[r] and not static:
                status[r] = ST_COMPLETED
                finish_t[r] = t_end
        if static:
            done_batch = True
            for jj in range(n_run):
                if g[run[jj]] < output[run[jj]]:
                    done_batch = False
            if done_batch:
                for jj in range(n_run):
                    r = run[jj]
                    status[r] = ST_COMPLETED
                    finish_t[r] = t_end
        m = 0
        n_oth = 0
        for jj in range(n_run):
            r = run[jj]
            if status[r] == ST_COMPLETED:
                if caching:
                    free = _release_blocks(r, free, private, nent, pgrp, fpre, held, hoff, jmax, cst, cnt,
                                           lprev, lnext)
                else:
                    free += blocks[r]
                blocks[r] = 0
                if admission == 2:
                    reserved -= prompt[r] + output[r]
            else:
                run[m] = r
                m += 1
                # decoders that emitted at t_end become lazy; the rest are "others"
                if not static and not caching and last_t[r] == t_end and k[r] == prompt[r] + g[r] - 1:
                    _d_add(r, k[r], g[r], S, dmem, dpos, koff, goff, ph, hk, hr, hs, bs, bsh, warmup, output,
                           dstate)
                else:
                    oth[n_oth] = r
                    n_oth += 1
        n_run = m
        rl = m
        t = t_end

    # -- end of run: materialise lazy decoders; whatever is in the system is unfinished
    for jj in range(dstate[0]):
        r = dmem[jj]
        k[r] = koff[r] + S
        g[r] = goff[r] + S
        blocks[r] = _blocks_of(k[r], bs, bsh)
    for i in range(n):
        if status[i] == ST_SWAPPED:
            swapped_s[i] += t - swapped_since[i]   # to the stop
        if status[i] == ST_WAITING or status[i] == ST_RUNNING or status[i] == ST_SWAPPED:
            status[i] = ST_UNFINISHED
    for b in range(cap + 1):
        if gapw[b] > 0:
            n_itl = _gap_add(itl_v, itl_w, n_itl, _plain_step(base, dec_cost, b), gapw[b])
    acc[A_OCC_INT] = a_occ / mns
    acc[A_QUEUE_INT] = a_queue
    acc[A_KV_INT] = a_kv / nblk
    acc[A_L_INT] = a_l
    acc[A_STEPS] = a_steps
    acc[A_MAX_BLOCKS] = a_max
    acc[A_END] = t
    acc[A_BLOCKS_END] = nblk - free - cst[2]
    # prefix hit rate: measured requests of a group that were admitted at least once
    if caching:
        for i in range(warmup, n):
            if pgrp[i] >= 0 and ever[i]:
                acc[A_HIT_TOK] += ctok[i]
                acc[A_QUERY_TOK] += prompt[i]
    acc[A_N_ITL] = n_itl
    return n_itl


# ==============================================================================
# Reduction of one replication to its metrics row

@njit_noalloc
def _lerp(a, b, t):
    """numpy's percentile interpolation, operation for operation (it
    interpolates from the upper neighbour when t >= 0.5)."""
    diff = b - a
    if t >= 0.5:
        return b - diff * (1.0 - t)
    return a + diff * t


@njit_noalloc
def _ranks(total, q):
    """The two 0-based ranks numpy's percentile ``q`` of ``total`` values
    interpolates between, and the position between them."""
    pos = q / 100.0 * (total - 1)
    r = int(math.floor(pos))
    return r, (r + 1 if r + 1 < total else r), pos


@njit_noalloc
def _weighted_select(v, w, lo, hi, below, j):
    """The value at 0-based rank ``j`` of the sorted sample in which each
    ``v[e]`` occurs ``w[e]`` >= 1 times (a zero weight could be taken for
    the next rank; every caller's weights count something), searched in
    ``v[lo:hi]`` by three-way quickselect (expected O(hi - lo); reorders
    ``v`` and ``w`` there together). Every entry before ``lo`` is smaller
    than all of ``v[lo:hi]`` and they weigh ``below`` (so ``below <= j``).

    Returns ``(value, lt, before, gt, upto)``: the value's entries are
    ``v[lt:gt]``, every entry before ``lt`` is smaller (weight ``before``),
    every entry from ``gt`` on is larger, and ``upto`` is the weight of the
    entries <= the value. A larger rank can be searched from ``(lt, before)``.
    """
    while True:
        a = v[lo]
        b = v[(lo + hi - 1) // 2]
        c = v[hi - 1]
        pivot = max(min(a, b), min(max(a, b), c))   # median of three
        i = lo
        lt = lo
        gt = hi
        w_lt = 0
        w_eq = 0
        while i < gt:
            x = v[i]
            if x < pivot:
                v[i], v[lt] = v[lt], x
                w[i], w[lt] = w[lt], w[i]
                w_lt += w[lt]
                lt += 1
                i += 1
            elif x > pivot:
                gt -= 1
                v[i], v[gt] = v[gt], x
                w[i], w[gt] = w[gt], w[i]
            else:
                w_eq += w[i]
                i += 1
        if j < below + w_lt:
            hi = lt
        elif j < below + w_lt + w_eq:
            return pivot, lt, below + w_lt, gt, below + w_lt + w_eq
        else:
            below += w_lt + w_eq
            lo = gt


@njit_noalloc
def _percentile_from(v, w, m, total, q, lo, below):
    """numpy's percentile ``q`` of the expanded sample (total weight
    ``total`` > 0) in ``v[:m]``, searching from ``(lo, below)`` (see
    `_weighted_select`; ``(0, 0)`` for the whole sample). Returns the value
    and the ``(lo, below)`` from which any higher percentile can be searched,
    so that ascending percentiles each search a shrinking part."""
    r, r2, pos = _ranks(total, q)
    x_lo, lt, before, gt, upto = _weighted_select(v, w, lo, m, below, r)
    x_hi = x_lo
    if r2 > r and r2 >= upto:
        # the next rank holds the smallest value above x_lo: all of them are in v[gt:m]
        x_hi = np.inf
        for e in range(gt, m):
            if v[e] < x_hi:
                x_hi = v[e]
    return _lerp(x_lo, x_hi, pos - r), lt, before


@njit_noalloc
def _percentile_into(v, w, m, total, q, lo, below, row, col):
    """``row[col]`` = `_percentile_from` (nan for an empty sample); return the next ``(lo, below)``."""
    if total == 0:
        row[col] = np.nan
        return lo, below
    x, lo, below = _percentile_from(v, w, m, total, q, lo, below)
    row[col] = x
    return lo, below


@njit_noalloc
def _bucket(x, lo, scale, nb):
    """Histogram bucket of ``x``: non-decreasing in ``x`` (so equal values share a
    bucket, and a value in a lower bucket is strictly smaller)."""
    b = np.int64((x - lo) * scale)
    return b if b < nb else nb - 1


@njit_noalloc
def _rank_buckets(hist, total, q):
    """The histogram buckets [b_lo, b_hi] that hold the two ranks numpy's
    percentile ``q`` interpolates between, and the weight of the buckets below b_lo."""
    nb = hist.size
    r, r2, _pos = _ranks(total, q)
    cum = 0
    b_lo = -1
    below = 0
    b_hi = nb - 1
    for b in range(nb):
        if b_lo < 0 and cum + hist[b] > r:
            b_lo = b
            below = cum
        if cum + hist[b] > r2:
            b_hi = b
            break
        cum += hist[b]
    return b_lo, b_hi, below


@njit_noalloc(inline="llvm")
def _swap_entries(v, w, a, b):
    """Swap entries ``a`` and ``b`` of the weighted sample ``v``, ``w``."""
    v[a], v[b] = v[b], v[a]
    w[a], w[b] = w[b], w[a]


@njit_noalloc
def _gather(v, w, m, lo, scale, marked):
    """Move the entries of ``v[:m]``, ``w[:m]`` whose histogram bucket is
    marked (``marked[b] != 0``) to the front; return their count. (A lookup,
    not range tests: a third of the time, with no branch but the move's.)"""
    nb = marked.size
    c = 0
    for e in range(m):
        if marked[_bucket(v[e], lo, scale, nb)] != 0:
            _swap_entries(v, w, e, c)
            c += 1
    return c


@njit_noalloc
def _percentile_in_buckets(v, w, m, total, q, lo, scale, nb, b_lo, b_hi, below):
    """numpy's percentile ``q`` of the expanded sample, searching only the
    entries of its rank buckets [b_lo, b_hi] (`_rank_buckets`: below them
    weigh ``below``), which are among ``v[:m]``, ``w[:m]``."""
    r, r2, pos = _ranks(total, q)
    # those buckets' entries to the front (an unsigned comparison: one test for the range)
    span = np.uint64(b_hi - b_lo)
    c = 0
    for e in range(m):
        if np.uint64(_bucket(v[e], lo, scale, nb) - b_lo) <= span:
            _swap_entries(v, w, e, c)
            c += 1
    x_lo, lt, before, gt, upto = _weighted_select(v, w, 0, c, below, r)
    x_hi = x_lo
    if r2 > r and r2 >= upto:
        # the next rank holds the smallest value above x_lo; it is in the gathered buckets
        x_hi = np.inf
        for e in range(gt, c):
            if v[e] < x_hi:
                x_hi = v[e]
    return _lerp(x_lo, x_hi, pos - r)


@njit_noalloc
def _percentiles(v, w, m, hist, q0, q1, q2, q3, nq, row, c):
    """numpy's percentiles ``q0 <= q1 <= ...`` (the first ``nq`` <= 4) of the
    sample in which each ``v[e]`` occurs ``w[e]`` >= 1 times, into
    ``row[c:c + nq]`` (nan for an empty sample); reorders ``v[:m]``, ``w[:m]``.

    A sample of ``m`` >= 32 entries is first counted into ``min(hist.size,
    m // 2)`` buckets of equal width between its minimum and maximum (two
    cheap passes); the entries of the buckets that hold the percentiles'
    ranks are gathered to the front (a third pass), and each percentile is
    selected among those of its own (at most two) buckets. Smaller samples,
    and spans too narrow to scale, use plain selection (`_percentile_into`).
    ``hist`` is scratch."""
    total = 0
    lo = np.inf
    hi = -np.inf
    for e in range(m):
        total += w[e]
        x = v[e]
        lo = min(lo, x)
        hi = max(hi, x)
    # About two entries a bucket, at most hist.size: the reduction of a
    # replication of 80-250 requests took 30-45% less time than with plain
    # selection below hist.size entries, and no more at 40 (b366c06)
    nb = min(hist.size, m // 2)
    scale = nb / (hi - lo) if hi > lo else 0.0
    if total == 0 or nb < 16 or not (0.0 < scale < 1e300):
        a = 0
        b = 0
        for j in range(nq):
            q = q0 if j == 0 else (q1 if j == 1 else (q2 if j == 2 else q3))
            a, b = _percentile_into(v, w, m, total, q, a, b, row, c + j)
        return
    hist = hist[:nb]
    for b in range(nb):
        hist[b] = 0
    for e in range(m):
        hist[_bucket(v[e], lo, scale, nb)] += w[e]
    # Each percentile's rank buckets (empty ranges [1, 0] for the unused ones);
    # then the counts are spent, and hist marks those buckets for `_gather`.
    l0, h0, s0 = _rank_buckets(hist, total, q0)
    l1, h1, s1 = 1, 0, 0
    l2, h2, s2 = 1, 0, 0
    l3, h3, s3 = 1, 0, 0
    if nq > 1:
        l1, h1, s1 = _rank_buckets(hist, total, q1)
    if nq > 2:
        l2, h2, s2 = _rank_buckets(hist, total, q2)
    if nq > 3:
        l3, h3, s3 = _rank_buckets(hist, total, q3)
    for b in range(nb):
        hist[b] = 0
    for b_lo, b_hi in ((l0, h0), (l1, h1), (l2, h2), (l3, h3)):
        for b in range(b_lo, b_hi + 1):
            hist[b] = 1
    m = _gather(v, w, m, lo, scale, hist)
    row[c] = _percentile_in_buckets(v, w, m, total, q0, lo, scale, nb, l0, h0, s0)
    if nq > 1:
        row[c + 1] = _percentile_in_buckets(v, w, m, total, q1, lo, scale, nb, l1, h1, s1)
    if nq > 2:
        row[c + 2] = _percentile_in_buckets(v, w, m, total, q2, lo, scale, nb, l2, h2, s2)
    if nq > 3:
        row[c + 3] = _percentile_in_buckets(v, w, m, total, q3, lo, scale, nb, l3, h3, s3)


@njit_noalloc
def _weighted_stats(v, w, m, row, c, hist):
    """Mean, p50 and p99 into ``row[c:c + 3]`` of the sample in which each
    ``v[e]`` occurs ``w[e]`` times: the values numpy gives on the expanded
    sample (percentiles by linear interpolation), from ``m`` entries, by
    selection rather than sorting (`_percentiles`; ``hist``: its scratch).
    Reorders ``v[:m]`` and ``w[:m]``."""
    total = 0
    s = 0.0
    for e in range(m):
        total += w[e]
        s += v[e] * w[e]
    row[c] = s / total if total > 0 else np.nan
    _percentiles(v, w, m, hist, 50.0, 99.0, 0.0, 0.0, 2, row, c + 1)


@njit_noalloc
def _mean(x, m):
    if m == 0:
        return np.nan
    s = 0.0
    for j in range(m):
        s += x[j]
    return s / m


@njit_noalloc(entry=True)
def _reduce(n, arrival, output, ipar, fpar, wi, wf, row):
    """Per-replication metrics of the measured requests (``docs/engine-model.md``)
    from the workspace ``wi``/``wf`` that `_simulate` filled."""
    status = wi[WI_STATUS * n:(WI_STATUS + 1) * n]
    npre = wi[WI_NPRE * n:(WI_NPRE + 1) * n]
    nswap = wi[WI_NSWAP * n:(WI_NSWAP + 1) * n]
    ones = wi[WI_ONES * n:(WI_ONES + 1) * n]
    first_t = wf[WF_FIRST * n:(WF_FIRST + 1) * n]
    finish_t = wf[WF_FINISH * n:(WF_FINISH + 1) * n]
    acc = wf[WF_HEAD * n:WF_HEAD * n + N_ACC]
    o = WF_HEAD * n + N_ACC
    ttft = wf[o:o + n]
    e2e = wf[o + n:o + 2 * n]
    tpot = wf[o + 2 * n:o + 3 * n]
    n_itl = np.int64(acc[A_N_ITL])
    o = WI_HEAD * n
    hist = wi[o:o + N_HIST]
    itl_w = wi[o + N_HIST:o + N_HIST + n_itl]
    o = (WF_HEAD + WF_SCRATCH) * n + N_ACC
    itl_v = wf[o:o + n_itl]
    warmup = ipar[I_WARMUP]
    swap = ipar[I_SWAP] == 1
    has_ttft = ipar[I_HAS_TTFT_SLO] == 1
    has_tpot = ipar[I_HAS_TPOT_SLO] == 1
    ttft_slo = fpar[F_TTFT_SLO]
    tpot_slo = fpar[F_TPOT_SLO]
    overhead = fpar[F_TTFT_OVERHEAD]
    nm = max(n - warmup, 0)
    n_done = 0
    n_tpot = 0
    n_good = 0
    out_tokens = 0
    n_rej_meas = 0
    n_drop_meas = 0
    pre_meas = 0
    swap_meas = 0
    c_done = 0
    c_long = 0
    c_adm = 0
    c_drop = 0
    c_unf = 0
    c_pre = 0
    c_swap = 0
    end = acc[A_END]
    sojourn = 0.0
    for i in range(n):
        ones[i] = 1
    for i in range(n):
        st = status[i]
        if st == ST_COMPLETED:
            c_done += 1
        elif st == ST_REJECTED_TOO_LONG:
            c_long += 1
        elif st == ST_REJECTED_ADMISSION:
            c_adm += 1
        elif st == ST_DROPPED:
            c_drop += 1
        elif st == ST_UNFINISHED:
            c_unf += 1
        ns = nswap[i] if swap else 0   # (written by the engine only with swap preemption)
        c_pre += npre[i]
        c_swap += ns
        # Little's law bookkeeping: sojourn of every accepted request, from
        # arrival to completion, drop, or the end of the run.
        if st == ST_COMPLETED or st == ST_DROPPED:
            sojourn += finish_t[i] - arrival[i]
        elif st == ST_UNFINISHED:
            sojourn += end - arrival[i]
        if i < warmup:
            continue
        pre_meas += npre[i]
        swap_meas += ns
        if st == ST_REJECTED_TOO_LONG or st == ST_REJECTED_ADMISSION:
            n_rej_meas += 1
        elif st == ST_DROPPED:
            n_drop_meas += 1
        elif st == ST_COMPLETED:
            a = first_t[i] - arrival[i] + overhead
            e = finish_t[i] - arrival[i] + overhead
            ttft[n_done] = a
            e2e[n_done] = e
            n_done += 1
            out_tokens += output[i]
            ok = not (has_ttft and a > ttft_slo)
            if output[i] > 1:
                tp = (finish_t[i] - first_t[i]) / (output[i] - 1)
                tpot[n_tpot] = tp
                n_tpot += 1
                if has_tpot and tp > tpot_slo:
                    ok = False
            if ok:
                n_good += 1

    row[C_TTFT_MEAN] = _mean(ttft, n_done)
    # percentiles by selection (each reorders its array; the means come first)
    _percentiles(ttft, ones, n_done, hist, 50.0, 90.0, 95.0, 99.0, 4, row, C_TTFT_MEAN + 1)
    row[C_TPOT_MEAN] = _mean(tpot, n_tpot)
    _percentiles(tpot, ones, n_tpot, hist, 50.0, 99.0, 0.0, 0.0, 2, row, C_TPOT_MEAN + 1)
    _weighted_stats(itl_v, itl_w, n_itl, row, C_ITL_MEAN, hist)
    row[C_E2E_MEAN] = _mean(e2e, n_done)
    _percentiles(e2e, ones, n_done, hist, 50.0, 99.0, 0.0, 0.0, 2, row, C_E2E_MEAN + 1)
    # The window closes at the horizon, or else at the end of the drained run
    # (its last completion) as the client sees it.
    window_end = fpar[F_HORIZON] if ipar[I_HAS_HORIZON] == 1 else end + overhead
    window = window_end - acc[A_WINDOW_START] if nm > 0 else 0.0
    if window > 0.0:
        row[C_REQ_TPUT] = n_done / window
        row[C_OUT_TPUT] = out_tokens / window
        row[C_GOODPUT] = n_good / window
        row[C_OCC] = acc[A_OCC_INT] / window
        row[C_QUEUE] = acc[A_QUEUE_INT] / window
        row[C_KV] = acc[A_KV_INT] / window
    else:
        row[C_REQ_TPUT] = np.nan
        row[C_OUT_TPUT] = np.nan
        row[C_GOODPUT] = np.nan
        row[C_OCC] = np.nan
        row[C_QUEUE] = np.nan
        row[C_KV] = np.nan
    if nm > 0:
        row[C_BLOCKING] = n_rej_meas / nm
        row[C_DROP] = n_drop_meas / nm
        row[C_PREEMPT] = pre_meas / nm
        row[C_SWAPS] = swap_meas / nm
    else:
        row[C_BLOCKING] = np.nan
        row[C_DROP] = np.nan
        row[C_PREEMPT] = np.nan
        row[C_SWAPS] = np.nan
    row[C_HIT] = acc[A_HIT_TOK] / acc[A_QUERY_TOK] if acc[A_QUERY_TOK] > 0 else np.nan
    c0 = C_N_ARRIVED
    row[c0 + 0] = n
    row[c0 + 1] = c_done
    row[c0 + 2] = c_long + c_adm
    row[c0 + 3] = c_long
    row[c0 + 4] = c_adm
    row[c0 + 5] = c_drop
    row[c0 + 6] = c_unf
    row[c0 + 7] = c_pre
    row[c0 + 8] = c_swap
    row[c0 + 9] = nm
    row[c0 + 10] = acc[A_STEPS]
    row[c0 + 11] = acc[A_MAX_BLOCKS]
    row[c0 + 12] = acc[A_BLOCKS_END]
    row[c0 + 13] = acc[A_MAX_SWAP]
    row[c0 + 14] = window
    row[c0 + 15] = end
    row[c0 + 16] = acc[A_L_INT]
    row[c0 + 17] = sojourn


# ==============================================================================
# CPU drivers. `_run_chunk` allocates nothing: its buffers (`ChunkBuffers`)
# come from Python, one set per thread, kept across chunks. It
# calls the engine's entries through function pointers (`function_pointer`):
# linked in, the engine would be optimised and code-generated by LLVM a second
# time, for `_run_chunk` (3.8 s of LLVM time). The pointers' types are declared
# (`_driver_types`), so that `_run_chunk` compiles alongside the entries, in
# the helper process on a cold start. The Python helpers below call
# the same compiled entries from Python, so sampling or simulating one stream
# compiles nothing more.

# The arrays `_replicate.pack_scenario` makes of a scenario, in the order the
# drivers take them (`_draw_workload` takes them without ``lat``).
SCENARIO_ARRAYS = ("ipar", "fpar", "lat", "arr_times", "lcomp", "lpar", "ltab", "lrange", "trace",
                   "prio_val", "prio_cdf", "pred_edges")


def scenario_arrays(packed, lat=True):
    """The arrays of ``packed`` (`pack_scenario`'s dict) in the drivers'
    order: `run_chunk`'s and `chunk_runner`'s ``arrays``, or without ``lat``
    `draw_workload`'s."""
    return tuple(packed[name] for name in SCENARIO_ARRAYS if lat or name != "lat")


_V_I, _V_F, _V_U = (nb_types.Array(t, 1, "C") for t in (nb_types.int64, nb_types.float64, nb_types.uint64))


def _engine_types(ipar, fpar, lat, full):
    """Argument types of `_simulate` (the engine ``full`` selects), `_ws_need`
    and `_reduce`, for parameter arrays of Numba types ``ipar``, ``fpar``,
    ``lat`` and the buffers the drivers allocate."""
    i64, vi, vf = nb_types.int64, _V_I, _V_F
    return {_simulate: (i64, vf, vi, vi, vi, vi, vi, vi, ipar, fpar, lat, vi, vf,
                        nb_types.none if full is None else i64),
            _ws_need: (i64, vi, vi, vi, ipar),
            _reduce: (i64, vf, vi, ipar, fpar, vi, vf, vf)}


# The internal functions `_simulate` calls, with their argument types (i:
# int64, f: float64, b: bool, vi and vf: C arrays of int64 and float64), in
# the order its compilation first asks for them ("full": the full engine's
# only). On a cold start the compile helper compiles them first, and the
# engine's compilation here loads them from the disk cache instead of
# compiling them (`compile_entries`): about 4 s of the engine's 15 s. A
# missing line, or wrong types, cost only that time (the helper skips a job
# it cannot compile); tests/test_compile_helper.py checks the list against
# what compiling each engine asks for.
_ENGINE_CALLEES = """
_needs_full_engine vi
_log2_exact i
_ws_dims i vi vi vi vi
_ws_sizes i i i i i i
_arrival_status i i vi i i
_q_push vi vi vf i i b
_heap_push vi vi vf i
_before i i vf
_blocks_of i i i
_q_peek vi vi vf i vi
_q_pop vi vi vf i
_heap_pop vi vi vf
_first_chunk i i b
_start_running i i vi vi vf i vi vi vi
_compact_run vi i vi
_account_step f f f f f i f f f i i i f f
_arrivals_during_step i i f vf vi vi vi i i i vi vi vi vf f f f f
_gap_add vf vi i f i
_complete_decoders f i i i i vi vi vi vi vi vi vi i i i vi vi vi vi vi vf vf vi vi i
_heap2_pop vi vi vi
_d_remove i vi vi vi vi i i i vi
_phase i i i
_d_add i i i i vi vi vi vi vi vi vi vi i i i vi vi
_heap2_push vi vi vi i i
_plain_step f vf i
_stretch_steps f i f f f i i i vi i i i
_stretch_blocks vi i i i i
_binade_steps f f i f
_steps_within f f i f
_stretch_kv vi i i i f f
_kv_weight f f f f
_elapsed i f f
full _lookup i vi vi i vi
full _evictable_hits i i vi i vi
full _release_blocks i i vi vi vi vi vi vi i vi vi vi vi
full _lru_append i vi vi vi
full _take_blocks i i vi vi vi vi
full _lru_remove i vi vi vi
full _claim_hits i i vi vi vi i vi vi vi vi vi
_rebuild vi i vi
full _register i i i i vi vi vi vi i vi vi vi vi
"""


@functools.lru_cache(maxsize=None)
def _callee_types(full):
    """`_ENGINE_CALLEES` of the engine ``full`` selects, as ``(dispatcher, argtypes)`` pairs."""
    codes = {"i": nb_types.int64, "f": nb_types.float64, "b": nb_types.boolean, "vi": _V_I, "vf": _V_F}
    callees = []
    for line in _ENGINE_CALLEES.split("\n"):
        words = line.split()
        if words and words[0] == "full":
            if full is None:
                continue
            words = words[1:]
        if words:
            callees.append((globals()[words[0]], tuple(codes[w] for w in words[1:])))
    return tuple(callees)


# The entries `_run_chunk` calls through pointers, in its argument order.
_POINTED = (_draw_workload, _ws_need, _simulate, _reduce)


def _driver_types(given, full):
    """Argument types of the entries in `_POINTED` (the engine ``full``
    selects) and of `_run_chunk`, keyed by dispatcher, for the Numba types
    ``given`` of the scenario arrays (`SCENARIO_ARRAYS`), the buffers
    (`ChunkBuffers`) and the call `replicate` makes (keys as
    ``np.uint64``, ``out`` rows of a C-contiguous 2-D array). The entries'
    return types are declared here, so that the pointers' types, and with
    them `_run_chunk`'s, are known before the entries are compiled."""
    ipar, fpar, lat, *tables = given
    types = _engine_types(ipar, fpar, lat, full)
    i64, u64, vi, vf = nb_types.int64, nb_types.uint64, _V_I, _V_F
    types[_draw_workload] = (i64, u64, u64, ipar, fpar, *tables, _V_U, vf, vi, vi, vi, vi, vi, vi)
    returns = {_draw_workload: i64, _ws_need: nb_types.UniTuple(i64, 2), _simulate: i64, _reduce: nb_types.none}
    pointers = tuple(nb_types.FunctionType(returns[d](*types[d])) for d in _POINTED)
    types[_run_chunk] = (i64, i64, u64, u64, *given, nb_types.Array(nb_types.float64, 2, "C"),
                         _V_U, vf, vi, vi, vi, vi, vi, vi, vi, vf, vi,     # ChunkBuffers.arrays()
                         nb_types.none if full is None else i64, *pointers)
    # The engine first (`compile_entries` compiles it here), then the others
    # from the costliest down: the helper takes them from the front and this
    # process from the back, and the one the helper is at when they meet,
    # which this process waits for, is then a short one.
    return {d: types[d] for d in (_simulate, _reduce, _draw_workload, _ws_need, _run_chunk)}


@functools.lru_cache(maxsize=None)
def _entry_pointers(given, full):
    """`_draw_workload`, `_ws_need`, `_simulate` (the engine ``full`` selects)
    and `_reduce` as function pointers, compiled for `_driver_types` with
    `_run_chunk` (`compile_entries`: the engine here, the others alongside
    in a helper process, so that a cold start waits for the engine only).
    `engine_pointers` is the way in."""
    types = _driver_types(given, full)
    compile_entries(types.items(), _callee_types(full))
    return tuple(function_pointer(d, types[d]) for d in _POINTED)


def _array_key(a):
    """What Numba's type of the array ``a`` depends on (`numba.typeof` of an
    ndarray: its class, dtype, dimensions, layout, writeability, alignment)."""
    f = a.flags
    return type(a), a.dtype.str, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned


_POINTERS = {}


def engine_pointers(arrays, full):
    """`_draw_workload`, `_ws_need`, `_simulate` (the engine ``full``
    selects) and `_reduce` as function pointers for the scenario ``arrays``
    (`scenario_arrays`), compiled or loaded on the first call for their types.
    Looked up by the arrays' `_array_key`: their Numba types, and the
    `_entry_pointers` cache keyed by those types, made `chunk_runner` take
    180 us a call, against 20 us now (a `replicate` call of 8 x 250
    requests takes about 2 ms)."""
    key = (full,) + tuple(_array_key(a) for a in arrays)
    pointers = _POINTERS.get(key)
    if pointers is None:
        pointers = _POINTERS[key] = _entry_pointers(tuple(numba.typeof(a) for a in arrays), full)
    return pointers


class ChunkBuffers:
    """One thread's buffers for `_run_chunk`: the stream state, the request
    arrays of a replication (``requests``: arrival, prompt, output, priority,
    SJF key, prefix group, prefix length, as `_draw_workload` fills them) and
    the engine's workspace (``wi``, ``wf``).

    A runner (`chunk_runner`) keeps them from one chunk to the next, and
    grows the workspace with room to spare, so that its pages are faulted in
    about once per thread and call. The driver used to allocate them per
    chunk and grow the workspace to exactly what a replication needed, so
    long replications paid the page faults of a fresh workspace nearly every
    time (~80 MB at 256,000 requests): the reference workload at 256,000
    requests a replication ran at 1.8-1.9 M requests/s, and at 2.4-2.9 M
    with the buffers kept (one thread, 7 replications, 5 interleaved rounds:
    ``benchmarks/ab_interleaved.py OLD . --replications 7 --requests 256000``)."""

    def __init__(self, num_requests):
        self.state = np.empty(N_STREAMS, np.uint64)
        self.requests = (np.empty(num_requests),) + tuple(np.empty(num_requests, np.int64) for _ in range(6))
        self.wi = np.empty(0, np.int64)
        self.wf = np.empty(0)
        self.need = np.zeros(2, np.int64)   # the workspace sizes a replication asked for

    def arrays(self):
        """`_run_chunk`'s buffer arguments, in its order."""
        return (self.state, *self.requests, self.wi, self.wf, self.need)

    def grow(self):
        """Make the workspace larger than ``need`` says by a quarter, and by
        half again at least: replications differ in size (the gap samples'
        room is the sum of their output lengths), and each regrowth costs a
        call of `_run_chunk` (unused room costs address space only)."""
        need_i, need_f = (int(x) for x in self.need)
        if need_i > self.wi.size:
            self.wi = np.empty(max(need_i + need_i // 4, self.wi.size + self.wi.size // 2), np.int64)
        if need_f > self.wf.size:
            self.wf = np.empty(max(need_f + need_f // 4, self.wf.size + self.wf.size // 2))


def chunk_runner(arrays, full):
    """``run(rep0, nrep, key0, key1, out)``: `run_chunk` with a scenario's
    ``arrays`` (`scenario_arrays`) and the compiled entries bound once (a
    run calls it per chunk, from several threads). Each call takes a set of
    `ChunkBuffers` from the runner's pool, or makes one, and puts it back:
    at most one set per concurrent call, reused by the later chunks."""
    arrays = tuple(arrays)
    pointers = engine_pointers(arrays, full)
    num_requests = int(arrays[0][I_NUM_REQUESTS])
    pool = queue.SimpleQueue()

    def run(rep0, nrep, key0, key1, out):
        try:
            buf = pool.get_nowait()
        except queue.Empty:
            buf = ChunkBuffers(num_requests)
        try:
            return run_on(_run_chunk, buf, rep0, nrep, key0, key1, arrays, out, full, pointers)
        finally:
            pool.put(buf)
    run.pool = pool   # (for tests)
    return run


def run_on(driver, buf, rep0, nrep, key0, key1, arrays, out, full, pointers):
    """Replications ``rep0 .. rep0 + nrep - 1`` into ``out`` by ``driver``
    (`_run_chunk`, compiled) on the buffers ``buf``, grown whenever a
    replication needs a larger workspace (that replication then runs again,
    its stream drawn again from its key). Returns 0 or `_simulate`'s
    negative code."""
    done = 0
    while done < nrep:
        # keys as np.uint64 whatever the caller passes: the types `_driver_types` compiled
        rc = driver(rep0 + done, nrep - done, np.uint64(key0), np.uint64(key1), *arrays, out[done:],
                    *buf.arrays(), full, *pointers)
        if rc < 0:
            return rc
        done += rc
        if done < nrep:
            buf.grow()
    return 0


def run_chunk(rep0, nrep, key0, key1, ipar, fpar, lat, arr_times, lcomp, lpar, ltab,
              lrange, trace, prio_val, prio_cdf, pred_edges, out, full):
    """Simulate replications ``rep0 .. rep0 + nrep - 1`` into ``out[nrep, N_COLUMNS]``.

    One thread's work (the Python layer runs chunks on a thread pool; the
    kernels release the GIL). The request arrays and the workspace
    (`ChunkBuffers`) are reused, grown when a replication needs more.
    Replications are keyed by their global index, so results do not depend
    on the thread count or on how a run is chunked. ``full``: the engine
    (`engine_variant`). Returns 0, or `_simulate`'s negative code (-2: the
    common engine refused ``ipar``), at the first replication that gets one.
    """
    run = chunk_runner((ipar, fpar, lat, arr_times, lcomp, lpar, ltab, lrange, trace, prio_val, prio_cdf,
                        pred_edges), full)
    return run(rep0, nrep, key0, key1, out)


@njit
def _run_chunk(rep0, nrep, key0, key1, ipar, fpar, lat, arr_times, lcomp, lpar, ltab,
               lrange, trace, prio_val, prio_cdf, pred_edges, out, state, arrival, prompt, output, prio,
               sjfk, pgrp, plen, wi, wf, need, full, draw, ws_need, simulate, reduce):
    """`run_chunk` compiled, on the buffers `ChunkBuffers.arrays` gives;
    ``draw``, ``ws_need``, ``simulate``, ``reduce``: `_entry_pointers`.
    Returns the number of replications done: ``nrep``, or fewer when the
    next one needs a larger workspace (its sizes are then in ``need``), or
    `_simulate`'s negative code."""
    for j in range(nrep):
        n = draw(rep0 + j, key0, key1, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange, trace,
                 prio_val, prio_cdf, pred_edges, state, arrival, prompt, output, prio, sjfk, pgrp, plen)
        need_i, need_f = ws_need(n, output, pgrp, plen, ipar)
        if need_i > wi.size or need_f > wf.size:
            need[0] = need_i
            need[1] = need_f
            return j
        rc = simulate(n, arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, wi, wf, full)
        if rc < 0:
            return rc
        reduce(n, arrival, output, ipar, fpar, wi, wf, out[j])
    return nrep


def draw_workload(rep, key0, key1, ipar, fpar, arr_times, lcomp, lpar, ltab, lrange, trace,
                  prio_val, prio_cdf, pred_edges):
    """The request stream of replication ``rep`` (arrival, prompt, output, priority, SJF key,
    prefix group, prefix length): `_draw_workload` called from Python."""
    buf = ChunkBuffers(int(ipar[I_NUM_REQUESTS]))
    n = _draw_workload(np.int64(rep), np.uint64(key0), np.uint64(key1), ipar, fpar, arr_times, lcomp, lpar, ltab,
                       lrange, trace, prio_val, prio_cdf, pred_edges, buf.state, *buf.requests)
    return tuple(c[:n].copy() for c in buf.requests)


@functools.lru_cache(maxsize=None)
def _stream_entries(ipar, fpar, lat, full):
    """Compile or load the entries `simulate_stream` calls, once per process
    for the Numba types of its parameter arrays (not their types' lookup on
    every call)."""
    compile_entries(_engine_types(ipar, fpar, lat, full).items(), _callee_types(full))


def simulate_stream(arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat):
    """Simulate one given request stream; return per-request results (status,
    first-token time, finish time, preemptions, tokens, preemptions by swap,
    time swapped, cached tokens) and the metrics row. (`_simulate`, the
    engine `engine_variant` chooses, and `_reduce` called from Python on a
    workspace allocated here.)"""
    arrival = np.array(arrival, dtype=np.float64)   # writeable, C-contiguous copies: the
    ints = [np.array(x, dtype=np.int64) for x in (prompt, output, prio, sjfk, pgrp, plen)]  # compiled types
    prompt, output, prio, sjfk, pgrp, plen = ints
    n = arrival.size
    full = engine_variant(ipar)
    _stream_entries(*(numba.typeof(a) for a in (ipar, fpar, lat)), full)
    need_i, need_f = _ws_need(np.int64(n), output, pgrp, plen, ipar)
    wi = np.zeros(need_i, np.int64)   # zeros: the common engine leaves the swap and caching columns as they are
    wf = np.zeros(need_f)
    _simulate(np.int64(n), arrival, prompt, output, prio, sjfk, pgrp, plen, ipar, fpar, lat, wi, wf, full)
    row = np.empty(N_COLUMNS)
    _reduce(np.int64(n), arrival, output, ipar, fpar, wi, wf, row)
    def col(a, j):
        return a[j * n:(j + 1) * n].copy()
    return (col(wi, WI_STATUS).astype(np.int8), col(wf, WF_FIRST), col(wf, WF_FINISH), col(wi, WI_NPRE),
            col(wi, WI_G), col(wi, WI_NSWAP), col(wf, WF_SWAPPED), col(wi, WI_CTOK), row)
