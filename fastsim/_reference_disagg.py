"""A slow, plain-Python reference of disaggregated prefill and decode.

It checks the compiled disaggregated server (``fastsim/kernel/disagg.py``)
bit for bit per request and shares no simulation code with the kernel: the
prefill pool is the reference fleet (`_reference_cluster.simulate_fleet_reference`,
outputs capped at one token), the decode pool is reference replicas
(`_reference_cluster._PausedReplica`) handed the requests in order of their
prefill first tokens, and the link is written again here from
``docs/engine-model.md``, "Disaggregated prefill and decode".
"""

from __future__ import annotations

import math

import numpy as np

from ._config import EngineConfig
from ._latency import LatencyModel
from ._reference import COMPLETED, _Request, prompt_block_identities, queue_key
from ._reference_cluster import (ROUTERS, _choose, _PausedReplica, _replica_key, _RouterStream, _TraceRouter,
                                 _WeightedRouter, simulate_fleet_reference)
from ._reference_noise import StepNoiseDraws, run_latency

#: The decode router's random stream: the purpose after the prefill router's (13).
DECODE_ROUTER_PURPOSE = 14


def _hashes(engine) -> bool:
    return bool(engine.enable_prefix_caching and engine.block_hash_caching)


def simulate_disagg_reference(arrival, prompt, output, prio, sjfk, pgrp, plen, *,
                              prefill: tuple[EngineConfig, LatencyModel, int, str],
                              decode: tuple[EngineConfig, LatencyModel, int, str],
                              kv_bytes_per_token: float, link_bandwidth: float, link_latency_s: float = 0.0,
                              routing_latency_s: float = 0.0, staleness_s: float = 0.0, load_cap: int = 4,
                              seed_keys=(0, 0, 0), n_groups=None, block_hashes=None, hash_block_size=512,
                              scorer_weights=(3.0, 2.0, 2.0)):
    """Simulate a disaggregated server over one request stream, slowly and literally.

    Parameters
    ----------
    arrival, prompt, output, prio, sjfk, pgrp, plen : 1-D arrays
        The requests, sorted by arrival (at the prefill router).
    prefill, decode : (EngineConfig, LatencyModel, int, str)
        Each pool's engine, latency model, number of replicas and router.
    kv_bytes_per_token : float
        KV bytes of one prompt token (a transfer is ``P * kv_bytes_per_token``).
    link_bandwidth : float
        Bytes per second of each decode replica's inbound link (``inf``: instant).
    link_latency_s : float
        Fixed latency of a transfer.
    routing_latency_s, staleness_s, load_cap : float, float, int
        The prefill router's (`simulate_fleet_reference`'s).
    scorer_weights : (float, float, float), or a pair of them
        The ``"weighted"`` routers' (`_reference_cluster._WeightedRouter`):
        both pools', or the prefill pool's and the decode pool's.
    seed_keys : (int, int, int)
        The routers' random streams' keys.
    block_hashes, hash_block_size : optional
        A replayed trace's hash list per request, each hash
        ``hash_block_size`` tokens: a pool caching by block hash keys prompt
        blocks by them, and its routers route as `simulate_fleet_reference`'s
        do (a pool that does not hash routes as without them).

    Returns
    -------
    dict of per-request arrays, by request index
        ``status`` (the decode side's, or the prefill side's if it never got
        there), ``first_token_s`` (prefill), ``decode_first_token_s``,
        ``ready_s`` (its KV at the decode replica), ``finish_s``,
        ``num_preemptions`` (both sides), ``num_tokens``, ``prefill_replica``,
        ``decode_replica`` (-1: none), ``prefill_finish_s`` (when the prefill
        replica let it go, freeing its blocks), ``decode_blocks_end`` (each
        decode replica's blocks in use at the end), ``decode_cached_tokens``
        (the prompt tokens a request found cached on its decode replica at
        its first admission there; nan: never handed).
    """
    e_p, l_p, n_p, router_p = prefill
    e_d, l_d, n_d, router_d = decode
    w_p, w_d = (scorer_weights, scorer_weights) if len(scorer_weights) == 3 else scorer_weights
    if router_d not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router_d!r}")
    a = np.asarray(arrival, dtype=np.float64)
    n = a.size
    pre = simulate_fleet_reference(a, prompt, np.ones(n, np.int64), prio, sjfk, pgrp, plen, e_p, l_p, n_p,
                                   router_p, staleness_s=staleness_s, routing_latency_s=routing_latency_s,
                                   load_cap=load_cap, seed_keys=seed_keys, n_groups=n_groups,
                                   block_hashes=block_hashes if _hashes(e_p) else None,
                                   hash_block_size=hash_block_size, scorer_weights=w_p)
    # hand-offs in order of the prefill first token, ties by request index
    order = sorted((float(pre["first_token_s"][i]), i) for i in range(n) if pre["status"][i] == COMPLETED)
    # the decode pool's model as the replication runs it (its per-run effects, `run_latency`), per-step noise
    # drawn per replica: decode replica d is the server's replica n_p + d (the prefill pool's come first)
    l_d, steps = run_latency(l_d, *(int(k) for k in seed_keys))
    reps = [_PausedReplica(e_d, l_d, None, None if steps is None else
                           StepNoiseDraws(_replica_key(steps.key, n_p + d), steps.sd, steps.p, steps.mean))
            for d in range(n_d)]
    rng = _RouterStream(*(int(k) for k in seed_keys), purpose=DECODE_ROUTER_PURPOSE)
    ngroups = (int(np.max(pgrp)) + 1 if n else 0) if n_groups is None else n_groups
    table = [-1] * max(ngroups, 1)
    trace = None
    if block_hashes is not None and _hashes(e_d):   # (a pool that does not hash routes as without them)
        trace = _TraceRouter(block_hashes, prompt, hash_block_size, e_d.block_size, n_d)
    weighted = _WeightedRouter(w_d, [e_d] * n_d) if router_d == "weighted" else None
    link_free = [0.0] * n_d
    views = [(0, 0, 0, 0)] * n_d
    decode_of = [None] * n
    owner = [-1] * n
    ready = [math.nan] * n
    for t1, i in order:
        if router_d not in ("random", "round_robin") and n_d > 1:
            for rep in reps:
                rep.advance_until(t1)
            views = [rep.view() for rep in reps]
        if trace is not None:
            d = trace.choose(router_d, i, views, rng, load_cap, weighted)
            trace.hand(i, d)
        elif weighted is not None:
            d = weighted.choose(int(pgrp[i]), int(prompt[i]), int(plen[i]), views, rng)
        else:
            d = _choose(router_d, i, int(pgrp[i]), views, table, rng, load_cap)
        p = int(prompt[i])
        start = max(t1, link_free[d])
        link_free[d] = start + p * kv_bytes_per_token / link_bandwidth
        at = link_free[d] + link_latency_s
        rep = reps[d]
        j = rep.handed
        req = _Request(idx=j, arrival=at, P=p, O=int(output[i]), prio=int(prio[i]), sjf_key=int(sjfk[i]),
                       group=int(pgrp[i]), prefix_len=int(plen[i]),
                       qkey=queue_key(e_d.policy, j, at, int(prio[i]), int(sjfk[i]), e_d.priority_aging_s))
        req.remote_k = p - 1     # the prompt's KV but its last token, as vLLM's connector leaves it
        if _hashes(e_d) and block_hashes is not None:
            # the prompt's blocks by the trace's hashes: its blocks are cached here too
            req.group, req.prefix_len = -1, 0
            req.idents = prompt_block_identities(j, p, e_d.block_size, block_hashes=block_hashes[i],
                                                 hash_block_size=hash_block_size)
        elif e_d.enable_prefix_caching and e_d.block_hash_caching:
            # the prompt's block identities, as the prefill side's: its blocks are cached here too
            req.idents = prompt_block_identities(j, p, e_d.block_size, req.group, req.prefix_len)
        rep.hand(req)
        decode_of[i] = req
        owner[i] = d
        ready[i] = at
    for rep in reps:
        rep.advance_until(math.inf)
        rep.finish()
    status = np.array(pre["status"], dtype=np.int8)
    first_d = np.full(n, np.nan)
    finish = np.array(pre["finish_s"], dtype=np.float64)
    npre = np.array(pre["num_preemptions"], dtype=np.int64)
    tokens = np.array(pre["num_tokens"], dtype=np.int64)
    for i, r in enumerate(decode_of):
        if r is not None:
            status[i] = r.status
            first_d[i] = r.first_token
            finish[i] = r.finish
            npre[i] += r.num_preemptions
            tokens[i] = r.g
    return {
        "status": status,
        "first_token_s": np.array(pre["first_token_s"], dtype=np.float64),
        "decode_first_token_s": first_d,
        "ready_s": np.array(ready, dtype=np.float64),
        "finish_s": finish,
        "num_preemptions": npre,
        "num_tokens": tokens,
        "prefill_replica": np.array(pre["replica"], dtype=np.int64),
        "decode_replica": np.array(owner, dtype=np.int64),
        "prefill_finish_s": np.array(pre["finish_s"], dtype=np.float64),
        "decode_blocks_end": [rep.blocks_used for rep in reps],
        "decode_cached_tokens": np.array([math.nan if r is None else r.cached_tokens for r in decode_of]),
    }
