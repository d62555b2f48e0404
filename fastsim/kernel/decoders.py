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
from .kv_cache import _blocks_of, _phase
from .layout import ADMISSION_KV_RESERVATION, I_ADMISSION, I_WARMUP, ST_COMPLETED


@njit_noalloc(inline="llvm")
def _d_add(r, kk, gg, S, dec, output, warmup, bs, bsh):
    """Make running request ``r`` (which emitted a token at the end of the last
    step and holds ``kk`` computed tokens, ``gg`` generated) a lazy decoder
    of ``dec`` (`workspace.Decoders`), ``S`` fast steps into the run."""
    dstate = dec.dstate
    n_d = dstate[0]
    dec.dmem[n_d] = r
    dec.dpos[r] = n_d
    dstate[0] = n_d + 1
    dec.koff[r] = kk - S
    dec.goff[r] = gg - S
    dec.ph[_phase(kk - S, bs, bsh)] += 1
    dstate[1] += kk - S
    if r >= warmup:
        dstate[2] += 1
    # completion heap keyed by the fast-step count at which g reaches output
    _heap2_push(dec.hk, dec.hr, dec.hs, S + output[r] - gg, r)


@njit_noalloc
def _d_remove(r, dec, warmup, bs, bsh):
    """Take request ``r`` out of the lazy decoders."""
    dstate = dec.dstate
    n_d = dstate[0] - 1
    pos = dec.dpos[r]
    last = dec.dmem[n_d]
    dec.dmem[pos] = last
    dec.dpos[last] = pos
    dec.dpos[r] = -1
    dstate[0] = n_d
    dec.ph[_phase(dec.koff[r], bs, bsh)] -= 1
    dstate[1] -= dec.koff[r]
    if r >= warmup:
        dstate[2] -= 1


@njit_noalloc(inline="llvm")
def _complete_decoders(t, S, free, reserved, n_run, dec, req, ipar, bs, bsh):
    """Complete the lazy decoders whose last token came at the end of fast
    step ``S`` (at ``t``): release their blocks (and KV reservations); return
    the updated (free blocks, reserved tokens, running requests)."""
    warmup = ipar[I_WARMUP]
    kv_reservation = ipar[I_ADMISSION] == ADMISSION_KV_RESERVATION
    while dec.hs[0] > 0 and dec.hk[0] == S:
        r = _heap2_pop(dec.hk, dec.hr, dec.hs)
        _d_remove(r, dec, warmup, bs, bsh)
        req.k[r] = dec.koff[r] + S
        req.g[r] = req.output[r]
        free += _blocks_of(req.k[r], bs, bsh)
        req.blocks[r] = 0
        if kv_reservation:
            reserved -= req.prompt[r] + req.output[r]
        req.status[r] = ST_COMPLETED
        req.finish_t[r] = t
        req.last_t[r] = t
        n_run -= 1
    return free, reserved, n_run


@njit_noalloc(inline="llvm")
def _hold_decoders(t, S, dec, req, zl, n_held, warmup, bs, bsh):
    """Async scheduling (`pipeline`): the lazy decoders whose last token came
    at the end of fast step ``S`` (at ``t``) finish, but hold their seats
    and the blocks of their tokens until the next step is scheduled: listed
    in ``zl`` after the ``n_held`` already there. Returns the number held."""
    while dec.hs[0] > 0 and dec.hk[0] == S:
        r = _heap2_pop(dec.hk, dec.hr, dec.hs)
        _d_remove(r, dec, warmup, bs, bsh)
        req.k[r] = dec.koff[r] + S
        req.g[r] = req.output[r]
        req.blocks[r] = _blocks_of(req.k[r], bs, bsh)
        req.finish_t[r] = t
        req.last_t[r] = t
        zl[n_held] = r
        n_held += 1
    return n_held


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
                # the smaller child as arithmetic, not a branch: which child
                # is smaller is a coin toss the branch predictor loses
                c += np.int64(hk[c + 1] < hk[c])
            if hk[c] >= key:
                break
            hk[pos] = hk[c]
            hr[pos] = hr[c]
            pos = c
        hk[pos] = key
        hr[pos] = r
    return top
