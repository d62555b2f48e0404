"""Property-based fuzzing of the whole simulator (issue 43), with hypothesis.

Random scenarios over every option (engine: batching, chunking, policies,
admission, abandonment, max_model_len, swap and priority preemption, aging,
prefix caching, length predictors; workload: renewal, given and multi-user
arrivals, every length law and traces, priorities, warm-up, horizons,
prefix groups; latency models and SLOs) must satisfy, each checked against
something independent of the kernel:

* kernel = reference: `simulate_requests` gives bit-identical per-request
  results with ``backend="numba"`` and with the plain-Python reference
  simulator (``fastsim/_reference.py``) on the stream `sample_requests` draws;
* conservation: every arrival ends in exactly one state, per request and in
  `replicate`'s counts; KV blocks never exceed the cache; Little's law's two
  sums agree;
* determinism: `replicate` gives the same rows on 1 and on 2 threads, in
  chunks of one replication;
* bad input: a scenario with one field set to an arbitrary value either
  builds and runs, or raises ValueError, never anything else.

Profiles. The default (CI) profile runs a fixed, derandomized budget of
examples (2,000 random scenarios, 2,000 bad inputs, 500 bad request
streams: about 1.5 minutes on the 2-core development VM once the kernels
are compiled); ``FASTSIM_FUZZ_EXAMPLES=N`` sets the budget, and the
``slow``-marked test runs the long profile (``FASTSIM_FUZZ_LONG``
examples, 1,500 by default, randomized: ``pytest -m slow tests/test_fuzz.py``).
"""

import math
import os

import numba
import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import fastsim  # noqa: E402

