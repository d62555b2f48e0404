"""A deployment as vLLM is launched: a model, a GPU and vLLM's engine arguments.

``Deployment.num_gpu_blocks`` follows vLLM's V1 memory profiling
(``vllm/v1/worker/gpu_worker.py``, ``Worker.determine_available_memory``, and
``vllm/v1/core/kv_cache_utils.py``, ``get_num_blocks``; versions 0.10 to 0.22
share it)::

    requested   = total_memory * gpu_memory_utilization
    available   = requested - (weights + peak activation of the profiling run
                               + non-torch memory)
    num_blocks  = available // (block_size * kv_bytes_per_token_per_layer * num_layers)

all per tensor-parallel rank. The weights are counted from the config. The
profiling run is a forward pass of ``max_num_batched_tokens`` tokens
followed by a sampler pass over ``max_num_seqs`` sequences; fastsim
estimates its peak as the MLP activations of the forward pass plus
:data:`LOGIT_COPIES` float32 copies of the ``max_num_seqs x vocab`` logits,
and the non-torch memory (cuBLAS workspaces, CUDA graph pools) as
:data:`NON_TORCH_BYTES`. Those two constants are fitted to the two vLLM runs
in ``../shared/data`` (A10G / Qwen2.5-1.5B, vLLM 0.22, and RTX 4090 /
Llama-3.1-8B, vLLM 0.19); ``docs/deployment.md`` gives the check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from ._config import EngineConfig
from ._hardware import DTYPES, GIB, KV_DTYPES, MIB, get_gpu, gpu_names
from ._models import ModelSpec
from ._validation import MAX_TOKENS, check_bool, check_choice, check_int

#: Float32 copies of the ``max_num_seqs x vocab`` logits alive at the peak of
#: vLLM's dummy sampler run (logits, probabilities, sorted values and int64
#: indices of top-k/top-p); fitted (6.0) to the two runs, rounded.
LOGIT_COPIES = 6
#: Memory vLLM's profiler sees grow outside torch's allocator (cuBLAS/cuDNN
#: workspaces, CUDA graph pools): fitted to the two runs (192 MiB).
NON_TORCH_BYTES = 192 * MIB
QUANTIZATIONS = (None, "fp8")
#: vLLM version whose names and defaults the deployment follows.
VLLM_VERSION = "0.22"
# set while _what_fits tries alternatives, so that their failures do not search again
_PROBING = [False]


@dataclass(frozen=True)
class Deployment:
    """A model served by vLLM on one or more identical GPUs (vLLM's argument names).

    Parameters
    ----------
    model : str, path or dict
        A catalogue name (``fastsim._models.model_names()``, e.g.
        ``"meta-llama/Llama-3.1-8B-Instruct"``), a path to a Hugging Face
        ``config.json`` (or its folder), or the config's dict.
    gpu : str or GPU
        A catalogue name (case-insensitive, with aliases: ``"H100"``,
        ``"4090"``...) or a :class:`fastsim.GPU`.
    tensor_parallel_size : int
        GPUs the model is sharded over; must divide the attention heads.
    dtype : {"bfloat16", "float16", "auto"}
        Activation and (unquantized) weight type.
    kv_cache_dtype : {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"}
        KV-cache element type (``"auto"``: as ``dtype``).
    quantization : {None, "fp8"}
        Weight quantization: ``"fp8"`` stores the layers' GEMM weights in one
        byte (embedding and LM head stay in ``dtype``, as vLLM's fp8 does).
    gpu_memory_utilization : float
        Fraction of the GPU's memory vLLM may use, in (0, 1].
    max_model_len : int, optional
        Longest prompt + output; by default the model's
        (`ModelSpec.derived_max_model_len`: ``max_position_embeddings``, or
        the smallest of the config's length keys, times its RoPE scaling
        factor, as vLLM derives it), and at most that (or the config's
        ``model_max_length``), as vLLM refuses a longer one. As in vLLM, the
        KV cache must hold one request of this length.
    max_num_seqs, max_num_batched_tokens, block_size : int
        vLLM's scheduler limits and KV block size (defaults: fastsim's, as in the
        interface; vLLM's own ``max_num_batched_tokens`` default
        depends on the GPU and entry point).
    enable_prefix_caching, enable_chunked_prefill : bool
    num_gpu_blocks_override : int, optional
        vLLM's override: use this many blocks (>= 2) instead of the profiled count.

    Attributes
    ----------
    num_gpu_blocks : int
        KV blocks per rank, as vLLM computes them.
    engine : EngineConfig
    latency : RooflineLatency
        The roofline step-time model (:class:`fastsim.Roofline`), evaluated
        by the kernel at every step.
    regression_latency : LatencyModel
        The roofline mapped onto the kernel's regression form over this
        deployment's operating range.

    Examples
    --------
    The RTX 4090 run in ``../shared/data`` (vLLM 0.19 reported 2588 blocks):

    >>> import fastsim
    >>> dep = fastsim.Deployment(model="meta-llama/Llama-3.1-8B", gpu="4090", gpu_memory_utilization=0.9,
    ...                          max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=32768)
    >>> dep.num_gpu_blocks
    2590
    >>> dep.engine.num_gpu_blocks * dep.engine.block_size
    41440
    """

    model: object
    gpu: object
    tensor_parallel_size: int = 1
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    num_gpu_blocks_override: int | None = None
    spec: ModelSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        s = object.__setattr__
        s(self, "spec", ModelSpec.from_config(self.model))
        s(self, "gpu", get_gpu(self.gpu))
        s(self, "tensor_parallel_size", check_int("tensor_parallel_size", self.tensor_parallel_size, low=1,
                                                  high=1024))
        check_choice("dtype", self.dtype, tuple(DTYPES))
        check_choice("kv_cache_dtype", self.kv_cache_dtype, tuple(KV_DTYPES))
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be None or 'fp8', got {self.quantization!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or isinstance(u, bool) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization must be a fraction of the GPU's memory in (0, 1], got "
                             f"{u!r} (vLLM's default is 0.9)")
        s(self, "gpu_memory_utilization", float(u))
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            s(self, name, check_int(name, getattr(self, name), low=1, high=MAX_TOKENS))
        for name in ("enable_prefix_caching", "enable_chunked_prefill"):
            s(self, name, check_bool(name, getattr(self, name)))
        # (at least 2: vLLM V1's null block is one of them; `EngineConfig` named num_gpu_blocks for 1)
        s(self, "num_gpu_blocks_override", check_int("num_gpu_blocks_override", self.num_gpu_blocks_override,
                                                     low=2, high=MAX_TOKENS, optional=True))
        spec, tp = self.spec, self.tensor_parallel_size
        if spec.num_attention_heads % tp:
            ok = [t for t in range(1, spec.num_attention_heads + 1) if spec.num_attention_heads % t == 0
                  and (spec.num_key_value_heads % t == 0 or t % spec.num_key_value_heads == 0)]
            raise ValueError(f"tensor_parallel_size={tp} must divide the model's {spec.num_attention_heads} "
                             f"attention heads (vLLM shards heads over ranks); valid sizes: "
                             f"{', '.join(map(str, ok[:12]))}")
        if spec.num_key_value_heads % tp and tp % spec.num_key_value_heads:
            raise ValueError(f"tensor_parallel_size={tp} and the model's {spec.num_key_value_heads} KV heads: "
                             f"one must divide the other (vLLM shards or replicates KV heads)")
        mml = spec.derived_max_model_len if self.max_model_len is None else self.max_model_len
        s(self, "max_model_len", check_int("max_model_len", mml, low=2, high=MAX_TOKENS))
        limit = spec.derived_max_model_len
        if self.max_model_len > limit and not (spec.model_max_length and self.max_model_len <= spec.model_max_length):
            # (vLLM 0.22's `get_and_verify_max_len`; it takes a longer one only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)
            raise ValueError(f"max_model_len={self.max_model_len} must be at most the model's length, {limit} "
                             f"(the smallest of its config's length keys, times its RoPE scaling factor: vLLM "
                             f"refuses a longer one unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; to model that, give a "
                             f"ModelSpec with max_model_len_limit set)")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
                             f"({self.max_model_len}) without chunked prefill (vLLM refuses it too); enable "
                             f"chunked prefill or lower max_model_len")
        self._check_fits()

    # ---- memory ---------------------------------------------------------------------------------

    @property
    def weight_bytes_per_rank(self) -> int:
        """Bytes of weights one tensor-parallel rank loads."""
        c = self.spec.param_counts(self.tensor_parallel_size)
        wb = DTYPES[self.dtype]
        lin_b = 1 if self.quantization == "fp8" else wb
        return int(c["linear"] * lin_b + (c["embedding"] + c["lm_head"] + c["other"]) * wb)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token on one rank, all layers."""
        kb = KV_DTYPES[self.kv_cache_dtype] or DTYPES[self.dtype]
        return self.spec.kv_bytes_per_token(self.tensor_parallel_size, kb)

    @property
    def page_bytes(self) -> int:
        """Bytes of one KV block over all layers, per rank."""
        return self.block_size * self.kv_bytes_per_token

    @property
    def profile_peak_bytes(self) -> int:
        """Peak activation memory of vLLM's profiling run, per rank (estimate)."""
        sp, tp = self.spec, self.tensor_parallel_size
        inter = (sp.moe_intermediate_size * sp.num_experts_per_tok if sp.is_moe else sp.intermediate_size) // tp
        # MLP input and residual (2 x hidden), gate_up (2 x inter) and activation (inter)
        act = self.max_num_batched_tokens * (3 * inter + 4 * sp.hidden_size) * DTYPES[self.dtype]
        logits = LOGIT_COPIES * self.max_num_seqs * sp.padded_vocab() // tp * 4
        return int(act + logits)

    @property
    def non_kv_bytes(self) -> int:
        """Weights + profiling peak + non-torch memory, per rank."""
        return self.weight_bytes_per_rank + self.profile_peak_bytes + NON_TORCH_BYTES

    @property
    def requested_bytes(self) -> int:
        return int(self.gpu.total_memory_bytes * self.gpu_memory_utilization)

    @property
    def available_kv_bytes(self) -> int:
        return self.requested_bytes - self.non_kv_bytes

    @property
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks per rank, as vLLM reports them (``num_gpu_blocks``)."""
        if self.num_gpu_blocks_override is not None:
            return self.num_gpu_blocks_override
        return int(self.available_kv_bytes // self.page_bytes)

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def _check_fits(self):
        g = self.gpu
        avail = self.available_kv_bytes
        if avail <= 0:
            need = self.non_kv_bytes
            msg = (f"model {self.spec.name!r} does not fit: {self.weight_bytes_per_rank / GIB:.2f} GiB of weights "
                   f"+ {(need - self.weight_bytes_per_rank) / GIB:.2f} GiB of activations and buffers per GPU, but "
                   f"gpu_memory_utilization={self.gpu_memory_utilization} of a {g.name} "
                   f"({g.total_memory_bytes / GIB:.1f} GiB usable) is {self.requested_bytes / GIB:.2f} GiB")
            raise ValueError(msg if _PROBING[0] else msg + "; " + self._what_fits())
        if self.num_gpu_blocks_override is None and self.kv_cache_tokens < self.max_model_len:
            est = self.kv_cache_tokens
            need = math.ceil(self.max_model_len / self.block_size)
            raise ValueError(f"max_model_len={self.max_model_len} needs {need}"
                             f" KV blocks for one request, but only {self.num_gpu_blocks} fit "
                             f"({avail / GIB:.2f} GiB of KV cache on a {g.name}); as vLLM suggests, set "
                             f"max_model_len <= {est}, raise gpu_memory_utilization or tensor_parallel_size")

    def _what_fits(self) -> str:
        _PROBING[0] = True
        try:
            return self._alternatives()
        finally:
            _PROBING[0] = False

    def _alternatives(self) -> str:
        import dataclasses

        tips = []
        for tp in (2, 4, 8, 16):
            if tp <= self.tensor_parallel_size or self.spec.num_attention_heads % tp:
                continue
            try:
                dataclasses.replace(self, model=self.spec, tensor_parallel_size=tp, max_model_len=None
                                    if self.max_model_len == self.spec.derived_max_model_len else self.max_model_len)
            except ValueError:
                continue
            tips.append(f"tensor_parallel_size={tp} would fit")
            break
        if self.quantization is None:
            try:
                dataclasses.replace(self, model=self.spec, quantization="fp8")
                tips.append("quantization='fp8' would fit")
            except ValueError:
                pass
        bigger = []
        for name in gpu_names():
            if name == self.gpu.name:
                continue
            try:
                dataclasses.replace(self, model=self.spec, gpu=name)
                bigger.append(name)
            except ValueError:
                pass
        if bigger:
            tips.append(f"at this tensor_parallel_size it fits on: {', '.join(bigger)}")
        return "; ".join(tips) if tips else "no catalogue GPU holds it at up to tensor_parallel_size=16"

    # ---- derived objects ------------------------------------------------------------------------

    @property
    def engine(self) -> EngineConfig:
        """The :class:`EngineConfig` of this deployment (vLLM's scheduler limits and KV blocks)."""
        return EngineConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                            block_size=self.block_size, num_gpu_blocks=self.num_gpu_blocks,
                            enable_chunked_prefill=self.enable_chunked_prefill, max_model_len=self.max_model_len,
                            enable_prefix_caching=self.enable_prefix_caching)

    @cached_property
    def roofline(self):
        """The :class:`fastsim.Roofline` step-time model of this deployment."""
        from ._roofline import Roofline

        return Roofline.from_deployment(self)

    @cached_property
    def latency(self):
        """The roofline evaluated by the kernel at every step (a :class:`fastsim.RooflineLatency`;
        its ``.regression`` is :attr:`regression_latency`)."""
        return self.roofline.to_kernel_latency(max_num_seqs=self.max_num_seqs,
                                               max_num_batched_tokens=self.max_num_batched_tokens,
                                               max_context=min(self.max_model_len, 8192))

    @cached_property
    def regression_latency(self):
        """The roofline mapped onto the kernel's regression form (a :class:`LatencyModel`)."""
        return self.roofline.to_latency_model(max_num_seqs=self.max_num_seqs,
                                              max_num_batched_tokens=self.max_num_batched_tokens,
                                              max_context=min(self.max_model_len, 8192))

    def summary(self) -> str:
        """Memory breakdown per rank, as vLLM logs it."""
        return (f"{self.spec.name} on {self.tensor_parallel_size} x {self.gpu.name} (vLLM {VLLM_VERSION} "
                f"memory profile): requested {self.requested_bytes / GIB:.2f} GiB, weights "
                f"{self.weight_bytes_per_rank / GIB:.2f} GiB, profiling peak {self.profile_peak_bytes / GIB:.2f} GiB, "
                f"non-torch {NON_TORCH_BYTES / GIB:.2f} GiB, KV cache {self.available_kv_bytes / GIB:.2f} GiB = "
                f"{self.num_gpu_blocks} blocks of {self.block_size} tokens ({self.kv_cache_tokens} tokens)")
