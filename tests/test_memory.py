"""Memory safety (issue 43, items 1 and 2): workspace sizes in exact
integers, and runs refused before allocating when they cannot fit.

Each memory bomb of the issue must be a ValueError naming the parameter,
within a second and without allocating (checked with tracemalloc: NumPy
reports its allocations to it)."""

import time
import tracemalloc

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim import _memory
from fastsim._replicate import pack_scenario
from test_workspace import CASES, stream

SEGFAULT = fastsim.Scenario(
    engine=fastsim.EngineConfig(enable_prefix_caching=True, block_size=1),
    workload=fastsim.Workload(prompt_len=2 ** 40, prefix_groups=2 ** 22, prefix_len=2 ** 40 - 1))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("rep", [0, 1, 2])
def test_exact_sizes_mirror_the_kernel(name, rep):
    # the Python mirror of _ws_dims/_ws_sizes gives the kernel's figures
    args, p = stream(CASES[name], rep)
    n, a, pr, o, c, q, grp, plen = args
    dims = _memory.ws_dims(n, pr, o, grp, plen, p["ipar"])
    mine = _memory.ws_sizes(n, int(p["ipar"][K.I_BLOCK_SIZE]), *dims[:4], *dims[5:])
    assert mine == tuple(int(x) for x in K._ws_need(n, pr, o, grp, plen, p["ipar"]))
    # a replica handed its requests (a fleet's): the gap room rounded, as `replica._state_dims` states it
    handed = _memory.ws_dims(n, pr, o, grp, plen, p["ipar"], handed=True)
    assert handed[3] == _memory.gap_room(dims[3]) and handed[:3] + handed[4:] == dims[:3] + dims[4:]
    mine = _memory.ws_sizes(n, int(p["ipar"][K.I_BLOCK_SIZE]), *handed[:4], *handed[5:])
    assert mine == tuple(int(x) for x in K._ws_need_handed(n, pr, o, grp, plen, p["ipar"]))
    wi = np.zeros(mine[0], np.int64)
    K.replica._state_dims(n, pr, o, grp, plen, p["ipar"], wi)
    assert tuple(wi[wi.size - K.workspace.N_RI + K.workspace.RI_DIM_CAP:][:7]) == handed
    # a fleet's compact row of m of the requests (`cluster.compact_capacity`): m seats at most, the gap room
    # shared by count; m = n is the handed layout itself
    for m in (1, max(1, n // 3), n):
        compact = _memory.ws_dims(n, pr, o, grp, plen, p["ipar"], capacity=m)
        if m == n:
            assert compact == handed
        mine = _memory.ws_sizes(m, int(p["ipar"][K.I_BLOCK_SIZE]), *compact[:4], *compact[5:])
        assert mine == tuple(int(x) for x in K._ws_need_compact(m, n, pr, o, grp, plen, p["ipar"]))
        wi = np.zeros(mine[0], np.int64)
        K.replica._state_dims_compact(m, n, pr, o, grp, plen, p["ipar"], wi)
        assert tuple(wi[wi.size - K.workspace.N_RI + K.workspace.RI_DIM_CAP:][:7]) == compact


@pytest.mark.parametrize("name", list(CASES))
def test_bound_holds_every_drawn_replication(name):
    sc = CASES[name]
    bound = _memory.workspace_bound(sc)
    for rep in range(20):
        args, p = stream(sc, rep)
        n, a, pr, o, c, q, grp, plen = args
        cap, ncnt, nheld, nitl, _, nbp, nbt = _memory.ws_dims(n, pr, o, grp, plen, p["ipar"])
        assert n <= bound["n"][0] and cap <= bound["cap"][0] and ncnt <= bound["ncnt"][0]
        assert nheld <= bound["nheld"][0] and nitl <= bound["nitl"][0]
        assert nbp <= bound["nbp"][0] and nbt <= bound["nbt"][0]


def _refused_fast(call, match):
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ValueError, match=match):
            call()
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < 50 * 2 ** 20   # nothing of the bomb's size was allocated


def test_segfault_case_is_a_value_error():
    # 3 * groups x prefix blocks wrapped around int64 in the kernel: SIGSEGV
    _refused_fast(lambda: fastsim.replicate(SEGFAULT, 2, seed=0),
                  r"too large for the kernel's 64-bit sizes: prefix_groups, prefix_len and block_size .*"
                  r"reduce prefix_groups or prefix_len, or raise block_size")
    _refused_fast(lambda: fastsim.sample_requests(SEGFAULT, seed=0), r"64-bit sizes: prefix_groups")


BOMBS = {
    "dense prefix table": (
        lambda: fastsim.replicate(fastsim.Scenario(
            engine=fastsim.EngineConfig(enable_prefix_caching=True),
            workload=fastsim.Workload(prompt_len=2000, prefix_groups=2 ** 24, prefix_len=1000)), 2, seed=0),
        r"replicate needs about .* GiB of memory .* the prefix-cache table .* grows with prefix_groups: "
        r"reduce prefix_groups"),
    "num_requests": (
        lambda: fastsim.replicate(fastsim.Scenario(workload=fastsim.Workload(num_requests=10 ** 8)), 2, seed=0),
        r"engine workspace .* grows with num_requests: reduce num_requests"),
    "n_replications": (
        lambda: fastsim.replicate(fastsim.Scenario(workload=fastsim.Workload(num_requests=10)), 10 ** 8, seed=0),
        r"result tables \(.* GiB\) grows with n_replications: reduce n_replications"),
    "multi_user": (   # (the scenario built outside the timed call: scipy's import takes ~1 s)
        lambda sc=fastsim.Scenario(workload=fastsim.Workload.multi_user(2 ** 24, requests_per_user=10,
                                                                        user_rate=1.0)):
            fastsim.replicate(sc, 2, seed=0),
        r"grows with users: reduce users"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_memory_bomb_is_refused_before_allocating(name, monkeypatch):
    monkeypatch.setenv("FASTSIM_MEMORY_LIMIT", "16G")   # the same verdict on any machine
    call, match = BOMBS[name]
    _refused_fast(call, match)


def test_limit_names_its_source_and_is_validated(monkeypatch):
    monkeypatch.setenv("FASTSIM_MEMORY_LIMIT", "1M")
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=10 ** 5))
    with pytest.raises(ValueError, match=r"more than 80% of the 1 MiB available \(FASTSIM_MEMORY_LIMIT\)"):
        fastsim.replicate(sc, 2, seed=0)
    monkeypatch.setenv("FASTSIM_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match=r"FASTSIM_MEMORY_LIMIT must be a byte count > 0.*got 'lots'"):
        fastsim.replicate(sc, 2, seed=0)
    assert _memory.parse_memory_limit("4G") == 4 * 2 ** 30
    assert _memory.parse_memory_limit("512MiB") == 512 * 2 ** 20
    assert _memory.parse_memory_limit("1000") == 1000


def test_available_memory_reads_the_machine(monkeypatch):
    monkeypatch.delenv("FASTSIM_MEMORY_LIMIT", raising=False)
    avail, source = _memory.available_memory()
    if avail is not None:
        assert 0 <= avail and isinstance(source, str)


def test_simulate_requests_refuses_an_overflowing_stream():
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(enable_prefix_caching=True, block_size=1))
    req = {"arrival_s": [0.0, 1.0], "prompt_len": [2 ** 40, 2 ** 40], "output_len": [1, 1],
           "prefix_group": [2 ** 40, 0], "prefix_len": [2 ** 40 - 1, 2 ** 40 - 1]}
    _refused_fast(lambda: fastsim.simulate_requests(sc, req),
                  r"requests: the engine workspace for these 2 requests is too large for the kernel's "
                  r"64-bit sizes .* reduce prefix_group x prefix_len")


def test_workspace_growth_beyond_reach_is_a_value_error():
    # a drawn replication asking for more than NumPy can reserve (a huge
    # output draw, or a size that wrapped around)
    sc = fastsim.Scenario(workload=fastsim.Workload(num_requests=4))
    buf = _memory.CheckedBuffers(4, sc)
    for need in (2 ** 45, 2 ** 61):   # 256 TiB: MemoryError; 16 EiB: NumPy's "array is too big"
        buf.need[:] = (need, need)
        with pytest.raises(ValueError, match=r"workspace of .* more than this machine can reserve.*"
                                             r"num_gpu_blocks \* block_size = 109152\); reduce num_requests, "
                                             r"output_len or num_gpu_blocks"):
            buf.grow()
    buf.need[:] = (-5, 10)
    with pytest.raises(ValueError, match=r"beyond the kernel's 64-bit sizes \(-5, 10\)"):
        buf.grow()


def test_checked_runs_give_the_same_results():
    # the checked buffers change nothing: same rows as the kernel's own runner
    sc = CASES["prefix-cache"]
    res = fastsim.replicate(sc, 6, seed=3, n_threads=1)
    p = pack_scenario(sc)
    out = np.empty((6, K.N_COLUMNS))
    assert K.run_chunk(0, 6, *fastsim._replicate._seed_keys(3)[:2], *K.scenario_arrays(p), out,
                       K.engine_variant(p["ipar"])) == 0
    np.testing.assert_array_equal(res.per_replication.to_numpy(dtype=float), out)


def test_huge_output_draw_is_refused_not_allocated():
    # the issue's PiB request: the gap samples' room is the measured output
    # tokens, each capped at the KV cache (here 2**39 tokens); the estimate
    # cannot see a draw, the checked buffers refuse it
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(num_gpu_blocks=2 ** 35, block_size=16,
                                                      enable_prefix_caching=False),   # (no block pool)
                          workload=fastsim.Workload(num_requests=4, output_len=fastsim.LogNormal(2 ** 39, 0.1)))
    _refused_fast(lambda: fastsim.replicate(sc, 2, seed=0, n_threads=1),
                  r"a replication needs an engine workspace of .* TiB, more than this machine can reserve")


def test_output_overflow_names_the_output_law():
    # 2**23 requests whose (lognormal: unbounded) outputs may each fill a
    # 2**40-token KV cache: gap room beyond int64
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(num_gpu_blocks=2 ** 35, block_size=16),
                          workload=fastsim.Workload(num_requests=2 ** 24, output_len=fastsim.LogNormal(100, 1.0)))
    _refused_fast(lambda: fastsim.replicate(sc, 2, seed=0),
                  r"64-bit sizes: num_requests, output_len and num_gpu_blocks \* block_size allow up to .* "
                  r"reduce num_requests or output_len \(its largest draw\), or the KV cache")
