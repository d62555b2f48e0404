"""A roofline step-time model of one vLLM engine step, evaluated in Python.

Per step and per tensor-parallel rank, from the batch's composition:

* the weight GEMMs of every layer (QKV, output projection, MLP or the MoE
  experts the batch's tokens touch), each ``t0 + max(FLOPs / (eta_c * peak),
  bytes / (eta_m * bandwidth))``: memory bound for a few tokens (the weights
  are read once per step), compute bound for many;
* attention: a fixed time per decoding sequence (the microbenchmarks' decode
  attention has one), the KV bytes the decoding sequences and the prefill chunks read
  (their contexts), and the FLOPs of the prefill chunks (``4 * heads *
  head_dim`` per query-key pair, causal), added (the kernel microbenchmarks
  show a prefill's KV bytes adding to its compute time, not hidden under it:
  ``experiments/ctx_attention_form.py``);
* the LM head over the sequences that sample a token;
* two all-reduces per layer when ``tensor_parallel_size > 1``;
* a fixed per-step overhead (scheduler, sampler, launches) and an optional
  multiplicative correction, both 0 / 1 unless calibrated.

The efficiencies ``eta`` and fixed latencies ``t0`` of the four kernel
families are fitted to vLLM kernel microbenchmarks on five GPUs
(``experiments/fit_roofline.py`` -> ``fastsim/data/roofline_efficiencies.json``);
a GPU without microbenchmarks borrows those of its ``roofline_class``.

The simulation kernel evaluates the roofline itself, per step
(:meth:`Roofline.to_kernel_latency`, a :class:`RooflineLatency`; what
``Deployment(...).latency`` gives); :meth:`Roofline.to_latency_model` maps
it onto the kernel's regression form instead, over an operating range, and
reports the mapping's error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from importlib import resources

import numpy as np

from ._hardware import DTYPES, GPU, KV_DTYPES, get_gpu
from ._latency import LatencyModel
from ._models import ModelSpec
from ._validation import check_float

_EFF = json.loads(resources.files("fastsim").joinpath("data/roofline_efficiencies.json").read_text())
FAMILIES = ("gemm", "gen_attn", "ctx_attn", "allreduce")


def efficiencies(gpu_class: str | None = None, *, exclude: str | None = None) -> dict:
    """Fitted kernel efficiencies of a microbenchmarked GPU (``"h100_sxm"``...),
    or the median over them (``None``), optionally leaving one GPU out."""
    if gpu_class is not None and exclude is None:
        if gpu_class not in _EFF["gpus"]:
            raise ValueError(f"roofline_class must be one of {sorted(_EFF['gpus'])} or '', got {gpu_class!r}")
        return {k: tuple(_EFF["gpus"][gpu_class][k]["params"]) for k in FAMILIES}
    keep = [g for g in _EFF["gpus"] if g != exclude]
    return {k: tuple(float(v) for v in np.median([_EFF["gpus"][g][k]["params"] for g in keep], axis=0))
            for k in FAMILIES}


@dataclass(frozen=True)
class RooflineMapping:
    """How well the kernel's regression form reproduces the roofline (relative errors)."""

    median_abs_rel_error: float
    p90_abs_rel_error: float
    max_abs_rel_error: float
    decode_max_abs_rel_error: float
    n_points: int
    operating_range: dict


