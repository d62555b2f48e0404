"""Scenario configuration: the server (`EngineConfig`), the load (`Workload`)
and both together with the latency model and SLOs (`Scenario`).

All validation happens here, when an object is built, so that a bad value
fails before any kernel runs, with a message that names it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._distributions import (Empirical, Exponential, Fixed, Gamma, Geometric, Histogram, LengthDistribution,
                             LengthTrace, LogNormal, Mixture, Truncated, Uniform, _ArrivalSpec, as_length)
from ._latency import LatencyModel
from ._validation import (MAX_CLOCK_S, MAX_COUNT, MAX_TOKENS, check_arrival_times, check_bool, check_choice,
                          check_float, check_int, check_probabilities)

POLICIES = ("fcfs", "priority", "sjf")
#: `EngineConfig`'s vLLM V1 switches whose ``None`` means vLLM 0.22's default.
_VLLM_SWITCHES = ("enable_prefix_caching", "block_hash_caching", "scheduler_reserve_full_isl", "async_scheduling")
#: vLLM V1's four rules off (`EngineConfig.synchronous`).
SYNCHRONOUS_RULES = {"async_scheduling": False, "scheduler_reserve_full_isl": False, "null_block": False,
                     "enable_prefix_caching": False}
SJF_KEYS = ("output", "prompt", "total")
#: Largest block_size (vLLM's are 1-256; the kernel's workspace holds a
#: histogram of this many entries).
MAX_BLOCK_SIZE = 65536
#: Largest prefix_groups and users: tables of one entry per group, and a
#: request buffer of (users x per-user cap) entries.
MAX_GROUPS = 2 ** 24
MAX_USERS = 2 ** 24
SCHEDULERS = ("continuous", "static")
ADMISSIONS = ("none", "queue_limit", "kv_reservation")


@dataclass(frozen=True)
class LogNormalPredictor:
    """An output-length predictor with a lognormal error, for ``policy="sjf"``.

    The SJF key of request ``i`` (the length the scheduler believes it has)
    is ``ceil(O_i * exp(sigma * Z_i))`` with ``O_i`` its true output length
    and ``Z_i`` standard normal, drawn per replication from a random stream
    of its own (so the rest of the request stream does not change).
    ``sigma=0`` gives the true lengths.

    Parameters
    ----------
    sigma : float
        Standard deviation of ``log(predicted / true)`` (before rounding up), >= 0.
    """

    sigma: float = 0.5

    def __post_init__(self):
        object.__setattr__(self, "sigma", check_float("LogNormalPredictor.sigma", self.sigma, low=0))


@dataclass(frozen=True)
class BucketPredictor:
    """A length-bucket classifier, for ``policy="sjf"``.

    The output lengths are split into buckets ``[1, e_1), [e_1, e_2), ...,
    [e_{B-1}, inf)`` by ``edges = (e_1, ..., e_{B-1})``. The classifier
    names the request's true bucket with probability ``accuracy``, else one
    of the ``B - 1`` other buckets uniformly at random (drawn per
    replication from a random stream of its own); the SJF key is the lower
    edge of the named bucket (1 for the first).

    Parameters
    ----------
    edges : sequence of int
        Strictly increasing bucket edges, each >= 2.
    accuracy : float
        Probability of naming the right bucket, in [0, 1].
    """

    edges: tuple = (64, 256)
    accuracy: float = 0.8

    def __post_init__(self):
        e = np.asarray(self.edges)
        if (e.ndim != 1 or e.size == 0 or e.dtype.kind not in "iu" or np.any(e < 2)
                or np.any(np.diff(e) <= 0)):
            raise ValueError(f"BucketPredictor.edges must be a non-empty, strictly increasing sequence of "
                             f"integers >= 2, got {self.edges!r}")
        object.__setattr__(self, "edges", tuple(int(x) for x in e))
        object.__setattr__(self, "accuracy", check_float("BucketPredictor.accuracy", self.accuracy,
                                                         low=0, high=1))


@dataclass(frozen=True)
class EngineConfig:
    """One vLLM-like server (vLLM's parameter names).

    Parameters
    ----------
    max_num_seqs : int
        Most requests running (in the batch) at once.
    max_num_batched_tokens : int
        Token budget of one step (prefill chunks plus one token per decode).
    block_size : int
        Tokens per KV-cache block (1 to 65536).
    num_gpu_blocks : int
        KV-cache blocks on the GPU (fewer than 2**40 tokens in all). The
        default, 6822, is what vLLM 0.22 reported for Qwen2.5-1.5B on an A10G
        at ``gpu_memory_utilization=0.3``.
    enable_chunked_prefill : bool
        Split prompts into chunks that fit the step's remaining budget.
    policy : {"fcfs", "priority", "sjf"}
        Waiting-queue order and preemption victim choice.
    scheduler : {"continuous", "static"}
        Continuous (iteration-level) batching, or the static batching baseline.
    admission : {"none", "queue_limit", "kv_reservation"}
        Admission control at arrival (see ``docs/engine-model.md``).
    max_waiting : int, optional
        With ``admission="queue_limit"``: waiting places beyond ``max_num_seqs``
        (0 gives a loss system).
    max_queue_delay_s : float, optional
        A request still waiting (never scheduled) this long after its arrival
        abandons.
    max_model_len : int, optional
        Longest prompt + output a request may have; longer ones are rejected.
    preemption_mode : {"recompute", "swap"}
        How a preempted request gives up its KV blocks: dropped and recomputed
        later (vLLM V1), or moved to a CPU swap space and resumed before any
        new prefill (vLLM V0; falls back to recompute when the swap space is
        full). Transfers cost ``LatencyModel.swap_s_per_block``.
    swap_space_blocks : int
        CPU swap space in KV blocks (only with ``preemption_mode="swap"``).
    priority_preemption : bool
        With ``policy="priority"`` or ``"sjf"``: preempt a running, strictly
        less urgent request as soon as the head of the waiting queue cannot
        be scheduled (no seat or no KV blocks), not only when KV runs out.
    priority_aging_s : float, optional
        Aging for ``policy="priority"`` or ``"sjf"``: every this-many seconds
        since its arrival make a request one priority class (sjf: one token
        of predicted length) more urgent.
    enable_prefix_caching : bool, optional
        vLLM's automatic prefix caching: full KV blocks are identified by the
        hash of their tokens and of the blocks before them, so requests that
        share a prefix share its blocks, a recomputed request finds its own
        cached blocks, and freed blocks stay cached until evicted (LRU).
        ``None`` (the default): on, as in vLLM 0.22, unless the engine cannot
        have it (``scheduler="static"`` or ``preemption_mode="swap"``).
    length_predictor : LogNormalPredictor or BucketPredictor, optional
        With ``policy="sjf"``: order by predicted output lengths (the SJF
        keys ``q_i``) instead of the true ones (``None``).
    async_scheduling : bool, optional
        vLLM V1's asynchronous scheduling (a batch queue of 2): step ``k+1``
        is scheduled when step ``k`` starts, so it sees arrivals, tokens and
        freed blocks one step late, and a request whose in-flight token is
        its last is not scheduled again. ``False``: the synchronous loop
        (which the exact queueing-theory checks need). ``None`` (the
        default): on, as in vLLM 0.22, unless the engine needs the
        synchronous loop (``scheduler="static"``, ``preemption_mode="swap"``,
        ``priority_preemption=True``, or the prefix-group cache
        ``block_hash_caching=False``).
    scheduler_reserve_full_isl : bool, optional
        vLLM's full-input admission gate: a waiting request is admitted only
        if the blocks for its whole known sequence (prompt plus the tokens
        generated so far, less its cached blocks) are free, not only those of
        its first chunk. ``None`` (the default): on, as in vLLM 0.22, unless
        ``scheduler="static"``.
    null_block : bool
        vLLM reserves one KV block (block 0, the null block): ``True`` (the
        default, as vLLM) makes ``num_gpu_blocks`` the count vLLM reports,
        with ``num_gpu_blocks - 1`` usable; ``False``: all ``num_gpu_blocks``
        are usable.
    block_hash_caching : bool, optional
        With ``enable_prefix_caching``: ``True`` (what ``None``, the default,
        means) is vLLM's cache by block hash above. ``False`` is fastsim's
        prefix-group approximation: only a prefix group's shared prefix is
        cached (one entry per group), and a recomputed request does not find
        its own blocks. It is much faster when prefixes are shared (see
        ``docs/performance.md``) but is not what vLLM does.
    sjf_key : {"output", "prompt", "total"}
        With ``policy="sjf"``: the length the SJF key is (or, with a
        ``length_predictor``, predicts): the output, the prompt, or both.

    Notes
    -----
    See ``docs/engine-model.md`` for the exact semantics of every option.
    The defaults are vLLM 0.22's serving defaults (its V1 engine:
    ``async_scheduling``, ``scheduler_reserve_full_isl``, ``null_block`` and
    ``enable_prefix_caching`` by block hash on). A switch left at ``None`` is
    resolved when the object is built, to vLLM's default where this engine
    supports it, else off; :meth:`replace` resolves it again for the new
    engine, where ``dataclasses.replace`` would keep the resolved value.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_gpu_blocks: int = 6822
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    scheduler: str = "continuous"
    admission: str = "none"
    max_waiting: int | None = None
    max_queue_delay_s: float | None = None
    max_model_len: int | None = None
    preemption_mode: str = "recompute"
    swap_space_blocks: int = 0
    priority_preemption: bool = False
    priority_aging_s: float | None = None
    enable_prefix_caching: bool | None = None
    length_predictor: LogNormalPredictor | BucketPredictor | None = None
    async_scheduling: bool | None = None
    scheduler_reserve_full_isl: bool | None = None
    null_block: bool = True
    block_hash_caching: bool | None = None
    sjf_key: str = "output"
    #: The switches that were ``None`` and took vLLM's default (`replace`).
    defaulted: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self):
        s = object.__setattr__
        for name, high in (("max_num_seqs", MAX_COUNT), ("max_num_batched_tokens", MAX_TOKENS),
                           ("block_size", MAX_BLOCK_SIZE), ("num_gpu_blocks", MAX_TOKENS)):
            s(self, name, check_int(name, getattr(self, name), low=1, high=high))
        if self.num_gpu_blocks * self.block_size >= MAX_TOKENS:
            raise ValueError(f"num_gpu_blocks * block_size (the KV cache in tokens) must be < 2**40, got "
                             f"{self.num_gpu_blocks} * {self.block_size} = {self.num_gpu_blocks * self.block_size}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses this too; a static batch could starve forever.
            raise ValueError(f"max_num_batched_tokens must be >= max_num_seqs ({self.max_num_seqs}), "
                             f"got {self.max_num_batched_tokens}")
        s(self, "enable_chunked_prefill", check_bool("enable_chunked_prefill", self.enable_chunked_prefill))
        check_choice("policy", self.policy, POLICIES)
        check_choice("sjf_key", self.sjf_key, SJF_KEYS)
        if self.sjf_key != "output" and self.policy != "sjf":
            raise ValueError(f"sjf_key requires policy='sjf' (the SJF keys are only used there), got "
                             f"sjf_key={self.sjf_key!r} with policy={self.policy!r}")
        check_choice("scheduler", self.scheduler, SCHEDULERS)
        check_choice("admission", self.admission, ADMISSIONS)
        s(self, "max_waiting", check_int("max_waiting", self.max_waiting, low=0, high=MAX_COUNT, optional=True))
        if self.admission == "queue_limit" and self.max_waiting is None:
            raise ValueError("max_waiting must be an integer >= 0 when admission='queue_limit', got None")
        if self.admission != "queue_limit" and self.max_waiting is not None:
            raise ValueError(f"max_waiting is only used with admission='queue_limit', "
                             f"got max_waiting={self.max_waiting} with admission={self.admission!r}")
        s(self, "max_queue_delay_s", check_float("max_queue_delay_s", self.max_queue_delay_s,
                                                 low=0, low_open=True, optional=True))
        s(self, "max_model_len", check_int("max_model_len", self.max_model_len, low=2, high=MAX_TOKENS,
                                           optional=True))
        self._resolve_vllm_defaults()
        self._check_scheduler_features()
        self._check_v1_rules()

    def _resolve_vllm_defaults(self):
        """Give each V1 switch left at ``None`` vLLM 0.22's default where this
        engine supports it, else ``False`` (as vLLM turns off what a
        configuration cannot have)."""
        s = object.__setattr__
        for name in _VLLM_SWITCHES:
            value = getattr(self, name)
            if value is not None:
                s(self, name, check_bool(name, value))
        static = self.scheduler == "static"
        swap = self.preemption_mode == "swap"
        defaulted = []

        def default(name, supported):
            if getattr(self, name) is None:
                s(self, name, bool(supported))
                defaulted.append(name)

        default("enable_prefix_caching", not (static or swap))
        default("block_hash_caching", self.enable_prefix_caching)
        default("scheduler_reserve_full_isl", not static)
        group_cache = self.enable_prefix_caching and not self.block_hash_caching
        default("async_scheduling", not (static or swap or self.priority_preemption is True or group_cache))
        s(self, "defaulted", tuple(defaulted))

    @classmethod
    def synchronous(cls, **kwargs) -> "EngineConfig":
        """The engine with vLLM V1's four rules off: the synchronous loop, no
        admission gate, no null block, no prefix caching (the model of the
        exact queueing-theory checks and of ``fastsim.analytical``).

        Parameters
        ----------
        **kwargs
            Any other `EngineConfig` field (a V1 switch given here wins).

        Returns
        -------
        EngineConfig
        """
        return cls(**{**SYNCHRONOUS_RULES, **kwargs})

    def replace(self, **changes) -> "EngineConfig":
        """A copy with some fields changed; the switches that took vLLM's
        default (``None``) take it again for the new engine.

        Parameters
        ----------
        **changes
            Fields and their new values, as for ``dataclasses.replace``.

        Returns
        -------
        EngineConfig
        """
        for name in self.defaulted:
            changes.setdefault(name, None)
        return dataclasses.replace(self, **changes)

    def _check_v1_rules(self):
        """vLLM V1's rules (``docs/engine-model.md``, "vLLM V1 rules"): booleans, and
        only where they have defined semantics."""
        s = object.__setattr__
        s(self, "null_block", check_bool("null_block", self.null_block))
        if self.null_block and self.num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 with null_block=True (one block is the null "
                             f"block), got num_gpu_blocks={self.num_gpu_blocks}")
        if self.block_hash_caching and not self.enable_prefix_caching:
            raise ValueError("block_hash_caching=True requires enable_prefix_caching=True, got "
                             "enable_prefix_caching=False")
        if self.scheduler == "static":
            for name in ("async_scheduling", "scheduler_reserve_full_isl"):
                if getattr(self, name):
                    raise ValueError(f"{name}=True requires scheduler='continuous' (a vLLM V1 rule), got "
                                     f"scheduler='static'")
        if self.async_scheduling:
            # vLLM V1 has neither; their interplay with the batch queue is not modelled.
            for name, on in (("preemption_mode", self.preemption_mode == "swap"),
                             ("priority_preemption", self.priority_preemption)):
                if on:
                    raise ValueError(f"async_scheduling=True cannot be combined with "
                                     f"{name}={getattr(self, name)!r} (not modelled); use "
                                     f"async_scheduling=False")

    def _check_scheduler_features(self):
        """Swap preemption, active priority preemption, aging and prefix caching
        (``docs/engine-model.md``, "Option combinations")."""
        s = object.__setattr__
        check_choice("preemption_mode", self.preemption_mode, ("recompute", "swap"))
        s(self, "swap_space_blocks", check_int("swap_space_blocks", self.swap_space_blocks, low=0,
                                               high=MAX_TOKENS))
        s(self, "priority_preemption", check_bool("priority_preemption", self.priority_preemption))
        s(self, "priority_aging_s", check_float("priority_aging_s", self.priority_aging_s,
                                                low=0, low_open=True, optional=True))
        lp = self.length_predictor
        if lp is not None:
            if not isinstance(lp, (LogNormalPredictor, BucketPredictor)):
                raise ValueError(f"length_predictor must be None, a fastsim.LogNormalPredictor or a "
                                 f"fastsim.BucketPredictor, got {lp!r}")
            if self.policy != "sjf":
                raise ValueError(f"length_predictor requires policy='sjf' (the SJF keys are only used "
                                 f"there), got length_predictor={lp!r} with policy={self.policy!r}")
        swap = self.preemption_mode == "swap"
        if not swap and self.swap_space_blocks != 0:
            raise ValueError(f"swap_space_blocks is only used with preemption_mode='swap', got "
                             f"swap_space_blocks={self.swap_space_blocks} with preemption_mode='recompute'")
        if self.policy == "fcfs":
            for name in ("priority_preemption", "priority_aging_s"):
                value = getattr(self, name)
                if value not in (False, None):
                    raise ValueError(f"{name} requires policy='priority' or 'sjf', got {name}={value!r} "
                                     f"with policy='fcfs'")
        if self.scheduler == "static":
            for name, on in (("preemption_mode", swap), ("priority_preemption", self.priority_preemption),
                             ("enable_prefix_caching", self.enable_prefix_caching)):
                if on:
                    raise ValueError(f"{name}={getattr(self, name)!r} requires scheduler='continuous' "
                                     f"(static batching never preempts or shares blocks), got "
                                     f"scheduler='static'")
        if swap:
            for name in ("priority_preemption", "enable_prefix_caching"):
                if getattr(self, name):
                    raise ValueError(f"preemption_mode='swap' cannot be combined with {name}=True "
                                     f"(not modelled); use preemption_mode='recompute' or {name}=False")

    @property
    def usable_gpu_blocks(self) -> int:
        """The blocks requests can hold: ``num_gpu_blocks`` less the null block."""
        return self.num_gpu_blocks - int(self.null_block)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.usable_gpu_blocks * self.block_size


@dataclass(frozen=True, eq=False)
class Workload:
    """The requests that reach the server.

    Parameters
    ----------
    arrival_rate : float, optional
        Mean arrivals per second (> 0); 1.0 when left out, except with
        ``max_concurrency`` (a pure closed loop then). Not used with
        ``arrival_times``.
    num_requests : int
        Arrivals per replication (each run is a benchmark of this many
        requests).
    prompt_len, output_len : int or LengthDistribution
        Token lengths; an int means every request has that length.
    lengths : LengthTrace, optional
        Paired (prompt, output) rows instead of ``prompt_len``/``output_len``
        (which must then keep their defaults).
    burstiness : float
        Gamma inter-arrival shape, as ``vllm bench serve --burstiness``: 1 is
        Poisson, < 1 burstier, > 1 more regular (the gaps' squared coefficient
        of variation is ``1 / burstiness``). Renewal arrivals only (not with
        ``arrival_times`` or a multi-user workload).
    arrival_times : array_like, optional
        Given arrival timestamps (seconds, non-decreasing, >= 0), the same in
        every replication. They are measured from the start of the run, which
        is where the throughput window starts (without warm-up): shift a
        trace that starts late (a first arrival at or after 1e6 s, such as
        an epoch timestamp, draws a warning).
    priorities, priority_probs : sequence
        Priority classes (integers; lower is served first by ``policy="priority"``)
        and their probabilities.
    warmup_requests : int
        The first this-many requests are simulated but excluded from the
        statistics.
    horizon_s : float, optional
        Stop each run at this time; requests still in the system are
        counted as unfinished. Arrivals after it do not happen, and at most
        ``num_requests`` arrive (``replicate`` warns if that cap binds before
        the horizon). Throughputs and time averages then use the window up
        to ``horizon_s``.
    normalize_arrivals : bool
        Generate arrival times as ``vllm bench serve`` does: draw
        ``num_requests`` gaps, sum them and rescale so that the last request
        arrives at exactly ``num_requests / arrival_rate`` (the first arrives
        after one scaled gap). By default the first request arrives at time
        0 and the gaps are not rescaled.
    users, requests_per_user, user_rate : optional
        A multi-user arrival process (open: users do not wait for replies) instead of a renewal
        process; build it with :meth:`multi_user`. ``users`` is the number of
        users (an int, or an inclusive ``(low, high)`` range drawn uniformly
        per replication); each user sends a Poisson(``requests_per_user``)
        number of requests separated by exponential gaps of rate
        ``user_rate`` (1/s), the first one gap after time 0; the users'
        streams are merged. ``num_requests`` is then the per-replication
        buffer: ``users_high * m`` where ``m`` is the Poisson quantile of
        probability ``1 - 1e-15`` (a user's count is truncated there).
    prefix_groups : int
        Number of prefix groups (shared system prompts or conversations;
        ``docs/engine-model.md``, "Requests"); 0 (the default): none. With
        groups, every request belongs to group ``g`` in ``0 .. G-1`` with
        probability proportional to ``(g + 1) ** -prefix_popularity`` (Zipf),
        and its prompt starts with ``min(L, prompt_len - 1)`` tokens of the
        group's shared prefix, ``L`` drawn from ``prefix_len``. Used by
        ``EngineConfig(enable_prefix_caching=True)``.
    prefix_len : int or LengthDistribution, optional
        Length of the shared prefix at the start of a grouped request's
        prompt (required with ``prefix_groups``).
    prefix_popularity : float
        Zipf exponent of the group popularity (>= 0; 0: uniform).
    request_trace : RequestTrace, optional
        Recorded requests replayed as they are (build it with
        :meth:`from_trace`): their arrival times and lengths (then
        ``arrival_times`` and ``lengths``), and their block identities
        (``request_trace.blocks(row)``; ``sample_requests`` gives them).
    classes : RequestClasses, "priority", "trace" or (by, edges), optional
        The request classes that ``replicate(...).summary(by="class")``
        reports apart: length bands (``("prompt_len", [64, 256])``; also
        ``"output_len"``, ``"total_len"``), the priority class, or a trace
        column. With ``RequestClasses(..., priorities=...)`` each length band
        has its own priority (``priorities`` must then keep its default).
    trace_window_s : float, optional
        With ``request_trace``: replay, in each replication, the requests of
        a window of this many seconds whose start is drawn uniformly (from
        0 to the last arrival less the window), so that replications differ
        while keeping the trace's burstiness; ``num_requests`` is then the
        most requests any window holds.
    max_concurrency : int, optional
        Closed-loop load (``docs/engine-model.md``, "Closed-loop load"), as
        ``vllm bench serve --max-concurrency``: at most this many requests
        are in the system. Alone (``arrival_rate=None``, its default here) it
        is a closed loop of that many clients, each sending its next request
        when its last one leaves the system (completed, rejected or
        dropped), ``num_requests`` in all; with ``arrival_rate`` it caps the
        open-loop stream, a request beyond the cap waiting client-side (not
        counted in its latencies) until one leaves. Not with
        ``arrival_times``, ``users``, ``request_trace``, ``warmup_requests``
        or ``horizon_s``.
    think_time_s : float
        Closed loop without ``arrival_rate``: the time (s, >= 0) a client
        waits between a reply and its next request (its mean with
        ``think_time_dist="exponential"``).
    think_time_dist : {"fixed", "exponential"}
        The law of the think times: each ``think_time_s``, or independent
        exponential draws of that mean, one per departure.
    rate_schedule : RateSchedule, optional
        A time-varying arrival rate (`fastsim.RateSchedule`: piecewise
        constant or linear, optionally repeating) instead of
        ``arrival_rate`` (which must then be left out): arrivals are a
        Poisson process of that rate, ``num_requests`` at most, before
        ``horizon_s`` when given (``docs/engine-model.md``, "Time-varying
        arrival rate").
    sessions : Sessions, optional
        Multi-turn sessions (``docs/engine-model.md``, "Sessions"): each
        turn's prompt is the conversation so far plus ``prompt_len`` new
        tokens. Sessions start as the arrival process of ``arrival_rate``
        (with ``burstiness``), or ``max_concurrency`` users run them back to
        back; ``num_requests`` bounds the turns sent.
    """

    arrival_rate: float | None = None
    num_requests: int = 1000
    prompt_len: object = 256
    output_len: object = 128
    lengths: LengthTrace | None = None
    burstiness: float = 1.0
    arrival_times: np.ndarray | None = None
    priorities: tuple = (0,)
    priority_probs: tuple = (1.0,)
    warmup_requests: int = 0
    horizon_s: float | None = None
    normalize_arrivals: bool = False
    users: object = None
    requests_per_user: float | None = None
    user_rate: float | None = None
    prefix_groups: int = 0
    prefix_len: object = None
    prefix_popularity: float = 0.0
    request_trace: object = None
    trace_window_s: float | None = None
    classes: object = None
    max_concurrency: int | None = None
    think_time_s: float = 0.0
    think_time_dist: str = "fixed"
    rate_schedule: object = None
    sessions: object = None

    def __post_init__(self):
        s = object.__setattr__
        if self.sessions is not None:
            from ._sessions import check_workload

            check_workload(self)
        closed = self._check_closed_loop()
        self._check_rate_schedule()
        if (self.arrival_rate is None and not closed and self.arrival_times is None and self.users is None
                and self.request_trace is None and self.trace_window_s is None and self.rate_schedule is None):
            s(self, "arrival_rate", 1.0)   # the default of an open-loop stream
        self._check_prefix_groups()
        self._check_classes()
        if self.request_trace is not None or self.trace_window_s is not None:
            self._check_request_trace()
        if self.users is not None:
            self._check_multi_user()
        elif self.requests_per_user is not None or self.user_rate is not None:
            raise ValueError("requests_per_user and user_rate need users (use Workload.multi_user), "
                             f"got users=None, requests_per_user={self.requests_per_user!r}, "
                             f"user_rate={self.user_rate!r}")
        if self.arrival_times is not None:
            t = check_arrival_times("arrival_times", self.arrival_times, stacklevel=4)
            s(self, "arrival_times", t)
            if self.arrival_rate is not None and self.arrival_rate != 1.0:
                raise ValueError(f"arrival_rate must be None when arrival_times is given, "
                                 f"got {self.arrival_rate!r}")
            s(self, "arrival_rate", None)
            if self.num_requests not in (1000, t.size):
                raise ValueError(f"num_requests must equal len(arrival_times) = {t.size}, "
                                 f"got {self.num_requests!r}")
            s(self, "num_requests", int(t.size))
        elif (self.users is None and self.trace_window_s is None and self.rate_schedule is None
              and not (closed and self.arrival_rate is None)):
            s(self, "arrival_rate", check_float("arrival_rate", self.arrival_rate, low=0, low_open=True))
        s(self, "num_requests", check_int("num_requests", self.num_requests, low=1, high=MAX_COUNT))
        rs = self.rate_schedule
        if rs is not None and self.horizon_s is None:
            # (as arrival_rate's bound: a rate of 1e-20 gave TPOTs of 0) the arrivals that would come after the
            # clock's range; a schedule that stops (its last rate 0) just ends the stream early
            expected = float(rs.cumulative(MAX_CLOCK_S))
            ever = np.inf if rs.repeat or rs.rates[-1] > 0 else float(rs.cumulative(rs.times[-1]))
            if not (expected >= self.num_requests or ever <= expected):
                raise ValueError(f"rate_schedule's rates bring {expected:.3g} arrivals expected in {MAX_CLOCK_S:g} s, "
                                 f"fewer than num_requests ({self.num_requests}); arrivals spread over at most "
                                 f"{MAX_CLOCK_S:g} s (the clock's resolution): raise the rates or set horizon_s, got "
                                 f"rates={self.rate_schedule.rates.tolist()!r}")
        if self.arrival_rate is not None and self.num_requests / self.arrival_rate > MAX_CLOCK_S:
            # (1e-320: gaps of inf s; any rate this low: a clock too coarse for the steps)
            raise ValueError(f"arrival_rate must be >= num_requests / {MAX_CLOCK_S:g} s = "
                             f"{self.num_requests / MAX_CLOCK_S:.3g} req/s (arrivals spread over at most "
                             f"{MAX_CLOCK_S:g} s, where the clock's double keeps sub-millisecond resolution), "
                             f"got {self.arrival_rate!r}")
        s(self, "burstiness", check_float("burstiness", self.burstiness, low=0, low_open=True))
        if self.lengths is not None:
            if not isinstance(self.lengths, LengthTrace):
                raise ValueError(f"lengths must be a LengthTrace or None, got {self.lengths!r}")
            for name, default in (("prompt_len", 256), ("output_len", 128)):
                value = getattr(self, name)       # (Fixed(default) after Scenario.replace)
                if not (isinstance(value, (int, np.integer)) and value == default
                        or isinstance(value, Fixed) and value.value == default):
                    raise ValueError(f"{name} must be left at its default ({default}) when lengths gives the "
                                     f"(prompt, output) pairs, got {value!r}")
        else:
            s(self, "prompt_len", as_length("prompt_len", self.prompt_len))
            s(self, "output_len", as_length("output_len", self.output_len))
        pri = np.asarray(self.priorities)
        if (pri.ndim != 1 or pri.size == 0 or pri.dtype.kind not in "iu"
                or np.any(pri > MAX_COUNT) or np.any(pri < -MAX_COUNT)):
            raise ValueError(f"priorities must be a non-empty sequence of integers in [-2**62, 2**62], "
                             f"got {self.priorities!r}")
        s(self, "priorities", tuple(int(p) for p in pri))
        s(self, "priority_probs", tuple(check_probabilities("priority_probs", self.priority_probs, pri.size)))
        s(self, "warmup_requests", check_int("warmup_requests", self.warmup_requests,
                                             low=0, high=self.num_requests - 1))
        s(self, "horizon_s", check_float("horizon_s", self.horizon_s, low=0, low_open=True, optional=True))
        s(self, "normalize_arrivals", check_bool("normalize_arrivals", self.normalize_arrivals))
        if self.normalize_arrivals and self.arrival_times is not None:
            raise ValueError("normalize_arrivals must be False when arrival_times is given, got True")
        if self.burstiness != 1.0 and self.arrival_times is not None:
            raise ValueError(f"burstiness must be 1.0 (its default) when arrival_times is given, "
                             f"got {self.burstiness!r}")

    def _check_rate_schedule(self) -> None:
        """A rate schedule replaces ``arrival_rate`` in an open-loop Poisson stream."""
        if self.rate_schedule is None:
            return
        from ._rate_schedule import RateSchedule
        if not isinstance(self.rate_schedule, RateSchedule):
            raise ValueError(f"rate_schedule must be None or a fastsim.RateSchedule, got {self.rate_schedule!r}")
        for name, default in (("arrival_rate", None), ("arrival_times", None), ("users", None),
                              ("request_trace", None), ("max_concurrency", None), ("burstiness", 1.0),
                              ("normalize_arrivals", False)):
            value = getattr(self, name)
            if not (value is None if default is None else value == default):
                raise ValueError(f"{name} must be {default!r} with rate_schedule (a Poisson stream of the "
                                 f"schedule's rate), got {name}={value!r}")

    def _check_closed_loop(self) -> bool:
        """Check ``max_concurrency`` and ``think_time_s``; return whether the load is closed-loop."""
        s = object.__setattr__
        s(self, "think_time_s", check_float("think_time_s", self.think_time_s, low=0, high=MAX_CLOCK_S))
        check_choice("think_time_dist", self.think_time_dist, ("fixed", "exponential"))
        if self.max_concurrency is None:
            if self.think_time_s != 0.0 or self.think_time_dist != "fixed":
                raise ValueError(f"think_time_s needs max_concurrency (a closed loop of clients), got "
                                 f"think_time_s={self.think_time_s!r}, think_time_dist={self.think_time_dist!r} "
                                 f"with max_concurrency=None")
            return False
        s(self, "max_concurrency", check_int("max_concurrency", self.max_concurrency, low=1, high=MAX_COUNT))
        for name, default in (("arrival_times", None), ("users", None), ("request_trace", None),
                              ("trace_window_s", None), ("horizon_s", None), ("warmup_requests", 0)):
            value = getattr(self, name)
            if not (value is None if default is None else value == default):
                raise ValueError(f"{name} must be {default!r} with max_concurrency (closed-loop load: alone, or "
                                 f"capping a renewal stream of arrival_rate), got {name}={value!r}")
        if self.arrival_rate is not None and (self.think_time_s != 0.0 or self.think_time_dist != "fixed"):
            raise ValueError(f"think_time_s must be 0 when max_concurrency caps an open-loop stream "
                             f"(arrival_rate={self.arrival_rate!r}): it is the think time of closed-loop "
                             f"clients, got think_time_s={self.think_time_s!r}")
        return True

    @property
    def closed_loop(self) -> bool:
        """Whether requests are sent by ``max_concurrency`` closed-loop seats."""
        return self.max_concurrency is not None

    def _check_classes(self):
        from ._classes import as_classes

        c = as_classes(self.classes)
        object.__setattr__(self, "classes", c)
        if c is None:
            return
        if c.priorities is not None and (tuple(self.priorities) != (0,) or tuple(self.priority_probs) != (1.0,)):
            raise ValueError(f"priorities and priority_probs must keep their defaults when classes set a priority "
                             f"per band, got priorities={self.priorities!r}")
        if c.by == "trace" and (self.request_trace is None or self.request_trace.classes is None):
            raise ValueError("classes='trace' needs a request trace with a class column "
                             "(Workload.from_trace(..., class_column=...))")

    def _check_request_trace(self):
        """A replayed trace gives the arrivals and the lengths: fill them in
        (again, after `dataclasses.replace`), or check they are the trace's."""
        from ._traces import RequestTrace, max_window_count

        s = object.__setattr__
        tr = self.request_trace
        if not isinstance(tr, RequestTrace):
            raise ValueError(f"request_trace must be a fastsim RequestTrace (Workload.from_trace reads one), "
                             f"got {tr!r}")
        if self.users is not None:
            raise ValueError("request_trace gives the arrivals: users must be None")
        if self.arrival_rate not in (None, 1.0):
            raise ValueError(f"arrival_rate must be None with request_trace (replay faster with "
                             f"Workload.from_trace(..., rate_scale=k)), got {self.arrival_rate!r}")
        lengths = LengthTrace(tr.prompt_len, tr.output_len, "replay")
        if self.lengths is not None and not (np.array_equal(self.lengths.prompt_len, tr.prompt_len)
                                             and np.array_equal(self.lengths.output_len, tr.output_len)
                                             and self.lengths.order == "replay"):
            raise ValueError("lengths must be None with request_trace (the trace gives them)")
        s(self, "lengths", lengths)
        if self.trace_window_s is None:
            if self.arrival_times is not None and not np.array_equal(np.asarray(self.arrival_times),
                                                                     tr.arrival_s):
                raise ValueError("arrival_times must be None with request_trace (the trace gives them)")
            s(self, "arrival_times", np.asarray(tr.arrival_s, dtype=np.float64))
            s(self, "arrival_rate", None)
            return
        s(self, "trace_window_s", check_float("trace_window_s", self.trace_window_s, low=0, low_open=True,
                                              high=MAX_CLOCK_S))
        span = float(tr.arrival_s[-1]) if len(tr) else 0.0
        if self.trace_window_s >= span:
            # (windows start uniformly on [0, span - trace_window_s]: every replication the whole trace)
            raise ValueError(f"trace_window_s must be below the trace's span ({span:g} s), got "
                             f"{self.trace_window_s!r}: every window would be the whole trace (the same stream "
                             f"in every replication); replay it without a window")
        if self.arrival_times is not None:
            raise ValueError("arrival_times must be None with trace_window_s (each replication draws a window "
                             "of the trace's times)")
        s(self, "arrival_rate", None)
        s(self, "num_requests", max_window_count(np.asarray(tr.arrival_s, float), self.trace_window_s))

    def _check_prefix_groups(self):
        s = object.__setattr__
        g = check_int("prefix_groups", self.prefix_groups, low=0, high=MAX_GROUPS)
        s(self, "prefix_groups", g)
        if g == 0:
            if self.prefix_len is not None or self.prefix_popularity != 0.0:
                raise ValueError(f"prefix_len and prefix_popularity need prefix_groups >= 1, got "
                                 f"prefix_groups=0, prefix_len={self.prefix_len!r}, "
                                 f"prefix_popularity={self.prefix_popularity!r}")
            return
        if self.prefix_len is None:
            raise ValueError(f"prefix_len (an int or a length distribution) is required with "
                             f"prefix_groups={g}, got None")
        s(self, "prefix_len", as_length("prefix_len", self.prefix_len))
        s(self, "prefix_popularity", check_float("prefix_popularity", self.prefix_popularity, low=0))

    def prefix_group_probs(self) -> np.ndarray:
        """Probabilities of the prefix groups ``0 .. prefix_groups - 1`` (Zipf)."""
        w = np.arange(1, self.prefix_groups + 1, dtype=float) ** -self.prefix_popularity
        return w / w.sum()

    def _check_multi_user(self):
        s = object.__setattr__
        u = self.users
        if isinstance(u, (tuple, list)):
            if len(u) != 2:
                raise ValueError(f"users must be an integer >= 1 or a (low, high) pair, got {u!r}")
            lo = check_int("users[0]", u[0], low=1, high=MAX_USERS)
            hi = check_int("users[1]", u[1], low=lo, high=MAX_USERS)
        else:
            lo = hi = check_int("users", u, low=1, high=MAX_USERS)
        s(self, "users", (lo, hi))
        m = check_float("requests_per_user", self.requests_per_user, low=0, low_open=True, high=1000.0)
        s(self, "requests_per_user", m)
        s(self, "user_rate", check_float("user_rate", self.user_rate, low=0, low_open=True))
        if m / self.user_rate > MAX_CLOCK_S:
            raise ValueError(f"user_rate must be >= requests_per_user / {MAX_CLOCK_S:g} s = {m / MAX_CLOCK_S:.3g} "
                             f"per s (a user's requests spread over at most {MAX_CLOCK_S:g} s), "
                             f"got {self.user_rate!r}")
        for name in ("arrival_times",):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} must be None with a multi-user workload, got {getattr(self, name)!r}")
        if self.arrival_rate is not None and self.arrival_rate != 1.0:
            raise ValueError(f"arrival_rate must be None with a multi-user workload (the rate follows from "
                             f"users, requests_per_user and user_rate), got {self.arrival_rate!r}")
        if self.burstiness != 1.0 or self.normalize_arrivals:
            raise ValueError("burstiness and normalize_arrivals apply to renewal arrivals, not to a "
                             "multi-user workload")
        s(self, "arrival_rate", None)
        cap = hi * self.user_request_cap
        if self.num_requests not in (1000, cap):
            raise ValueError(f"num_requests must be left out with a multi-user workload (it is set to the "
                             f"buffer users_high * per-user cap = {cap}), got {self.num_requests!r}")
        s(self, "num_requests", int(cap))

    @property
    def user_request_cap(self) -> int:
        """Per-user request cap of a multi-user workload: the Poisson quantile of 1 - 1e-15."""
        from scipy.stats import poisson

        return int(max(1, poisson.isf(1e-15, self.requests_per_user)))

    @classmethod
    def multi_user(cls, users, requests_per_user: float, user_rate: float, **kwargs) -> "Workload":
        """A multi-user workload: each user sends a Poisson number of requests.

        Parameters
        ----------
        users : int or (int, int)
            Number of users, or an inclusive range drawn uniformly per replication.
        requests_per_user : float
            Mean (Poisson) number of requests per user, in (0, 1000].
        user_rate : float
            Rate (1/s) of a user's exponential gaps between requests; the first
            request comes one gap after time 0.
        **kwargs
            Other :class:`Workload` fields (``prompt_len``, ``output_len``,
            ``priorities``, ``priority_probs``, ``warmup_requests``, ``horizon_s``, ...).

        Examples
        --------
        >>> w = Workload.multi_user((12, 16), requests_per_user=10, user_rate=0.2,
        ...                         prompt_len=LogNormal(256, 0.5), output_len=128)
        >>> w.users, w.mean_arrivals
        ((12, 16), 140.0)
        """
        return cls(users=users, requests_per_user=requests_per_user, user_rate=user_rate,
                   arrival_rate=kwargs.pop("arrival_rate", None), **kwargs)

    @property
    def mean_arrivals(self) -> float:
        """Expected arrivals per replication (before any horizon)."""
        if self.users is not None:
            return 0.5 * (self.users[0] + self.users[1]) * self.requests_per_user
        if self.trace_window_s is not None:
            # the mean over window starts (a fine grid of them) of the requests in the window
            t = np.asarray(self.request_trace.arrival_s, float)
            starts = np.linspace(0.0, max(t[-1] - self.trace_window_s, 0.0), 4001)
            counts = (np.searchsorted(t, starts + self.trace_window_s, side="left")
                      - np.searchsorted(t, starts, side="left"))
            return float(np.minimum(counts, self.num_requests).mean())
        return float(self.num_requests)

    @classmethod
    def from_trace(cls, path, *, format: str = "auto", rate_scale: float = 1.0, start_s: float = 0.0,
                   duration_s: float | None = None, resample: bool = False, block_size: int | None = None,
                   timestamp: str | None = None, prompt: str | None = None, output: str | None = None,
                   class_column: str | None = None, num_requests: int | None = None,
                   arrival_rate: float | None = None, order: str = "replay", **kwargs) -> "Workload":
        """Replay a recorded trace: its arrivals, lengths and block identities.

        Parameters
        ----------
        path : str or Path
            A CSV with a timestamp column and prompt/output length columns (the
            Azure LLM inference traces 2023), Mooncake-style JSON lines with
            ``hash_ids``, or JSON lines with token ids (``input_tok_ids``, hashed
            into blocks of ``block_size`` tokens as vLLM does); see
            ``fastsim._traces``. A CSV with lengths only (``prompt_len`` and
            ``output_len``/``gen_len``) gives the lengths, with renewal arrivals
            at ``arrival_rate`` (1/s, default 1; ``order`` and ``num_requests``
            as :class:`LengthTrace`).
        format : {"auto", "csv", "mooncake", "token_ids"}
        rate_scale : float
            Replay ``rate_scale`` times as fast: every gap divided by it.
        start_s, duration_s : float
            Replay the requests arriving in ``[start_s, start_s + duration_s)``
            of the trace (seconds from its first arrival, before scaling),
            shifted to start at 0. Default: all of it.
        resample : bool
            Replay, in each replication, a window of ``duration_s`` whose start
            is drawn uniformly over the trace (reproducible per seed and
            replication; ``Workload.trace_window_s``); ``start_s`` must be 0.
        block_size : int, optional
            Tokens per block when hashing token ids (default 16).
        timestamp, prompt, output, class_column : str, optional
            Column (or JSON field) names, when not the known ones; ``class_column``
            gives each request's class (``classes=("column", ...)``).
        **kwargs
            Other :class:`Workload` fields (``priorities``, ``warmup_requests``, ...).

        Returns
        -------
        Workload
            With ``request_trace`` (the replayed requests) and ``arrival_times``
            and ``lengths`` taken from it, or ``trace_window_s`` when resampled.
        """
        from ._traces import read_trace, window

        p = Path(path)
        if p.suffix.lower() == ".csv" and p.is_file() and timestamp is None:
            try:
                with p.open(newline="") as fh:
                    header = fh.readline().strip().split(",")
            except UnicodeDecodeError as exc:   # (a binary file: the codec's message named no file)
                raise ValueError(f"path must be a text trace (a CSV file or JSON lines, UTF-8), got {str(p)!r}, "
                                 f"which is not: {exc}") from None
            from ._traces import TIME_COLUMNS

            if not any(c in header for c in TIME_COLUMNS):
                # lengths only: renewal arrivals (the LengthTrace reading)
                trace = LengthTrace.from_csv(p, order=order,
                                             nrows=num_requests if order == "replay" else None)
                n = len(trace) if num_requests is None else num_requests
                return cls(arrival_rate=1.0 if arrival_rate is None else arrival_rate, num_requests=n,
                           lengths=trace, **kwargs)
        if arrival_rate is not None:
            raise ValueError(f"arrival_rate must be None when the trace gives the arrival times (replay it "
                             f"faster with rate_scale), got {arrival_rate!r}")
        if order != "replay":
            raise ValueError(f"order must be 'replay' when the trace gives the arrival times, got {order!r}")
        trace = read_trace(p, format=format, block_size=block_size, nrows=num_requests, timestamp=timestamp,
                           prompt=prompt, output=output, class_column=class_column)
        resample = check_bool("resample", resample)
        if resample:
            if duration_s is None:
                raise ValueError("duration_s (the window's length, s) is required with resample=True, got None")
            start_s = check_float("start_s", start_s, low=0)
            if start_s != 0.0:
                raise ValueError(f"start_s must be 0 with resample=True (windows start anywhere), got {start_s!r}")
            duration_s = check_float("duration_s", duration_s, low=0, low_open=True)
            span = float(trace.arrival_s[-1]) if len(trace) else 0.0
            if duration_s >= span:
                # (windows start uniformly on [0, span - duration_s]: each would be the whole trace, every
                # replication the same stream, and the intervals of zero width)
                raise ValueError(f"duration_s must be below the trace's span ({span:g} s, before rate_scale) with "
                                 f"resample=True, got {duration_s!r}: every window would be the whole trace; "
                                 f"replay it without resample")
            rate_scale = check_float("rate_scale", rate_scale, low=0, low_open=True)
            scaled = trace.with_times(trace.arrival_s / rate_scale)
            return cls(arrival_rate=None, request_trace=scaled, trace_window_s=duration_s / rate_scale, **kwargs)
        return cls(arrival_rate=None, request_trace=window(trace, start_s, duration_s, rate_scale), **kwargs)

    @property
    def mean_prompt_len(self) -> float:
        return float(self.lengths.prompt_len.mean()) if self.lengths is not None else self.prompt_len.mean()

    @property
    def mean_output_len(self) -> float:
        return float(self.lengths.output_len.mean()) if self.lengths is not None else self.output_len.mean()

    def _arrival_spec(self) -> _ArrivalSpec:
        if self.trace_window_s is not None:
            return _ArrivalSpec(kind=3, times=np.asarray(self.request_trace.arrival_s, dtype=np.float64))
        if self.arrival_times is not None:
            return _ArrivalSpec(kind=1, times=self.arrival_times)
        if self.users is not None:
            return _ArrivalSpec(kind=2, rate=self.user_rate, users=self.users,
                                requests_per_user=self.requests_per_user, user_cap=self.user_request_cap)
        if self.rate_schedule is not None:
            return _ArrivalSpec(kind=5, times=self.rate_schedule._table())
        if self.arrival_rate is None:   # a pure closed loop (`max_concurrency`)
            return _ArrivalSpec(kind=4)
        return _ArrivalSpec(kind=0, rate=self.arrival_rate, burstiness=self.burstiness)


