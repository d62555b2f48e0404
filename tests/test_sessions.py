"""Multi-turn sessions (docs/engine-model.md, "Sessions"): a hand-computed
session, the kernel against the reference per request and on every metric,
conservation, the cache hits each turn must get, and the checks of bad
input."""

import numpy as np
import pandas as pd
import pytest

import fastsim
from conftest import legacy_engine
from fastsim import kernel as K
from fastsim._replicate import pack_scenario
from fastsim._sessions import stream_arrays

BS = 16
# constant steps of 10 ms: a step's duration does not depend on its batch
FLAT = fastsim.LatencyModel(base_s=0.01, decode_scale_s=0.0, prefill_per_token_s=0.0)
LAT = fastsim.LatencyModel(base_s=0.01, decode_scale_s=0.001, decode_alpha=1.0, prefill_per_token_s=1e-5)


def engine(caching=True, **kw):
    base = dict(num_gpu_blocks=300, block_size=BS, max_num_seqs=6, max_num_batched_tokens=256,
                enable_prefix_caching=caching, block_hash_caching=caching)
    base.update(kw)
    return legacy_engine(**base)   # (the synchronous loop of the hand-computed cases; async: test_sessions_async)


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


def test_one_session_by_hand():
    """One user, three turns of 32 new tokens and 16 output tokens, 1 s of
    thought, 10 ms steps, a cold cache. Turn k is one prefill step and 15
    decode steps (160 ms); turn k + 1 goes 1 s after turn k's last token,
    with the conversation so far as its prompt (32, 80, 128 tokens). A turn
    hits the blocks its session's last turn filled with computed tokens
    (all of its tokens but the last: 47 -> 2 blocks, 95 -> 5 blocks)."""
    w = fastsim.Workload(max_concurrency=1, num_requests=3, prompt_len=32, output_len=16,
                         sessions=fastsim.Sessions(turns=3, think_time_s=1.0))
    sc = fastsim.Scenario(engine=engine(num_gpu_blocks=64, max_num_batched_tokens=512), workload=w, latency=FLAT)
    for backend in ("numba", "reference"):
        out = run(sc, backend=backend)
        assert out["prompt_len"].tolist() == [32, 80, 128]
        assert out["output_len"].tolist() == [16, 16, 16]
        assert out["session"].tolist() == [0, 0, 0] and out["turn"].tolist() == [1, 2, 3]
        assert (out["status"] == "completed").all()
        assert out["cached_tokens"].tolist() == [0, 2 * BS, 5 * BS]
        sent = [0.0, 1.16, 2.32]
        np.testing.assert_allclose(out["arrival_s"], sent, rtol=1e-12)
        np.testing.assert_allclose(out["first_token_s"], np.add(sent, 0.01), rtol=1e-12)
        np.testing.assert_allclose(out["finish_s"], np.add(sent, 0.16), rtol=1e-12)
        # each turn is sent exactly think_time_s after the last one finished
        assert np.array_equal(out["arrival_s"].to_numpy()[1:], out["finish_s"].to_numpy()[:-1] + 1.0)


CONFIGS = {
    # name: (engine kwargs, workload kwargs)
    "users-cached": (dict(), dict()),
    "users-no-cache-zero-think": (dict(caching=False), dict(think=0.0, dist="fixed")),
    "open-cached-max-model-len": (dict(max_model_len=600), dict(mode="open")),
    "open-queue-limit-priority": (dict(max_model_len=400, admission="queue_limit", max_waiting=2, policy="priority"),
                                  dict(mode="open", think=0.2, dist="fixed", priorities=(0, 1),
                                       priority_probs=(0.5, 0.5))),
    "open-abandonment-no-cache": (dict(caching=False, max_queue_delay_s=0.5), dict(mode="open")),
    "users-tight-kv-preemption": (dict(num_gpu_blocks=60, max_model_len=900), dict(think=0.1)),
    "open-horizon": (dict(), dict(mode="open", horizon_s=15.0, n=200)),
    "users-no-chunking": (dict(enable_chunked_prefill=False, max_num_batched_tokens=400), dict()),
}
COLUMNS = ["arrival_s", "prompt_len", "output_len", "priority", "session", "turn", "status", "first_token_s",
           "finish_s", "num_preemptions", "num_tokens", "cached_tokens"]


