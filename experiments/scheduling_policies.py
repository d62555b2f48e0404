"""Scheduling policies (FCFS, priority, SJF) under three multi-user load scenarios.

A study of vLLM's scheduler compared FCFS, priority and shortest-job-first on
multi-user workloads. This experiment rebuilds its three scenarios with
``fastsim.Workload.multi_user``: each user sends a Poisson number of requests
(mean ``requests_per_user``) separated by exponential gaps of rate
``user_rate``, the users' streams merged:

=========  ======  ===================  =========  ==========================  =========================
scenario   users   requests per user    user rate  length-mix weights          over mean lengths (tokens)
=========  ======  ===================  =========  ==========================  =========================
low        8       Poisson(5)           0.05 /s    0.5, 0.3, 0.15, 0.05        20, 100, 2000, 15000
medium     12-16   Poisson(10)          0.2 /s     0.2, 0.3, 0.35, 0.15        20, 100, 2000, 20000
high       24      Poisson(20)          0.5 /s     0.1, 0.2, 0.35, 0.35        100, 1500, 5000, 30000
=========  ======  ===================  =========  ==========================  =========================

(``12-16``: the user count is drawn uniformly from 12..16 in every replication.)

Modelling choices (the study gives only the mix):

* **The lengths are output lengths.** The mix gives each request one "length"
  in tokens, and the question is about job size: in a decode-bound server a
  request's service time is proportional to the tokens it generates, and
  ``policy="sjf"`` orders the queue by the true output length. Prompts are
  drawn independently from the packaged ShareGPT prompt lengths (mean 114
  tokens). A request's band (< 500, 500-5000, > 5000 tokens) is that of its
  output length.
* **Each mix component is a LogNormal with the stated mean**:
  ``LogNormal(median=mean / exp(sigma^2 / 2), sigma)`` with ``sigma = 0.5``
  (a within-class coefficient of variation of 0.53), combined with
  ``fastsim.Mixture``.
* **Priority = length class.** Under ``policy="priority"`` every request
  carries its band as its priority (0: < 500 tokens, most urgent; 1: 500-5000;
  2: > 5000), as a client tags interactive vs batch work: the scheduler knows
  the class, not the exact length, serves classes in order and FCFS within a
  class, and preempts the least urgent request first. (With priorities drawn
  independently of length, priority scheduling is a random reordering and
  cannot favour any band.) ``sjf`` uses the exact output length (an oracle).

Servers: the A10G server of the measured vLLM runs (``max_num_batched_tokens=2048``,
blocks of 16 tokens) at ``gpu_memory_utilization=0.9`` (38,421 KV blocks,
614,736 tokens), with no ``max_model_len`` (requests of tens of thousands of
tokens are the point of the mix), ``LatencyModel.default()``, and
``max_num_seqs`` 64 (as measured) or 16 (a smaller batch, where queues form
earlier).

Method: for each replication ``r`` the request stream is
``fastsim.sample_requests(scenario, seed, r)``, and the *same* stream is
simulated under each policy with ``fastsim.simulate_requests`` (common random
numbers). Per replication and band: mean TTFT, the band's per-run p90 TTFT,
the band's worst TTFT (starvation), mean TPOT and mean E2E; per replication the
makespan and preemptions per request. Estimates are means over replications
with 95 % Student-t intervals; the differences ``sjf - fcfs`` and
``priority - fcfs`` are paired (per-replication differences, t interval).
Replications in which a band is empty are left out of that band's estimates
(``n`` says how many remain).

Outputs (``--out``, default ``experiments/output/scheduling_policies``):
``scheduling_policies.csv`` (tidy: one row per server x scenario x policy (or
difference) x band x metric with ``estimate``, ``ci_low``, ``ci_high``, ``n``)
and ``scheduling_policies.png``; the full mode copies the figure to
``docs/img/exp_scheduling_policies.png``.

    python experiments/scheduling_policies.py            # full, ~1.5 min on 2 cores
    python experiments/scheduling_policies.py --quick    # medium scenario, 16 sequences: seconds
"""

from __future__ import annotations

import sys
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root: fastsim
sys.path.insert(0, str(HERE))  # experiments/: _common

import fastsim  # noqa: E402
from _common import fmt, mean_ci, paired_diff_ci, run_experiment, save_figure  # noqa: E402

NAME = "scheduling_policies"
SIGMA = 0.5
BAND_EDGES = (500, 5000)
BANDS = ("<500", "500-5000", ">5000")
POLICIES = ("fcfs", "priority", "sjf")
#: name -> (users, requests per user, user rate /s, weights, mean lengths)
SCENARIOS = {
    "low": (8, 5, 0.05, (0.5, 0.3, 0.15, 0.05), (20, 100, 2000, 15000)),
    "medium": ((12, 16), 10, 0.2, (0.2, 0.3, 0.35, 0.15), (20, 100, 2000, 20000)),
    "high": (24, 20, 0.5, (0.1, 0.2, 0.35, 0.35), (100, 1500, 5000, 30000)),
}
SERVERS = {"seqs64": 64, "seqs16": 16}
KV_BLOCKS = 38421
BAND_METRICS = ("ttft_mean", "ttft_p90", "ttft_max", "tpot_mean", "e2e_mean", "n_requests")
RUN_METRICS = ("makespan_s", "preemptions_per_request", "n_requests")

