"""Multi-turn sessions (``docs/engine-model.md``, "Sessions"): the session
law of a workload, the checks of a scenario that has one, and one
replication's sessions simulated from Python (`sample_requests`'s draws in,
the turns sent out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._validation import check_choice, check_float

__all__ = ["Sessions"]


@dataclass(frozen=True)
class Sessions:
    """Multi-turn sessions: each turn's prompt is the conversation so far.

    A session has ``turns`` turns. Its first turn sends ``prompt_len`` new
    tokens (the workload's law); turn k + 1 is sent ``think_time_s`` after
    turn k left the system, with the prompt = turn k's prompt + its output +
    ``prompt_len`` new tokens, and ``output_len`` output tokens (the
    workload's laws, drawn per turn). With prefix caching by block hash
    (``EngineConfig(enable_prefix_caching=True, block_hash_caching=True)``)
    a turn hits the blocks the session's earlier turns left cached, as in
    vLLM (every full block of a turn, prompt or output, is block j of its
    conversation). A session ends after its last turn, or with a turn that
    does not complete (rejected, e.g. longer than ``max_model_len``, or
    dropped).

    Used as ``Workload(sessions=...)``: with ``arrival_rate``, sessions start
    as the workload's arrival process (Poisson by default); with
    ``max_concurrency``, that many users each run sessions back to back (a
    user starts a new session a think time after the last one ends).
    ``num_requests`` bounds the turns sent per replication.

    Parameters
    ----------
    turns : int or LengthDistribution
        Turns per session (>= 1).
    think_time_s : float
        The time (s, >= 0) a user takes between a reply and the next turn
        (the mean with ``think_time_dist="exponential"``).
    think_time_dist : {"fixed", "exponential"}
        Each think time ``think_time_s``, or independent exponential draws
        of that mean.
    """

    turns: object = 1
    think_time_s: float = 0.0
    think_time_dist: str = "fixed"

    def __post_init__(self):
        from ._distributions import as_length

        object.__setattr__(self, "turns", as_length("turns", self.turns))
        object.__setattr__(self, "think_time_s", check_float("think_time_s", self.think_time_s, low=0))
        check_choice("think_time_dist", self.think_time_dist, ("fixed", "exponential"))


def check_workload(w) -> None:
    """Refuse what a workload of sessions cannot have (`Workload.__post_init__`)."""
    if not isinstance(w.sessions, Sessions):
        raise ValueError(f"sessions must be None or a fastsim.Sessions, got {w.sessions!r}")
    for name, default in (("arrival_times", None), ("users", None), ("request_trace", None),
                          ("trace_window_s", None), ("lengths", None), ("warmup_requests", 0),
                          ("prefix_groups", 0), ("normalize_arrivals", False), ("classes", None),
                          ("think_time_s", 0.0), ("think_time_dist", "fixed")):
        value = getattr(w, name)
        if not (value is None if default is None else value == default):
            raise ValueError(f"{name} must be {default!r} with sessions (a session's turns are sent as its "
                             f"earlier turns finish; its think time is sessions.think_time_s), got "
                             f"{name}={value!r}")
    if (w.arrival_rate is None) == (w.max_concurrency is None):
        raise ValueError(f"sessions need exactly one of arrival_rate (sessions start as that arrival process) "
                         f"and max_concurrency (that many users running sessions back to back), got "
                         f"arrival_rate={w.arrival_rate!r}, max_concurrency={w.max_concurrency!r}")


def check_scenario(scenario) -> None:
    """Refuse the engine features sessions are not simulated with (`Scenario.__post_init__`)."""
    e = scenario.engine
    for name, bad, allowed in (
            ("async_scheduling", e.async_scheduling, "False"),
            ("policy", e.policy == "sjf", "'fcfs' or 'priority'"),
            ("preemption_mode", e.preemption_mode == "swap", "'recompute'"),
            ("priority_aging_s", e.priority_aging_s is not None, "None"),
            ("scheduler", e.scheduler == "static", "'continuous'"),
            ("length_predictor", e.length_predictor is not None, "None"),
            ("block_hash_caching", e.enable_prefix_caching and not e.block_hash_caching,
             "True with enable_prefix_caching (the prefix-group cache has one prefix per group)")):
        if bad:
            raise ValueError(f"engine.{name} must be {allowed} with workload.sessions, got "
                             f"{name}={getattr(e, name)!r}")
    if scenario.fleet is not None:
        raise ValueError(f"fleet must be None with workload.sessions (one replica), got {scenario.fleet!r}")


def stream_arrays(requests: pd.DataFrame):
    """The kernel's columns (`workload._draw_sessions`) of `sample_requests`'s
    frame of a workload of sessions."""
    a = np.asarray(requests["arrival_s"], dtype=np.float64)
    think = np.asarray(requests["think_s"], dtype=np.float64)
    p = np.asarray(requests["prompt_len"], dtype=np.int64)
    o = np.asarray(requests["output_len"], dtype=np.int64)
    c = np.asarray(requests["priority"], dtype=np.int64)
    turns = np.asarray(requests["turns"], dtype=np.int64)
    first = np.asarray(requests["first_turn"], dtype=bool)
    c_first = int(first.sum())
    if not first[:c_first].all() or np.any(turns < 1) or np.any(p < 1) or np.any(o < 1):
        raise ValueError("requests must be sample_requests's frame of a workload of sessions (first turns "
                         "first; turns, prompt_len and output_len >= 1)")
    idx = np.arange(a.size)
    arrival = np.where(first, a, think)
    pgrp = np.where(first, idx, -turns)
    sjfk = np.where(first, turns - 1, o)
    plen = np.where(first, p + o, 0)
    return arrival, p, o, c, sjfk, pgrp, plen


def sample_frame(a, p, o, c, q, grp, plen) -> pd.DataFrame:
    """`sample_requests`'s frame of a workload of sessions, from the kernel's draw."""
    first = grp >= 0
    return pd.DataFrame({
        "arrival_s": np.where(first, a, np.nan),   # a first turn's start; the others: when it is made
        "prompt_len": p,          # the turn's new tokens (a first turn: its prompt)
        "output_len": o,
        "priority": c,
        "think_s": np.where(first, np.nan, a),    # the think time before the send this row makes
        "turns": np.where(first, q + 1, -grp),    # the turns of the session its send starts
        "first_turn": first,
    })


def reference_sessions(scenario, latency, step_noise, arrival, p, o, c, sjfk, pgrp) -> dict:
    """`simulate_reference` of the kernel's columns of a workload of sessions
    (`workload._draw_sessions`), on the run's ``latency`` and ``step_noise``."""
    from ._reference import simulate_reference

    first = pgrp >= 0
    a0 = np.where(first, arrival, np.inf)
    with np.errstate(invalid="ignore"):   # (inf - inf in the check that arrivals do not decrease)
        res = simulate_reference(a0, p, o, c, scenario.engine, latency, horizon_s=scenario.workload.horizon_s,
                                  step_noise=step_noise, sessions=dict(
                                      users=scenario.workload.max_concurrency is not None, first=int(first.sum()),
                                      think=arrival, turns=np.where(first, sjfk + 1, -pgrp)))
    # the turns sent (the first ones: a send is made before any later one arrives)
    m = int((res["status"] != -1).sum())
    return {k: (v[:m] if isinstance(v, (np.ndarray, list)) and len(v) == arrival.size else v)
            for k, v in res.items()}


def simulate(scenario, requests: pd.DataFrame, backend: str, k0, k1, replication: int) -> dict:
    """One replication's sessions (`simulate_requests`): the turns sent, in
    arrival order, with their final prompts, sessions and results."""
    from . import kernel as K
    from ._replicate import pack_scenario

    arrival, p, o, c, sjfk, pgrp, plen = stream_arrays(requests)
    if backend == "reference":
        from ._reference_noise import run_latency

        run, steps = run_latency(scenario.latency, k0, k1, replication)
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
