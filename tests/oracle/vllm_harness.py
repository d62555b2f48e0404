"""Drive vLLM's own V1 scheduler on fastsim's request streams, with no model.

vLLM 0.22.0's real ``Scheduler``/``AsyncScheduler`` and ``KVCacheManager``
(pure Python) are built the way vLLM's ``tests/v1/core/utils.py``
(``create_scheduler``) builds them, from a config-only model directory, and
driven by a virtual clock:

* the engine core's loop (``EngineCore.step``, or with async scheduling
  ``EngineCore.step_with_batch_queue`` and a batch queue of 2): before each
  ``schedule()`` the requests that have arrived by the clock are added; a
  batch runs when the GPU is free, for the duration fastsim's
  ``LatencyModel.step_time`` gives its composition (the same floating-point
  operations as the reference simulator); the core waits for the oldest batch
  and hands its output to ``update_from_output`` at its end;
* fake model outputs: one new token for every scheduled request whose
  scheduled tokens reach the end of its known tokens (vLLM's own
  ``is_prefill_chunk``), token ids unique per request and position;
* prompts made of token ids from the request's block identities: requests of
  one prefix group share the ids of their first ``prefix_len`` tokens, or, with
  trace hash lists, of each hash block; all other ids are unique.

``run_vllm`` returns per-request first-token time, finish time and preemption
count, and the batch of every step, to compare with the reference simulator
(``compare``), which names the first diverging step and the rule involved.

Only this module imports vLLM; it needs the ``oracle`` environment
(``tests/oracle/install.sh``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import deque
from dataclasses import dataclass

import numpy as np

# The config-only model directory (ModelConfig reads config.json, no hub).
_QWEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
    "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
    "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 1 << 20,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
}
_MODEL_DIR = None

# Token ids: disjoint ranges for shared prefixes, trace hash blocks, unique
# prompt tokens and generated tokens (the scheduler never looks them up).
_SHARED, _HASHED, _UNIQUE, _OUTPUT = 10**12, 2 * 10**12, 3 * 10**12, 4 * 10**12
_STRIDE = 10**7


def model_dir() -> str:
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = tempfile.mkdtemp(prefix="fastsim-oracle-model-")
        with open(os.path.join(_MODEL_DIR, "config.json"), "w") as f:
            json.dump(_QWEN_CONFIG, f)
    return _MODEL_DIR


def vllm_num_blocks(engine) -> int:
    """The block count vLLM is given: fastsim's ``num_gpu_blocks`` with the
    null block (``null_block=True``), or one more so that ``num_gpu_blocks``
    are usable (``null_block=False``)."""
    return engine.num_gpu_blocks + (0 if engine.null_block else 1)


def vllm_max_model_len(engine) -> int:
    if not engine.enable_chunked_prefill:
        return engine.max_num_batched_tokens      # vLLM requires it
    return engine.max_model_len or 1 << 20


def build_scheduler(engine):
    """vLLM's scheduler for a fastsim ``EngineConfig`` (as ``create_scheduler``)."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if engine.policy not in ("fcfs", "priority") or engine.scheduler != "continuous" \
            or engine.preemption_mode != "recompute" or engine.priority_preemption \
            or engine.priority_aging_s is not None or engine.admission != "none" \
            or engine.max_queue_delay_s is not None:
        raise ValueError("vLLM V1 has only continuous batching, recompute preemption, fcfs and "
                         "priority policies and no admission control or abandonment")
    if engine.enable_prefix_caching and not engine.block_hash_caching:
        raise ValueError("vLLM caches by block hash: use block_hash_caching=True with enable_prefix_caching")
    mml = vllm_max_model_len(engine)
    sc = SchedulerConfig(max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
                         max_model_len=mml, enable_chunked_prefill=engine.enable_chunked_prefill,
                         async_scheduling=engine.async_scheduling, policy=engine.policy,
                         scheduler_reserve_full_isl=engine.scheduler_reserve_full_isl,
                         is_encoder_decoder=False)
    mc = ModelConfig(model=model_dir(), skip_tokenizer_init=True, dtype="float16", max_model_len=mml)
    cc = CacheConfig(block_size=engine.block_size, enable_prefix_caching=engine.enable_prefix_caching)
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, device_config=DeviceConfig(device="cpu"))
    n = vllm_num_blocks(engine)
    kc = KVCacheConfig(num_blocks=n, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=engine.block_size, num_kv_heads=1, head_size=1,
                                     dtype=torch.float32))])
    cc.num_gpu_blocks = n
    cls = AsyncScheduler if engine.async_scheduling else Scheduler
    return cls(vllm_config=vc, kv_cache_config=kc, log_stats=False,
               structured_output_manager=StructuredOutputManager(vc), block_size=engine.block_size)


