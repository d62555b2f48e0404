"""`replicate`: many independent runs of one scenario, with confidence intervals."""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import save_table
from . import kernel as K
from ._config import EngineConfig, Scenario, Workload
from ._distributions import LogNormal
from ._pack import _is_disagg, pack_scenario, trace_hashing  # noqa: F401 (pack_scenario: its callers' name)
from ._stats import ConfidenceInterval, check_confidence_level, mean_interval, prediction_band, summary_frame
from ._validation import MAX_COUNT, check_bool, check_choice, check_float, check_int, check_kernel_supports

BACKENDS = ("numba", "cuda", "reference")

#: What each estimate means. Every metric is first computed per replication
#: (one run of ``num_requests`` arrivals, like one ``vllm bench serve`` run)
#: over the measured (post-warm-up) requests; the summary reports the mean of
#: those per-run values across replications with a Student-t interval. So a
#: percentile's estimand is the *expected per-run percentile* of a run of this
#: length (what a benchmark of that many requests measures), not the
#: steady-state percentile of an infinitely long run; the two agree as runs
#: grow long.
METRIC_DESCRIPTIONS = {
    "ttft_mean": "time to first token (s): arrival to the end of the step that emits the first token",
    "ttft_p50": "per-run median TTFT (s)",
    "ttft_p90": "per-run 90th percentile TTFT (s)",
    "ttft_p95": "per-run 95th percentile TTFT (s)",
    "ttft_p99": "per-run 99th percentile TTFT (s)",
    "tpot_mean": "time per output token (s): (E2E - TTFT) / (output_len - 1), averaged over requests",
    "tpot_p50": "per-run median TPOT (s)",
    "tpot_p99": "per-run 99th percentile TPOT (s)",
    "itl_mean": "inter-token latency (s): gaps between consecutive tokens, pooled over requests",
    "itl_p50": "per-run median ITL (s)",
    "itl_p99": "per-run 99th percentile ITL (s)",
    "e2e_mean": "end-to-end latency (s): arrival to completion",
    "e2e_p50": "per-run median E2E latency (s)",
    "e2e_p99": "per-run 99th percentile E2E latency (s)",
    "request_throughput": "completed requests / s over the window (run start, or first measured arrival "
                          "with warm-up, to the last completion or the horizon)",
    "output_throughput": "output tokens of completed requests / s over the window",
    "goodput": "completed requests meeting the scenario's SLOs / s over the window",
    "blocking_probability": "fraction of arrivals rejected (admission control or too long)",
    "drop_probability": "fraction of arrivals that abandoned (max_queue_delay_s)",
    "preemptions_per_request": "preemptions / arrivals",
    "swaps_per_request": "preemptions by swap (preemption_mode='swap') / arrivals",
    "prefix_hit_rate": "prefix-cache hit tokens / prompt tokens of grouped requests admitted at least once "
                       "(enable_prefix_caching; nan without)",
    "batch_occupancy_mean": "time-average of running requests / max_num_seqs",
    "queue_depth_mean": "time-average number of waiting requests",
    "kv_utilization_mean": "time-average allocated KV blocks / num_gpu_blocks",
}

# Per-replication counts, stored as integers.
_INT_COLUMNS = frozenset(c for c in K.COUNTS if c.startswith("n_")
                         or c in ("max_blocks_used", "blocks_used_at_end", "max_swap_blocks_used"))


def metric_unit(metric: str):
    """Display unit of a metric and the factor from its SI value: ``("ms", 1000.0)``."""
    if metric.startswith(("ttft", "tpot", "itl", "e2e")):
        return "ms", 1000.0
    if metric in ("request_throughput", "goodput"):
        return "req/s", 1.0
    if metric == "output_throughput":
        return "tok/s", 1.0
    return "", 1.0


def _extra_columns(scenario) -> tuple:
    """The columns after `COLUMNS` of the scenario's rows: a fleet's load balance (and an autoscaler's
    GPU-hours and SLO-violation minutes), a disaggregated server's."""
    if scenario.fleet is None:
        return ()
    if _is_disagg(scenario):
        return K.DISAGG_COLUMNS
    return _fleet_columns(scenario)


