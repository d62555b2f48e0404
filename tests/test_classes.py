"""Request classes (issue 41): per-class estimates equal the per-request
computation from `simulate_requests` (the reference simulator, which shares
no code with the kernel) on the same streams; a priority per length band;
SJF keyed on prompt or total length, kernel = reference bit for bit."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim import EngineConfig, Exponential, RequestClasses, Scenario, Workload

EDGES = [128, 512]


def _scenario(policy="priority", rate=4.0, **engine):
    w = Workload(arrival_rate=rate, num_requests=150, prompt_len=Exponential(300), output_len=Exponential(60),
                 warmup_requests=10, classes=RequestClasses("prompt_len", EDGES, priorities=[0, 1, 2]))
    return Scenario(engine=EngineConfig(policy=policy, max_num_seqs=8, num_gpu_blocks=400, **engine), workload=w,
                    ttft_slo_s=1.0)


def _by_hand(sc, seed, rep, window):
    """Per-class metrics from the reference simulator's per-request output, in pandas."""
    req = fastsim.sample_requests(sc, seed=seed, replication=rep)
    res = fastsim.simulate_requests(sc, req, backend="reference")
    band = np.array(["<128", "128-511", ">=512"])[np.searchsorted(EDGES, req["prompt_len"], side="right")]
    df = res.assign(cls=band)
    meas = df.iloc[sc.workload.warmup_requests:]
    out = {c: {"n_completed": int((g["status"] == "completed").sum())} for c, g in df.groupby("cls")}
    for c, g in meas.groupby("cls"):
        done = g[g["status"] == "completed"]
        tp = ((done["finish_s"] - done["first_token_s"]) / (done["output_len"] - 1))[done["output_len"] > 1]
        out[c] |= {"ttft_mean": done["ttft_s"].mean(), "ttft_p90": np.percentile(done["ttft_s"], 90),
                  "e2e_p99": np.percentile(done["e2e_s"], 99), "tpot_mean": tp.mean(),
                  "request_throughput": len(done) / window, "goodput": (done["ttft_s"] <= 1.0).sum() / window}
    return out


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_per_class_estimates_equal_per_request_computation(policy):
    sc = _scenario(policy)
    res = fastsim.replicate(sc, n_replications=6, seed=11)
    pc = res.per_class
    assert set(pc["class"]) == {"<128", "128-511", ">=512"}
    for rep in range(6):
        hand = _by_hand(sc, res.seed, rep, res.per_replication.at[rep, "window_s"])
        for c, metrics in hand.items():
            row = pc[(pc["replication"] == rep) & (pc["class"] == c)].iloc[0]
            for m, v in metrics.items():
                assert row[m] == pytest.approx(v, rel=1e-12, abs=1e-15), (rep, c, m)
    # the summary is the mean over replications, with its interval
    s = res.summary(by="class")
    assert list(s.columns[:2]) == ["class", "metric"]
    for c, g in pc.groupby("class"):
        est = s[(s["class"] == c) & (s["metric"] == "ttft_mean")].iloc[0]
        assert est["estimate"] == pytest.approx(g["ttft_mean"].mean(), rel=1e-12)
        assert est["ci_low"] <= est["estimate"] <= est["ci_high"]
    # nothing lost: the classes' counts and throughputs add up to the totals
    tot = pc.groupby("replication")[["n_arrived", "n_completed", "request_throughput"]].sum()
    np.testing.assert_array_equal(tot["n_arrived"], res.per_replication["n_arrived"])
    np.testing.assert_array_equal(tot["n_completed"], res.per_replication["n_completed"])
    meas_done = res.per_replication["request_throughput"] * res.per_replication["window_s"]
    np.testing.assert_allclose(tot["request_throughput"], res.per_replication["request_throughput"], rtol=1e-12)
    assert np.all(meas_done.round(6) <= res.per_replication["n_completed"])


def test_priority_per_band_and_by_priority():
    sc = _scenario()
    r = fastsim.sample_requests(sc, seed=2)
    np.testing.assert_array_equal(r["priority"], np.searchsorted(EDGES, r["prompt_len"], side="right"))
    by_prio = sc.replace(**{"workload.classes": "priority", "workload.priorities": (0, 1, 2),
                            "workload.priority_probs": (0.2, 0.3, 0.5)})
    res = fastsim.replicate(by_prio, n_replications=3, seed=2)
    assert set(res.per_class["class"]) == {0, 1, 2}
    s = res.to_frame(by="class")
    assert "class" in s.columns and len(s) == 3 * len(fastsim._classes.CLASS_METRICS)


