"""Where the GPU's results part from the CPU kernel's (a script for a lent GPU, not a test).

    python benchmarks/gpu_bits.py [--replications 2000] [--requests 1000]

For the issue-7 reference workload and ShareGPT at ~80% load, on the same
replications and seed:

1. whole runs, ``backend="cuda"`` against ``backend="numba"``: the share of
   metric rows that are bit-identical, and which columns differ;
2. the draw alone: the device's request streams against the CPU's
   ``_draw_workload`` (replications whose columns are all bit-identical,
   arrival times that differ);
3. the simulation alone: the CPU's request streams simulated on the device,
   against the CPU kernel's rows.

Separates what the device's math library (``log``, ``exp`` in the draws)
does from what the engine's arithmetic does; each workload is also run with
``decode_alpha = 1``, where the decode-cost table needs no ``pow``. Needs an NVIDIA GPU with
numba-cuda and CuPy (or ``NUMBA_ENABLE_CUDASIM=1``, where every share is 1).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import fastsim  # noqa: E402
from fastsim import _cuda  # noqa: E402
from fastsim import kernel as K  # noqa: E402
from fastsim._replicate import _seed_keys, pack_scenario  # noqa: E402
from benchmarks.common import reference_workload, sharegpt_80pct  # noqa: E402

SEED = 0


def host_draws(packed, k0, k1, m, cap):
    """The CPU's request streams of replications 0 .. m - 1, as the device lays them out."""
    cols = [np.zeros((m, cap))] + [np.zeros((m, cap), np.int64) for _ in range(6)]
    nreq = np.zeros(m, np.int64)
    need = np.zeros((m, 2), np.int64)
    arrays = K.scenario_arrays(packed, lat=False)
    buf = K.ChunkBuffers(cap)
    for j in range(m):
        n = K._draw_workload(np.int64(j), np.uint64(k0), np.uint64(k1), *arrays, buf.state, *buf.requests)
        for c, b in zip(cols, buf.requests):
            c[j, :n] = b[:n]
        nreq[j] = n
        need[j] = K._ws_need(n, buf.requests[1], buf.requests[2], buf.requests[5], buf.requests[6], packed["ipar"])
    return cols, nreq, need


def rows_agree(a, b):
    same = np.array([np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b)])
    cols = [K.COLUMNS[c] for c in range(a.shape[1])
            if not np.array_equal(a[:, c], b[:, c], equal_nan=True)]
    return float(same.mean()), cols


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replications", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--time-replications", type=int, default=10_000, help="then time ShareGPT at this count")
    args = ap.parse_args()
    reason = _cuda.cuda_unavailable_reason()
    if reason is not None:
        print(f"no GPU backend here: {reason}")
        return 2
    diagnose(args.replications, args.requests)
    sc = sharegpt_80pct(args.requests)
    n = args.time_replications
    t = time.perf_counter()
    fastsim.replicate(sc, n, seed=1, backend="cuda", progress=False)
    s = time.perf_counter() - t
    print(f"ShareGPT 80%, {n:,} replications on the GPU: {n / s:,.0f} rep/s ({s:.2f} s)", flush=True)
    return 0


def diagnose(m, requests):
    """Print the three comparisons for each workload, over replications 0 .. m - 1."""
    mem = _cuda._Arrays()
    cases = []
    for name, factory in (("reference workload", reference_workload), ("ShareGPT 80%", sharegpt_80pct)):
        sc = factory(requests)
        cases.append((name, sc))
        # with decode_alpha = 1 the decode-cost table needs no pow (x ** 1.0 is x on both sides):
        # if the rows then agree, the device's pow was what parted them
        cases.append((f"{name}, decode_alpha = 1", sc.replace(**{"latency.decode_alpha": 1.0})))
    for name, sc in cases:
        t = time.perf_counter()
        cpu = fastsim.replicate(sc, m, seed=SEED, progress=False).per_replication.to_numpy()
        gpu = fastsim.replicate(sc, m, seed=SEED, backend="cuda", progress=False).per_replication.to_numpy()
        share, cols = rows_agree(cpu, gpu)
        print(f"{name}: {m:,} replications ({time.perf_counter() - t:.0f} s with compilation)", flush=True)
        print(f"  whole runs: {share:.1%} of rows bit-identical; columns that differ: {cols}", flush=True)

        packed = pack_scenario(sc)
        draw, simulate = _cuda._build(K.engine_variant(packed["ipar"]))
        k0, k1, _ = _seed_keys(SEED)
        k0, k1 = np.uint64(k0), np.uint64(k1)
        cap = max(int(packed["ipar"][K.I_NUM_REQUESTS]), 1)
        h_cols, h_nreq, h_need = host_draws(packed, k0, k1, m, cap)
        tables = [mem.to_device(a) for a in K.scenario_arrays(packed, lat=False)]
        with _cuda._rounded_as_on_the_cpu():
            d_req, d_nreq, d_need = _cuda._draw_chunk(draw, mem, tables, k0, k1, 0, m, cap, _cuda.THREADS_PER_BLOCK)
        g_cols = [mem.to_host(c) for c in d_req]
        g_nreq = mem.to_host(d_nreq)
        same_rep = (g_nreq == h_nreq) & (d_need == h_need).all(axis=1)
        for g, h in zip(g_cols, h_cols):
            same_rep &= np.array([np.array_equal(g[j, :h_nreq[j]], h[j, :h_nreq[j]]) for j in range(m)])
        valid = np.arange(cap)[None, :] < h_nreq[:, None]
        arr_diff = int((g_cols[0] != h_cols[0])[valid].sum())
        int_diff = [int((g != h)[valid].sum()) for g, h in zip(g_cols[1:], h_cols[1:])]
        print(f"  draws: {same_rep.mean():.1%} of replications bit-identical; arrival times that differ: "
              f"{arr_diff:,} of {int(valid.sum()):,}; integer columns that differ: {int_diff}", flush=True)

        d_host = [mem.to_device(c) for c in h_cols]
        with _cuda._rounded_as_on_the_cpu():
            d_out = _cuda._simulate_chunk(simulate, mem, tables[0], tables[1], mem.to_device(packed["lat"]),
                                          d_host, mem.to_device(h_nreq), h_need, mem.default_budget(),
                                          _cuda.THREADS_PER_BLOCK)
        share, cols = rows_agree(cpu, mem.to_host(d_out))
        print(f"  the CPU's draws simulated on the device: {share:.1%} of rows bit-identical; "
              f"columns that differ: {cols}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
