"""The engine's workspace layout (``kernel.workspace._ws_need``) is exact.

`_simulate` carves its whole state out of two flat arrays whose sizes
`_ws_need` states. Run as plain Python (`kernel_as_python`), NumPy raises IndexError
on any access past a workspace of exactly that size, so these runs prove the
carving stays inside it; a smaller workspace is refused (-1) before any
write; and a workspace reused dirty from a larger replication gives the same
results as a fresh one (everything is initialised).
"""

import numpy as np
import pytest

import fastsim
from conftest import kernel_as_python
from fastsim import kernel as K
from fastsim._replicate import pack_scenario

CASES = {
    "plain": fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=3, num_gpu_blocks=20),
                              workload=fastsim.Workload(arrival_rate=5.0, num_requests=12, prompt_len=30,
                                                        output_len=fastsim.Uniform(2, 20))),
    "cache-swap-priority": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=3, num_gpu_blocks=12, policy="priority",
                                    preemption_mode="swap", swap_space_blocks=6),
        workload=fastsim.Workload(arrival_rate=8.0, num_requests=12, prompt_len=fastsim.Uniform(20, 60),
                                  output_len=fastsim.Uniform(2, 30), priorities=(0, 1), priority_probs=(0.5, 0.5),
                                  warmup_requests=2)),
    "prefix-cache": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=3, num_gpu_blocks=16, enable_prefix_caching=True),
        workload=fastsim.Workload(arrival_rate=8.0, num_requests=12, prompt_len=fastsim.Uniform(40, 80),
                                  output_len=fastsim.Uniform(2, 20), prefix_groups=2, prefix_len=33)),
    # long stretches in closed form, with one inter-token gap per step (context term)
    "long-outputs": fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=3, num_gpu_blocks=40),
        workload=fastsim.Workload(arrival_rate=0.5, num_requests=8, prompt_len=30,
                                  output_len=fastsim.Uniform(100, 300), warmup_requests=1, horizon_s=25.0),
        latency=fastsim.LatencyModel(base_s=0.006, decode_scale_s=1e-4, decode_alpha=1.3,
                                     prefill_per_token_s=3e-5, ctx_per_token_s=2e-7)),
}


def stream(sc, rep=0):
    p = pack_scenario(sc)
    a, pr, o, c, q, grp, plen = K.draw_workload(rep, 1, 2, *K.scenario_arrays(p, lat=False))
    return (a.size, a, pr, o, c, q, grp, plen), p


@pytest.mark.parametrize("name", list(CASES))
def test_simulate_stays_inside_a_workspace_of_exactly_the_stated_size(name):
    args, p = stream(CASES[name])
    n, a, pr, o, c, q, grp, plen = args
    ni, nf = K._ws_need(n, pr, o, grp, plen, p["ipar"])
    wi, wf = np.zeros(ni, np.int64), np.zeros(nf)
    row = np.empty(K.N_COLUMNS)
    with kernel_as_python():
        # IndexError if it overflows
        n_itl = K._simulate(*args, p["ipar"], p["fpar"], p["lat"], wi, wf, K.engine_variant(p["ipar"]),
                            np.inf, K.WHOLE_RUN)
        K._reduce(n, a, o, p["ipar"], p["fpar"], wi, wf, row)
    assert n_itl >= 0
    # ... and gives the compiled kernel's per-request results and metrics
    st, first, finish, npre, ntok, nswap, swapped, ctok, row_c = K.simulate_stream(
        a, pr, o, c, q, grp, plen, p["ipar"], p["fpar"], p["lat"])
    assert np.array_equal(wi[:n], st) and np.array_equal(wf[:n], first, equal_nan=True)
    assert np.array_equal(row, row_c, equal_nan=True)
    assert (st == K.ST_COMPLETED).sum() > 0


