"""Calibrate the step-time model on the packaged A10G decode traces and plot the fit.

Prints the fitted parameters (with standard errors and meaning), the per-batch
diagnostics (measured mean step vs fitted, relative error), the TTFT fit
(prefill cost per token and client overhead) and its caveats, a sanity check
against the low-load serving sweep (not used in the fit), and saves
``experiments/output/calibration_a10g.png``: the measured step-time
distribution per batch size against the fitted curve, and TTFT vs batch size.

Run: ``python experiments/calibrate_a10g.py``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastsim._calibration import PACKAGED_TRACES, PRESETS, fit_tpot_traces  # noqa: E402

OUT = ROOT / "experiments" / "output"
SWEEP = ROOT / "experiments" / "data" / "serving_sweep.csv"   # the published sweep, unmodified
LENGTHS = ROOT / "fastsim" / "data" / "sharegpt_lengths.csv"


def v1_rules_check(lm) -> str:
    """The TTFT fit under vLLM V1's rules: each trace run (``b`` requests of ~20 prompt tokens sent
    together to an idle server, 48 output tokens) simulated with the synchronous loop and with async
    scheduling, the full-input gate and the null block. An idle server schedules the batch at once
    either way, so the rules cannot move the fitted ``ttft_overhead_s``; the async lag only appears
    when a request arrives while a step runs (the serving sweep, ``experiments/fit_noise.py``)."""
    import fastsim

    lines = []
    for b in (1, 2, 4, 8, 16, 32):
        req = pd.DataFrame({"arrival_s": np.zeros(b), "prompt_len": np.full(b, 20), "output_len": np.full(b, 48)})
        out = []
        for v1 in (False, True):
            eng = fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=6822, max_num_batched_tokens=2048,
                                       max_model_len=2048, async_scheduling=v1, scheduler_reserve_full_isl=v1,
                                       null_block=v1)
            sc = fastsim.Scenario(engine=eng, latency=lm, workload=fastsim.Workload(arrival_rate=1.0, num_requests=b))
            sim = fastsim.simulate_requests(sc, req)
            out.append((sim.ttft_s.median(), ((sim.e2e_s - sim.ttft_s) / 47).mean()))
        lines.append(f"b={b:2d}: median TTFT sync {out[0][0] * 1e3:.3f} ms, V1 {out[1][0] * 1e3:.3f} ms; "
                     f"TPOT sync {out[0][1] * 1e3:.4f} ms, V1 {out[1][1] * 1e3:.4f} ms")
    return ("TTFT and TPOT of the trace runs simulated with the synchronous loop and with vLLM V1's rules "
            "(async scheduling, gate, null block):\n  " + "\n  ".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Fit the A10G step-time model to the packaged decode-step traces.")
    ap.add_argument("--quick", action="store_true", help="the same (the fit takes about a second); accepted "
                                                          "like every experiment's --quick")
    ap.add_argument("--out", type=Path, default=OUT, help=f"directory of the figure (default {OUT})")
    args = ap.parse_args(argv)
    out_dir = args.out
    res = fit_tpot_traces(PACKAGED_TRACES)
    print(res.report())
    print()
    print("publisher's own fit (alpha fixed at 1.25):", json.load(open(PACKAGED_TRACES))["fit"])
    preset = PRESETS["a10g-qwen2.5-1.5b"]
    same = all(abs(preset[k] - float(res.params[k])) <= 1e-6 * max(abs(preset[k]), 1e-300)
               for k in ("base_s", "decode_scale_s", "decode_alpha", "prefill_per_token_s"))
    print(f"PRESETS['a10g-qwen2.5-1.5b'] matches this fit: {same}")

    # Sanity check (NOT a fit): TTFT at the lowest serving-sweep load, where a request
    # mostly finds the engine idle or lightly loaded: overhead + base + p * prompt.
    if SWEEP.exists() and LENGTHS.exists():
        sweep = pd.read_csv(SWEEP)
        low = sweep.sort_values("arrival_rate").iloc[0]
        prompts = pd.read_csv(LENGTHS)["prompt_len"].to_numpy()[:300]
        lm = res.latency_model()
        pred = res.ttft_overhead_s + lm.step_time(0, prompts)
        print(f"\nsanity check vs serving sweep at {low['arrival_rate']} req/s (not fitted): "
              f"predicted idle-server TTFT mean {pred.mean():.4f} s, median {np.median(pred):.4f} s; "
              f"measured mean {low['mean_ttft_s']:.4f} s, p50 {low['p50_ttft_s']:.4f} s; "
              f"predicted TPOT at b=1 {lm.step_time(1):.5f} s vs measured mean TPOT "
              f"{low['mean_tpot_s']:.5f} s")

    print(v1_rules_check(res.latency_model()))

    # ---- plot ----
    out_dir.mkdir(parents=True, exist_ok=True)
    data = json.load(open(PACKAGED_TRACES))
    meas = sorted(data["measurements"], key=lambda m: m["batch_size"])
    bs = [m["batch_size"] for m in meas]
    gaps = [np.concatenate([r["step_deltas_s"] for r in m["requests"]]) * 1e3 for m in meas]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    pos = np.log2(bs)
    parts = ax.violinplot([np.clip(g, None, 15.0) for g in gaps], positions=pos, widths=0.7,
                          showextrema=False)
    for pc in parts["bodies"]:
        pc.set_alpha(0.35)
    rng = np.random.default_rng(0)
    for x, g in zip(pos, gaps):
        ax.scatter(x + 0.12 * rng.standard_normal(g.size), np.clip(g, None, 15.0), s=2, alpha=0.15,
                   color="C0")
    d = res.diagnostics
    ax.plot(pos, d["mean_step_s"] * 1e3, "ks", label="measured mean step")
    bgrid = np.linspace(1, 32, 200)
    lm = res.latency_model()
    p, se = res.params, res.stderr
    ax.plot(np.log2(bgrid), lm.step_time(bgrid) * 1e3, "r-", lw=2,
            label=(f"fit: {p['base_s'] * 1e3:.3f} ms + {p['decode_scale_s'] * 1e6:.1f} us "
                   f"(b-1)^{p['decode_alpha']:.3f}"))
    ax.set_xticks(pos, [str(b) for b in bs])
    ax.set_xlabel("decode batch size b")
    ax.set_ylabel("inter-token gap (ms; clipped at 15)")
    ax.set_ylim(5.5, 15.5)
    ax.set_title(f"A10G / Qwen2.5-1.5B decode step (max |rel err| of mean {res.max_rel_error:.2%})")
    ax.legend(loc="upper left", fontsize=8)

    td = res.ttft_diagnostics
    for m in meas:
        t = np.array([r["ttft_s"] for r in m["requests"]]) * 1e3
        ax2.scatter(np.full(t.size, m["batch_size"]), t, s=10, alpha=0.4, color="C0")
    ok = ~td["outlier"]
    ax2.plot(td.loc[ok, "batch_size"], td.loc[ok, "median_ttft_s"] * 1e3, "ks", label="median TTFT")
    ax2.plot(td.loc[~ok, "batch_size"], td.loc[~ok, "median_ttft_s"] * 1e3, "rx", ms=10,
             label="outlier (not fitted)")
    bb = np.linspace(1, 32, 100)
    ax2.plot(bb, (res.ttft_overhead_s + lm.step_time(0, bb * 20)) * 1e3, "r-",
             label=(f"overhead {res.ttft_overhead_s * 1e3:.1f}+/-{se['ttft_overhead_s'] * 1e3:.1f} ms"
                    f" + step(b*20 prompt tok), p = {p['prefill_per_token_s'] * 1e6:.0f}+/-"
                    f"{se['prefill_per_token_s'] * 1e6:.0f} us/tok"))
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(bs, [str(b) for b in bs])
    ax2.set_xlabel("requests started together b")
    ax2.set_ylabel("TTFT (ms)")
    ax2.set_title("TTFT vs b (prefill of b x ~20 tokens; poorly identified)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "calibration_a10g.png"
    fig.savefig(path, dpi=130)
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
