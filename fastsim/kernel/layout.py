"""The kernel's shared vocabulary: the slots of the parameter vectors, the
request statuses, the random streams, the metric columns and the run-level
accumulators. Python (`fastsim/_pack.py`, the only writer of the
parameter vectors) and the kernel both read these names; no other module
states a slot number.
"""

from __future__ import annotations

# --- layout of the integer parameter vector ``ipar`` -------------------------
I_MAX_NUM_SEQS = 0
I_MAX_BATCHED_TOKENS = 1
I_BLOCK_SIZE = 2
I_NUM_GPU_BLOCKS = 3
I_CHUNKED = 4
I_POLICY = 5          # 0 fcfs, 1 priority, 2 sjf
I_STATIC = 6          # 0 continuous, 1 static batching
I_ADMISSION = 7       # 0 none, 1 queue_limit, 2 kv_reservation
I_MAX_WAITING = 8
I_MAX_MODEL_LEN = 9   # 0 = no limit
I_WARMUP = 10
I_HAS_DELAY = 11
I_HAS_HORIZON = 12
I_ARRIVAL_KIND = 13   # 0 renewal (gamma gaps), 1 given times, 2 multi-user, 3 trace windows
I_TRACE_MODE = 14     # 0 independent laws, 1 replay rows, 2 sample rows
I_NUM_REQUESTS = 15   # arrivals to generate (buffer capacity with a horizon)
I_HAS_TTFT_SLO = 16
I_HAS_TPOT_SLO = 17
I_NORMALIZE_ARRIVALS = 18  # 1: rescale as `vllm bench serve` (last arrival at N / rate)
I_USERS_LO = 19       # multi-user arrivals (I_ARRIVAL_KIND 2): user count range
I_USERS_HI = 20
I_USER_CAP = 21       # per-user request cap (Poisson quantile of 1 - 1e-15)
I_PREDICTOR = 22      # SJF key: 0 the true output length, 1 lognormal prediction error, 2 buckets
I_PRIO_PREEMPT = 23   # 1: active priority preemption (phase 0)
I_HAS_AGING = 24      # 1: queue keys c_i + a_i / A (F_AGING = A)
I_SWAP = 25           # 1: preemption_mode="swap"
I_SWAP_BLOCKS = 26    # swap_space_blocks
I_PREFIX = 27         # 1: the workload has prefix groups (laws at lrange[4:8])
I_CACHING = 28        # 1: enable_prefix_caching
I_FULL_ISL = 29       # 1: scheduler_reserve_full_isl (admission needs the whole input's blocks)
I_ASYNC = 30          # 1: async_scheduling (a step is scheduled while the one before it runs)
I_PRIO_BAND = 31      # priority per length band (BAND_*): prio_val[j] for the band j in which the length
                      # falls, prio_cdf the bands' upper edges (the last inf); BAND_NONE: drawn by prio_cdf
I_SJF_KEY = 32        # the length the SJF key is (or predicts): SJF_KEY_*
I_MAX_CONCURRENCY = 33  # closed loop (`arrivals._release_seats`): c seats; 0: open loop
I_THINK_EXP = 34      # pure closed loop: 1 exponential think times of mean F_THINK, 0 fixed
I_BLOCK_HASH = 35     # with I_CACHING: 1 prefix caching by block hash (vLLM V1, `block_pool`), 2 the same
                      # with the block pool's conservation checked after every step (a test path)
I_SESSIONS = 36       # multi-turn sessions (`arrivals._session_sends`): SESSIONS_*; 0: none
I_TRACE_HASH = 37     # 1: a replayed trace's block identities (`workload._trace_parents`) key the block pool
I_STEP_EXTRAS = 38   # 1: the latency record is the roofline or has per-step noise (`replica.engine_variant`
                      # reads it: the common engine has neither)
N_IPAR = 39


# --- layout of the float parameter vector ``fpar`` ---------------------------
F_RATE = 0
F_BURSTINESS = 1
F_MAX_DELAY = 2
F_HORIZON = 3
F_TTFT_SLO = 4
F_TPOT_SLO = 5
F_TTFT_OVERHEAD = 6   # client-side offset of observed first-token and completion times
F_USER_REQUESTS = 7   # multi-user arrivals: mean requests per user (F_RATE is the per-user rate)
F_PRED_SIGMA = 8      # lognormal length predictor: sigma of the log error
F_AGING = 9           # priority_aging_s
F_PRED_ACCURACY = 10  # bucket length predictor: probability of the right bucket
F_TRACE_WINDOW = 11   # trace windows (I_ARRIVAL_KIND 3): the window's duration (s, scaled)
F_THINK = 12          # closed loop: a client's think time between a reply and its next request (s)
N_FPAR = 13


