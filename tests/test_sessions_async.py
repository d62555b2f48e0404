"""Multi-turn sessions under vLLM V1's rules (docs/engine-model.md,
"Sessions" and "Async scheduling"): a turn's send follows its session's last
turn's last token (the client sees it when the step that produced it ends),
kernel = reference per request over the session configurations and over
random engines with async scheduling, the full-input gate, the null block
and caching by block hash each on and off; the block pool conserved after
every step; every turn's send time in closed form on an idle server."""

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim import kernel as K
from test_sessions import check_conversations
from fastsim._replicate import pack_scenario
from fastsim._sessions import stream_arrays

BS = 16
FLAT = fastsim.LatencyModel(base_s=0.01, decode_scale_s=0.0, prefill_per_token_s=0.0)
LAT = fastsim.LatencyModel(base_s=0.01, decode_scale_s=0.001, decode_alpha=1.0, prefill_per_token_s=1e-5)
COLUMNS = ["arrival_s", "prompt_len", "output_len", "priority", "session", "turn", "status", "first_token_s",
           "finish_s", "num_preemptions", "num_tokens", "cached_tokens"]


def engine(async_on=True, v1=True, caching=True, **kw):
    """An engine with vLLM V1's switches set explicitly: ``async_on`` async
    scheduling, ``v1`` the full-input gate and the null block, ``caching``
    prefix caching by block hash."""
    base = dict(num_gpu_blocks=300, block_size=BS, max_num_seqs=6, max_num_batched_tokens=256,
                async_scheduling=async_on, scheduler_reserve_full_isl=v1, null_block=v1,
                enable_prefix_caching=caching, block_hash_caching=caching)
    base.update(kw)
    return fastsim.EngineConfig(**base)


def workload(mode="users", turns=None, think=0.3, dist="exponential", n=120, **kw):
    load = dict(max_concurrency=4) if mode == "users" else dict(arrival_rate=3.0)
    load.update(kw)
    return fastsim.Workload(num_requests=n, prompt_len=fastsim.LogNormal(median=60, sigma=0.6),
                            output_len=fastsim.LogNormal(median=30, sigma=0.8),
                            sessions=fastsim.Sessions(turns=turns or fastsim.Geometric(mean_len=3.0),
                                                      think_time_s=think, think_time_dist=dist), **load)


def run(sc, seed=7, replication=0, backend="numba"):
    return fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=seed, replication=replication),
                                     backend=backend)


CONFIGS = {
    # name: (engine kwargs, workload kwargs)
    "users-cached": (dict(), dict()),
    "users-no-cache-zero-think": (dict(caching=False), dict(think=0.0, dist="fixed")),
    "users-cached-zero-think": (dict(), dict(think=0.0, dist="fixed")),
    "open-cached-max-model-len": (dict(max_model_len=600), dict(mode="open")),
    "open-queue-limit-priority": (dict(max_model_len=400, admission="queue_limit", max_waiting=2, policy="priority"),
                                  dict(mode="open", think=0.2, dist="fixed", priorities=(0, 1),
                                       priority_probs=(0.5, 0.5))),
    "open-abandonment": (dict(max_queue_delay_s=0.3), dict(mode="open", think=0.0, dist="fixed")),
    "users-tight-kv-preemption": (dict(num_gpu_blocks=60, max_model_len=900), dict(think=0.1)),
    "open-horizon": (dict(), dict(mode="open", horizon_s=15.0, n=200)),
    "users-no-chunking": (dict(enable_chunked_prefill=False, max_num_batched_tokens=400), dict()),
    "users-kv-reservation": (dict(admission="kv_reservation", num_gpu_blocks=80), dict(think=0.0, dist="fixed")),
}


def scenario(name, async_on=True, v1=True):
    ekw, wkw = CONFIGS[name]
    return fastsim.Scenario(engine=engine(async_on, v1, **ekw), workload=workload(**wkw), latency=LAT)


def assert_same(fast, ref):
    pd.testing.assert_frame_equal(fast[COLUMNS].reset_index(drop=True), ref[COLUMNS].reset_index(drop=True),
                                  check_exact=True, check_dtype=False)


