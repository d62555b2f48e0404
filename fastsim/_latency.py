"""The step-time (latency) model: how long one engine iteration takes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._validation import check_float


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

    def __post_init__(self):
        object.__setattr__(self, "base_s", check_float("base_s", self.base_s, low=0, low_open=True))
        for name in ("decode_scale_s", "prefill_per_token_s", "ctx_per_token_s", "ttft_overhead_s",
                     "swap_s_per_block"):
            object.__setattr__(self, name, check_float(name, getattr(self, name), low=0))
        object.__setattr__(self, "decode_alpha",
                           check_float("decode_alpha", self.decode_alpha, low=0, low_open=True))

    @classmethod
    def constant(cls, step_s: float) -> "LatencyModel":
        """Every step takes ``step_s`` seconds, whatever the batch (for theory checks)."""
        return cls(base_s=check_float("step_s", step_s, low=0, low_open=True))

    @classmethod
    def default(cls) -> "LatencyModel":
        """The built-in model: vLLM 0.22 serving Qwen2.5-1.5B-Instruct on one NVIDIA A10G.

        This is the preset ``"a10g-qwen2.5-1.5b"``: a robust fit to the
        decode-step traces shipped in ``fastsim/data/tpot_traces.json`` (see
        ``fastsim/data/README.md`` and :meth:`from_tpot_traces`). It reproduces
        the measured mean decode step within 1.3% at batch sizes 1-32. Its
        prefill cost per token is weakly identified by those traces (one
        prompt length) and is an upper bound. It includes the fitted
        client-side ``ttft_overhead_s`` (12.5 ms), so that TTFT and E2E are
        what a ``vllm bench serve`` client measures.
        """
        return cls.preset("a10g-qwen2.5-1.5b")

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
        """The parameters in the order the kernel reads them (``swap_s_per_block``
        last, at index 5)."""
        return np.array([self.base_s, self.decode_scale_s, self.decode_alpha,
                         self.prefill_per_token_s, self.ctx_per_token_s, self.swap_s_per_block],
                        dtype=np.float64)
