"""The vLLM scheduler study's three scenarios, per length class, with swap preemption.

The study compared FCFS, priority and shortest-job-first on three multi-user
loads (the scenarios, length mix and modelling choices of
``experiments/scheduling_policies.py``: 8 / 12-16 / 24 users sending
Poisson(5 / 10 / 20) requests at exponential gaps of rate 0.05 / 0.2 / 0.5 per
second, four length classes). This script runs them through the library's own
per-class reporting instead of a hand-written loop:

* the classes are the output-length bands ``< 500``, ``500-5000``,
  ``> 5000`` tokens, given to the workload as
  ``RequestClasses("output_len", (500, 5000), priorities=(0, 1, 2))``: the
  band is also the priority under ``policy="priority"``;
* each policy is a ``fastsim.replicate`` of the same scenario and seed, so
  the three policies see the same request streams (common random numbers),
  and ``replicate(...).summary(by="class")`` gives every metric per class
  with its 95 % interval;
* preemption is by **swap** (``preemption_mode="swap"``), with vLLM's
  default 4 GiB of CPU swap space per GPU: 9,362 blocks of 16 tokens of
  Qwen2.5-1.5B (28 layers x 2 KV heads x 128 x 2 bytes x K and V = 28,672
  bytes a token), and a transfer cost of 3.8e-5 s a block (458,752 bytes at
  an assumed 12 GB/s of pinned PCIe 4.0 copies; not calibrated).

**The study's measured figures are not in this repository.** Only its
workload description (the scenario table above) is; the per-band TTFT table
in ``experiments/README.md``, section 2, is fastsim's own simulation, not a
measurement. So the ``measured`` column of the output is empty (NaN) and the
findings say so; nothing here is compared with measurements. Where the
measurements come to the repository, note that the study reports TPOT as
tokens per second: compare ``1 / tpot_mean`` with it, not ``tpot_mean``.

Outputs (``--out``, default ``experiments/output/scheduler_study``):
``scheduler_study.csv`` (tidy: server x scenario x policy x class x metric
with ``estimate``, ``ci_low``, ``ci_high``, ``n`` and ``measured``) and
``scheduler_study.png``.

    python experiments/scheduler_study.py            # full: both servers, three scenarios
    python experiments/scheduler_study.py --quick    # medium scenario, 16 sequences, 8 replications
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root: fastsim
sys.path.insert(0, str(HERE))  # experiments/: _common, scheduling_policies

import fastsim  # noqa: E402
from _common import run_experiment, save_figure  # noqa: E402
from scheduling_policies import KV_BLOCKS, SCENARIOS, SERVERS, length_mix  # noqa: E402

NAME = "scheduler_study"
BAND_EDGES = (500, 5000)
BANDS = ("<500", "500-5000", ">5000")
POLICIES = ("fcfs", "priority", "sjf")
SWAP_BLOCKS = 9362            # 4 GiB / (16 tokens x 28,672 bytes)
SWAP_S_PER_BLOCK = 3.8e-5     # 458,752 bytes at an assumed 12 GB/s
METRICS = ("ttft_mean", "ttft_p90", "tpot_mean", "e2e_mean", "preemptions_per_request")

FULL = dict(servers=["seqs64", "seqs16"], scenarios=["low", "medium", "high"],
            replications={"low": 40, "medium": 40, "high": 10})
QUICK = dict(servers=["seqs16"], scenarios=["medium"], replications={"medium": 8})


def scenario(name: str, server: str, policy: str) -> fastsim.Scenario:
    """One scenario of the study on one server under one policy."""
    users, rpu, rate, weights, means = SCENARIOS[name]
    classes = fastsim.RequestClasses("output_len", BAND_EDGES, names=BANDS, priorities=(0, 1, 2))
    wl = fastsim.Workload.multi_user(users, rpu, rate,
                                     prompt_len=fastsim.Empirical(fastsim.sharegpt_lengths().prompt_len),
                                     output_len=length_mix(weights, means), classes=classes)
    eng = fastsim.EngineConfig(max_num_seqs=SERVERS[server], max_num_batched_tokens=2048, block_size=16,
                               num_gpu_blocks=KV_BLOCKS, policy=policy, preemption_mode="swap",
                               swap_space_blocks=SWAP_BLOCKS)
    lat = dataclasses.replace(fastsim.LatencyModel.default(), swap_s_per_block=SWAP_S_PER_BLOCK)
    return fastsim.Scenario(engine=eng, workload=wl, latency=lat)


def run(cfg: dict, seed: int) -> pd.DataFrame:
    rows = []
    for server in cfg["servers"]:
        for name in cfg["scenarios"]:
            for policy in POLICIES:
                res = fastsim.replicate(scenario(name, server, policy), cfg["replications"][name], seed=seed,
                                        progress=False)
                table = res.summary(by="class")
                for _, r in table[table["metric"].isin(METRICS)].iterrows():
                    rows.append(dict(server=server, scenario=name, policy=policy, **{"class": r["class"]},
                                     metric=r["metric"], estimate=r["estimate"], ci_low=r["ci_low"],
                                     ci_high=r["ci_high"], n=r["n"],
                                     measured=np.nan))   # (not in the repository: see the docstring)
    return pd.DataFrame(rows)


def get(table, server, name, policy, band, metric) -> pd.Series:
    t = table[(table.server == server) & (table.scenario == name) & (table.policy == policy)
              & (table["class"] == band) & (table.metric == metric)]
    if len(t) != 1:
        raise KeyError((server, name, policy, band, metric, len(t)))
    return t.iloc[0]


def per_class_tables(table: pd.DataFrame) -> dict:
    """{(server, scenario, metric): DataFrame class x policy of 'estimate [low, high]'}."""
    out = {}
    for (server, name, metric), part in table.groupby(["server", "scenario", "metric"], sort=False):
        cells = {}
        for _, r in part.iterrows():
            cell = f"{r['estimate']:.4g} [{r['ci_low']:.4g}, {r['ci_high']:.4g}]"
            cells.setdefault(r["class"], {})[r["policy"]] = cell
        frame = pd.DataFrame(cells).T.reindex(index=list(BANDS), columns=list(POLICIES))
        frame["measured"] = "not in repo"
        out[(server, name, metric)] = frame
    return out


def findings(table: pd.DataFrame) -> list:
    lines = ["the study's measured per-class figures are not in this repository (experiments/README.md section 2 "
             "holds fastsim's own simulation): the 'measured' column is empty, and no agreement is claimed"]
    for (server, name, metric), frame in per_class_tables(table).items():
        if metric not in ("ttft_mean", "tpot_mean"):
            continue
        lines.append(f"{name} load, {server}, {metric} (s) by output-length class:")
        lines.extend("  " + s for s in frame.to_string().splitlines())
    return lines


def plot(table: pd.DataFrame, path: Path, title: str) -> None:
    keys = [(s, n) for s in table.server.unique() for n in table.scenario.unique()]
    fig, axes = plt.subplots(len(keys), 2, figsize=(11, 3.2 * len(keys)), squeeze=False)
    for i, (server, name) in enumerate(keys):
        for j, metric in enumerate(("ttft_mean", "tpot_mean")):
            ax = axes[i][j]
            for k, policy in enumerate(POLICIES):
                est, lo, hi = (np.array([get(table, server, name, policy, b, metric)[c] for b in BANDS])
                               for c in ("estimate", "ci_low", "ci_high"))
                x = np.arange(len(BANDS)) + (k - 1) * 0.2
                ax.errorbar(x, est, yerr=[np.maximum(est - lo, 0), np.maximum(hi - est, 0)], fmt="o",
                            color=f"C{k}", capsize=4, label=policy)
            finite = table[(table.metric == metric) & (table.estimate > 0)]["estimate"]
            if len(finite) and finite.max() / finite.min() > 20:
                ax.set_yscale("log")
            ax.set_xticks(np.arange(len(BANDS)), [f"{b} tok" for b in BANDS])
            ax.set_title(f"{name} load, {server}: {metric} (s)", fontsize=10)
            ax.grid(alpha=0.3, axis="y", which="both")
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    save_figure(fig, path, title, top=0.95, dpi=90)


def title(cfg: dict, mode: str, seed: int) -> str:
    reps = ", ".join(f"{k} {v}" for k, v in cfg["replications"].items())
    return (f"Scheduler study per length class, swap preemption, A10G model ({mode}: replications {reps}; "
            f"seed {seed}); error bars: 95% CIs; measured figures: not in the repository")


def main(argv=None) -> dict:
    return run_experiment(NAME, __doc__, argv, full=FULL, quick=QUICK, run=run, plot=plot, findings=findings,
                          title=title, wrap_indent=None,
                          quick_help="the medium scenario on the 16-sequence server, 8 replications (test suite)")


if __name__ == "__main__":
    main()