# --- layout of the latency record ``lat`` (the step-time coefficients, `latency`) ---
L_BASE = 0           # base_s
L_DECODE_SCALE = 1   # decode_scale_s
L_DECODE_ALPHA = 2   # decode_alpha
L_PREFILL = 3        # prefill_per_token_s
L_CTX = 4            # ctx_per_token_s
L_SWAP = 5           # swap_s_per_block
# the noise of the step time (`latency`; `_latency.StepNoise`): all 0.0 for a deterministic model
L_NOISE = 6          # 1.0: per-step jitter and stalls (the stretch's closed forms do not apply)
L_JITTER_SD = 7      # sd of the log of a step's multiplicative jitter
L_JITTER_SHIFT = 8   # the log-mean of the jitter, -sd^2 / 2 (its mean is 1)
L_STALL_PROB = 9     # probability that a step stalls
L_STALL_MEAN = 10    # mean of a stall's (exponential) duration, seconds
L_KEY_HI = 11        # the replication's step-noise key, as two 32-bit halves (written per replication)
L_KEY_LO = 12
L_RUN = 13           # 1.0: per-run effects drawn once per replication (`latency._draw_run_latency`)
L_SPEED_MU = 14      # the log of the per-run speed factor ~ N(mu, sd^2), multiplying every step term
L_SPEED_SD = 15
L_PREFILL_MU = 16    # the log of the per-run prefill factor ~ N(mu, sd^2), multiplying the prefill term
L_PREFILL_SD = 17
L_OVERHEAD_SD = 18   # sd of the per-run client overhead (normal about ttft_overhead_s, at least 0)
L_CHOL = 19          # 5 x 5 lower Cholesky factor (row-major) of the covariance of
N_CAL = 5            # (base_s, decode_scale_s, decode_alpha, prefill_per_token_s, ttft_overhead_s)
N_LAT_REGRESSION = L_CHOL + N_CAL * N_CAL
# the roofline step time (`latency._roofline_time`, `fastsim.RooflineLatency`); L_ROOF 0.0: the
# regression model above. Every time below is already multiplied by the layers it runs in and by
# the time scale. A GEMM entry (t0, a, b, c) of t rows costs t0 + max(a * t, b + c * t) (compute
# bound or memory bound); the roofline's L_CTX is the decode attention's cost per KV token.
L_ROOF = N_LAT_REGRESSION   # 1.0: the roofline
L_R_OVER = L_ROOF + 1       # fixed time of every step (s)
L_R_PER_SEQ = L_ROOF + 2    # time per scheduled sequence (s)
L_R_NGEMM = L_ROOF + 3      # number of weight-GEMM entries at L_R_GEMM (at most N_R_GEMM)
L_R_MOE_E = L_ROOF + 4      # MoE: experts (0.0: dense)
L_R_MOE_K = L_ROOF + 5      # MoE: experts per token
L_R_MOE_Q = L_ROOF + 6      # MoE: 1 - k / E (a token misses a given expert)
L_R_GA_T0 = L_ROOF + 7      # decode attention's fixed time (steps with a decoder)
L_R_CA_T0 = L_ROOF + 8      # prefill attention's fixed time (steps with prefill tokens)
L_R_CA_PAIR = L_ROOF + 9    # prefill attention's time per doubled causal query-key pair
L_R_AR_T0 = L_ROOF + 10     # tensor-parallel all-reduces' fixed time (0.0 without TP)
L_R_AR_TOK = L_ROOF + 11    # all-reduces' time per token
L_R_LM = L_ROOF + 12        # the LM head's GEMM entry (4 slots), rows = scheduled sequences
L_R_MOE_GEMM = L_ROOF + 16  # the two GEMM entries of one expert (8 slots), rows = tokens per expert
L_R_GEMM = L_ROOF + 24      # the weight-GEMM entries, 4 slots each, rows = the step's tokens
N_R_GEMM = 8
L_R_GA_SEQ = L_R_GEMM + 4 * N_R_GEMM   # decode attention's time per decoding sequence
N_LAT = L_R_GA_SEQ + 1

# --- named codes, shared by Python (`fastsim/_pack.py`) and the kernel ---
# ipar[I_POLICY]: the waiting queue's order
POLICY_FCFS, POLICY_PRIORITY, POLICY_SJF = 0, 1, 2
POLICY_CODES = {"fcfs": POLICY_FCFS, "priority": POLICY_PRIORITY, "sjf": POLICY_SJF}


