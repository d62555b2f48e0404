"""Lazy decoders: running requests that decode one token a step and are
handled in aggregate by the fast step, O(1) per step. Their computed and
generated tokens are ``koff + S`` and ``goff + S`` (S the fast steps so far),
the blocks they need per step are counted by a histogram of phases (``ph``), and
their completions come from a heap keyed by the fast step at which they finish
(``hk``, ``hr``, ``hs``).
"""

from __future__ import annotations

import numpy as np

from .._numba_options import njit_noalloc
from .layout import ST_COMPLETED
from .kv_cache import _blocks_of, _phase

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