def as_seed_sequence(seed) -> np.random.SeedSequence:
    """The one reading of a ``seed`` argument (None, int >= 0, SeedSequence or Generator)."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, np.random.Generator):
        return np.random.SeedSequence(int(seed.integers(0, 2**63)))
    if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0):
        return np.random.SeedSequence(None if seed is None else int(seed))
    raise ValueError(f"seed must be None, an integer >= 0, a numpy SeedSequence or Generator, got {seed!r}")


def reproducible_seed(ss: np.random.SeedSequence):
    """A value that gives back ``ss`` when passed as ``seed``: the plain entropy
    for a root sequence, else the sequence itself (its spawn_key matters)."""
    plain = not ss.spawn_key and isinstance(ss.entropy, (int, np.integer))
    return int(ss.entropy) if plain else ss


def _seed_keys(seed):
    """Two 64-bit keys, and a seed value that reproduces them when passed back."""
    ss = as_seed_sequence(seed)
    k0, k1 = ss.generate_state(2, dtype=np.uint64)
    return np.uint64(k0), np.uint64(k1), reproducible_seed(ss)


def _thread_count(n_threads):
    """Threads for the CPU kernel: ``n_threads``, else Numba's setting (which
    :func:`fastsim._parallel.run_parallel` sets per worker)."""
    if n_threads is not None:
        return n_threads
    import numba

    return numba.get_num_threads()


def sample_requests(scenario: Scenario, seed=None, replication: int = 0) -> pd.DataFrame:
    """The request stream that replication ``replication`` of ``replicate(scenario, seed=seed)`` simulates.

    Returns
    -------
    pandas.DataFrame
        Columns ``arrival_s``, ``prompt_len``, ``output_len``, ``priority``,
        ``sjf_key`` (the predicted output lengths that ``policy="sjf"``
        orders by) when the engine has a ``length_predictor``, ``think_s``
        in a pure closed loop (``max_concurrency`` without ``arrival_rate``:
        every ``arrival_s`` is 0, and the client of the ``j``-th departure
        sends again ``think_s[j + max_concurrency]`` later; 0 for the first
        ``max_concurrency`` rows), and
        ``prefix_group`` and ``prefix_len`` when the workload has
        ``prefix_groups``; with a ``request_trace``, ``trace_row`` (the
        trace's request each one replays) and, when the trace identifies
        blocks, ``block_hashes`` (an int64 array per request: its prompt's
        block identities, ``request_trace.block_size`` tokens each). With
        ``workload.sessions``, the draws per send (request k is the k-th
        turn sent): ``arrival_s`` (a session's first turn: when it starts;
        NaN for the others), ``prompt_len`` (the new tokens of the turn it
        sends), ``output_len``, ``priority``, ``think_s`` (the think time
        before it), ``turns`` (of a session it starts) and ``first_turn``;
        :func:`simulate_requests` gives the turns sent.
    """
    replication = check_int("replication", replication, low=0, high=MAX_COUNT)
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    from ._memory import check_run_memory

    check_run_memory(scenario, 0, 1, "sample_requests")
    k0, k1, _ = _seed_keys(seed)
    p = pack_scenario(scenario)
    a, pr, o, c, q, grp, plen = K.draw_workload(replication, k0, k1, *K.scenario_arrays(p, lat=False))
    if scenario.workload.sessions is not None:
        from ._sessions import sample_frame

        return sample_frame(a, pr, o, c, q, grp, plen)
    cols = {"arrival_s": a, "prompt_len": pr, "output_len": o, "priority": c}
    if scenario.workload.closed_loop and scenario.workload.arrival_rate is None:
        # a pure closed loop: every request wants to go at once; the kernel's
        # arrival column holds the think time of the departure that frees
        # request k's seat (k >= max_concurrency)
        cols["arrival_s"] = np.zeros(a.size)
        cols["think_s"] = a
    if scenario.engine.length_predictor is not None:
        cols["sjf_key"] = q
    if scenario.workload.prefix_groups > 0:
        cols["prefix_group"] = grp
        cols["prefix_len"] = plen
    tr = scenario.workload.request_trace
    if tr is not None:
        rows = trace_rows(scenario.workload, k0, k1, replication, a.size)
        cols["trace_row"] = rows
        if tr.block_offsets is not None:
            cols["block_hashes"] = pd.Series([tr.blocks(r) for r in rows], dtype=object)
    return pd.DataFrame(cols)


def trace_rows(workload: Workload, k0, k1, replication: int, n: int) -> np.ndarray:
    """The rows of ``workload.request_trace`` that the ``n`` requests of
    ``replication`` replay: 0 .. n - 1, or from the first row of its window
    (the kernel's draw, `kernel.trace_window`)."""
    row0 = 0
    if workload.trace_window_s is not None:
        row0 = K.trace_window(replication, k0, k1, workload.request_trace.arrival_s, workload.trace_window_s)[1]
    return np.arange(row0, row0 + n, dtype=np.int64)


def compile_kernels(engine: str = "both") -> pd.DataFrame:
    """Compile the CPU kernels now, or load them from Numba's disk cache.

    The first run on a machine compiles the kernels (10-25 s for each
    engine on the 2-core development VM, by the VM's speed) and stores them
    in Numba's cache, from which later processes load them in well under a
    second. Call this where that cost should be paid, e.g. when a container
    image or a cluster's environment is built, or before timing anything.
    The kernels do not depend on the scenario: one compilation serves every
    scenario that uses that engine.

    Parameters
    ----------
    engine : {"both", "common", "full"}
        ``"full"``: the engine of prefix caching (on by default, as in vLLM),
        static batching, active priority preemption and swap preemption.
        ``"common"``: the smaller one of every other scenario (prefix caching
        off). ``"both"``: the two.

    Returns
    -------
    pandas.DataFrame
        One row per engine: ``engine`` and ``seconds`` (the time to compile
        or load its kernels and run them on 8 requests).
    """
    check_choice("engine", engine, ("both", "common", "full"))
    # (the common engine is the synchronous one: vLLM V1's defaults, async scheduling on, need the full engine,
    # so `compile` compiled only that one)
    base = Scenario(engine=EngineConfig.synchronous(max_num_seqs=4, num_gpu_blocks=64),
                    workload=Workload(arrival_rate=1.0, num_requests=8, prompt_len=LogNormal(64, 0.5),
                                      output_len=LogNormal(16, 0.5)))
    scenarios = {"common": base, "full": base.replace(**{"engine.enable_prefix_caching": True,
                                                          "engine.block_hash_caching": True})}
    rows = []
    for name in (("common", "full") if engine == "both" else (engine,)):
        sc = scenarios[name]
        start = time.perf_counter()
        replicate(sc, n_replications=2, seed=0, n_threads=1, progress=False)
        simulate_requests(sc, sample_requests(sc, seed=0))
        rows.append((name, time.perf_counter() - start))
    return pd.DataFrame(rows, columns=["engine", "seconds"])


def _prepare_kernel(scenario: Scenario) -> None:
    """Compile the CPU kernel ``scenario`` needs, or load it from Numba's cache
    (what the first :func:`replicate` of a process does first)."""
    packed = pack_scenario(scenario)
    K.chunk_runner(K.scenario_arrays(packed), K.engine_variant(packed["ipar"]))


def simulate_requests(scenario: Scenario, requests: pd.DataFrame, backend: str = "numba", *, seed=0,
                      replication: int = 0) -> pd.DataFrame:
    """Simulate one given request stream and return per-request results.

    Parameters
    ----------
    scenario : Scenario
        The engine, latency model and SLOs (its workload's laws are ignored,
        except ``warmup_requests`` and ``horizon_s``).
    requests : pandas.DataFrame
        Columns ``arrival_s``, ``prompt_len``, ``output_len`` and optionally
        ``priority`` and ``sjf_key`` (the SJF keys; default: the output
        lengths) (e.g. from :func:`sample_requests`). With a
        ``length_predictor`` the ``sjf_key`` column is required.
    backend : {"numba", "reference"}
    seed, replication : optional
        With a stochastic latency model (``latency.noise``), the run's noise
        is that of replication ``replication`` of ``replicate(scenario,
        seed=seed)`` (seed 0 by default: a given stream gives the same
        results on every call and backend; ``None`` draws fresh noise).
        Ignored by a deterministic model.

    Returns
    -------
    pandas.DataFrame
        One row per request: ``status`` (completed, rejected_too_long,
        rejected_admission, dropped, unfinished), ``first_token_s``,
        ``finish_s`` (absolute engine times), ``ttft_s``, ``e2e_s`` (as the
        client sees them: including ``latency.ttft_overhead_s``),
        ``num_preemptions``, ``num_tokens``, ``num_swaps`` (preemptions by
        swap, counted in ``num_preemptions`` too) and ``swapped_s`` (time in
        the swapped queue) and ``cached_tokens`` (prefix-cache hit tokens at
        its first admission). With ``workload.sessions`` (``requests``: the
        draws `sample_requests` gives), one row per turn sent, in arrival
        order, with its ``prompt_len`` (the conversation so far and its new
        tokens), ``output_len``, ``priority``, ``session`` and ``turn`` (1,
        2, ...).
    """
    check_choice("backend", backend, ("numba", "reference"))   # one stream: no GPU backend
    replication = check_int("replication", replication, low=0, high=MAX_COUNT)
    from ._validation import check_arrival_times, check_int_array

    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    if scenario.fleet is not None:
        # (it ran the stream on one replica of the scenario's engine, the fleet ignored)
        raise ValueError(f"scenario.fleet must be None for simulate_requests (one replica's per-request "
                         f"results), got {scenario.fleet!r}; replicate runs fleets and disaggregated servers "
                         f"(per-class results: Workload(classes=...))")
    if hasattr(requests, "to_pandas") and not isinstance(requests, pd.DataFrame):
        requests = requests.to_pandas()        # polars, pyarrow
    if scenario.workload.sessions is not None:
        return _simulate_sessions(scenario, pd.DataFrame(requests), backend, seed, replication)
    if not isinstance(requests, (pd.DataFrame, dict)):
        raise ValueError(f"requests must be a pandas DataFrame (or a dict of columns) with columns arrival_s, "
                         f"prompt_len and output_len, got {type(requests).__name__}")
    if isinstance(requests, dict):
        try:
            requests = pd.DataFrame(requests)
        except ValueError as exc:
            raise ValueError(f"requests: {exc}") from None
    missing = [col for col in ("arrival_s", "prompt_len", "output_len") if col not in requests]
    if missing:
        raise ValueError(f"requests has no column(s) {', '.join(map(repr, missing))}; it needs arrival_s, "
                         f"prompt_len and output_len (optional: priority, sjf_key, prefix_group, prefix_len)")
    # an empty stream is a legitimate one (sample_requests draws it when no user sends a request)
    a = check_arrival_times("requests['arrival_s']", requests["arrival_s"], allow_empty=True)
    p = check_int_array("requests['prompt_len']", requests["prompt_len"], allow_empty=True)
    o = check_int_array("requests['output_len']", requests["output_len"], allow_empty=True)
    c = np.zeros(a.size, np.int64)
    if "priority" in requests:
        pri = np.asarray(requests["priority"])
        if pri.dtype.kind not in "iu":
            raise ValueError(f"requests['priority'] must hold integers, got dtype {pri.dtype}")
        c = pri.astype(np.int64)
    h = scenario.workload.horizon_s
    if h is not None:
        keep = a < h
        a, p, o, c = a[keep], p[keep], o[keep], c[keep]
    extra = {}
    for col in ("sjf_key", "prefix_group", "prefix_len"):
        if col in requests:
            x = np.asarray(requests[col])
            extra[col] = x[keep] if h is not None else x
    w = scenario.workload
    pure_loop = w.closed_loop and w.arrival_rate is None
    think = None
    if pure_loop:
        if "think_s" in requests:
            think = np.asarray(requests["think_s"], dtype=np.float64)
            if think.shape != a.shape or not np.all(np.isfinite(think) & (think >= 0)):
                raise ValueError("requests['think_s'] must hold a finite think time >= 0 per request")
        elif w.think_time_dist == "fixed":
            think = np.where(np.arange(a.size) < w.max_concurrency, 0.0, w.think_time_s)
        else:
            raise ValueError("requests must have a 'think_s' column (sample_requests draws it) with "
                             "think_time_dist='exponential'")
        if np.any(a != 0.0):
            raise ValueError("requests['arrival_s'] must be 0 in a pure closed loop (max_concurrency without "
                             "arrival_rate: the seats set when each request goes)")
    if "sjf_key" not in extra and scenario.engine.sjf_key != "output":
        extra["sjf_key"] = _sjf_keys(scenario.engine, p, o)
    if scenario.engine.length_predictor is not None and "sjf_key" not in extra:
        raise ValueError("requests must have an 'sjf_key' column (the predicted output lengths) when "
                         f"engine.length_predictor is set (got length_predictor="
                         f"{scenario.engine.length_predictor!r}); sample_requests draws it")
    if "sjf_key" in extra:
        q = np.asarray(extra["sjf_key"])
        if q.dtype.kind not in "iu":
            raise ValueError(f"requests['sjf_key'] must hold integers, got dtype {q.dtype}")
        extra["sjf_key"] = q.astype(np.int64)
    if ("prefix_group" in extra) != ("prefix_len" in extra):
        raise ValueError("requests must have both 'prefix_group' and 'prefix_len' columns, or neither")
    if "prefix_group" in extra:
        grp, plen = np.asarray(extra["prefix_group"]), np.asarray(extra["prefix_len"])
        for name, x in (("prefix_group", grp), ("prefix_len", plen)):
            if x.dtype.kind not in "iu":
                raise ValueError(f"requests['{name}'] must hold integers, got dtype {x.dtype}")
        grp, plen = grp.astype(np.int64), plen.astype(np.int64)
        bad = (grp < -1) | (plen < 0) | (plen >= p) | ((grp == -1) & (plen != 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"requests row {i}: prefix_group must be >= -1 and 0 <= prefix_len < prompt_len "
                             f"(prefix_len 0 without a group), got prefix_group={int(grp[i])}, "
                             f"prefix_len={int(plen[i])}, prompt_len={int(p[i])}")
        extra["prefix_group"], extra["prefix_len"] = grp, plen
    hashes = None
    if trace_hashing(scenario) and "block_hashes" in requests and "prefix_group" not in extra:
        # the trace's block identities (`sample_requests`'s column) key the cache
        hashes = list(requests["block_hashes"])
        hashes = [hashes[i] for i in np.flatnonzero(keep)] if h is not None else hashes
    if backend in ("numba", "cuda"):
        check_kernel_supports(scenario.engine)
    if backend == "cuda":
        from ._cuda import check_cuda_available

        check_cuda_available()
    k0, k1, _ = _seed_keys(seed)
    c0 = scenario.latency.ttft_overhead_s
    if a.size == 0:   # nothing to simulate (each backend would want at least one request)
        status = np.zeros(0, np.int64)
        first = finish = swapped = np.zeros(0)
        npre = ntok = nswap = ctok = np.zeros(0, np.int64)
    elif backend == "reference":
        from ._reference import simulate_reference
        from ._reference_noise import run_latency

        run, steps = run_latency(scenario.latency, k0, k1, replication)
        c0 = run.ttft_overhead_s
        if hashes is not None:
            extra.update(block_hashes=hashes, hash_block_size=w.request_trace.block_size)
        res = simulate_reference(a, p, o, c, scenario.engine, run, horizon_s=h, step_noise=steps,
                                 max_concurrency=w.max_concurrency,
                                 think_time_s=None if think is None else think[w.max_concurrency:], **extra)
        a = np.asarray(res["arrival_s"])   # (a closed loop's: when each request was sent)
        status = np.asarray(res["status"])   # the reference's codes: 0 completed ... 4 unfinished
        first, finish = np.asarray(res["first_token_s"]), np.asarray(res["finish_s"])
        npre, ntok = np.asarray(res["num_preemptions"]), np.asarray(res["num_tokens"])
        nswap, swapped = np.asarray(res["num_swaps"]), np.asarray(res["swapped_s"])
        ctok = np.asarray(res["cached_tokens"])
    else:
        packed = pack_scenario(scenario)
        q = np.ascontiguousarray(extra.get("sjf_key", o), dtype=np.int64)
        grp = np.ascontiguousarray(extra.get("prefix_group", np.full(a.size, -1)), dtype=np.int64)
        plen = np.ascontiguousarray(extra.get("prefix_len", np.zeros(a.size)), dtype=np.int64)
        if hashes is not None:
            from ._traces import stream_parents

            grp, plen = stream_parents(hashes, p, w.request_trace.block_size, scenario.engine.block_size)
        if scenario.engine.enable_prefix_caching and (grp >= 0).any():
            packed["ipar"] = packed["ipar"].copy()
            packed["ipar"][K.I_CACHING] = 1   # (the stream's own prefix groups: `pack_scenario`)
        from ._memory import check_stream_memory

        check_stream_memory(a.size, p, o, grp, plen, packed["ipar"])
        rlat, rfpar = K.run_records(packed["lat"], packed["fpar"], k0, k1, replication)
        c0 = float(rfpar[K.F_TTFT_OVERHEAD])
        sent = np.array(a, dtype=np.float64)   # (a closed loop's: when each request was sent)
        st, first, finish, npre, ntok, nswap, swapped, ctok, _ = K.simulate_stream(
            a if think is None else think, p, o, c, q, grp, plen, packed["ipar"], rfpar, rlat, arrival_out=sent)
        a = sent
        status = np.asarray(st) - K.ST_COMPLETED
    return pd.DataFrame({
        "arrival_s": a, "prompt_len": p, "output_len": o, "priority": c,
        "status": pd.Categorical(_STATUS_NAMES[status], categories=_STATUS_NAMES),
        "first_token_s": first, "finish_s": finish,
        "ttft_s": first - a + c0,
        "e2e_s": np.where(status == 0, finish - a + c0, np.nan),
        "num_preemptions": npre, "num_tokens": ntok, "num_swaps": nswap, "swapped_s": swapped,
        "cached_tokens": ctok,
    })


def _session_turns(scenario, requests, backend, k0, k1, replication) -> dict:
    """One replication's sessions from `sample_requests`'s draws: the turns
    sent, in arrival order, with their final prompts, sessions and results."""
    from ._sessions import stream_arrays

    arrival, p, o, c, sjfk, pgrp, plen = stream_arrays(requests)
    if backend == "reference":
        from ._reference_noise import run_latency

        run, steps = run_latency(scenario.latency, k0, k1, replication)
        from ._reference_metrics import reference_sessions

        res = reference_sessions(scenario, run, steps, arrival, p, o, c, sjfk, pgrp)
        return dict(arrival=res["arrival_s"], prompt=res["prompt_len"], output=res["output_len"],
                    session=res["session"], status=res["status"], first=res["first_token_s"],
                    finish=res["finish_s"], npre=res["num_preemptions"], ntok=res["num_tokens"],
                    nswap=res["num_swaps"], swapped=res["swapped_s"], ctok=res["cached_tokens"],
                    c0=run.ttft_overhead_s, prio=res["priority"])
    packed = pack_scenario(scenario)
    rlat, rfpar = K.run_records(packed["lat"], packed["fpar"], k0, k1, replication)
    from .kernel.drivers import Replica

    rep = Replica(arrival, p, o, c, sjfk, pgrp, plen, packed["ipar"], rfpar, rlat)
    rep.advance_until(np.inf)
    st, first, finish, npre, ntok, nswap, swapped, ctok, _ = rep.finish()
    s = rep.stream
    sent = np.isfinite(s.arrival)
    return dict(arrival=s.arrival[sent].copy(), prompt=s.prompt[sent].copy(), output=s.output[sent].copy(),
                session=s.pgrp[sent].copy(), status=(np.asarray(st) - K.ST_COMPLETED)[sent], first=first[sent],
                finish=finish[sent], npre=npre[sent], ntok=ntok[sent], nswap=nswap[sent], swapped=swapped[sent],
                ctok=ctok[sent], c0=float(rfpar[K.F_TTFT_OVERHEAD]), prio=s.prio[sent].copy())


def _simulate_sessions(scenario, requests, backend, seed, replication) -> pd.DataFrame:
    """`simulate_requests` of a workload of sessions."""
    if backend == "numba":
        check_kernel_supports(scenario.engine)
    k0, k1, _ = _seed_keys(seed)
    r = _session_turns(scenario, requests, backend, k0, k1, replication)
    a, status, c0 = r["arrival"], np.asarray(r["status"], dtype=np.int64), r["c0"]
    turn = pd.Series(r["session"]).groupby(r["session"]).cumcount().to_numpy() + 1
    return pd.DataFrame({
        "arrival_s": a, "prompt_len": r["prompt"], "output_len": r["output"], "priority": r["prio"],
        "session": r["session"], "turn": turn,
        "status": pd.Categorical(_STATUS_NAMES[status], categories=_STATUS_NAMES),
        "first_token_s": r["first"], "finish_s": r["finish"],
        "ttft_s": r["first"] - a + c0,
        "e2e_s": np.where(status == 0, r["finish"] - a + c0, np.nan),
        "num_preemptions": r["npre"], "num_tokens": r["ntok"], "num_swaps": r["nswap"], "swapped_s": r["swapped"],
        "cached_tokens": r["ctok"],
    })


#: Final request states, indexed by the code both backends report (kernel codes offset by ST_COMPLETED).
_STATUS_NAMES = np.array(["completed", "rejected_too_long", "rejected_admission", "dropped", "unfinished"])


# ------------------------------------------------------------------------------
# Results

@dataclass(eq=False)
class ReplicateResult:
    """Result of :func:`replicate`.

    Attributes
    ----------
    scenario : Scenario
    per_replication : pandas.DataFrame
        One row per replication: every metric in :data:`METRIC_DESCRIPTIONS`
        and the counts ``n_arrived``, ``n_completed``, ``n_rejected``
        (``n_rejected_too_long`` + ``n_rejected_admission``), ``n_dropped``,
        ``n_unfinished`` (``n_arrived`` is always their sum), ``n_measured`` (arrivals after
        the ``warmup_requests``: those the metrics cover), ``n_preemptions``, ``n_swaps``,
        ``n_steps``, ``max_blocks_used``, ``blocks_used_at_end``, ``max_swap_blocks_used``
        (CPU swap space, at most ``swap_space_blocks``), ``window_s``,
        ``end_s`` and the Little's-law pair ``time_in_system_integral`` /
        ``sojourn_sum``.
    confidence_level : float
    seed : int or numpy.random.SeedSequence
        Pass it as ``seed`` to reproduce this result exactly (it is the
        drawn entropy when ``seed=None`` was given).
    backend : str
    precision : dict or None
        The requested relative half-widths, if any.
    elapsed_s : float
        Wall time of the simulation (including compilation, or loading
        compiled kernels from Numba's cache, on the first call in a process).
    interrupted : bool
        True for the partial result of an interrupted run (:class:`Interrupted`):
        ``per_replication`` then holds only the replications that finished
        (its index is their replication number), and :meth:`save` adds a
        ``partial`` column.
    per_class : pandas.DataFrame or None
        With ``workload.classes``: a row per (class, replication), its
        metrics over that class's requests, each replication's stream served
        again as the replication served it (its seed's noise; the
        scenario's server: one replica, a fleet, a disaggregated server or
        an autoscaled fleet). Pooled over the classes, the rows give the
        replication's own counts and means.
    """

    scenario: Scenario
    per_replication: pd.DataFrame
    confidence_level: float
    seed: object
    backend: str
    precision: dict | None = None
    elapsed_s: float = 0.0
    metrics: tuple = field(default=K.METRICS)
    interrupted: bool = False
    per_class: pd.DataFrame | None = None
    _stability: object = field(default=None, repr=False)

    @property
    def stability(self):
        """`fastsim._stability.StabilityCheck`: is the offered load more than the
        engine serves? Computed on first use (it simulates up to five of the
        replications' streams again, so `replicate` itself costs nothing more,
        each as its replication ran: one replica, a fleet or a disaggregated
        server or an autoscaled fleet; not checked, ``replications`` 0:
        sessions and pure closed loops, whose sends follow departures);
        warns (RuntimeWarning) with the rate the scenario sustains when overloaded."""
        if self._stability is None:
            from ._stability import CHECK_REPLICATIONS, check_stability

            # (a fleet serves the stream, not one replica)
            simulate = simulate_requests if self.scenario.fleet is None else _served_frame
            reps = self.per_replication.index[:CHECK_REPLICATIONS]
            w = self.scenario.workload
            if w.sessions is not None or (w.closed_loop and w.arrival_rate is None):
                # (not checked, `replications` 0: sessions' later turns and a pure closed loop's sends come from
                # departures, so the load they offer is the served; a capped stream is checked on the times
                # its requests want to go)
                reps = reps[:0]
            self._stability = check_stability(self.scenario, self.seed, reps, sample_requests, simulate,
                                              self.backend)
            if self._stability.overloaded:
                import warnings

                warnings.warn(self._stability.message, RuntimeWarning, stacklevel=3)
        return self._stability

    @property
    def arrivals(self) -> str:
        """The requests that arrived per replication, in words ("200", or
        "about 41 (31-52)" when they vary): not a buffer size."""
        n = self.per_replication["n_arrived"].to_numpy()
        if n.size == 0:
            return "0"
        if n.min() == n.max():
            return f"{int(n[0])}"
        return f"about {n.mean():.0f} ({int(n.min())}-{int(n.max())})"

    @property
    def n_replications(self) -> int:
        return len(self.per_replication)

    def summary(self, confidence_level: float | None = None, by: str | None = None) -> pd.DataFrame:
        """Estimates with confidence intervals, one row per metric.

        Columns: ``estimate`` (mean over replications), ``ci_low``,
        ``ci_high`` (Student-t interval), ``std_error``, ``n`` (replications
        with a finite value), ``band_low``, ``band_high`` (the single-run
        prediction band, :meth:`prediction_band`) and ``description`` (what
        is estimated).

        The two intervals answer two questions. ``ci_low``/``ci_high``: where
        the *expected value* lies (the long-run average over many benchmark
        runs); it shrinks as replications are added. ``band_low``/``band_high``:
        where the value of *one* run (one ``vllm bench serve``) falls with
        probability ``confidence_level``; it does not shrink, and with a
        stochastic latency model (``latency.noise``) it includes the
        server's own noise and the calibration's uncertainty.

        ``by="class"`` (a workload with ``classes``): one row per (class,
        metric) of the per-request metrics (`fastsim._classes.CLASS_METRICS`),
        each the mean over replications of the class's per-run value, with
        a ``class`` column first.
        """
        level = self.confidence_level if confidence_level is None else check_confidence_level(confidence_level)
        if by is not None:
            check_choice("by", by, ("class",))
            return self._class_summary(level)
        frame = summary_frame(self.per_replication, self.metrics, level, bands=True)
        frame["description"] = [METRIC_DESCRIPTIONS.get(m, "") for m in frame.index]
        if self.n_replications and self.stability.overloaded:
            frame.attrs["stability"] = self.stability.message
        return frame

    def _class_summary(self, level) -> pd.DataFrame:
        from ._classes import CLASS_METRICS

        if self.per_class is None:
            raise ValueError("summary(by='class') needs a workload with classes (Workload(classes=...)), "
                             "got one without")
        parts = []
        for cls, rows in self.per_class.groupby("class", sort=False):
            frame = summary_frame(rows, CLASS_METRICS, level).reset_index()
            frame.insert(0, "class", cls)
            parts.append(frame)
        out = pd.concat(parts, ignore_index=True)
        out["description"] = [METRIC_DESCRIPTIONS.get(m, "") for m in out["metric"]]
        if self.n_replications and self.stability.overloaded:
            out.attrs["stability"] = self.stability.message
        return out

    to_frame = summary

    def confidence_interval(self, metric: str, confidence_level: float | None = None) -> ConfidenceInterval:
        """The interval of one metric's estimate."""
        check_choice("metric", metric, self.metrics)
        level = self.confidence_level if confidence_level is None else check_confidence_level(confidence_level)
        _, low, high, _, _ = mean_interval(self.per_replication[metric].to_numpy(), level)
        return ConfidenceInterval(low, high)

    def prediction_band(self, metric: str, confidence_level: float | None = None) -> ConfidenceInterval:
        """Where one run's value of ``metric`` falls with probability
        ``confidence_level``: the central quantiles of the per-replication
        values (one replication = one benchmark run). Unlike
        :meth:`confidence_interval`, it does not shrink with more replications."""
        check_choice("metric", metric, self.metrics)
        level = self.confidence_level if confidence_level is None else check_confidence_level(confidence_level)
        return ConfidenceInterval(*prediction_band(self.per_replication[metric].to_numpy(), level))

    def estimate(self, metric: str) -> float:
        check_choice("metric", metric, self.metrics)
        return float(mean_interval(self.per_replication[metric].to_numpy(), self.confidence_level)[0])

    def relative_half_width(self, metric: str) -> float:
        """CI half-width divided by the absolute estimate (0 if every replication
        gave the same value, else inf if the estimate is 0 or undefined)."""
        check_choice("metric", metric, self.metrics)
        return _relative_half_width_of(self.per_replication[metric].to_numpy(), self.confidence_level)

    def precision_achieved(self) -> pd.DataFrame:
        """For a run with ``precision`` targets: target and reached relative
        half-width of each named metric, and whether it was met."""
        if not self.precision:
            raise ValueError("precision_achieved() needs a result of replicate(..., precision={...})")
        rows = {m: {"target": t, "reached": self.relative_half_width(m),
                    "met": self.relative_half_width(m) <= t} for m, t in self.precision.items()}
        frame = pd.DataFrame.from_dict(rows, orient="index")
        frame.index.name = "metric"
        return frame

    def save(self, path, by: str | None = None) -> Path:
        """Write the summary (``.csv``, ``.json``, ``.parquet``; by suffix;
        ``by="class"``: the summary by class).

        ``*.per_replication.parquet``-style full data: use
        ``result.per_replication.to_parquet(...)``.
        """
        frame = self.summary(by=by)
        if self.interrupted:
            frame["partial"] = True   # the file outlives the message that said so
        return save_table(frame, path)

    def _repr_html_(self) -> str:
        """A notebook's view: every metric's estimate and interval, in display units."""
        import html

        level = self.confidence_level
        name = self.scenario.name or "scenario"
        head = (f"<b>{html.escape(name)}</b>: {self.n_replications} replications x "
                f"{self.arrivals} requests, seed {html.escape(str(self.seed))}"
                + (" <b>(partial: interrupted)</b>" if self.interrupted else ""))
        if self.n_replications and self.stability.overloaded:
            head += f"<br><b>{html.escape(self.stability.message)}</b>"
        rows = []
        for metric, row in self.summary().iterrows():
            unit, scale = metric_unit(metric)
            if np.isfinite(row.estimate):
                cells = (f"{row.estimate * scale:.4g}", f"[{row.ci_low * scale:.4g}, {row.ci_high * scale:.4g}]")
            else:
                cells = ("n/a", "")
            rows.append(f"<tr><td>{metric}</td><td style='text-align:right'>{cells[0]}</td><td>{cells[1]}</td>"
                        f"<td>{unit}</td><td style='text-align:left'>{html.escape(row.description)}</td></tr>")
        return (f"<div><p>{head}</p><table><thead><tr><th>metric</th><th>estimate</th>"
                f"<th>{level:.0%} confidence interval</th><th>unit</th><th>what</th></tr></thead><tbody>"
                + "".join(rows) + "</tbody></table></div>")

    def __repr__(self):
        part = ", interrupted=True" if self.interrupted else ""
        return (f"ReplicateResult(n_replications={self.n_replications}, backend={self.backend!r}, "
                f"confidence_level={self.confidence_level}{part})")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM in the CLI) stopped :func:`replicate` or :func:`~fastsim.sweep`.

    A :class:`KeyboardInterrupt`, so code that does not look for it still
    stops; ``partial`` holds what had finished: a :class:`ReplicateResult`
    or :class:`~fastsim.SweepResult` with ``interrupted=True``.

    Examples
    --------
    >>> try:                                                # doctest: +SKIP
    ...     res = fastsim.replicate(scenario, 100_000)
    ... except fastsim.Interrupted as stop:
    ...     res = stop.partial          # the finished replications
    """

    def __init__(self, partial):
        super().__init__("interrupted; the finished part is in .partial")
        self.partial = partial


class _ChunksInterrupted(KeyboardInterrupt):
    """`_run` was interrupted: ``ids`` (replication numbers) and ``rows`` that finished."""

    def __init__(self, ids, rows):
        super().__init__()
        self.ids, self.rows = ids, rows


# ------------------------------------------------------------------------------
# replicate

def _check_backend(backend):
    """Raise unless ``backend`` is known and (for ``"cuda"``) usable here."""
    check_choice("backend", backend, BACKENDS)
    if backend == "cuda":
        from ._cuda import check_cuda_available

        check_cuda_available()


def check_runnable(scenario, backend="numba") -> None:
    """What `replicate` refuses of a scenario before any kernel runs
    (`capacity`, `fleet_capacity` and `simulate_autoscaled` run it too): a
    backend that cannot run it, an autoscaled fleet's or a disaggregated
    server's limits, and engine options (every serving engine's,
    `_fleet.running_engines`) the kernel does not implement yet."""
    if backend == "cuda" and scenario.latency.is_stochastic:
        raise ValueError("backend='cuda' does not simulate a stochastic latency model (latency.noise); use "
                         "backend='numba', or latency.deterministic()")
    _check_backend(backend)
    if scenario.fleet is not None and backend != "numba":
        raise ValueError(f"backend must be 'numba' for a fleet scenario (Scenario.fleet), got {backend!r}")
    if _is_autoscaled(scenario):
        from ._autoscale import check_autoscaled
        check_autoscaled(scenario)
    if backend in ("numba", "cuda"):
        from ._fleet import running_engines

        for _, engine in running_engines(scenario):   # (a listed fleet's replicas, a disaggregated server's pools)
            check_kernel_supports(engine)
    if _is_disagg(scenario):
        from ._disagg import check_disagg_scenario

        check_disagg_scenario(scenario)


def _replicate_iv(scenario, n_replications, backend, confidence_level, precision, max_replications,
                  n_threads, batch_size):
    if not isinstance(scenario, Scenario):
        raise ValueError(f"scenario must be a fastsim.Scenario, got {type(scenario).__name__}")
    n_replications = check_int("n_replications", n_replications, low=2)
    check_runnable(scenario, backend)
    confidence_level = check_confidence_level(confidence_level)
    if precision is not None:
        if not isinstance(precision, dict) or not precision:
            raise ValueError(f"precision must be a non-empty dict {{metric: relative half-width}}, got {precision!r}")
        for m, v in precision.items():
            check_choice("precision metric", m, K.METRICS)
            check_float(f"precision[{m!r}]", v, low=0, low_open=True)
    if precision is not None:
        max_replications = check_int("max_replications", max_replications, low=n_replications)
    n_threads = check_int("n_threads", n_threads, low=1, optional=True)
    if n_threads is not None:
        import numba

        if n_threads > numba.config.NUMBA_NUM_THREADS:
            raise ValueError(f"n_threads must be <= NUMBA_NUM_THREADS ({numba.config.NUMBA_NUM_THREADS}), "
                             f"got {n_threads}")
    batch_size = check_int("batch_size", batch_size, low=1, optional=True)
    return n_replications, confidence_level, max_replications, n_threads, batch_size


def _check_replicate_memory(scenario, n_replications, backend, n_threads, what="replicate", count=None):
    """Refuse a run whose workspace sizes overflow the kernel's int64, or
    whose memory estimate exceeds the memory available (`fastsim._memory`),
    before anything is allocated: ValueError naming the parameter (``count``:
    the one that sets ``n_replications`` when it is not ``n_replications``
    itself, ``max_replications`` with a precision target)."""
    if count is not None:
        try:
            return _check_replicate_memory(scenario, n_replications, backend, n_threads, what)
        except ValueError as exc:   # (it said "reduce n_replications" of a run sized by max_replications)
            raise ValueError(str(exc).replace("n_replications", count)) from None
    from . import _memory

    if backend == "numba":   # (a fleet's too: `_memory.check_fleet_memory`)
        _memory.check_run_memory(scenario, n_replications, _thread_count(n_threads), what)
        return
    if backend == "cuda":
        _memory.check_int64(scenario)
    _memory.check_memory(_memory.estimate(scenario, n_replications, 1), what)


def replicate(scenario: Scenario, n_replications: int = 1000, *, seed=None, backend: str = "numba",
              confidence_level: float = 0.95, precision: dict | None = None,
              max_replications: int = 100_000, n_threads: int | None = None,
              batch_size: int | None = None, progress: bool | None = None) -> ReplicateResult:
    """Simulate independent replications of a scenario and estimate its metrics.

    Parameters
    ----------
    scenario : Scenario
        Server, workload, latency model and SLOs.
    n_replications : int
        Independent runs (each of ``scenario.workload.num_requests`` arrivals).
        With ``precision``, the number to start with.
    seed : None, int, numpy.random.SeedSequence or numpy.random.Generator
        Key of the counter-based random streams. Replication ``r`` depends only
        on the seed and ``r``, so results are identical whatever the thread
        count or ``batch_size``, and a run with more replications extends one
        with fewer.
    backend : {"numba", "cuda", "reference"}
        The compiled CPU kernel; the same kernel on an NVIDIA GPU, one GPU
        thread per replication (needs ``pip install 'fastsim-llm[gpu]'`` and a
        GPU; see ``fastsim/_cuda.py``); or the slow reference simulator (for
        checks). ``"cuda"`` gives the CPU kernel's results to floating-point
        tolerance (the GPU fuses multiply-adds and has its own ``exp``/``log``;
        under Numba's CUDA simulator they are bit-identical).
    confidence_level : float
        Level of the intervals in :meth:`ReplicateResult.summary`.
    precision : dict, optional
        ``{metric: relative half-width}``: keep adding replications (in
        batches) until every named metric's CI half-width is below that
        fraction of its estimate, or ``max_replications`` is reached
        (:meth:`ReplicateResult.precision_achieved` gives each target, the
        half-width reached and whether it was met; a warning names those
        missed).
    max_replications : int
        Cap on replications with ``precision``.
    n_threads : int, optional
        Threads for this call (default: Numba's setting). A run of fewer
        than 20,000 requests (replications x requests; 40,000 / threads
        above two) runs in the calling thread unless ``batch_size`` or a
        progress bar splits it: a pool would cost more than it saves.
    batch_size : int, optional
        Replications per kernel call (progress granularity); does not change results.
    progress : bool, optional
        Show a tqdm progress bar (default: when replications x requests >= 5 million).

    Returns
    -------
    ReplicateResult

    Raises
    ------
    ValueError
        For a bad argument; and, before anything is allocated, for a run
        whose engine workspace would exceed the kernel's 64-bit sizes, or
        whose memory estimate (per thread: the request arrays and the
        engine's workspace; the result tables) exceeds 80% of the memory
        available (``FASTSIM_MEMORY_LIMIT``, e.g. ``4G``, when set; else
        the cgroup limit and ``MemAvailable``): the message names the
        parameter that costs most, and the estimate. A replication whose
        drawn requests need a workspace larger than the machine's memory
        and swap is refused then (`fastsim._memory`).

    Examples
    --------
    >>> import fastsim
    >>> sc = fastsim.Scenario(workload=fastsim.Workload(arrival_rate=2.0, num_requests=200))
    >>> res = fastsim.replicate(sc, n_replications=50, seed=1)
    >>> ci = res.confidence_interval("ttft_mean")
    >>> bool(ci.low < res.estimate("ttft_mean") < ci.high)
    True
    >>> int(res.per_replication["n_arrived"].sum())   # nothing is lost
    10000
    """
    n_replications, confidence_level, max_replications, n_threads, batch_size = _replicate_iv(
        scenario, n_replications, backend, confidence_level, precision, max_replications, n_threads,
        batch_size)
    if progress is not None:
        progress = check_bool("progress", progress)
    _check_replicate_memory(scenario, max_replications if precision is not None else n_replications,
                            backend, n_threads, count="max_replications" if precision is not None else None)
    k0, k1, entropy = _seed_keys(seed)
    packed = pack_scenario(scenario)
    start = time.perf_counter()
    blocks, ids = [], []

    def run(rep0, nrep):
        blocks.append(_run(scenario, packed, k0, k1, rep0, nrep, backend, n_threads, batch_size, progress))
        ids.append(np.arange(rep0, rep0 + nrep))

    try:
        run(0, n_replications)
        done = n_replications
        if precision is not None:
            while done < max_replications:
                frame = np.concatenate(blocks)
                need = _replications_needed(frame, precision, done, confidence_level)
                if need <= done:
                    break
                # Grow geometrically (at most x2 per round) toward the estimate.
                extra = int(min(max(need - done, done // 4, 1), done, max_replications - done))
                run(done, extra)
                done += extra
    except KeyboardInterrupt as stop:
        # Keep what finished: whole blocks, and the finished chunks of the block that was running.
        if isinstance(stop, _ChunksInterrupted):
            blocks.append(stop.rows)
            ids.append(stop.ids)
        data = np.concatenate(blocks) if blocks else np.empty((0, K.N_COLUMNS + len(_extra_columns(scenario))))
        partial = _make_result(scenario, data, np.concatenate(ids) if ids else np.empty(0, np.int64),
                               confidence_level, entropy, backend, precision, time.perf_counter() - start,
                               interrupted=True)
        raise Interrupted(partial) from None
    # (one block, the common case, is taken as it is: a copy of a large run's
    # table would double its memory)
    data = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    if precision is not None:
        need = _replications_needed(data, precision, done, confidence_level)
        if need > done:
            import warnings

            missed = []
            for metric, target in precision.items():
                rel = _relative_half_width_of(data[:, K.COLUMNS.index(metric)], confidence_level)
                if not rel <= target:
                    missed.append(f"{metric} {rel:.3g} (target {target:g})")
            warnings.warn(f"precision targets not reached with max_replications={max_replications}: relative "
                          f"half-width {', '.join(missed)}; see ReplicateResult.precision_achieved()",
                          RuntimeWarning, stacklevel=2)
    w = scenario.workload
    if w.horizon_s is not None and w.arrival_times is None and w.users is None:
        exhausted = int((data[:, K.C_N_ARRIVED] >= w.num_requests).sum())
        if exhausted:
            import warnings

            warnings.warn(f"in {exhausted} replications all num_requests={w.num_requests} arrivals came "
                          f"before horizon_s={w.horizon_s}: arrivals stopped early; raise num_requests "
                          f"above about arrival_rate * horizon_s", RuntimeWarning, stacklevel=2)
    result = _make_result(scenario, data, None, confidence_level, entropy, backend, precision,
                          time.perf_counter() - start)
    if w.classes is not None:
        result.per_class = class_table(scenario, result.per_replication, entropy, backend)
        result.elapsed_s = time.perf_counter() - start
    return result


def served_requests(scenario: Scenario, requests: pd.DataFrame, seed, replication: int) -> dict:
    """Each request of ``requests`` (`sample_requests`'s frame) served by the
    scenario's fleet or disaggregated server as replication ``replication``
    of ``replicate(scenario, seed=seed)`` serves it: ``status`` (codes
    `kernel.layout.ST_*`; ``ST_PENDING``: arrived before a horizon and
    still in transit to its replica at it, not an arrival), ``first``
    (the client's first token), ``finish``, ``npre`` (preemptions),
    ``overhead`` (the run's TTFT overhead) and ``tpot_first`` (where TPOT
    starts: a disaggregated server's decode side; None: ``first``), and
    ``arrival`` (a closed loop's send times; None: the stream's)."""
    k0, k1, _ = _seed_keys(seed)
    if "sjf_key" not in requests and scenario.engine.sjf_key != "output":
        # (the keys `sample_requests` leaves out, as `simulate_requests` derives them)
        requests = requests.assign(sjf_key=_sjf_keys(scenario.engine, requests["prompt_len"].to_numpy(),
                                                     requests["output_len"].to_numpy()))
    arrival = None   # (the stream's own arrivals; a closed-loop fleet's are its sends)
    if _is_disagg(scenario):
        from ._disagg import simulate_disagg_requests

        pools = tuple(pack_scenario(s) for s in scenario.fleet.pool_scenarios(scenario))
        st, first, finish, npre, overhead, first_d = simulate_disagg_requests(scenario, pools, requests, k0, k1,
                                                                              replication)
    elif _is_autoscaled(scenario):
        from ._autoscale import served_autoscaled

        # (the replication's own stream, which ``requests`` is: `sample_requests` draws it)
        st, first, finish, npre, overhead = served_autoscaled(scenario, pack_scenario(scenario), k0, k1,
                                                              replication)
        first_d = None
    else:
        from ._fleet import simulate_fleet_requests

        st, first, finish, npre, overhead, arrival = simulate_fleet_requests(scenario, pack_scenario(scenario),
                                                                             requests, k0, k1, replication)
        first_d = None
    return dict(status=np.asarray(st, np.int64), first=first, finish=finish, npre=npre, overhead=overhead,
                tpot_first=first_d, arrival=arrival)


def _sjf_keys(engine, prompt, output):
    """Each request's SJF key where ``engine.sjf_key`` is not the output (and
    no predictor drew it): its prompt, or prompt and output, as
    `kernel.workload._draw_workload` takes them."""
    return prompt if engine.sjf_key == "prompt" else prompt + output


def _served_frame(scenario, requests, backend="numba", seed=None, replication=0) -> pd.DataFrame:
    """`served_requests` as the stability check reads `simulate_requests`' frame (a request still in transit
    at the horizon: unfinished)."""
    got = served_requests(scenario, requests, seed, replication)
    st = np.where(got["status"] == K.ST_PENDING, K.ST_UNFINISHED, got["status"])
    return pd.DataFrame({"status": _STATUS_NAMES[st - K.ST_COMPLETED], "finish_s": got["finish"]})


def _run_overhead(scenario: Scenario, seed, replication: int, backend: str) -> float:
    """The TTFT overhead replication ``replication`` of ``replicate(scenario,
    seed=seed)`` runs with (its per-run draw, as `simulate_requests` takes it)."""
    k0, k1, _ = _seed_keys(seed)
    if backend == "reference":
        from ._reference_noise import run_latency

        return float(run_latency(scenario.latency, k0, k1, replication)[0].ttft_overhead_s)
    packed = pack_scenario(scenario)
    return float(K.run_records(packed["lat"], packed["fpar"], k0, k1, replication)[1][K.F_TTFT_OVERHEAD])


def _is_autoscaled(scenario: Scenario) -> bool:
    return (scenario.fleet is not None and not _is_disagg(scenario)
            and getattr(scenario.fleet, "autoscaler", None) is not None)


def class_table(scenario: Scenario, per_replication: pd.DataFrame, seed, backend: str) -> pd.DataFrame:
    """Per-class rows of every replication in ``per_replication`` (its index):
    each replication's stream drawn again (`sample_requests`), simulated
    again as that replication ran (`simulate_requests` with its seed and
    index, the GPU's replications on the CPU kernel; a fleet's or a
    disaggregated server's by `served_requests`),
    labelled by the workload's classes and reduced per class over the run's
    window (`fastsim._classes.class_rows`)."""
    from ._classes import class_rows

    w = scenario.workload
    rows = []
    for rep in per_replication.index:
        req = sample_requests(scenario, seed=seed, replication=int(rep))
        labels = w.classes.label(req, w.request_trace)
        output = req["output_len"].to_numpy()
        tpot_first = None
        if scenario.fleet is None:
            # (the replication's own noise: the seed and index `replicate` ran it with)
            res = simulate_requests(scenario, req, backend="reference" if backend == "reference" else "numba",
                                    seed=seed, replication=int(rep))
            status = np.asarray(res["status"].cat.codes, dtype=np.int64)   # 0 completed ... (`_STATUS_NAMES`)
            # (the run's arrival times: a closed loop's are when each request was sent)
            arrival, first, finish, npre = (res[c].to_numpy() for c in ("arrival_s", "first_token_s", "finish_s",
                                                                         "num_preemptions"))
            overhead = _run_overhead(scenario, seed, int(rep), backend)
        else:   # (the fleet serves the stream, as that replication)
            got = served_requests(scenario, req, seed, int(rep))
            first, finish, npre, overhead, tpot_first = (got[k] for k in ("first", "finish", "npre", "overhead",
                                                                           "tpot_first"))
            status = got["status"] - K.ST_COMPLETED
            # (a closed loop's sends are the run's, not the stream's wanted times)
            arrival = req["arrival_s"].to_numpy() if got["arrival"] is None else got["arrival"]
            # (a request in transit to its replica at the horizon is not an arrival: the kernel's counts)
            keep = got["status"] != K.ST_PENDING
            if not keep.all():
                labels, arrival, output, status, first, finish, npre = (
                    x[keep] for x in (np.asarray(labels), arrival, output, status, first, finish, npre))
                tpot_first = None if tpot_first is None else tpot_first[keep]
        got = class_rows(labels, w.classes.order(labels), arrival, output, status, first, finish, npre,
                         w.warmup_requests, float(per_replication.at[rep, "window_s"]), overhead,
                         scenario.ttft_slo_s, scenario.tpot_slo_s, tpot_first)
        for r in got:
            r["replication"] = int(rep)
        rows.extend(got)
    frame = pd.DataFrame(rows)
    if not w.classes.is_band and len(frame):
        # a class absent from a replication: present in the table with no arrivals (throughput 0)
        every = sorted(set(frame["class"].tolist()), key=str)
        full = []
        for rep, part in frame.groupby("replication", sort=True):
            have = set(part["class"].tolist())
            full.append(part)
            miss = [c for c in every if c not in have]
            if miss:
                extra = class_rows(np.asarray(miss, dtype=object), miss, np.zeros(0), np.zeros(0, np.int64),
                                   np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, np.int64), 0,
                                   float(per_replication.at[rep, "window_s"]), 0.0, None, None)
                for r in extra:
                    r["replication"] = int(rep)
                full.append(pd.DataFrame(extra))
        frame = pd.concat(full, ignore_index=True)
        frame["_o"] = frame["class"].map({c: j for j, c in enumerate(every)})
        frame = frame.sort_values(["_o", "replication"], kind="stable").drop(columns="_o")
    return frame.reset_index(drop=True)


def _make_result(scenario, data, ids, confidence_level, seed, backend, precision, elapsed_s, interrupted=False):
    """A ReplicateResult from the kernel's rows (``ids``: their replication numbers, None for 0..n-1)."""
    # One frame from typed columns (14 astype assignments cost ~1 ms a call).
    columns = K.COLUMNS + _extra_columns(scenario)
    per_rep = pd.DataFrame({c: data[:, j].astype(np.int64) if c in _INT_COLUMNS else data[:, j]
                            for j, c in enumerate(columns)}, index=None if ids is None else pd.Index(ids))
    if ids is not None:
        per_rep = per_rep.sort_index()
    per_rep.index.name = "replication"
    return ReplicateResult(scenario=scenario, per_replication=per_rep, confidence_level=confidence_level,
                           seed=seed, backend=backend, precision=precision, elapsed_s=elapsed_s,
                           metrics=K.METRICS + _extra_columns(scenario),
                           interrupted=interrupted)


def _fleet_columns(scenario) -> tuple:
    """The columns a fleet adds: load balance, and an autoscaler's GPU-hours and SLO-violation minutes."""
    f = scenario.fleet
    if f is None:
        return ()
    return K.FLEET_COLUMNS + (K.AUTOSCALE_COLUMNS if f.autoscaler is not None else ())


def _relative_half_width(est, low, high) -> float:
    """Half-width of the mean's confidence interval [low, high] over |est|: 0
    when every value is the same, inf when the mean is 0 or the interval undefined."""
    hw = (high - low) / 2.0
    if hw == 0:
        return 0.0
    return float(hw / abs(est)) if est != 0 and np.isfinite(hw) else math.inf


def _relative_half_width_of(values, confidence_level) -> float:
    """:func:`_relative_half_width` of the mean of ``values``."""
    return _relative_half_width(*mean_interval(values, confidence_level)[:3])


def _replications_needed(data, precision, done, confidence_level):
    """Replications for each metric's relative half-width to reach its target."""
    need = done
    for metric, target in precision.items():
        x = data[:, K.COLUMNS.index(metric)]
        est, low, high, se, n = mean_interval(x, confidence_level)
        if n == 0:
            raise ValueError(f"precision metric {metric!r} is undefined (NaN) in every replication "
                             f"of this scenario, so no precision can be reached")
        if n >= 2 and se == 0:
            continue  # the same value in every replication: nothing to estimate
        if n < 2 or not np.isfinite(low):
            return max(need, 2 * done)
        rel = _relative_half_width(est, low, high)
        if rel > target:
            ratio = rel / target
            factor = ratio * ratio if np.isfinite(rel) else 4.0   # (inf, not an OverflowError, for a tiny target)
            need = max(need, int(math.ceil(min(done * factor * 1.05, MAX_COUNT))))
    return need


# Fewer requests than this are simulated in the calling thread, on 2 threads
# (measured crossover, 2 cores: about 8 ms of work on one); scaled down in
# proportion for more threads, where the pool saves more (not measured).
_POOL_MIN_REQUESTS = 20_000
#: Most requests in one kernel call (chunk): Ctrl-C waits for the running
#: chunks, 25-100 ms at 0.25-1 us a request (0.2 s for the slowest
#: workloads). At 25,000, one thread ran 1.8% slower than with the old
#: unbounded chunks (benchmarks/ab_interleaved.py --same-process, 7 rounds,
#: 4,000 x 1,000 requests); at 100,000 the median time ratio was 0.98, within
#: the machine's noise, and the results the same.
_CHUNK_MAX_REQUESTS = 100_000


def _run_threads(work, chunks, n_threads, stop, bar):
    """``work(chunk)`` for every chunk on ``n_threads`` threads, each taking
    the next chunk by a shared counter, until done or ``stop`` is set.

    The calling thread waits in `time.sleep`, holding no lock, so that an
    interrupt (KeyboardInterrupt, raised in it) cannot leave a lock held that
    the workers need: `concurrent.futures`' pool could deadlock so when
    Ctrl-C came while it queued many chunks. On an interrupt or a worker's
    error, the workers finish the chunk they are in and take no other."""
    next_chunk = itertools.count()
    done = [0] * n_threads       # chunks' replications each worker finished
    ended = [False] * n_threads
    errors = []

    def worker(w):
        try:
            while not stop.is_set():
                i = next(next_chunk)
                if i >= len(chunks):
                    return
                done[w] += work(chunks[i])
        except BaseException as exc:   # (re-raised by the calling thread)
            errors.append(exc)
            stop.set()
        finally:
            ended[w] = True

    workers = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(n_threads)]
    for t in workers:
        t.start()
    try:
        shown = 0
        while not all(ended):
            time.sleep(0.005)
            if bar is not None:
                total = sum(done)
                bar.update(total - shown)
                shown = total
        if bar is not None:
            bar.update(sum(done) - shown)
    finally:
        stop.set()
        for t in workers:
            t.join()
    if errors:
        raise errors[0]


def _run(scenario, packed, k0, k1, rep0, nrep, backend, n_threads, batch_size, progress):
    if scenario.fleet is not None:
        from ._fleet import ReplicationsInterrupted

        try:
            return _run_fleet(scenario, packed, k0, k1, rep0, nrep, n_threads)
        except ReplicationsInterrupted as stop:   # (the finished replications, as `replicate` keeps them)
            raise _ChunksInterrupted(rep0 + stop.done, stop.rows) from None
    return _run_one(scenario, packed, k0, k1, rep0, nrep, backend, n_threads, batch_size, progress)


def _run_fleet(scenario, packed, k0, k1, rep0, nrep, n_threads):
    """A fleet's, an autoscaled fleet's or a disaggregated server's rows (`check_runnable` refused the
    backends other than numba)."""
    if _is_disagg(scenario):
        from ._disagg import run_disagg

        pools = tuple(pack_scenario(s) for s in scenario.fleet.pool_scenarios(scenario))
        return run_disagg(scenario, packed, pools, k0, k1, rep0, nrep, _thread_count(n_threads))
    if scenario.fleet.autoscaler is not None:
        from ._autoscale import run_autoscaled
        return run_autoscaled(scenario, packed, k0, k1, rep0, nrep, _thread_count(n_threads))
    from ._fleet import run_fleet

    return run_fleet(scenario, packed, k0, k1, rep0, nrep, _thread_count(n_threads))


def _run_one(scenario, packed, k0, k1, rep0, nrep, backend, n_threads, batch_size, progress):
    out = np.empty((nrep, K.N_COLUMNS))
    if backend == "reference":
        from ._reference_metrics import run_reference_replications

        run_reference_replications(scenario, packed, k0, k1, rep0, out, progress=progress)
        return out
    if backend == "cuda":
        from ._cuda import run_replications_cuda

        return run_replications_cuda(packed, k0, k1, rep0, nrep, out, chunk=batch_size)
    total = nrep * scenario.workload.num_requests
    show = progress if progress is not None else total >= 5_000_000
    if batch_size is None:
        batch_size = max(1, -(-nrep // 20)) if show else nrep
    bar = None
    if show:
        from tqdm.auto import tqdm

        bar = tqdm(total=nrep, desc="replications", unit="rep", leave=False)
    # the common engine unless an option needs the full one; compiled (or loaded) here, once
    run_chunk = K.chunk_runner(K.scenario_arrays(packed), K.engine_variant(packed["ipar"]))
    threads = _thread_count(n_threads)
    # Buffers whose workspace growth is refused with a ValueError where it
    # cannot be reserved (a huge drawn output, `_memory.CheckedBuffers`):
    # one per concurrent call, so the runner never makes an unchecked one.
    from ._memory import CheckedBuffers

    for _ in range(max(1, min(threads, nrep))):
        run_chunk.pool.put(CheckedBuffers(scenario.workload.num_requests, scenario))
    # Chunks of at most batch_size replications: 4 per thread (balance:
    # replications differ in cost) when each has 50,000 requests or more,
    # else fewer, down to one per thread (a call costs ~0.05 ms more: Numba
    # unboxes the compiled entries' pointers). Each chunk writes its own rows.
    size = max(-(-nrep // (4 * threads)), min(-(-50_000 // scenario.workload.num_requests), -(-nrep // threads)))
    if total * threads < 2 * _POOL_MIN_REQUESTS:
        size = nrep   # a thread pool would cost more (~1 ms to start) than it saves
    # At most _CHUNK_MAX_REQUESTS requests a chunk, so that Ctrl-C is answered
    # within about one chunk's time (a chunk cannot be stopped midway).
    size = min(batch_size, max(1, size), max(1, _CHUNK_MAX_REQUESTS // scenario.workload.num_requests))
    chunks = [(lo, min(nrep, lo + size)) for lo in range(0, nrep, size)]
    finished = []   # chunks whose rows are written (list.append is atomic)
    stop = threading.Event()

    def work(chunk):
        if stop.is_set():
            return 0
        lo, hi = chunk
        if run_chunk(rep0 + lo, hi - lo, k0, k1, out[lo:hi]) != 0:
            raise RuntimeError("run_chunk: the common engine was asked for an option it lacks")
        finished.append(chunk)
        return hi - lo

    # The kernel releases the GIL (nogil), so Python threads run it in parallel.
    pooled = threads > 1 and len(chunks) > 1
    try:
        if pooled:
            _run_threads(work, chunks, threads, stop, bar)
        else:
            for chunk in chunks:
                m = work(chunk)
                if bar is not None:
                    bar.update(m)
    except KeyboardInterrupt:
        keep = sorted(finished)
        ids = np.concatenate([np.arange(rep0 + lo, rep0 + hi) for lo, hi in keep]) if keep else np.empty(0, np.int64)
        rows = np.concatenate([out[lo:hi] for lo, hi in keep]) if keep else np.empty((0, K.N_COLUMNS))
        raise _ChunksInterrupted(ids, rows) from None
    finally:
        if bar is not None:
            bar.close()
        _give_back_buffers(run_chunk.pool)
    return out


def _give_back_buffers(pool):
    """The workspaces of the runner's buffers handed on to a later run
    (`kernel.drivers.ChunkBuffers.give_back`): those in its pool, which no
    thread is using (a thread still running a chunk after an interruption
    holds its own)."""
    while True:
        try:
            buf = pool.get_nowait()
        except queue.Empty:
            return
        buf.give_back()