# ipar[I_ADMISSION]: admission control at arrival
ADMISSION_NONE, ADMISSION_QUEUE_LIMIT, ADMISSION_KV_RESERVATION = 0, 1, 2
ADMISSION_CODES = {"none": ADMISSION_NONE, "queue_limit": ADMISSION_QUEUE_LIMIT,
                   "kv_reservation": ADMISSION_KV_RESERVATION}
# ipar[I_ARRIVAL_KIND]: renewal process (gamma gaps), given times, multi-user, or a window of a
# trace's times drawn per replication (arr_times: the whole trace; its rows: the trace table);
# ARRIVAL_CLOSED: a pure closed loop, every request wanting to go at time 0 (the seats decide)
ARRIVAL_RENEWAL, ARRIVAL_GIVEN, ARRIVAL_MULTI_USER, ARRIVAL_TRACE_WINDOW, ARRIVAL_CLOSED = 0, 1, 2, 3, 4
# ARRIVAL_SCHEDULE: a Poisson process of a time-varying rate (`fastsim.RateSchedule`), arr_times its
# table: shape (0 piecewise constant, 1 piecewise linear), period (0: none), the K knots, their K rates
# and the K integrals of the rate from 0 to each knot (`workload._schedule_arrivals`)
ARRIVAL_SCHEDULE = 5

# ipar[I_SESSIONS]: no sessions; session starts from the arrival process (open); or
# I_MAX_CONCURRENCY users, each running sessions back to back (users)
SESSIONS_NONE, SESSIONS_OPEN, SESSIONS_USERS = 0, 1, 2
# ipar[I_TRACE_MODE]: lengths from the laws, or rows of a trace replayed in order or sampled
TRACE_NONE, TRACE_REPLAY, TRACE_SAMPLE = 0, 1, 2
# ipar[I_PRIO_BAND]: which length's band sets the priority (none: drawn at random)
BAND_NONE, BAND_PROMPT, BAND_OUTPUT, BAND_TOTAL = 0, 1, 2, 3
BAND_CODES = {"prompt_len": BAND_PROMPT, "output_len": BAND_OUTPUT, "total_len": BAND_TOTAL}
# ipar[I_SJF_KEY]: the length SJF orders by (before any predictor's error)
SJF_KEY_OUTPUT, SJF_KEY_PROMPT, SJF_KEY_TOTAL = 0, 1, 2
SJF_KEY_CODES = {"output": SJF_KEY_OUTPUT, "prompt": SJF_KEY_PROMPT, "total": SJF_KEY_TOTAL}
# ipar[I_PREDICTOR]: the SJF key: the true output length, a lognormal prediction, or a bucket classifier
PREDICTOR_EXACT, PREDICTOR_LOGNORMAL, PREDICTOR_BUCKETS = 0, 1, 2


# --- request status codes ------------------------------------------------------
ST_PENDING = 0
ST_WAITING = 1
ST_RUNNING = 2
ST_COMPLETED = 3
ST_REJECTED_TOO_LONG = 4
ST_REJECTED_ADMISSION = 5
ST_DROPPED = 6
ST_UNFINISHED = 7
ST_SWAPPED = 8        # preempted by swap (in the swapped queue); internal


# --- random stream purposes ----------------------------------------------------
S_ARRIVAL = 0
S_PROMPT_COMPONENT = 1
S_PROMPT_VALUE = 2
S_OUTPUT_COMPONENT = 3
S_OUTPUT_VALUE = 4
S_PRIORITY = 5
S_TRACE_ROW = 6
S_USERS = 7           # multi-user arrivals: user count and per-user request counts
S_PREDICT = 8         # SJF key prediction errors (a stream of its own: the other draws do not change)
S_PREFIX_GROUP = 9    # prefix group of each request
S_PREFIX_LEN = 10     # prefix length of each request
S_RUN_EFFECTS = 11    # per-run latency effects: speed, prefill and overhead levels, calibration draw
S_STEP_NOISE = 12     # per-step jitter and stalls: a key, drawn by step counter (`latency._step_noise`)
N_STREAMS = 13


# --- per-replication output row -------------------------------------------------
METRICS = (
    "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p95", "ttft_p99",
    "tpot_mean", "tpot_p50", "tpot_p99",
    "itl_mean", "itl_p50", "itl_p99",
    "e2e_mean", "e2e_p50", "e2e_p99",
    "request_throughput", "output_throughput", "goodput",
    "blocking_probability", "drop_probability", "preemptions_per_request", "swaps_per_request",
    "prefix_hit_rate", "batch_occupancy_mean", "queue_depth_mean", "kv_utilization_mean",
)


