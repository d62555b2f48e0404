"""Event skipping: a *stretch* is a run of steps in which every running request
is a lazy decoder and nothing happens but token counts (docs/engine-model.md
does not know the word: a stretch is ordinary steps). Step j of a stretch
(j = 0, 1, ...) lasts d0 + j * dlt (the context term grows by one token per
decoder per step), so its first j steps take `_elapsed(j, d0, dlt)`; step j
allocates the new blocks of the decoders whose token count is a multiple of
block_size, ph[(sph - j) mod block_size]. The clock gives the running sum of
the reference bit for bit: one addition per step, or many steps at once
inside a binade (`_binade_steps`), where that sum is exact arithmetic.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from .._numba_options import njit_noalloc
from .latency import _noise_key, _noisy_duration


_UNBOUNDED = 1 << 62
_BINADE_AFTER = 32   # steps of a stretch summed one by one before `_binade_steps` is tried


_TINY = 2.0 ** -1022  # the smallest normal double


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
def _binade_steps(t, d, jmax, limit, lag_limit):
    """Up to ``jmax`` steps of duration ``d`` from ``t`` at once, with the
    clock the running sum would give, bit for bit: return (steps, clock).

    In t's binade [2^(e-1), 2^e) the doubles are the multiples of
    u = 2^(e-53). While a sum x + d (x such a multiple) stays below 2^e,
    rounding it to the nearest double gives x + D, D = d rounded to a multiple
    of u; so j steps end at t + j * D exactly. Taken: the most steps whose
    sums stay in the binade, that start before ``limit`` (the next arrival
    or the horizon, as the step loop decides), and whose previous step
    starts before ``lag_limit`` (async scheduling: an arrival is seen a
    step later; the caller checked the step before ``t``; ``inf`` without
    it). 0 when none can be taken this way: t = 0
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
    if lag_limit < np.inf:
        # step i's previous step starts at t + (i - 1) * D (the caller's, for i = 0)
        j = min(j, _steps_within(t, dd, j - 1, lag_limit) + 2 if t < lag_limit else 1)
    return j, t + j * dd


#: What bounds a stretch's steps and what they take (`_stretch_steps`): at
#: most ``kmax`` steps, each starting before ``limit``, its previous step
#: before ``lag_limit``; step i lasts ``d + c_ctx * (ksum + n_d * (S + i +
#: 1))`` (``n_d`` decoders, ``ksum`` their tokens, ``S`` the fast steps so
#: far) and allocates ``ph[(sph - i) mod bs]`` new blocks, all within ``free``.
#: ``stop``: the steps are summed while their clock is before it (a paused
#: replica's: just after `replica._simulate`'s ``t_stop``, a stretch that
#: ends after which is not taken; ``inf``: every step).
Stretch = namedtuple("Stretch", ("kmax", "limit", "lag_limit", "d", "c_ctx", "n_d", "ksum", "S", "ph", "sph", "bs",
                                 "free", "stop"))


# Out of line: the step loop's clock and sums then live in registers that
# LLVM allocates for this function alone. Inlined into the 60 KB engine
# loop, the same loop went to stack slots after unrelated edits anywhere in
# the engine (`benchmarks/HISTORY.md`, stops 52-54). Its call is cheap as the
# engine's module makes it internal (`_numba_options._EntryLibrary`).
@njit_noalloc(inline="never")
def _stretch_steps(t, t_prev, plan):
    """The steps of the stretch ``plan`` (a `Stretch`) from ``t``: at most
    ``kmax``, that start before ``limit``
    (the next arrival or the horizon, whichever comes first: an arrival
    during a step does not change the step), whose previous step starts
    before ``lag_limit`` (async scheduling: the next arrival, seen when the
    step after the one it came in is scheduled; ``t_prev``: when the step
    before ``t`` started; ``inf`` without it) and whose new blocks fit in
    ``free``; return (steps,
    clock at their end, blocks B they allocate, S1, S2, the start of the
    last step), with S1 and S2 the
    sums over those steps i = 0, 1, ... of b_i * i and b_i * i * i (S2 only
    with a context term, dlt = c_ctx * n_d != 0, else 0), b_i the blocks step
    i allocates, ph[(sph - i) mod block_size] (`_kv_weight` turns them into
    the KV integral's W, see `_stretch_kv`).

    The clock is a running sum of the steps' durations, the terms and order
    of a fast step's (so ties go as in the reference): one addition per step,
    then, without a context term, a few operations per binade
    (`_binade_steps`, its blocks in closed form: `_stretch_kv`). ``d``:
    a pure decode step's duration (`latency._decode_step_time`). The blocks are counted in the step loop, which is bound by
    the latency of its additions: they come for free there.

    Once the clock reaches ``plan.stop`` the steps after are not summed:
    the values returned are those of the steps summed (a replica paused
    before the stretch takes none of them, and a lower bound of its end will
    do, `_end_bound`; a paused replica of a fleet plans its stretch again
    when it is called next, most often on other inputs: a request handed
    since cuts it)."""
    kmax, limit, lag_limit, d, c_ctx, n_d, ksum, S, ph, sph, bs, free, stop = plan
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
    # A step that starts before lag_limit has its previous step before it
    # too (t_prev <= t: durations are not negative), so the loop tests the
    # clock against one bound; the one step that may follow (it starts at or
    # after lag_limit, its previous step before) runs as a loop of one
    # below. (A third test in every step of the loop costs the synchronous
    # engine's steps time.) Written so that a NaN lag_limit is the bound, as
    # the per-step test would have it (no step).
    tlim = lag_limit if not lag_limit >= limit else limit
    if stop < tlim:
        tlim = stop
    while True:
        # (no call inside this loop: a call would make LLVM keep t and the
        # sums in memory, which doubles the cost of a step)
        while kk < lim and t < tlim:
            c = ph[idx]
            if nb + c > free:
                return kk, t, nb, s1, s2, t_prev
            nb += c
            s1 += float(c * kk)   # (no test of c > 0: a branch mispredicted every few steps)
            if quad:
                s2 += float(c * kk) * kk
            t_prev = t
            if c_ctx != 0.0:   # (without a context term it would add 0.0)
                t = t + (d + c_ctx * (ksum + n_d * (S + kk + 1)))
            else:
                t = t + d
            kk += 1
            idx = idx - 1 if idx > 0 else bs - 1
        if kk == kmax or not t < limit or not t_prev < lag_limit:
            return kk, t, nb, s1, s2, t_prev
        if not t < stop:
            return kk, t, nb, s1, s2, t_prev
        if not t < tlim:   # async's step after lag_limit: the last one
            tlim = limit
            lim = kk + 1
            continue
        # many steps at once (a constant duration: no S2)
        j, t_j = _binade_steps(t, d, min(kmax - kk, _stretch_blocks(ph, idx, bs, free - nb, n_d)),
                               limit if limit < stop else stop, lag_limit)
        if j > 0:
            b, w = _stretch_kv(ph, idx, bs, j, 1.0, 0.0)   # (w: the chunk's own S1)
            nb += b
            s1 += w + float(kk) * b
            t_prev = t + (j - 1) * ((t_j - t) / j)   # (exact: the binade's steps are multiples of its unit)
            t = t_j
            kk += j
            idx = (idx - j) % bs
        lim = min(kmax, kk + _BINADE_AFTER)