@dataclass(frozen=True)
class Roofline:
    """Roofline step time of a model on a GPU (per tensor-parallel rank).

    Build it with :meth:`from_deployment` (or directly). ``step_time`` is
    vectorised over its array arguments.

    Parameters
    ----------
    model : ModelSpec
    gpu : GPU
    tensor_parallel_size : int
    weight_bytes : int
        Bytes per GEMM weight (2 for BF16, 1 for FP8).
    kv_bytes : int
        Bytes per KV element.
    eff : dict, optional
        Kernel efficiencies per family (see :func:`efficiencies`); by default
        those of the GPU's ``roofline_class``.
    step_overhead_s : float
        Fixed time added to every step (calibrated; 0 by default).
    per_seq_overhead_s : float
        Time added per scheduled sequence (vLLM's per-request CPU work:
        input preparation, sampling, detokenisation; calibrated; 0 by default).
    time_scale : float
        Multiplies the kernel time (calibrated; 1 by default).
    """

    model: ModelSpec
    gpu: GPU
    tensor_parallel_size: int = 1
    weight_bytes: int = 2
    kv_bytes: int = 2
    eff: dict = field(default=None)
    step_overhead_s: float = 0.0
    per_seq_overhead_s: float = 0.0
    time_scale: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "model", ModelSpec.from_config(self.model))
        object.__setattr__(self, "gpu", get_gpu(self.gpu))
        if self.eff is None:
            object.__setattr__(self, "eff", efficiencies(self.gpu.roofline_class or None))
        object.__setattr__(self, "step_overhead_s", check_float("step_overhead_s", self.step_overhead_s, low=0))
        object.__setattr__(self, "per_seq_overhead_s", check_float("per_seq_overhead_s", self.per_seq_overhead_s,
                                                                   low=0))
        object.__setattr__(self, "time_scale", check_float("time_scale", self.time_scale, low=0, low_open=True))

    @classmethod
    def from_deployment(cls, dep, **kwargs) -> "Roofline":

        return cls(model=dep.spec, gpu=dep.gpu, tensor_parallel_size=dep.tensor_parallel_size,
                   weight_bytes=1 if dep.quantization == "fp8" else DTYPES[dep.dtype],
                   kv_bytes=KV_DTYPES[dep.kv_cache_dtype] or DTYPES[dep.dtype], **kwargs)

    # ---- the parts -----------------------------------------------------------------------------

    def _gemm(self, m, n, k):
        """Time of an (m x k) @ (k x n) GEMM with the weight (k x n) read once."""
        eta_c, eta_m, t0 = self.eff["gemm"]
        peak = self.gpu.peak_flops("fp8" if self.weight_bytes == 1 else "bfloat16")
        flops = 2.0 * m * n * k
        nbytes = self.weight_bytes * float(n) * k + 2.0 * m * (n + k)
        return t0 + np.maximum(flops / (eta_c * peak), nbytes / (eta_m * self.gpu.bandwidth_bytes_s))

    def layer_gemm_time(self, tokens):
        """Weight GEMMs of one layer for ``tokens`` tokens (array), seconds."""
        sp, tp = self.model, self.tensor_parallel_size
        t = np.asarray(tokens, dtype=float)
        h, hd = sp.hidden_size, sp.head_dim
        q = sp.num_attention_heads // tp * hd
        kv = sp.kv_heads_per_rank(tp) * hd
        out = self._gemm(t, q + 2 * kv, h) + self._gemm(t, h, q)
        if sp.is_moe:
            e, k = sp.num_experts, sp.num_experts_per_tok
            # expected distinct experts touched by t tokens routed uniformly (k of e each)
            touched = e * (1.0 - (1.0 - k / e) ** t)
            m = np.where(touched > 0, t * k / np.maximum(touched, 1e-300), 0.0)
            im = sp.moe_intermediate_size // tp
            out = out + touched * (self._gemm(m, 2 * im, h) + self._gemm(m, h, im)) + self._gemm(t, e, h)
            if sp.shared_expert_intermediate_size:
                ish = sp.shared_expert_intermediate_size // tp
                out = out + self._gemm(t, 2 * ish, h) + self._gemm(t, h, ish)
        else:
            i = sp.intermediate_size // tp
            out = out + self._gemm(t, 2 * i, h) + self._gemm(t, h, i)
        return np.where(t > 0, out, 0.0)

    def step_time(self, num_decode, decode_context_tokens=0, num_prefill_tokens=0, prefill_pairs=0,
                  num_prefill_seqs=None, prefill_context_tokens=None):
        """Duration of one engine step, seconds (vectorised).

        Parameters
        ----------
        num_decode : array_like
            Decoding sequences (one token each).
        decode_context_tokens : array_like
            KV tokens the decoding sequences read (sum of their contexts).
        num_prefill_tokens : array_like
            Prompt tokens computed in the step (prefill chunks).
        prefill_pairs : array_like
            Causal query-key pairs of the prefill chunks: ``sum s * (k + (s + 1) / 2)``
            for a chunk of ``s`` tokens after ``k`` already in the cache
            (:meth:`chunk_pairs`).
        num_prefill_seqs : array_like, optional
            Prefilling sequences that sample a token (LM head rows); default:
            one if there are prefill tokens.
        prefill_context_tokens : array_like, optional
            KV tokens the prefill chunks' attention reads, ``sum k + s`` (their cached
            context and their own tokens); default ``num_prefill_tokens`` (fresh chunks).
        """
        sp, tp, g = self.model, self.tensor_parallel_size, self.gpu
        nd = np.asarray(num_decode, dtype=float)
        ctx = np.asarray(decode_context_tokens, dtype=float)
        npf = np.asarray(num_prefill_tokens, dtype=float)
        pairs = np.asarray(prefill_pairs, dtype=float)
        nps = (npf > 0).astype(float) if num_prefill_seqs is None else np.asarray(num_prefill_seqs, dtype=float)
        pctx = npf if prefill_context_tokens is None else np.asarray(prefill_context_tokens, dtype=float)
        tokens = nd + npf
        L = sp.num_hidden_layers
        t = L * self.layer_gemm_time(tokens)
        # attention: decode reads the KV of every context token; prefill computes its causal
        # pairs and reads its chunks' KV (context and own tokens) besides, at the decode
        # attention's bandwidth efficiency (the form its efficiency was fitted with)
        eta_ga, t0_ga, ts_ga = self._gen_attn()
        kv_layer = 2 * sp.kv_heads_per_rank(tp) * sp.head_dim * self.kv_bytes
        t = t + L * np.where(nd > 0, t0_ga + ts_ga * nd + ctx * kv_layer / (eta_ga * g.bandwidth_bytes_s), 0.0)
        eta_ca, t0_ca = self.eff["ctx_attn"]
        fl = 4.0 * pairs * (sp.num_attention_heads // tp) * sp.head_dim
        t = t + L * np.where(npf > 0, t0_ca + fl / (eta_ca * g.peak_flops("bfloat16"))
                             + pctx * kv_layer / (eta_ga * g.bandwidth_bytes_s), 0.0)
        # LM head (vocab-parallel) for the sampled rows
        rows = nd + nps
        eh = np.where(rows > 0, self._gemm_bf16(rows, sp.padded_vocab() // tp, sp.hidden_size), 0.0)
        t = t + eh
        if tp > 1:
            eta_l, t0_l = self.eff["allreduce"]
            msg = tokens * sp.hidden_size * 2 * 2 * (tp - 1) / tp
            t = t + 2 * L * (t0_l + msg / (eta_l * g.interconnect_gbs * 1e9))
        out = self.step_overhead_s + self.per_seq_overhead_s * (nd + nps) + self.time_scale * t
        out = np.where(tokens > 0, out, 0.0)
        return out[()] if out.ndim == 0 else out

    def _gen_attn(self):
        """The decode attention's (bandwidth efficiency, fixed time, time per decoding
        sequence); an ``eff`` of two entries (without the last) has none per sequence."""
        e = tuple(self.eff["gen_attn"])
        return e if len(e) == 3 else (*e, 0.0)

    def _gemm_bf16(self, m, n, k):
        return replace(self, weight_bytes=2, eff=self.eff)._gemm(m, n, k) if self.weight_bytes != 2 \
            else self._gemm(m, n, k)

    @staticmethod
    def chunk_pairs(chunk, context=0):
        """Causal query-key pairs of a prefill chunk of ``chunk`` tokens after ``context`` cached ones."""
        s = np.asarray(chunk, dtype=float)
        return s * (np.asarray(context, dtype=float) + (s + 1) / 2)

    def decode_step(self, batch, context_per_seq=0):
        """Step time of ``batch`` decoding sequences with ``context_per_seq`` KV tokens each."""
        b = np.asarray(batch, dtype=float)
        return self.step_time(b, b * context_per_seq)

    # ---- calibration of the two corrections -----------------------------------------------------

    def calibrated(self, batch, step_s, context_per_seq=0, *, fit_scale: bool = False) -> "Roofline":
        """Fit the corrections to measured decode steps (non-negative, relative
        least squares): ``step = step_overhead_s + per_seq_overhead_s * b +
        time_scale * roofline(b)``, with ``time_scale`` fixed at 1 unless
        ``fit_scale`` (over a narrow range of ``b`` it is confounded with the
        overhead: the weight-read time hardly changes with ``b``)."""
        from scipy.optimize import nnls

        b = np.asarray(batch, dtype=float)
        y = np.asarray(step_s, dtype=float)
        x = replace(self, step_overhead_s=0.0, per_seq_overhead_s=0.0, time_scale=1.0).decode_step(b, context_per_seq)
        if fit_scale:
            a = np.column_stack([np.ones_like(x), b, x]) / y[:, None]
            (c0, c1, c2), _ = nnls(a, np.ones_like(y))
        else:
            a = np.column_stack([np.ones_like(x), b]) / y[:, None]
            (c0, c1), _ = nnls(a, 1.0 - x / y)
            c2 = 1.0
        return replace(self, step_overhead_s=float(c0), per_seq_overhead_s=float(c1), time_scale=float(max(c2, 1e-6)))

    def calibrated_from_vllm_bench(self, paths, *, min_steps: int = 10) -> "Roofline":
        """Fit ``step_overhead_s`` and ``per_seq_overhead_s`` to ``vllm bench serve`` runs.

        The runs (``--save-result --save-detailed``, with ``start_times``) are
        rebuilt as in :meth:`LatencyModel.from_vllm_bench`; for each gap
        without a prefill the decoding requests and their KV contexts (prompt
        plus tokens emitted so far) are known, so the roofline's kernel time
        of that step is computed exactly and the remainder ``gap - kernel``
        is an observation of ``step_overhead_s + per_seq_overhead_s * b``.
        Its median per batch size ``b`` (bins of at least ``min_steps``
        distinct steps, i.e. ``b * min_steps`` gaps; medians, because a client
        gap may span bunched chunks) is fitted by non-negative least squares
        weighted by the square root of the steps. ``time_scale`` stays 1.

        Raises
        ------
        ValueError
            A file of another kind, runs without ``start_times``, or fewer
            than two batch sizes with ``min_steps`` pure-decode steps.
        """
        from scipy.optimize import nnls

        from ._calibration import read_vllm_bench_json

        runs = list(paths) if isinstance(paths, (list, tuple)) else [paths]
        if not runs:
            raise ValueError("paths: got an empty list of runs")
        kernel = replace(self, step_overhead_s=0.0, per_seq_overhead_s=0.0, time_scale=1.0)
        bs, rs = [], []
        for run in runs:
            df = read_vllm_bench_json(run)
            df = df[df["success"]].reset_index(drop=True)
            st = df["start_time_s"].to_numpy()
            if len(df) == 0 or not np.all(np.isfinite(st)):
                raise ValueError("vllm bench serve result needs per-request start_times (recent vLLM) and at "
                                 "least one successful request to rebuild the batches")
            b, ctx, y = _decode_gaps(df)
            rs.append(y - kernel.step_time(b, ctx))
            bs.append(b)
        b, r = np.concatenate(bs), np.concatenate(rs)
        levels, counts = np.unique(b, return_counts=True)
        # the b requests of a step all observe it: a bin holds counts / b distinct steps
        steps = counts / levels
        ok = steps >= min_steps
        levels, steps = levels[ok], steps[ok]
        if levels.size < 2:
            raise ValueError(f"need pure-decode gaps at >= 2 batch sizes with >= {min_steps} distinct steps each, "
                             f"got {levels.size}; pool more runs or lower min_steps")
        med = np.array([np.median(r[b == lv]) for lv in levels])
        w = np.sqrt(steps)  # a bin's median is as precise as its number of distinct steps allows
        (c0, c1), _ = nnls(np.column_stack([np.ones_like(levels), levels]) * w[:, None], med * w)
        return replace(self, step_overhead_s=float(c0), per_seq_overhead_s=float(c1), time_scale=1.0)

    # ---- the kernel's roofline record ---------------------------------------------------------

    def _gemm_entry(self, n, k, mult, weight_bytes=None):
        """The kernel's GEMM entry (t0, a, b, c) of an (rows x k) @ (k x n) GEMM run ``mult`` times
        per step and scaled by ``time_scale``: its time is t0 + max(a rows, b + c rows) (`_gemm`)."""
        wb = self.weight_bytes if weight_bytes is None else weight_bytes
        eta_c, eta_m, t0 = self.eff["gemm"]
        peak = self.gpu.peak_flops("fp8" if wb == 1 else "bfloat16")
        bw = self.gpu.bandwidth_bytes_s
        f = mult * self.time_scale
        return (f * t0, f * 2.0 * n * k / (eta_c * peak), f * wb * float(n) * k / (eta_m * bw),
                f * 2.0 * (n + k) / (eta_m * bw))

    def kernel_record(self) -> dict:
        """The roofline's coefficients as the kernel reads them (``kernel.layout`` ``L_R_*``
        and ``L_CTX``), by slot name: every time multiplied by the layers it runs in and by
        ``time_scale``."""
        sp, tp, g = self.model, self.tensor_parallel_size, self.gpu
        L = float(sp.num_hidden_layers)
        s = self.time_scale
        h, hd = sp.hidden_size, sp.head_dim
        q = sp.num_attention_heads // tp * hd
        kv = sp.kv_heads_per_rank(tp) * hd
        gemms = [self._gemm_entry(q + 2 * kv, h, L), self._gemm_entry(h, q, L)]
        moe = (0.0, 0.0, 0.0)
        expert = [(0.0,) * 4, (0.0,) * 4]
        if sp.is_moe:
            e, k = sp.num_experts, sp.num_experts_per_tok
            im = sp.moe_intermediate_size // tp
            gemms.append(self._gemm_entry(e, h, L))   # the router
            if sp.shared_expert_intermediate_size:
                ish = sp.shared_expert_intermediate_size // tp
                gemms += [self._gemm_entry(2 * ish, h, L), self._gemm_entry(h, ish, L)]
            moe = (float(e), float(k), 1.0 - k / e)
            expert = [self._gemm_entry(2 * im, h, L), self._gemm_entry(h, im, L)]
        else:
            i = sp.intermediate_size // tp
            gemms += [self._gemm_entry(2 * i, h, L), self._gemm_entry(h, i, L)]
        eta_ga, t0_ga, ts_ga = self._gen_attn()
        eta_ca, t0_ca = self.eff["ctx_attn"]
        kv_layer = 2 * sp.kv_heads_per_rank(tp) * hd * self.kv_bytes
        ar_t0 = ar_tok = 0.0
        if tp > 1:
            eta_l, t0_l = self.eff["allreduce"]
            ar_t0 = 2 * L * s * t0_l
            ar_tok = 2 * L * s * h * 2 * 2 * (tp - 1) / tp / (eta_l * g.interconnect_gbs * 1e9)
        return {
            "over": self.step_overhead_s, "per_seq": self.per_seq_overhead_s, "gemms": gemms,
            "moe_e": moe[0], "moe_k": moe[1], "moe_q": moe[2], "expert": expert,
            "ga_t0": L * s * t0_ga, "ga_seq": L * s * ts_ga,
            "ctx": s * L * kv_layer / (eta_ga * g.bandwidth_bytes_s),
            "ca_t0": L * s * t0_ca,
            "ca_pair": s * L * 4.0 * (sp.num_attention_heads // tp) * hd / (eta_ca * g.peak_flops("bfloat16")) / 2,
            "lm": self._gemm_entry(sp.padded_vocab() // tp, h, 1.0, weight_bytes=2),
            "ar_t0": ar_t0, "ar_tok": ar_tok,
        }

    def to_kernel_latency(self, *, swap_s_per_block=0.0, ttft_overhead_s=0.0, noise=None,
                          **mapping) -> "RooflineLatency":
        """This roofline as the kernel evaluates it, step by step (a :class:`RooflineLatency`).

        Parameters
        ----------
        swap_s_per_block : float
            Time to move one KV block to or from CPU swap space (as :class:`LatencyModel`'s).
        ttft_overhead_s : float
            Client-side time added to first-token and completion times (as :class:`LatencyModel`'s).
        noise : StepNoise, optional
            Per-step noise only (per-run effects are refused).
        **mapping
            The operating range of :meth:`to_latency_model`, whose mapping the result's
            regression fields hold (``.regression``) for what needs the regression form.
        """
        reg = self.to_latency_model(ttft_overhead_s=ttft_overhead_s, **mapping)
        return RooflineLatency(base_s=reg.base_s, decode_scale_s=reg.decode_scale_s, decode_alpha=reg.decode_alpha,
                               prefill_per_token_s=reg.prefill_per_token_s, ctx_per_token_s=reg.ctx_per_token_s,
                               ttft_overhead_s=ttft_overhead_s, swap_s_per_block=swap_s_per_block,
                               calibration=reg.calibration, noise=noise, roofline=self)

    # ---- mapping onto the kernel's regression form ----------------------------------------------

    def to_latency_model(self, *, max_num_seqs=256, max_num_batched_tokens=8192, max_context=8192,
                         ttft_overhead_s=0.0) -> LatencyModel:
        """The :class:`LatencyModel` closest to this roofline over an operating range.

        ``base_s + decode_scale_s * (b - 1) ** alpha`` is fitted (relative
        least squares) to the decode steps without context at ``b = 1 ..
        max_num_seqs``; ``ctx_per_token_s`` is the decode attention's exact
        cost per KV token; ``prefill_per_token_s`` is the least-squares slope
        of fresh prefill chunks of up to ``max_num_batched_tokens`` tokens
        (after their context term, which both charge them). The
        mapping's error over a mixed grid (decode batches with contexts up to
        ``max_context`` per sequence, with and without a prefill chunk) is in
        the result's ``calibration`` attribute (a :class:`RooflineMapping`).
        """
        from scipy.optimize import least_squares

        sp = self.model
        b = np.unique(np.round(np.geomspace(1, max(max_num_seqs, 2), 40)))
        td = self.decode_step(b, 0)
        base0 = float(td[0])
        eta_ga = self.eff["gen_attn"][0]
        c_ctx = self.time_scale * sp.num_hidden_layers * 2 * sp.kv_heads_per_rank(self.tensor_parallel_size) \
            * sp.head_dim * self.kv_bytes / (eta_ga * self.gpu.bandwidth_bytes_s)
        x = b - 1.0

        def resid(th):
            base, sc, al = th
            return (base + sc * x ** al) / td - 1.0

        sc0 = max((td[-1] - base0) / max(x[-1], 1.0), 1e-9)
        r = least_squares(resid, [base0, sc0, 1.0], bounds=([1e-9, 0.0, 0.05], [np.inf, np.inf, 5.0]),
                          x_scale=[base0, sc0, 1.0])
        base, sc, al = (float(v) for v in r.x)
        n = np.unique(np.round(np.linspace(max(16, max_num_batched_tokens // 16), max_num_batched_tokens, 16)))
        tp_ = self.step_time(0, 0, n, self.chunk_pairs(n, 0))
        extra = tp_ - base - c_ctx * n
        c_pf = max(float(n @ extra / (n @ n)), 0.0)
        lm = LatencyModel(base_s=base, decode_scale_s=sc, decode_alpha=al, prefill_per_token_s=c_pf,
                          ctx_per_token_s=c_ctx, ttft_overhead_s=ttft_overhead_s)
        # mapping error on a mixed grid
        bb, cc, ch = np.meshgrid(np.unique(np.round(np.geomspace(1, max(max_num_seqs, 2), 12))),
                                 np.linspace(0, max_context, 6),
                                 np.concatenate([[0], np.linspace(64, max_num_batched_tokens, 4)]), indexing="ij")
        bb, cc, ch = bb.ravel(), cc.ravel(), ch.ravel()
        ch = np.minimum(ch, np.maximum(max_num_batched_tokens - bb, 0))
        roof = self.step_time(bb, bb * cc, ch, self.chunk_pairs(ch, 0))
        mapped = lm.step_time(bb, ch, bb * cc + ch)
        err = np.abs(mapped / roof - 1)
        dec = ch == 0
        object.__setattr__(lm, "calibration", RooflineMapping(
            median_abs_rel_error=float(np.median(err)), p90_abs_rel_error=float(np.percentile(err, 90)),
            max_abs_rel_error=float(err.max()), decode_max_abs_rel_error=float(err[dec].max()),
            n_points=int(err.size),
            operating_range={"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                             "max_context": max_context}))
        return lm


def _decode_gaps(df):
    """Pure-decode inter-token gaps of one bench run: (decoding requests, their summed KV context,
    gap length). A gap of request i spans (t_k, t_k+1]; the requests decoding at its midpoint are
    those whose first token came before and last after it; each one's context is its prompt plus
    the tokens it had emitted by then. Gaps in which some request emitted its first token (a
    prefill ran) are left out."""
    first = (df["start_time_s"] + df["ttft_s"]).to_numpy()
    times = [f + np.concatenate([[0.0], np.cumsum(g)]) for f, g in zip(first, df["itls_s"])]
    lo = np.concatenate([t[:-1] for t in times])
    hi = np.concatenate([t[1:] for t in times])
    mid = 0.5 * (lo + hi)
    plen = df["input_len"].to_numpy(dtype=float)
    n = np.zeros_like(mid)
    ctx = np.zeros_like(mid)
    prefill = np.zeros(mid.shape, dtype=bool)
    for t, p in zip(times, plen):
        k = np.searchsorted(t, mid, side="right")   # tokens emitted by mid
        running = (k >= 1) & (k < t.size)
        n += running
        ctx += np.where(running, p + k, 0.0)
        prefill |= (t[0] > lo) & (t[0] <= hi)        # a first token arrived with this gap
    keep = ~prefill & (hi > lo) & (n >= 1)
    return n[keep], ctx[keep], (hi - lo)[keep]


@dataclass(frozen=True)
class RooflineLatency(LatencyModel):
    """A :class:`Roofline` evaluated by the simulation kernel at every step.

    Build it with :meth:`Roofline.to_kernel_latency` (``Deployment(...).latency``).
    A step of ``n_decode`` decoders, ``n_prefill_tokens`` prefill tokens in
    chunks of ``s_i`` tokens after ``k_i`` cached ones, and
    ``n_context_tokens`` KV tokens (as for :class:`LatencyModel`) lasts::

        over + per_seq * rows + sum_g gemm_g(t) + touched(t) * expert(t k / touched(t))
             + (ga_t0 + ga_seq * n_decode) [n_decode > 0] + (ca_t0 + ca_pair * sum_i s_i (2 k_i + s_i + 1)) [prefill]
             + lm_head(rows) + ar_t0 + ar_tok * t + ctx * n_context_tokens + swap_s_per_block * n_swap_blocks

    with ``t = n_decode + n_prefill_tokens`` the step's tokens, ``rows`` the
    scheduled sequences, each GEMM ``t0 + max(a rows, b + c rows)`` and
    ``touched(t) = E (1 - (1 - k/E)^t)`` (:meth:`Roofline.kernel_record`),
    added in this order. The decode attention's memory term charges every
    context token of the step (the prefill chunks' contexts too, which their
    attention reads as well, as :meth:`Roofline.step_time` charges them:
    ``prefill_context_tokens``). The regression fields are :meth:`Roofline.to_latency_model`'s
    mapping (``regression``); the kernel does not read them.

    Parameters
    ----------
    roofline : Roofline
        The step-time model.
    """

    roofline: Roofline = None

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.roofline, Roofline):
            raise ValueError(f"roofline must be a fastsim.Roofline, got {type(self.roofline).__name__}")
        if self.noise is not None and self.noise.per_run:
            raise ValueError("noise: per-run effects (speed_sd, prefill_sd, overhead_sd, the calibration's "
                             "covariance) scale the regression coefficients and do not apply to the roofline; "
                             "use per-step noise (jitter_sd, stall_prob) or the regression model "
                             "(RooflineLatency.regression)")

    def __hash__(self):
        # (the roofline's efficiencies are a dict: hash its repr, as equal rooflines print alike)
        return hash((self.regression, repr(self.roofline)))

    @property
    def regression(self) -> LatencyModel:
        """The regression mapping of the roofline (:meth:`Roofline.to_latency_model`)."""
        return LatencyModel(base_s=self.base_s, decode_scale_s=self.decode_scale_s, decode_alpha=self.decode_alpha,
                            prefill_per_token_s=self.prefill_per_token_s, ctx_per_token_s=self.ctx_per_token_s,
                            ttft_overhead_s=self.ttft_overhead_s, swap_s_per_block=self.swap_s_per_block,
                            calibration=self.calibration, noise=self.noise)

    def deterministic(self) -> "RooflineLatency":
        """The same roofline without its noise (``noise=None``)."""
        return replace(self, noise=None)

    def _params(self) -> np.ndarray:
        """The latency record: the regression slots 0.0 but for the context slope and the swap
        term, the noise slots, then the roofline's (`kernel.layout` ``L_R_*``)."""
        from .kernel import layout as K

        out = super()._params()
        rec = self.roofline.kernel_record()
        if len(rec["gemms"]) > K.N_R_GEMM:
            raise ValueError(f"roofline: {len(rec['gemms'])} GEMM entries, the kernel holds {K.N_R_GEMM}")
        out[K.L_BASE] = 0.0
        out[K.L_DECODE_SCALE] = 0.0
        out[K.L_DECODE_ALPHA] = 1.0
        out[K.L_PREFILL] = 0.0
        out[K.L_CTX] = rec["ctx"]
        out[K.L_ROOF] = 1.0
        out[K.L_R_OVER] = rec["over"]
        out[K.L_R_PER_SEQ] = rec["per_seq"]
        out[K.L_R_NGEMM] = len(rec["gemms"])
        out[K.L_R_MOE_E], out[K.L_R_MOE_K], out[K.L_R_MOE_Q] = rec["moe_e"], rec["moe_k"], rec["moe_q"]
        out[K.L_R_GA_T0] = rec["ga_t0"]
        out[K.L_R_GA_SEQ] = rec["ga_seq"]
        out[K.L_R_CA_T0] = rec["ca_t0"]
        out[K.L_R_CA_PAIR] = rec["ca_pair"]
        out[K.L_R_AR_T0] = rec["ar_t0"]
        out[K.L_R_AR_TOK] = rec["ar_tok"]
        out[K.L_R_LM:K.L_R_LM + 4] = rec["lm"]
        out[K.L_R_MOE_GEMM:K.L_R_MOE_GEMM + 8] = np.concatenate(rec["expert"])
        for j, e in enumerate(rec["gemms"]):
            out[K.L_R_GEMM + 4 * j:K.L_R_GEMM + 4 * j + 4] = e
        return out

    def step_time(self, num_decode, num_prefill_tokens=0, num_context_tokens=0, num_swap_blocks=0, *,
                  prefill_pairs2=None, num_prefill_seqs=None):
        """The kernel's step time (vectorised over array arguments).

        Parameters
        ----------
        num_decode, num_prefill_tokens, num_context_tokens, num_swap_blocks : array_like of int
            As for :meth:`LatencyModel.step_time`.
        prefill_pairs2 : array_like of int, optional
            Twice the causal query-key pairs of the prefill chunks, ``sum s (2 k + s + 1)``;
            by default one fresh chunk, ``n (n + 1)``.
        num_prefill_seqs : array_like of int, optional
            Prefilling sequences; by default one if there are prefill tokens.

        Returns
        -------
        numpy.ndarray or float
            Step duration in seconds.
        """
        rec = self.roofline.kernel_record()
        nd = np.asarray(num_decode, dtype=float)
        npf = np.asarray(num_prefill_tokens, dtype=float)
        nc = np.asarray(num_context_tokens, dtype=float)
        nsw = np.asarray(num_swap_blocks, dtype=float)
        p2 = npf * (npf + 1.0) if prefill_pairs2 is None else np.asarray(prefill_pairs2, dtype=float)
        nps = (npf > 0).astype(float) if num_prefill_seqs is None else np.asarray(num_prefill_seqs, dtype=float)

        def gemm(e, r):
            return e[0] + np.maximum(e[1] * r, e[2] + e[3] * r)

        t = nd + npf
        rows = nd + nps
        d = rec["over"] + rec["per_seq"] * rows
        for e in rec["gemms"]:
            d = d + gemm(e, t)
        if rec["moe_e"] > 0:
            with np.errstate(divide="ignore", invalid="ignore"):
                touched = rec["moe_e"] * (1.0 - rec["moe_q"] ** t)
                m = t * rec["moe_k"] / touched
                d = d + np.where(t > 0, touched * (gemm(rec["expert"][0], m) + gemm(rec["expert"][1], m)), 0.0)
        d = d + np.where(nd > 0, rec["ga_t0"] + rec["ga_seq"] * nd, 0.0)
        d = d + np.where(npf > 0, rec["ca_t0"] + rec["ca_pair"] * p2, 0.0)
        d = d + np.where(rows > 0, gemm(rec["lm"], rows), 0.0)
        d = d + (rec["ar_t0"] + rec["ar_tok"] * t)
        d = d + rec["ctx"] * nc
        d = d + np.where(nsw > 0, self.swap_s_per_block * nsw, 0.0)
        return d[()] if d.ndim == 0 else d