COUNTS = (
    "n_arrived", "n_completed", "n_rejected", "n_rejected_too_long", "n_rejected_admission",
    "n_dropped", "n_unfinished", "n_preemptions", "n_swaps", "n_measured", "n_steps",
    "max_blocks_used", "blocks_used_at_end", "max_swap_blocks_used", "window_s", "end_s",
    "time_in_system_integral", "sojourn_sum",
)


COLUMNS = METRICS + COUNTS
N_COLUMNS = len(COLUMNS)
_COL = {name: j for j, name in enumerate(COLUMNS)}
C_TTFT_MEAN = _COL["ttft_mean"]
C_TPOT_MEAN = _COL["tpot_mean"]
C_ITL_MEAN = _COL["itl_mean"]
C_E2E_MEAN = _COL["e2e_mean"]
C_REQ_TPUT = _COL["request_throughput"]
C_OUT_TPUT = _COL["output_throughput"]
C_GOODPUT = _COL["goodput"]
C_BLOCKING = _COL["blocking_probability"]
C_DROP = _COL["drop_probability"]
C_PREEMPT = _COL["preemptions_per_request"]
C_SWAPS = _COL["swaps_per_request"]
C_HIT = _COL["prefix_hit_rate"]
C_OCC = _COL["batch_occupancy_mean"]
C_QUEUE = _COL["queue_depth_mean"]
C_KV = _COL["kv_utilization_mean"]
C_N_ARRIVED = _COL["n_arrived"]


# Run-level accumulators returned by `_simulate` (indices into `acc`).
A_OCC_INT = 0       # integral over the window of running / max_num_seqs
A_QUEUE_INT = 1     # integral over the window of waiting
A_KV_INT = 2        # integral over the window of used blocks / num_gpu_blocks
A_L_INT = 3         # integral over the whole run of the number in system
A_WINDOW_START = 4
A_END = 5
A_STEPS = 6
A_MAX_BLOCKS = 7
A_BLOCKS_END = 8
A_N_ITL = 9
A_HIT_TOK = 10      # prefix caching: cached tokens of measured requests that queried the cache
A_QUERY_TOK = 11    # ... and their prompt tokens
A_MAX_SWAP = 12     # most blocks held in CPU swap space
N_ACC = 13
N_HIST = 256       # buckets of the histogram that narrows percentile searches (`_percentiles`)


# --- fleets of replicas behind a router (`router`, `cluster`) -----------------
# The router's random stream: keyed as the workload's streams are, after them
# (so that a fleet's requests are the ones one replica would get).
S_ROUTE = N_STREAMS
# The routing policies (`router._route`), by the names `fastsim.Fleet` takes.
(ROUTER_RANDOM, ROUTER_ROUND_ROBIN, ROUTER_LEAST_OUTSTANDING, ROUTER_VLLM_DP, ROUTER_JSQ, ROUTER_POWER_OF_TWO,
 ROUTER_LEAST_KV, ROUTER_PREFIX_AFFINITY, ROUTER_SESSION_AFFINITY, ROUTER_WEIGHTED) = range(10)
ROUTER_CODES = {"random": ROUTER_RANDOM, "round_robin": ROUTER_ROUND_ROBIN,
                "least_outstanding": ROUTER_LEAST_OUTSTANDING, "vllm_dp": ROUTER_VLLM_DP, "jsq": ROUTER_JSQ,
                "power_of_two": ROUTER_POWER_OF_TWO, "least_kv": ROUTER_LEAST_KV,
                "prefix_affinity": ROUTER_PREFIX_AFFINITY, "session_affinity": ROUTER_SESSION_AFFINITY,
                "weighted": ROUTER_WEIGHTED}
# The weighted router's scorers' weights (`router._route_weighted`: llm-d's
# prefix-cache, queue and KV-cache-utilisation scorers), a record of their
# own inside the fleet's record and the link's (at ``FL_SCORERS``, ``DL_SCORERS``).
SC_PREFIX, SC_QUEUE, SC_KV = 0, 1, 2
N_SCORERS = 3
# The fleet's float record ``fleet``: how stale the state the router sees is
# (its scrape period; 0: live), the routing latency added to each arrival,
# prefix affinity's load cap (requests above the least loaded replica), and
# the weighted router's weights.
FL_STALENESS, FL_LATENCY, FL_LOAD_CAP, FL_SCORERS = 0, 1, 2, 3
N_FLEET = FL_SCORERS + N_SCORERS
# A replica's state as the router sees it (`router.LOAD_*`, a row per replica).
LOAD_IN_SYSTEM, LOAD_WAITING, LOAD_RUNNING, LOAD_KV = 0, 1, 2, 3
N_LOAD = 4
# The fleet's columns after `COLUMNS`: load balance across replicas.
FLEET_COLUMNS = ("requests_per_replica_cv", "requests_per_replica_max_ratio",
                 "kv_utilization_spread", "queue_depth_spread")
