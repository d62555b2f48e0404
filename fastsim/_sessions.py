"""Multi-turn sessions (``docs/engine-model.md``, "Sessions"): the session
law of a workload, the checks of a scenario that has one, and the kernel's
columns of `sample_requests`'s draws (`_replicate._simulate_sessions`
simulates them; `_reference_metrics.reference_sessions` on the reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._validation import MAX_CLOCK_S, check_choice, check_float

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
        object.__setattr__(self, "think_time_s", check_float("think_time_s", self.think_time_s, low=0,
                                                                        high=MAX_CLOCK_S))
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
    missing = [k for k in ("arrival_s", "think_s", "prompt_len", "output_len", "priority", "turns", "first_turn")
               if k not in requests]
    if missing:
        raise ValueError(f"requests must be sample_requests's frame of a workload of sessions: columns {missing} "
                         f"are missing")
    if requests["first_turn"].dtype != bool:
        raise ValueError(f"requests['first_turn'] must be booleans (whether the row starts a session), got dtype "
                         f"{requests['first_turn'].dtype}")
    a = np.asarray(requests["arrival_s"], dtype=np.float64)
    think = np.asarray(requests["think_s"], dtype=np.float64)
    p = np.asarray(requests["prompt_len"], dtype=np.int64)
    o = np.asarray(requests["output_len"], dtype=np.int64)
    c = np.asarray(requests["priority"], dtype=np.int64)
    turns = np.asarray(requests["turns"], dtype=np.int64)
    first = np.asarray(requests["first_turn"], dtype=bool)
    c_first = int(first.sum())
    if not np.all(np.isfinite(think[~first]) & (think[~first] >= 0)):   # (NaN hung the run; < 0 sent in the past)
        raise ValueError("requests['think_s'] must hold a finite think time >= 0 on every row that is not a first "
                         "turn (the think time before the send it makes)")
    af = a[first]
    if not (np.all(np.isfinite(af) & (af >= 0)) and np.all(np.diff(af) >= 0)):   # (a NaN arrival hung the run)
        raise ValueError("requests['arrival_s'] must hold finite arrival times >= 0, in order, on the first turns' "
                         "rows (first_turn True: the sessions' starts; the later turns' rows have none)")
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
