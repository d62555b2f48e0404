"""Autoscaling against a day-shaped rate: SLO-violation minutes and GPU-hours of two policies.

A fleet of A10G replicas (``LatencyModel.default()``, the measured engine,
ShareGPT lengths) behind JSQ serves a day-shaped arrival rate (a piecewise
linear `fastsim.RateSchedule`: a night trough at 15% of the peak, a morning
ramp, a midday peak and an evening shoulder; a "day" compressed into
``day_s`` seconds). Three `fastsim.Autoscaler` policies, each evaluated
every 15 s with the same provisioning delay and scale-in cool-down (HPA's
rule, ``ceil(total / target)``):

* ``rate``: a target arrival rate per replica (proportional: it follows the
  day's shape), with one spare replica;
* ``kv_utilisation``: a target fraction of KV blocks in use per replica
  (vLLM's ``kv_cache_usage_perc``, which grows with the requests running);
* ``queue_depth``: a target number of waiting requests per replica (vLLM's
  ``num_requests_waiting``: reactive, it scales out only once requests queue,
  and a fleet with nothing waiting asks for ``min_replicas``).

All see the same request streams (one seed: common random numbers), so
each difference is paired per replication (a Student-t interval on the mean
difference). Reported: SLO-violation minutes (windows where fewer than 95%
of the arrivals meet TTFT <= 1 s), GPU-hours, p99 TTFT, and one
replication's replicas and attainment over the day (the figure).

    python experiments/autoscaling.py [--quick] [--seed S] [--out DIR]

Outputs: ``autoscaling.csv`` (policy, metric, estimate and interval; the
paired difference from ``rate``) and ``autoscaling_windows.csv``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import MEASURED_ENGINE, mean_ci, paired_diff_ci, run_experiment  # noqa: E402

import fastsim  # noqa: E402

#: The day's shape: the rate at each hour (fraction of the peak), 0 h to 24 h (= 0 h).
DAY = (0.25, 0.18, 0.15, 0.15, 0.18, 0.25, 0.4, 0.6, 0.8, 0.92, 1.0, 1.0, 0.95, 0.97, 1.0, 0.95, 0.9,
       0.85, 0.8, 0.75, 0.65, 0.5, 0.38, 0.3, 0.25)
METRICS = ("slo_violation_minutes", "gpu_hours", "ttft_p99", "replicas_mean", "scale_events")

FULL = dict(day_s=7200.0, peak=40.0, replications=10, delay_s=60.0)
QUICK = dict(day_s=900.0, peak=16.0, replications=4, delay_s=30.0)


def day_schedule(day_s, peak):
    """The day's shape as a piecewise-linear schedule over ``day_s`` seconds."""
    times = np.linspace(0.0, day_s, len(DAY))
    return fastsim.RateSchedule(times, peak * np.array(DAY), shape="linear")


def policies(delay_s):
    common = dict(interval_s=15.0, min_replicas=1, max_replicas=16, provisioning_delay_s=delay_s,
                  scale_in_cooldown_s=120.0, initial_replicas=2)
    return {"rate": fastsim.Autoscaler(metric="rate", target=6.0, spare_replicas=1, **common),
            "kv_utilisation": fastsim.Autoscaler(metric="kv_utilisation", target=0.1, **common),
            "queue_depth": fastsim.Autoscaler(metric="queue_depth", target=2.0, **common)}


def scenario(cfg, scaler):
    rs = day_schedule(cfg["day_s"], cfg["peak"])
    n = int(rs.cumulative(cfg["day_s"]) * 1.2) + 100
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(**MEASURED_ENGINE),
        workload=fastsim.Workload(rate_schedule=rs, num_requests=n, horizon_s=cfg["day_s"],
                                  lengths=fastsim.sharegpt_lengths("sample")),
        latency=fastsim.LatencyModel.default(), ttft_slo_s=1.0,
        fleet=fastsim.Fleet(router="jsq", autoscaler=scaler))


def run(cfg, seed):
    scs = {name: scenario(cfg, p) for name, p in policies(cfg["delay_s"]).items()}
    res = {name: fastsim.replicate(sc, n_replications=cfg["replications"], seed=seed) for name, sc in scs.items()}
    rows = []
    base = res["rate"].per_replication
    for name, r in res.items():
        per = r.per_replication
        for m in METRICS:
            est, lo, hi, n = mean_ci(per[m].to_numpy())
            d = paired_diff_ci(per[m].to_numpy(), base[m].to_numpy()) if name != "rate" else (np.nan,) * 4
            rows.append(dict(policy=name, metric=m, estimate=est, ci_low=lo, ci_high=hi, n=n,
                             diff_vs_rate=d[0], diff_low=d[1], diff_high=d[2]))
    table = pd.DataFrame(rows)
    table.attrs["windows"] = pd.concat(
        [fastsim.simulate_autoscaled(sc, seed=seed).windows.assign(policy=name) for name, sc in scs.items()],
        ignore_index=True)
    return table


def plot(table, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    w = table.attrs.get("windows")
    fig, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for name, g in w.groupby("policy", sort=False):
        axes[0].step(g["t_s"] / 60, g["replicas_serving"], where="post", label=f"{name}: serving")
        axes[1].plot(g["t_s"] / 60, g["slo_attainment"], label=name)
    axes[0].set_ylabel("replicas serving")
    axes[1].set_ylabel("TTFT <= 1 s, per 15 s window")
    axes[1].set_xlabel("time (min)")
    axes[0].legend()
    axes[1].legend()
    _common.save_figure(fig, path, title)
    w.to_csv(path.with_name("autoscaling_windows.csv"), index=False)


def findings(table):
    t = table.set_index(["policy", "metric"])
    out = []
    for m in ("slo_violation_minutes", "gpu_hours"):
        r = t.loc[("rate", m)]
        parts = [f"rate {r.estimate:.3g} [{r.ci_low:.3g}, {r.ci_high:.3g}]"]
        for name in ("kv_utilisation", "queue_depth"):
            q = t.loc[(name, m)]
            parts.append(f"{name} {q.estimate:.3g} [{q.ci_low:.3g}, {q.ci_high:.3g}], minus rate "
                         f"{q.diff_vs_rate:+.3g} [{q.diff_low:+.3g}, {q.diff_high:+.3g}]")
        out.append(f"{m} (paired, n={int(r.n)}): " + "; ".join(parts))
    return out


def title(cfg, mode, seed):
    return (f"Autoscaling over a {cfg['day_s'] / 60:.0f}-min day (peak {cfg['peak']:g} req/s, "
            f"{cfg['delay_s']:g} s provisioning; {mode}, seed {seed})")


def main(argv=None):
    return run_experiment("autoscaling", __doc__, argv, full=FULL, quick=QUICK, run=run, plot=plot,
                                  findings=findings, title=title)


if __name__ == "__main__":
    main()
