"""Calibrating the step-time model (:class:`fastsim._latency.LatencyModel`) from measurements.

Two kinds of input are supported.

* **Decode-step traces** (:func:`fit_tpot_traces`), the format of
  ``fastsim/data/tpot_traces.json``: ``b`` requests started together, each
  streaming a fixed number of tokens; per request the TTFT, the end-to-end
  latency and the gaps between consecutive streamed tokens. Every gap is one
  engine step with ``b`` decoding sequences, so the gaps identify the decode
  terms (``base_s``, ``decode_scale_s``, ``decode_alpha``) directly; the TTFT
  versus ``b`` weakly identifies the prefill cost per token and a client-side
  constant.
* **``vllm bench serve`` results** (:func:`read_vllm_bench_json`,
  :func:`fit_bench_serve`) written with ``--save-result --save-detailed``:
  per-request ``ttfts``, ``itls``, ``input_lens``, ``output_lens`` (and, in
  recent vLLM versions, ``start_times``). The batch behind each inter-token gap
  is not recorded and has to be reconstructed from the request timelines.

All fits use :func:`scipy.optimize.least_squares` with a robust loss and report
parameter standard errors from the Jacobian at the optimum, scaled by the
(robustly weighted) residual variance.

The module depends only on :mod:`fastsim._latency` (and, through it,
:mod:`fastsim._validation`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
# scipy.stats, .signal, .sparse and .optimize are imported inside the functions that use them:
# at module level they were about 1 s of `import fastsim` (tests/test_import.py).

from ._latency import CALIBRATED, LatencyModel, StepNoise

__all__ = [
    "CalibrationResult",
    "PRESETS",
    "PACKAGED_TRACES",
    "DEFAULT_PROMPT_TOKENS",
    "fit_tpot_traces",
    "read_vllm_bench_json",
    "fit_bench_serve",
    "describe_format",
    "preset_latency_model",
]

#: The decode-step traces shipped with fastsim (vLLM 0.22, Qwen2.5-1.5B-Instruct, one A10G).
PACKAGED_TRACES = Path(__file__).resolve().parent / "data" / "tpot_traces.json"

#: Prompt length (tokens) assumed for the trace requests when the file does not
#: record it. The traces' prompt is the one sentence stored under ``"prompt"``
#: (13 words, about 13-14 Qwen2.5 tokens as raw text); the data's README states
#: "~20 tokens", which is what we use (it allows for a short per-request
#: prefix / special tokens). ``prefill_per_token_s`` scales as ``1 / P``.
DEFAULT_PROMPT_TOKENS = 20

#: Huber's constant: 95 % asymptotic efficiency for Gaussian noise. Residuals
#: are first divided by a robust (MAD-based) noise scale measured from the
#: data, so ``f_scale = 1.345`` means "beyond 1.345 measured sigmas the loss
#: grows only linearly".
HUBER_K = 1.345

_MAD_TO_SIGMA = 1.482602218505602  # 1 / Phi^-1(3/4)

_MEANINGS = {
    "base_s": "duration of a step with one decoding sequence: weight reads, kernel "
              "launches, scheduler and sampling overhead (s)",
    "decode_scale_s": "extra step time of the 2nd decoding sequence; the k-th extra sequence "
                      "adds scale * ((k)^alpha - (k-1)^alpha) (s)",
    "decode_alpha": "growth exponent of the decode cost with batch size (1 = linear, > 1 = "
                    "attention / memory traffic growing faster than the batch)",
    "prefill_per_token_s": "compute time per prompt token processed in a step (s/token)",
    "ctx_per_token_s": "attention cost per KV token touched by a step (s/token); not fitted "
                       "here, fixed to 0",
    "ttft_overhead_s": "client-side constant in TTFT not spent in engine steps: HTTP, "
                       "tokenisation, API-server queueing, first-chunk streaming (s)",
}

_MODEL_KEYS = ("base_s", "decode_scale_s", "decode_alpha", "prefill_per_token_s", "ctx_per_token_s")

# ---------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------

#: Fitted step-time parameters, by hardware/model name.
#:
#: ``"a10g-qwen2.5-1.5b"``: ``fit_tpot_traces(PACKAGED_TRACES)`` (vLLM 0.22.0,
#: Qwen2.5-1.5B-Instruct, one NVIDIA A10G). Regenerate with::
#:
#:     python -c "from fastsim._calibration import *; r = fit_tpot_traces(PACKAGED_TRACES); \
#:                print(r.params, r.ttft_overhead_s)"
#:
#: (or ``python experiments/calibrate_a10g.py``); ``tests/test_calibration.py``
#: re-fits the packaged file and checks these literals to 1e-6 relative.
#: ``prefill_per_token_s`` and ``ttft_overhead_s`` are poorly identified (one
#: prompt length, 5 usable TTFT points): see ``summary()`` of the fit.
PRESETS: dict[str, dict[str, float]] = {
    "a10g-qwen2.5-1.5b": {
        "base_s": 0.007966691784345647,                # +/- 1.05e-05
        "decode_scale_s": 4.1233062523776856e-05,      # +/- 4.7e-06
        "decode_alpha": 1.148156986935774,             # +/- 0.034 (corr. with scale -0.99)
        "prefill_per_token_s": 6.738016205660655e-05,  # +/- 6.6e-06, assumes P = 20; upper bound
        "ctx_per_token_s": 0.0,                        # not fitted
        "ttft_overhead_s": 0.012487641921946478,       # +/- 2.0e-03, client-side, not a step cost
    },
}


#: The fitted noise of each preset (``experiments/fit_noise.py``; method in
#: ``docs/calibration.md``, "Noise"): per-step jitter and stalls from the
#: traces, the calibration's covariance, and per-run speed, prefill and
#: overhead laws from the spread between the A10G sweep's runs, which also
#: re-identify the TTFT constant (``ttft_overhead_s``) that the traces cannot
#: separate from the prefill slope. ``PRESETS[name + "-deterministic"]`` is the
#: same preset without noise.
#:
#: ``"a10g-qwen2.5-1.5b"``: fitted with the sweep's runs simulated under vLLM
#: 0.22's V1 rules (``async_scheduling``, ``scheduler_reserve_full_isl``,
#: ``null_block``) and, where the server's previous run left the same prompts
#: cached, a warm prefix cache (``experiments/vllm_a10g_validation.py``,
#: ``warm_prefix_cache``): ``python experiments/fit_noise.py --reps 200``
#: (``docs/validation.md``, "Recalibration with vLLM V1's rules"). The fit made
#: with the synchronous engine and every run cold (overhead 17.5 ms, prefill
#: log-mean -0.60, sd 0.48) is kept in that script as ``BEFORE_FIT``.
NOISE_PRESETS: dict[str, dict] = {
    "a10g-qwen2.5-1.5b": {
        "ttft_overhead_s": 0.011735233499773306,
        # The per-step jitter fitted on the traces (sd 0.0119, lag-1 autocorrelation
        # -0.12, `experiments/fit_noise.py`) averages out over a run's thousands of
        # steps, but would make every step a step of its own (no stretches): the
        # preset leaves it out; StepNoise(jitter_sd=0.0119, ...) puts it in.
        "noise": {"jitter_sd": 0.0, "stall_prob": 0.0, "stall_mean_s": 0.0,
                  "speed_log_mean": 0.04817332576019934, "speed_sd": 0.014182094295697301,
                  "prefill_log_mean": -0.3189974416456564, "prefill_sd": 0.0,
                  "overhead_sd": 0.004500395042046196},
    },
}


def _preset_names():
    return list(PRESETS) + [f"{k}-deterministic" for k in PRESETS]


def preset_latency_model(name: str) -> LatencyModel:
    """The :class:`LatencyModel` of a named preset.

    Parameters
    ----------
    name : str
        A key of :data:`PRESETS`, e.g. ``"a10g-qwen2.5-1.5b"`` (with its fitted
        noise, :data:`NOISE_PRESETS`), or that name with ``"-deterministic"``
        (the traces' fit alone, deterministic steps).

    Returns
    -------
    LatencyModel
    """
    if not isinstance(name, str) or name not in _preset_names():
        raise ValueError(f"preset name must be one of {', '.join(repr(k) for k in _preset_names())}, got {name!r}")
    deterministic = name.endswith("-deterministic")
    key = name[:-len("-deterministic")] if deterministic else name
    p = PRESETS[key]
    model = LatencyModel(**{k: p[k] for k in _MODEL_KEYS}, ttft_overhead_s=p["ttft_overhead_s"])
    if deterministic or key not in NOISE_PRESETS:
        return model
    from dataclasses import replace

    fitted = NOISE_PRESETS[key]
    cov = _preset_covariance(key)
    return replace(model, ttft_overhead_s=fitted["ttft_overhead_s"],
                   noise=StepNoise(**fitted["noise"], calibration_cov=cov))


def _preset_covariance(key):
    """The covariance of a preset's fit (refitted from its packaged traces, once)."""
    cov = _COVARIANCES.get(key)
    if cov is None:
        cov = _COVARIANCES[key] = fit_tpot_traces(PACKAGED_TRACES).covariance.to_numpy()
    return cov


_COVARIANCES: dict = {}


# ---------------------------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------------------------

@dataclass(eq=False)
class CalibrationResult:
    """Outcome of a step-time calibration.

    Attributes
    ----------
    params : dict
        ``base_s``, ``decode_scale_s``, ``decode_alpha``, ``prefill_per_token_s``,
        ``ctx_per_token_s`` (the :class:`LatencyModel` fields). A parameter the
        data do not identify is fixed (``0`` for costs, ``1`` for the exponent)
        and has ``nan`` standard error; see ``notes``.
    stderr : dict
        One standard error per parameter of ``params`` plus ``ttft_overhead_s``
        (``nan`` where not estimated).
    ttft_overhead_s : float or None
        Client-side constant in the TTFT (seconds), not part of the engine's
        step time; ``None`` where not identifiable.
    diagnostics : pandas.DataFrame
        Per batch size (traces) or per decode-batch bin (bench results):
        measured mean step, predicted step, relative error, sample counts.
    max_rel_error : float
        Largest ``|predicted / measured_mean - 1|`` over the rows of
        ``diagnostics``.
    ttft_diagnostics : pandas.DataFrame or None
        Per batch size: median TTFT, predicted TTFT, residual and whether it
        was treated as an outlier.
    notes : list of str
        Identification caveats and what was assumed.
    method : str
        Which estimator produced the result.
    covariance : pandas.DataFrame or None
        The estimates' covariance, rows and columns ``base_s``,
        ``decode_scale_s``, ``decode_alpha``, ``prefill_per_token_s``,
        ``ttft_overhead_s`` (``_latency.CALIBRATED``; 0 where a parameter was
        not estimated): ``StepNoise(calibration_cov=...)`` draws each run's
        coefficients from it.
    """

    params: dict
    stderr: dict
    ttft_overhead_s: float | None
    diagnostics: pd.DataFrame
    max_rel_error: float
    ttft_diagnostics: pd.DataFrame | None = None
    notes: list = field(default_factory=list)
    method: str = ""
    covariance: pd.DataFrame | None = None

    def latency_model(self) -> LatencyModel:
        """The fitted :class:`fastsim._latency.LatencyModel`."""
        return LatencyModel(**{k: float(self.params[k]) for k in _MODEL_KEYS},
                            ttft_overhead_s=float(self.ttft_overhead_s or 0.0))

    def summary(self) -> pd.DataFrame:
        """Table of the parameters: ``parameter``, ``value``, ``stderr``,
        ``rel_stderr`` and ``meaning`` (the physical meaning)."""
        rows = []
        for k in _MODEL_KEYS + ("ttft_overhead_s",):
            v = self.ttft_overhead_s if k == "ttft_overhead_s" else self.params.get(k)
            v = float("nan") if v is None else float(v)
            se = float(self.stderr.get(k, float("nan")))
            rel = abs(se / v) if (math.isfinite(se) and v != 0) else float("nan")
            rows.append({"parameter": k, "value": v, "stderr": se, "rel_stderr": rel,
                         "meaning": _MEANINGS[k]})
        return pd.DataFrame(rows)

    def to_toml(self) -> str:
        """A ``[latency]`` table for a scenario TOML, with the standard errors as comments."""
        lines = [f"# fitted by fastsim ({self.method}); value  # standard error", "[latency]"]
        for k in _MODEL_KEYS + ("ttft_overhead_s",):
            v = self.ttft_overhead_s if k == "ttft_overhead_s" else self.params.get(k)
            if v is None:
                continue
            se = float(self.stderr.get(k, float("nan")))
            lines.append(f"{k} = {float(v)!r}" + (f"  # +- {se:.3g}" if math.isfinite(se) else "  # fixed"))
        return "\n".join(lines) + "\n"

    def report(self) -> str:
        """A plain-text report: parameter table, diagnostics and notes."""
        with pd.option_context("display.width", 200, "display.max_columns", 20,
                               "display.max_colwidth", 60, "display.float_format", "{:.6g}".format):
            parts = [f"method: {self.method}", "", "parameters:",
                     self.summary().drop(columns="meaning").to_string(index=False), "",
                     "step-time diagnostics:", self.diagnostics.to_string(index=False), "",
                     f"max relative error of the mean step: {self.max_rel_error:.4%}"]
            if self.ttft_diagnostics is not None:
                parts += ["", "TTFT diagnostics:", self.ttft_diagnostics.to_string(index=False)]
        if self.notes:
            parts += ["", "notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def describe_format(data) -> str:
    """What a parsed JSON object looks like (for error messages about a file of the wrong kind)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    keys = set(data)
    if {"ttfts", "itls"} <= keys:
        return "a `vllm bench serve --save-result --save-detailed` result"
    if "measurements" in keys:
        return "fastsim decode-step traces (the tpot_traces.json format)"
    if keys & {"request_throughput", "mean_ttft_ms", "mean_tpot_ms"}:
        return ("a `vllm bench serve --save-result` summary without per-request data (rerun with "
                "--save-detailed)")
    if keys & {"engine_kwargs", "resolved_config"}:
        return "vLLM run metadata (an LLMServingSim meta.json), not a benchmark result"
    if keys & {"engine", "workload", "latency"}:
        return "a fastsim scenario"
    return f"an unknown JSON object (keys: {', '.join(sorted(keys)[:8])}{', ...' if len(keys) > 8 else ''})"


def _describe_text(text: str) -> str:
    head = text.lstrip()[:2000]
    first = head.splitlines()[0] if head else ""
    if not head:
        return "an empty file"
    if head[0] == "{" and "\n{" in head:
        return "JSON Lines (one object per line, e.g. a requests.jsonl or workload.jsonl)"
    if head[0] not in "[{" and "," in first:
        return f"CSV (header: {first[:80]!r})"
    if first.startswith("[") and "=" in head:
        return "TOML"
    return "not JSON"


def _load_json(path_or_dict, what: str) -> dict:
    if isinstance(path_or_dict, dict):
        return path_or_dict
    if isinstance(path_or_dict, (str, os.PathLike)):
        p = Path(path_or_dict)
        if not p.is_file():
            raise ValueError(f"{what}: no such file {str(p)!r}")
        text = p.read_text(encoding="utf-8", errors="replace")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what}: {str(p)!r} is not valid JSON ({exc}); it looks like "
                             f"{_describe_text(text)}, expected a JSON object") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{what}: {str(p)!r} must hold a JSON object, got {type(data).__name__}")
        return data
    raise ValueError(f"{what} must be a path or a dict, got {type(path_or_dict).__name__}")


def _finite_list(name: str, value, *, positive: bool = True, allow_empty: bool = False) -> np.ndarray:
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise ValueError(f"{name} must be a list of numbers, got {type(value).__name__}")
    if len(value) == 0 and not allow_empty:
        raise ValueError(f"{name} is empty")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must contain only numbers") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a flat list of numbers")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains a non-finite value")
    if positive and np.any(arr <= 0):
        raise ValueError(f"{name} contains a value <= 0 (min {arr.min()!r})")
    return arr


def _robust_sigma(x) -> float:
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return float("nan")
    return float(_MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


def _loss_weights(z, loss: str, f_scale: float) -> np.ndarray:
    """IRLS weights psi(z)/z of the scipy losses (z: raw residuals)."""
    u = (np.asarray(z) / f_scale) ** 2
    if loss == "linear":
        return np.ones_like(u)
    if loss == "huber":
        return np.where(u <= 1.0, 1.0, 1.0 / np.sqrt(np.maximum(u, 1e-300)))
    if loss == "soft_l1":
        return 1.0 / np.sqrt(1.0 + u)
    if loss == "cauchy":
        return 1.0 / (1.0 + u)
    raise ValueError(f"unknown loss {loss!r}")


def _psi_prime(z, loss: str, f_scale: float) -> np.ndarray:
    """Derivative of the influence function ``psi(z) = w(z) z`` of the scipy losses."""
    u = (np.asarray(z) / f_scale) ** 2
    if loss == "linear":
        return np.ones_like(u)
    if loss == "huber":
        return (u <= 1.0).astype(float)
    if loss == "soft_l1":
        return (1.0 + u) ** -1.5
    if loss == "cauchy":
        return (1.0 - u) / (1.0 + u) ** 2
    raise ValueError(f"unknown loss {loss!r}")


def _robust_cov(jac, resid, loss, f_scale, n_eff=None, hc_copies=None):
    """Covariance from the Jacobian at the optimum, scaled by the residual variance.

    The M-estimator sandwich (Huber 1981, sec. 7.6)
    ``cov = s2 / m^2 * (J^T J)^-1`` with ``s2 = sum(psi(r)^2) / (n_eff - p)``
    (the robust residual variance: an outlier contributes at most
    ``f_scale^2``) and ``m = mean(psi'(r))``; for the linear loss this is the
    ordinary ``sigma^2 (J^T J)^-1``. ``n_eff`` is the number of independent
    observations (default: the number of residuals).

    With ``hc_copies`` (one number per residual) the heteroscedasticity-
    consistent form ``B^-1 [sum c_i psi_i^2 J_i J_i^T] B^-1`` with
    ``B = sum psi'_i J_i J_i^T`` (White / Huber) is used instead, ``c_i`` being how many perfectly correlated
    copies of observation ``i`` the data hold (rows scaled by
    ``sqrt(1 / c_i)``): this makes the sum equal the per-cluster one.
    Returns ``(cov, s2)``;
    ``cov`` is all-nan without spare degrees of freedom or when ``J^T J`` is
    singular.
    """
    jac = np.asarray(jac, dtype=float)
    resid = np.asarray(resid, dtype=float)
    n, p = jac.shape
    n_eff = float(n) if n_eff is None else float(n_eff)
    dof = n_eff - p
    psi = _loss_weights(resid, loss, f_scale) * resid
    m = float(np.mean(_psi_prime(resid, loss, f_scale)))
    if dof <= 0 or m <= 0:
        return np.full((p, p), np.nan), float("nan")
    s2 = float(np.sum(psi ** 2) / dof) / m ** 2
    a = jac.T @ jac
    try:
        if np.linalg.cond(a) > 1e14:
            raise np.linalg.LinAlgError
        ainv = np.linalg.inv(a)
    except np.linalg.LinAlgError:
        return np.full((p, p), np.nan), s2
    if hc_copies is None:
        return ainv * s2, s2
    c = np.asarray(hc_copies, dtype=float)
    jm = jac * (psi * np.sqrt(c))[:, None]
    meat = jm.T @ jm
    bread = (jac * _psi_prime(resid, loss, f_scale)[:, None]).T @ jac
    try:
        if np.linalg.cond(bread) > 1e14:
            raise np.linalg.LinAlgError
        binv = np.linalg.inv(bread)
    except np.linalg.LinAlgError:
        return np.full((p, p), np.nan), s2
    cov = binv @ meat @ binv.T * (n_eff / dof)
    return cov, s2


def _decode_curve(theta, b):
    base, scale, alpha = theta
    x = np.maximum(np.asarray(b, dtype=float) - 1.0, 0.0)
    return base + scale * x ** alpha


def _decode_jac(theta, b):
    base, scale, alpha = theta
    x = np.maximum(np.asarray(b, dtype=float) - 1.0, 0.0)
    xa = x ** alpha
    logx = np.log(np.where(x > 0, x, 1.0))
    return np.column_stack([np.ones_like(x), xa, scale * xa * logx])


def _multistart(fun, jac, starts, bounds, **kw):
    from scipy.optimize import least_squares
    best = None
    for x0 in starts:
        x0 = np.clip(np.asarray(x0, dtype=float), bounds[0] + 1e-12, bounds[1] - 1e-12)
        res = least_squares(fun, x0, jac=jac, bounds=bounds, x_scale="jac",
                            ftol=1e-14, xtol=1e-14, gtol=1e-14, max_nfev=20000, **kw)
        if best is None or res.cost < best.cost - 1e-15 * max(abs(best.cost), 1.0):
            best = res
    return best


# ---------------------------------------------------------------------------------------------
# Decode-step traces
# ---------------------------------------------------------------------------------------------

def _parse_traces(data: dict):
    if "measurements" not in data:
        hint = (" (use LatencyModel.from_vllm_bench for it)" if "ttfts" in data else "")
        raise ValueError(f"trace data is missing key 'measurements': the file looks like "
                         f"{describe_format(data)}{hint}; expected fastsim decode-step traces "
                         f"(the tpot_traces.json format)")
    meas = data["measurements"]
    if not isinstance(meas, list) or len(meas) == 0:
        raise ValueError("trace data 'measurements' must be a non-empty list")
    out = []
    seen = set()
    for i, m in enumerate(meas):
        where = f"measurements[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{where} must be an object")
        for key in ("batch_size", "requests"):
            if key not in m:
                raise ValueError(f"{where} is missing key {key!r}")
        b = m["batch_size"]
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"{where}.batch_size must be an integer >= 1, got {b!r}")
        b = int(b)
        if b in seen:
            raise ValueError(f"{where}.batch_size {b} appears twice")
        seen.add(b)
        reqs = m["requests"]
        if not isinstance(reqs, list) or len(reqs) == 0:
            raise ValueError(f"{where}.requests must be a non-empty list")
        gaps, ttfts = [], []
        for j, r in enumerate(reqs):
            rw = f"{where}.requests[{j}]"
            if not isinstance(r, dict):
                raise ValueError(f"{rw} must be an object")
            for key in ("ttft_s", "step_deltas_s"):
                if key not in r:
                    raise ValueError(f"{rw} is missing key {key!r}")
            gaps.append(_finite_list(f"{rw}.step_deltas_s", r["step_deltas_s"]))
            ttfts.append(_finite_list(f"{rw}.ttft_s", [r["ttft_s"]])[0])
        prompt_tokens = m.get("prompt_tokens", data.get("prompt_tokens"))
        out.append({"batch_size": b, "gaps": gaps, "ttft": np.array(ttfts),
                    "prompt_tokens": prompt_tokens})
    out.sort(key=lambda d: d["batch_size"])
    return out


def _step_observations(gaps: list[np.ndarray]) -> np.ndarray:
    """Median over the requests of the ``j``-th gap, for every step index ``j``.

    The ``b`` requests of a run are served by the same engine steps, so their
    ``j``-th gaps are ``b`` client-side views of (nearly) the same step: they
    are not independent samples. The cross-request median is one observation
    of the step, robust to one client's late read (which makes one gap long
    and the next short) and to a request that started a step early.
    """
    n = max(len(g) for g in gaps)
    mat = np.full((len(gaps), n), np.nan)
    for i, g in enumerate(gaps):
        mat[i, : len(g)] = g
    return np.nanmedian(mat, axis=0)


def fit_tpot_traces(path_or_dict=PACKAGED_TRACES, *, prompt_tokens: int | None = None,
                    fit_prefill: bool = True) -> CalibrationResult:
    """Fit the step-time model to decode-step traces (``tpot_traces.json`` format).

    **Decode terms.** For a run with batch size ``b`` (``b`` requests started
    together, all decoding), every streamed-token gap is one engine step with
    ``n_decode = b``: ``step = base_s + decode_scale_s * (b - 1) ** decode_alpha``.
    The unit of data is one *step observation*: the median over the ``b``
    requests of their ``j``-th gap (the requests share the engine's steps, so
    treating all ``b * 47`` gaps as independent would overstate the information
    ``b``-fold). Residuals are divided by the batch's robust noise scale
    (1.4826 * MAD of its step observations), which equalises the very
    different step-to-step jitter of small and large batches, and fitted with
    Huber's loss, ``f_scale = 1.345`` (in those measured-sigma units; 95 %
    Gaussian efficiency). That bounds the influence of stalls such as the
    0.113 s gap at ``b = 16`` (a mixed prefill step, not a decode step) and
    of the short first/last gaps of a stream. Standard errors: Jacobian at the
    optimum, scaled by the robust residual variance (M-estimator sandwich,
    see ``_robust_cov``). They assume independent step observations; the slow drift of
    the step time within a run (context growth) makes them somewhat
    optimistic.

    **Prefill and client overhead** (``fit_prefill``). The ``b`` requests of a
    run are prefilled together, so their TTFT is about
    ``ttft_overhead_s + base_s + prefill_per_token_s * b * P`` with ``P`` the
    prompt length. One robust TTFT per batch size (the median over its
    requests) is fitted with ``base_s`` fixed from the decode fit and a
    Cauchy loss, started from the least-median-of-squares line (exhaustive
    over pairs of points; 50 % breakdown). ``f_scale`` is Rousseeuw's
    small-sample corrected LMS residual scale (floored by the pooled
    within-batch TTFT spread). Points more than 2.5 ``f_scale`` off the line
    are reported as outliers and left out of the standard errors: in the A10G
    data that is ``b = 16``, where 15 of the 16 requests waited ~0.11 s
    behind one stalled step (TTFT 0.148 s against ~0.04 s expected; the 16th
    request, prefilled a step earlier, shows the same stall as its first
    0.113 s inter-token gap).
    These two parameters are poorly identified: one prompt length only, so the
    slope also absorbs per-request server costs (tokenisation, request setup,
    streaming ``b`` outputs); the intercept mixes the network/HTTP constant
    with scheduling (most requests of a run actually get their first token
    one step after the first request); the number of usable points is tiny.

    Parameters
    ----------
    path_or_dict : path-like or dict
        The trace file (default: the packaged A10G traces) or its parsed
        content. Required: ``measurements[*].batch_size`` and
        ``measurements[*].requests[*].{ttft_s, step_deltas_s}``. At least three
        distinct batch sizes are needed for the three decode parameters.
    prompt_tokens : int, optional
        Prompt length ``P`` in tokens. Default: a ``prompt_tokens`` entry of
        the measurement or the file, else :data:`DEFAULT_PROMPT_TOKENS` (20,
        an assumption stated in ``notes``).
    fit_prefill : bool
        Also fit ``prefill_per_token_s`` and ``ttft_overhead_s`` from the TTFTs.

    Returns
    -------
    CalibrationResult
        ``diagnostics`` has one row per batch size: ``batch_size``,
        ``n_requests``, ``n_gaps``, ``n_steps``, ``mean_step_s`` (mean of all
        gaps, = (latency - ttft) / (tokens - 1) averaged over requests),
        ``median_step_s``, ``predicted_s``, ``rel_error`` (predicted / mean - 1),
        ``robust_sigma_s`` and ``drift_s_per_step`` (Theil-Sen slope of the step
        time over the run).

    Raises
    ------
    ValueError
        On missing keys, empty lists, non-positive or non-finite values, or
        fewer than three distinct batch sizes.
    """
    from scipy import stats
    data = _load_json(path_or_dict, "tpot traces")
    runs = _parse_traces(data)
    if len(runs) < 3 or sum(r["batch_size"] > 1 for r in runs) < 2:
        raise ValueError("the decode fit needs at least 3 distinct batch sizes, two of them > 1; "
                         f"got batch sizes {[r['batch_size'] for r in runs]}")
    notes: list[str] = []

    # --- decode fit (in milliseconds internally for conditioning) ---
    b_obs, y_obs, s_obs = [], [], []
    for r in runs:
        y = _step_observations(r["gaps"]) * 1e3
        sig = _robust_sigma(y)
        sig = max(sig, 1e-3 * float(np.median(y)))  # floor: a run with (near) constant steps
        r["obs_ms"], r["sigma_ms"] = y, sig
        b_obs.append(np.full(y.size, r["batch_size"], dtype=float))
        y_obs.append(y)
        s_obs.append(np.full(y.size, sig))
    b_obs, y_obs, s_obs = map(np.concatenate, (b_obs, y_obs, s_obs))

    def fun(theta):
        return (_decode_curve(theta, b_obs) - y_obs) / s_obs

    def jac(theta):
        return _decode_jac(theta, b_obs) / s_obs[:, None]

    bs = np.array([r["batch_size"] for r in runs], dtype=float)
    med = np.array([np.median(r["obs_ms"]) for r in runs])
    base0 = float(med[0])
    starts = []
    for a0 in (0.5, 1.0, 1.5, 2.0):
        sc0 = max((med[-1] - base0) / max(bs[-1] - 1.0, 1.0) ** a0, 1e-6)
        starts.append([base0, sc0, a0])
    bounds = (np.array([1e-9, 0.0, 0.05]), np.array([np.inf, np.inf, 5.0]))
    res = _multistart(fun, jac, starts, bounds, loss="huber", f_scale=HUBER_K)
    theta = res.x
    cov, _ = _robust_cov(jac(theta), res.fun, "huber", HUBER_K, n_eff=res.fun.size)
    se = np.sqrt(np.clip(np.diag(cov), 0, None))
    base_s, scale_s, alpha = theta[0] * 1e-3, theta[1] * 1e-3, float(theta[2])
    se_base, se_scale, se_alpha = se[0] * 1e-3, se[1] * 1e-3, se[2]
    if res.active_mask[1] != 0 or res.active_mask[2] != 0:
        notes.append("decode_scale_s or decode_alpha ended on a bound; their standard errors "
                     "are not meaningful")
    w = _loss_weights(res.fun, "huber", HUBER_K)
    n_down = int(np.sum(w < 1.0))
    notes.append(f"decode fit: {res.fun.size} step observations (cross-request median gap per "
                 f"step index) from {len(runs)} batch sizes; Huber loss, f_scale = {HUBER_K} "
                 f"per-batch robust sigmas; {n_down} observations down-weighted")

    rows = []
    for r in runs:
        allg = np.concatenate(r["gaps"])
        pred = float(_decode_curve((base_s, scale_s, alpha), r["batch_size"]))
        mean = float(allg.mean())
        ts = stats.theilslopes(r["obs_ms"] * 1e-3) if r["obs_ms"].size >= 3 else (np.nan,)
        rows.append({"batch_size": r["batch_size"], "n_requests": len(r["gaps"]),
                     "n_gaps": int(allg.size), "n_steps": int(r["obs_ms"].size),
                     "mean_step_s": mean, "median_step_s": float(np.median(allg)),
                     "predicted_s": pred, "rel_error": pred / mean - 1.0,
                     "robust_sigma_s": r["sigma_ms"] * 1e-3,
                     "drift_s_per_step": float(ts[0])})
    diag = pd.DataFrame(rows)
    max_rel = float(np.max(np.abs(diag["rel_error"])))

    params = {"base_s": base_s, "decode_scale_s": scale_s, "decode_alpha": alpha,
              "prefill_per_token_s": 0.0, "ctx_per_token_s": 0.0}
    stderr = {"base_s": se_base, "decode_scale_s": se_scale, "decode_alpha": se_alpha,
              "prefill_per_token_s": float("nan"), "ctx_per_token_s": float("nan"),
              "ttft_overhead_s": float("nan")}
    if np.all(np.isfinite(cov)):
        corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
        notes.append(f"correlation(decode_scale_s, decode_alpha) = {corr[1, 2]:+.3f}: the two "
                     "are strongly coupled; use them together, not separately")
    notes.append("ctx_per_token_s is fixed to 0: with one prompt length the KV context grows "
                 "in proportion to b, so its cost is absorbed by the decode terms; the "
                 "within-run drift (drift_s_per_step) shows the context effect")

    ttft_over = None
    ttft_diag = None
    if fit_prefill:
        ttft_diag, pf, ttft_over, se_pf, se_over, pf_notes, cov_ttft = _fit_ttft(runs, base_s, prompt_tokens)
        params["prefill_per_token_s"] = pf
        stderr["prefill_per_token_s"] = se_pf
        stderr["ttft_overhead_s"] = se_over
        notes.extend(pf_notes)

    # the joint covariance, in the order of `_latency.CALIBRATED` (the decode fit and the
    # TTFT fit are separate fits: no cross terms; the decode fit works in ms)
    full_cov = np.zeros((5, 5))
    if np.all(np.isfinite(cov)):
        unit = np.array([1e-3, 1e-3, 1.0])
        full_cov[:3, :3] = cov * np.outer(unit, unit)
    if fit_prefill and cov_ttft is not None and np.all(np.isfinite(cov_ttft)):
        full_cov[3, 3], full_cov[4, 4] = cov_ttft[1, 1], cov_ttft[0, 0]
        full_cov[3, 4] = full_cov[4, 3] = cov_ttft[0, 1]
    return CalibrationResult(params=params, stderr=stderr, ttft_overhead_s=ttft_over,
                             diagnostics=diag, max_rel_error=max_rel, ttft_diagnostics=ttft_diag,
                             covariance=pd.DataFrame(full_cov, index=list(CALIBRATED), columns=list(CALIBRATED)),
                             notes=notes, method="fit_tpot_traces (decode: robust Huber fit of "
                                                 "per-step observations; prefill: robust TTFT "
                                                 "line)")


_OUTLIER_CUT = 2.5  # Rousseeuw & Leroy's cut-off, in units of the LMS residual scale


def _lms_line(x, y):
    """Least-median-of-squares line through two of the points (exhaustive; few points).

    Returns ``(intercept, slope, scale)`` with Rousseeuw's small-sample corrected
    residual scale ``1.4826 (1 + 5 / (n - 2)) sqrt(med r^2)``. Breakdown ~50 %:
    a start for the Cauchy fit that a single wild point cannot drag.
    """
    n = x.size
    h = n // 2 + 1
    best = None
    for i in range(n):
        for j in range(i + 1, n):
            if x[j] == x[i]:
                continue
            s = (y[j] - y[i]) / (x[j] - x[i])
            c = y[i] - s * x[i]
            q = float(np.sort((y - c - s * x) ** 2)[h - 1])
            if best is None or q < best[0]:
                best = (q, c, s)
    q, c, s = best
    scale = _MAD_TO_SIGMA * (1.0 + 5.0 / max(n - 2, 1)) * math.sqrt(q)
    return float(c), float(s), scale


def _fit_ttft(runs, base_s, prompt_tokens):
    from scipy.optimize import least_squares
    notes = []
    # prompt length per run
    p_list = []
    for r in runs:
        p = prompt_tokens if prompt_tokens is not None else r["prompt_tokens"]
        if p is None:
            p = DEFAULT_PROMPT_TOKENS
            assumed = True
        else:
            assumed = False
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or p <= 0:
            raise ValueError(f"prompt_tokens must be a number > 0, got {p!r}")
        p_list.append((float(p), assumed))
    if any(a for _, a in p_list):
        notes.append(f"prompt length not in the data: assumed P = {DEFAULT_PROMPT_TOKENS} tokens per "
                     "request (the data README's '~20 tokens'); prefill_per_token_s scales as 1/P, "
                     "the per-request slope prefill_per_token_s * P does not depend on it")
    b = np.array([r["batch_size"] for r in runs], dtype=float)
    tok = np.array([r["batch_size"] * p for r, (p, _) in zip(runs, p_list)])
    y = np.array([np.median(r["ttft"]) for r in runs])
    n_req = np.array([r["ttft"].size for r in runs])
    spreads = np.concatenate([r["ttft"] - np.median(r["ttft"]) for r in runs if r["ttft"].size >= 2]
                             or [np.zeros(0)])
    within = _robust_sigma(spreads) if spreads.size >= 3 else 0.0
    yy = y - base_s

    def fun(th):
        return th[0] + th[1] * tok - yy

    def jac(th):
        return np.column_stack([np.ones_like(tok), tok])

    nan = float("nan")
    if np.unique(tok).size < 2:
        notes.append("prefill not identified: all runs have the same prompt-token count")
        return None, 0.0, None, nan, nan, notes, None
    c0, s0, lms_scale = _lms_line(tok, yy)
    # f_scale: Rousseeuw's LMS residual scale of the points about the line (small-sample
    # corrected), floored by the pooled within-batch TTFT spread.
    f_scale = max(lms_scale, within, 1e-5)
    bounds = (np.array([-np.inf, 0.0]), np.array([np.inf, np.inf]))
    res = least_squares(fun, [c0, max(s0, 0.0)], jac=jac, bounds=bounds, loss="cauchy",
                        f_scale=f_scale, x_scale=np.array([1e-2, 1e-5]), ftol=1e-15, xtol=1e-15,
                        gtol=1e-15, max_nfev=20000)
    over, pf = float(res.x[0]), float(res.x[1])
    outlier = np.abs(res.fun) > _OUTLIER_CUT * f_scale
    n_in = int(np.sum(~outlier))
    # covariance from the inliers: Jacobian scaled by the inlier residual variance
    jin, rin = jac(res.x)[~outlier], res.fun[~outlier]
    cov, s2 = _robust_cov(jin, rin, "linear", 1.0, n_eff=n_in)
    se = np.sqrt(np.clip(np.diag(cov), 0, None))
    ttft_diag = pd.DataFrame({
        "batch_size": b.astype(int), "n_requests": n_req, "prompt_tokens_total": tok,
        "median_ttft_s": y, "min_ttft_s": [r["ttft"].min() for r in runs],
        "max_ttft_s": [r["ttft"].max() for r in runs],
        "predicted_ttft_s": over + base_s + pf * tok, "residual_s": -res.fun,
        "outlier": outlier})
    if np.any(outlier):
        bad = ", ".join(str(int(v)) for v in b[outlier])
        notes.append(f"TTFT outliers (> {_OUTLIER_CUT} x {f_scale * 1e3:.2f} ms off the robust line, "
                     "down-weighted by the Cauchy loss and left out of the standard errors): "
                     f"b = {bad}")
    dof = n_in - 2
    if res.active_mask[1] != 0:
        notes.append("prefill_per_token_s hit its lower bound 0: not identified")
    rel = se[1] / pf if pf > 0 else nan
    notes.append(
        f"prefill/overhead fit: {n_in} usable TTFT points for 2 parameters ({dof} dof); "
        f"prefill_per_token_s = {pf:.3g} +/- {se[1]:.2g} s/token (rel. {rel:.0%}), "
        f"ttft_overhead_s = {over:.3g} +/- {se[0]:.2g} s. POORLY IDENTIFIED: a single prompt length, "
        "so the slope also contains per-request server costs (an upper bound on the true per-token "
        "prefill cost) and the intercept mixes the client/HTTP constant with the extra step most "
        "requests of a run wait (the first request is often prefilled one step ahead)")
    if np.all(np.isfinite(cov)):
        notes.append(f"correlation(ttft_overhead_s, prefill_per_token_s) = "
                     f"{cov[0, 1] / math.sqrt(cov[0, 0] * cov[1, 1]):+.3f}")
    return ttft_diag, pf, over, float(se[1]), float(se[0]), notes, cov


# ---------------------------------------------------------------------------------------------
# vllm bench serve results
# ---------------------------------------------------------------------------------------------

_BENCH_REQUIRED = ("ttfts", "itls", "input_lens", "output_lens")


def read_vllm_bench_json(path_or_dict) -> pd.DataFrame:
    """Read the per-request data of a ``vllm bench serve --save-result --save-detailed`` file.

    Parameters
    ----------
    path_or_dict : path-like or dict
        The result JSON or its parsed content. Required keys (lists with one
        entry per request): ``ttfts`` (seconds), ``itls`` (list of per-request
        lists of inter-token gaps, seconds), ``input_lens`` (prompt tokens),
        ``output_lens`` (generated tokens). Optional: ``start_times`` (request
        send times on the client's ``perf_counter`` clock, seconds; recent vLLM
        versions), ``errors`` (empty string for success).

    Returns
    -------
    pandas.DataFrame
        One row per request: ``input_len``, ``output_len``, ``ttft_s``,
        ``itls_s`` (numpy array), ``start_time_s`` (nan when absent),
        ``success`` (no error, ``ttft > 0`` and ``output_len >= 1``).

    Raises
    ------
    ValueError
        A required key is missing, a list is empty, the lists differ in
        length, or an entry is not a finite number (negative gaps included).
    """
    data = _load_json(path_or_dict, "vllm bench serve result")
    for k in _BENCH_REQUIRED:
        if k not in data:
            raise ValueError(f"vllm bench serve result is missing key {k!r}: the file looks like "
                             f"{describe_format(data)}; expected a `vllm bench serve --save-result "
                             f"--save-detailed` result (keys ttfts, itls, input_lens, output_lens)")
    n = None
    for k in _BENCH_REQUIRED + tuple(k for k in ("start_times", "errors") if k in data):
        v = data[k]
        if not isinstance(v, list):
            raise ValueError(f"vllm bench serve result key {k!r} must be a list, got "
                             f"{type(v).__name__}")
        if len(v) == 0:
            raise ValueError(f"vllm bench serve result key {k!r} is an empty list")
        if n is None:
            n = len(v)
        elif len(v) != n:
            raise ValueError(f"vllm bench serve result key {k!r} has {len(v)} entries, "
                             f"expected {n} (one per request, as 'ttfts')")
    ttft = _finite_list("ttfts", data["ttfts"], positive=False)
    inl = _finite_list("input_lens", data["input_lens"], positive=False)
    outl = _finite_list("output_lens", data["output_lens"], positive=False)
    if np.any(ttft < 0) or np.any(inl < 0) or np.any(outl < 0):
        raise ValueError("ttfts, input_lens and output_lens must be >= 0")
    itls = []
    for i, g in enumerate(data["itls"]):
        a = _finite_list(f"itls[{i}]", g, positive=False, allow_empty=True)
        if np.any(a < 0):
            raise ValueError(f"itls[{i}] contains a negative gap")
        itls.append(a)
    if "start_times" in data:
        st = _finite_list("start_times", data["start_times"], positive=False)
    else:
        st = np.full(n, np.nan)
    errors = data.get("errors") or [""] * n
    ok = np.array([not e for e in errors]) & (ttft > 0) & (outl >= 1)
    return pd.DataFrame({"input_len": inl.astype(int), "output_len": outl.astype(int),
                         "ttft_s": ttft, "itls_s": itls, "start_time_s": st, "success": ok})


def _bench_timeline(df):
    """Inter-token gaps of one run and the batch behind each (see :func:`fit_bench_serve`)."""
    first = (df["start_time_s"] + df["ttft_s"]).to_numpy()
    times = [f + np.concatenate([[0.0], np.cumsum(g)]) for f, g in zip(first, df["itls_s"])]
    last = np.array([t[-1] for t in times])
    plen = df["input_len"].to_numpy(dtype=float)
    o_first = np.argsort(first, kind="stable")
    first_sorted = first[o_first]
    cum_p = np.concatenate([[0.0], np.cumsum(plen[o_first])])
    last_sorted = np.sort(last)
    lo = np.concatenate([t[:-1] for t in times]) if times else np.zeros(0)
    hi = np.concatenate([t[1:] for t in times]) if times else np.zeros(0)
    out = {"start": df["start_time_s"].to_numpy(), "ttft": df["ttft_s"].to_numpy(), "plen": plen,
           "last_sorted": last_sorted}
    if lo.size == 0:
        return {**out, "y": np.zeros(0), "n_dec": np.zeros(0), "n_pf": np.zeros(0)}
    y = hi - lo
    mid = 0.5 * (lo + hi)
    n_dec = (np.searchsorted(first_sorted, mid, side="left")
             - np.searchsorted(last_sorted, mid, side="right")).astype(float)
    n_dec = np.maximum(n_dec, 1.0)  # the observing request itself decodes
    # a first token emitted by this step reaches the client at ~hi (+- jitter), one emitted by
    # the previous / next step at ~lo / ~hi + next step: count first tokens within
    # +- delta of hi, delta = half the 5th percentile of all gaps (shorter than any real step,
    # much longer than client jitter), and after the gap's midpoint
    delta = 0.5 * float(np.percentile(hi - lo, 5))
    i_lo = np.searchsorted(first_sorted, np.maximum(mid, hi - delta), side="right")
    i_hi = np.searchsorted(first_sorted, hi + delta, side="right")
    n_pf = cum_p[i_hi] - cum_p[i_lo]
    keep = y > 0
    return {**out, "y": y[keep], "n_dec": n_dec[keep], "n_pf": n_pf[keep]}


def fit_bench_serve(path_or_dict, *, fit_prefill: bool = True) -> CalibrationResult:
    """Estimate the step-time parameters from ``vllm bench serve`` per-request data.

    **With ``start_times``** (recent vLLM): every request's token emission
    times are rebuilt on the common client clock
    (``start + ttft + cumsum(itls)``). Each inter-token gap ``(t_k, t_k+1]`` of
    a request is one engine step (or several when the client read a bunched
    chunk); its batch is reconstructed from the other requests' timelines:
    ``n_decode`` = requests whose first token came before and whose last
    token came after the gap's midpoint, ``n_prefill_tokens`` = prompt tokens
    of the requests whose *first* token arrived with this gap's closing token
    (within +- half the 5th-percentile gap of ``t_k+1``, after the midpoint:
    tolerant to client jitter; their prefill ran in that step). The model ``base + scale (n_decode - 1)^alpha +
    prefill_per_token * n_prefill_tokens`` is fitted to the gaps with a
    soft-L1 loss whose ``f_scale`` is the robust (MAD) scale of the residuals
    of a first pass; each gap is weighted ``1 / n_decode`` because the
    ``n_decode`` requests of a step all observe it (standard errors use
    ``sum(1 / n_decode)``, about the number of distinct steps, as sample
    size; the covariance is the heteroscedasticity-consistent sandwich, as
    prefill steps are longer and noisier than pure decode steps).
    ``ttft_overhead_s`` is the median of ``ttft - predicted prefill
    step`` over requests sent to an idle server.

    Limits: chunked prefill splits long prompts over several steps but the
    reconstruction charges the whole prompt to the step of the first token
    (biasing ``prefill_per_token_s`` low when prompts exceed the token
    budget); preemptions, bunched chunks and client-side jitter blur the
    timeline (the robust loss absorbs isolated cases); the decode terms are
    only identified over the range of ``n_decode`` the run visited; the KV
    context cost (``ctx_per_token_s``) is not fitted.

    **Without ``start_times``** the requests cannot be placed on a common clock
    and the batch behind a gap is unknown: only a constant step time
    (``base_s`` = robust mean of all gaps; ``decode_scale_s = 0``) and, if
    ``fit_prefill``, a TTFT-versus-prompt-length line (valid at low load
    only) are estimated.

    Parameters
    ----------
    path_or_dict : path-like, dict or list of them
        A result file of ``vllm bench serve --save-result --save-detailed``,
        or its parsed content (see :func:`read_vllm_bench_json`); a list pools
        several runs of the same server (each run's timeline is rebuilt on
        its own clock, then one model is fitted to all the gaps).
    fit_prefill : bool
        Also estimate ``prefill_per_token_s`` and ``ttft_overhead_s``.

    Returns
    -------
    CalibrationResult
        ``diagnostics`` has one row per ``n_decode`` bin of pure-decode gaps:
        measured mean gap, predicted, relative error, number of gaps.
    """
    runs = list(path_or_dict) if isinstance(path_or_dict, (list, tuple)) else [path_or_dict]
    if not runs:
        raise ValueError("vllm bench serve result: got an empty list of runs")
    dfs = []
    for k, run in enumerate(runs):
        df = read_vllm_bench_json(run)
        df = df[df["success"]].reset_index(drop=True)
        if len(df) == 0:
            raise ValueError(f"vllm bench serve result{f' #{k}' if len(runs) > 1 else ''} has no successful "
                             "request")
        dfs.append(df)
    notes: list[str] = []
    nan = float("nan")
    have_start = all(bool(np.all(np.isfinite(d["start_time_s"].to_numpy()))) for d in dfs)
    if not have_start:
        if len(dfs) > 1:
            notes.append(f"{len(dfs)} runs pooled")
        return _fit_bench_no_timeline(pd.concat(dfs, ignore_index=True), fit_prefill, notes)

    # --- timeline reconstruction, run by run (each run has its own client clock) ---
    timelines = [_bench_timeline(d) for d in dfs]
    y, n_dec, n_pf = (np.concatenate([tl[key] for tl in timelines]) for key in ("y", "n_dec", "n_pf"))
    if y.size < 10:
        raise ValueError(f"vllm bench serve result has only {y.size} inter-token gaps; "
                         "need at least 10")
    df = pd.concat(dfs, ignore_index=True)
    if len(dfs) > 1:
        notes.append(f"{len(dfs)} runs pooled (timelines rebuilt per run, one joint fit)")
    wobs = 1.0 / n_dec
    n_eff = float(np.sum(wobs))

    use_pf = fit_prefill and np.any(n_pf > 0)
    use_dec = np.unique(n_dec).size >= 3 and np.any(n_dec > 1)
    if not use_dec:
        notes.append("decode_scale_s/decode_alpha not identified (fewer than 3 distinct "
                     "reconstructed batch sizes): fixed to 0 / 1")
    if fit_prefill and not use_pf:
        notes.append("no gap contains a prefill: prefill_per_token_s not identified (fixed to 0)")

    ym = y * 1e3

    def unpack(th):
        base = th[0]
        scale, alpha = (th[1], th[2]) if use_dec else (0.0, 1.0)
        pf = th[-1] if use_pf else 0.0
        return base, scale, alpha, pf

    def model(th):
        base, scale, alpha, pf = unpack(th)
        return _decode_curve((base, scale, alpha), n_dec) + pf * n_pf

    sw = np.sqrt(wobs)

    def fun(th):
        return sw * (model(th) - ym)

    def jac(th):
        base, scale, alpha, pf = unpack(th)
        cols = [np.ones_like(n_dec)]
        if use_dec:
            jd = _decode_jac((base, scale, alpha), n_dec)
            cols += [jd[:, 1], jd[:, 2]]
        if use_pf:
            cols.append(n_pf)
        return np.column_stack(cols) * sw[:, None]

    pure = n_pf == 0
    base0 = float(np.median(ym[pure & (n_dec == n_dec[pure].min())])) if np.any(pure) else float(
        np.median(ym))
    lo_b, hi_b = [1e-9], [np.inf]
    starts = []
    for a0 in ((0.7, 1.0, 1.5, 2.0) if use_dec else (None,)):
        x0 = [base0]
        if use_dec:
            top = n_dec[pure].max() if np.any(pure) else n_dec.max()
            ytop = float(np.median(ym[pure & (n_dec == top)])) if np.any(pure & (n_dec == top)) \
                else base0 * 1.1
            x0 += [max((ytop - base0) / max(top - 1.0, 1.0) ** a0, 1e-6), a0]
        if use_pf:
            x0.append(1e-3 * 0.05)
        starts.append(x0)
    if use_dec:
        lo_b += [0.0, 0.05]
        hi_b += [np.inf, 5.0]
    if use_pf:
        lo_b.append(0.0)
        hi_b.append(np.inf)
    bounds = (np.array(lo_b), np.array(hi_b))
    # pass 1: f_scale from the spread of the gaps themselves; pass 2: from the pass-1 residuals
    f1 = max(_robust_sigma(ym) * float(np.median(sw)), 1e-6)
    r1 = _multistart(fun, jac, starts, bounds, loss="soft_l1", f_scale=f1)
    f2 = max(_robust_sigma(r1.fun), 1e-6)
    res = _multistart(fun, jac, [r1.x], bounds, loss="soft_l1", f_scale=f2)
    cov, _ = _robust_cov(jac(res.x), res.fun, "soft_l1", f2, n_eff=n_eff, hc_copies=n_dec)
    se = np.sqrt(np.clip(np.diag(cov), 0, None)) * 1e-3
    base, scale, alpha, pf = unpack(res.x)
    params = {"base_s": base * 1e-3, "decode_scale_s": scale * 1e-3, "decode_alpha": float(alpha),
              "prefill_per_token_s": pf * 1e-3, "ctx_per_token_s": 0.0}
    stderr = {k: nan for k in _MODEL_KEYS + ("ttft_overhead_s",)}
    stderr["base_s"] = se[0]
    if use_dec:
        stderr["decode_scale_s"], stderr["decode_alpha"] = se[1], se[2] * 1e3
    if use_pf:
        stderr["prefill_per_token_s"] = se[-1]
    notes.append(f"bench fit: {y.size} gaps from {len(df)} requests, ~{n_eff:.0f} distinct steps "
                 f"(sum of 1/n_decode); soft_l1 loss, f_scale = {f2 * 1e3 / np.median(sw):.3g} us "
                 "(robust scale of the first-pass residuals)")

    lm = LatencyModel(**params)
    # TTFT overhead from requests sent to an idle server
    ttft_over = None
    if fit_prefill:
        extras = []
        for tl in timelines:
            st = tl["start"]
            busy = (np.searchsorted(np.sort(st), st, side="left")
                    - np.searchsorted(tl["last_sorted"], st, side="right"))
            idle = busy <= 0
            extras.append(tl["ttft"][idle] - lm.step_time(0, tl["plen"][idle]))
        extra = np.concatenate(extras)
        if extra.size:
            ttft_over = float(np.median(extra))
            stderr["ttft_overhead_s"] = float(1.2533 * _robust_sigma(extra) / math.sqrt(extra.size)) \
                if extra.size >= 3 else nan
            notes.append(f"ttft_overhead_s from {extra.size} requests sent to an idle server")
        else:
            notes.append("ttft_overhead_s not identified: no request found the server idle")

    # diagnostics over pure-decode gaps
    pred = lm.step_time(n_dec, n_pf)
    rows = []
    bins = np.unique(n_dec[pure]) if np.any(pure) else np.zeros(0)
    for nb in bins:
        m = pure & (n_dec == nb)
        meas = float(np.mean(y[m]))
        rows.append({"n_decode": int(nb), "n_gaps": int(m.sum()), "mean_step_s": meas,
                     "median_step_s": float(np.median(y[m])), "predicted_s": float(pred[m][0]),
                     "rel_error": float(pred[m][0]) / meas - 1.0})
    diag = pd.DataFrame(rows, columns=["n_decode", "n_gaps", "mean_step_s", "median_step_s",
                                       "predicted_s", "rel_error"])
    well = diag["n_gaps"] >= 20
    max_rel = float(np.max(np.abs(diag.loc[well, "rel_error"]))) if well.any() else nan
    notes.append("max_rel_error is over n_decode bins with >= 20 pure-decode gaps (means of "
                 "client-side gaps include bunched chunks, so a few % above the robust fit is "
                 "expected)")
    notes.append("limits: prompts split by chunked prefill are charged to the step of their first "
                 "token; ctx_per_token_s not fitted")
    return CalibrationResult(params=params, stderr=stderr, ttft_overhead_s=ttft_over,
                             diagnostics=diag, max_rel_error=max_rel, ttft_diagnostics=None,
                             notes=notes, method="fit_bench_serve (timeline reconstruction)")


def _fit_bench_no_timeline(df, fit_prefill, notes):
    from scipy import stats
    from scipy.optimize import least_squares
    nan = float("nan")
    gaps = np.concatenate([g for g in df["itls_s"]]) if len(df) else np.zeros(0)
    gaps = gaps[gaps > 0]
    if gaps.size < 10:
        raise ValueError(f"vllm bench serve result has only {gaps.size} inter-token gaps; need at "
                         "least 10")
    ym = gaps * 1e3
    f = max(_robust_sigma(ym), 1e-6)
    res = least_squares(lambda th: th[0] - ym, [float(np.median(ym))], loss="huber",
                        f_scale=HUBER_K * f, jac=lambda th: np.ones((ym.size, 1)))
    cov, _ = _robust_cov(np.ones((ym.size, 1)), res.fun, "huber", HUBER_K * f, n_eff=len(df))
    params = {"base_s": float(res.x[0]) * 1e-3, "decode_scale_s": 0.0, "decode_alpha": 1.0,
              "prefill_per_token_s": 0.0, "ctx_per_token_s": 0.0}
    stderr = {k: nan for k in _MODEL_KEYS + ("ttft_overhead_s",)}
    stderr["base_s"] = float(math.sqrt(cov[0, 0])) * 1e-3
    notes.append("no start_times: requests cannot be put on a common clock, the batch behind a gap "
                 "is unknown; base_s is the robust mean step at the run's (unknown) average batch, "
                 "decode_scale_s/decode_alpha are not identified (0 / 1). Standard error uses the "
                 "number of requests as sample size (gaps of concurrent requests are correlated)")
    ttft_over = None
    if fit_prefill:
        x = df["input_len"].to_numpy(dtype=float)
        y = df["ttft_s"].to_numpy()
        if np.unique(x).size >= 2:
            ts = stats.theilslopes(y, x)
            fs = max(_robust_sigma(y - ts[1] - ts[0] * x), 1e-5)
            r = least_squares(lambda th: th[0] + th[1] * x - y, [ts[1], max(ts[0], 0.0)],
                              jac=lambda th: np.column_stack([np.ones_like(x), x]),
                              bounds=([-np.inf, 0.0], [np.inf, np.inf]), loss="soft_l1",
                              f_scale=fs, x_scale=[1e-2, 1e-5])
            cov, _ = _robust_cov(np.column_stack([np.ones_like(x), x]), r.fun, "soft_l1", fs)
            params["prefill_per_token_s"] = float(r.x[1])
            ttft_over = float(r.x[0]) - params["base_s"]
            stderr["prefill_per_token_s"] = float(math.sqrt(cov[1, 1]))
            stderr["ttft_overhead_s"] = float(math.sqrt(cov[0, 0]))
            notes.append("prefill from a robust line TTFT = overhead + base + p * input_len: biased "
                         "upward by queueing unless the run was at low load")
        else:
            notes.append("prefill not identified: all prompts have the same length")
    diag = pd.DataFrame([{"n_decode": np.nan, "n_gaps": int(gaps.size),
                          "mean_step_s": float(gaps.mean()), "median_step_s": float(np.median(gaps)),
                          "predicted_s": params["base_s"],
                          "rel_error": params["base_s"] / float(gaps.mean()) - 1.0}])
    return CalibrationResult(params=params, stderr=stderr, ttft_overhead_s=ttft_over,
                             diagnostics=diag, max_rel_error=float(abs(diag["rel_error"].iloc[0])),
                             notes=notes, method="fit_bench_serve (no timeline: constant step)")
