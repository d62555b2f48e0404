"""GPU and model catalogues, Deployment's KV capacity against vLLM's reports, and
its input validation."""

import json
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

import fastsim
from fastsim._deployment import Deployment
from fastsim._hardware import GPU, get_gpu, gpu_names
from fastsim._models import ModelSpec, model_names

REPORTS = pd.read_csv(resources.files("fastsim").joinpath("data/vllm_kv_cache_reports.csv"))


def _deployment(row, **kw):
    return Deployment(model=row.model, gpu=row.gpu, gpu_memory_utilization=row.gpu_memory_utilization,
                      max_num_seqs=int(row.max_num_seqs), max_num_batched_tokens=int(row.max_num_batched_tokens),
                      max_model_len=int(row.max_model_len), block_size=int(row.block_size), **kw)


# Two of the six reports (the sweep at 0.3 and the TPOT-trace run at 0.85, max_num_seqs 32) show
# more non-KV memory than the sweep's 0.5/0.7/0.9 runs of the same server (272 and 206 MiB against
# the line those three lie on to the block), which nothing in vLLM's formula produces (it is affine
# in the utilisation, and its max_num_seqs terms shrink with it); they are 9.7% and 2.0% above
# (docs/deployment.md, "KV capacity").
_ANOMALOUS = {(0.3, 64), (0.85, 32)}
_CASES = [pytest.param(i, marks=pytest.mark.xfail(strict=True, reason="200-300 MiB more non-KV memory in this "
                                                                       "run than vLLM's formula gives"))
          if (REPORTS.gpu_memory_utilization[i], REPORTS.max_num_seqs[i]) in _ANOMALOUS else i
          for i in range(len(REPORTS))]


@pytest.mark.parametrize("i", _CASES)
def test_num_gpu_blocks_matches_vllm(i):
    row = REPORTS.iloc[i]
    got = _deployment(row).num_gpu_blocks
    assert abs(got / row.num_gpu_blocks - 1) <= 0.02, (row.to_dict(), got)


def test_blocks_grow_with_memory_at_the_page_rate():
    """Between two utilisations the KV cache grows by exactly the extra memory (vLLM's formula is affine)."""
    row = REPORTS.iloc[1].copy()
    a = _deployment(row)
    row["gpu_memory_utilization"] = 0.7
    b = _deployment(row)
    extra = b.requested_bytes - a.requested_bytes
    assert abs((b.num_gpu_blocks - a.num_gpu_blocks) - extra / a.page_bytes) <= 1


@pytest.mark.parametrize("name", ["A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe",
                                  "H200", "B200", "RTX-4090"])
def test_gpu_catalogue(name):
    g = get_gpu(name.lower())
    assert g.name == name and get_gpu(name.upper()) is g
    assert g.sources and 0 < g.total_memory_bytes < g.memory_gib * 2 ** 30


def test_gpu_aliases_and_custom():
    assert get_gpu("h100").name == "H100-SXM" and get_gpu("4090").name == "RTX-4090"
    assert get_gpu("A100").name == "A100-80GB" and get_gpu("H100 PCIe").name == "H100-PCIe"
    g = fastsim.GPU(name="my-gpu", memory_gib=96, memory_bandwidth_tbs=1.79, bf16_tflops=500.0, fp8_tflops=1000.0,
                    interconnect_gbs=64)
    d = Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu=g, max_model_len=8192)
    assert d.num_gpu_blocks > 0 and d.gpu is g
    with pytest.raises(ValueError, match="GPU.memory_gib"):
        GPU(name="x", memory_gib=-1, memory_bandwidth_tbs=1, bf16_tflops=1)


def test_model_parameter_counts():
    """Parameter counts from the configs equal the published totals (Hugging Face model cards / safetensors)."""
    published = {"meta-llama/Llama-3.1-8B": 8_030_261_248, "meta-llama/Llama-2-7b-hf": 6_738_415_616,
                 "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304, "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
                 "meta-llama/Llama-3.1-70B": 70_553_706_496}
    for name, n in published.items():
        assert ModelSpec.from_config(name).num_parameters() == n
    moe = ModelSpec.from_config("Qwen/Qwen3-30B-A3B")
    assert moe.is_moe and moe.qk_norm and 3.0e9 < moe.active_linear_params_per_token() + 2048 * 151936 < 3.6e9
    assert ModelSpec.from_config("qwen2.5-1.5b-instruct").tie_word_embeddings


def test_model_from_path_and_dict(tmp_path):
    text = resources.files("fastsim").joinpath("data/models/llama-3.1-8b-instruct.json").read_text()
    (tmp_path / "config.json").write_text(text)
    a = Deployment(model=str(tmp_path / "config.json"), gpu="H100", max_model_len=4096)
    b = Deployment(model=json.loads(text), gpu="H100", max_model_len=4096)
    c = Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", max_model_len=4096)
    assert a.num_gpu_blocks == b.num_gpu_blocks == c.num_gpu_blocks
    assert len(model_names()) >= 10 and len(gpu_names()) >= 10


