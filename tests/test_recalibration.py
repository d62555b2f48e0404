"""The V1 recalibration's pieces (experiments/vllm_a10g_validation.py, fit_noise.py,
deployment_validation.py; docs/validation.md, "Recalibration with vLLM V1's rules").

* The warm prefix cache between the sweep's runs: which rows are warm (independent
  count of one run's blocks), the shortened prompts (what a request with every prompt
  block cached schedules), and the shortcut against the reference simulator's prefix
  caching by block hash on the previous and the current run back to back.
* The traces' TTFT fit is not moved by the V1 rules (an idle server schedules at once).
* The RTX 4090 replay's block identities: chained, full blocks only.
* The refitted preset: the V1 rules' fit in the preset ``"a10g-qwen2.5-1.5b"``, the old fit
  kept in the validation script for the "before" rows.
"""

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fastsim
from fastsim._calibration import NOISE_PRESETS

ROOT = Path(__file__).resolve().parents[1]


def _module(name):
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        spec = importlib.util.spec_from_file_location(f"recal_{name}", ROOT / "experiments" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "experiments"))


@pytest.fixture(scope="module")
def val():
    return _module("vllm_a10g_validation")


@pytest.fixture(scope="module")
def sweep(val):
    return pd.read_csv(val.SWEEP)


def test_warm_lengths_schedule_only_the_uncached_tail(val):
    for bs in (16, 32):
        full = fastsim.sharegpt_lengths("replay")
        warm = val.warm_lengths(bs)
        p, q = full.prompt_len.astype(np.int64), warm.prompt_len
        # vLLM hits floor((P - 1) / bs) blocks: 1 .. bs tokens are left to compute
        assert np.all((q >= 1) & (q <= bs))
        assert np.all((p - q) % bs == 0)
        assert np.all((p - q) // bs == (p - 1) // bs)
        np.testing.assert_array_equal(warm.output_len, full.output_len)
        assert warm.order == "replay"


def test_warm_rows_are_those_whose_previous_run_stayed_cached(val, sweep):
    lengths = fastsim.sharegpt_lengths("replay")
    p, o = lengths.prompt_len[:300], lengths.output_len[:300]
    blocks = sum(int(np.ceil((a + b) / 16)) for a, b in zip(p, o))   # counted another way
    assert val.run_blocks(16) == blocks
    for _, row in sweep.iterrows():
        first = row.arrival_rate == sweep.arrival_rate.min()
        fits = blocks <= row.kv_cache_blocks - 1       # the null block is not usable
        assert val.warm_prefix_cache(row, sweep) == (not first and fits)
    # the sweep has both: the smallest cache (gmu 0.3) holds less than one run, the others more
    assert (sweep.kv_cache_blocks - 1 < blocks).any() and (sweep.kv_cache_blocks - 1 >= blocks).any()


def test_warm_shortcut_agrees_with_block_hash_caching_in_the_reference(val, sweep):
    """The reference runs the previous run and this one back to back with prefix caching by
    block hash; the kernel runs this one alone with the shortened prompts: equal hits, and
    first-token and finish times within 1e-9 s (the check raises otherwise)."""
    row = next(r for _, r in sweep.iterrows() if val.warm_prefix_cache(r, sweep))
    line = val.check_warm_model(row, fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b"), seed=3, n=25)
    assert "as assumed" in line


def test_scenario_for_sets_the_v1_rules(val, sweep):
    row = sweep.iloc[9]
    lm = fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b")
    sync, v1 = val.scenario_for(row, lm, True), val.scenario_for(row, lm, True, v1=True, warm=True)
    for name in ("async_scheduling", "scheduler_reserve_full_isl", "null_block"):
        assert getattr(v1.engine, name) and not getattr(sync.engine, name)
    assert v1.engine.num_gpu_blocks == sync.engine.num_gpu_blocks == row.kv_cache_blocks
    assert v1.engine.usable_gpu_blocks == row.kv_cache_blocks - 1
    assert v1.workload.mean_prompt_len < sync.workload.mean_prompt_len


def test_v1_rules_leave_the_traces_ttft_fit_alone(capsys):
    """Every trace run starts on an idle server: the V1 rules give the same TTFT and TPOT."""
    cal = _module("calibrate_a10g")
    text = cal.v1_rules_check(fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b-deterministic"))
    found = re.findall(r"TTFT sync ([0-9.]+) ms, V1 ([0-9.]+) ms; TPOT sync ([0-9.]+) ms, V1 ([0-9.]+) ms", text)
    assert len(found) == 6
    assert all(t[0] == t[1] and t[2] == t[3] for t in found)


def test_rtx_block_hashes_are_chained_full_blocks():
    dv = _module("deployment_validation")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 100_000, 70)
    b = a.copy()
    b[40] += 1                      # differs in the third 16-token block
    c = a[:47]                      # the same first 47 tokens: 2 full blocks
    ha, hb, hc = dv.block_hashes([a, b, c])
    assert len(ha) == 4 and len(hb) == 4 and len(hc) == 2
    assert list(ha[:2]) == list(hb[:2]) == list(hc)
    assert ha[2] != hb[2] and ha[3] != hb[3]          # a block's identity carries everything before it
    assert len(set(ha)) == 4


def test_preset_carries_the_v1_refit_and_the_script_keeps_the_old_fit(val):
    lm = fastsim.LatencyModel.preset("a10g-qwen2.5-1.5b")
    fit = NOISE_PRESETS["a10g-qwen2.5-1.5b"]
    assert lm.ttft_overhead_s == fit["ttft_overhead_s"]
    for k, v in fit["noise"].items():
        assert getattr(lm.noise, k) == v
    old = val.before_model()
    assert old.ttft_overhead_s == val.BEFORE_FIT["ttft_overhead_s"] != lm.ttft_overhead_s
    assert old.noise.prefill_log_mean == val.BEFORE_FIT["noise"]["prefill_log_mean"]
    # the step-time coefficients (the traces' fit) and their covariance are shared
    for k in ("base_s", "decode_scale_s", "decode_alpha", "prefill_per_token_s"):
        assert getattr(old, k) == getattr(lm, k)
    np.testing.assert_array_equal(np.asarray(old.noise.calibration_cov), np.asarray(lm.noise.calibration_cov))
