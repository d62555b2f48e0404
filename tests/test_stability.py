"""Stability warnings (issue 41): an overloaded scenario says so, with the
rate it sustains; one at 70% load does not. Headers report the requests
that arrive, not a buffer size."""

import warnings

import pytest

import fastsim
from fastsim import EngineConfig, LatencyModel, Scenario, Workload

STEP = 0.05          # one step per request: a D/D-like server of rate 1 / STEP per seat
SEATS = 1


def _scenario(rate):
    # one seat, one step of STEP s for prefill + the single output token: service rate 1 / STEP = 20 req/s
    return Scenario(engine=EngineConfig(max_num_seqs=SEATS, max_num_batched_tokens=64),
                    workload=Workload(arrival_rate=rate, num_requests=400, prompt_len=8, output_len=1),
                    latency=LatencyModel.constant(STEP))


def test_overloaded_scenario_warns_with_the_sustainable_rate():
    res = fastsim.replicate(_scenario(40.0), n_replications=4, seed=1)
    with pytest.warns(RuntimeWarning, match="overloaded") as rec:
        st = res.stability           # beside the estimates: computed when first asked, warned once
    assert st.overloaded
    # the server completes one request per step: it sustains 1 / STEP = 20 req/s
    assert st.served_rate == pytest.approx(1 / STEP, rel=0.02)
    assert st.offered_rate == pytest.approx(40.0, rel=0.25)
    assert f"{st.served_rate:.4g} req/s" in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "overloaded" in res.summary().attrs["stability"]
    from fastsim._cli import format_table

    text = format_table(res.summary(), _scenario(40.0), res)
    assert "WARNING: overloaded" in text and "4 replications x 400 requests" in text


def test_seventy_percent_load_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for seed in range(5):
            res = fastsim.replicate(_scenario(0.7 / STEP), n_replications=4, seed=seed)
            assert not res.stability.overloaded
            assert "stability" not in res.summary().attrs


def test_header_reports_arrivals_not_the_buffer():
    w = Workload.multi_user(8, requests_per_user=5, user_rate=0.2, prompt_len=64, output_len=16)
    res = fastsim.replicate(Scenario(workload=w), n_replications=6, seed=0)
    n = res.per_replication["n_arrived"]
    assert w.num_requests > n.max()                      # the buffer
    assert res.arrivals == f"about {n.mean():.0f} ({n.min()}-{n.max()})"
    assert str(w.num_requests) not in res._repr_html_().split("requests")[0]
    fixed = fastsim.replicate(Scenario(workload=Workload(num_requests=30)), n_replications=2, seed=0)
    assert fixed.arrivals == "30"


def test_capped_stream_backlog_is_client_side_flagged_here_and_refused_by_the_searches():
    # one seat capped at one request in the system: whatever the rate, each request sent finds the server
    # idle, so its latencies do not grow with the load (they start at the send); the backlog is client-side
    capped = [_scenario(rate).replace(**{"workload.max_concurrency": 1}) for rate in (10.0, 40.0)]
    low, high = (fastsim.replicate(sc, n_replications=4, seed=2) for sc in capped)
    assert high.estimate("ttft_p99") == pytest.approx(low.estimate("ttft_p99"), rel=1e-9)
    assert not low.stability.overloaded
    with pytest.warns(RuntimeWarning, match="waits client-side under max_concurrency") as rec:
        st = high.stability
    assert st.overloaded and st.capped and "grow with the run's length" not in str(rec[0].message)
    assert st.served_rate == pytest.approx(1 / STEP, rel=0.02)
    with pytest.raises(ValueError, match=r"capacity searches the largest arrival_rate .*; "
                                         r"workload.max_concurrency=1 caps the stream"):
        fastsim.capacity(capped[1], {"ttft_p99": 1.0}, n_replications=2)
    with pytest.raises(ValueError, match=r"fleet_capacity searches the fewest replicas .*; "
                                         r"workload.max_concurrency=1 caps the stream"):
        fastsim.fleet_capacity(capped[1].replace(fleet=fastsim.Fleet(2)), {"ttft_p99": 1.0}, n_replications=2)
