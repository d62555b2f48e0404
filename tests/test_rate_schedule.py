"""Time-varying arrival rates (`fastsim.RateSchedule`, `Workload(rate_schedule=...)`):
the integrated rate is exact, the compiled draw is the reference's bit for
bit, a replication's arrivals are reproducible, and the arrival counts per
window follow the Poisson law of the integrated rate (tolerances from
exact Poisson intervals and chi-square quantiles, any seed)."""

import numpy as np
import pytest
from scipy import integrate, stats

import fastsim
from fastsim import kernel as K
from fastsim._reference_autoscale import schedule_arrivals_reference
from fastsim._replicate import pack_scenario

SCHEDULES = {
    "steps": fastsim.RateSchedule([0, 50, 120, 200], [2.0, 8.0, 0.0, 3.0]),
    "ramp": fastsim.RateSchedule([0, 60, 100, 180], [0.0, 10.0, 10.0, 1.0], shape="linear"),
    "day": fastsim.RateSchedule([0, 30, 60, 90, 120], [1.0, 6.0, 2.0, 0.5, 1.0], shape="linear", repeat=True),
    "day_steps": fastsim.RateSchedule([0, 40, 80], [4.0, 0.5, 4.0], repeat=True),
    "flat": fastsim.RateSchedule([0], [3.0]),
}


def _kernel_arrivals(schedule, num_requests, horizon, rep, k0=5, k1=9):
    w = fastsim.Workload(rate_schedule=schedule, num_requests=num_requests, horizon_s=horizon)
    p = pack_scenario(fastsim.Scenario(workload=w))
    a = K.draw_workload(rep, k0, k1, *K.scenario_arrays(p, lat=False))[0]
    return np.asarray(a)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_integrated_rate_is_exact(name):
    rs = SCHEDULES[name]
    for t in (0.0, 13.7, 50.0, 77.0, 119.9, 200.0, 263.5, 500.0):
        # numerically, piece by piece (the rate is smooth between its knots, repeated over periods)
        knots = rs.times if not rs.repeat else np.concatenate([rs.times + c * rs.times[-1] for c in range(6)])
        cuts = np.unique(np.r_[0.0, knots[(knots > 0) & (knots < t)], t])
        num = sum(integrate.quad(lambda x: float(rs.rate(x)), lo, hi)[0] for lo, hi in zip(cuts[:-1], cuts[1:]))
        assert rs.cumulative(t) == pytest.approx(num, rel=1e-9, abs=1e-9)
    # a linear piece's integral is its trapezoid, exactly
    ramp = SCHEDULES["ramp"]
    assert ramp.cumulative(60.0) == 300.0 and ramp.cumulative(100.0) == 700.0
    assert ramp.cumulative(30.0) == 75.0   # (0 + 5) / 2 * 30


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_kernel_draw_is_the_reference_bit_for_bit(name):
    rs = SCHEDULES[name]
    for rep in range(3):
        a = _kernel_arrivals(rs, 2000, 700.0, rep)
        ref = schedule_arrivals_reference(rs, 2000, 700.0, seed_keys=(5, 9, rep))
        assert a.size > 100 and np.array_equal(a, ref)
        assert np.all(np.diff(a) >= 0) and a[-1] < 700.0


def test_reproducible_per_seed_and_distinct_across_replications():
    rs = SCHEDULES["day"]
    a = _kernel_arrivals(rs, 500, None, 4)
    assert np.array_equal(a, _kernel_arrivals(rs, 500, None, 4))
    assert not np.array_equal(a, _kernel_arrivals(rs, 500, None, 5))
    sc = fastsim.Scenario(workload=fastsim.Workload(rate_schedule=rs, num_requests=300))
    x = fastsim.sample_requests(sc, seed=7, replication=2)
    assert x.equals(fastsim.sample_requests(sc, seed=7, replication=2)) and len(x) == 300


@pytest.mark.parametrize("name", ["steps", "ramp", "day"])
def test_window_counts_follow_the_poisson_law_of_the_integrated_rate(name):
    """Over 200 replications, each window's total count is Poisson(200 x
    expected): inside its exact 99.9% interval (Bonferroni over windows); and
    the per-replication counts' dispersion (variance / mean) is 1 within a
    chi-square interval."""
    rs = SCHEDULES[name]
    edges = np.arange(0.0, 241.0, 20.0)
    nrep = 200
    counts = np.array([np.histogram(_kernel_arrivals(rs, 5000, 240.0, rep), bins=edges)[0] for rep in range(nrep)])
    mean = rs.expected_count(edges[:-1], edges[1:])
    alpha = 1e-3 / len(mean)
    for j, m in enumerate(mean):
        tot = counts[:, j].sum()
        if m == 0:
            assert tot == 0
            continue
        lo, hi = stats.poisson.ppf(alpha / 2, nrep * m), stats.poisson.isf(alpha / 2, nrep * m)
        assert lo <= tot <= hi, (j, tot, nrep * m)
        # dispersion: sum (x - xbar)^2 / xbar ~ chi2(nrep - 1) for Poisson counts
        if m > 5:
            d = ((counts[:, j] - counts[:, j].mean()) ** 2).sum() / counts[:, j].mean()
            assert stats.chi2.ppf(alpha / 2, nrep - 1) <= d <= stats.chi2.isf(alpha / 2, nrep - 1)


