"""Autoscaling fleets (`fastsim.Autoscaler`, `Fleet(autoscaler=...)`): with
zero provisioning delay and a rule that keeps one idle replica the fleet is
the static fleet of its final size (bit for bit while the rule keeps that
size, from intervals after scaling to it); with a delay, SLO violations
appear in the windows where the rate steps up; nothing is lost (every
request once, a replica's requests finished before it leaves); the API
(`replicate`, `compare` on common random numbers) and its refusals."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import fastsim
from fastsim import kernel as K

ENGINE = fastsim.EngineConfig(max_num_seqs=8)


def _scenario(autoscaler, workload, router="jsq", ttft_slo_s=0.5):
    return fastsim.Scenario(engine=ENGINE, workload=workload, ttft_slo_s=ttft_slo_s,
                            fleet=fastsim.Fleet(router=router, autoscaler=autoscaler))


#: A constant rate of 4 req/s; windows of 120 s hold Poisson(480) arrivals,
#: so ceil(rate / 3) is 2 unless a window's count leaves (360, 720], a
#: 5.5-sigma event: the rule asks for 2 + 1 spare = 3 replicas.
CONSTANT = fastsim.Workload(arrival_rate=4.0, num_requests=2000, prompt_len=fastsim.Uniform(64, 512),
                            output_len=fastsim.Uniform(16, 256))
SPARE = dict(metric="rate", target=3.0, interval_s=120.0, min_replicas=1, max_replicas=6,
             provisioning_delay_s=0.0, scale_in_cooldown_s=0.0, tolerance=0.0, spare_replicas=1)
PER_REQUEST = [m for m in K.METRICS if m not in ("batch_occupancy_mean", "kv_utilization_mean")]


def test_a_rule_keeping_its_size_is_the_static_fleet_bit_for_bit():
    """Started at the size the rule keeps (3), the autoscaled fleet does not
    scale while requests arrive (after the last one the rate falls and it
    scales in): every per-request metric is the static fleet's of 3, bit for
    bit (the means over replicas, batch occupancy and KV use, are over the
    ``max_replicas`` rows)."""
    scaled = fastsim.replicate(_scenario(fastsim.Autoscaler(**SPARE, initial_replicas=3), CONSTANT),
                               n_replications=6, seed=3)
    static = fastsim.replicate(fastsim.Scenario(engine=ENGINE, workload=CONSTANT, ttft_slo_s=0.5,
                                                fleet=fastsim.Fleet(3, router="jsq")), n_replications=6, seed=3)
    a, b = scaled.per_replication, static.per_replication
    assert (a["replicas_peak"] == 3).all()
    for c in PER_REQUEST + ["n_completed", "n_arrived", "end_s"]:
        assert np.array_equal(a[c].to_numpy(), b[c].to_numpy(), equal_nan=True), c
    assert (a["gpu_hours"] <= 3 * a["end_s"] / 3600.0).all()
    assert (a["gpu_hours"] >= 3 * (a["end_s"] - 240.0) / 3600.0).all()   # (scaled in at most 2 windows early)
    assert ((a["gpu_hours"] * 3600 / a["end_s"]).round(9) == a["replicas_mean"].round(9)).all()


def test_scaling_up_to_the_final_size_then_matches_the_static_fleet_from_intervals():
    """Started at 1 with zero delay, the fleet is at 3 from the first
    evaluation (120 s) on; the requests after it (warm-up: the first 600,
    arriving by ~150 s) see the static fleet of 3: their mean TTFT and E2E
    differences, paired on common random numbers, have 99.9% intervals
    holding 0; a fleet of 2 is told apart the same way (the test's power)."""
    w = fastsim.Workload(arrival_rate=4.0, num_requests=2000, prompt_len=fastsim.Uniform(64, 512),
                         output_len=fastsim.Uniform(16, 256), warmup_requests=600)
    nrep = 30
    scaled = fastsim.replicate(_scenario(fastsim.Autoscaler(**SPARE), w), n_replications=nrep, seed=11)
    assert (scaled.per_replication["replicas_peak"] == 3).all()
    for size, same in ((3, True), (1, False)):
        static = fastsim.replicate(fastsim.Scenario(engine=ENGINE, workload=w, ttft_slo_s=0.5,
                                                    fleet=fastsim.Fleet(size, router="jsq")),
                                   n_replications=nrep, seed=11)
        for m in ("ttft_mean", "e2e_mean"):
            d = scaled.per_replication[m].to_numpy() - static.per_replication[m].to_numpy()
            if not d.any():   # (identical in every replication: the transient had emptied)
                assert same, (size, m)
                continue
            lo, hi = stats.t.interval(0.999, nrep - 1, loc=d.mean(), scale=d.std(ddof=1) / np.sqrt(nrep))
            assert (lo <= 0.0 <= hi) == same, (size, m, lo, hi)


STEP = fastsim.Workload(rate_schedule=fastsim.RateSchedule([0, 240], [2.0, 24.0]), num_requests=20000,
                        horizon_s=600.0, prompt_len=256, output_len=128)


def _step_policy(delay):
    return fastsim.Autoscaler(metric="rate", target=4.0, interval_s=30.0, min_replicas=1, max_replicas=10,
                              provisioning_delay_s=delay, scale_in_cooldown_s=120.0, spare_replicas=1)


def test_with_a_delay_slo_violations_appear_where_the_rate_steps_up():
    """The rate steps from 2 to 24 req/s at 240 s. With a 120 s provisioning
    delay the windows after the step (to 240 + 120 + 60 s) violate the SLO
    in most replications (Clopper-Pearson 99% lower bound above 1/2), the
    windows before it almost never (95% upper bound below 1/5); without a delay,
    fewer violation minutes, paired on common random numbers (99% interval)."""
    nrep = 16
    hit = {0.0: [], 120.0: []}
    before = []
    for delay in hit:
        sc = _scenario(_step_policy(delay), STEP)
        for r in range(nrep):
            w = fastsim.simulate_autoscaled(sc, seed=5, replication=r).windows
            bad = (w["slo_attainment"] < 0.95).to_numpy()
            t = w["t_s"].to_numpy()
            hit[delay].append(bad[(t > 240) & (t <= 420)].sum() * 0.5)   # minutes
            if delay == 120.0:
                before.append(bool(bad[t <= 240].any()))
    k = int(np.sum(np.array(hit[120.0]) > 0))
    assert stats.beta.ppf(0.01, k, nrep - k + 1) > 0.5, k
    j = int(np.sum(before))
    assert stats.beta.ppf(0.95, j + 1, nrep - j) < 0.2, j
    d = np.array(hit[120.0]) - np.array(hit[0.0])
    if d.min() <= 0.0:   # (else every pair says so: no interval needed, and d may not vary)
        lo = stats.t.interval(0.99, nrep - 1, loc=d.mean(), scale=d.std(ddof=1) / np.sqrt(nrep))[0]
        assert lo > 0.0, d


@pytest.mark.parametrize("router", ["jsq", "round_robin", "power_of_two"])
def test_nothing_is_lost_and_replicas_drain_before_leaving(router):
    """Every arrival is handed once and completes; at every evaluation the
    requests in the held replicas are exactly those arrived and not yet
    finished (a replica that left with a request would lose it); the
    fleet scaled out and in."""
    sc = _scenario(fastsim.Autoscaler(metric="queue_depth", target=1.0, interval_s=2.0, min_replicas=1,
                                      max_replicas=6, provisioning_delay_s=20.0, scale_in_cooldown_s=10.0),
                   fastsim.Workload(rate_schedule=fastsim.RateSchedule([0, 100, 200, 300], [2.0, 20.0, 1.0, 1.0]),
                                    num_requests=3000, prompt_len=fastsim.Uniform(64, 512),
                                    output_len=fastsim.Uniform(256, 1024)), router=router)
    for r in range(3):
        run = fastsim.simulate_autoscaled(sc, seed=2, replication=r)
        q, w = run.requests, run.windows
        assert (q["status"] == K.ST_COMPLETED).all()
        a, f = q["arrival_s"].to_numpy(), q["finish_s"].to_numpy()
        for tau, insys in zip(w["t_s"], w["in_system"]):
            assert insys == np.sum((a < tau) & (f > tau)), tau
        assert w["arrivals"].sum() == len(q)
        assert w["replicas_draining"].max() >= 1 and w["replicas_serving"].max() >= 3
        assert w["replicas_serving"].iloc[-1] < w["replicas_serving"].max()
        assert run.gpu_hours > 0


def test_replicate_and_compare_report_gpu_hours_and_violation_minutes():
    fast = _scenario(_step_policy(0.0), STEP)
    slow = _scenario(_step_policy(120.0), STEP)
    res = fastsim.replicate(slow, n_replications=4, seed=1)
    s = res.summary()
    for m in K.AUTOSCALE_COLUMNS:
        assert m in res.per_replication.columns
    assert "gpu_hours" in str(s) and "slo_violation_minutes" in str(s)
    ci = res.confidence_interval("gpu_hours")
    assert ci.low <= res.per_replication["gpu_hours"].mean() <= ci.high
    cmp = fastsim.compare({"no delay": fast, "120 s delay": slow}, n_replications=4, seed=1)
    assert "slo_violation_minutes" in str(cmp.summary())


@pytest.mark.parametrize("kwargs, match", [
    (dict(metric="latency"), "metric must be one of"),
    (dict(target=0.0), "target must be"),
    (dict(metric="kv_utilisation", target=1.5), "target must be"),
    (dict(interval_s=0), "interval_s must be"),
    (dict(min_replicas=0), "min_replicas must be"),
    (dict(min_replicas=3, max_replicas=2), "max_replicas must be"),
    (dict(provisioning_delay_s=-1.0), "provisioning_delay_s must be"),
    (dict(scale_in_cooldown_s=-1.0), "scale_in_cooldown_s must be"),
    (dict(initial_replicas=9), "initial_replicas must be"),
    (dict(spare_replicas=-1), "spare_replicas must be"),
    (dict(window_attainment=1.2), "window_attainment must be"),
])
def test_bad_policies_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastsim.Autoscaler(**kwargs)


def test_what_an_autoscaled_fleet_refuses():
    a = fastsim.Autoscaler()
    with pytest.raises(ValueError, match="replicas must be 1"):
        fastsim.Fleet(3, autoscaler=a)
    with pytest.raises(ValueError, match="autoscaler must be None or a fastsim.Autoscaler"):
        fastsim.Fleet(autoscaler="hpa")
    w = fastsim.Workload(num_requests=50)
    with pytest.raises(ValueError, match="router must be one of"):
        fastsim.replicate(_scenario(a, w, router="prefix_affinity"), n_replications=2)
    with pytest.raises(ValueError, match="router_staleness_s must be 0"):
        fastsim.replicate(fastsim.Scenario(workload=w, fleet=fastsim.Fleet(router_staleness_s=1.0, autoscaler=a)),
                          n_replications=2)
    with pytest.raises(ValueError, match="block_hash_caching must be True with an autoscaler"):
        fastsim.replicate(fastsim.Scenario(engine=fastsim.EngineConfig(enable_prefix_caching=True,
                                                                       block_hash_caching=False),
                                           workload=w, fleet=fastsim.Fleet(autoscaler=a)), n_replications=2)
    with pytest.raises(ValueError, match="scenario must have a fleet with an autoscaler"):
        fastsim.simulate_autoscaled(fastsim.Scenario(workload=w))


def test_the_experiment_runs_quick(tmp_path, capsys):
    """``experiments/autoscaling.py --quick``: every policy and metric with
    an interval around its estimate, paired differences from ``rate``, the
    evaluations' table; its findings printed."""
    import importlib.util
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "experiments"
    sys.path.insert(0, str(root))
    try:
        spec = importlib.util.spec_from_file_location("exp_autoscaling", root / "autoscaling.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out = mod.main(["--quick", "--out", str(tmp_path)])
    finally:
        sys.path.remove(str(root))
    t = out["table"]
    assert set(t["policy"]) == {"rate", "kv_utilisation", "queue_depth"} and set(t["metric"]) == set(mod.METRICS)
    ok = t["ci_low"].notna()
    assert ((t["ci_low"] <= t["estimate"] + 1e-12) & (t["estimate"] <= t["ci_high"] + 1e-12))[ok].all()
    assert (t.loc[t.metric == "gpu_hours", "estimate"] > 0).all()
    assert t.loc[t.policy != "rate", "diff_vs_rate"].notna().all()
    w = pd.read_csv(tmp_path / "autoscaling_windows.csv")
    assert set(w["policy"]) == {"rate", "kv_utilisation", "queue_depth"} and (w["replicas_serving"] >= 1).all()
    assert "gpu_hours" in capsys.readouterr().out


TOML = """
[engine]
max_num_seqs = 8
[workload]
num_requests = 600
horizon_s = 120.0
prompt_len = 128
output_len = 32
rate_schedule = {times = [0.0, 60.0, 120.0], rates = [1.0, 6.0, 1.0], shape = "linear"}
[slo]
ttft_s = 0.5
[fleet]
router = "jsq"
[fleet.autoscaler]
metric = "rate"
target = 2.0
interval_s = 10.0
max_replicas = 4
provisioning_delay_s = 5.0
[run]
n_replications = 3
"""


def test_a_toml_scenario_with_a_schedule_and_an_autoscaler(tmp_path, capsys):
    import tomllib
    from fastsim._cli import main
    sc = fastsim.Scenario.from_dict(tomllib.loads(TOML))
    assert sc.workload.rate_schedule.shape == "linear" and sc.fleet.autoscaler.max_replicas == 4
    path = tmp_path / "a.toml"
    path.write_text(TOML)
    assert main(["run", str(path), "--no-progress", "--format", "csv"]) == 0
    assert "gpu_hours" in capsys.readouterr().out
    path.write_text(TOML.replace("provisioning_delay_s", "provisioning_delay"))
    with pytest.raises(ValueError, match="provisioning_delay"):
        fastsim.Scenario.from_dict(tomllib.loads(path.read_text()))


def test_threads_do_not_change_the_results():
    sc = _scenario(_step_policy(30.0), fastsim.Workload(
        rate_schedule=fastsim.RateSchedule([0, 60], [2.0, 12.0]), num_requests=3000, horizon_s=150.0,
        prompt_len=fastsim.Uniform(64, 512), output_len=fastsim.Uniform(16, 256)))
    one = fastsim.replicate(sc, n_replications=6, seed=4, n_threads=1).per_replication
    two = fastsim.replicate(sc, n_replications=6, seed=4, n_threads=2).per_replication
    assert np.array_equal(one.to_numpy(), two.to_numpy(), equal_nan=True)
    run = fastsim.simulate_autoscaled(sc, seed=4, replication=5)
    assert run.gpu_hours == one["gpu_hours"].iloc[5]
    assert run.slo_violation_minutes == one["slo_violation_minutes"].iloc[5]


def test_the_serving_set_is_a_scan_of_the_rows():
    """The serving set an arrival reads (`kernel.autoscale._serving_set`,
    stated at each evaluation and activation; that it is stated then is
    the reference tests' to check): its count, whether the serving
    replicas are the first rows (the router then reads `FleetBuffers.load`
    itself, which is the view `_serving_view` builds: the same rows in the
    same order) and the earliest time a provisioning replica serves,
    against a scan of random states."""
    from fastsim._numba_options import python_entry
    from fastsim.kernel import autoscale as A
    serving_set, serving_view = python_entry(A._serving_set), python_entry(A._serving_view)
    rng = np.random.default_rng(7)
    states = (K.REP_OFF, K.REP_PROVISIONING, K.REP_SERVING, K.REP_DRAINING)
    seen = {True: 0, False: 0}
    for _ in range(400):
        m = int(rng.integers(1, 12))
        ab = A.autoscale_buffers(m, 1)
        ab.state[:] = rng.choice(states, size=m, p=(0.2, 0.2, 0.45, 0.15))
        if rng.random() < 0.4:   # (the common case: the first rows serve, the others do not)
            k = int(rng.integers(0, m + 1))
            ab.state[:k] = K.REP_SERVING
            ab.state[k:] = rng.choice((K.REP_OFF, K.REP_PROVISIONING, K.REP_DRAINING), size=m - k)
        ab.ready[:] = rng.uniform(0, 100, size=m)
        load = rng.uniform(0, 10, size=(m, ab.sload.shape[1]))
        fb = K.cluster.fleet_buffers(4, m, 1, 1, 0)._replace(load=load)
        ns, prefix, ready = serving_set(ab, m)
        rows = np.flatnonzero(ab.state == K.REP_SERVING)
        assert ns == rows.size
        assert prefix == (rows.size > 0 and np.array_equal(rows, np.arange(rows.size)))
        prov = ab.ready[ab.state == K.REP_PROVISIONING]
        assert ready == (prov.min() if prov.size else np.inf)
        assert serving_view(fb, ab, m) == ns and np.array_equal(ab.pos[:ns], rows)
        if prefix:
            assert np.array_equal(ab.sload[:ns], fb.load[:ns])
        seen[bool(prefix)] += 1
    assert min(seen.values()) > 50   # (both kinds of set were drawn)