@dataclass(frozen=True, eq=False)
class Scenario:
    """A server, its load, its latency model and the SLOs that define goodput.

    Parameters
    ----------
    engine : EngineConfig
    workload : Workload
    latency : LatencyModel, optional
        Defaults to ``LatencyModel.default()`` (A10G, Qwen2.5-1.5B).
    ttft_slo_s, tpot_slo_s : float, optional
        A completed request counts toward ``goodput`` if its TTFT and TPOT are
        within these limits (all completed requests count if neither is set).
    name : str, optional
        A label used in tables.
    fleet : Fleet or Disaggregated, optional
        Several replicas of this server behind a router (`fastsim.Fleet`);
        the workload is then the fleet's. None: one replica. A
        `fastsim.Disaggregated`: a prefill pool and a decode pool.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: Workload = field(default_factory=Workload)
    latency: LatencyModel = field(default_factory=LatencyModel.default)
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    name: str | None = None
    fleet: object = None

    def __post_init__(self):
        for name, cls in (("engine", EngineConfig), ("workload", Workload), ("latency", LatencyModel)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        if self.fleet is not None:
            from ._disagg import Disaggregated
            from ._fleet import Fleet

            if not isinstance(self.fleet, (Fleet, Disaggregated)):
                raise ValueError(f"fleet must be None or a fastsim.Fleet (or a fastsim.Disaggregated), got "
                                 f"{self.fleet!r}")
            from ._fleet import check_closed_loop, check_sjf_keys, check_trace_identities

            check_trace_identities(self)
            check_closed_loop(self)
            check_sjf_keys(self)
        object.__setattr__(self, "ttft_slo_s", check_float("ttft_slo_s", self.ttft_slo_s, low=0,
                                                           low_open=True, optional=True))
        object.__setattr__(self, "tpot_slo_s", check_float("tpot_slo_s", self.tpot_slo_s, low=0,
                                                           low_open=True, optional=True))
        e, w = self.engine, self.workload
        self._check_step_durations()
        if w.sessions is not None:
            from ._sessions import check_scenario

            check_scenario(self)
        if w.max_concurrency is not None and e.priority_aging_s is not None:
            # (aged keys a_i / A need the arrival when the request is drawn; a
            # closed loop's arrivals are known only when a seat frees)
            raise ValueError(f"engine.priority_aging_s must be None with workload.max_concurrency (closed-loop "
                             f"load), got priority_aging_s={e.priority_aging_s!r}")
        # vLLM refuses a prompt longer than max_model_len; with admission="none"
        # a fixed-length workload that can never run is a configuration error.
        if e.max_model_len is not None and w.lengths is None:
            p, o = w.prompt_len, w.output_len
            if isinstance(p, Fixed) and isinstance(o, Fixed) and p.value + o.value > e.max_model_len:
                raise ValueError(f"prompt_len + output_len must be <= max_model_len ({e.max_model_len}), "
                                 f"got {p.value} + {o.value}")
        if getattr(self.fleet, "mixed", False) and w.lengths is None:   # (a listed replica's too: it was refused
            p, o = w.prompt_len, w.output_len                            # late, naming the scenario's engine)
            for k, (ek, _) in enumerate(self.fleet.replicas):
                if (isinstance(p, Fixed) and isinstance(o, Fixed) and ek.max_model_len is not None
                        and p.value + o.value > ek.max_model_len):
                    raise ValueError(f"prompt_len + output_len must be <= fleet.replicas[{k}]'s max_model_len "
                                     f"({ek.max_model_len}), got {p.value} + {o.value}")

    def _check_step_durations(self):
        """Refuse a latency model whose longest step (a full batch: every
        seat decoding, the whole token budget prefilled, the whole KV cache
        read, every block swapped) exceeds `MAX_CLOCK_S`, naming its
        largest term (base_s=1e308 gave inf times and NaN metrics)."""
        e, lat = self.engine, self.latency
        try:
            decode = lat.decode_scale_s * float(max(e.max_num_seqs - 1, 0)) ** lat.decode_alpha
        except OverflowError:
            decode = float("inf")
        terms = {"base_s": lat.base_s, "decode_scale_s": decode if lat.decode_scale_s else 0.0,
                 "prefill_per_token_s": lat.prefill_per_token_s * e.max_num_batched_tokens,
                 "ctx_per_token_s": lat.ctx_per_token_s * e.kv_capacity_tokens,
                 "swap_s_per_block": lat.swap_s_per_block * (e.num_gpu_blocks + e.swap_space_blocks)}
        longest = sum(terms.values())   # (inf for an overflowing power: refused too)
        noise = lat.noise
        if noise is not None and longest <= MAX_CLOCK_S:
            # (its factors at 8 standard deviations, a stall at 40 means: where a run's clock must still hold)
            f = (math.exp(noise.speed_log_mean + 8 * noise.speed_sd + 8 * noise.jitter_sd)
                 * math.exp(max(0.0, noise.prefill_log_mean + 8 * noise.prefill_sd)))
            noisy = longest * f + (40 * noise.stall_mean_s if noise.stall_prob > 0 else 0.0)
            if not noisy <= MAX_CLOCK_S:
                raise ValueError(f"latency.noise makes the longest step {noisy:.3g} s at 8 standard deviations of "
                                 f"its factors (speed_log_mean, speed_sd, prefill_log_mean, prefill_sd, jitter_sd; "
                                 f"stall_mean_s), more than {MAX_CLOCK_S:g} s, beyond which the engine's clock "
                                 f"loses its resolution; got {noise!r}")
        if not longest <= MAX_CLOCK_S:
            name = max(terms, key=terms.get)
            raise ValueError(f"latency.{name} makes the longest step {longest:.3g} s (a full batch: "
                             f"{name} term {terms[name]:.3g} s), more than {MAX_CLOCK_S:g} s, beyond which the "
                             f"engine's clock loses its resolution and overflows; got {name}="
                             f"{getattr(lat, name)!r}"
                             + (f" with decode_alpha={lat.decode_alpha!r} (the term is decode_scale_s * "
                                f"(max_num_seqs - 1) ** decode_alpha)" if name == "decode_scale_s" else ""))

    def describe(self) -> str:
        """What this scenario simulates, in words: says so when the engine or the
        latency are the A10G / Qwen2.5-1.5B defaults."""
        from ._describe import describe_scenario

        return describe_scenario(self)

    def replace(self, **changes) -> "Scenario":
        """A copy with some fields changed; dotted keys reach inside, e.g.
        ``scenario.replace(**{"engine.max_num_seqs": 32})``."""
        top, nested = {}, {}
        for key, value in changes.items():
            head, _, rest = key.partition(".")
            if rest:
                nested.setdefault(head, {})[rest] = value
            else:
                top[key] = value
        for head, sub in nested.items():
            if head not in ("engine", "workload", "latency"):
                raise ValueError(f"unknown scenario section {head!r}; use engine, workload or latency")
            base = top.get(head, getattr(self, head))
            top[head] = base.replace(**sub) if isinstance(base, EngineConfig) else dataclasses.replace(base, **sub)
        return dataclasses.replace(self, **top)

    @classmethod
    def from_dict(cls, config: dict, *, base_dir: Path | None = None) -> "Scenario":
        """Build a scenario from a dict with ``engine``, ``workload``, ``latency``
        and ``slo`` tables (the layout of a ``fastsim run`` TOML file)."""
        return _scenario_from_dict(config, base_dir=base_dir)


_LENGTH_LAWS = {"fixed": Fixed, "lognormal": LogNormal, "uniform": Uniform, "empirical": Empirical,
                "exponential": Exponential, "geometric": Geometric, "gamma": Gamma, "histogram": Histogram}
#: TOML keys of the laws whose dataclass field is named otherwise (``mean`` would shadow the method)
_LAW_KEY_ALIASES = {"mean": "mean_len"}

#: Keys of the TOML tables other than the dataclass fields (``Scenario.from_dict``).
_WORKLOAD_EXTRA_KEYS = ("trace", "sharegpt", "sharegpt_order")
_LATENCY_EXTRA_KEYS = ("step_s", "preset")
SLO_KEYS = ("ttft_s", "tpot_s")
TABLES = ("engine", "workload", "latency", "slo", "run", "name", "deployment", "fleet")


def _field_names(cls, skip=()):
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name not in skip]


def table_keys(table: str) -> list[str]:
    """The keys a ``fastsim run`` TOML table accepts (``[run]`` is the CLI's: see ``fastsim._cli``)."""
    if table == "engine":
        return _field_names(EngineConfig)
    if table == "workload":
        return _field_names(Workload, skip=("lengths", "request_trace", "trace_window_s")) + list(_WORKLOAD_EXTRA_KEYS)
    if table == "latency":
        return _field_names(LatencyModel, skip=("calibration",)) + list(_LATENCY_EXTRA_KEYS)
    if table == "slo":
        return list(SLO_KEYS)
    if table == "deployment":
        from ._deployment import Deployment

        return [p for p in inspect.signature(Deployment).parameters if p != "self"]
    if table == "fleet":
        from ._fleet import Fleet

        return _field_names(Fleet)
    raise ValueError(f"table must be one of engine, workload, latency, slo, deployment, fleet, got {table!r}")


def check_table_keys(table: str, given, allowed) -> None:
    """A ValueError naming ``[table]``, the unknown key(s), a close match and every allowed key."""
    import difflib

    unknown = [k for k in given if k not in allowed]
    if not unknown:
        return
    hints = []
    for k in unknown:
        close = difflib.get_close_matches(str(k), list(allowed), n=1)
        if close:
            hints.append(f"{k!r} (did you mean {close[0]!r}?)")
        else:
            hints.append(repr(k))
    where = "TOML top level" if table is None else f"[{table}]"
    raise ValueError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                     f"allowed keys: {', '.join(allowed)}")