FULL = dict(servers=["seqs64", "seqs16"], scenarios=["low", "medium", "high"],
            replications={"low": 100, "medium": 100, "high": 25})
QUICK = dict(servers=["seqs16"], scenarios=["medium"], replications={"medium": 30})


def length_mix(weights, means, sigma=SIGMA) -> fastsim.Mixture:
    """A mixture of LogNormals, component j with mean ``means[j]`` (median = mean / exp(sigma^2 / 2))."""
    return fastsim.Mixture([fastsim.LogNormal(median=m / math.exp(sigma ** 2 / 2), sigma=sigma) for m in means],
                           list(weights))


def scenario(name: str, server: str, policy: str = "fcfs") -> fastsim.Scenario:
    users, rpu, rate, weights, means = SCENARIOS[name]
    wl = fastsim.Workload.multi_user(users, rpu, rate,
                                     prompt_len=fastsim.Empirical(fastsim.sharegpt_lengths().prompt_len),
                                     output_len=length_mix(weights, means))
    eng = fastsim.EngineConfig(max_num_seqs=SERVERS[server], max_num_batched_tokens=2048, block_size=16,
                               num_gpu_blocks=KV_BLOCKS, policy=policy)
    return fastsim.Scenario(engine=eng, workload=wl, latency=fastsim.LatencyModel.default())


def band_of(output_len) -> np.ndarray:
    return np.digitize(np.asarray(output_len), BAND_EDGES)


def run_metrics(sim: pd.DataFrame) -> dict:
    """Per-band and per-run metrics of one simulated stream."""
    out = {}
    band = band_of(sim["output_len"])
    done = (sim["status"] == "completed").to_numpy()
    ttft = sim["ttft_s"].to_numpy()
    e2e = sim["e2e_s"].to_numpy()
    o = sim["output_len"].to_numpy()
    multi = done & (o >= 2)
    tpot = np.full(o.size, np.nan)
    tpot[multi] = (e2e[multi] - ttft[multi]) / (o[multi] - 1)
    for b, name in enumerate(BANDS):
        sel = (band == b) & done
        n = int(sel.sum())
        out[(name, "n_requests")] = n
        if n == 0:
            for m in BAND_METRICS[:-1]:
                out[(name, m)] = np.nan
            continue
        t = ttft[sel]
        out[(name, "ttft_mean")] = t.mean()
        out[(name, "ttft_p90")] = np.percentile(t, 90)
        out[(name, "ttft_max")] = t.max()
        out[(name, "tpot_mean")] = np.nanmean(tpot[sel]) if np.isfinite(tpot[sel]).any() else np.nan
        out[(name, "e2e_mean")] = e2e[sel].mean()
    out[("all", "makespan_s")] = float(np.nanmax(sim["finish_s"].to_numpy()))
    out[("all", "preemptions_per_request")] = float(sim["num_preemptions"].mean())
    out[("all", "n_requests")] = len(sim)
    return out


def simulate(name: str, server: str, n_rep: int, seed: int) -> dict:
    """{policy: DataFrame (one row per replication, columns (band, metric))} on common streams."""
    base = scenario(name, server)
    rows = {p: [] for p in POLICIES}
    for r in range(n_rep):
        req = fastsim.sample_requests(base, seed=seed, replication=r)
        for p in POLICIES:
            sc = base.replace(**{"engine.policy": p})
            stream = req.assign(priority=band_of(req["output_len"])) if p == "priority" else req
            rows[p].append(run_metrics(fastsim.simulate_requests(sc, stream)))
    return {p: pd.DataFrame(v) for p, v in rows.items()}


def run(cfg: dict, seed: int) -> pd.DataFrame:
    rows = []
    for server in cfg["servers"]:
        for name in cfg["scenarios"]:
            per = simulate(name, server, cfg["replications"][name], seed)
            cols = per["fcfs"].columns
            for p in POLICIES:
                for band, m in cols:
                    est, lo, hi, n = mean_ci(per[p][(band, m)])
                    rows.append(dict(server=server, scenario=name, policy=p, band=band, metric=m, estimate=est,
                                     ci_low=lo, ci_high=hi, n=n))
            for p in ("sjf", "priority"):
                for band, m in cols:
                    if m == "n_requests":
                        continue
                    est, lo, hi, n = paired_diff_ci(per[p][(band, m)], per["fcfs"][(band, m)])
                    rows.append(dict(server=server, scenario=name, policy=f"{p}-fcfs", band=band, metric=m,
                                     estimate=est, ci_low=lo, ci_high=hi, n=n))
    return pd.DataFrame(rows)


