"""vLLM 0.22.0's own rule for a model's maximum length, as an oracle for
`fastsim._models.derived_max_model_len_of` and the check `fastsim.Deployment`
makes of ``max_model_len``: for model configs with and without RoPE scaling
(YaRN, dynamic, linear, Llama 3's, both RoPE keys, a ``model_max_length``
key, none of the length keys), vLLM's derived
default is fastsim's, vLLM takes exactly the lengths fastsim takes, and
refuses one token more as fastsim does.

Runs in the oracle environment (``bash tests/oracle/install.sh``; skipped
when vLLM cannot be imported)."""

from __future__ import annotations

import copy
import types

import pytest

import fastsim
from fastsim._models import ModelSpec, derived_max_model_len_of

pytestmark = pytest.mark.oracle

vllm = pytest.importorskip("vllm", reason="vLLM 0.22.0 is not installed (bash tests/oracle/install.sh)")
transformers = pytest.importorskip("transformers")

BASE = dict(model_type="llama", hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
            num_hidden_layers=32, intermediate_size=14336, vocab_size=128256, rope_theta=500000.0)

CONFIGS = {
    "plain 4096": dict(BASE, max_position_embeddings=4096),
    "yarn x4 from 32768": dict(BASE, model_type="qwen2", max_position_embeddings=32768,
                               rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    "dynamic x2": dict(BASE, max_position_embeddings=4096, rope_scaling={"type": "dynamic", "factor": 2.0}),
    "linear x2": dict(BASE, max_position_embeddings=8192, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "llama3 (already scaled)": dict(BASE, max_position_embeddings=131072, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}),
    "model_max_length key": dict(BASE, max_position_embeddings=8192, model_max_length=16384),
    # (Transformers' class default, 2048 for Llama; the Qwen class's 32768)
    "no max_position_embeddings (llama)": dict(BASE),
    "no max_position_embeddings (qwen2)": dict(BASE, model_type="qwen2"),
    # (both stated: rope_scaling's is taken; YaRN's inner original length beside a top-level one)
    "rope_scaling and rope_parameters": dict(BASE, max_position_embeddings=4096,
                                             rope_scaling={"type": "dynamic", "factor": 2.0},
                                             rope_parameters={"rope_type": "linear", "factor": 3.0}),
    "yarn, inner and top-level original lengths": dict(
        BASE, model_type="qwen2", max_position_embeddings=32768, original_max_position_embeddings=8192,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
}


def _vllm_max_len(config: dict, max_model_len):
    """vLLM's `_get_and_verify_max_len` of a config dict, loaded as vLLM
    loads one (its RoPE fields patched, `patch_rope_parameters`)."""
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.config import patch_rope_parameters
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    d = copy.deepcopy(config)
    hf = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    patch_rope_parameters(hf)
    arch = types.SimpleNamespace(
        derived_max_model_len_and_key=ModelArchConfigConvertorBase(hf, hf).derive_max_model_len_and_key())
    return _get_and_verify_max_len(hf, arch, None, max_model_len, False, None)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_derived_maximum_and_its_check_are_vllms(name):
    config = CONFIGS[name]
    spec = ModelSpec.from_config(config, name=name)
    ours = spec.derived_max_model_len
    assert derived_max_model_len_of(config) in (ours, None)   # (None: the class default, `from_config`'s)
    assert _vllm_max_len(config, None) == ours
    limit = max(ours, config.get("model_max_length") or 0)
    assert _vllm_max_len(config, limit) == limit
    with pytest.raises(ValueError, match="max_model_len"):
        _vllm_max_len(config, limit + 1)
    kw = dict(gpu="H100", tensor_parallel_size=1, enable_chunked_prefill=True, num_gpu_blocks_override=100_000)
    assert fastsim.Deployment(model=spec, max_model_len=limit, **kw).max_model_len == limit
    with pytest.raises(ValueError, match=rf"max_model_len={limit + 1} must be at most the model's length"):
        fastsim.Deployment(model=spec, max_model_len=limit + 1, **kw)
