"""A scenario packed into the kernel's arrays: its parameter records
(`kernel.layout`'s ``I_*``, ``F_*``, ``L_*``, ``FL_*``, ``AS_*`` slots) and
flat law tables, the names `kernel.drivers.SCENARIO_ARRAYS`. The only writer
of the records; below `_replicate` (which runs them) and `_memory` (which
sizes a run's workspaces from them), so that both read one packing."""
from __future__ import annotations

import numpy as np

from . import kernel as K
from ._config import BucketPredictor, Scenario
from ._distributions import KIND_EMPIRICAL
from ._fleet import trace_hashing  # noqa: F401 (the packing's test, stated with the engines that serve)


def pack_scenario(scenario: Scenario) -> dict:
    """The kernel's view of a scenario: parameter vectors and flat tables
    (the names `kernel.drivers.SCENARIO_ARRAYS`; `kernel.drivers.scenario_arrays` orders them)."""
    e, w = scenario.engine, scenario.workload
    ipar = np.zeros(K.N_IPAR, np.int64)
    fpar = np.zeros(K.N_FPAR, np.float64)
    ipar[K.I_MAX_NUM_SEQS] = e.max_num_seqs
    ipar[K.I_MAX_BATCHED_TOKENS] = e.max_num_batched_tokens
    ipar[K.I_BLOCK_SIZE] = e.block_size
    ipar[K.I_NUM_GPU_BLOCKS] = e.usable_gpu_blocks   # (the null block holds nothing)
    ipar[K.I_FULL_ISL] = int(e.scheduler_reserve_full_isl)
    ipar[K.I_ASYNC] = int(e.async_scheduling)
    ipar[K.I_CHUNKED] = int(e.enable_chunked_prefill)
    ipar[K.I_POLICY] = K.POLICY_CODES[e.policy]
    ipar[K.I_STATIC] = int(e.scheduler == "static")
    ipar[K.I_ADMISSION] = K.ADMISSION_CODES[e.admission]
    ipar[K.I_MAX_WAITING] = e.max_waiting or 0
    ipar[K.I_MAX_MODEL_LEN] = e.max_model_len or 0
    ipar[K.I_WARMUP] = w.warmup_requests
    ipar[K.I_HAS_DELAY] = int(e.max_queue_delay_s is not None)
    ipar[K.I_HAS_HORIZON] = int(w.horizon_s is not None)
    ipar[K.I_NUM_REQUESTS] = w.num_requests
    ipar[K.I_HAS_TTFT_SLO] = int(scenario.ttft_slo_s is not None)
    ipar[K.I_HAS_TPOT_SLO] = int(scenario.tpot_slo_s is not None)
    fpar[K.F_MAX_DELAY] = e.max_queue_delay_s or 0.0
    fpar[K.F_HORIZON] = w.horizon_s or 0.0
    fpar[K.F_TTFT_SLO] = scenario.ttft_slo_s or 0.0
    fpar[K.F_TPOT_SLO] = scenario.tpot_slo_s or 0.0
    fpar[K.F_TTFT_OVERHEAD] = scenario.latency.ttft_overhead_s
    ipar[K.I_NORMALIZE_ARRIVALS] = int(w.normalize_arrivals)
    ipar[K.I_MAX_CONCURRENCY] = w.max_concurrency or 0
    ipar[K.I_THINK_EXP] = int(w.think_time_dist == "exponential")
    fpar[K.F_THINK] = w.think_time_s
    pred_edges = np.ones(1, np.int64)
    if isinstance(e.length_predictor, BucketPredictor):
        ipar[K.I_PREDICTOR] = 2
        fpar[K.F_PRED_ACCURACY] = e.length_predictor.accuracy
        pred_edges = np.array((1,) + e.length_predictor.edges, np.int64)
    elif e.length_predictor is not None:
        ipar[K.I_PREDICTOR] = 1
        fpar[K.F_PRED_SIGMA] = e.length_predictor.sigma
    ipar[K.I_PRIO_PREEMPT] = int(e.priority_preemption)
    ipar[K.I_SWAP] = int(e.preemption_mode == "swap")
    ipar[K.I_SWAP_BLOCKS] = e.swap_space_blocks
    if e.priority_aging_s is not None:
        ipar[K.I_HAS_AGING] = 1
        fpar[K.F_AGING] = e.priority_aging_s

    arr = w._arrival_spec()
    ipar[K.I_ARRIVAL_KIND] = arr.kind
    fpar[K.F_RATE] = arr.rate
    fpar[K.F_BURSTINESS] = arr.burstiness
    if arr.kind == 2:
        ipar[K.I_USERS_LO], ipar[K.I_USERS_HI] = arr.users
        ipar[K.I_USER_CAP] = arr.user_cap
        fpar[K.F_USER_REQUESTS] = arr.requests_per_user
    arr_times = np.ascontiguousarray(arr.times, dtype=np.float64)
    if arr.kind == K.ARRIVAL_TRACE_WINDOW:
        fpar[K.F_TRACE_WINDOW] = w.trace_window_s

    comps, tab_rows = [], []
    # lrange: [lo, hi) component rows of the prompt, output and prefix length
    # laws, then of the prefix group law (empty ranges: no prefix groups)
    lrange = np.zeros(8, np.int64)
    trace = np.zeros((1, 2), np.int64)
    laws = []   # (slot in lrange / 2, law): prompt 0, output 1, prefix length 2
    if w.lengths is not None:
        ipar[K.I_TRACE_MODE] = 1 if w.lengths.order == "replay" else 2
        trace = np.ascontiguousarray(np.column_stack([w.lengths.prompt_len, w.lengths.output_len]))
        comps.append((0, 0, 0, 1.0, 0.0, 1.0))  # a placeholder row: the kernel reads the trace
    else:
        laws += [(0, w.prompt_len), (1, w.output_len)]
    if w.prefix_groups > 0:
        ipar[K.I_PREFIX] = 1
        laws.append((2, w.prefix_len))
    if w.sessions is not None:
        # (a session's turns take the prefix length's slot: sessions have no prefix groups)
        ipar[K.I_SESSIONS] = K.SESSIONS_USERS if w.max_concurrency is not None else K.SESSIONS_OPEN
        laws.append((2, w.sessions.turns))
        ipar[K.I_THINK_EXP] = int(w.sessions.think_time_dist == "exponential")
        fpar[K.F_THINK] = w.sessions.think_time_s
    for j, law in laws:
        lrange[2 * j] = len(comps)
        cum = 0.0
        parts = law._components()
        for m, (weight, kind, p0, p1, values, cdf) in enumerate(parts):
            cum = 1.0 if m == len(parts) - 1 else cum + weight
            start = len(tab_rows)
            if values is not None:
                tab_rows.extend(zip(values, cdf))
            comps.append((kind, start, 0 if values is None else len(values), p0, p1, cum))
        lrange[2 * j + 1] = len(comps)
    if w.prefix_groups > 0:
        # the group: a sampled table of the values 0 .. G-1 with Zipf probabilities
        lrange[6] = len(comps)
        gcdf = np.cumsum(w.prefix_group_probs())
        gcdf[-1] = 1.0
        start = len(tab_rows)
        tab_rows.extend(zip(np.arange(w.prefix_groups, dtype=float), gcdf))
        comps.append((KIND_EMPIRICAL, start, w.prefix_groups, 0.0, 0.0, 1.0))
        lrange[7] = len(comps)
    # The prefix-group cache with no prefix group to share holds nothing: its steps are those of
    # caching off, request for request (`simulate_requests` turns it on for a stream with groups)
    ipar[K.I_CACHING] = int(e.enable_prefix_caching and (e.block_hash_caching or w.prefix_groups > 0))
    ipar[K.I_BLOCK_HASH] = int(e.enable_prefix_caching and e.block_hash_caching)
    if trace_hashing(scenario):
        # a replayed trace's block identities: each row's steps (`_traces.parent_steps`) after the tables
        from ._traces import parent_steps

        start, count, steps = parent_steps(w.request_trace, e.block_size)
        ipar[K.I_TRACE_HASH] = 1
        trace = np.ascontiguousarray(np.column_stack([trace, start + len(tab_rows), count]))
        tab_rows.extend(map(tuple, steps))
    lcomp = np.array([c[:3] for c in comps], dtype=np.int64).reshape(-1, 3)
    lpar = np.array([c[3:] for c in comps], dtype=np.float64).reshape(-1, 3)
    ltab = np.array(tab_rows, dtype=np.float64).reshape(-1, 2) if tab_rows else np.zeros((1, 2))
    ipar[K.I_SJF_KEY] = K.SJF_KEY_CODES[e.sjf_key]
    if w.classes is not None and w.classes.priorities is not None:
        # a priority per length band: prio_val the bands' priorities, prio_cdf their upper edges
        ipar[K.I_PRIO_BAND] = K.BAND_CODES[w.classes.by]
        prio_val = np.asarray(w.classes.priorities, dtype=np.int64)
        prio_cdf = np.asarray(w.classes.edges + (np.inf,), dtype=np.float64)
    else:
        prio_val = np.asarray(w.priorities, dtype=np.int64)
        prio_cdf = np.cumsum(np.asarray(w.priority_probs, dtype=np.float64))
        prio_cdf[-1] = 1.0
    lat = scenario.latency._params()
    ipar[K.I_STEP_EXTRAS] = int(lat[K.L_ROOF] != 0.0 or lat[K.L_NOISE] != 0.0)   # (the full engine's)
    packed = dict(ipar=ipar, fpar=fpar, lat=lat, arr_times=arr_times,
                  lcomp=lcomp, lpar=lpar, ltab=ltab, lrange=lrange, trace=trace,
                  prio_val=prio_val, prio_cdf=prio_cdf, pred_edges=pred_edges)
    f = scenario.fleet
    if f is not None and not _is_disagg(scenario):   # the fleet's record (`kernel.layout.FL_*`), router and size
        fleet = np.zeros(K.N_FLEET)
        fleet[K.FL_STALENESS] = f.router_staleness_s
        fleet[K.FL_LATENCY] = f.routing_latency_s
        fleet[K.FL_LOAD_CAP] = f.prefix_load_cap
        fleet[K.FL_SCORERS:K.FL_SCORERS + K.N_SCORERS] = f.scorer_weights
        packed.update(fleet=fleet, router=K.ROUTER_CODES[f.router], replicas=f.n_replicas)
        if f.mixed:   # each replica's records (`_fleet.fleet_members`), one pack per distinct entry
            packs = {}
            for engine, latency in f.replicas:
                if (id(engine), id(latency)) not in packs:
                    packs[id(engine), id(latency)] = pack_scenario(scenario.replace(engine=engine, latency=latency,
                                                                                     fleet=None))
            packed["members"] = [packs[id(e), id(lat)] for e, lat in f.replicas]
        if f.autoscaler is not None:   # the policy's record (`kernel.layout.AS_*`)
            packed.update(apar=f.autoscaler._record())
    return packed


def _is_disagg(scenario) -> bool:
    """Whether the scenario is a disaggregated server (`fastsim.Disaggregated`, run by `_disagg.run_disagg`)."""
    from ._disagg import Disaggregated

    return isinstance(scenario.fleet, Disaggregated)
