"""Model architectures: the few numbers of a Hugging Face ``config.json`` that
decide weight memory, KV-cache size and per-step work.

Dense and mixture-of-experts decoder-only transformers (Llama, Qwen2/2.5/3,
Qwen3-MoE, Mistral, Mixtral and their relatives), with grouped-query
attention, QKV biases (Qwen2), QK norms (Qwen3) and tied embeddings. The
packaged configs are in ``fastsim/data/models/`` (origin in
``fastsim/data/README.md``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ._validation import check_bool, check_int

#: vLLM pads the vocabulary of its (vocab-parallel) embedding and LM head to a
#: multiple of this (``DEFAULT_VOCAB_PADDING_SIZE`` in vLLM's
#: ``vocab_parallel_embedding.py``).
VOCAB_PADDING = 64

# catalogue name -> packaged config file; names are matched case-insensitively, with or
# without the organisation prefix. Base and instruct variants share an architecture.
_CATALOGUE = {
    "meta-llama/Llama-2-7b-hf": "llama-2-7b-hf.json",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b-instruct.json",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b-instruct.json",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b-instruct.json",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b-instruct.json",
    "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b-instruct.json",
    "Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b-instruct.json",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct.json",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b-instruct.json",
    "Qwen/Qwen3-14B": "qwen3-14b.json",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b.json",
    "mistralai/Mistral-Nemo-Instruct-2407": "mistral-nemo-instruct-2407.json",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b-v0.1.json",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b-v0.1.json",
    "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b-instruct-hf.json",
    "01-ai/Yi-34B": "yi-34b.json",
}
_SUPPORTED_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe")

#: Each supported type's ``max_position_embeddings`` where a config leaves it out: its Transformers config
#: class's default (Transformers 5.24: ``LlamaConfig`` 2048, ``MistralConfig`` and ``MixtralConfig`` 4096 * 32,
#: the Qwen classes 32768), which vLLM reads.
_DEFAULT_POSITIONS = {"llama": 2048, "mistral": 131072, "mixtral": 131072, "qwen2": 32768, "qwen3": 32768,
                      "qwen3_moe": 32768, "qwen2_moe": 32768}


def model_names() -> list[str]:
    """The catalogue's model names (Hugging Face repository ids)."""
    return list(_CATALOGUE)


def _lookup(name: str):
    key = name.strip().lower()
    for full, fname in _CATALOGUE.items():
        if key in (full.lower(), full.split("/", 1)[1].lower()):
            return full, fname
    return None, None


#: The config keys vLLM reads a model's length from, the smallest present winning (vLLM 0.22's
#: ``ModelArchConfigConvertorBase.derive_max_model_len_and_key``).
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def derived_max_model_len_of(config: dict) -> int | None:
    """vLLM 0.22's derived maximum model length of a Hugging Face config
    (a dict; ``vllm/config/model.py``, ``_get_and_verify_max_len``): the
    smallest of its `LENGTH_KEYS` present, or its ``model_max_length`` where
    it has one; then, with RoPE parameters (``rope_parameters``, or
    ``rope_scaling`` as older configs name them; one dict, or one per layer
    type) of a type other than ``su``, ``longrope`` and ``llama3`` (whose
    lengths already state the scaled context), times their ``factor`` (1 if
    absent), from ``original_max_position_embeddings`` for ``yarn``. None
    where the config has none of the keys (`ModelSpec.from_config` gives a
    config its class's ``max_position_embeddings`` first, as Transformers
    does). Not modelled: the smaller of this and a tokenizer config's
    ``model_max_length`` (a ``config.json`` does not carry it), and
    LongRoPE's default of ``original_max_position_embeddings`` (no supported
    model type uses LongRoPE)."""
    present = [int(config[k]) for k in LENGTH_KEYS if config.get(k) is not None]
    if not present:
        return None
    derived = float(config["model_max_length"]) if config.get("model_max_length") else float(min(present))
    # (a config stating both: Transformers and vLLM take ``rope_scaling``'s)
    rope = config.get("rope_scaling") if config.get("rope_scaling") is not None else config.get("rope_parameters")
    if isinstance(rope, dict) and rope and "gemma3" not in str(config.get("model_type", "")):
        layers = list(rope.values()) if all(isinstance(v, dict) for v in rope.values()) else [rope]
        factor = 1.0
        for rp in layers:
            if rp.get("rope_type", rp.get("type", "default")) in ("su", "longrope", "llama3"):
                continue
            factor = rp.get("factor", factor)
            # (a top-level original_max_position_embeddings overrides the RoPE parameters' own: vLLM patches it
            # in with Transformers 4, Transformers 5 standardises the parameters so)
            ompe = config.get("original_max_position_embeddings") or rp.get("original_max_position_embeddings")
            if rp.get("rope_type", rp.get("type")) == "yarn" and ompe:
                derived = float(ompe)
        derived *= 1.0 if factor is None else float(factor)
    return int(derived)