N_FLEET_COLUMNS = len(FLEET_COLUMNS)


# --- autoscaling fleets (`autoscale`, `fastsim.Autoscaler`) -------------------
# The policy's record ``apar``: the metric (AS_METRIC_*), its target per replica, the evaluation
# period, the replica bounds, the provisioning delay, the scale-in cool-down, the replicas at time 0,
# HPA's tolerance (no change while |metric / (serving x target) - 1| <= it), replicas kept beyond
# the rule's, the GPUs of a replica.
(AS_METRIC, AS_TARGET, AS_INTERVAL, AS_MIN, AS_MAX, AS_DELAY, AS_COOLDOWN, AS_INITIAL, AS_TOLERANCE,
 AS_SPARE, AS_GPUS) = range(11)
N_APAR = 11
AS_METRIC_QUEUE_DEPTH, AS_METRIC_KV, AS_METRIC_RATE = 0, 1, 2
AS_METRIC_CODES = {"queue_depth": AS_METRIC_QUEUE_DEPTH, "kv_utilisation": AS_METRIC_KV,
                   "rate": AS_METRIC_RATE}
# A replica row's state: not held, starting (held, not yet serving), serving, draining (held, sent nothing)
REP_OFF, REP_PROVISIONING, REP_SERVING, REP_DRAINING = 0, 1, 2, 3
# One row per evaluation (at t_s, about the window ((k - 1) interval, k interval]): the replicas by
# state after the draining ones that emptied left, the metric's fleet total over the serving replicas,
# the replicas the rule asked for, waiting and in-system requests over every replica held, the
# arrivals of the window, and (after the run) how many of those arrivals met the scenario's SLOs.
WINDOW_COLUMNS = ("t_s", "replicas_serving", "replicas_provisioning", "replicas_draining", "metric",
                  "desired", "queue_depth", "in_system", "arrivals", "slo_met")
N_WINDOW_COLUMNS = len(WINDOW_COLUMNS)
(W_T, W_SERVING, W_PROVISIONING, W_DRAINING, W_METRIC, W_DESIRED, W_QUEUE, W_IN_SYSTEM, W_ARRIVALS,
 W_SLO_MET) = range(N_WINDOW_COLUMNS)
# The autoscaled fleet's columns after `COLUMNS` and `FLEET_COLUMNS`.
AUTOSCALE_COLUMNS = ("gpu_hours", "slo_violation_minutes", "replicas_mean", "replicas_peak", "scale_events")
N_AUTOSCALE_COLUMNS = len(AUTOSCALE_COLUMNS)
# `autoscale._simulate_autoscaled`: the window table is full (the caller grows it and runs again)
AS_WINDOWS_FULL = -900

# --- disaggregated prefill and decode (`disagg`) ------------------------------
# The decode router's random stream: the purpose after the prefill router's.
S_ROUTE_DECODE = S_ROUTE + 1
# The link's float record ``link``: each decode replica's inbound bandwidth
# (bytes per second; inf: instant), a transfer's fixed latency, the KV bytes
# of one prompt token, the decode router's prefix-affinity load cap and its
# weighted router's weights.
DL_BANDWIDTH, DL_LATENCY, DL_KV_BYTES, DL_LOAD_CAP, DL_SCORERS = 0, 1, 2, 3, 4
N_DLINK = DL_SCORERS + N_SCORERS
# The disaggregated server's columns after `COLUMNS`: the decode side's first
# token (what vLLM's proxy returns), the KV transfer (hand-off to arrival at
# the decode replica, waiting for the link included), and each pool's time averages.
DISAGG_COLUMNS = ("ttft_decode_mean", "ttft_decode_p50", "ttft_decode_p90", "ttft_decode_p95", "ttft_decode_p99",
                  "kv_transfer_mean", "kv_transfer_p50", "kv_transfer_p99",
                  "prefill_batch_occupancy_mean", "decode_batch_occupancy_mean",
                  "prefill_kv_utilization_mean", "decode_kv_utilization_mean",
                  "prefill_queue_depth_mean", "decode_queue_depth_mean")
N_DISAGG_COLUMNS = len(DISAGG_COLUMNS)
