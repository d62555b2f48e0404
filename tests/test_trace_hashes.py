"""A replayed trace's block identities in prefix caching by block hash
(docs/engine-model.md, "Trace block identities"): the parents express
exactly the chained hashes' sharing, a cold large cache serving one request
at a time hits exactly what the trace's hashes say, and the kernel equals
the reference per request and on every metric."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim._traces import parent_steps, stream_parents, RequestTrace

DATA = Path(fastsim.__file__).parent / "data" / "traces"
MOONCAKE = DATA / "mooncake_conversation_head300.jsonl"
BS = 16
LAT = fastsim.LatencyModel(base_s=0.01, decode_scale_s=0.001, decode_alpha=1.0, prefill_per_token_s=1e-5)


def _records(path, n=None):
    with path.open() as fh:
        recs = [json.loads(line) for line in fh]
    return recs[:n]


def _shared_blocks(h_r, h_s, p_r, p_s, k):
    """Engine blocks two prompts share, straight from their hash lists: the
    common prefix of hashes, in engine blocks, within both prompts' full blocks."""
    c = 0
    while c < min(len(h_r), len(h_s)) and h_r[c] == h_s[c]:
        c += 1
    return min(p_r // BS, p_s // BS, c * k)


def _block_key(r, j, grp, plen, prompt):
    """`block_pool._block_id`'s identity of a trace request's prompt block j (the walk up the parents)."""
    q = r
    while (j + 1) * BS <= plen[q]:
        q = -2 - grp[q]
    return q, j


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_parents_express_chained_hash_sharing_exactly(seed):
    """Random streams of chained hashes (conversations that branch): two
    requests' prompt blocks j get one identity exactly when their hashes
    agree up to block j's hash block (and both prompts hold block j)."""
    rng = np.random.default_rng(seed)
    hb, k = 64, 64 // BS
    hashes, prompts = [], []

    def fresh(m):
        return [int(x) for x in rng.integers(10**6, 10**12, m)]

    for i in range(80):
        u = rng.random()
        if hashes and u < 0.1:      # the same prompt again
            j = int(rng.integers(len(hashes)))
            h, p = list(hashes[j]), prompts[j]
        else:
            # a branch of an earlier prompt: its full hash blocks kept (a hash
            # names its tokens: a partial block's hash is never a full one's),
            # new blocks after, the last one partial or full
            base = list(hashes[rng.integers(len(hashes))]) if hashes and u < 0.8 else []
            full = len(base) - 1 if base else 0
            h = base[:int(rng.integers(0, full + 1))] + fresh(int(rng.integers(1, 4)))
            p = (len(h) - 1) * hb + int(rng.integers(1, hb + 1))
        hashes.append(np.array(h, np.int64))
        prompts.append(p)
    grp, plen = stream_parents(hashes, prompts, hb, BS)
    assert (grp <= -2).all() and (-2 - grp <= np.arange(len(grp))).all()
    for r in range(len(hashes)):
        for s in range(r):
            shared = _shared_blocks(hashes[r], hashes[s], prompts[r], prompts[s], k)
            for j in range(min(prompts[r], prompts[s]) // BS):
                same = _block_key(r, j, grp, plen, prompts) == _block_key(s, j, grp, plen, prompts)
                assert same == (j < shared), (r, s, j, shared)


def test_window_replay_takes_parents_inside_the_window():
    """`parent_steps` replayed from a later row: a parent before the window is
    replaced by the best one inside it (same rule as a stream that starts there)."""
    recs = _records(MOONCAKE, 120)
    tr = RequestTrace(np.zeros(len(recs)), np.array([r["input_length"] for r in recs]),
                      np.array([r["output_length"] for r in recs]),
                      np.concatenate([[0], np.cumsum([len(r["hash_ids"]) for r in recs])]).astype(np.int64),
                      np.concatenate([r["hash_ids"] for r in recs]).astype(np.int64), 512)
    start, count, steps = parent_steps(tr, BS)
    for row0 in (0, 17, 60):
        grp, plen = stream_parents([np.array(r["hash_ids"]) for r in recs[row0:]],
                                   [r["input_length"] for r in recs[row0:]], 512, BS)
        for i in range(len(recs) - row0):
            row = row0 + i
            want = (-2 - i, 0)
            for e in range(start[row], start[row] + count[row]):
                if steps[e, 0] >= row0:
                    want = (-2 - (int(steps[e, 0]) - row0), int(steps[e, 1]) * BS)
                    break
            got = (int(grp[i]), int(plen[i]))
            # (the same parent, or another one sharing as many blocks)
            assert got[1] == want[1]
            assert (got[1] == 0) == (got[0] == -2 - i)


def _one_at_a_time(path, **kw):
    w = fastsim.Workload.from_trace(path, **kw)
    e = fastsim.EngineConfig(num_gpu_blocks=400_000, block_size=BS, max_num_seqs=1, max_num_batched_tokens=8192,
                             enable_prefix_caching=True, block_hash_caching=True)
    return fastsim.Scenario(engine=e, workload=w, latency=LAT)


def test_replay_hits_equal_the_trace_hashes():
    """A cold cache that never evicts (more blocks than the trace fills), one
    request at a time: request r hits exactly the blocks it shares with some
    earlier request (by the trace's hashes), at most (P_r - 1) // bs of them
    (vLLM recomputes the last prompt token)."""
    recs = _records(MOONCAKE)
    sc = _one_at_a_time(MOONCAKE)
    out = fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=0))
    assert (out["status"] == "completed").all() and (out["num_preemptions"] == 0).all()
    p = [r["input_length"] for r in recs]
    want = np.zeros(len(recs), np.int64)
    for r in range(len(recs)):
        best = max((_shared_blocks(recs[r]["hash_ids"], recs[s]["hash_ids"], p[r], p[s], 512 // BS)
                    for s in range(r)), default=0)
        want[r] = min(best, (p[r] - 1) // BS) * BS
    assert np.array_equal(out["cached_tokens"].to_numpy(), want)
    # (most share one system-prompt block; later turns of a conversation much more)
    assert (want > 512).sum() >= 10
    # replicate reports the same hits as its prefix hit rate
    rate = fastsim.replicate(sc, n_replications=2, seed=0).per_replication["prefix_hit_rate"]
    np.testing.assert_allclose(rate, want.sum() / sum(p), rtol=1e-12)


def test_token_id_replay_hits_equal_the_chained_hashes(tmp_path):
    """Token ids hashed into chained blocks of the engine's block size (the
    bundled RTX 4090 run's format; here conversations that share a system
    prompt and extend earlier prompts): the same exact count, from the
    token ids themselves (the longest run of leading tokens shared with an
    earlier request, in full blocks)."""
    rng = np.random.default_rng(5)
    system = rng.integers(0, 50_000, 40).tolist()
    ids = []
    for i in range(14):
        if ids and rng.random() < 0.6:
            base = ids[rng.integers(len(ids))]
            x = base[:int(rng.integers(len(base) // 2, len(base) + 1))] + rng.integers(0, 50_000, 30).tolist()
        else:
            x = system + rng.integers(0, 50_000, int(rng.integers(5, 60))).tolist()
        ids.append(x)
    path = tmp_path / "tokens.jsonl"
    with path.open("w") as fh:
        for i, x in enumerate(ids):
            fh.write(json.dumps({"input_toks": len(x), "output_toks": 8, "arrival_time_ns": i * 10**9,
                                 "input_tok_ids": x}) + "\n")
    sc = _one_at_a_time(path, block_size=BS)
    out = fastsim.simulate_requests(sc, fastsim.sample_requests(sc, seed=0))
    want = []
    for r, x in enumerate(ids):
        best = 0
        for y in ids[:r]:
            c = 0
            while c < min(len(x), len(y)) and x[c] == y[c]:
                c += 1
            best = max(best, c // BS)
        want.append(min(best, (len(x) - 1) // BS) * BS)
    assert out["prompt_len"].tolist() == [len(x) for x in ids]
    assert out["cached_tokens"].tolist() == want
    assert sum(w > 2 * BS for w in want) >= 3   # (hits beyond the system prompt's blocks)


def _tight(**kw):
    w = fastsim.Workload.from_trace(MOONCAKE, duration_s=16.0, rate_scale=0.5, **kw)   # (its first 60 requests)
    e = fastsim.EngineConfig(num_gpu_blocks=1500, block_size=BS, max_num_seqs=8, max_num_batched_tokens=2048,
                             enable_prefix_caching=True, block_hash_caching=True)
    return fastsim.Scenario(engine=e, workload=w, latency=LAT)


def test_kernel_equals_reference_per_request():
    sc = _tight()
    req = fastsim.sample_requests(sc, seed=0)
    fast = fastsim.simulate_requests(sc, req)
    ref = fastsim.simulate_requests(sc, req, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    assert fast["cached_tokens"].sum() > 0 and fast["num_preemptions"].sum() > 0


def test_kernel_equals_reference_on_every_metric_with_resampled_windows():
    w = fastsim.Workload.from_trace(MOONCAKE, duration_s=15.0, resample=True, rate_scale=1.0)
    e = fastsim.EngineConfig(num_gpu_blocks=1500, block_size=BS, max_num_seqs=8, max_num_batched_tokens=2048,
                             enable_prefix_caching=True, block_hash_caching=True)
    sc = fastsim.Scenario(engine=e, workload=w, latency=LAT)
    fast = fastsim.replicate(sc, n_replications=3, seed=4).per_replication
    ref = fastsim.replicate(sc, n_replications=3, seed=4, backend="reference").per_replication
    pd.testing.assert_frame_equal(fast, ref, check_exact=False, rtol=1e-9, atol=1e-12)
    assert (fast["prefix_hit_rate"] > 0).all()