@pytest.mark.parametrize("v1", [True, False], ids=["gate-null", "no-gate"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_async_kernel_equals_reference_per_request(name, v1):
    sc = scenario(name, v1=v1)
    for rep in range(2):
        fast, ref = run(sc, replication=rep), run(sc, replication=rep, backend="reference")
        assert_same(fast, ref)
        assert fast["turn"].max() >= 3   # (sessions of several turns ran)
    if sc.engine.enable_prefix_caching:
        assert (fast["cached_tokens"] > 0).any()


def random_scenario(seed):
    """A random session scenario under async scheduling: tight or loose KV,
    block sizes 1-32, small token budgets (long prompts in chunks), priority,
    admission control, abandonment, horizons, each V1 switch on or off."""
    rng = np.random.default_rng(seed)
    bs = int(rng.choice([1, 4, 16, 32]))
    blocks_needed = 700 // bs
    ekw = dict(block_size=bs, num_gpu_blocks=int(blocks_needed * rng.choice([1.0, 1.3, 3.0, 30.0])) + 2,
               max_num_seqs=int(rng.integers(1, 9)), max_num_batched_tokens=int(rng.choice([48, 128, 512])),
               max_model_len=int(rng.choice([500, 700])),
               policy=str(rng.choice(["fcfs", "priority"])))
    v1 = bool(rng.integers(2))
    caching = bool(rng.integers(2))
    if rng.random() < 0.3:
        ekw.update(admission="queue_limit", max_waiting=int(rng.integers(0, 4)))
    if rng.random() < 0.3:
        ekw["max_queue_delay_s"] = float(rng.choice([0.05, 0.5]))
    wkw = dict(mode=str(rng.choice(["users", "open"])), think=float(rng.choice([0.0, 0.02, 0.3])),
               dist=str(rng.choice(["fixed", "exponential"])), n=int(rng.integers(40, 140)))
    if wkw["mode"] == "users":
        wkw["max_concurrency"] = int(rng.integers(1, 10))
    else:
        wkw["arrival_rate"] = float(rng.choice([1.0, 5.0, 20.0]))
    if rng.random() < 0.25 and wkw["mode"] == "open":
        wkw["horizon_s"] = float(rng.choice([2.0, 8.0]))
    if rng.random() < 0.4:   # tight KV under heavy load: preemptions of turns sharing blocks
        ekw.update(num_gpu_blocks=-(-ekw["max_model_len"] // bs) + 2, max_num_seqs=8)
        wkw.update(think=0.0, dist="fixed", max_concurrency=8) if wkw["mode"] == "users" else \
            wkw.update(arrival_rate=20.0)
    if ekw["policy"] == "priority":
        wkw.update(priorities=(0, 1, 2), priority_probs=(0.3, 0.3, 0.4))
    lat = fastsim.LatencyModel(base_s=float(rng.choice([0.005, 0.02])), decode_scale_s=0.001, decode_alpha=1.0,
                               prefill_per_token_s=float(rng.choice([0.0, 2e-5])))
    return fastsim.Scenario(engine=engine(True, v1, caching, **ekw), workload=workload(**wkw), latency=lat)


@pytest.mark.parametrize("seed", range(24))
def test_async_kernel_equals_reference_random(seed):
    sc = random_scenario(seed)
    fast, ref = run(sc, seed=seed), run(sc, seed=seed, backend="reference")
    assert_same(fast, ref)
    assert len(fast) > 0


def _checked_run(sc, draws):
    """The kernel with the block pool's conservation checked after every step
    (``I_BLOCK_HASH`` = 2: `_simulate` returns -3 at the first failure)."""
    packed = pack_scenario(sc)
    ipar = packed["ipar"].copy()
    ipar[K.I_BLOCK_HASH] = 2
    a, *cols = (np.array(x) for x in stream_arrays(draws))   # (writeable: turns are written as they are sent)
    n = np.int64(a.size)
    ni, nf = K._ws_need(n, cols[0], cols[1], cols[4], cols[5], ipar)
    wi, wf = np.zeros(ni, np.int64), np.zeros(nf)
    rlat, rfpar = K.run_records(packed["lat"], packed["fpar"], np.uint64(0), np.uint64(0), 0)
    return K._simulate(n, a, *cols, ipar, rfpar, rlat, wi, wf, 1, np.inf, K.WHOLE_RUN)


@pytest.mark.parametrize("name", ["users-cached", "users-tight-kv-preemption", "open-horizon",
                                  "users-kv-reservation", "open-abandonment"])
def test_async_conservation_and_sends(name):
    """Every turn sent is accounted once; each turn is sent exactly a think
    time after its session's last turn's last token (as the client sees it,
    although vLLM applies that completion a step later); a session goes on
    only after a completed turn; nothing is sent beyond num_requests; the
    block pool is conserved after every step."""
    sc = scenario(name)
    think = sc.workload.sessions.think_time_s
    fixed = sc.workload.sessions.think_time_dist == "fixed"
    for rep in range(2):
        draws = fastsim.sample_requests(sc, seed=7, replication=rep)
        out = fastsim.simulate_requests(sc, draws)
        for gap in check_conversations(sc, out):
            if fixed:
                np.testing.assert_allclose(gap, think, rtol=0, atol=1e-12)
        if sc.engine.enable_prefix_caching:
            assert _checked_run(sc, draws) >= 0


@pytest.mark.parametrize("async_on", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("v1", [True, False], ids=["gate-null", "no-gate"])
@pytest.mark.parametrize("caching", [True, False], ids=["block-hash", "no-cache"])
def test_one_session_on_an_idle_server_in_closed_form(async_on, v1, caching):
    """One user, four turns of 32 new tokens and 16 output tokens, 1 s of
    thought, constant 10 ms steps: each turn finds the server idle, so async
    scheduling schedules its prefill and first decode at once (nothing in
    flight) and its last token comes 16 steps after its send, as in the
    synchronous loop: turn k is sent at (k - 1)(0.16 + 1) s, its first token
    10 ms later, its last 160 ms later. A turn hits the blocks its session's
    last turn filled with computed tokens, floor((P + O - 1) / 16)."""
    w = fastsim.Workload(max_concurrency=1, num_requests=4, prompt_len=32, output_len=16,
                         sessions=fastsim.Sessions(turns=4, think_time_s=1.0))
    sc = fastsim.Scenario(engine=engine(async_on, v1, caching, num_gpu_blocks=64, max_num_batched_tokens=512),
                          workload=w, latency=FLAT)
    sent = np.arange(4) * 1.16
    for backend in ("numba", "reference"):
        out = run(sc, backend=backend)
        assert out["prompt_len"].tolist() == [32, 80, 128, 176]
        assert (out["status"] == "completed").all()
        np.testing.assert_allclose(out["arrival_s"], sent, rtol=1e-12)
        np.testing.assert_allclose(out["first_token_s"], sent + 0.01, rtol=1e-12)
        np.testing.assert_allclose(out["finish_s"], sent + 0.16, rtol=1e-12)
        hits = [0, 2 * BS, 5 * BS, 8 * BS] if caching else [0, 0, 0, 0]
        assert out["cached_tokens"].tolist() == hits


@pytest.mark.parametrize("name", ["users-cached", "open-horizon", "users-tight-kv-preemption", "open-abandonment"])
def test_async_every_metric_and_littles_law(name):
    """`replicate`'s rows: kernel = reference on every metric; every turn
    sent counted once (completed, rejected, dropped or unfinished); Little's
    law exact (the requests counted in the system step by step against the
    sum of their sojourns), the one-step lag of async scheduling included."""
    sc = scenario(name)
    fast = fastsim.replicate(sc, n_replications=3, seed=5).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=5, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)
    for rep in range(3):
        row = fast.loc[rep]
        assert row["n_arrived"] == len(run(sc, seed=5, replication=rep))
        assert row["n_arrived"] == row["n_completed"] + row["n_rejected"] + row["n_dropped"] + row["n_unfinished"]
        np.testing.assert_allclose(row["time_in_system_integral"], row["sojourn_sum"], rtol=1e-9)