def _in_table(table: str, build, *args, **kwargs):
    """``build(*args, **kwargs)`` with a ValueError or TypeError re-raised as a
    ValueError that names ``[table]`` (a TOML file's reader sees where)."""
    try:
        return build(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith(f"[{table}]") else f"[{table}] {msg}") from None


def _tables_from_config(wl, base_dir):
    """``[workload]``'s ``classes = {by = "prompt_len", edges = [256, 1024]}``
    (`RequestClasses`) and ``sessions = {turns = 4, think_time_s = 5.0}``
    (`Sessions`; ``turns`` a length as ``prompt_len``), in place."""
    from ._classes import RequestClasses
    from ._sessions import Sessions

    for key, cls, keys in (("classes", RequestClasses, ["by", "edges", "names", "priorities"]),
                           ("sessions", Sessions, ["turns", "think_time_s", "think_time_dist"])):
        if key not in wl:
            continue
        spec = wl[key]
        if not isinstance(spec, dict):
            raise ValueError(f"[workload] {key} must be a table ({{{', '.join(k + ' = ...' for k in keys[:2])}}}), "
                             f"got {spec!r}")
        check_table_keys(f"workload] [{key}", spec, keys)
        spec = dict(spec)
        if "turns" in spec:
            spec["turns"] = _length_from_config("turns", spec["turns"], base_dir)
        wl[key] = _in_table("workload", cls, **spec)


