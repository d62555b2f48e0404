"""fastsim against exact queueing theory (the figures quoted in README.md).

    python experiments/theory_checks.py [--replications 1000] [--seed 0] [--quick]

``--quick`` (20 replications of 1,000 requests per row, a few seconds) checks
that the script runs; its intervals are too wide to say much.

* M/G/1: ``max_num_seqs=1``, constant step ``d``, 1-token prompts: TTFT =
  Wq + d with Wq from Pollaczek-Khinchine.
* Erlang-B: ``admission="queue_limit", max_waiting=0``. Exact for one seat
  (M/G/1/1). With c > 1 seats an arrival during a step waits for the step
  boundary (as in vLLM), which adds 0 <= R < d to each sojourn: blocking lies
  between B(c, lambda E[O] d) and B(c, lambda (E[O] + 1) d).
"""

import argparse

import pandas as pd

import fastsim
from fastsim.testing import erlang_b, mg1_mean_wait

STEP = 0.01


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replications", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="20 replications of 1,000 requests per row")
    args = ap.parse_args(argv)
    n_requests, warmup = (1000, 100) if args.quick else (4000, 500)
    if args.quick:
        args.replications = 20
    rows = []
    for rho in (0.5, 0.8):
        for law in (fastsim.Fixed(10), fastsim.Uniform(1, 19), fastsim.LogNormal(8, 0.8)):
            lam = rho / (law.mean() * STEP)
            sc = fastsim.Scenario(
                engine=fastsim.EngineConfig.synchronous(max_num_seqs=1),
                workload=fastsim.Workload(arrival_rate=lam, num_requests=n_requests, prompt_len=1, output_len=law,
                                          warmup_requests=warmup),
                latency=fastsim.LatencyModel.constant(STEP))
            res = fastsim.replicate(sc, args.replications, seed=args.seed)
            truth = mg1_mean_wait(lam, law.mean() * STEP, law.second_moment() * STEP**2) + STEP
            ci = res.confidence_interval("ttft_mean")
            rows.append({"check": f"M/G/1 mean TTFT, rho={rho}, O~{law}", "theory": truth,
                         "estimate": res.estimate("ttft_mean"), "ci_low": ci.low, "ci_high": ci.high,
                         "covered": truth in ci})
    for c, a, law in ((1, 0.9, fastsim.Fixed(12)), (1, 0.9, fastsim.LogNormal(8, 0.9)),
                      (4, 3.0, fastsim.Uniform(10, 30)), (8, 6.0, fastsim.Fixed(40))):
        lam = a / (law.mean() * STEP)
        sc = fastsim.Scenario(
            engine=fastsim.EngineConfig.synchronous(max_num_seqs=c, admission="queue_limit", max_waiting=0),
            workload=fastsim.Workload(arrival_rate=lam, num_requests=n_requests, prompt_len=1, output_len=law,
                                      warmup_requests=min(100, warmup)),
            latency=fastsim.LatencyModel.constant(STEP))
        res = fastsim.replicate(sc, args.replications, seed=args.seed)
        ci = res.confidence_interval("blocking_probability")
        low = erlang_b(c, a)
        high = erlang_b(c, lam * (law.mean() + 1) * STEP) if c > 1 else low
        rows.append({"check": f"Erlang-B blocking, c={c}, a={a}, O~{law}",
                     "theory": low if c == 1 else f"[{low:.4f}, {high:.4f}]",
                     "estimate": res.estimate("blocking_probability"), "ci_low": ci.low, "ci_high": ci.high,
                     "covered": (low in ci) if c == 1 else (ci.high >= low and ci.low <= high)})
    with pd.option_context("display.width", 200, "display.max_colwidth", 80,
                           "display.float_format", "{:.5f}".format):
        print(pd.DataFrame(rows).to_string(index=False))
    return pd.DataFrame(rows)


if __name__ == "__main__":
    main()
