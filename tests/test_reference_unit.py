"""Hand-computed unit tests of the pure-Python reference simulator.

Every expected value below is derived on paper from ``docs/engine-model.md``;
the derivation is written next to the test. Times use dyadic step lengths
(1.0, 0.125, 2**-4 per token, ...) so that they are exact in binary floating
point and can be compared with ``==``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest


from conftest import legacy_engine as EngineConfig  # (V1 switches off unless a case sets them: the model its times were derived in)
from fastsim._latency import LatencyModel
from fastsim._reference import (COMPLETED, DROPPED, NOT_ARRIVED, REJECTED_ADMISSION,
                                REJECTED_TOO_LONG, UNFINISHED, simulate_reference)

ONE = LatencyModel.constant(1.0)


def run(reqs, engine=None, latency=ONE, horizon_s=None):
    """reqs: list of (arrival, prompt_len, output_len[, priority])."""
    reqs = [tuple(r) + (0,) * (4 - len(r)) for r in reqs]
    a, p, o, c = (np.array(col) for col in zip(*reqs))
    return simulate_reference(a.astype(float), p, o, c, engine or EngineConfig(), latency,
                              horizon_s=horizon_s)


# --------------------------------------------------------------------- basics
def test_single_request_constant_latency():
    # a = 1, P = 5, O = 3, every step 0.01 s.
    # step 1 [1.00, 1.01): prefill 5 tokens -> k = 5 = P + 0 -> first token at 1.01
    # step 2: decode -> g = 2 at 1.02; step 3: decode -> g = 3 = O -> completes at 1.03.
    r = run([(1.0, 5, 3)], latency=LatencyModel.constant(0.01))
    assert r["status"].tolist() == [COMPLETED]
    assert r["first_token_s"][0] == pytest.approx(1.01)
    assert r["finish_s"][0] == pytest.approx(1.03)
    assert r["itl_max_s"][0] == pytest.approx(0.01)
    assert r["num_tokens"].tolist() == [3]
    assert r["num_steps"] == 3
    assert r["end_s"] == pytest.approx(1.03)
    # KV: at most P + O - 1 = 7 tokens -> 1 block of 16
    assert r["max_blocks_used"] == 1 and r["blocks_used_at_end"] == 0
    assert r["total_preemptions"] == 0


def test_single_token_output_has_no_itl():
    # O = 1: the prefill step emits the only token and completes the request.
    r = run([(0.0, 8, 1)])
    assert r["first_token_s"][0] == 1.0 and r["finish_s"][0] == 1.0
    assert math.isnan(r["itl_max_s"][0]) and r["num_tokens"][0] == 1


def test_idle_jump_to_next_arrival():
    # R0 at 0 runs steps [0,1), [1,2); the engine is then idle and jumps to a = 10.
    r = run([(0.0, 4, 2), (10.0, 4, 2)])
    assert r["finish_s"].tolist() == [2.0, 12.0]
    assert r["first_token_s"].tolist() == [1.0, 11.0]
    assert r["num_steps"] == 4 and r["end_s"] == 12.0


def test_queueing_with_one_seat():
    # max_num_seqs = 1, both at t = 0 (P = 4, O = 2, steps of 0.125 s).
    # R0: prefill [0, .125) -> token, decode [.125, .25) -> completes at .25.
    # R1 waits (1 running = max_num_seqs), is admitted at .25: first .375, done .5.
    eng = EngineConfig(max_num_seqs=1)
    r = run([(0.0, 4, 2), (0.0, 4, 2)], eng, LatencyModel.constant(0.125))
    assert r["first_token_s"].tolist() == [0.125, 0.375]
    assert r["finish_s"].tolist() == [0.25, 0.5]
    assert r["num_steps"] == 4 and r["end_s"] == 0.5


def test_continuous_batching_joins_running_batch():
    # max_num_seqs = 2: R1 arriving at 0.5 (during step 1) is ingested at t = 1 and
    # joins the batch at step 2 [1, 2): first token at 2, while R0 keeps decoding.
    r = run([(0.0, 4, 4), (0.5, 4, 2)], EngineConfig(max_num_seqs=2))
    assert r["first_token_s"].tolist() == [1.0, 2.0]
    assert r["finish_s"].tolist() == [4.0, 3.0]


# -------------------------------------------------------------- chunked prefill
def test_chunked_prefill_splits_long_prompt():
    # P = 100, O = 2, budget 32: chunks 32, 32, 32, 4 -> first token at the end of
    # the 4th step, then one decode step.
    eng = EngineConfig(max_num_seqs=8, max_num_batched_tokens=32)
    r = run([(0.0, 100, 2)], eng)
    assert r["first_token_s"][0] == 4.0 and r["finish_s"][0] == 5.0
    assert r["num_steps"] == 5


def test_latency_model_counts():
    # Same run with L = 0.5 + n_prefill / 64 + n_ctx / 1024 (decode_scale 0):
    # step 1: prefill 32, ctx  32 -> 0.5 + 0.5    + 0.03125     = 1.03125
    # step 2: prefill 32, ctx  64 -> 0.5 + 0.5    + 0.0625      = 1.0625
    # step 3: prefill 32, ctx  96 -> 0.5 + 0.5    + 0.09375     = 1.09375
    # step 4: prefill  4, ctx 100 -> 0.5 + 0.0625 + 0.09765625  = 0.66015625
    #   first token at 3.84765625
    # step 5: decode (g = 1, k = 100 = P + g - 1, s = 1): n_decode = 1,
    #   no prefill tokens, ctx = k + s = 101 -> 0.5 + 101/1024 = 0.5986328125
    #   finish at 4.4462890625
    lat = LatencyModel(base_s=0.5, prefill_per_token_s=2.0**-6, ctx_per_token_s=2.0**-10)
    r = run([(0.0, 100, 2)], EngineConfig(max_num_seqs=8, max_num_batched_tokens=32), lat)
    assert r["first_token_s"][0] == 3.84765625
    assert r["finish_s"][0] == 4.4462890625


def test_decode_count_uses_decode_scale():
    # Two requests P = 4, O = 3 at 0; L = 1 + 0.5 * max(n_decode - 1, 0).
    # step 1: both prefill (n_decode = 0) -> 1;  steps 2, 3: n_decode = 2 -> 1.5 each.
    lat = LatencyModel(base_s=1.0, decode_scale_s=0.5, decode_alpha=1.0)
    r = run([(0.0, 4, 3), (0.0, 4, 3)], latency=lat)
    assert r["first_token_s"].tolist() == [1.0, 1.0]
    assert r["finish_s"].tolist() == [4.0, 4.0]
    assert r["itl_max_s"].tolist() == [1.5, 1.5]


@pytest.mark.parametrize("chunked, expected_first", [
    # chunked off, budget 64; R0 P=40, R1 P=60, R2 P=4 (all O = 10, a = 0):
    #   step 1: R0 admitted (40, B = 24); R1 need 60 > 24 -> stop admitting, so R2
    #           is not admitted either (head of line). R0 token at 1.
    #   step 2: R0 decodes (1, B = 63); R1 60 (B = 3); R2 need 4 > 3 -> stop.
    #   step 3: R0 1, R1 1, R2 4 -> R2 first token at 3.
    (False, [1.0, 2.0, 3.0]),
    # chunked on: step 1: R0 40, R1 24 (B = 0). step 2: R0 1, R1 36, R2 4 (B = 23)
    #   -> R1 and R2 first tokens at 2.
    (True, [1.0, 2.0, 2.0]),
])
def test_chunked_prefill_off_prompt_does_not_fit_leftover_budget(chunked, expected_first):
    eng = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, enable_chunked_prefill=chunked)
    r = run([(0.0, 40, 10), (0.0, 60, 4), (0.0, 4, 10)], eng)
    assert r["first_token_s"].tolist() == expected_first
    assert (r["status"] == COMPLETED).all()


# ------------------------------------------------------------------ preemption
def _tight_kv(policy, **kw):
    # block_size 4, 4 blocks (16 tokens). R0 (c = 1) and R1 (c = 0): P = 4, O = 6 at 0.
    # step 1: both prefill 4 tokens (1 block each) -> first tokens at 1 (k = 4, g = 1).
    # step 2: k + s = 5 -> 2 blocks each (4 used).  steps 3-5: k + s = 6, 7, 8 -> 2 blocks.
    # step 6 (t = 5): R0 needs k + s = 9 -> a 3rd block; none free -> preempt.
    return EngineConfig(block_size=4, num_gpu_blocks=4, policy=policy, **kw)


def test_preemption_fcfs_victim_is_last_admitted():
    # fcfs: victim = last of running = R1 (frees 2 blocks, k := 0, g = 5 kept).
    #   R0 allocates its 3rd block, decodes -> g = 6 = O, completes at 6.
    #   No admission in the preempting step. step 7 (t = 6): R1 re-admitted with
    #   need = P + g = 9 (3 blocks), recompute -> k = 9 = P + g -> emits 6th token,
    #   completes at 7.
    r = run([(0.0, 4, 6, 1), (0.0, 4, 6, 0)], _tight_kv("fcfs"))
    assert r["finish_s"].tolist() == [6.0, 7.0]
    assert r["num_preemptions"].tolist() == [0, 1]
    assert r["total_preemptions"] == 1
    assert r["num_tokens"].tolist() == [6, 6]
    assert r["first_token_s"].tolist() == [1.0, 1.0]
    # R1's tokens at 1..5, then 7: the largest gap spans the preemption.
    assert r["itl_max_s"].tolist() == [1.0, 2.0]
    assert r["max_blocks_used"] == 4 and r["blocks_used_at_end"] == 0
    assert r["num_steps"] == 7


def test_preemption_recomputes_prompt_and_generated_tokens():
    # Same as above with L = 1 + n_prefill / 16:
    # step 1: 8 prefill tokens -> 1.5; steps 2-6: decodes only -> 1.0 each
    #   (t = 2.5, 3.5, 4.5, 5.5, 6.5); R0 completes at 6.5.
    # step 7: R1 recomputes P + g = 4 + 5 = 9 tokens -> 1 + 9/16 = 1.5625 -> 8.0625.
    lat = LatencyModel(base_s=1.0, prefill_per_token_s=2.0**-4)
    r = run([(0.0, 4, 6, 1), (0.0, 4, 6, 0)], _tight_kv("fcfs"), lat)
    assert r["finish_s"].tolist() == [6.5, 8.0625]


def test_fcfs_preempted_request_goes_to_the_front():
    # The fcfs tight-KV case plus R2 (P=5, O=1: 2 blocks) arriving at 4.5, ingested
    # at t = 5; max_num_seqs 3. At t = 5 R1 is preempted and goes *in front of* R2:
    # waiting = [R1, R2]. (No admission in that step.) R0 completes at 6.
    # t = 6: R1 (need 9 -> 3 blocks of 4 free) admitted; R2 needs 2 > 1 free -> stop.
    #   R1 completes at 7. t = 7: R2 prefill -> done at 8.
    # (Were R1 put at the back, R2 would be done at 7 and R1 at 8.)
    eng = _tight_kv("fcfs", max_num_seqs=3)
    r = run([(0.0, 4, 6, 1), (0.0, 4, 6, 0), (4.5, 5, 1, 0)], eng)
    assert r["finish_s"].tolist() == [6.0, 7.0, 8.0]
    assert r["num_preemptions"].tolist() == [0, 1, 0]


def test_no_admission_in_a_step_with_a_preemption():
    # sjf, max_num_seqs 3. R0, R1 (P=4, O=6) as in the tight-KV case; R2 (P=1, O=1)
    # arrives at 4.5, is ingested at 5 and heads the sjf queue (O = 1).
    # t = 5: R0 needs a 3rd block -> sjf victim = last admitted = R1 (back to the
    #   queue behind R2, key O = 6). One block is free and R2 needs one, but
    #   nothing is admitted in a step with a preemption. R0 completes at 6.
    # t = 6: R2 (1 block) and R1 (need 9 -> 3 blocks) both admitted -> both at 7.
    # (Admitting R2 at t = 5 would finish it at 6.)
    eng = _tight_kv("sjf", max_num_seqs=3)
    r = run([(0.0, 4, 6, 1), (0.0, 4, 6, 0), (4.5, 1, 1, 0)], eng)
    assert r["finish_s"].tolist() == [6.0, 7.0, 7.0]
    assert r["num_preemptions"].tolist() == [0, 1, 0]


def test_preempted_request_is_not_abandoned():
    # fcfs case with D = 0.5: R1 waits from t = 5 after its preemption (a + D = 0.5
    # <= t) but it has been scheduled before, so it is not dropped.
    r = run([(0.0, 4, 6, 1), (0.0, 4, 6, 0)], _tight_kv("fcfs", max_queue_delay_s=0.5))
    assert r["status"].tolist() == [COMPLETED, COMPLETED]
    assert r["finish_s"].tolist() == [6.0, 7.0]


def test_preemption_priority_victim_is_least_urgent():
    # priority: victim = largest (c, index) = R0 (c = 1) = the request being scheduled
    #   itself -> R0 frees its 2 blocks, goes back to waiting, scheduling of running
    #   requests stops; nothing was scheduled -> zero-duration step at t = 5.
    # next step, still t = 5: R1 k + s = 9 -> 3rd block (2 free) ok; waiting R0
    #   need = 4 + 5 = 9 -> 3 blocks > 1 free -> not admitted. R1 completes at 6.
    # t = 6: R0 recomputes 9 tokens -> emits its 6th token, completes at 7.
    r = run([(0.0, 4, 6, 1), (0.0, 4, 6, 0)], _tight_kv("priority"))
    assert r["finish_s"].tolist() == [7.0, 6.0]
    assert r["num_preemptions"].tolist() == [1, 0]
    assert r["num_steps"] == 7  # the zero-duration step is not counted


def test_priority_preemption_of_already_scheduled_victim_refunds_budget():
    # block_size 8, 4 blocks, budget 12, policy priority, L = 1 + n_prefill / 16.
    # A: a=0,  c=5, P=7,  O=10.   B: a=0.5, c=0, P=8, O=10.   C: a=0.5, c=1, P=20, O=2.
    # step 1 (t=0): A prefill 7 (1 block) -> d = 1 + 7/16 = 1.4375; B, C arrive
    #   during it and are ingested at 1.4375 (waiting order B, C).
    # step 2 (t=1.4375): A decodes (k+s = 8, 1 block); B admitted 8 (1 block);
    #   C gets the last 3 tokens (1 block). 3 blocks used. d = 1 + 11/16 = 1.6875.
    # step 3 (t=3.125), 1 block free: A (k+s = 9) takes it, B = 11. B (k+s = 9)
    #   needs one: victim = max (c, index) = A, already scheduled -> its token is
    #   refunded (B = 12), its 2 blocks freed, the cursor moves back; B fits
    #   (B = 11). C: s = min(17, 11) = 11, k+s = 14 -> 2 blocks, fits.
    #   n_decode = 1 (B), n_prefill = 11 -> d = 1.6875 -> step ends at 4.8125.
    #   (Without the refund C would get 10 -> 4.75; without moving the cursor
    #   back C would be skipped -> 4.125.)
    # horizon 4 stops the run at that boundary.
    eng = EngineConfig(block_size=8, num_gpu_blocks=4, max_num_batched_tokens=12,
                       max_num_seqs=8, policy="priority")
    lat = LatencyModel(base_s=1.0, prefill_per_token_s=2.0**-4)
    r = run([(0.0, 7, 10, 5), (0.5, 8, 10, 0), (0.5, 20, 2, 1)], eng, lat, horizon_s=4.0)
    assert r["end_s"] == 4.8125
    assert r["num_preemptions"].tolist() == [1, 0, 0]
    assert r["status"].tolist() == [UNFINISHED] * 3
    assert r["first_token_s"][:2].tolist() == [1.4375, 3.125]
    assert r["num_tokens"].tolist() == [2, 2, 0]
    assert r["itl_max_s"][1] == 1.6875
    # blocks at the end: B (k = 9 -> 2) + C (k = 14 -> 2); A holds none
    assert r["blocks_used_at_end"] == 4 and r["max_blocks_used"] == 4


# ------------------------------------------------------------- waiting order
@pytest.mark.parametrize("policy, order", [
    ("fcfs", [0, 1, 2]),       # arrival order
    ("priority", [1, 2, 0]),   # c = (2, 0, 1)
    ("sjf", [2, 1, 0]),        # O = (5, 3, 1)
])
def test_waiting_order_by_policy(policy, order):
    # max_num_seqs = 1, all at 0: requests run one after another in policy order.
    r = run([(0.0, 4, 5, 2), (0.0, 4, 3, 0), (0.0, 4, 1, 1)],
            EngineConfig(max_num_seqs=1, policy=policy))
    assert np.argsort(r["finish_s"]).tolist() == order
    assert r["finish_s"].max() == 9.0  # 5 + 3 + 1 steps in total


# --------------------------------------------------------- admission control
def test_queue_limit_loss_system():
    # queue_limit, max_num_seqs 1, max_waiting 0 (loss system). R0 (P=4, O=2) at 0
    # runs [0,1), [1,2) and completes at 2.
    # R1 at 0: running + waiting = 1 >= 1 -> rejected.
    # R2 at 1.5 < 2: ingested at 2 *before* R0's completion -> sees R0 -> rejected.
    # R3 at 2.0 exactly: ingested after the completion -> accepted, done at 4.
    eng = EngineConfig(max_num_seqs=1, admission="queue_limit", max_waiting=0)
    r = run([(0.0, 4, 2), (0.0, 4, 2), (1.5, 4, 2), (2.0, 4, 2)], eng)
    assert r["status"].tolist() == [COMPLETED, REJECTED_ADMISSION, REJECTED_ADMISSION, COMPLETED]
    assert r["finish_s"][3] == 4.0
    assert np.isnan(r["finish_s"][1]) and np.isnan(r["first_token_s"][1])
    assert r["num_tokens"][1] == 0


def test_queue_limit_counts_waiting_places():
    # max_num_seqs 1, max_waiting 2: capacity 3 at once; 5 simultaneous -> 2 rejected.
    eng = EngineConfig(max_num_seqs=1, admission="queue_limit", max_waiting=2)
    r = run([(0.0, 4, 2)] * 5, eng)
    assert r["status"].tolist() == [COMPLETED] * 3 + [REJECTED_ADMISSION] * 2


def test_kv_reservation():
    # capacity 4 blocks * 4 = 16 tokens; each request reserves P + O tokens.
    # R0 (4+6 = 10) accepted; R1 (10) -> 20 > 16 rejected; R2 (2+4 = 6) -> 16 <= 16 ok.
    # Timeline (1 s steps): R2 tokens at 1..4 (done 4), R0 tokens at 1..6 (done 6).
    # R3 (10) arrives at 5.0 = a step boundary: reservations 10 held -> rejected.
    # R4 (10) arrives at 6.0 = R0's completion boundary, ingested after it -> ok,
    #   runs [6, 12).
    eng = EngineConfig(block_size=4, num_gpu_blocks=4, admission="kv_reservation")
    r = run([(0.0, 4, 6), (0.0, 4, 6), (0.0, 2, 4), (5.0, 4, 6), (6.0, 4, 6)], eng)
    assert r["status"].tolist() == [COMPLETED, REJECTED_ADMISSION, COMPLETED,
                                    REJECTED_ADMISSION, COMPLETED]
    assert r["finish_s"][[0, 2, 4]].tolist() == [6.0, 4.0, 12.0]


def test_kv_reservation_sees_requests_finishing_at_the_boundary():
    # R0 (10 tokens reserved) completes at 6; R1 (10) arriving at 5.5 is ingested at
    # 6 before that completion, so R0's reservation still counts -> rejected.
    eng = EngineConfig(block_size=4, num_gpu_blocks=4, admission="kv_reservation")
    r = run([(0.0, 4, 6), (5.5, 4, 6)], eng)
    assert r["status"].tolist() == [COMPLETED, REJECTED_ADMISSION]


def test_too_long_by_max_model_len():
    # P + O = 11 > 10 rejected; 10 accepted. too_long wins over admission control.
    eng = EngineConfig(max_model_len=10, admission="queue_limit", max_waiting=0, max_num_seqs=1)
    r = run([(0.0, 5, 5), (0.0, 5, 6)], eng)
    assert r["status"].tolist() == [COMPLETED, REJECTED_TOO_LONG]
    assert np.isnan(r["finish_s"][1]) and r["num_tokens"][1] == 0


def test_too_long_by_kv_size():
    # 2 blocks of 4 = 8 tokens: P + O - 1 = 8 fits (2 blocks); 9 needs 3 > 2.
    eng = EngineConfig(block_size=4, num_gpu_blocks=2)
    r = run([(0.0, 5, 4), (0.0, 5, 5)], eng)
    assert r["status"].tolist() == [COMPLETED, REJECTED_TOO_LONG]
    assert r["max_blocks_used"] == 2


@pytest.mark.parametrize("chunked, expected", [(False, REJECTED_TOO_LONG), (True, COMPLETED)])
def test_too_long_by_budget_without_chunked_prefill(chunked, expected):
    # budget 8: P + O - 1 = 8 always ok; 9 > 8 rejected only with chunked prefill off.
    eng = EngineConfig(max_num_seqs=8, max_num_batched_tokens=8, enable_chunked_prefill=chunked)
    r = run([(0.0, 5, 4), (0.0, 5, 5)], eng)
    assert r["status"].tolist() == [COMPLETED, expected]


# ---------------------------------------------------------------- abandonment
def test_abandonment():
    # max_num_seqs 1, D = 2.5. R0 (P=4, O=5) at 0 runs steps ending 1..5.
    # R1 at 0: deadline 2.5; step starts are 1, 2, 3 -> dropped at t = 3.
    # R2 at 0.5: deadline 3.0 <= 3 -> dropped at t = 3 as well (<= is inclusive).
    # R3 at 4.0: deadline 6.5; at the step start 5 (R0 completed) it is admitted:
    #   P=4, O=1 -> done at 6.
    eng = EngineConfig(max_num_seqs=1, max_queue_delay_s=2.5)
    r = run([(0.0, 4, 5), (0.0, 4, 1), (0.5, 4, 1), (4.0, 4, 1)], eng)
    assert r["status"].tolist() == [COMPLETED, DROPPED, DROPPED, COMPLETED]
    assert r["finish_s"].tolist() == [5.0, 3.0, 3.0, 6.0]
    assert r["num_tokens"].tolist() == [5, 0, 0, 1]
    assert np.isnan(r["first_token_s"][1])


def test_abandonment_empties_the_system_then_idle_jump():
    # max_num_seqs 1, D = 1: R0 (P=4, O=3) at 0 done at 3; R1 at 0 dropped at t = 1;
    # R2 at 10 starts after the idle jump: done at 11.
    eng = EngineConfig(max_num_seqs=1, max_queue_delay_s=1.0)
    r = run([(0.0, 4, 3), (0.0, 4, 1), (10.0, 4, 1)], eng)
    assert r["status"].tolist() == [COMPLETED, DROPPED, COMPLETED]
    assert r["finish_s"].tolist() == [3.0, 1.0, 11.0]


# ------------------------------------------------------------ static batching
def test_static_batching_completion_times():
    # max_num_seqs 2; R0 (P=4, O=2), R1 (P=4, O=4), R2 (P=4, O=1) all at 0.
    # L = 1 + 0.5 * max(n_decode - 1, 0): padding decodes count in n_decode.
    # batch {R0, R1}: step 1 prefill (n_decode 0) -> 1; step 2 both decode -> 1.5
    #   (t = 2.5, R0 has all its tokens); steps 3, 4: R0 pads + R1 decodes, n_decode
    #   2 -> 1.5 each (t = 4, 5.5). R1's 4th token at 5.5 -> both complete at 5.5.
    # batch {R2} at 5.5: prefill -> 6.5.
    eng = EngineConfig(max_num_seqs=2, scheduler="static")
    lat = LatencyModel(base_s=1.0, decode_scale_s=0.5, decode_alpha=1.0)
    r = run([(0.0, 4, 2), (0.0, 4, 4), (0.0, 4, 1)], eng, lat)
    assert r["first_token_s"].tolist() == [1.0, 1.0, 6.5]
    assert r["finish_s"].tolist() == [5.5, 5.5, 6.5]
    assert r["itl_max_s"][0] == 1.5  # tokens at 1, 2.5: padding emits nothing
    assert r["num_tokens"].tolist() == [2, 4, 1]
    assert r["num_steps"] == 5


def test_static_batching_reserves_blocks_up_front():
    # block_size 4, 4 blocks. R0 (P=4, O=6) reserves ceil(9/4) = 3 blocks, R1 the
    # same -> does not fit beside R0 -> batch formation stops (R2, 1 block, is
    # behind R1 and is not taken either). R0 alone: 6 steps, done at 6.
    # batch 2 at 6: R1 (3) + R2 (P=2, O=2: 1 block): R1 done at 12, R2's tokens at
    # 7, 8 but it completes with the batch at 12.
    eng = EngineConfig(block_size=4, num_gpu_blocks=4, max_num_seqs=2, scheduler="static")
    r = run([(0.0, 4, 6), (0.0, 4, 6), (0.0, 2, 2)], eng)
    assert r["finish_s"].tolist() == [6.0, 12.0, 12.0]
    assert r["first_token_s"].tolist() == [1.0, 7.0, 7.0]
    assert r["max_blocks_used"] == 4 and r["total_preemptions"] == 0
    assert r["blocks_used_at_end"] == 0


def test_static_batch_that_could_never_finish_is_refused_up_front():
    # budget 2 < batch size 3: R0 and R1 would take the budget every step (decode,
    # then padding) and R2 would never be scheduled. EngineConfig refuses such a
    # budget (as vLLM does), so the livelock cannot be configured.
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= max_num_seqs"):
        EngineConfig(max_num_seqs=3, max_num_batched_tokens=2, scheduler="static")


# -------------------------------------------------------------------- horizon
def test_horizon_leaves_unfinished_requests():
    # H = 3.5, max_num_seqs 2, 1 s steps.
    # R0 (P=4, O=10) at 0: running at the stop.    R1 (P=4, O=4) at 0: done at 4.
    # R2 at 3.4 < H: ingested at 4, still waiting (full batch) -> unfinished.
    # R3 at 5.0 >= H: does not exist.
    # Steps end at 1, 2, 3, 4; the first boundary >= 3.5 is 4.
    r = run([(0.0, 4, 10), (0.0, 4, 4), (3.4, 4, 1), (5.0, 4, 1)],
            EngineConfig(max_num_seqs=2), horizon_s=3.5)
    assert r["status"].tolist() == [UNFINISHED, COMPLETED, UNFINISHED, NOT_ARRIVED]
    assert r["end_s"] == 4.0 and r["num_steps"] == 4
    assert r["num_tokens"].tolist() == [4, 4, 0, 0]
    assert r["first_token_s"][0] == 1.0 and np.isnan(r["finish_s"][0])
    assert r["finish_s"][1] == 4.0
    assert r["blocks_used_at_end"] == 1  # R0: k = 7 tokens -> 1 block of 16


def test_horizon_after_drain():
    # Everything finishes before H; nothing arrives later: the run ends drained.
    r = run([(0.0, 4, 2)], horizon_s=100.0)
    assert r["status"].tolist() == [COMPLETED] and r["end_s"] == 2.0


# -------------------------------------------------------- random-stream checks
CONFIGS = [
    dict(),
    dict(policy="priority"),
    dict(policy="sjf", enable_chunked_prefill=False),
    dict(admission="queue_limit", max_waiting=4),
    dict(admission="kv_reservation", policy="priority"),
    dict(max_queue_delay_s=0.5, max_model_len=300),
    dict(scheduler="static"),
    dict(scheduler="static", policy="sjf", max_queue_delay_s=1.0),
]


@pytest.mark.parametrize("overrides", CONFIGS)
@pytest.mark.parametrize("horizon_s", [None, 15.0])
def test_random_stream_conservation(overrides, horizon_s):
    rng = np.random.default_rng(12345)
    n = 300
    arrivals = np.cumsum(rng.exponential(1 / 15.0, n))
    prompt = rng.integers(1, 200, n)
    output = rng.integers(1, 120, n)
    prio = rng.integers(0, 3, n)
    kw = dict(max_num_seqs=16, max_num_batched_tokens=256, block_size=16, num_gpu_blocks=40)
    kw.update(overrides)
    eng = EngineConfig(**kw)
    lat = LatencyModel(base_s=0.01, decode_scale_s=1e-4, decode_alpha=1.2,
                       prefill_per_token_s=2e-5, ctx_per_token_s=1e-6)
    r = simulate_reference(arrivals, prompt, output, prio, eng, lat, horizon_s=horizon_s)
    st = r["status"]
    exists = arrivals < horizon_s if horizon_s is not None else np.ones(n, bool)
    # every arrival has exactly one final status; non-arrivals are marked as such
    assert set(st[exists].tolist()) <= {COMPLETED, REJECTED_TOO_LONG, REJECTED_ADMISSION,
                                        DROPPED, UNFINISHED}
    assert (st[~exists] == NOT_ARRIVED).all()
    done = st == COMPLETED
    assert done.sum() > 0
    assert (r["num_tokens"][done] == output[done]).all()
    assert (r["first_token_s"][done] > arrivals[done]).all()
    assert (r["finish_s"][done] >= r["first_token_s"][done]).all()
    assert (r["finish_s"][done] <= r["end_s"]).all()
    rejected = (st == REJECTED_TOO_LONG) | (st == REJECTED_ADMISSION)
    assert np.isnan(r["finish_s"][rejected]).all() and (r["num_tokens"][rejected] == 0).all()
    dropped = st == DROPPED
    assert (r["num_tokens"][dropped] == 0).all()
    if eng.max_queue_delay_s is not None:
        assert (r["finish_s"][dropped] >= arrivals[dropped] + eng.max_queue_delay_s).all()
    unfinished = st == UNFINISHED
    assert np.isnan(r["finish_s"][unfinished]).all()
    if eng.scheduler == "static":
        # a static-batch member may have all its tokens and be padding at the stop
        assert (r["num_tokens"][unfinished] <= output[unfinished]).all()
    else:
        assert (r["num_tokens"][unfinished] < output[unfinished]).all()
    # too_long rule 2 (KV size): ceil((P + O - 1) / 16) > 40, i.e. P + O - 1 > 640:
    # impossible here, so too_long only comes from max_model_len / the budget rule
    if eng.max_model_len is None and eng.enable_chunked_prefill:
        assert not (st == REJECTED_TOO_LONG).any()
    # itl: defined iff >= 2 tokens
    assert (np.isnan(r["itl_max_s"]) == (r["num_tokens"] < 2)).all()
    # KV accounting
    assert 0 < r["max_blocks_used"] <= eng.num_gpu_blocks
    if horizon_s is None:
        assert not unfinished.any()
        assert r["blocks_used_at_end"] == 0
    else:
        assert r["end_s"] >= horizon_s
        assert 0 <= r["blocks_used_at_end"] <= eng.num_gpu_blocks
    assert r["total_preemptions"] == r["num_preemptions"].sum()
    if eng.scheduler == "static":
        assert r["total_preemptions"] == 0
    assert r["num_steps"] > 0


def test_random_stream_tight_kv_preempts():
    # A small cache under load must preempt, and every request still completes.
    rng = np.random.default_rng(7)
    n = 200
    arrivals = np.cumsum(rng.exponential(1 / 30.0, n))
    prompt = rng.integers(1, 100, n)
    output = rng.integers(1, 100, n)
    for policy in ("fcfs", "priority", "sjf"):
        eng = EngineConfig(max_num_seqs=32, max_num_batched_tokens=128, block_size=8,
                           num_gpu_blocks=30, policy=policy)
        r = simulate_reference(arrivals, prompt, output, rng.integers(0, 4, n), eng,
                               LatencyModel.constant(0.02))
        assert r["total_preemptions"] > 0
        assert (r["status"] == COMPLETED).all()
        assert (r["num_tokens"] == output).all()
        assert r["max_blocks_used"] <= 30 and r["blocks_used_at_end"] == 0