CI_EXAMPLES = int(os.environ.get("FASTSIM_FUZZ_EXAMPLES", "2000"))
LONG_EXAMPLES = int(os.environ.get("FASTSIM_FUZZ_LONG", "1500"))
COMMON = dict(deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
CI = settings(max_examples=CI_EXAMPLES, derandomize=True, **COMMON)
LONG = settings(max_examples=LONG_EXAMPLES, **COMMON)

# ------------------------------------------------------------------------------
# Scenarios


def lengths(lo, hi):
    """A length law with values in [lo, hi] (a lognormal may exceed hi: its tail is the point)."""
    fixed = st.integers(lo, hi).map(fastsim.Fixed)
    uniform = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(lambda t: fastsim.Uniform(min(t), max(t)))
    lognormal = st.builds(fastsim.LogNormal, st.floats(max(lo, 1), hi), st.floats(0.0, 1.5))
    empirical = st.lists(st.integers(lo, hi), min_size=1, max_size=6).map(
        lambda v: fastsim.Empirical(np.array(v)))
    simple = st.one_of(fixed, uniform, lognormal, empirical)
    mixture = st.tuples(simple, simple, st.floats(0.05, 0.95)).map(
        lambda t: fastsim.Mixture([t[0], t[1]], [t[2], 1 - t[2]]))
    return st.one_of(simple, mixture)


@st.composite
def engines(draw):
    e = {}
    e["max_num_seqs"] = draw(st.integers(1, 12))
    e["max_num_batched_tokens"] = draw(st.integers(e["max_num_seqs"], 400))
    e["block_size"] = draw(st.sampled_from([1, 2, 12, 16, 32]))
    e["num_gpu_blocks"] = draw(st.integers(1, 300))
    e["enable_chunked_prefill"] = draw(st.booleans())
    e["policy"] = draw(st.sampled_from(["fcfs", "priority", "sjf"]))
    e["scheduler"] = draw(st.sampled_from(["continuous", "continuous", "static"]))
    e["admission"] = draw(st.sampled_from(["none", "queue_limit", "kv_reservation"]))
    if e["admission"] == "queue_limit":
        e["max_waiting"] = draw(st.integers(0, 6))
    e["max_queue_delay_s"] = draw(st.one_of(st.none(), st.floats(0.01, 3.0)))
    e["max_model_len"] = draw(st.one_of(st.none(), st.integers(2, 700)))
    static = e["scheduler"] == "static"
    if not static:
        e["enable_prefix_caching"] = draw(st.booleans())
        if not e["enable_prefix_caching"] and draw(st.booleans()):
            e["preemption_mode"] = "swap"
            e["swap_space_blocks"] = draw(st.integers(0, 100))
    if e["policy"] != "fcfs":
        if not static and e.get("preemption_mode") != "swap":
            e["priority_preemption"] = draw(st.booleans())
        e["priority_aging_s"] = draw(st.one_of(st.none(), st.floats(0.05, 5.0)))
    if e["policy"] == "sjf":
        e["length_predictor"] = draw(st.one_of(
            st.none(), st.floats(0.0, 1.5).map(fastsim.LogNormalPredictor),
            st.tuples(st.integers(2, 50), st.integers(1, 200), st.floats(0.0, 1.0)).map(
                lambda t: fastsim.BucketPredictor((t[0], t[0] + t[1]), t[2]))))
    # vLLM V1's rules (async scheduling where its interplay is modelled)
    if not static:
        e["scheduler_reserve_full_isl"] = draw(st.booleans())
        if e.get("enable_prefix_caching"):
            e["block_hash_caching"] = draw(st.booleans())
        if (e.get("preemption_mode") != "swap" and not e.get("priority_preemption")
                and e.get("enable_prefix_caching", False) == e.get("block_hash_caching", False)):
            e["async_scheduling"] = draw(st.booleans())
    if e["num_gpu_blocks"] >= 2:
        e["null_block"] = draw(st.booleans())
    return e


@st.composite
def workloads(draw):
    w = {}
    kind = draw(st.sampled_from(["renewal", "renewal", "times", "users"]))
    n = draw(st.integers(1, 60))
    if kind == "renewal":
        w.update(arrival_rate=draw(st.floats(0.2, 60.0)), num_requests=n,
                 burstiness=draw(st.sampled_from([1.0, 0.3, 4.0])), normalize_arrivals=draw(st.booleans()))
    elif kind == "times":
        gaps = draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
        w.update(arrival_rate=None, arrival_times=np.cumsum(gaps))
    else:
        lo = draw(st.integers(1, 4))
        users = draw(st.sampled_from([lo, (lo, lo + draw(st.integers(0, 3)))]))
        w.update(users=users, requests_per_user=draw(st.floats(0.3, 6.0)), user_rate=draw(st.floats(0.2, 5.0)),
                 arrival_rate=None)
    if draw(st.integers(0, 4)) == 0:
        m = draw(st.integers(1, 8))
        w["lengths"] = fastsim.LengthTrace(draw(st.lists(st.integers(1, 400), min_size=m, max_size=m)),
                                           draw(st.lists(st.integers(1, 150), min_size=m, max_size=m)),
                                           order=draw(st.sampled_from(["replay", "sample"])))
    else:
        w["prompt_len"] = draw(lengths(1, 400))
        w["output_len"] = draw(lengths(1, 150))
    if draw(st.booleans()):
        w["priorities"], w["priority_probs"] = (0, 1, 2), (0.2, 0.3, 0.5)
    w["horizon_s"] = draw(st.one_of(st.none(), st.none(), st.floats(0.5, 20.0)))
    if draw(st.booleans()):
        w["prefix_groups"] = draw(st.integers(1, 5))
        w["prefix_len"] = draw(lengths(1, 200))
        w["prefix_popularity"] = draw(st.sampled_from([0.0, 1.0, 2.5]))
    return w, draw(st.integers(0, 10))   # (the warm-up, capped below at the request count)


LATENCIES = st.one_of(
    st.floats(1e-3, 0.05).map(fastsim.LatencyModel.constant),
    st.builds(fastsim.LatencyModel, base_s=st.floats(1e-3, 0.02), decode_scale_s=st.floats(0.0, 1e-3),
              decode_alpha=st.floats(0.5, 2.0), prefill_per_token_s=st.floats(0.0, 1e-4),
              ctx_per_token_s=st.floats(0.0, 1e-6), ttft_overhead_s=st.floats(0.0, 0.05),
              swap_s_per_block=st.floats(0.0, 1e-3)),
    st.just(fastsim.LatencyModel.default()))


@st.composite
def scenarios(draw):
    e = draw(engines())
    (w, warmup), lat = draw(workloads()), draw(LATENCIES)
    try:
        workload = fastsim.Workload(**w)
        workload = fastsim.Workload(**{**w, "warmup_requests": min(warmup, workload.num_requests - 1)})
        return fastsim.Scenario(engine=fastsim.EngineConfig(**e), workload=workload, latency=lat,
                                ttft_slo_s=draw(st.one_of(st.none(), st.floats(0.01, 5.0))),
                                tpot_slo_s=draw(st.one_of(st.none(), st.floats(1e-3, 0.5))))
    except ValueError:   # a combination the configuration refuses (e.g. max_model_len below a fixed length)
        hypothesis.reject()


# ------------------------------------------------------------------------------
# Properties

STATUSES = {"completed", "rejected_too_long", "rejected_admission", "dropped", "unfinished"}


def check_scenario(sc, seed):
    # kernel = reference, request by request, on the drawn stream
    stream = fastsim.sample_requests(sc, seed=seed, replication=1)
    fast = fastsim.simulate_requests(sc, stream, backend="numba")
    ref = fastsim.simulate_requests(sc, stream, backend="reference")
    pd.testing.assert_frame_equal(fast, ref, check_exact=True)
    # conservation per request: one final state each; a completed request emitted its whole output
    assert set(fast["status"].astype(str)) <= STATUSES
    done = fast["status"] == "completed"
    np.testing.assert_array_equal(fast.loc[done, "num_tokens"], fast.loc[done, "output_len"])
    assert (fast.loc[done, "finish_s"] >= fast.loc[done, "first_token_s"]).all()
    assert (fast.loc[done, "first_token_s"] >= fast.loc[done, "arrival_s"]).all()
    if sc.workload.horizon_s is None:
        assert not (fast["status"] == "unfinished").any()
    # conservation per replication, and the same rows on 1 and 2 threads in chunks of one
    one = fastsim.replicate(sc, 3, seed=seed, n_threads=1).per_replication
    two = fastsim.replicate(sc, 3, seed=seed, n_threads=min(2, numba.config.NUMBA_NUM_THREADS),
                            batch_size=1).per_replication   # (1 thread where Numba has only one)
    pd.testing.assert_frame_equal(one, two, check_exact=True)
    total = one["n_completed"] + one["n_rejected"] + one["n_dropped"] + one["n_unfinished"]
    np.testing.assert_array_equal(one["n_arrived"], total)
    np.testing.assert_array_equal(one["n_rejected"], one["n_rejected_too_long"] + one["n_rejected_admission"])
    assert (one["max_blocks_used"] <= sc.engine.num_gpu_blocks).all()
    assert (one["max_swap_blocks_used"] <= sc.engine.swap_space_blocks).all()
    np.testing.assert_allclose(one["time_in_system_integral"], one["sojourn_sum"], rtol=1e-9, atol=1e-9)
    if sc.workload.horizon_s is None:
        assert (one["n_unfinished"] == 0).all()


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
@CI
@given(sc=scenarios(), seed=st.integers(0, 2 ** 32))
def test_random_scenarios_conserve_agree_and_are_deterministic(sc, seed):
    check_scenario(sc, seed)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
@LONG
@given(sc=scenarios(), seed=st.integers(0, 2 ** 32))
def test_random_scenarios_long_profile(sc, seed):
    check_scenario(sc, seed)


# ------------------------------------------------------------------------------
# Bad input: ValueError or a run, nothing else

FIELDS = {
    "engine": ["max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks", "enable_chunked_prefill",
               "policy", "scheduler", "admission", "max_waiting", "max_queue_delay_s", "max_model_len",
               "preemption_mode", "swap_space_blocks", "priority_preemption", "priority_aging_s",
               "enable_prefix_caching", "length_predictor"],
    "workload": ["arrival_rate", "num_requests", "prompt_len", "output_len", "burstiness", "arrival_times",
                 "priorities", "priority_probs", "warmup_requests", "horizon_s", "normalize_arrivals",
                 "prefix_groups", "prefix_len", "prefix_popularity"],
    "latency": ["base_s", "decode_scale_s", "decode_alpha", "prefill_per_token_s", "ctx_per_token_s",
                "ttft_overhead_s", "swap_s_per_block"],
}
ANY_VALUE = st.one_of(
    st.integers(-2 ** 70, 2 ** 70), st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-10, 1e3), st.text(max_size=4), st.none(), st.booleans(), st.complex_numbers(max_magnitude=10),
    st.lists(st.one_of(st.integers(-5, 500), st.floats(-1, 10)), max_size=4),
    st.lists(st.floats(0, 1), max_size=3).map(np.array), st.just(np.array(3.0)), st.just(math.inf),
    st.sampled_from(["fcfs", "sjf", "static", "queue_limit", "swap", "continuous"]))


