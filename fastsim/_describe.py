"""Say in words what a scenario simulates (which server, which step-time model).

``EngineConfig()`` and ``LatencyModel.default()`` are the A10G / Qwen2.5-1.5B
server of the packaged measurements; a scenario that leaves them at their
defaults simulates that server, and :func:`describe_scenario` says so instead
of leaving it implicit.
"""

from __future__ import annotations

from ._calibration import PRESETS


def describe_latency(latency) -> str:
    cal = getattr(latency, "calibration", None)
    from ._latency import LatencyModel
    from ._roofline import RooflineMapping

    if latency == LatencyModel.default():
        return ("LatencyModel.default(): the step times of vLLM 0.22 serving Qwen2.5-1.5B-Instruct on one NVIDIA "
                "A10G (preset 'a10g-qwen2.5-1.5b'); for another GPU or model use fastsim.Deployment(...).latency "
                "or LatencyModel.from_vllm_bench(...)")
    for name in PRESETS:
        if latency == LatencyModel.preset(name):
            return f"the packaged calibration {name!r}"
    if isinstance(cal, RooflineMapping):
        return (f"a roofline model mapped onto the kernel's form (mapping error median "
                f"{cal.median_abs_rel_error:.1%}, max {cal.max_abs_rel_error:.1%})")
    if cal is not None:
        return f"a model calibrated by {getattr(cal, 'method', 'fastsim._calibration')}"
    if latency.is_constant:
        return f"a constant step of {latency.base_s:g} s"
    return "a user-given LatencyModel"


def describe_engine(engine) -> str:
    if engine.num_gpu_blocks == type(engine)().num_gpu_blocks:   # (EngineConfig's default)
        return (f"num_gpu_blocks={engine.num_gpu_blocks} (EngineConfig's default: what vLLM 0.22 reported for "
                f"Qwen2.5-1.5B on an A10G at gpu_memory_utilization=0.3; use fastsim.Deployment(...).engine for "
                f"another GPU or model)")
    return f"num_gpu_blocks={engine.num_gpu_blocks} ({engine.kv_capacity_tokens} KV tokens)"


def describe_rules(engine) -> str:
    """Which of vLLM V1's rules the engine has on, in words."""
    on = [label for name, label in (("async_scheduling", "async scheduling"),
                                    ("scheduler_reserve_full_isl", "the full-input gate"),
                                    ("null_block", "the null block")) if getattr(engine, name)]
    if engine.enable_prefix_caching:
        on.append("prefix caching by block hash" if engine.block_hash_caching else "the prefix-group cache")
    if len(on) == 4 and engine.block_hash_caching:
        return "vLLM 0.22's serving defaults (" + ", ".join(on) + ")"
    return "V1 rules on: " + (", ".join(on) if on else "none (the synchronous loop)")


def describe_scenario(scenario) -> str:
    """One paragraph: the engine's KV capacity, its vLLM V1 rules and where the step-time model comes from."""
    e = scenario.engine
    return (f"engine: max_num_seqs={e.max_num_seqs}, max_num_batched_tokens={e.max_num_batched_tokens}, "
            f"{describe_engine(e)}; {describe_rules(e)}; latency: {describe_latency(scenario.latency)}")