def test_arrivals_stop_when_the_last_rate_is_zero():
    rs = fastsim.RateSchedule([0, 10], [5.0, 0.0])
    for rep in range(5):
        a = _kernel_arrivals(rs, 1000, None, rep)
        assert a.size < 200 and (a.size == 0 or a[-1] < 10.0)


def test_a_trace_and_a_schedule_of_its_shape_run_in_a_fleet():
    """A recorded trace (the bundled Azure 2023 conversation sample) replayed
    by its own timestamps, and a schedule of its shape
    (`RateSchedule.from_arrivals`), both run in a fleet: every arrival once."""
    from pathlib import Path
    path = Path(fastsim.__file__).parent / "data" / "traces" / "azure_conv_2023_head300.csv"
    w = fastsim.Workload.from_trace(path)
    sc = fastsim.Scenario(workload=w, fleet=fastsim.Fleet(2))
    res = fastsim.replicate(sc, n_replications=2, seed=0)
    assert (res.per_replication["n_arrived"] == 300).all()
    a = w.arrival_times
    rs = fastsim.RateSchedule.from_arrivals(a, 10.0, scale=2.0)
    assert rs.cumulative(rs.times[-1] + 10.0) == pytest.approx(2 * a.size)
    n = int(2 * a.size)
    w2 = fastsim.Workload(rate_schedule=rs, num_requests=n, prompt_len=64, output_len=16)
    res = fastsim.replicate(fastsim.Scenario(workload=w2, fleet=fastsim.Fleet(2)), n_replications=2, seed=0)
    assert (res.per_replication["n_arrived"] == n).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(times=[1, 2], rates=[1, 1]), "times must be"),
    (dict(times=[0, 2, 2], rates=[1, 1, 1]), "times must be"),
    (dict(times=[0, 2], rates=[1, -1]), "rates must be"),
    (dict(times=[0, 2], rates=[1]), "rates must be"),
    (dict(times=[0, 2], rates=[0, 0]), "positive somewhere"),
    (dict(times=[0, 2], rates=[1, 2], repeat=True), "repeat=True"),
    (dict(times=[0, 2], rates=[1, 2], shape="cubic"), "shape must be"),
])
def test_bad_schedules_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastsim.RateSchedule(**kwargs)


def test_a_schedule_replaces_the_arrival_rate():
    rs = SCHEDULES["flat"]
    with pytest.raises(ValueError, match="arrival_rate must be None with rate_schedule"):
        fastsim.Workload(rate_schedule=rs, arrival_rate=2.0)
    with pytest.raises(ValueError, match="burstiness must be 1.0 with rate_schedule"):
        fastsim.Workload(rate_schedule=rs, burstiness=2.0)
    with pytest.raises(ValueError, match="rate_schedule must be None or a fastsim.RateSchedule"):
        fastsim.Workload(rate_schedule=[1, 2])


def test_the_cuda_backend_draws_the_schedule_as_the_cpu(tmp_path):
    """Under Numba's CUDA simulator, `backend="cuda"` gives the CPU kernel's
    per-replication rows bit for bit for a rate-schedule workload."""
    import os
    import subprocess
    import sys
    pytest.importorskip("numba.cuda")
    code = (
        "import fastsim, numpy as np\n"
        "sc = fastsim.Scenario(engine=fastsim.EngineConfig(max_num_seqs=4, num_gpu_blocks=60), "
        "workload=fastsim.Workload(rate_schedule=fastsim.RateSchedule([0, 5, 10], [1.0, 8.0, 2.0], shape='linear'), "
        "num_requests=200, horizon_s=12.0, prompt_len=30, output_len=fastsim.LogNormal(20, 0.5)))\n"
        "g = fastsim.replicate(sc, 4, seed=7, backend='cuda', progress=False).per_replication.to_numpy()\n"
        "c = fastsim.replicate(sc, 4, seed=7, progress=False).per_replication.to_numpy()\n"
        "print('SAME' if np.array_equal(g, c, equal_nan=True) else 'DIFFERENT')\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("SAME"), proc.stdout
