"""Fit the A10G preset's step-time noise (``fastsim.StepNoise``) and check the fit.

Method (``docs/calibration.md``, "Noise"):

1. **Per-step jitter and stalls, from the TPOT traces.** An engine step is seen
   by every request of the batch: the step's duration is the cross-request
   median of the b gaps at that step index. Its log residual about the
   deterministic model, less each run's own mean (a run's level is the
   per-run effect, not jitter), has a robust standard deviation (1.4826 x
   MAD) pooled over the batch sizes: ``jitter_sd``. The lag-1
   autocorrelation of those residuals says whether an AR(1) term is needed.
   A stall is a step whose whole batch waits more than
   ``STALL_FACTOR`` x the model's step: their count over the decode steps
   gives ``stall_prob``, their mean excess ``stall_mean_s``.
2. **Calibration uncertainty**: the fit's covariance (``CalibrationResult.covariance``).
3. **Per-run effects, from the sweep's spread between runs.** Each sweep row is
   simulated with (1) and (2) only; per row, the measured value's log ratio to
   the simulated runs gives: for mean TPOT, the log speed factor (mean and
   variance, less the variance the simulation already has); for p99 TTFT
   less the overhead, the speed plus the log prefill factor; for mean TTFT,
   after a second simulation with speed and prefill factors, the spread of
   the residuals gives the per-run overhead's standard deviation.
   (The four rows at one rate replay identical requests with no preemption:
   their differences are the server's run-to-run noise.)

Checks: the fitted jitter's residual quantiles against the traces', the stall
count, and **cross-validation**: fit (3) on half the sweep's arrival rates,
predict the other half (coverage of the single-run 95 % band), both ways.

The sweep's rows are simulated as vLLM 0.22 served them: its V1 rules (async
scheduling, the full-input gate, the null block) and, for a run whose server
had served the same prompts in its previous run with room to keep them, a warm
prefix cache (``vllm_a10g_validation.warm_prefix_cache``); the prefill factor
comes from the cold runs' p99 TTFT only. ``--rules sync --no-warm`` gives the
fit as it was made before (synchronous engine, every run cold).

Run: ``python experiments/fit_noise.py [--reps N] [--quick] [--rules v1|sync] [--no-warm]``;
prints the fitted ``StepNoise`` (the literal in ``fastsim/_calibration.py``'s
``NOISE_PRESETS``) and writes ``experiments/output/fit_noise*.csv``. Refit after
any change that moves the A10G predictions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import fastsim
from fastsim._calibration import PACKAGED_TRACES, fit_tpot_traces

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_a10g_validation import SWEEP, scenario_for, warm_prefix_cache  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "experiments" / "output"
STALL_FACTOR = 3.0            # a stall: the whole batch's step more than 3x the model's
HALF_A = (0.5, 2.0, 4.0, 6.0)  # the cross-validation split of the sweep's arrival rates
HALF_B = (1.0, 3.0, 5.0, 8.0)
#: The engine the sweep rows are simulated with: vLLM 0.22's V1 rules (async scheduling, the
#: full-input gate, the null block) and, where the previous run's blocks stayed cached, the warm
#: prefix cache (``vllm_a10g_validation.warm_prefix_cache``). ``--rules sync --no-warm``: the fit
#: as it was made before (synchronous engine, every run cold).
RULES = {"v1": True, "warm": True}
FULL_SWEEP = pd.read_csv(SWEEP)


def trace_noise(lm: fastsim.LatencyModel, traces=PACKAGED_TRACES) -> tuple[dict, pd.DataFrame]:
    """Per-step jitter, its autocorrelation and stalls from the TPOT traces."""
    data = json.loads(Path(traces).read_text())
    rows, pooled, events, excess, n_steps = [], [], 0, [], 0
    for m in data["measurements"]:
        b = int(m["batch_size"])
        gaps = np.array([r["step_deltas_s"] for r in m["requests"]])
        step = np.median(gaps, axis=0)                     # the engine's step, seen by the batch
        pred = float(lm.step_time(b))
        stalled = step > STALL_FACTOR * pred
        events += int(stalled.sum())
        excess += list(step[stalled] - pred)
        n_steps += step.size
        lr = np.log(step[~stalled] / pred)
        lr = lr - lr.mean()                                # the run's own level is a per-run effect
        pooled.append(lr)
        mad = 1.4826 * np.median(np.abs(lr - np.median(lr)))
        rows.append({"batch_size": b, "steps": step.size, "robust_sd": mad, "sd": lr.std(ddof=1),
                     "lag1_autocorrelation": float(np.corrcoef(lr[:-1], lr[1:])[0, 1]),
                     "stalls": int(stalled.sum()), "max_step_s": float(step.max()), "model_step_s": pred})
    allr = np.concatenate(pooled)
    jitter_sd = float(1.4826 * np.median(np.abs(allr - np.median(allr))))
    fit = {"jitter_sd": jitter_sd, "stall_prob": events / n_steps,
           "stall_mean_s": float(np.mean(excess)) if excess else 0.0,
           "stall_events": events, "decode_steps": n_steps,
           # one-sided 95 % upper bound of the stall probability (exact Poisson; 3 / n for 0 events)
           "stall_prob_upper95": (3.0 if events == 0 else events + 2.0 * np.sqrt(events) + 2.0) / n_steps,
           "median_lag1_autocorrelation": float(np.median([r["lag1_autocorrelation"] for r in rows])),
           "residual_quantiles": np.quantile(allr, [0.05, 0.25, 0.5, 0.75, 0.95]).tolist()}
    return fit, pd.DataFrame(rows)


def simulate_rows(sweep: pd.DataFrame, lm: fastsim.LatencyModel, reps: int, seed: int = 0) -> dict:
    """Per-replication values of each row (vllm's arrival process)."""
    out = {}
    for i, row in sweep.iterrows():
        sc = scenario_for(row, lm, True, v1=RULES["v1"], warm=is_warm(row))
        out[i] = fastsim.replicate(sc, reps, seed=seed, n_threads=1).per_replication
    return out


def is_warm(row) -> bool:
    """Whether the row is simulated with the previous run's prompts cached (``RULES``)."""
    return RULES["warm"] and warm_prefix_cache(row, FULL_SWEEP)


def _log_ratio(meas, sims, shift=0.0):
    """Per row: log(measured - shift) - mean log(simulated - shift), and the
    simulated runs' own variance of that log."""
    y, v = [], []
    for m, s in zip(meas, sims):
        ls = np.log(np.asarray(s) - shift)
        y.append(np.log(m - shift) - ls.mean())
        v.append(ls.var(ddof=1))
    return np.array(y), np.array(v)


def run_effects(sweep: pd.DataFrame, base: fastsim.LatencyModel, noise: fastsim.StepNoise, reps: int) -> dict:
    """Fit the per-run speed, prefill and overhead laws on ``sweep``'s rows."""
    over = base.ttft_overhead_s
    sims = simulate_rows(sweep, dataclasses.replace(base, noise=noise), reps)
    y, v = _log_ratio(sweep.mean_tpot_s, [sims[i].tpot_mean for i in sweep.index])
    speed_mu = float(y.mean())
    speed_sd = float(np.sqrt(max(y.var(ddof=1) - v.mean(), 0.0)))
    # The prefill factor from the rows whose p99 TTFT is a long prompt's full prefill: the cold
    # runs (a warm run computes at most one block of each prompt).
    cold = [i for i, row in sweep.iterrows() if not is_warm(row)]
    yp, vp = _log_ratio(sweep.p99_ttft_s[cold], [sims[i].ttft_p99 for i in cold], shift=over)
    prefill_mu = float(yp.mean() - speed_mu)
    prefill_sd = float(np.sqrt(max(yp.var(ddof=1) - vp.mean() - speed_sd ** 2, 0.0)))
    step2 = dataclasses.replace(noise, speed_log_mean=speed_mu, speed_sd=speed_sd,
                                prefill_log_mean=prefill_mu, prefill_sd=prefill_sd)
    sims2 = simulate_rows(sweep, dataclasses.replace(base, noise=step2), reps)
    r = np.array([sweep.mean_ttft_s[i] - sims2[i].ttft_mean.mean() for i in sweep.index])
    within = np.mean([sims2[i].ttft_mean.var(ddof=1) for i in sweep.index])
    overhead_sd = float(np.sqrt(max(r.var(ddof=1) - within, 0.0)))
    # The traces identify only the sum of the TTFT's constant and its per-token slope (one
    # prompt length); with the slope scaled by the prefill factor, the constant is re-identified
    # from the same residuals: the client overhead moves by their mean.
    return {"speed_log_mean": speed_mu, "speed_sd": speed_sd, "prefill_log_mean": prefill_mu,
            "prefill_sd": prefill_sd, "overhead_sd": overhead_sd}, over + float(r.mean())


COVERED = (("ttft_mean", "mean_ttft_s"), ("ttft_p99", "p99_ttft_s"), ("tpot_mean", "mean_tpot_s"),
           ("request_throughput", "request_throughput"))


def coverage(sweep: pd.DataFrame, lm: fastsim.LatencyModel, reps: int, seed: int = 1) -> pd.DataFrame:
    """Per row and metric: measured, predicted mean and single-run 95 % band, inside or not."""
    sims = simulate_rows(sweep, lm, reps, seed=seed)
    lines = []
    for i, row in sweep.iterrows():
        for name, col in COVERED:
            x = sims[i][name].to_numpy()
            lo, hi = np.percentile(x, [2.5, 97.5])
            meas = float(row[col])
            lines.append({"row": i, "arrival_rate": row.arrival_rate, "metric": name, "measured": meas,
                          "pred_mean": float(x.mean()), "band_lo": lo, "band_hi": hi,
                          "rel_error": float(x.mean()) / meas - 1, "rel_width": (hi - lo) / float(x.mean()),
                          "inside": bool(lo <= meas <= hi)})
    return pd.DataFrame(lines)


def plot(t: pd.DataFrame, path: Path) -> None:
    """Measured value against the predicted single-run 95 % band, per row and metric."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, (name, _) in zip(axes, COVERED):
        m = t[t.metric == name].reset_index(drop=True)
        x = np.arange(len(m))
        ax.vlines(x, m.band_lo, m.band_hi, color="tab:blue", alpha=0.6, label="single-run 95 % band")
        ax.plot(x, m.det_pred_mean, "_", color="gray", label="deterministic prediction")
        ax.scatter(x, m.measured, c=np.where(m.inside, "tab:green", "tab:red"), s=14, zorder=3,
                   label="measured (red: outside)")
        ax.set_title(name)
        ax.set_xlabel("sweep row (rate 0.5 .. 8 req/s, 4 gmu each)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=100, help="replications per sweep row (default 100)")
    ap.add_argument("--quick", action="store_true", help="20 replications, no cross-validation")
    ap.add_argument("--rules", choices=("v1", "sync"), default="v1",
                    help="engine rules: vLLM 0.22's V1 rules (default) or the synchronous loop")
    ap.add_argument("--no-warm", action="store_true",
                    help="simulate every run with a cold prefix cache (the fit before the V1 refit)")
    args = ap.parse_args(argv)
    RULES.update(v1=args.rules == "v1", warm=not args.no_warm)
    print(f"engine: {'vLLM V1 rules' if RULES['v1'] else 'synchronous'}; warm prefix cache between runs: "
          f"{RULES['warm']} ({sum(is_warm(r) for _, r in FULL_SWEEP.iterrows())} of {len(FULL_SWEEP)} rows warm)")
    reps = 20 if args.quick else args.reps
    OUT.mkdir(parents=True, exist_ok=True)
    # the traces' fit alone (its TTFT constant from the traces), so that a refit does not start from itself
    base = fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b-deterministic")
    cal = fit_tpot_traces(PACKAGED_TRACES)
    tfit, tdiag = trace_noise(base)
    tdiag.to_csv(OUT / "fit_noise_traces.csv", index=False)
    print("traces, per batch size:\n" + tdiag.to_string(index=False))
    print({k: v for k, v in tfit.items()})
    noise0 = fastsim.StepNoise(jitter_sd=tfit["jitter_sd"], stall_prob=tfit["stall_prob"],
                               stall_mean_s=tfit["stall_mean_s"],
                               calibration_cov=cal.covariance.to_numpy())
    sweep = pd.read_csv(SWEEP)
    if not args.quick:
        cv = []
        for fit_on, predict in ((HALF_A, HALF_B), (HALF_B, HALF_A)):
            eff, over = run_effects(sweep[sweep.arrival_rate.isin(fit_on)], base, noise0, reps)
            held = sweep[sweep.arrival_rate.isin(predict)]
            t = coverage(held, dataclasses.replace(base, ttft_overhead_s=over,
                                                   noise=dataclasses.replace(noise0, **eff)), reps)
            t["fit_on"] = "/".join(f"{r:g}" for r in fit_on)
            cv.append(t)
            print(f"fit on rates {fit_on}: {eff}, ttft_overhead_s={over}")
        cv = pd.concat(cv)
        cv.to_csv(OUT / "fit_noise_cv.csv", index=False)
        print("cross-validation (held-out rates), coverage / median |rel. error| / median rel. width:")
        print(cv.groupby("metric").agg(coverage=("inside", "mean"),
                                       abs_err=("rel_error", lambda e: e.abs().median()),
                                       width=("rel_width", "median")).to_string())
    eff, over = run_effects(sweep, base, noise0, reps)
    noise = dataclasses.replace(noise0, **eff)
    print(f"fitted on all rows: ttft_overhead_s={over!r}")
    print(f"StepNoise(jitter_sd={noise.jitter_sd!r}, stall_prob={noise.stall_prob!r}, "
          f"stall_mean_s={noise.stall_mean_s!r}, speed_log_mean={noise.speed_log_mean!r}, "
          f"speed_sd={noise.speed_sd!r}, prefill_log_mean={noise.prefill_log_mean!r}, "
          f"prefill_sd={noise.prefill_sd!r}, overhead_sd={noise.overhead_sd!r})")
    t = coverage(sweep, dataclasses.replace(base, ttft_overhead_s=over, noise=noise), reps)
    # the deterministic model (the traces' fit, no noise) with a band of the same relative width
    d = coverage(sweep, base, reps)
    half = t.rel_width.to_numpy() / 2 * d.pred_mean.to_numpy()
    t["det_pred_mean"] = d.pred_mean.to_numpy()
    t["det_inside_same_width"] = (np.abs(t.measured - d.pred_mean.to_numpy()) <= half).to_numpy()
    t["det_inside_own_band"] = d.inside.to_numpy()
    t["det_rel_error"] = d.rel_error.to_numpy()
    t.to_csv(OUT / "fit_noise_insample.csv", index=False)
    print("in sample: coverage / median |rel. error| / median rel. width; deterministic model: own band's "
          "coverage, coverage with the same width, median |rel. error|:")
    plot(t, OUT / "fit_noise_bands.png")
    print(t.groupby("metric").agg(coverage=("inside", "mean"), abs_err=("rel_error", lambda e: e.abs().median()),
                                  width=("rel_width", "median"), det_own=("det_inside_own_band", "mean"),
                                  det_same_width=("det_inside_same_width", "mean"),
                                  det_abs_err=("det_rel_error", lambda e: e.abs().median())).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
