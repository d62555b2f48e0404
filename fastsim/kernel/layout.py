"""The kernel's shared vocabulary: the slots of the parameter vectors, the
request statuses, the random streams, the metric columns and the run-level
accumulators. Python (`fastsim/_replicate.py`, the only writer of the
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
I_ARRIVAL_KIND = 13   # 0 renewal (gamma gaps), 1 given times
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
N_IPAR = 29


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
N_FPAR = 11


# --- layout of the latency record ``lat`` (the step-time coefficients, `latency`) ---
L_BASE = 0           # base_s
L_DECODE_SCALE = 1   # decode_scale_s
L_DECODE_ALPHA = 2   # decode_alpha
L_PREFILL = 3        # prefill_per_token_s
L_CTX = 4            # ctx_per_token_s
L_SWAP = 5           # swap_s_per_block
N_LAT = 6

# --- named codes, shared by Python (`fastsim/_replicate.py`) and the kernel ---
# ipar[I_POLICY]: the waiting queue's order
POLICY_FCFS, POLICY_PRIORITY, POLICY_SJF = 0, 1, 2
POLICY_CODES = {"fcfs": POLICY_FCFS, "priority": POLICY_PRIORITY, "sjf": POLICY_SJF}


# ipar[I_ADMISSION]: admission control at arrival
ADMISSION_NONE, ADMISSION_QUEUE_LIMIT, ADMISSION_KV_RESERVATION = 0, 1, 2
ADMISSION_CODES = {"none": ADMISSION_NONE, "queue_limit": ADMISSION_QUEUE_LIMIT,
                   "kv_reservation": ADMISSION_KV_RESERVATION}
# ipar[I_ARRIVAL_KIND]: renewal process (gamma gaps), given times, or multi-user
ARRIVAL_RENEWAL, ARRIVAL_GIVEN, ARRIVAL_MULTI_USER = 0, 1, 2
# ipar[I_TRACE_MODE]: lengths from the laws, or rows of a trace replayed in order or sampled
TRACE_NONE, TRACE_REPLAY, TRACE_SAMPLE = 0, 1, 2
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
N_STREAMS = 11


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
 ROUTER_LEAST_KV, ROUTER_PREFIX_AFFINITY, ROUTER_SESSION_AFFINITY) = range(9)
ROUTER_CODES = {"random": ROUTER_RANDOM, "round_robin": ROUTER_ROUND_ROBIN,
                "least_outstanding": ROUTER_LEAST_OUTSTANDING, "vllm_dp": ROUTER_VLLM_DP, "jsq": ROUTER_JSQ,
                "power_of_two": ROUTER_POWER_OF_TWO, "least_kv": ROUTER_LEAST_KV,
                "prefix_affinity": ROUTER_PREFIX_AFFINITY, "session_affinity": ROUTER_SESSION_AFFINITY}
# The fleet's float record ``fleet``: how stale the state the router sees is
# (its scrape period; 0: live), the routing latency added to each arrival,
# and prefix affinity's load cap (requests above the least loaded replica).
FL_STALENESS, FL_LATENCY, FL_LOAD_CAP = 0, 1, 2
N_FLEET = 3
# A replica's state as the router sees it (`router.LOAD_*`, a row per replica).
LOAD_IN_SYSTEM, LOAD_WAITING, LOAD_RUNNING, LOAD_KV = 0, 1, 2, 3
N_LOAD = 4
# The fleet's columns after `COLUMNS`: load balance across replicas.
FLEET_COLUMNS = ("requests_per_replica_cv", "requests_per_replica_max_ratio",
                 "kv_utilization_spread", "queue_depth_spread")
N_FLEET_COLUMNS = len(FLEET_COLUMNS)
