"""fastsim.sweep on a dask.distributed cluster through joblib's dask backend.

:func:`fastsim._parallel.run_parallel` dispatches through joblib's *active*
backend, so ``with joblib.parallel_config(backend="dask")`` sends the sweep's
points to the cluster's workers. Each point's seed depends only on the sweep
seed and the point's index, so the frame must be bit-identical to an
in-process run.
"""

import joblib
import pandas as pd
import pytest

import fastsim

distributed = pytest.importorskip("distributed")


def _sweep(n_jobs):
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=100, output_len=32,
                                                    prompt_len=64))
    grid = {"workload.arrival_rate": [1.0, 3.0], "engine.max_num_seqs": [4, 16]}
    return fastsim.sweep(sc, grid, n_replications=10, seed=7, n_jobs=n_jobs, progress=False)


def test_sweep_on_dask_cluster_matches_in_process(monkeypatch):
    expected = _sweep(n_jobs=1).frame
    # The cluster's workers are not this machine's cores: even a one-core
    # client sends the points to them (rather than running them in process).
    monkeypatch.setattr("fastsim._parallel.available_cores", lambda: 1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        with distributed.get_task_stream(client) as tasks, joblib.parallel_config(backend="dask"):
            result = _sweep(n_jobs=2)
        # The points really ran on the cluster's workers.
        assert len(client.scheduler_info()["workers"]) == 2
        assert len(tasks.data) >= 1
    pd.testing.assert_frame_equal(result.frame, expected, check_exact=True)
