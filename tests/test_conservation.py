"""Nothing is lost: every arrival ends in exactly one state, KV blocks are
never over-allocated or leaked, and each mechanism is exercised."""

import numpy as np
import pytest

import fastsim

CONFIGS = {
    "fcfs": {},
    "priority": {"policy": "priority"},
    "sjf": {"policy": "sjf"},
    "no-chunking": {"enable_chunked_prefill": False, "max_num_batched_tokens": 1024},
    "static": {"scheduler": "static"},
    "queue_limit": {"admission": "queue_limit", "max_waiting": 4},
    "kv_reservation": {"admission": "kv_reservation"},
    "abandonment": {"max_queue_delay_s": 0.5},
    "max_model_len": {"max_model_len": 300},
}


def _check_accounting(pr, engine, drained=True):
    total = pr["n_completed"] + pr["n_rejected"] + pr["n_dropped"] + pr["n_unfinished"]
    np.testing.assert_array_equal(pr["n_arrived"], total)
    np.testing.assert_array_equal(pr["n_rejected"], pr["n_rejected_too_long"] + pr["n_rejected_admission"])
    assert (pr["max_blocks_used"] <= engine.num_gpu_blocks).all()
    if drained:
        assert (pr["n_unfinished"] == 0).all()
        assert (pr["blocks_used_at_end"] == 0).all()
    np.testing.assert_allclose(pr["time_in_system_integral"], pr["sojourn_sum"], rtol=1e-9)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_request_is_accounted_for(name, tight_kv_scenario):
    sc = tight_kv_scenario.replace(**{f"engine.{k}": v for k, v in CONFIGS[name].items()},
                                   **{"workload.priorities": (0, 1), "workload.priority_probs": (0.3, 0.7)})
    res = fastsim.replicate(sc, n_replications=16, seed=5)
    _check_accounting(res.per_replication, sc.engine)


def test_mechanisms_take_effect(tight_kv_scenario):
    """Each mechanism changes the outcome it is meant to change."""
    def run(**engine):
        sc = tight_kv_scenario.replace(**{f"engine.{k}": v for k, v in engine.items()})
        return fastsim.replicate(sc, n_replications=16, seed=5).per_replication

    assert (run(admission="queue_limit", max_waiting=0)["n_rejected_admission"] > 0).all()
    assert (run(admission="kv_reservation")["n_rejected_admission"] > 0).all()
    assert (run(max_queue_delay_s=0.2)["n_dropped"] > 0).all()
    assert (run(max_model_len=250)["n_rejected_too_long"] > 0).all()
    static = run(scheduler="static")
    assert (static["n_preemptions"] == 0).all()


def test_preemption_happens_and_is_counted_when_kv_is_tight(tight_kv_result):
    pr = tight_kv_result.per_replication
    assert (pr["n_preemptions"] > 0).all()
    est = tight_kv_result.summary().loc["preemptions_per_request", "estimate"]
    np.testing.assert_allclose(est, (pr["n_preemptions"] / pr["n_arrived"]).mean())
    # With ample KV the same load never preempts.
    roomy = tight_kv_result.scenario.replace(**{"engine.num_gpu_blocks": 100_000})
    assert (fastsim.replicate(roomy, 8, seed=1).per_replication["n_preemptions"] == 0).all()


def test_horizon_leaves_unfinished_requests_counted(tight_kv_scenario):
    sc = tight_kv_scenario.replace(**{"workload.horizon_s": 20.0})
    pr = fastsim.replicate(sc, n_replications=16, seed=3).per_replication
    _check_accounting(pr, sc.engine, drained=False)
    assert (pr["n_unfinished"] > 0).any()
    assert (pr["end_s"] >= 20.0).all() and (pr["end_s"] < 21.0).all()
    # Arrivals stop at the horizon: about rate * horizon of them.
    assert (pr["n_arrived"] < sc.workload.num_requests).all()


def test_requests_that_can_never_fit_are_rejected_not_looped_on():
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(num_gpu_blocks=10, block_size=16),
        workload=fastsim.Workload(arrival_rate=2.0, num_requests=200, prompt_len=fastsim.Uniform(50, 250),
                                  output_len=10))
    pr = fastsim.replicate(sc, n_replications=8, seed=2).per_replication
    assert (pr["n_rejected_too_long"] > 0).all()
    _check_accounting(pr, sc.engine)


def test_simulate_requests_matches_replicate_row():
    """The stream of replication r, simulated on its own, gives that replication's metrics."""
    sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=5.0, num_requests=200,
                                                    prompt_len=fastsim.LogNormal(200, 0.5), output_len=50,
                                                    warmup_requests=20))
    res = fastsim.replicate(sc, n_replications=4, seed=9)
    stream = fastsim.sample_requests(sc, seed=9, replication=2)
    per_req = fastsim.simulate_requests(sc, stream)
    measured = per_req.iloc[20:]
    np.testing.assert_allclose(measured["ttft_s"].mean(), res.per_replication.loc[2, "ttft_mean"], rtol=1e-12)
    np.testing.assert_allclose(np.percentile(measured["e2e_s"], 99), res.per_replication.loc[2, "e2e_p99"],
                               rtol=1e-12)
    assert (per_req["status"] == "completed").all()
