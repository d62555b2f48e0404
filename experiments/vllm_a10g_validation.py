"""Validate fastsim against measured vLLM serving runs (A10G / Qwen2.5-1.5B-Instruct).

For every row of ``experiments/data/serving_sweep.csv`` (32 ``vllm bench serve``
runs: arrival rate 0.5-8 req/s x gpu_memory_utilization 0.3/0.5/0.7/0.9; see
``experiments/data/README.md``) this simulates the same server
(``EngineConfig(max_num_seqs, num_gpu_blocks=kv_cache_blocks,
max_num_batched_tokens, block_size, max_model_len)``) under the same requests
(rows 0..299 of the packaged ShareGPT trace, ``fastsim.sharegpt_lengths("replay")``,
replayed in order) with no warm-up (vllm's 8 warm-up requests finish before the
benchmark starts), and compares each measured metric with the simulator's
prediction: the mean over replications and the 2.5-97.5 % band of the
per-replication values (one replication = one benchmark run, so the band is
where a single measured run should fall 95 % of the time).

Every prediction variant is one plain ``fastsim.replicate(scenario, n, seed=...,
n_threads=1)`` call per row; its ``per_replication`` columns are the per-run
benchmark metrics. None has a constant tuned to the sweep:

* ``poisson``: the plain ``Workload`` (Poisson arrivals, first request at t = 0);
* ``vllm``: ``Workload(normalize_arrivals=True)``, the arrival process
  ``vllm bench serve`` uses (n exponential gaps summed and rescaled so that the
  last request is sent at exactly ``n / rate``; the throughput window starts at
  t = 0, before the first request);
* each with (``+overhead``) and without the client-side ``ttft_overhead_s``, which
  the package adds to TTFT, E2E and the end of the throughput window (not to
  TPOT/ITL); these four use the A10G preset as it was fitted with the synchronous
  engine (:func:`before_model`, ``BEFORE_FIT``: 17.5 ms and its noise), and
  ``vllm+overhead`` is the "before" of ``docs/validation.md``;
* ``vllm+overhead+ctx``: a sensitivity check, not a candidate model (see
  :func:`context_sensitivity_model`);
* ``v1, before fit``, ``v1``, ``v1+warm``: vLLM 0.22's V1 rules (:data:`V1_RULES`)
  with the old fit, with the A10G preset by name, ``LatencyModel.preset("a10g-qwen2.5-1.5b")`` (refitted with those rules by
  ``experiments/fit_noise.py``), and with that and the warm prefix cache between the
  sweep's runs where the previous run's blocks stayed cached
  (:func:`warm_prefix_cache`, :func:`warm_lengths`, checked against the reference
  simulator's prefix caching by block hash by :func:`check_warm_model`). ``v1+warm``
  is the headline, the "after".

The kernel's random streams depend only on the seed, the replication index and
the workload laws, so all rows and variants use common random numbers: rows at
one rate share their arrival stream replication by replication, as the sweep's
rows share vllm's seeded arrival sequence.

Outputs (``experiments/output/``): ``vllm_a10g_validation.csv`` (one line per
row x metric x variant), ``vllm_a10g_validation_summary.csv`` (the targets per
variant), ``vllm_a10g_validation_diagnostics.csv`` (per-row mechanism
diagnostics) and ``vllm_a10g_validation.png`` (relative error per metric vs
arrival rate, headline variant).

Run (full: 32 rows x 8 variants x 200 replications, about 2 min on 2 shared cores)::

    NUMBA_CACHE_DIR=/tmp/nbcache python experiments/vllm_a10g_validation.py

or ``--quick`` (4 rows x 30 replications, for the test suite).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import PercentFormatter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastsim  # noqa: E402
from fastsim._calibration import NOISE_PRESETS  # noqa: E402

SWEEP = ROOT / "experiments" / "data" / "serving_sweep.csv"
OUT = ROOT / "experiments" / "output"
PRESET = "a10g-qwen2.5-1.5b"
NUM_REQUESTS = 300

#: (simulated name = replicate() per_replication column, column of serving_sweep.csv, label,
#: unit scale for printing, unit)
METRICS = [
    ("ttft_mean", "mean_ttft_s", "mean TTFT", 1e3, "ms"),
    ("ttft_p50", "p50_ttft_s", "p50 TTFT", 1e3, "ms"),
    ("ttft_p95", "p95_ttft_s", "p95 TTFT", 1e3, "ms"),
    ("ttft_p99", "p99_ttft_s", "p99 TTFT", 1e3, "ms"),
    ("request_throughput", "request_throughput", "request throughput", 1.0, "req/s"),
    ("tpot_mean", "mean_tpot_s", "mean TPOT", 1e3, "ms"),
    ("tpot_p99", "p99_tpot_s", "p99 TPOT", 1e3, "ms"),
    ("output_throughput", "output_throughput_tok_s", "output throughput", 1.0, "tok/s"),
]
METRIC_NAMES = [m[0] for m in METRICS]

#: Targets of the validation: median |relative error| of the predicted mean ...
REL_ERROR_TARGETS = {"tpot_mean": 0.03, "request_throughput": 0.02, "ttft_mean": 0.10}
#: ... and the fraction of rows whose measured value is inside the single-run 95 % band.
COVERAGE_METRICS = ("ttft_mean", "ttft_p99", "tpot_mean", "request_throughput")
COVERAGE_TARGET = 0.90

#: vLLM 0.22's V1 rules as ``EngineConfig`` switches (``docs/engine-model.md``, "vLLM V1 rules"). The
#: fourth, prefix caching by block hash, matters here only between runs (distinct prompts, no
#: preemption): :func:`warm_prefix_cache`.
V1_RULES = {"async_scheduling": True, "scheduler_reserve_full_isl": True, "null_block": True,
            "enable_prefix_caching": False}
#: The synchronous engine (`EngineConfig`'s defaults are vLLM 0.22's, all on). Both keep prefix
#: caching off: the replayed prompts share nothing, and a warm cache is `warm_lengths`'s.
SYNC_RULES = {"async_scheduling": False, "scheduler_reserve_full_isl": False, "null_block": False,
              "enable_prefix_caching": False}

#: The A10G preset's fitted client overhead and noise before the V1 refit (synchronous engine, every
#: run cold; ``experiments/fit_noise.py --rules sync --no-warm``), kept to reproduce the "before" rows.
BEFORE_FIT = {
    "ttft_overhead_s": 0.01747249660680036,
    "noise": {"jitter_sd": 0.0, "stall_prob": 0.0, "stall_mean_s": 0.0,
              "speed_log_mean": 0.026412098626376085, "speed_sd": 0.010611197473343928,
              "prefill_log_mean": -0.6009230425382931, "prefill_sd": 0.4784493989059713,
              "overhead_sd": 0.0024060627570847834},
}


def before_model() -> fastsim.LatencyModel:
    """The A10G preset as it was fitted with the synchronous engine (:data:`BEFORE_FIT`)."""
    det = fastsim.LatencyModel.preset(PRESET + "-deterministic")
    cov = fastsim.LatencyModel.preset(PRESET).noise.calibration_cov    # the traces' fit: unchanged
    return dataclasses.replace(det, ttft_overhead_s=BEFORE_FIT["ttft_overhead_s"],
                               noise=fastsim.StepNoise(**BEFORE_FIT["noise"], calibration_cov=cov))


#: Variants: name -> (normalize_arrivals, client-side overhead, context-cost sensitivity model,
#: V1 rules, warm prefix cache where :func:`warm_prefix_cache` says so, latency fit: "before" =
#: :func:`before_model`, "after" = the noisy preset by name, refitted with the V1 rules).
VARIANTS = {
    "poisson": (False, False, False, False, False, "before"),
    "poisson+overhead": (False, True, False, False, False, "before"),
    "vllm": (True, False, False, False, False, "before"),
    "vllm+overhead": (True, True, False, False, False, "before"),
    "vllm+overhead+ctx": (True, True, True, False, False, "before"),
    "v1, before fit": (True, True, False, True, False, "before"),
    "v1": (True, True, False, True, False, "after"),
    "v1+warm": (True, True, False, True, True, "after"),
}
#: The variant the headline table, plot and docs use (chosen on the evidence, see docs/validation.md).
HEADLINE = "v1+warm"
#: The synchronous model with the old fit: the "before" of docs/validation.md's table.
BEFORE = "vllm+overhead"
#: Sensitivity variant: vllm arrivals + overhead + the traces' own KV-context cost (not a fit to the sweep).
SENSITIVITY = "vllm+overhead+ctx"


# ------------------------------------------------------------------------------------------
# Scenarios

def scenario_for(row: pd.Series, latency: fastsim.LatencyModel, normalize_arrivals: bool, *,
                 v1: bool = False, warm: bool = False) -> fastsim.Scenario:
    """One sweep row: its server, the 300 replayed requests, no warm-up.

    ``v1``: vLLM 0.22's V1 rules (:data:`V1_RULES`: async scheduling, the full-input
    admission gate, the null block; ``num_gpu_blocks`` is then the count vLLM reported).
    ``warm``: the run finds the prompts of the server's previous run in its prefix cache
    (:func:`warm_prefix_cache`, :func:`warm_lengths`)."""
    engine = fastsim.EngineConfig(
        max_num_seqs=int(row.max_num_seqs), num_gpu_blocks=int(row.kv_cache_blocks),
        max_num_batched_tokens=int(row.max_num_batched_tokens), block_size=int(row.block_size),
        max_model_len=int(row.max_model_len), **(V1_RULES if v1 else SYNC_RULES))
    lengths = warm_lengths(int(row.block_size)) if warm else fastsim.sharegpt_lengths("replay")
    workload = fastsim.Workload(arrival_rate=float(row.arrival_rate), num_requests=NUM_REQUESTS,
                                lengths=lengths, warmup_requests=0,
                                normalize_arrivals=normalize_arrivals)
    return fastsim.Scenario(engine=engine, workload=workload, latency=latency)


def run_blocks(block_size: int) -> int:
    """KV blocks the 300 requests of one run leave behind in vLLM's prefix cache: every
    request's prompt and output, ``ceil((P + O) / block_size)`` blocks each (vLLM caches
    full blocks of generated tokens too, and frees a finished request's blocks into the
    evictable queue)."""
    lengths = fastsim.sharegpt_lengths("replay")
    p = lengths.prompt_len[:NUM_REQUESTS].astype(np.int64)
    o = lengths.output_len[:NUM_REQUESTS].astype(np.int64)
    return int(np.sum(-(-(p + o) // block_size)))


def warm_prefix_cache(row: pd.Series, sweep: pd.DataFrame) -> bool:
    """Whether this run starts with the previous run's prompts in vLLM's prefix cache.

    The sweep replays the same 300 prompts at every rate, and vLLM 0.22 serves with
    prefix caching on, so a run on a server that already served the sweep's previous
    rate finds its prompts cached, **if** the whole previous run's blocks stayed cached:
    vLLM evicts the least recently freed block first, and a run that replays the same
    requests in the same order through a cache smaller than one run's blocks evicts
    each block before it is asked for again (the cyclic LRU pattern: no hit at all).
    So a row is warm when (1) it is not the first run of its server (assumed: one
    server per ``gpu_memory_utilization``, rates run in increasing order; the data
    carry no run order, but the lowest rate's p99 TTFT is the cold one at every gmu)
    and (2) :func:`run_blocks` fits in the usable blocks (``kv_cache_blocks - 1``).
    Checked against the reference simulator's prefix caching by block hash on the
    previous and the current run back to back (``check_warm_model``)."""
    first = row.arrival_rate == sweep[sweep.gpu_memory_utilization == row.gpu_memory_utilization].arrival_rate.min()
    return bool(not first and run_blocks(int(row.block_size)) <= int(row.kv_cache_blocks) - 1)


def warm_lengths(block_size: int) -> fastsim.LengthTrace:
    """The replayed lengths as a run with every prompt block cached computes them.

    A new request hits ``floor((P - 1) / block_size)`` cached blocks (vLLM recomputes
    at least the last prompt token), so it schedules ``P - block_size * floor((P - 1) /
    block_size)`` prompt tokens (1 to ``block_size``). With the KV cache never binding
    (at most 15 % used here) and no context cost in the step-time model, a run of these
    shortened prompts schedules the same tokens in the same steps as vLLM's warm run
    (``check_warm_model`` compares them request by request); only the KV blocks held
    differ, by the cached ones."""
    lengths = fastsim.sharegpt_lengths("replay")
    p = lengths.prompt_len.astype(np.int64)
    return fastsim.LengthTrace(p - block_size * ((p - 1) // block_size), lengths.output_len, order="replay")


def check_warm_model(row: pd.Series, latency: fastsim.LatencyModel, seed: int, n: int | None = 60) -> str:
    """The warm-cache shortcut against the reference simulator's prefix caching by block hash.

    The reference runs the first ``n`` requests (``None``: all 300) of replication 0 twice,
    back to back (the server's previous run, then this one, its arrivals shifted past the
    first run's end), with the V1 rules and ``enable_prefix_caching=True,
    block_hash_caching=True`` (each prompt's blocks have their own identities, the same in
    both runs). Where the previous run's blocks fit in the cache (:func:`run_blocks`; always
    for ``n`` < 300 here) every prompt block is hit and the kernel runs the second pass
    with :func:`warm_lengths`; where they do not (gmu 0.3 with all 300 requests), LRU
    eviction must leave no hit and the kernel runs the full prompts. Deterministic steps.
    Returns a line; raises if the hits or the first-token or finish times differ."""
    from fastsim._reference import simulate_reference

    det = latency.deterministic()
    sc = scenario_for(row, det, True, v1=True)
    req = fastsim.sample_requests(sc, seed=seed, replication=0)
    n = len(req) if n is None else n
    req = req.iloc[:n]
    a, p, o = (req[c].to_numpy() for c in ("arrival_s", "prompt_len", "output_len"))
    bs = int(row.block_size)
    hashes = [np.arange(-(-int(x) // bs), dtype=np.int64) + 1_000_000 * i for i, x in enumerate(p)]
    shift = a[-1] + 1000.0                                     # the first run has drained by then
    eng = dataclasses.replace(sc.engine, enable_prefix_caching=True, block_hash_caching=True)
    ref = simulate_reference(np.concatenate([a, a + shift]), np.concatenate([p, p]), np.concatenate([o, o]),
                             np.zeros(2 * n, np.int64), eng, det, block_hashes=hashes + hashes, hash_block_size=bs)
    hit = np.asarray(ref["cached_tokens"])[n:]
    blocks = int(np.sum(-(-(p + o) // bs)))
    fits = blocks <= eng.usable_gpu_blocks
    prompts = warm_lengths(bs).prompt_len[:n] if fits else p
    mine = fastsim.simulate_requests(sc, pd.DataFrame({"arrival_s": a, "prompt_len": prompts, "output_len": o}))
    diff = max(np.max(np.abs(np.asarray(ref["first_token_s"])[n:] - shift - mine.first_token_s.to_numpy())),
               np.max(np.abs(np.asarray(ref["finish_s"])[n:] - shift - mine.finish_s.to_numpy())))
    if not (np.array_equal(hit, p - prompts) and diff < 1e-9):
        raise RuntimeError(f"warm-cache shortcut disagrees with the reference: hits {hit.sum()} vs "
                           f"{(p - prompts).sum()}, max time difference {diff:.3g} s")
    return (f"warm-cache check (rate {row.arrival_rate:g}, gmu {row.gpu_memory_utilization:g}, {n} requests, "
            f"{blocks} blocks per run vs {eng.usable_gpu_blocks} usable): the reference with prefix caching by "
            f"block hash, previous run then this one, hits {int(hit.sum())} prompt tokens, as assumed; first-token "
            f"and finish times agree with the kernel on the {'shortened' if fits else 'full'} prompts to "
            f"{diff:.1e} s")


def context_sensitivity_model() -> tuple[fastsim.LatencyModel, float]:
    """SENSITIVITY ONLY (not a fit to the sweep): the preset plus the KV-context cost that the
    calibration traces themselves show, to test whether that mechanism explains the TPOT gap.

    In each decode trace all ``b`` requests decode, so every step adds ``b`` tokens of KV
    context; the Theil-Sen drift of the step time per step divided by ``b`` is a cost per
    context token. ``ctx_per_token_s`` = the median of that over ``b >= 2``. The decode curve
    is then refitted (least squares on the per-batch median steps) after removing that cost at
    the traces' own mean context (``b`` x (~20 prompt + 24 mean generated) tokens), so the
    context cost is not counted twice. ``prefill_per_token_s`` and ``ttft_overhead_s`` are kept.
    """
    from scipy.optimize import curve_fit

    from fastsim._calibration import DEFAULT_PROMPT_TOKENS, PACKAGED_TRACES, fit_tpot_traces

    lm = before_model()
    d = fit_tpot_traces(PACKAGED_TRACES, fit_prefill=False).diagnostics
    many = d.batch_size >= 2
    c = float(np.median(d.drift_s_per_step[many] / d.batch_size[many]))
    b = d.batch_size.to_numpy(float)
    y = d.median_step_s.to_numpy() - c * b * (DEFAULT_PROMPT_TOKENS + 24)

    def curve(b, base, scale, alpha):
        return base + scale * np.maximum(b - 1, 0) ** alpha

    (base, scale, alpha), _ = curve_fit(curve, b, y, p0=[lm.base_s, lm.decode_scale_s, lm.decode_alpha],
                                        bounds=([1e-4, 0, 0.1], [0.1, 0.01, 4]))
    return dataclasses.replace(lm, base_s=base, decode_scale_s=scale, decode_alpha=alpha,
                               ctx_per_token_s=c), c


def latency_models(with_sensitivity: bool) -> dict:
    """Latency model of each variant."""
    fits = {"before": before_model(), "after": fastsim.LatencyModel.preset(PRESET)}
    out = {}
    sens = context_sensitivity_model()[0] if with_sensitivity else None
    for name, (_, overhead, ctx, _, _, fit) in VARIANTS.items():
        if ctx:
            if sens is not None:
                out[name] = sens
        else:
            out[name] = fits[fit] if overhead else dataclasses.replace(fits[fit], ttft_overhead_s=0.0)
    return out


# ------------------------------------------------------------------------------------------
# Cross-checks (one row, one replication): the per-run values are the benchmark's metrics

def bench_metrics(sim: pd.DataFrame) -> dict:
    """Metrics of one ``simulate_requests`` run, computed as ``vllm bench serve`` does
    (``np.percentile``; TPOT over requests with output_len > 1; duration from the
    start, t = 0, to the last completion as the client sees it). ``ttft_s`` and
    ``e2e_s`` already include the model's ``ttft_overhead_s``."""
    done = (sim["status"] == "completed").to_numpy()
    ttft = sim["ttft_s"].to_numpy()[done]
    e2e = sim["e2e_s"].to_numpy()[done]
    out_len = sim["output_len"].to_numpy()[done]
    multi = out_len > 1
    tpot = (e2e[multi] - ttft[multi]) / (out_len[multi] - 1)
    duration = float((sim["arrival_s"].to_numpy()[done] + e2e).max())
    q = np.percentile(ttft, [50, 95, 99])
    return {
        "ttft_mean": ttft.mean(), "ttft_p50": q[0], "ttft_p95": q[1], "ttft_p99": q[2],
        "request_throughput": done.sum() / duration,
        "tpot_mean": tpot.mean(), "tpot_p99": np.percentile(tpot, 99),
        "output_throughput": out_len.sum() / duration,
    }


def cross_check(sc: fastsim.Scenario, res: fastsim.ReplicateResult, seed: int) -> float:
    """Max relative difference between ``simulate_requests`` on ``sample_requests``' stream of
    replication 0 (metrics by :func:`bench_metrics`) and ``replicate``'s replication 0."""
    req = fastsim.sample_requests(sc, seed=seed, replication=0)
    a = req["arrival_s"].to_numpy()
    n, rate = NUM_REQUESTS, sc.workload.arrival_rate
    if sc.workload.normalize_arrivals:   # vllm bench serve: first send after one gap, last at exactly n / rate
        assert a[0] > 0 and abs(a[-1] / (n / rate) - 1) < 1e-12, (a[0], a[-1])
    else:                                # Poisson: first arrival at t = 0
        assert a[0] == 0.0, a[0]
    mine = bench_metrics(fastsim.simulate_requests(sc, req))
    ref = res.per_replication.iloc[0]
    return max(abs(mine[m] / ref[m] - 1.0) for m in METRIC_NAMES)


def shared_streams(sweep: pd.DataFrame, lm: fastsim.LatencyModel, seed: int) -> str:
    """Check that rows at one rate simulate the same arrival stream (replication 1)."""
    rate, g = next(((r, g) for r, g in sweep.groupby("arrival_rate") if len(g) > 1), (None, None))
    if g is None:
        return "shared arrival streams: not checked (one row per rate)"
    streams = [fastsim.sample_requests(scenario_for(r, lm, True), seed=seed, replication=1)["arrival_s"]
               for _, r in g.iterrows()]
    same = all(np.array_equal(streams[0], s) for s in streams[1:])
    if not same:
        raise RuntimeError(f"rows at rate {rate} do not share their arrival stream")
    return f"shared arrival streams: the {len(g)} rows at {rate:g} req/s simulate identical arrivals"


# ------------------------------------------------------------------------------------------

def compare(sweep: pd.DataFrame, preds: dict) -> pd.DataFrame:
    """Long table: one line per row x variant x metric."""
    lines = []
    for (i, var), per in preds.items():
        row = sweep.loc[i]
        for name, col, *_ in METRICS:
            x = per[name].to_numpy()
            lo, hi = np.percentile(x, [2.5, 97.5])
            meas = float(row[col])
            mean = float(x.mean())
            lines.append({"row": i, "arrival_rate": row.arrival_rate,
                          "gpu_memory_utilization": row.gpu_memory_utilization,
                          "kv_cache_blocks": int(row.kv_cache_blocks), "variant": var, "metric": name,
                          "measured": meas, "pred_mean": mean, "pred_lo": lo, "pred_hi": hi,
                          "pred_std": float(x.std(ddof=1)), "n_replications": x.size,
                          "rel_error": mean / meas - 1.0, "inside_band": bool(lo <= meas <= hi)})
    return pd.DataFrame(lines)


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """The targets, per variant."""
    rows = []
    for var, t in table.groupby("variant", sort=False):
        r = {"variant": var}
        for m in METRIC_NAMES:
            tm = t[t.metric == m]
            r[f"{m}_median_abs_rel_error"] = float(tm.rel_error.abs().median())
            r[f"{m}_median_rel_error"] = float(tm.rel_error.median())
            r[f"{m}_coverage"] = float(tm.inside_band.mean())
        r["rel_error_targets_met"] = all(r[f"{m}_median_abs_rel_error"] <= v
                                         for m, v in REL_ERROR_TARGETS.items())
        r["coverage_targets_met"] = all(r[f"{m}_coverage"] >= COVERAGE_TARGET for m in COVERAGE_METRICS)
        rows.append(r)
    return pd.DataFrame(rows).set_index("variant")


def print_table(table: pd.DataFrame, variant: str) -> None:
    t = table[table.variant == variant]
    print(f"\n=== measured vs predicted, variant {variant!r} "
          f"(pred = mean over replications; band = 2.5-97.5 % of single runs) ===")
    for name, _, label, scale, unit in METRICS:
        tm = t[t.metric == name]
        print(f"\n{label} ({unit})")
        print(f"{'rate':>5} {'gmu':>4} {'measured':>10} {'predicted':>10} {'band':>21} {'rel.err':>8} in")
        for _, r in tm.iterrows():
            band = f"[{r.pred_lo * scale:.4g}, {r.pred_hi * scale:.4g}]"
            print(f"{r.arrival_rate:5.1f} {r.gpu_memory_utilization:4.1f} {r.measured * scale:10.4g} "
                  f"{r.pred_mean * scale:10.4g} {band:>21} {r.rel_error:+8.2%} {'Y' if r.inside_band else 'n'}")


def print_summary(summary: pd.DataFrame) -> None:
    print("\n=== targets: median |rel. error| of the predicted mean; coverage = measured inside "
          "the single-run 95 % band ===")
    head = (f"{'variant':<18}" + "".join(f"{'|err| ' + m:>24}" for m in REL_ERROR_TARGETS)
            + "".join(f"{'cov ' + m:>24}" for m in COVERAGE_METRICS))
    print(head)
    print(f"{'target':<18}" + "".join(f"{'<= ' + format(v, '.0%'):>24}" for v in REL_ERROR_TARGETS.values())
          + "".join(f"{'>= ' + format(COVERAGE_TARGET, '.0%'):>24}" for _ in COVERAGE_METRICS))
    for var, r in summary.iterrows():
        print(f"{var:<18}" + "".join(f"{r[f'{m}_median_abs_rel_error']:>24.2%}" for m in REL_ERROR_TARGETS)
              + "".join(f"{r[f'{m}_coverage']:>24.0%}" for m in COVERAGE_METRICS))
    others = [m for m in METRIC_NAMES if m not in REL_ERROR_TARGETS]
    print("other metrics, median |rel. error|:")
    for var, r in summary.iterrows():
        print(f"{var:<18}" + ", ".join(f"{m} {r[f'{m}_median_abs_rel_error']:.2%}" for m in others))


def plot(table: pd.DataFrame, variant: str, path: Path, title: str) -> None:
    """Relative error predicted / measured - 1 per metric vs arrival rate, one colour per gmu;
    the error bar is the single-run 95 % band on the same scale (band / measured - 1)."""
    t = table[table.variant == variant]
    gmus = sorted(t.gpu_memory_utilization.unique())
    rates = sorted(t.arrival_rate.unique())
    fig, axes = plt.subplots(2, 4, figsize=(18, 8.5))
    for ax, (name, _, label, _, _) in zip(axes.flat, METRICS):
        tm = t[t.metric == name]
        ax.axhline(0.0, color="k", lw=0.8)
        for k, g in enumerate(gmus):
            d = tm[tm.gpu_memory_utilization == g].sort_values("arrival_rate")
            x = d.arrival_rate.to_numpy() * 2 ** (0.06 * (k - (len(gmus) - 1) / 2))   # dodge
            err = d.rel_error.to_numpy()
            lo = d.pred_lo.to_numpy() / d.measured.to_numpy() - 1
            hi = d.pred_hi.to_numpy() / d.measured.to_numpy() - 1
            c = f"C{k}"
            ax.errorbar(x, err, yerr=[err - lo, hi - err], fmt="none", ecolor=c, elinewidth=2.5,
                        alpha=0.45, capsize=0)
            ax.plot(x, err, "-", color=c, lw=1.2, alpha=0.6, label=f"gmu {g:g}")
            inside = d.inside_band.to_numpy()
            ax.plot(x[inside], err[inside], "o", color=c, ms=5)
            ax.plot(x[~inside], err[~inside], "x", color=c, ms=7, mew=2)
        ax.set_xscale("log", base=2)
        ax.set_xticks(rates, [f"{v:g}" for v in rates])
        ax.minorticks_off()
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(alpha=0.3)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("predicted / measured - 1")
        ax.set_title(label)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    handles += [plt.Line2D([], [], ls="", marker="o", color="k", ms=5),
                plt.Line2D([], [], ls="", marker="x", color="k", ms=7, mew=2)]
    labels += ["measured inside band", "measured outside band"]
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.suptitle(title + "\npoint: predicted mean / measured - 1 (o: measured inside the single-run 95 % band, "
                 "x: outside); bar: the band on the same scale (band / measured - 1)", fontsize=10)
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def diagnostics(sweep: pd.DataFrame, table: pd.DataFrame, diag: pd.DataFrame, lm, overhead_s) -> list[str]:
    """Mechanism evidence (nothing here is fitted to the sweep). Returns printable lines."""
    head = HEADLINE
    lines = []
    lengths = fastsim.sharegpt_lengths("replay")
    last_out = int(lengths.output_len[NUM_REQUESTS - 1])

    lines.append("-- arrival process: vllm bench serve rescales its send times so the last request goes out "
                 f"at exactly {NUM_REQUESTS}/rate; then duration - {NUM_REQUESTS}/rate is the drain tail, "
                 f"mostly the decode of the last request ({last_out} output tokens)")
    tp = table[table.metric == "request_throughput"]
    for rate, g in sweep.groupby("arrival_rate"):
        thr = g.request_throughput
        tail = NUM_REQUESTS / thr - NUM_REQUESTS / rate
        pb = tp[(tp.variant == "poisson") & (tp.arrival_rate == rate)]
        pv = tp[(tp.variant == head) & (tp.arrival_rate == rate)]
        ptail = NUM_REQUESTS / pv.pred_mean - NUM_REQUESTS / rate
        lines.append(f"rate {rate:4.1f}: measured throughput range over the {len(g)} gmu rows "
                     f"{(thr.max() - thr.min()) / thr.mean():.3%}; measured tail {tail.min():.2f}-{tail.max():.2f} s, "
                     f"predicted ({head}) {ptail.mean():.2f} s; single-run band width: Poisson "
                     f"{((pb.pred_hi - pb.pred_lo) / pb.pred_mean).mean():.1%}, {head} "
                     f"{((pv.pred_hi - pv.pred_lo) / pv.pred_mean).mean():.2%}")

    lines.append("-- prefix cache between runs: p99 TTFT by gmu (mean over the rows at rates > the lowest, "
                 "ms): measured; predicted with every run cold (variant v1) and with the warm cache where "
                 "warm_prefix_cache says so (v1+warm)")
    p99 = table[(table.metric == "ttft_p99") & (table.arrival_rate > sweep.arrival_rate.min())]
    for g, d in p99.groupby("gpu_memory_utilization"):
        cold, warm = d[d.variant == "v1"], d[d.variant == head]
        lines.append(f"gmu {g:.1f}: measured {cold.measured.mean() * 1e3:5.1f} (range {cold.measured.min() * 1e3:.0f}-"
                     f"{cold.measured.max() * 1e3:.0f}); cold {cold.pred_mean.mean() * 1e3:5.1f}; "
                     f"v1+warm {warm.pred_mean.mean() * 1e3:5.1f}; in the v1+warm band {warm.inside_band.sum()} of "
                     f"{len(warm)}")
    lines.append("-- server-side run-to-run noise: rows at one rate share the arrival sequence and the "
                 "requests, no run preempted and KV is never binding (max predicted KV use below), so the "
                 f"synchronous, all-cold model ({BEFORE}) predicts the same value for every gmu; the measured "
                 "spread across gmu is the real server's own noise (and its cache state), compared with the "
                 "predicted single-run band width")
    th = table[table.variant == BEFORE]
    for m in COVERAGE_METRICS + ("ttft_p50",):
        parts = []
        for rate, g in th[th.metric == m].groupby("arrival_rate"):
            if len(g) < 2:
                continue
            spread = (g.measured.max() - g.measured.min()) / g.measured.mean()
            band = ((g.pred_hi - g.pred_lo) / g.pred_mean).mean()
            parts.append(f"{rate:g}: {spread:.1%}/{band:.1%}")
        if parts:
            lines.append(f"{m:<19} measured range / predicted band width, by rate: " + ", ".join(parts))
    same = th.groupby(["arrival_rate", "metric"]).pred_mean.agg(lambda x: x.max() / x.min() - 1).max()
    lines.append(f"max relative difference of the prediction across gmu at one rate: {same:.1e}")

    low = sweep.arrival_rate.min()
    t_low = th[(th.metric == "tpot_mean") & (th.arrival_rate == low)]
    from fastsim._calibration import PACKAGED_TRACES, fit_tpot_traces

    trace_b1 = fit_tpot_traces(PACKAGED_TRACES, fit_prefill=False).diagnostics.iloc[0]
    lines.append(f"-- decode step at low load ({low:g} req/s, mean running "
                 f"{diag[diag.arrival_rate == low].mean_running.mean():.2f}): base_s {lm.base_s * 1e3:.3f} ms, "
                 f"traces' measured mean step at b = {int(trace_b1.batch_size)} {trace_b1.mean_step_s * 1e3:.3f} ms; "
                 f"simulated mean TPOT {t_low.pred_mean.mean() * 1e3:.3f} ms; measured "
                 f"{t_low.measured.min() * 1e3:.3f}-{t_low.measured.max() * 1e3:.3f} ms "
                 f"({(t_low.pred_mean / t_low.measured - 1).mean():+.2%})")
    tt = table[table.metric == "tpot_mean"]
    for rate, g in tt[tt.variant == head].groupby("arrival_rate"):
        mr = diag[diag.arrival_rate == rate].mean_running.mean()
        sens = tt[(tt.variant == SENSITIVITY) & (tt.arrival_rate == rate)]
        extra = f"; {SENSITIVITY} {sens.rel_error.mean():+.2%}" if len(sens) else ""
        lines.append(f"rate {rate:4.1f}: mean running {mr:5.2f}; mean TPOT rel. error {g.rel_error.mean():+.2%}"
                     + extra)

    lines.append("-- TTFT at the lowest rate (server mostly idle): measured minus simulated-without-overhead, "
                 f"per statistic (a pure client constant would give the same number each time; the fitted "
                 f"ttft_overhead_s is {overhead_s * 1e3:.1f} ms)")
    tv = table[(table.variant == "vllm") & (table.arrival_rate == low)]
    p = lengths.prompt_len[:NUM_REQUESTS]
    qp = {"ttft_mean": p.mean(), "ttft_p50": np.percentile(p, 50), "ttft_p95": np.percentile(p, 95),
          "ttft_p99": np.percentile(p, 99)}
    for m in ("ttft_p50", "ttft_mean", "ttft_p95", "ttft_p99"):
        g = tv[tv.metric == m]
        lines.append(f"{m:<9}: {(g.measured - g.pred_mean).mean() * 1e3:6.1f} ms "
                     f"(prompt-length statistic of the 300 requests: {qp[m]:.0f} tokens; predicted prefill "
                     f"cost {lm.prefill_per_token_s * qp[m] * 1e3:.1f} ms)")
    lines.append(f"-- batch sizes and KV reached ({head} replications)")
    for r in diag.itertuples():
        lines.append(f"rate {r.arrival_rate:4.1f} gmu {r.gpu_memory_utilization:.1f}: mean running requests "
                     f"{r.mean_running:5.2f}, max KV utilisation {r.max_kv_utilization:6.1%}, "
                     f"preemptions {r.preemptions}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replications", type=int, default=None,
                    help="replications per row and variant (default 200; --quick: 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="4 rows (gmu 0.3 at 0.5, 2, 5, 8 req/s) x 30 replications")
    ap.add_argument("--no-sensitivity", action="store_true",
                    help="skip the context-cost sensitivity variant")
    ap.add_argument("--check-lru", action="store_true",
                    help="also check, with the reference simulator (1-2 min), that the smallest cache keeps no "
                         "prompt of the previous run (LRU eviction)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="where to write (default experiments/output; --quick adds a _quick suffix)")
    args = ap.parse_args(argv)
    n_rep = args.replications or (30 if args.quick else 200)
    if n_rep < 2:
        ap.error("--replications must be >= 2")
    out_dir = args.out_dir or OUT
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""

    t0 = time.perf_counter()
    sweep = full_sweep = pd.read_csv(SWEEP)
    if args.quick:
        sweep = sweep[(sweep.gpu_memory_utilization == 0.3) & sweep.arrival_rate.isin([0.5, 2.0, 5.0, 8.0])]
    lm = fastsim.LatencyModel.preset(PRESET)
    overhead_s = lm.ttft_overhead_s
    if overhead_s != NOISE_PRESETS[PRESET]["ttft_overhead_s"] or overhead_s <= 0:
        raise RuntimeError("the A10G preset does not carry the's fitted ttft_overhead_s")
    models = latency_models(not args.no_sensitivity)
    print(f"{len(sweep)} sweep rows x {len(models)} variants x {n_rep} replications, seed {args.seed}; "
          f"LatencyModel.preset({PRESET!r}) = {lm} (fitted ttft_overhead_s = {overhead_s * 1e3:.2f} ms)")
    if SENSITIVITY in models:
        s = models[SENSITIVITY]
        print(f"sensitivity variant {SENSITIVITY!r}: {s} (ctx cost {s.ctx_per_token_s * 1e6:.3f} us/token from "
              "the traces' within-run drift; decode curve refitted without it)")

    preds, diags = {}, []
    max_check = {}
    sim_s = 0.0
    for n_row, (i, row) in enumerate(sweep.iterrows()):
        for var, latency in models.items():
            norm, _, _, v1, warm, _ = VARIANTS[var]
            sc = scenario_for(row, latency, norm, v1=v1, warm=warm and warm_prefix_cache(row, full_sweep))
            res = fastsim.replicate(sc, n_rep, seed=args.seed, n_threads=1, progress=False)
            sim_s += res.elapsed_s
            preds[(i, var)] = res.per_replication[METRIC_NAMES]
            if n_row == 0:
                max_check[var] = cross_check(sc, res, args.seed)
            if var == HEADLINE:
                per = res.per_replication
                diags.append({"row": i, "arrival_rate": row.arrival_rate,
                              "gpu_memory_utilization": row.gpu_memory_utilization,
                              "mean_running": float((per["batch_occupancy_mean"] * sc.engine.max_num_seqs).mean()),
                              "max_kv_utilization": float((per["max_blocks_used"] / sc.engine.num_gpu_blocks).max()),
                              "preemptions": int(per["n_preemptions"].sum())})
    worst = max(max_check.values())
    print(f"cross-check (row {sweep.index[0]}, replication 0, every variant): simulate_requests on "
          f"sample_requests' stream, metrics computed as vllm bench serve does, agree with replicate()'s "
          f"per-replication values to {worst:.1e} (relative)")
    if worst > 1e-9:
        raise RuntimeError(f"simulate_requests and replicate() disagree: {max_check}")
    print(shared_streams(sweep, lm, args.seed))
    warm_rows = [r for _, r in sweep.iterrows() if warm_prefix_cache(r, full_sweep)]
    if warm_rows:
        print(check_warm_model(warm_rows[0], lm, args.seed))
    if args.check_lru:
        cold = full_sweep[full_sweep.gpu_memory_utilization == full_sweep.gpu_memory_utilization.min()]
        print(check_warm_model(cold.iloc[len(cold) // 2], lm, args.seed, n=None))

    table = compare(sweep, preds)
    summary = summarise(table)
    diag = pd.DataFrame(diags)
    print_table(table, HEADLINE)
    print_summary(summary)
    print("\n=== diagnostics (evidence; nothing fitted to the sweep) ===")
    print("\n".join(diagnostics(sweep, table, diag, lm, overhead_s)))

    table.to_csv(out_dir / f"vllm_a10g_validation{suffix}.csv", index=False)
    summary.to_csv(out_dir / f"vllm_a10g_validation{suffix}_summary.csv")
    diag.to_csv(out_dir / f"vllm_a10g_validation{suffix}_diagnostics.csv", index=False)
    plot(table, HEADLINE, out_dir / f"vllm_a10g_validation{suffix}.png",
         f"fastsim vs vLLM 0.22 (A10G, Qwen2.5-1.5B): relative error of the predicted mean, variant {HEADLINE}, "
         f"{n_rep} replications per row")
    print(f"\nwrote {out_dir}/vllm_a10g_validation{suffix}[.csv, _summary.csv, _diagnostics.csv, .png]; "
          f"replicate() {sim_s:.1f} s, total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
