"""Does a prefill (context) attention kernel's time add its memory and compute
times, or overlap them (a roofline, max)? A test on the vLLM kernel
microbenchmarks (``../shared/data/gpu-kernels/<gpu>/attention``).

The microbenchmarks time fresh prefills only (``step`` is 0 throughout: no
cached prefix), so the test uses the axes they vary: batch, prompt length s,
query heads and KV heads. Per GPU (its fastest context-attention kernel, as
``experiments/fit_roofline.py`` picks it) three forms are fitted in log
space (robust soft-L1 loss, as the package's fit):

* ``compute``: t0 + F / (eta_c P)                      (the package's form)
* ``sum``:     t0 + F / (eta_c P) + B / (eta_m W)
* ``max``:     t0 + max(F / (eta_c P), B / (eta_m W))

with F = 4 b h d s^2 / 2 the causal FLOPs, B = 2 b s d (2 h + 2 h_kv) the
bytes of Q, K, V read and O written, P the BF16 peak and W the DRAM
bandwidth. Printed: each form's median and 90th-percentile absolute relative
error over all rows, and over the rows near the ridge (memory time between a
quarter and four times the compute time at the max form's efficiencies),
where the forms differ most.

Run: ``python experiments/ctx_attention_form.py [--quick]`` (``--quick``: one GPU, the H100).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fit_roofline import GPUS, newest, read_system  # noqa: E402


def data(g):
    d = newest(g, "attention", "context_attention_perf.parquet")
    d = d[(d.kv_cache_dtype == "bfloat16") & ((d.window_size == 0) if "window_size" in d else True)]
    d = d[~d.kernel_source.str.contains("decode")]
    best = d.groupby("kernel_source").latency.median().idxmin()
    d = d[d.kernel_source == best]
    b, s, h, hk, hd = (d[c].to_numpy(float) for c in ("batch_size", "isl", "num_heads", "num_key_value_heads",
                                                       "head_dim"))
    f = 4.0 * b * h * hd * s * s / 2
    by = 2.0 * b * s * hd * (2 * h + 2 * hk)
    return best, f, by, d.latency.to_numpy() * 1e-3, int(d.step.max())


def model(form, p, f, by, spec):
    tc = f / (p[0] * spec["bfloat16_tc_flops"])
    if form == "compute":
        return p[1] + tc
    tm = by / (p[2] * spec["mem_bw"])
    return p[1] + (tc + tm if form == "sum" else np.maximum(tc, tm))


def fit(form, f, by, y, spec):
    x0 = np.log([0.4, 5e-6] + ([] if form == "compute" else [0.5]))
    r = least_squares(lambda lp: np.log(model(form, np.exp(lp), f, by, spec)) - np.log(y), x0,
                      loss="soft_l1", f_scale=0.1)
    return np.exp(r.x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one GPU (the H100) rather than all five")
    args = ap.parse_args(argv)
    print("gpu\tkernel\tmax_step\tform\teta_c\tt0_us\teta_m\tmed_err\tp90_err\tridge_n\tridge_med\tridge_p90")
    for g in (["h100_sxm"] if args.quick else GPUS):
        spec = read_system(g)
        best, f, by, y, step = data(g)
        pm = fit("max", f, by, y, spec)
        tc = f / (pm[0] * spec["bfloat16_tc_flops"])
        tm = by / (pm[2] * spec["mem_bw"])
        ridge = (tm > 0.25 * tc) & (tm < 4 * tc) & (tc > 4 * pm[1])
        for form in ("compute", "sum", "max"):
            p = fit(form, f, by, y, spec)
            e = np.abs(model(form, p, f, by, spec) / y - 1)
            em = p[2] if p.size > 2 else float("nan")
            print(f"{g}\t{best}\t{step}\t{form}\t{p[0]:.3f}\t{p[1] * 1e6:.2f}\t{em:.3f}\t{np.median(e):.3f}\t"
                  f"{np.percentile(e, 90):.3f}\t{ridge.sum()}\t{np.median(e[ridge]):.3f}\t"
                  f"{np.percentile(e[ridge], 90):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