@pytest.mark.parametrize("key", ["prompt", "total"])
def test_sjf_key_kernel_equals_reference(key):
    sc = _scenario("sjf", rate=40.0, sjf_key=key)
    a = fastsim.replicate(sc, n_replications=3, seed=4)
    b = fastsim.replicate(sc, n_replications=3, seed=4, backend="reference")
    pd.testing.assert_frame_equal(a.per_replication, b.per_replication, check_exact=False, rtol=1e-12)
    req = fastsim.sample_requests(sc, seed=4)
    got = fastsim.simulate_requests(sc, req)
    length = req["prompt_len"] if key == "prompt" else req["prompt_len"] + req["output_len"]
    explicit = fastsim.simulate_requests(sc, req.assign(sjf_key=length))
    pd.testing.assert_frame_equal(got, explicit)
    # ordering by the key: not what output-keyed SJF gives
    out_keyed = fastsim.simulate_requests(sc.replace(**{"engine.sjf_key": "output"}), req)
    assert not np.array_equal(got["first_token_s"], out_keyed["first_token_s"])


def test_trace_column_classes(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,prompt_len,output_len,tenant\n0,10,5,a\n0.5,20,5,b\n1.0,30,5,a\n")
    w = Workload.from_trace(path, class_column="tenant", classes="trace")
    res = fastsim.replicate(Scenario(workload=w), n_replications=2, seed=0)
    s = res.summary(by="class")
    assert set(s["class"]) == {"a", "b"}
    assert res.per_class.groupby("class")["n_arrived"].first().to_dict() == {"a": 2, "b": 1}


@pytest.mark.parametrize("kwargs, match", [
    (dict(classes=("prompt_len", [5, 3])), "classes.edges must be"),
    (dict(classes={"by": "output_len", "edges": [10], "priorities": [1]}), "classes.priorities must be 2"),
    (dict(classes="tenant"), "classes.by must be one of"),
    (dict(classes="trace"), "needs a request trace with a class column"),
    (dict(classes={"by": "prompt_len", "edges": [10], "priorities": [0, 1]}, priorities=(0, 1),
          priority_probs=(0.5, 0.5)), "priorities and priority_probs must keep their defaults"),
])
def test_bad_classes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Workload(**kwargs)


def test_summary_by_class_needs_classes():
    res = fastsim.replicate(Scenario(workload=Workload(num_requests=20)), n_replications=2, seed=0)
    with pytest.raises(ValueError, match="needs a workload with classes"):
        res.summary(by="class")
    with pytest.raises(ValueError, match="by must be one of"):
        res.summary(by="user")
    with pytest.raises(ValueError, match="sjf_key requires policy='sjf'"):
        EngineConfig(sjf_key="prompt")


def _pooled(per_class, per_replication):
    """Each replication's per-class rows pooled (counts summed, means weighted
    by measured completions: throughput times the window) beside its own
    row: the same requests, the same run."""
    out = []
    for rep, part in per_class.groupby("replication"):
        row = per_replication.loc[rep]
        n = np.rint(part["request_throughput"].to_numpy() * row["window_s"])
        meas = row["request_throughput"] * row["window_s"]
        out.append([(part["n_arrived"].sum(), row["n_arrived"]), (part["n_measured"].sum(), row["n_measured"]),
                    (n.sum() / meas, 1.0)]
                   + [(np.nansum(part[m].to_numpy() * n) / n.sum(), row[m]) for m in ("ttft_mean", "e2e_mean")]
                   + [(part["goodput"].sum(), row["goodput"])])
    return np.array(out, dtype=float)


SERVERS = {
    "noisy replica": dict(latency=dataclasses.replace(fastsim.LatencyModel.default(), 
        noise=fastsim.StepNoise(speed_sd=0.3, jitter_sd=0.1))),
    "fleet": dict(fleet=fastsim.Fleet(4, router="jsq", routing_latency_s=0.01),
                  latency=dataclasses.replace(fastsim.LatencyModel.default(), noise=fastsim.StepNoise(speed_sd=0.3))),
    "mixed fleet": dict(fleet=fastsim.Fleet(replicas=[
        (EngineConfig(max_num_seqs=8, num_gpu_blocks=400), fastsim.LatencyModel.default()),
        (EngineConfig(max_num_seqs=4, num_gpu_blocks=200), fastsim.LatencyModel.default())], router="round_robin")),
    "fleet with a horizon": dict(fleet=fastsim.Fleet(3, router="power_of_two"), horizon_s=10.0),
    # (requests in transit at the horizon are not arrivals; warm-up; the listed replicas' TTFT overhead)
    "fleet: routing latency, horizon, warm-up": dict(
        fleet=fastsim.Fleet(replicas=[(EngineConfig(max_num_seqs=8, num_gpu_blocks=400), dataclasses.replace(
            fastsim.LatencyModel.default(), ttft_overhead_s=0.3))] * 3, router="jsq", routing_latency_s=0.05),
        horizon_s=12.0, warmup_requests=20),
    "fleet: SJF on prompts": dict(fleet=fastsim.Fleet(3, router="round_robin"),
                                  engine=EngineConfig(max_num_seqs=4, num_gpu_blocks=400, policy="sjf",
                                                      sjf_key="prompt")),
    "noisy overhead": dict(fleet=fastsim.Fleet(2, router="jsq"), latency=dataclasses.replace(
        fastsim.LatencyModel.default(), noise=fastsim.StepNoise(speed_sd=0.2, overhead_sd=0.05))),
    "disaggregated": dict(fleet=fastsim.Disaggregated(prefill=1, decode=2, kv_bytes_per_token=1e5)),
    "autoscaled fleet": dict(fleet=fastsim.Fleet(router="jsq", autoscaler=fastsim.Autoscaler(
        metric="rate", target=4.0, interval_s=5.0, max_replicas=4, provisioning_delay_s=3.0))),
    # (TPOT from the decode side's first token; the decode pool's TTFT overhead)
    "disaggregated, slow link, own servers": dict(
        fleet=fastsim.Disaggregated(
            prefill=1, decode=2, link_bandwidth_gbps=1.0, kv_bytes_per_token=28672.0,
            decode_server=(EngineConfig(max_num_seqs=8, num_gpu_blocks=400),
                           dataclasses.replace(fastsim.LatencyModel.default(), ttft_overhead_s=0.2))),
        tpot_slo_s=0.012),
}


@pytest.mark.parametrize("server", list(SERVERS))
def test_per_class_rows_are_the_replications_own_run(server):
    """The per-class table re-simulates each replication's stream: as that
    replication (its seed's noise, not seed 0's), on the scenario's server
    (a fleet's, not one replica of its engine). Found in stop 66: a fleet's
    per-class TTFT was one replica's under the whole fleet's load (21 s
    against 0.12 s), and a noisy model's per-class rows took seed 0's noise.
    Pooled over the classes they give the replication's own row."""
    kw = dict(SERVERS[server])
    horizon, warmup = kw.pop("horizon_s", None), kw.pop("warmup_requests", 0)
    kw.setdefault("engine", EngineConfig(max_num_seqs=8, num_gpu_blocks=400))
    w = Workload(arrival_rate=12.0 if "fleet" in kw else 4.0, num_requests=200, prompt_len=Exponential(300),
                 output_len=Exponential(60), horizon_s=horizon, warmup_requests=warmup,
                 classes=RequestClasses("prompt_len", EDGES))
    res = fastsim.replicate(Scenario(workload=w, **kw), n_replications=3, seed=7, n_threads=1)
    got = _pooled(res.per_class, res.per_replication)
    assert got.shape == (3, 6, 2)
    np.testing.assert_array_equal(got[:, :2, 0], got[:, :2, 1])
    np.testing.assert_allclose(got[:, 2:, 0], got[:, 2:, 1], rtol=1e-12)
    if horizon is not None:
        assert (res.per_replication["n_arrived"] < 200).all()   # (the horizon cuts the stream)


def test_simulate_requests_refuses_a_fleet():
    """`simulate_requests` runs one replica and refuses a fleet (it ran the
    stream on one replica of the scenario's engine)."""
    w = Workload(arrival_rate=4.0, num_requests=50, classes=RequestClasses("prompt_len", EDGES))
    fleet = Scenario(workload=w, fleet=fastsim.Fleet(2))
    with pytest.raises(ValueError, match=r"scenario.fleet must be None for simulate_requests .*got Fleet\("):
        fastsim.simulate_requests(fleet, fastsim.sample_requests(fleet, seed=0))