@pytest.mark.parametrize("name", list(CASES))
def test_a_short_workspace_is_refused_before_any_write(name):
    args, p = stream(CASES[name])
    n, a, pr, o, c, q, grp, plen = args
    ni, nf = K._ws_need(n, pr, o, grp, plen, p["ipar"])
    for wi, wf in ((np.full(ni - 1, 7, np.int64), np.zeros(nf)), (np.full(ni, 7, np.int64), np.zeros(nf - 1))):
        assert K._simulate(*args, p["ipar"], p["fpar"], p["lat"], wi, wf, K.engine_variant(p["ipar"]),
                           np.inf, K.WHOLE_RUN) == -1
        assert (wi == 7).all() and (wf == 0).all()


@pytest.mark.parametrize("dirt", ["leftover", "garbage"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_dirty_reused_workspace_gives_the_fresh_results(name, dirt):
    """Whatever a workspace holds (a larger replication's state, or garbage
    everywhere), a replication on it gives the row of a fresh one: the engine
    initialises all it reads (the common engine leaves the swap and caching
    columns alone, and the reduction reads them only with those options)."""
    sc = CASES[name]
    (n, a, pr, o, c, q, grp, plen), p = stream(sc, rep=3)
    big = sc.replace(**{"workload.num_requests": 40})
    (n2, *rest), _ = stream(big, rep=5)
    ni, nf = K._ws_need(n2, rest[1], rest[2], rest[5], rest[6], p["ipar"])
    wi, wf = np.empty(max(ni, 1), np.int64), np.empty(max(nf, 1))
    full = K.engine_variant(p["ipar"])
    K._simulate(n2, *rest, p["ipar"], p["fpar"], p["lat"], wi, wf, full,
                np.inf, K.WHOLE_RUN)        # leaves state behind
    if dirt == "garbage":
        wi[:] = 7
        wf[:] = np.nan
    K._simulate(n, a, pr, o, c, q, grp, plen, p["ipar"], p["fpar"], p["lat"], wi, wf, full, np.inf, K.WHOLE_RUN)
    row = np.empty(K.N_COLUMNS)
    K._reduce(n, a, o, p["ipar"], p["fpar"], wi, wf, row)
    *_, row_fresh = K.simulate_stream(a, pr, o, c, q, grp, plen, p["ipar"], p["fpar"], p["lat"])
    assert np.array_equal(row, row_fresh, equal_nan=True)


def test_the_views_are_the_segments_of_the_layout():
    """`workspace._carve` takes each segment where `_int_sizes` and
    `_float_sizes` (the one statement of the layout, in ``WI_*``/``WF_*``
    order) put it, with its size, and the segments tile the workspace."""
    from fastsim._numba_options import python_version
    from fastsim.kernel import workspace as W

    # n, block_size, seats, cache entries, prefix references, gap samples, pool blocks, block list entries
    dims = (5, 4, 3, 7, 11, 13, 17, 19)
    si = python_version(W._int_sizes)(*dims)
    sf = python_version(W._float_sizes)(dims[0], dims[2], dims[5])
    need_i, need_f = python_version(W._ws_sizes)(*dims)
    assert (need_i, need_f) == (sum(si), sum(sf)) and len(si) == W.N_WI and len(sf) == W.N_WF
    wi, wf = np.arange(need_i, dtype=np.int64), np.arange(need_f, dtype=np.float64)
    stream = W.Stream(np.zeros(5), *(np.zeros(5, np.int64),) * 6)
    req, batch, dec, swap, cache, rec, sc = python_version(W._carve)(stream, dims, wi, wf)
    ints = {"WI_STATUS": req.status, "WI_K": req.k, "WI_G": req.g, "WI_BLOCKS": req.blocks, "WI_NPRE": req.npre,
            "WI_NSWAP": swap.nswap, "WI_CTOK": cache.ctok, "WI_ITL_W": rec.itl_w, "WI_QUEUE": batch.q,
            "WI_QUEUE_STATE": batch.qs, "WI_RUN": batch.run, "WI_SCHED": req.sched, "WI_EVER": req.ever,
            "WI_DMEM": dec.dmem, "WI_DPOS": dec.dpos, "WI_KOFF": dec.koff, "WI_GOFF": dec.goff,
            "WI_PHASES": dec.ph, "WI_HEAP_KEY": dec.hk, "WI_HEAP_REQ": dec.hr, "WI_HEAP_SIZE": dec.hs,
            "WI_DSTATE": dec.dstate, "WI_OTHERS": batch.oth, "WI_SWAPQ": swap.sq, "WI_SWAPQ_SIZE": swap.sqs,
            "WI_FPRE": cache.fpre, "WI_HOFF": cache.hoff, "WI_CNT": cache.cnt, "WI_LPREV": cache.lprev,
            "WI_LNEXT": cache.lnext, "WI_CST": cache.cst, "WI_HELD": cache.held, "WI_PRIVATE": cache.private,
            "WI_NENT": cache.nent, "WI_QPREV": cache.pool.qprev, "WI_QNEXT": cache.pool.qnext,
            "WI_REF": cache.pool.ref, "WI_BHASH": cache.pool.bhash, "WI_DPREV": cache.pool.dprev,
            "WI_DNEXT": cache.pool.dnext, "WI_HUSED": cache.pool.hused, "WI_HKEY": cache.pool.hkey,
            "WI_HHEAD": cache.pool.hhead, "WI_HTAIL": cache.pool.htail, "WI_BOFF": cache.pool.boff,
            "WI_RBLK": cache.pool.rblk, "WI_NCACHED": cache.pool.ncached, "WI_PST": cache.pool.pst,
            "WI_GAPW": rec.gapw,
            "WI_HELD_FINISHED": batch.zl, "WI_SCALARS": sc.ri}
    floats = {"WF_FIRST": req.first_t, "WF_LAST": req.last_t, "WF_FINISH": req.finish_t,
              "WF_SWAPPED": swap.swapped_s, "WF_ACC": rec.acc, "WF_ITL_V": rec.itl_v, "WF_KEY": req.key,
              "WF_DEC_COST": rec.dec_cost, "WF_SKEY": swap.skey, "WF_SWAPPED_SINCE": swap.swapped_since,
              "WF_SCALARS": sc.rf}
    for views, sizes in ((ints, si), (floats, sf)):
        for name, view in views.items():
            j = getattr(W, name)
            assert view.size == sizes[j], name
            assert view.size == 0 or view[0] == sum(sizes[:j]), name
    # the per-request columns are where the reduction and the drivers read them (column j at j * n)
    for j in (W.WI_STATUS, W.WI_G, W.WI_NPRE, W.WI_NSWAP, W.WI_CTOK, W.WI_ONES):
        assert sum(si[:j]) == j * dims[0]
    for j in (W.WF_FIRST, W.WF_FINISH, W.WF_SWAPPED):
        assert sum(sf[:j]) == j * dims[0]
    assert sum(sf[:W.WF_ACC]) == W.WF_HEAD * dims[0] and sum(si[:W.WI_HIST]) == W.WI_HEAD * dims[0]


def test_the_gap_room_rounds_up_by_at_most_an_eighth():
    """`workspace._gap_room` (the gap samples' room of a replica handed its
    requests, a fleet's): at least the bound, at most an eighth more, never
    smaller for a larger bound, compiled and as Python alike
    (`_memory.gap_room`, which the memory checks use); replications whose
    tokens differ by a little share it."""
    from fastsim import _memory
    from fastsim._numba_options import njit
    from fastsim.kernel import workspace as W

    @njit(cache=False)
    def compiled(xs, out):
        for i in range(xs.size):
            out[i] = W._gap_room(xs[i])

    xs = np.unique(np.concatenate([np.arange(1, 5000), np.geomspace(5000, 2 ** 50, 3000).astype(np.int64),
                                   2 ** np.arange(13, 51) + 1, 2 ** np.arange(13, 51) - 1]))
    room = np.empty_like(xs)
    compiled(xs, room)
    assert np.all(room >= xs) and np.all(room <= xs + xs // 8) and np.all(np.diff(room) >= 0)
    assert all(_memory.gap_room(int(x)) == int(r) for x, r in zip(xs[::37], room[::37]))
    assert _memory.gap_room(2 ** 70 + 1) == 2 ** 70 + 2 ** 67   # (Python's integers: no wrap-around)
    assert len({int(r) for r in room[(xs >= 300_000) & (xs < 310_000)]}) == 1
