"""Same seed, same result: whatever the thread count, chunking or run."""

import os
import subprocess
import sys

import numpy as np
import pandas as pd

import fastsim
from fastsim import _replicate

SCENARIO = fastsim.Scenario(
    engine=fastsim.EngineConfig(max_num_seqs=8, num_gpu_blocks=200, policy="priority"),
    workload=fastsim.Workload(arrival_rate=3.0, num_requests=200, prompt_len=fastsim.LogNormal(150, 0.6),
                              output_len=fastsim.Mixture([fastsim.Fixed(20), fastsim.Uniform(50, 200)],
                                                         [0.5, 0.5]),
                              burstiness=0.5, priorities=(0, 1, 2), priority_probs=(0.2, 0.3, 0.5)))


def test_identical_across_thread_counts_and_chunking(monkeypatch):
    a = fastsim.replicate(SCENARIO, 40, seed=123, n_threads=1).per_replication
    b = fastsim.replicate(SCENARIO, 40, seed=123, n_threads=2).per_replication   # small: one chunk, no pool
    pd.testing.assert_frame_equal(a, b)
    # A run this small is simulated in the calling thread, unless batch_size
    # splits it; without that cut-off, two threads share it in chunks.
    pools = []
    real_threads = _replicate._run_threads

    def counting_threads(work, chunks, n_threads, stop, bar):
        pools.append(n_threads)
        return real_threads(work, chunks, n_threads, stop, bar)

    monkeypatch.setattr(_replicate, "_run_threads", counting_threads)
    fastsim.replicate(SCENARIO, 40, seed=123, n_threads=2)
    assert pools == []
    c = fastsim.replicate(SCENARIO, 40, seed=123, batch_size=7, n_threads=2).per_replication
    assert pools == [2]
    pd.testing.assert_frame_equal(a, c)
    monkeypatch.setattr(_replicate, "_POOL_MIN_REQUESTS", 0)
    d = fastsim.replicate(SCENARIO, 40, seed=123, n_threads=2).per_replication
    assert len(pools) == 2
    pd.testing.assert_frame_equal(a, d)


def test_more_replications_extend_fewer():
    a = fastsim.replicate(SCENARIO, 10, seed=5).per_replication
    b = fastsim.replicate(SCENARIO, 30, seed=5).per_replication
    pd.testing.assert_frame_equal(a, b.iloc[:10])


def test_different_seeds_differ_and_entropy_reproduces():
    a = fastsim.replicate(SCENARIO, 10, seed=1)
    b = fastsim.replicate(SCENARIO, 10, seed=2)
    assert not np.allclose(a.per_replication["ttft_mean"], b.per_replication["ttft_mean"])
    fresh = fastsim.replicate(SCENARIO, 10)
    again = fastsim.replicate(SCENARIO, 10, seed=fresh.seed)
    pd.testing.assert_frame_equal(fresh.per_replication, again.per_replication)
    # Spawned child sequences (the usual parallel-seeding pattern) differ from
    # each other and from their parent, and each reproduces itself.
    children = np.random.SeedSequence(0).spawn(2)
    runs = [fastsim.replicate(SCENARIO, 5, seed=ch) for ch in children]
    parent = fastsim.replicate(SCENARIO, 5, seed=0)
    assert not runs[0].per_replication.equals(runs[1].per_replication)
    assert not runs[0].per_replication.equals(parent.per_replication)
    pd.testing.assert_frame_equal(runs[1].per_replication,
                                  fastsim.replicate(SCENARIO, 5, seed=runs[1].seed).per_replication)


def test_identical_under_numba_num_threads_env(tmp_path):
    """A fresh process with NUMBA_NUM_THREADS=1 reproduces the 2-thread result bit for bit."""
    code = ("import fastsim, sys; sys.path.insert(0, %r); from test_determinism import SCENARIO; "
            "fastsim.replicate(SCENARIO, 20, seed=77).per_replication.to_pickle(%r)")
    here = os.path.dirname(__file__)
    out = {}
    for threads in ("1", "2"):
        path = str(tmp_path / f"t{threads}.pkl")
        env = {**os.environ, "NUMBA_NUM_THREADS": threads}
        subprocess.run([sys.executable, "-c", code % (here, path)], check=True, env=env)
        out[threads] = pd.read_pickle(path)
    pd.testing.assert_frame_equal(out["1"], out["2"])


def test_workload_streams_do_not_depend_on_engine_settings():
    """Common random numbers: changing the server leaves the request stream alone."""
    other = SCENARIO.replace(**{"engine.policy": "sjf", "engine.max_num_seqs": 64})
    pd.testing.assert_frame_equal(fastsim.sample_requests(SCENARIO, seed=3, replication=4),
                                  fastsim.sample_requests(other, seed=3, replication=4))