def test_tp_and_fp8_shrink_per_rank_memory():
    base = Deployment(model="meta-llama/Llama-3.1-8B", gpu="H100", max_model_len=8192)
    tp2 = Deployment(model="meta-llama/Llama-3.1-8B", gpu="H100", tensor_parallel_size=2, max_model_len=8192)
    fp8 = Deployment(model="meta-llama/Llama-3.1-8B", gpu="H100", quantization="fp8", kv_cache_dtype="fp8",
                     max_model_len=8192)
    assert tp2.weight_bytes_per_rank < 0.52 * base.weight_bytes_per_rank
    assert tp2.kv_bytes_per_token * 2 == base.kv_bytes_per_token == fp8.kv_bytes_per_token * 2
    assert fp8.num_gpu_blocks > 2 * base.num_gpu_blocks


def test_engine_from_deployment():
    d = Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-SXM", tensor_parallel_size=1,
                   dtype="bfloat16", gpu_memory_utilization=0.9, max_model_len=None, max_num_seqs=256,
                   max_num_batched_tokens=8192, block_size=16, enable_prefix_caching=True,
                   enable_chunked_prefill=True)
    e = d.engine
    assert isinstance(e, fastsim.EngineConfig)
    assert (e.num_gpu_blocks, e.max_num_seqs, e.max_num_batched_tokens, e.block_size) == (d.num_gpu_blocks, 256,
                                                                                          8192, 16)
    assert e.enable_prefix_caching and e.max_model_len == 131072


@pytest.mark.parametrize("kw, match", [
    (dict(gpu="V100"), r"gpu must be a catalogue name .* known GPUs: A10G"),
    (dict(model="no/such-model"), r"model must be a catalogue name.*known models"),
    (dict(model="meta-llama/Llama-3.1-70B", max_model_len=8192), r"does not fit: .*tensor_parallel_size=2 would fit"),
    (dict(tensor_parallel_size=3), r"tensor_parallel_size=3 must divide the model's 32 attention heads.*1, 2, 4, 8"),
    (dict(gpu_memory_utilization=0.0), r"gpu_memory_utilization must be .* in \(0, 1\], got 0.0"),
    (dict(gpu_memory_utilization=1.5), r"gpu_memory_utilization must be .* in \(0, 1\], got 1.5"),
    (dict(gpu="RTX-4090", max_model_len=None), r"max_model_len=131072 needs .* set max_model_len <= \d+"),
    (dict(dtype="float64"), r"dtype must be one of"),
    (dict(quantization="int4"), r"quantization must be None or 'fp8'"),
    (dict(model={"model_type": "deepseek_v2", "hidden_size": 8}), r"model_type 'deepseek_v2' is not supported"),
    (dict(model="meta-llama/Llama-2-7b-hf", max_model_len=8192),
     r"max_model_len=8192 must be at most the model's length, 4096 \(.*VLLM_ALLOW_LONG_MAX_MODEL_LEN"),
])
def test_invalid_deployments(kw, match):
    args = dict(model="meta-llama/Llama-3.1-8B", gpu="H100", max_model_len=8192)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        Deployment(**args)


def test_deployment_table_in_scenario_toml():
    import tomllib

    text = """
name = "llama8b-h100"
[deployment]
model = "meta-llama/Llama-3.1-8B-Instruct"
gpu = "h100"
gpu_memory_utilization = 0.9
max_model_len = 8192
max_num_seqs = 128
max_num_batched_tokens = 4096
[engine]
policy = "fcfs"
[workload]
arrival_rate = 5.0
num_requests = 100
"""
    cfg = tomllib.loads(text)
    sc = fastsim.Scenario.from_dict(cfg)
    dep = Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-SXM", max_model_len=8192, max_num_seqs=128,
                     max_num_batched_tokens=4096)
    assert sc.engine == dep.engine and sc.latency == dep.latency
    cfg["engine"]["max_num_seqs"] = 64
    with pytest.raises(ValueError, match=r"\[engine\] \['max_num_seqs'\] are set by \[deployment\]"):
        fastsim.Scenario.from_dict(cfg)
    with pytest.raises(ValueError, match=r"\[deployment\].*'gpus' \(did you mean 'gpu'\?\)"):
        fastsim.Scenario.from_dict({"deployment": {"model": "Qwen/Qwen3-14B", "gpus": "H100"}})
    with pytest.raises(ValueError, match=r"^\[deployment\]: gpu_memory_utilization"):
        fastsim.Scenario.from_dict({"deployment": {"model": "Qwen/Qwen3-14B", "gpu": "H100",
                                                   "gpu_memory_utilization": 1.5}})