@dataclass(frozen=True)
class ModelSpec:
    """The architecture of a decoder-only transformer (Hugging Face config names).

    Build it with :meth:`from_config` (a catalogue name, a ``config.json`` path
    or its dict). ``num_experts = 0`` is a dense model.
    """

    name: str
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    max_position_embeddings: int = 4096
    #: The longest ``max_model_len`` vLLM derives from the config (`derived_max_model_len`); None: stated by
    #: ``max_position_embeddings`` alone. ``model_max_length``: the config's key of that name (vLLM lets a
    #: ``max_model_len`` above the derived length up to it).
    max_model_len_limit: int | None = None
    model_max_length: int | None = None

    def __post_init__(self):
        for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
            object.__setattr__(self, key, check_int(f"model.{key}", getattr(self, key), low=1))
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "shared_expert_intermediate_size"):
            object.__setattr__(self, key, check_int(f"model.{key}", getattr(self, key), low=0))
        for key in ("tie_word_embeddings", "qkv_bias", "qk_norm"):
            object.__setattr__(self, key, check_bool(f"model.{key}", getattr(self, key)))
        for key in ("max_model_len_limit", "model_max_length"):
            object.__setattr__(self, key, check_int(f"model.{key}", getattr(self, key), low=1, optional=True))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"model.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"model.num_experts_per_tok must be in [1, num_experts={self.num_experts}] "
                             f"for a mixture-of-experts model, got {self.num_experts_per_tok}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def derived_max_model_len(self) -> int:
        """The longest context vLLM serves by default, and the largest
        ``max_model_len`` it takes (unless ``model_max_length`` is larger):
        the smallest of the config's length keys, times the RoPE scaling
        factor (`derived_max_model_len_of`)."""
        return self.max_position_embeddings if self.max_model_len_limit is None else self.max_model_len_limit

    @classmethod
    def from_config(cls, config, name: str | None = None) -> "ModelSpec":
        """A model from a catalogue name, a path to a ``config.json``, or its dict.

        Raises
        ------
        ValueError
            An unknown name, an unreadable file, an unsupported architecture
            (the message names the supported ``model_type`` values) or a
            missing field.
        """
        if isinstance(config, ModelSpec):
            return config
        if isinstance(config, (str, Path)):
            full, fname = _lookup(str(config)) if isinstance(config, str) else (None, None)
            if fname is not None:
                text = resources.files("fastsim").joinpath(f"data/models/{fname}").read_text()
                return cls.from_config(json.loads(text), name=full)
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ValueError(f"model must be a catalogue name, a path to a Hugging Face config.json or "
                                 f"its dict, got {str(config)!r} (no such file); known models: "
                                 f"{', '.join(model_names())}")
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"model: cannot read {str(path)!r} as JSON: {exc}") from None
            return cls.from_config(data, name=name or str(path))
        if not isinstance(config, dict):
            raise ValueError(f"model must be a catalogue name, a config.json path or a dict, got {config!r}")
        c = dict(config)
        if "text_config" in c and "hidden_size" not in c:
            c = dict(c["text_config"])  # multimodal wrappers keep the language model here
        mtype = c.get("model_type")
        if mtype not in _SUPPORTED_TYPES:
            raise ValueError(f"model: model_type {mtype!r} is not supported; supported: "
                             f"{', '.join(_SUPPORTED_TYPES)} (dense or MoE decoders with standard attention)")
        need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
        missing = [k for k in need if k not in c]
        if missing:
            raise ValueError(f"model config is missing {missing}")
        # (a config without max_position_embeddings has its Transformers class's default, as vLLM loads it)
        c.setdefault("max_position_embeddings", _DEFAULT_POSITIONS[mtype])
        h, nh = c["hidden_size"], c["num_attention_heads"]
        experts = c.get("num_local_experts", c.get("num_experts", 0)) or 0
        return cls(
            name=name or c.get("_name_or_path") or mtype,
            model_type=mtype,
            num_hidden_layers=c["num_hidden_layers"], hidden_size=h, num_attention_heads=nh,
            num_key_value_heads=c.get("num_key_value_heads") or nh,
            head_dim=c.get("head_dim") or h // nh,
            intermediate_size=c.get("intermediate_size", 4 * h),
            vocab_size=c["vocab_size"],
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            # Qwen2 has biases on q, k, v (hard-wired in vLLM's qwen2.py, not in the config)
            qkv_bias=bool(c.get("attention_bias", mtype in ("qwen2", "qwen2_moe"))),
            qk_norm=mtype in ("qwen3", "qwen3_moe"),
            num_experts=int(experts),
            num_experts_per_tok=int(c.get("num_experts_per_tok", 0) or 0) if experts else 0,
            moe_intermediate_size=int(c.get("moe_intermediate_size") or c.get("intermediate_size", 0))
            if experts else 0,
            shared_expert_intermediate_size=int(c.get("shared_expert_intermediate_size", 0) or 0),
            max_position_embeddings=c["max_position_embeddings"],
            max_model_len_limit=derived_max_model_len_of(c),
            model_max_length=c.get("model_max_length"),
        )

    # ---- per tensor-parallel rank --------------------------------------------------------------

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads a rank holds (vLLM replicates KV heads when ``tp`` exceeds them)."""
        return max(1, self.num_key_value_heads // tp)

    def padded_vocab(self) -> int:
        return -(-self.vocab_size // VOCAB_PADDING) * VOCAB_PADDING

    def param_counts(self, tp: int = 1) -> dict:
        """Parameters held by one tensor-parallel rank, by kind.

        Returns
        -------
        dict
            ``linear`` (the GEMM weights of the layers: QKV, output projection,
            dense MLP or all experts, shared experts), ``embedding`` (input
            embedding, vocab-parallel), ``lm_head`` (0 when tied), ``other``
            (norms, biases, routers).
        """
        h, hd, L = self.hidden_size, self.head_dim, self.num_hidden_layers
        q = self.num_attention_heads // tp * hd
        kv = self.kv_heads_per_rank(tp) * hd
        attn = h * (q + 2 * kv) + q * h
        if self.is_moe:
            mlp = self.num_experts * 3 * h * self.moe_intermediate_size // tp
            mlp += 3 * h * self.shared_expert_intermediate_size // tp
            router = h * self.num_experts + (h if self.shared_expert_intermediate_size else 0)
        else:
            mlp, router = 3 * h * self.intermediate_size // tp, 0
        other = L * (2 * h + (q + 2 * kv if self.qkv_bias else 0) + (2 * hd if self.qk_norm else 0) + router) + h
        vocab = self.padded_vocab() // tp * h
        return {"linear": L * (attn + mlp), "embedding": vocab,
                "lm_head": 0 if self.tie_word_embeddings else vocab, "other": other}

    def num_parameters(self) -> int:
        """All parameters of the model (unpadded vocabulary, TP 1)."""
        c = self.param_counts(1)
        pad = (self.padded_vocab() - self.vocab_size) * self.hidden_size
        return c["linear"] + c["embedding"] + c["lm_head"] + c["other"] - pad * (1 if self.tie_word_embeddings
                                                                                  else 2)

    def kv_bytes_per_token(self, tp: int = 1, kv_bytes: int = 2) -> int:
        """KV-cache bytes of one token on one rank, over all layers (K and V)."""
        return 2 * self.num_hidden_layers * self.kv_heads_per_rank(tp) * self.head_dim * kv_bytes

    def active_linear_params_per_token(self, tp: int = 1) -> int:
        """GEMM weights one token multiplies on one rank (the MoE experts it is routed to)."""
        h = self.hidden_size
        c = self.param_counts(tp)
        if not self.is_moe:
            return c["linear"]
        all_experts = self.num_hidden_layers * self.num_experts * 3 * h * self.moe_intermediate_size // tp
        per_expert = all_experts // self.num_experts
        return c["linear"] - all_experts + self.num_experts_per_tok * per_expert