def get(table, server, scenario_, policy, band, metric) -> pd.Series:
    t = table[(table.server == server) & (table.scenario == scenario_) & (table.policy == policy)
              & (table.band == band) & (table.metric == metric)]
    if len(t) != 1:
        raise KeyError((server, scenario_, policy, band, metric, len(t)))
    return t.iloc[0]


def verdict(row) -> str:
    if not np.isfinite(row.ci_low):
        return "n/a"
    return "lower" if row.ci_high < 0 else "higher" if row.ci_low > 0 else "no significant change"


def findings(table: pd.DataFrame) -> list[str]:
    lines = []
    for server in dict.fromkeys(table.server):
        for name in dict.fromkeys(table[table.server == server].scenario):
            f = get(table, server, name, "fcfs", "<500", "ttft_mean")
            pre = get(table, server, name, "fcfs", "all", "preemptions_per_request")
            mk = get(table, server, name, "fcfs", "all", "makespan_s")
            lines.append(f"[{server}, {name}] FCFS: short (<500) mean TTFT {fmt(f)} s; "
                         f"{fmt(pre)} preemptions/request; makespan {fmt(mk)} s")
            for p in ("sjf", "priority"):
                parts = []
                for band in BANDS:
                    d = get(table, server, name, f"{p}-fcfs", band, "ttft_mean")
                    parts.append(f"{band}: {fmt(d)} s ({verdict(d)})")
                lines.append(f"  {p} - fcfs, mean TTFT by band: " + "; ".join(parts))
                d = get(table, server, name, f"{p}-fcfs", ">5000", "ttft_max")
                t = get(table, server, name, f"{p}-fcfs", ">5000", "tpot_mean")
                lines.append(f"  {p} - fcfs, long (>5000) requests: worst TTFT {fmt(d)} s ({verdict(d)}), "
                             f"mean TPOT {fmt(t, 1e3)} ms ({verdict(t)})")
    return lines


def plot(table: pd.DataFrame, path: Path, title: str) -> None:
    servers = list(dict.fromkeys(table.server))
    names = list(dict.fromkeys(table.scenario))
    panels = [(s, m) for s in servers for m in ("ttft_mean", "ttft_max", "tpot_mean")]
    fig, axes = plt.subplots(len(panels), len(names), figsize=(5.2 * len(names), 3.3 * len(panels)),
                             squeeze=False)
    labels = {"ttft_mean": "mean TTFT (s)", "ttft_max": "worst TTFT in band (s)", "tpot_mean": "mean TPOT (ms)"}
    width = 0.2
    for i, (server, metric) in enumerate(panels):
        scale = 1e3 if metric == "tpot_mean" else 1.0
        for j, name in enumerate(names):
            ax = axes[i, j]
            t = table[(table.server == server) & (table.scenario == name)]
            if t.empty:
                ax.axis("off")
                continue
            allv = []
            for k, p in enumerate(POLICIES):
                x = np.arange(len(BANDS)) + (k - 1) * width
                rows = [get(t, server, name, p, b, metric) for b in BANDS]
                est = np.array([r.estimate for r in rows]) * scale
                lo = np.array([r.ci_low for r in rows]) * scale
                hi = np.array([r.ci_high for r in rows]) * scale
                ok = np.isfinite(lo) & np.isfinite(hi)
                lo, hi = np.where(ok, lo, est), np.where(ok, hi, est)
                ax.errorbar(x, est, yerr=[np.maximum(est - lo, 0), np.maximum(hi - est, 0)], fmt="o",
                            color=f"C{k}", ms=6, capsize=4, lw=1.5, label=p)
                allv.append(est[np.isfinite(est)])
            allv = np.concatenate(allv)
            if allv.size and allv.min() > 0 and allv.max() / allv.min() > 20:
                ax.set_yscale("log")
            ax.set_xticks(np.arange(len(BANDS)), [f"{b} tok" for b in BANDS])
            ax.set_ylabel(labels[metric])
            ax.set_title(f"{name} load, {server}: {labels[metric]}", fontsize=10)
            ax.grid(alpha=0.3, axis="y", which="both")
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    save_figure(fig, path, title, top=0.97, dpi=90)


def title(cfg: dict, mode: str, seed: int) -> str:
    reps = ", ".join(f"{k} {v}" for k, v in cfg["replications"].items())
    return (f"FCFS vs priority (by length class) vs SJF, multi-user workloads, A10G model, "
            f"38,421 KV blocks ({mode}: replications {reps}; seed {seed}); error bars: 95% CIs")


def main(argv=None) -> dict:
    return run_experiment(NAME, __doc__, argv, full=FULL, quick=QUICK, run=run, plot=plot, findings=findings,
                          title=title, wrap_indent="      ",
                          quick_help="the medium scenario on the 16-sequence server, 30 replications (test suite)")


if __name__ == "__main__":
    main()
