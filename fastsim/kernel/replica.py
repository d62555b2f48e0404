"""The engine: one replica of a vLLM-style server run over a request stream
(`_simulate`), in the common or the full compiled variant (`engine_variant`).
"""

from __future__ import annotations

import numpy as np

from .._numba_options import njit_noalloc
from .layout import (A_BLOCKS_END, A_END, A_HIT_TOK, A_KV_INT, A_L_INT, A_MAX_BLOCKS, A_MAX_SWAP, A_N_ITL,
    A_OCC_INT, A_QUERY_TOK, A_QUEUE_INT, A_STEPS, A_WINDOW_START, F_AGING, F_HORIZON, F_MAX_DELAY,
    I_ADMISSION, I_BLOCK_SIZE, I_CACHING, I_CHUNKED, I_HAS_AGING, I_HAS_DELAY, I_HAS_HORIZON,
    I_MAX_BATCHED_TOKENS, I_MAX_NUM_SEQS, I_NUM_GPU_BLOCKS, I_POLICY, I_PRIO_PREEMPT, I_STATIC, I_SWAP,
    I_SWAP_BLOCKS, I_WARMUP, N_ACC, N_HIST, ST_COMPLETED, ST_DROPPED, ST_PENDING, ST_RUNNING, ST_SWAPPED,
    ST_UNFINISHED, ST_WAITING)
from .waiting_queue import _heap_pop, _heap_push, _q_peek, _q_pop, _q_push
from .kv_cache import _blocks_of, _log2_exact, _phase
from .prefix_cache import _claim_hits, _evictable_hits, _lookup, _register, _release_blocks, _take_blocks
from .arrivals import _arrival_status, _arrivals_during_step
from .scheduler import _compact_run, _first_chunk, _rebuild, _start_running
from .accounting import _account_step, _gap_add
from .decoders import _complete_decoders, _d_add
from .workspace import (WF_FINISH, WF_FIRST, WF_HEAD, WF_LAST, WF_SCRATCH, WF_SWAPPED, WI_BLOCKS, WI_CTOK,
    WI_G, WI_HEAD, WI_K, WI_NPRE, WI_NSWAP, WI_STATUS, _ws_dims, _ws_sizes)
from .latency import _plain_step
from .stretch import _elapsed, _kv_weight, _stretch_steps

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