@njit_noalloc
def _end_bound(t, left, limit, d, fit):
    """A lower bound of the end of a synchronous stretch whose steps so far
    end at ``t``, with at most ``left`` steps more, those whose new blocks
    fit (``fit`` steps, `_stretch_blocks`), each starting before ``limit``
    and lasting at least ``d``: it ends at ``t`` if none follows, else no
    earlier than ``limit`` (a step that starts before it ends after it) or
    than m = min(left, fit) steps of ``d`` after ``t``, as the clock sums
    them in floating point (each sum rounds down by at most a unit roundoff
    of itself: the bound is shrunk by ``m + 8`` of them)."""
    m = left if left < fit else fit
    if m <= 0 or not d > 0.0:
        return t
    x = (t + m * d) * (1.0 - (m + 8) * 2.3e-16)
    x = x if x < limit else limit
    return x if x > t else t


@njit_noalloc
def _stretch_steps_noisy(t, t_prev, plan, lat, k0, itl_v, itl_w, n_itl, weight):
    """`_stretch_steps` with per-step noise: step i of the stretch lasts the
    noisy duration of the run's step ``k0 + i`` (`latency._noisy_duration`
    of the deterministic one, the bits of a fast step's `_step_time`), the
    clock their running sum, one addition per step (no binades: the steps
    differ). The same limits and values, except the fourth: the KV
    integral's weight W itself, sum of b_i * (t_i - t) (t_i: step i's
    start), and the fifth, 0.0. With ``weight`` decoders measured, step i's
    inter-token gap (the clock's difference, as a fast step records it) is
    written at ``n_itl + i`` of ``itl_v``/``itl_w``, in use once the caller
    takes the stretch (there is room: an entry per measured token at most;
    equal neighbours are not merged as `accounting._gap_add` merges them,
    which saves entries, not results: the steps' gaps differ). A call (the
    draw's exp is one anyway). (``stop`` is not read: every step is summed.)"""
    kmax, limit, lag_limit, d, c_ctx, n_d, ksum, S, ph, sph, bs, free, _stop = plan
    key = _noise_key(lat)
    kk = 0
    nb = 0
    w = 0.0
    idx = sph
    t0 = t
    while kk < kmax and t < limit and t_prev < lag_limit:
        c = ph[idx]
        if nb + c > free:
            break
        nb += c
        w += c * (t - t0)
        t_prev = t
        if c_ctx != 0.0:   # (without a context term it would add 0.0)
            t = t + _noisy_duration(lat, key, d + c_ctx * (ksum + n_d * (S + kk + 1)), k0 + kk)
        else:
            t = t + _noisy_duration(lat, key, d, k0 + kk)
        if weight > 0:
            itl_v[n_itl + kk] = t - t_prev
            itl_w[n_itl + kk] = weight
        kk += 1
        idx = idx - 1 if idx > 0 else bs - 1
    return kk, t, nb, w, 0.0, t_prev


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
    # Without a context term (dlt = 0, e.g. the A10G model) S2 is not needed,
    # and skipping it is cheap: LLVM moves the loop-invariant test out of the
    # loop.
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