def scenario(name):
    ekw, wkw = CONFIGS[name]
    ekw, wkw = dict(ekw), dict(wkw)
    return fastsim.Scenario(engine=engine(ekw.pop("caching", True), **ekw), workload=workload(**wkw), latency=LAT)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kernel_equals_reference_per_request(name):
    sc = scenario(name)
    for rep in range(2):
        fast, ref = run(sc, replication=rep), run(sc, replication=rep, backend="reference")
        pd.testing.assert_frame_equal(fast[COLUMNS], ref[COLUMNS], check_exact=True, check_dtype=False)
        assert fast["turn"].max() >= 3   # (sessions of several turns ran)
    if "cached" in name:
        assert (fast["cached_tokens"] > 0).any()


@pytest.mark.parametrize("name", ["users-cached", "open-horizon", "users-tight-kv-preemption"])
def test_kernel_equals_reference_on_every_metric(name):
    sc = scenario(name)
    fast = fastsim.replicate(sc, n_replications=3, seed=5).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=5, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)
    # the arrivals counted are the turns sent (not the sends left unmade)
    for rep in range(3):
        out = run(sc, seed=5, replication=rep)
        assert fast.loc[rep, "n_arrived"] == len(out)
        assert fast.loc[rep, "n_completed"] == (out["status"] == "completed").sum()


def test_preemptions_happen_in_the_tight_case():
    """(The tight-KV configuration exercises preemption with shared blocks.)"""
    sc = scenario("users-tight-kv-preemption")
    assert sum(run(sc, replication=r)["num_preemptions"].sum() for r in range(4)) > 0


def check_conversations(sc, out):
    """Every turn sent is accounted once (none beyond num_requests), in
    arrival order; each session's turns extend its conversation and go on
    only after a completed turn; returns each session's gaps between a
    turn's last token and its next turn's send."""
    assert len(out) <= sc.workload.num_requests
    left = ["completed", "rejected_too_long", "rejected_admission", "dropped"]
    # (a horizon leaves what is in the system unfinished; all sent before it)
    if sc.workload.horizon_s is not None:
        left.append("unfinished")
        assert (out["arrival_s"] < sc.workload.horizon_s).all()
    assert out["status"].isin(left).all()
    assert (np.diff(out["arrival_s"]) >= 0).all()
    gaps = []
    for _, s in out.groupby("session"):
        p, o = s["prompt_len"].to_numpy(), s["output_len"].to_numpy()
        assert (p[1:] - p[:-1] - o[:-1] >= 1).all()
        assert (s["status"].to_numpy()[:-1] == "completed").all()
        gap = s["arrival_s"].to_numpy()[1:] - s["finish_s"].to_numpy()[:-1]
        assert (gap >= 0).all()
        gaps.append(gap)
    return gaps


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conservation_and_the_conversation(name):
    """Every turn sent is accounted once; a turn's prompt is its session's
    last turn's prompt and output plus new tokens, sent after that turn
    finished; a session goes on only after a completed turn; the block pool
    is conserved after every step; nothing is sent beyond num_requests."""
    sc = scenario(name)
    for rep in range(2):
        draws = fastsim.sample_requests(sc, seed=7, replication=rep)
        out = fastsim.simulate_requests(sc, draws)
        check_conversations(sc, out)
        mml = sc.engine.max_model_len
        if mml is not None:
            too_long = out["status"] == "rejected_too_long"
            assert ((out["prompt_len"] + out["output_len"] > mml) == too_long).all()
        if sc.engine.enable_prefix_caching:
            assert _checked_run(sc, draws) >= 0


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


