"""The kernel against exact queueing theory.

With ``max_num_seqs=1``, a constant step time ``d`` and 1-token prompts the
server is an M/G/1 queue: a request of ``O`` output tokens holds the server
for exactly ``O`` steps (one prefill step that emits the first token, then
``O - 1`` decode steps), and TTFT = (wait in queue) + d. Pollaczek-Khinchine:
``E[Wq] = lambda E[S^2] / (2 (1 - rho))``.

With ``admission="queue_limit", max_waiting=0`` the server is a loss system.
For ``max_num_seqs=1`` it is exactly M/G/1/1 (an arrival finds the engine
idle and its first step starts at once), so blocking is Erlang-B with one
server: insensitive to the service law. For ``c > 1`` an arrival during a
step waits for the step boundary (as in vLLM), so each sojourn is
``O d + R`` with ``0 <= R < d`` on a clock shared by all requests; blocking
then lies between Erlang-B at offered loads ``lambda E[O] d`` and
``lambda (E[O] + 1) d`` (see docs/engine-model.md).
"""

import numpy as np
import pytest

import fastsim
from conftest import SYNC, within
from fastsim.testing import erlang_b, mg1_mean_wait

STEP = 0.01


def mg1_scenario(rho, law, max_num_seqs=1, **engine):
    lam = rho / (law.mean() * STEP)
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**SYNC, max_num_seqs=max_num_seqs, **engine),
        workload=fastsim.Workload(arrival_rate=lam, num_requests=3000, prompt_len=1, output_len=law,
                                  warmup_requests=500),
        latency=fastsim.LatencyModel.constant(STEP))


@pytest.mark.parametrize("rho", [0.5, 0.8])
@pytest.mark.parametrize("law", [fastsim.Fixed(10), fastsim.Uniform(1, 19)], ids=["M/D/1", "M/U/1"])
def test_mg1_mean_ttft_matches_pollaczek_khinchine(rho, law):
    sc = mg1_scenario(rho, law)
    res = fastsim.replicate(sc, n_replications=400, seed=None)
    es, es2 = law.mean() * STEP, law.second_moment() * STEP**2
    lam = sc.workload.arrival_rate
    truth = mg1_mean_wait(lam, es, es2) + STEP
    row = res.summary().loc["ttft_mean"]
    within(row.estimate, truth, row.std_error)
    # TPOT of every request is exactly one step on a one-at-a-time server.
    tpot = res.per_replication["tpot_mean"]
    assert np.allclose(tpot, STEP, rtol=1e-9)


@pytest.mark.parametrize("law", [fastsim.Fixed(12), fastsim.LogNormal(median=8, sigma=0.9)],
                         ids=["deterministic", "lognormal"])
def test_single_server_loss_system_matches_erlang_b(law):
    a = 0.9  # offered load in Erlangs
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(**SYNC, max_num_seqs=1, admission="queue_limit", max_waiting=0),
        workload=fastsim.Workload(arrival_rate=a / (law.mean() * STEP), num_requests=3000, prompt_len=1,
                                  output_len=law, warmup_requests=100),
        latency=fastsim.LatencyModel.constant(STEP))
    res = fastsim.replicate(sc, n_replications=300, seed=None)
    row = res.summary().loc["blocking_probability"]
    within(row.estimate, erlang_b(1, a), row.std_error)


def test_multi_server_loss_system_lies_in_the_erlang_b_bracket():
    c, a, law = 4, 3.0, fastsim.Uniform(10, 30)
    lam = a / (law.mean() * STEP)
    sc = fastsim.Scenario(
        engine=fastsim.EngineConfig(**SYNC, max_num_seqs=c, admission="queue_limit", max_waiting=0),
        workload=fastsim.Workload(arrival_rate=lam, num_requests=3000, prompt_len=1, output_len=law,
                                  warmup_requests=100),
        latency=fastsim.LatencyModel.constant(STEP))
    res = fastsim.replicate(sc, n_replications=300, seed=None)
    row = res.summary().loc["blocking_probability"]
    low, high = erlang_b(c, a), erlang_b(c, lam * (law.mean() + 1) * STEP)
    assert low - 5 * row.std_error <= row.estimate <= high + 5 * row.std_error


def test_littles_law_holds_on_every_run(tight_kv_result):
    """L = lambda W as a sample-path identity: the time integral of the number
    in system equals the total sojourn of the accepted requests."""
    pr = tight_kv_result.per_replication
    np.testing.assert_allclose(pr["time_in_system_integral"], pr["sojourn_sum"], rtol=1e-9)


def test_reference_formulas():
    """The exact references themselves: Erlang-B against its closed form,
    Pollaczek-Khinchine against M/M/1 (E[Wq] = rho / (mu - lambda))."""
    import math

    a, c = 2.5, 4
    closed = (a**c / math.factorial(c)) / sum(a**k / math.factorial(k) for k in range(c + 1))
    assert erlang_b(c, a) == pytest.approx(closed, rel=1e-12)
    lam, mu = 3.0, 5.0
    assert mg1_mean_wait(lam, 1 / mu, 2 / mu**2) == pytest.approx((lam / mu) / (mu - lam), rel=1e-12)
    with pytest.raises(ValueError, match="must be < 1"):
        mg1_mean_wait(6.0, 1 / mu, 2 / mu**2)