def test_a_deployment_tables_model_path_is_beside_the_file(tmp_path, monkeypatch):
    """A `[deployment] model` path (a config.json's folder) is read beside the
    TOML file, as trace and length-table paths are, whatever the working
    directory (it was read from the working directory: stop 66's review)."""
    import shutil

    from fastsim import _cli

    sub = tmp_path / "sub"
    (sub / "cfg").mkdir(parents=True)
    shutil.copy(Path(fastsim.__file__).parent / "data" / "models" / "qwen2.5-1.5b-instruct.json",
                sub / "cfg" / "config.json")
    path = sub / "d.toml"
    path.write_text('[deployment]\nmodel = "cfg"\ngpu = "A10G"\nmax_model_len = 4096\n'
                    '[workload]\narrival_rate = 2.0\nnum_requests = 20\n')
    monkeypatch.chdir(tmp_path)
    sc = _cli._load_config(path)[0]
    ref = Deployment(model=str(sub / "cfg"), gpu="A10G", max_model_len=4096)
    assert sc.engine == ref.engine and sc.latency == ref.latency


def test_scenario_says_what_it_simulates():
    default = fastsim.Scenario().describe()
    assert "A10G" in default and "Qwen2.5-1.5B" in default and "fastsim.Deployment" in default
    dep = Deployment(model="meta-llama/Llama-3.1-8B", gpu="H100", max_model_len=8192)
    text = fastsim.Scenario(engine=dep.engine, latency=dep.latency).describe()
    assert "A10G" not in text and "roofline" in text and str(dep.num_gpu_blocks) in text


def test_the_sweep_runs_lie_on_vllms_affine_line():
    """vLLM's block count is affine in gpu_memory_utilization (only the requested memory depends
    on it): the A10G sweep's 0.5, 0.7 and 0.9 runs lie on one line to the block; 0.3 lies 621
    blocks (272 MiB) below it, the anomaly the xfail above keeps."""
    a10g = REPORTS[(REPORTS.gpu == "A10G") & (REPORTS.max_num_seqs == 64)].set_index("gpu_memory_utilization")
    b = a10g.num_gpu_blocks
    assert b[0.7] - b[0.5] == b[0.9] - b[0.7]
    line_03 = b[0.5] - (b[0.7] - b[0.5])
    assert line_03 - b[0.3] == 621
    # and the deployment's blocks grow at that rate within 0.2% (the datasheet's total memory)
    row = REPORTS.iloc[1].copy()
    steps = []
    for u in (0.5, 0.7):
        row["gpu_memory_utilization"] = u
        steps.append(_deployment(row).num_gpu_blocks)
    assert abs((steps[1] - steps[0]) / (b[0.7] - b[0.5]) - 1) < 0.002


def test_max_model_len_follows_vllms_derived_length():
    """vLLM's derived maximum length (`_models.derived_max_model_len_of`,
    checked against vLLM's own code in `tests/oracle/test_vllm_max_model_len.py`):
    the smallest length key, or ``model_max_length``; times a RoPE scaling
    factor, from ``original_max_position_embeddings`` for YaRN, but not for
    Llama 3's (its positions are already scaled). It is the default
    ``max_model_len`` and the largest one a Deployment takes."""
    from fastsim._models import ModelSpec, derived_max_model_len_of

    qwen = json.loads((Path(fastsim.__file__).parent / "data" / "models" / "qwen2.5-7b-instruct.json").read_text())
    cases = [({"max_position_embeddings": 4096, "n_positions": 2048}, 2048),
             ({"max_position_embeddings": 8192, "model_max_length": 16384}, 16384),
             ({"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, 8192),
             ({"max_position_embeddings": 32768, "original_max_position_embeddings": 8192,
               "rope_scaling": {"type": "yarn", "factor": 4.0}}, 32768),
             ({"max_position_embeddings": 32768, "original_max_position_embeddings": 8192,   # (the top level's)
               "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 32768),
             ({"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0},
               "rope_parameters": {"rope_type": "linear", "factor": 3.0}}, 8192),   # (rope_scaling's)
             ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 131072),
             ({"max_position_embeddings": 4096, "rope_parameters": {
                 "full_attention": {"rope_type": "linear", "factor": 2.0},
                 "sliding_attention": {"rope_type": "default"}}}, 8192),
             ({"hidden_size": 8}, None)]
    for config, want in cases:
        assert derived_max_model_len_of(config) == want, config
    yarn = ModelSpec.from_config(dict(qwen, rope_scaling={"type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 32768}))
    assert ModelSpec.from_config(qwen).derived_max_model_len == 32768 and yarn.derived_max_model_len == 131072
    # a config without max_position_embeddings: its Transformers class's default, as vLLM reads it
    bare = {k: v for k, v in qwen.items() if k != "max_position_embeddings"}
    assert ModelSpec.from_config(bare).derived_max_model_len == 32768
    assert ModelSpec.from_config(dict(bare, model_type="llama")).derived_max_model_len == 2048
    kw = dict(gpu="H100", num_gpu_blocks_override=10_000)
    assert Deployment(model=yarn, **kw).max_model_len == 131072   # (the default: vLLM's)
    assert Deployment(model=yarn, max_model_len=131072, **kw).max_model_len == 131072
    with pytest.raises(ValueError, match=r"max_model_len=131073 must be at most the model's length, 131072"):
        Deployment(model=yarn, max_model_len=131073, **kw)
    with pytest.raises(ValueError, match=r"max_model_len=32769 must be at most the model's length, 32768"):
        Deployment(model="Qwen/Qwen2.5-7B-Instruct", max_model_len=32769, **kw)
