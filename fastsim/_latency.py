"""The step-time (latency) model: how long one engine iteration takes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._validation import MAX_CLOCK_S, check_float

#: Bounds of `StepNoise`'s log-scale standard deviations and means (factors of e**2 a standard deviation,
#: e**10 for a mean: far beyond any GPU's, where exp() of a draw would still stay finite and nonzero).
MAX_LOG_SD = 2.0
MAX_LOG_MEAN = 10.0
#: The coefficients whose joint uncertainty `StepNoise.calibration_cov` holds, in its order.
CALIBRATED = ("base_s", "decode_scale_s", "decode_alpha", "prefill_per_token_s", "ttft_overhead_s")


@dataclass(frozen=True)
class StepNoise:
    """The noise of a real server's step times (``LatencyModel(noise=...)``).

    Three kinds, each fitted from measurements (``docs/calibration.md``,
    ``experiments/fit_noise.py``):

    * **per step**: every step's duration is multiplied by a lognormal jitter
      ``exp(jitter_sd * z - jitter_sd**2 / 2)`` (mean 1), and with probability
      ``stall_prob`` a stall of exponential duration (mean ``stall_mean_s``) is
      added to it;
    * **per run** (one benchmark run = one replication): a speed factor
      ``exp(N(speed_log_mean, speed_sd**2))`` multiplies every term of the step
      time, a prefill factor ``exp(N(prefill_log_mean, prefill_sd**2))`` the
      prefill term, and the client overhead is ``N(ttft_overhead_s,
      overhead_sd**2)`` (at least 0);
    * **calibration uncertainty**: with ``calibration_cov``, the coefficients
      ``(base_s, decode_scale_s, decode_alpha, prefill_per_token_s,
      ttft_overhead_s)`` of each run are drawn from a normal law about the
      fitted values with that covariance (kept in their domain).

    Per-run effects keep the simulator's closed forms for runs of decode
    steps; per-step jitter and stalls make it take every step by itself.

    Parameters
    ----------
    jitter_sd : float
        Standard deviation of the log of a step's multiplicative jitter (>= 0).
    stall_prob : float
        Probability that a step stalls (0 <= p < 1).
    stall_mean_s : float
        Mean duration of a stall, seconds (>= 0).
    speed_log_mean, speed_sd : float
        Mean and standard deviation (>= 0) of the log of the per-run speed factor.
    prefill_log_mean, prefill_sd : float
        Mean and standard deviation (>= 0) of the log of the per-run prefill factor.
    overhead_sd : float
        Standard deviation of the per-run client overhead, seconds (>= 0).
    calibration_cov : array_like, shape (5, 5), optional
        Covariance of the fitted coefficients, in the order of ``CALIBRATED``
        (symmetric, positive semi-definite).
    """

    jitter_sd: float = 0.0
    stall_prob: float = 0.0
    stall_mean_s: float = 0.0
    speed_log_mean: float = 0.0
    speed_sd: float = 0.0
    prefill_log_mean: float = 0.0
    prefill_sd: float = 0.0
    overhead_sd: float = 0.0
    calibration_cov: tuple | None = None

    def __post_init__(self):
        # (the log-scale spreads and means bounded where their factors stay meaningful: beyond, exp() of a
        # draw overflows to inf, a run that never ends, or underflows to 0-long steps)
        for name in ("jitter_sd", "speed_sd", "prefill_sd"):
            object.__setattr__(self, name, check_float(name, getattr(self, name), low=0, high=MAX_LOG_SD))
        object.__setattr__(self, "overhead_sd", check_float("overhead_sd", self.overhead_sd, low=0, high=MAX_CLOCK_S))
        object.__setattr__(self, "stall_mean_s", check_float("stall_mean_s", self.stall_mean_s, low=0,
                                                             high=MAX_CLOCK_S))
        object.__setattr__(self, "stall_prob", check_float("stall_prob", self.stall_prob, low=0, high=1,
                                                           high_open=True))
        for name in ("speed_log_mean", "prefill_log_mean"):
            object.__setattr__(self, name, check_float(name, getattr(self, name), low=-MAX_LOG_MEAN,
                                                       high=MAX_LOG_MEAN))
        if self.calibration_cov is not None:
            try:
                cov = np.asarray(self.calibration_cov, dtype=float)
            except (TypeError, ValueError):
                raise ValueError(f"calibration_cov must be a finite symmetric 5 x 5 matrix of real numbers (the "
                                 f"covariance of {', '.join(CALIBRATED)}), got {self.calibration_cov!r}") from None
            if cov.shape != (5, 5) or not np.all(np.isfinite(cov)) or not np.allclose(cov, cov.T):
                raise ValueError(f"calibration_cov must be a finite symmetric 5 x 5 matrix (the covariance of "
                                 f"{', '.join(CALIBRATED)}), got shape {cov.shape}")
            if np.linalg.eigvalsh(cov).min() < -1e-12 * max(np.abs(cov).max(), 1e-300):
                raise ValueError("calibration_cov must be positive semi-definite, got a negative eigenvalue "
                                 f"{np.linalg.eigvalsh(cov).min():.3g}")
            object.__setattr__(self, "calibration_cov", tuple(tuple(float(x) for x in row) for row in cov))

    @property
    def per_step(self) -> bool:
        """Whether steps have noise of their own (jitter or stalls)."""
        return self.jitter_sd > 0 or (self.stall_prob > 0 and self.stall_mean_s > 0)

    @property
    def per_run(self) -> bool:
        """Whether each run draws effects of its own."""
        return (self.speed_log_mean != 0 or self.speed_sd > 0 or self.prefill_log_mean != 0
                or self.prefill_sd > 0 or self.overhead_sd > 0 or self.calibration_cov is not None)

    def cholesky(self) -> np.ndarray:
        """The lower Cholesky factor of ``calibration_cov`` (zeros without one;
        a semi-definite matrix by its eigen-decomposition, made triangular)."""
        if self.calibration_cov is None:
            return np.zeros((5, 5))
        cov = np.array(self.calibration_cov)
        scale = np.sqrt(np.clip(np.diag(cov), 0, None))
        s = np.where(scale > 0, scale, 1.0)
        corr = cov / np.outer(s, s)
        try:
            chol = np.linalg.cholesky(corr + 1e-12 * np.eye(5))
        except np.linalg.LinAlgError:   # semi-definite: through the eigen-decomposition
            w, v = np.linalg.eigh(corr)
            _, r = np.linalg.qr((v * np.sqrt(np.clip(w, 0, None))).T)
            chol = r.T * np.sign(np.diag(r))
        return chol * scale[:, None]

    def _record(self) -> np.ndarray:
        """The noise slots of the latency record (`kernel.layout` L_NOISE ..)."""
        from .kernel import layout as L

        r = np.zeros(L.N_LAT - L.L_NOISE)
        o = L.L_NOISE
        r[L.L_NOISE - o] = 1.0 if self.per_step else 0.0
        r[L.L_JITTER_SD - o] = self.jitter_sd
        r[L.L_JITTER_SHIFT - o] = -0.5 * self.jitter_sd * self.jitter_sd
        r[L.L_STALL_PROB - o] = self.stall_prob if self.stall_mean_s > 0 else 0.0
        r[L.L_STALL_MEAN - o] = self.stall_mean_s
        r[L.L_RUN - o] = 1.0 if self.per_run else 0.0
        r[L.L_SPEED_MU - o] = self.speed_log_mean
        r[L.L_SPEED_SD - o] = self.speed_sd
        r[L.L_PREFILL_MU - o] = self.prefill_log_mean
        r[L.L_PREFILL_SD - o] = self.prefill_sd
        r[L.L_OVERHEAD_SD - o] = self.overhead_sd
        r[L.L_CHOL - o:L.N_LAT_REGRESSION - o] = self.cholesky().ravel()
        return r


@dataclass(frozen=True)
class LatencyModel:
    """Duration of one engine step as a function of the batch it runs.

    ``step_s = base_s + decode_scale_s * max(n_decode - 1, 0) ** decode_alpha
    + prefill_per_token_s * n_prefill_tokens + ctx_per_token_s * n_context_tokens
    + swap_s_per_block * n_swap_blocks`` (added in this order)

    Parameters
    ----------
    base_s : float
        Time of a step with a single decoding sequence: weight loading,
        kernel launches and scheduler overhead (seconds, > 0).
    decode_scale_s, decode_alpha : float
        Extra time of each further decoding sequence in the batch; ``alpha > 1``
        captures the growth of the attention and memory traffic with batch size.
    prefill_per_token_s : float
        Compute time per prompt (prefill or recompute) token in the step.
    ctx_per_token_s : float
        Attention cost per token of KV touched by the step (context length).
    ttft_overhead_s : float
        Client-side time (HTTP, tokenisation, network) added to every
        request's first-token and completion times *as the client observes
        them*: it shifts TTFT, E2E and the end of the throughput window, but
        not the engine's steps, TPOT or ITL. 0 for a pure engine model; the
        A10G preset carries the value fitted from the traces' TTFTs.
    swap_s_per_block : float
        Time to move one KV block between GPU and CPU swap space (either
        direction, over PCIe), added to the step in which the transfer happens
        (``EngineConfig(preemption_mode="swap")``). 0 by default.
    noise : StepNoise or dict, optional
        The server's noise (per-step jitter and stalls, per-run effects, the
        calibration's uncertainty). ``None`` (the default for a model built
        by hand): deterministic steps. The calibrated preset carries its
        fitted noise; :meth:`deterministic` drops it.

    See ``docs/engine-model.md`` for how the batch quantities are counted.
    """

    base_s: float
    decode_scale_s: float = 0.0
    decode_alpha: float = 1.0
    prefill_per_token_s: float = 0.0
    ctx_per_token_s: float = 0.0
    ttft_overhead_s: float = 0.0
    swap_s_per_block: float = 0.0
    calibration: object = field(default=None, compare=False, repr=False)
    noise: StepNoise | None = None

    def __post_init__(self):
        object.__setattr__(self, "base_s", check_float("base_s", self.base_s, low=0, low_open=True))
        for name in ("decode_scale_s", "prefill_per_token_s", "ctx_per_token_s", "swap_s_per_block"):
            object.__setattr__(self, name, check_float(name, getattr(self, name), low=0))
        object.__setattr__(self, "ttft_overhead_s", check_float("ttft_overhead_s", self.ttft_overhead_s, low=0,
                                                                high=MAX_CLOCK_S))
        object.__setattr__(self, "decode_alpha",
                           check_float("decode_alpha", self.decode_alpha, low=0, low_open=True))
        if isinstance(self.noise, dict):
            object.__setattr__(self, "noise", StepNoise(**self.noise))
        if self.noise is not None and not isinstance(self.noise, StepNoise):
            raise ValueError(f"noise must be None, a fastsim.StepNoise or a dict of its fields, "
                             f"got {type(self.noise).__name__}")

    @property
    def is_stochastic(self) -> bool:
        """Whether steps or runs have noise (``noise`` with any effect)."""
        return self.noise is not None and (self.noise.per_step or self.noise.per_run)

    def deterministic(self) -> "LatencyModel":
        """The same model without its noise (``noise=None``)."""
        from dataclasses import replace

        return replace(self, noise=None)

    @classmethod
    def constant(cls, step_s: float) -> "LatencyModel":
        """Every step takes ``step_s`` seconds, whatever the batch (for theory checks)."""
        return cls(base_s=check_float("step_s", step_s, low=0, low_open=True))

    @classmethod
    def default(cls) -> "LatencyModel":
        """The built-in model: vLLM 0.22 serving Qwen2.5-1.5B-Instruct on one NVIDIA A10G.

        A robust fit to the decode-step traces shipped in
        ``fastsim/data/tpot_traces.json`` (see ``fastsim/data/README.md`` and
        :meth:`from_tpot_traces`), with deterministic steps. It reproduces
        the measured mean decode step within 1.3% at batch sizes 1-32. Its
        prefill cost per token is weakly identified by those traces (one
        prompt length) and is an upper bound. It includes the fitted
        client-side ``ttft_overhead_s`` (12.5 ms), so that TTFT and E2E are
        what a ``vllm bench serve`` client measures. The same calibration
        with its fitted noise (per-run effects and the calibration's
        covariance: the bands of a single run, ``docs/calibration.md``) is
        the preset ``"a10g-qwen2.5-1.5b"``; every backend and fleets take
        this deterministic one, the noisy one runs on the CPU backend.
        """
        return cls.preset("a10g-qwen2.5-1.5b-deterministic")

    @classmethod
    def deterministic_default(cls) -> "LatencyModel":
        """The A10G preset without noise: ``preset("a10g-qwen2.5-1.5b-deterministic")``, :meth:`default`."""
        return cls.preset("a10g-qwen2.5-1.5b-deterministic")

    @classmethod
    def preset(cls, name: str) -> "LatencyModel":
        """A named, packaged calibration (``fastsim._calibration.PRESETS``)."""
        from ._calibration import preset_latency_model

        return preset_latency_model(name)

    @classmethod
    def from_tpot_traces(cls, path, **kwargs) -> "LatencyModel":
        """Fit the model to decode-step (TPOT) traces.

        Parameters
        ----------
        path : str, path or dict
            A ``tpot_traces.json``-style file (see ``fastsim/data/README.md``).
        **kwargs
            Passed to ``fastsim._calibration.fit_tpot_traces``.

        Returns
        -------
        LatencyModel
            The fitted model; its ``calibration`` attribute holds the full
            :class:`~fastsim._calibration.CalibrationResult` (parameter
            standard errors, per-batch-size residuals, notes).
        """
        from ._calibration import fit_tpot_traces

        fit = fit_tpot_traces(path, **kwargs)
        model = fit.latency_model()
        object.__setattr__(model, "calibration", fit)
        return model

    @classmethod
    def from_vllm_bench(cls, paths, *, fit_prefill: bool = True, toml_path=None,
                        verbose: bool = False) -> "LatencyModel":
        """Fit the model to one or several ``vllm bench serve`` runs of one server.

        The runs must be saved with ``vllm bench serve --save-result
        --save-detailed`` (per-request ``ttfts``, ``itls``, ``input_lens``,
        ``output_lens`` and, in recent vLLM, ``start_times``). Several runs
        (say, at several request rates) are pooled into one fit. The batch
        behind each inter-token gap is rebuilt from the request timelines
        (see ``fastsim._calibration.fit_bench_serve`` for the method and its
        limits).

        Parameters
        ----------
        paths : path-like, dict, or a list of them
            One run or several.
        fit_prefill : bool
            Also estimate ``prefill_per_token_s`` and ``ttft_overhead_s``.
        toml_path : path-like, optional
            Write the fitted ``[latency]`` table (standard errors as comments)
            there, ready for a scenario TOML.
        verbose : bool
            Print the parameters with standard errors and the goodness-of-fit
            table (``model.calibration.report()``).

        Returns
        -------
        LatencyModel
            Its ``calibration`` attribute holds the
            :class:`~fastsim._calibration.CalibrationResult` (``summary()``,
            ``report()``, ``to_toml()``, ``diagnostics``).

        Raises
        ------
        ValueError
            A file of another kind (the message says which format it looks
            like), malformed or empty per-request lists, or too few gaps.
        """
        from pathlib import Path

        from ._calibration import fit_bench_serve

        fit = fit_bench_serve(paths, fit_prefill=fit_prefill)
        model = fit.latency_model()
        object.__setattr__(model, "calibration", fit)
        if toml_path is not None:
            Path(toml_path).write_text(fit.to_toml())
        if verbose:
            print(fit.report())
        return model

    @property
    def is_constant(self) -> bool:
        return (self.decode_scale_s == 0 and self.prefill_per_token_s == 0 and self.ctx_per_token_s == 0
                and self.swap_s_per_block == 0)

    def step_time(self, num_decode, num_prefill_tokens=0, num_context_tokens=0, num_swap_blocks=0):
        """Evaluate the model (vectorised over array arguments).

        Parameters
        ----------
        num_decode : array_like of int
            Decoding sequences in the step.
        num_prefill_tokens : array_like of int
            Prompt (or recompute) tokens in the step.
        num_context_tokens : array_like of int
            KV tokens touched by the step.
        num_swap_blocks : array_like of int
            KV blocks swapped out or in by the step.

        Returns
        -------
        numpy.ndarray or float
            Step duration in seconds.
        """
        nd = np.asarray(num_decode, dtype=float)
        npf = np.asarray(num_prefill_tokens, dtype=float)
        nc = np.asarray(num_context_tokens, dtype=float)
        nsw = np.asarray(num_swap_blocks, dtype=float)
        # Left to right in this order (docs/engine-model.md): the swap term last,
        # so that a step without transfers has exactly the duration without swap.
        out = (self.base_s + self.decode_scale_s * np.maximum(nd - 1.0, 0.0) ** self.decode_alpha
               + self.prefill_per_token_s * npf + self.ctx_per_token_s * nc
               + self.swap_s_per_block * nsw)
        return out[()] if out.ndim == 0 else out

    def _params(self) -> np.ndarray:
        """The latency record the kernel reads (`kernel.layout` ``L_*``): the
        coefficients (``swap_s_per_block`` at index 5), then the noise slots
        (all 0.0 without noise)."""
        from .kernel.layout import N_LAT

        out = np.zeros(N_LAT)
        out[:6] = (self.base_s, self.decode_scale_s, self.decode_alpha,
                   self.prefill_per_token_s, self.ctx_per_token_s, self.swap_s_per_block)
        if self.is_stochastic:
            out[6:] = self.noise._record()
        return out