def test_each_turn_hits_what_its_session_left_cached():
    """One user at a time and a cache too large to evict: turn k + 1 hits
    exactly the blocks turn k filled with computed tokens,
    floor((P_k + O_k - 1) / bs) of them, and a session's first turn hits
    nothing (sessions share no tokens)."""
    w = workload(max_concurrency=1, think=0.05, dist="fixed", n=60)
    sc = fastsim.Scenario(engine=engine(num_gpu_blocks=4000, max_num_seqs=1), workload=w, latency=LAT)
    for rep in range(3):
        out = run(sc, replication=rep)
        assert (out["status"] == "completed").all()
        prev = out.shift(1)
        same = out["session"] == prev["session"]
        want = np.where(same, (prev["prompt_len"] + prev["output_len"] - 1) // BS * BS, 0)
        assert np.array_equal(out["cached_tokens"].to_numpy(), want.astype(np.int64))
        assert same.sum() > 10


def test_hit_rate_rises_with_turns():
    """The share of a turn's prompt served from the cache grows with the
    turn number, as the conversation prefix grows: the mean over turns 1, 2,
    3+ rises by more than 4 standard errors each time."""
    sc = scenario("users-cached")
    out = pd.concat([run(sc, replication=r) for r in range(6)])
    out = out[out["status"] == "completed"]
    frac = out["cached_tokens"] / out["prompt_len"]
    by = frac.groupby(np.minimum(out["turn"], 3))
    mean, se = by.mean(), by.std() / np.sqrt(by.count())
    assert mean[1] == 0.0
    assert mean[2] - mean[1] > 4 * se[2]
    assert mean[3] - mean[2] > 4 * np.hypot(se[2], se[3])


def test_same_seed_same_results_on_any_thread_count():
    sc = scenario("open-cached-max-model-len")
    a = fastsim.replicate(sc, n_replications=6, seed=3, n_threads=1).per_replication
    b = fastsim.replicate(sc, n_replications=6, seed=3, n_threads=2, batch_size=2).per_replication
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("kw, match", [
    (dict(turns=0), "turns"),
    (dict(think_time_s=-1.0), "think_time_s"),
    (dict(think_time_dist="weibull"), "think_time_dist"),
])
def test_bad_session_laws(kw, match):
    with pytest.raises(ValueError, match=match):
        fastsim.Sessions(**kw)


@pytest.mark.parametrize("wkw, match", [
    (dict(arrival_rate=2.0, max_concurrency=3), "exactly one of arrival_rate"),
    (dict(arrival_rate=2.0, prefix_groups=2, prefix_len=10), "prefix_groups"),
    (dict(arrival_rate=2.0, warmup_requests=5), "warmup_requests"),
    (dict(max_concurrency=2, think_time_s=1.0), "think_time_s"),
])
def test_bad_session_workloads(wkw, match):
    with pytest.raises(ValueError, match=match):
        fastsim.Workload(sessions=fastsim.Sessions(turns=2), **wkw)
    with pytest.raises(ValueError, match="sessions must be None or a fastsim.Sessions"):
        fastsim.Workload(arrival_rate=1.0, sessions=3)


@pytest.mark.parametrize("ekw, match", [
    (dict(policy="sjf"), "policy"),
    (dict(preemption_mode="swap", swap_space_blocks=10), "preemption_mode"),
    (dict(enable_prefix_caching=True, block_hash_caching=False), "block_hash_caching"),
    (dict(scheduler="static"), "scheduler"),
])
def test_bad_session_engines(ekw, match):
    base = dict(num_gpu_blocks=100, block_size=BS, enable_prefix_caching=False, block_hash_caching=False)
    base.update(ekw)
    with pytest.raises(ValueError, match=match):
        fastsim.Scenario(engine=fastsim.EngineConfig(**base), workload=workload(), latency=LAT)


def test_compare_tells_session_laws_apart():
    """`compare` pairs scenarios only over the same workload: another think
    time or session law is another workload."""
    from fastsim._compare import same_workload

    a = scenario("users-cached")
    assert same_workload(a, a.replace(**{"engine.max_num_seqs": 4}))
    for other in (fastsim.Sessions(turns=fastsim.Geometric(mean_len=3.0), think_time_s=0.6,
                                   think_time_dist="exponential"),
                  fastsim.Sessions(turns=2, think_time_s=0.3, think_time_dist="exponential")):
        assert not same_workload(a, a.replace(**{"workload.sessions": other}))