def _length_from_config(name, spec, base_dir):
    """An int, or a table such as ``{dist = "lognormal", median = 256, sigma = 0.55}``."""
    if not isinstance(spec, dict):
        return spec
    spec = dict(spec)
    if "truncate" in spec:
        # any law: {dist = ..., ..., truncate = N} is the law conditioned on L <= N
        high = spec.pop("truncate")
        law = _length_from_config(name, spec, base_dir)
        try:
            return Truncated(law, high)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{name}.truncate: {exc}") from None
    kind = spec.pop("dist", None)
    if kind == "lognormal" and ("mean" in spec or "sd" in spec):
        extra = sorted(set(spec) - {"mean", "sd"})
        if extra or "mean" not in spec or "sd" not in spec:
            raise ValueError(f"{name}: a lognormal by its moments takes mean and sd (and no other key), "
                             f"got {sorted(spec)}")
        try:
            return LogNormal.from_mean_sd(spec["mean"], spec["sd"])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    if kind in _LENGTH_LAWS:
        spec = {_LAW_KEY_ALIASES.get(k, k): v for k, v in spec.items()}
    if kind == "mixture":
        comps = spec.pop("components", None)
        if not isinstance(comps, list) or not comps:
            raise ValueError(f"{name}.components must be a non-empty list of length laws (integers or "
                             f"tables such as {{dist = \"lognormal\", median = 256, sigma = 0.5}}), "
                             f"got {comps!r}")
        comps = [_length_from_config(f"{name}.components[{j}]", c, base_dir) for j, c in enumerate(comps)]
        weights = spec.pop("weights", None)
        if spec:
            raise ValueError(f"{name}: unknown key(s) {sorted(spec)} for dist = \"mixture\"; allowed: "
                             f"dist, components, weights")
        try:
            return Mixture(comps, weights)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    if kind == "empirical" and "path" in spec:
        path = spec.pop("path")
        if not isinstance(path, str):
            raise ValueError(f"{name}.path must be a file name (a string), got {path!r}")
        path = Path(path)
        if "column" not in spec:
            raise ValueError(f"{name}: an empirical length read from a file needs column = \"...\"")
        try:
            return Empirical.from_csv(path if path.is_absolute() or base_dir is None else base_dir / path,
                                      **spec)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    if kind not in _LENGTH_LAWS:
        raise ValueError(f"{name}.dist must be one of {', '.join(map(repr, [*_LENGTH_LAWS, 'mixture']))}, "
                         f"got {kind!r}")
    try:
        return _LENGTH_LAWS[kind](**spec)
    except TypeError:
        aliases = {v: k for k, v in _LAW_KEY_ALIASES.items()}
        fields = [f for f in dataclasses.fields(_LENGTH_LAWS[kind]) if f.init]
        allowed = ["dist"] + [aliases.get(f.name, f.name) for f in fields]
        unknown = sorted(set(spec) - set(allowed))
        if unknown:
            raise ValueError(f"{name}: unknown key(s) {unknown} for dist = {kind!r}; "
                             f"allowed: {', '.join(allowed)}") from None
        # (no unknown key: a required one is missing, which the message said as "unknown key(s) []")
        required = [aliases.get(f.name, f.name) for f in fields
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        raise ValueError(f"{name}: missing key(s) {sorted(set(required) - set(spec))} for dist = {kind!r}; "
                         f"allowed: {', '.join(allowed)}") from None
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _trace_from_config(trace, base_dir):
    """``trace = "file.csv"`` or ``trace = {path = "file.csv", order = "sample"}``."""
    if isinstance(trace, str):
        trace = {"path": trace}
    if not isinstance(trace, dict):
        raise ValueError(f"trace must be a CSV file name, or a table {{path = \"file.csv\", order = "
                         f"\"replay\" or \"sample\", nrows = N}}, got {trace!r}")
    trace = dict(trace)
    check_table_keys("workload] [trace", trace, ["path", "order", "nrows"])
    if "path" not in trace:
        raise ValueError(f"trace needs path = \"file.csv\" (a CSV with columns prompt_len and output_len), "
                         f"got {trace!r}")
    path = trace.pop("path")
    if not isinstance(path, str):
        raise ValueError(f"trace.path must be a file name (a string), got {path!r}")
    path = Path(path)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return LengthTrace.from_csv(path, **trace)


def _scenario_from_dict(config, base_dir=None):
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict of tables, got {type(config).__name__}")
    unknown = set(config) - set(TABLES)
    if unknown:
        check_table_keys(None, sorted(unknown), list(TABLES))
    for table in ("engine", "workload", "latency", "slo", "run", "deployment", "fleet"):
        if not isinstance(config.get(table, {}), dict):
            raise ValueError(f"[{table}] must be a table of key = value settings, got {config[table]!r}")
    name = config.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r}")
    eng = dict(config.get("engine", {}))
    check_table_keys("engine", eng, table_keys("engine"))
    deployment = None
    if "deployment" in config:
        # [deployment]: a model, a GPU and vLLM's arguments (fastsim._deployment); its engine settings
        # are the defaults of [engine] and its roofline latency that of an absent [latency]
        from ._deployment import Deployment
        from ._models import _lookup

        dep = dict(config["deployment"])
        check_table_keys("deployment", dep, table_keys("deployment"))
        model = dep.get("model")
        if (isinstance(model, str) and base_dir is not None and _lookup(model)[1] is None
                and not Path(model).is_absolute() and (Path(base_dir) / model).exists()):
            dep["model"] = str(Path(base_dir) / model)   # (a config.json path: beside the file, as trace paths)
        try:
            deployment = Deployment(**dep)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"[deployment]: {exc}") from None
        d_eng = deployment.engine
        given = ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks",
                 "enable_chunked_prefill", "max_model_len", "enable_prefix_caching")
        both = sorted(set(eng) & set(given))
        if both:
            raise ValueError(f"[engine] {both} are set by [deployment] (they decide num_gpu_blocks and the "
                             f"latency); move them to [deployment] (num_gpu_blocks as num_gpu_blocks_override)")
        eng = {**{f: getattr(d_eng, f) for f in given}, **eng}
    if isinstance(eng.get("length_predictor"), dict):
        # [engine] length_predictor = {sigma = 0.5} or {edges = [64, 256], accuracy = 0.8}
        spec = eng["length_predictor"]
        if "edges" in spec:
            check_table_keys("engine] [length_predictor", spec, ["edges", "accuracy"])
        else:
            check_table_keys("engine] [length_predictor", spec, ["sigma"])
        eng["length_predictor"] = _in_table("engine", BucketPredictor if "edges" in spec else LogNormalPredictor,
                                            **spec)
    engine = _in_table("engine", EngineConfig, **eng)
    wl = dict(config.get("workload", {}))
    check_table_keys("workload", wl, table_keys("workload"))
    trace = wl.pop("trace", None)
    sharegpt = _in_table("workload", check_bool, "sharegpt", wl.pop("sharegpt", False))
    order = wl.pop("sharegpt_order", None)
    if order is not None and not sharegpt:
        raise ValueError(f"[workload] sharegpt_order needs sharegpt = true, got sharegpt = false and "
                         f"sharegpt_order = {order!r}; remove sharegpt_order, or set sharegpt = true")
    if trace is not None and sharegpt:
        raise ValueError("[workload]: trace and sharegpt = true both give the lengths; set one of them")
    if trace is not None:
        wl["lengths"] = _in_table("workload", _trace_from_config, trace, base_dir)
    elif sharegpt:
        from ._distributions import sharegpt_lengths

        wl["lengths"] = _in_table("workload", sharegpt_lengths, "sample" if order is None else order)
    for key in ("prompt_len", "output_len", "prefix_len"):
        if key in wl:
            wl[key] = _in_table("workload", _length_from_config, key, wl[key], base_dir)
    if isinstance(wl.get("rate_schedule"), dict):   # rate_schedule = {times = [...], rates = [...], shape = ...}
        from ._rate_schedule import RateSchedule
        check_table_keys("workload] [rate_schedule", wl["rate_schedule"], ["times", "rates", "shape", "repeat"])
        wl["rate_schedule"] = _in_table("workload", RateSchedule, **wl["rate_schedule"])
    _tables_from_config(wl, base_dir)
    workload = _in_table("workload", Workload, **wl)
    lat = dict(config.get("latency", {}))
    check_table_keys("latency", lat, table_keys("latency"))
    if "step_s" in lat:
        step = lat.pop("step_s")
        if lat:
            raise ValueError(f"[latency]: step_s cannot be combined with {sorted(lat)}")
        latency = _in_table("latency", LatencyModel.constant, step)
    elif "preset" in lat:
        preset = lat.pop("preset")
        if lat:
            raise ValueError(f"[latency]: preset cannot be combined with {sorted(lat)}")
        latency = (LatencyModel.default() if preset == "default"
                   else _in_table("latency", LatencyModel.preset, preset))
    elif not lat and deployment is not None:
        latency = deployment.latency
    elif not lat:
        latency = LatencyModel.default()
    else:
        latency = _in_table("latency", LatencyModel, **lat)
    slo = config.get("slo", {})
    check_table_keys("slo", slo, table_keys("slo"))
    limits = {k: check_float(f"[slo] {k}", slo.get(k), low=0, low_open=True, optional=True) for k in SLO_KEYS}
    fleet = None
    if "fleet" in config:   # several replicas behind a router (`fastsim.Fleet`)
        from ._fleet import Fleet

        check_table_keys("fleet", config["fleet"], table_keys("fleet"))
        fl = dict(config["fleet"])
        if isinstance(fl.get("autoscaler"), dict):   # [fleet.autoscaler]: a fastsim.Autoscaler's settings
            from ._autoscaler import Autoscaler
            check_table_keys("fleet] [autoscaler", fl["autoscaler"],
                             [f.name for f in dataclasses.fields(Autoscaler)])
            fl["autoscaler"] = _in_table("fleet", Autoscaler, **fl["autoscaler"])
        fleet = _in_table("fleet", Fleet, **fl)
    return Scenario(engine=engine, workload=workload, latency=latency, ttft_slo_s=limits["ttft_s"],
                    tpot_slo_s=limits["tpot_s"], name=name, fleet=fleet)


__all__ = ["BucketPredictor", "EngineConfig", "LogNormalPredictor", "Workload", "Scenario", "LengthDistribution",
           "Uniform"]