def run_tiny(sc, **kwargs):
    fastsim.replicate(sc, 2, seed=0, n_threads=1, **kwargs)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
@settings(max_examples=CI_EXAMPLES, derandomize=True, **COMMON)
@given(section=st.sampled_from(sorted(FIELDS)), data=st.data(), value=ANY_VALUE)
def test_bad_input_raises_value_error_or_runs(section, data, value):
    name = data.draw(st.sampled_from(FIELDS[section]))
    base = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=64),
                            workload=fastsim.Workload(num_requests=8, prompt_len=20, output_len=10))
    try:
        sc = base.replace(**{f"{section}.{name}": value})
        run_tiny(sc)
        stream = fastsim.sample_requests(sc, seed=0)
        fastsim.simulate_requests(sc, stream)
    except ValueError:
        pass


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
@settings(max_examples=CI_EXAMPLES // 4, derandomize=True, **COMMON)
@given(column=st.sampled_from(["arrival_s", "prompt_len", "output_len", "priority", "sjf_key",
                               "prefix_group", "prefix_len"]),
       value=ANY_VALUE, row=st.integers(0, 2))
def test_bad_request_streams_raise_value_error_or_run(column, value, row):
    sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=64, policy="sjf",
                                                      length_predictor=fastsim.LogNormalPredictor(0.3),
                                                      enable_prefix_caching=True),
                          workload=fastsim.Workload(num_requests=3, prompt_len=20, output_len=10,
                                                    prefix_groups=2, prefix_len=8))
    cols = fastsim.sample_requests(sc, seed=0).to_dict("list")
    cols[column][row] = value
    frame = pd.DataFrame(cols)   # (object columns where the value does not fit)
    try:
        fastsim.simulate_requests(sc, frame)
    except ValueError:
        pass