def prompt_tokens(i: int, P: int, group: int = -1, plen: int = 0, hashes=None, hash_block_size: int = 512):
    """Request i's prompt as token ids (see the module docstring)."""
    out = []
    for p in range(P):
        if hashes is not None and p // hash_block_size < len(hashes):
            out.append(_HASHED + int(hashes[p // hash_block_size]) * hash_block_size + p % hash_block_size)
        elif hashes is None and group >= 0 and p < plen:
            out.append(_SHARED + group * _STRIDE + p)
        else:
            out.append(_UNIQUE + i * _STRIDE + p)
    return out


def too_long(engine, P: int, O: int) -> bool:
    """fastsim's never-fits rejection (the requests a vLLM front end refuses or
    that could never run), applied before vLLM sees the stream."""
    usable = engine.num_gpu_blocks - (1 if engine.null_block else 0)
    return ((engine.max_model_len is not None and P + O > engine.max_model_len)
            or -(-(P + O - 1) // engine.block_size) > usable
            or (not engine.enable_chunked_prefill and P + O - 1 > engine.max_num_batched_tokens))


@dataclass
class VllmRun:
    first_token_s: np.ndarray
    finish_s: np.ndarray
    num_preemptions: np.ndarray
    batches: list          # (start, ((index, tokens, computed before), ...)) per step with tokens
    num_steps: int


def run_vllm(requests, engine, latency, *, block_hashes=None, hash_block_size: int = 512) -> VllmRun:
    """Run vLLM's scheduler on a request stream (a DataFrame as from
    ``fastsim.sample_requests``). Requests fastsim rejects as too long are not
    sent (their times stay nan)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.request import Request

    sched = build_scheduler(engine)
    hash_fn = get_hash_fn_by_name("sha256")    # vLLM's default prefix_caching_hash_algo
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(engine.block_size, hash_fn) if engine.enable_prefix_caching else None
    a = np.asarray(requests["arrival_s"], dtype=np.float64)
    P = np.asarray(requests["prompt_len"], dtype=np.int64)
    O = np.asarray(requests["output_len"], dtype=np.int64)
    n = a.size
    prio = np.asarray(requests["priority"]) if "priority" in requests else np.zeros(n, np.int64)
    grp = np.asarray(requests["prefix_group"]) if "prefix_group" in requests else np.full(n, -1)
    plen = np.asarray(requests["prefix_len"]) if "prefix_len" in requests else np.zeros(n, np.int64)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    npre = np.zeros(n, np.int64)
    reqs: dict[str, Request] = {}
    index: dict[str, int] = {}
    send = [i for i in range(n) if not too_long(engine, int(P[i]), int(O[i]))]
    batches = []
    queue: deque = deque()
    size = 2 if engine.async_scheduling else 1
    t, gpu_free, nxt = 0.0, 0.0, 0
    while True:
        while nxt < len(send) and a[send[nxt]] <= t:
            i = send[nxt]
            rid = f"{i:09d}"   # zero-padded: the priority queue's id tie-break is arrival order
            r = Request(request_id=rid, prompt_token_ids=prompt_tokens(
                i, int(P[i]), int(grp[i]), int(plen[i]), None if block_hashes is None else block_hashes[i],
                hash_block_size), sampling_params=SamplingParams(max_tokens=int(O[i]), ignore_eos=True),
                pooling_params=None, arrival_time=float(a[i]), priority=int(prio[i]), block_hasher=hasher)
            reqs[rid], index[rid] = r, i
            sched.add_request(r)
            nxt += 1
        if sched.has_requests():
            out = sched.schedule()
            nd = npf = nctx = 0
            batch, emits = [], []
            for rid, s in out.num_scheduled_tokens.items():
                r = reqs[rid]
                emit = not r.is_prefill_chunk
                ph_before = r.num_output_placeholders - (1 if emit and engine.async_scheduling else 0)
                k0 = r.num_computed_tokens - s
                g = r.num_output_tokens + ph_before
                if s == 1 and g >= 1 and k0 == r.num_prompt_tokens + g - 1:
                    nd += 1
                else:
                    npf += s
                nctx += k0 + s
                batch.append((index[rid], s, k0))
                if emit:
                    emits.append(rid)
            if out.total_num_scheduled_tokens > 0:
                start = max(t, gpu_free)
                end = start + float(latency.step_time(nd, npf, nctx, 0))
                gpu_free = end
                batches.append((start, tuple(batch)))
            else:
                end = t
            queue.append((end, out, emits))
            if out.total_num_scheduled_tokens > 0 and len(queue) < size:
                continue
        elif not queue:
            if nxt >= len(send):
                break
            t = max(t, float(a[send[nxt]]))
            continue
        end, out, emits = queue.popleft()
        t = max(t, end)
        ids = list(out.num_scheduled_tokens)
        toks = []
        for rid in ids:
            r = reqs[rid]
            toks.append([_OUTPUT + index[rid] * _STRIDE + r.num_output_tokens] if rid in emits else [])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: j for j, rid in enumerate(ids)},
                                sampled_token_ids=toks)
        before = {rid: reqs[rid].num_output_tokens for rid in emits}
        sched.update_from_output(out, mro)
        for rid in emits:
            r, i = reqs[rid], index[rid]
            if before[rid] == 0 and r.num_output_tokens >= 1:
                first[i] = t
            if r.is_finished() and math.isnan(finish[i]):
                finish[i] = t
    for rid, r in reqs.items():
        npre[index[rid]] = r.num_preemptions
    return VllmRun(first, finish, npre, batches, len(batches))


def reference_run(requests, engine, latency, *, block_hashes=None, hash_block_size: int = 512) -> dict:
    """The reference simulator on the same stream."""
    from fastsim._reference import simulate_reference

    kw = {}
    if "prefix_group" in requests:
        kw = {"prefix_group": requests["prefix_group"], "prefix_len": requests["prefix_len"]}
    prio = requests["priority"] if "priority" in requests else np.zeros(len(requests["arrival_s"]), np.int64)
    return simulate_reference(requests["arrival_s"], requests["prompt_len"], requests["output_len"], prio,
                              engine, latency, block_hashes=block_hashes, hash_block_size=hash_block_size, **kw)


def _rules(engine) -> list[str]:
    names = ["async_scheduling", "scheduler_reserve_full_isl", "enable_prefix_caching", "null_block"]
    return [n for n in names if getattr(engine, n)]


def first_divergence(vllm_batches, ref_batches, engine) -> str | None:
    """The first step whose start or batch differs, with the rule most likely
    involved; None if all steps agree."""
    for j, (vb, rb) in enumerate(zip(vllm_batches, ref_batches)):
        if vb == rb:
            continue
        (vt, vs), (rt, rs) = vb, rb
        vd, rd = {x[0]: x for x in vs}, {x[0]: x for x in rs}
        only_v = sorted(set(vd) - set(rd))
        only_r = sorted(set(rd) - set(vd))
        differ = sorted(i for i in set(vd) & set(rd) if vd[i] != rd[i])
        if vs == rs:
            rule = "async_scheduling (batch timing)" if engine.async_scheduling else "step timing"
            what = f"start {vt!r} (vLLM) vs {rt!r} (reference), same batch"
        else:
            admitted = [i for i in only_v + only_r if (vd.get(i) or rd.get(i))[2] % engine.block_size == 0]
            if differ and any(vd[i][2] != rd[i][2] for i in differ):
                rule = "enable_prefix_caching (cached tokens differ)"
            elif admitted and engine.scheduler_reserve_full_isl:
                rule = "scheduler_reserve_full_isl or KV capacity (admission differs)"
            elif engine.async_scheduling:
                rule = "async_scheduling (which requests are scheduled)"
            else:
                rule = "KV capacity / preemption (which requests are scheduled)"
            what = (f"at t={vt!r}: only in vLLM {[vd[i] for i in only_v]}, only in the reference "
                    f"{[rd[i] for i in only_r]}, different {[(vd[i], rd[i]) for i in differ]}")
        return f"step {j}: {what}; rule: {rule} (rules on: {_rules(engine)})"
    if len(vllm_batches) != len(ref_batches):
        return (f"step {min(len(vllm_batches), len(ref_batches))}: one run has more steps "
                f"({len(vllm_batches)} in vLLM, {len(ref_batches)} in the reference)")
    return None


def compare(v: VllmRun, first_token_s, finish_s, num_preemptions) -> dict:
    """Per-request agreement (bit for bit; nan equals nan)."""
    def same(x, y):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return (x == y) | (np.isnan(x) & np.isnan(y))
    ok = same(v.first_token_s, first_token_s) & same(v.finish_s, finish_s) & \
        (v.num_preemptions == np.asarray(num_preemptions))
    return {"n": int(ok.size), "agree": int(ok.sum()), "mismatch": np.flatnonzero(~ok)}
