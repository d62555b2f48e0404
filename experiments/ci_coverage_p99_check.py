"""Coverage of the p99 TTFT interval for 8,000-request M/D/1 runs with more
replications per call (the weakest case of ci_coverage.py at N=40).

    python experiments/ci_coverage_p99_check.py 200     # N = 200 replications per call, K = 300 calls

Measured: 282/300 = 94.0%, Clopper-Pearson [90.7, 96.4], 217 s on 2 cores.
"""
import sys, time, numpy as np
sys.path.insert(0, __import__("os").path.dirname(__file__))
import fastsim
from ci_coverage import one_seat, clopper_pearson, STEP
law = fastsim.Fixed(10); lam = 0.8 / (10 * STEP)
sc = one_seat(lam, law, 8000, 800)
K, N = 300, int(sys.argv[1])
t0 = time.time()
pilot_own = 1.04549  # per-run p99 estimand, 8000-replication pilot in docs/coverage.md
children = np.random.SeedSequence(12345).spawn(K)
hits_own = 0; below = above = 0
for ch in children:
    res = fastsim.replicate(sc, N, seed=ch, progress=False)
    ci = res.confidence_interval("ttft_p99")
    hits_own += ci.low <= pilot_own <= ci.high
    below += ci.high < pilot_own; above += ci.low > pilot_own
lo, hi = clopper_pearson(hits_own, K)
print(f"p99 TTFT, 8000 req, N={N}: coverage of per-run estimand {hits_own}/{K} = {hits_own/K:.3f} CP [{lo:.3f}, {hi:.3f}], below/above {below}/{above}; {time.time()-t0:.0f} s")
