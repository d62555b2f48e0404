"""The GPU backend (``backend="cuda"``, fastsim/_cuda.py).

Without a GPU (CI), the CUDA code runs under Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) in a subprocess, where it must give the CPU
kernel's results bit for bit: the device functions are the CPU kernel's own
source, and the simulator does the same IEEE arithmetic. Where numba-cuda and
NVVM are installed, both kernels are also compiled to PTX for a real GPU
(sm_90) to catch code the simulator accepts but the CUDA target does not. On
a machine with a GPU, the real device is held to the CPU within a stated
tolerance (it has its own log, exp and pow: docs/gpu.md).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastsim
from fastsim import kernel as K
from fastsim._cuda import _groups, cuda_unavailable_reason

REAL_GPU = cuda_unavailable_reason() is None and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1"

# Small scenarios that exercise every engine path: preemption under a tight
# KV cache, priority + swap, static batching, prefix caching + SJF on
# predicted lengths + aging + active preemption, multi-user arrivals with a
# horizon and abandonment, admission control with warm-up and SLOs.
SCENARIOS = {
    "tight-kv": dict(engine=dict(max_num_seqs=6, num_gpu_blocks=40, max_num_batched_tokens=256),
                     workload=dict(arrival_rate=6.0, num_requests=40,
                                   prompt_len=fastsim.LogNormal(60, 0.6), output_len=fastsim.LogNormal(40, 0.7))),
    "priority-swap": dict(engine=dict(max_num_seqs=4, num_gpu_blocks=20, policy="priority",
                                      preemption_mode="swap", swap_space_blocks=20,
                                      enable_chunked_prefill=False),
                          workload=dict(arrival_rate=10.0, num_requests=40, prompt_len=fastsim.Uniform(10, 90),
                                        output_len=fastsim.Uniform(5, 60), priorities=(0, 1, 2),
                                        priority_probs=(0.3, 0.3, 0.4))),
    "static": dict(engine=dict(max_num_seqs=4, scheduler="static", num_gpu_blocks=100),
                   workload=dict(arrival_rate=3.0, num_requests=30, output_len=fastsim.LogNormal(30, 0.5),
                                 prompt_len=40)),
    "cache-sjf-aging": dict(engine=dict(max_num_seqs=5, num_gpu_blocks=50, policy="sjf",
                                        enable_prefix_caching=True, priority_preemption=True,
                                        priority_aging_s=5.0,
                                        length_predictor=fastsim.LogNormalPredictor(0.5)),
                            workload=dict(arrival_rate=6.0, num_requests=40, prompt_len=fastsim.Uniform(40, 120),
                                          output_len=fastsim.LogNormal(30, 0.8), prefix_groups=3,
                                          prefix_len=32, prefix_popularity=1.0)),
    "multi-user-horizon": dict(engine=dict(max_num_seqs=4, max_queue_delay_s=1.0, num_gpu_blocks=60),
                               workload=dict(users=(4, 8), requests_per_user=10.0, user_rate=2.0,
                                             horizon_s=6.0, output_len=fastsim.LogNormal(20, 0.5),
                                             prompt_len=30, arrival_rate=None)),
    "admission-slo-warmup": dict(engine=dict(max_num_seqs=4, admission="kv_reservation", num_gpu_blocks=30),
                                 workload=dict(arrival_rate=4.0, num_requests=40, warmup_requests=5,
                                               output_len=fastsim.LogNormal(25, 0.6), prompt_len=50),
                                 ttft_slo_s=1.0, tpot_slo_s=0.05),
    # V1's asynchronous loop without prefix caching (the full engine's kernel), the
    # common engine's (`replica.engine_variant` None) with the full-input gate and the
    # null block, and the synchronous loop (V1's rules off)
    "async-tight-kv": dict(engine=dict(max_num_seqs=6, num_gpu_blocks=40, max_num_batched_tokens=256,
                                       enable_prefix_caching=False),
                           workload=dict(arrival_rate=6.0, num_requests=40, prompt_len=fastsim.LogNormal(60, 0.6),
                                         output_len=fastsim.LogNormal(40, 0.7))),
    "common-tight-kv": dict(engine=dict(max_num_seqs=6, num_gpu_blocks=40, max_num_batched_tokens=256,
                                        enable_prefix_caching=False, async_scheduling=False),
                            workload=dict(arrival_rate=6.0, num_requests=40, prompt_len=fastsim.LogNormal(60, 0.6),
                                          output_len=fastsim.LogNormal(40, 0.7))),
    "common-sync": dict(engine=dict(max_num_seqs=4, num_gpu_blocks=30, admission="kv_reservation",
                                    async_scheduling=False, scheduler_reserve_full_isl=False, null_block=False,
                                    enable_prefix_caching=False),
                        workload=dict(arrival_rate=4.0, num_requests=40, output_len=fastsim.LogNormal(25, 0.6),
                                      prompt_len=fastsim.LogNormal(50, 0.5))),
}
N_REP = 6


def build(name):
    spec = SCENARIOS[name]
    kw = {k: v for k, v in spec.items() if k not in ("engine", "workload")}
    wl = dict(spec["workload"])
    if "users" in wl:
        users, rpu, rate = wl.pop("users"), wl.pop("requests_per_user"), wl.pop("user_rate")
        wl.pop("arrival_rate", None)
        workload = fastsim.Workload.multi_user(users, rpu, rate, **wl)
    else:
        workload = fastsim.Workload(**wl)
    return fastsim.Scenario(engine=fastsim.EngineConfig(**spec["engine"]), workload=workload, **kw)


SIM_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    sys.path.insert(0, {tests!r})
    import fastsim
    from fastsim import _cuda
    from fastsim._replicate import pack_scenario, _seed_keys
    from test_cuda import build, SCENARIOS, N_REP
    warnings.simplefilter("error")
    out = {{}}
    for name in SCENARIOS:
        sc = build(name)
        res = fastsim.replicate(sc, N_REP, seed=7, backend="cuda", progress=False)
        out[name] = res.per_replication.to_numpy().tolist()
    # chunking and memory groups do not change results
    sc = build("tight-kv")
    p = pack_scenario(sc)
    k0, k1, _ = _seed_keys(7)
    small = np.empty((N_REP, len(fastsim.kernel.COLUMNS)))
    _cuda.run_replications_cuda(p, k0, k1, 0, N_REP, small, chunk=4, memory_budget=1, threads_per_block=2)
    out["tight-kv/chunked"] = small.tolist()
    print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def simulated():
    """Per-replication tables of every scenario from backend='cuda' under the CUDA simulator."""
    pytest.importorskip("numba.cuda")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    code = SIM_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return {k: np.array(v, dtype=float) for k, v in json.loads(line[len("RESULT"):]).items()}


def same(a, b):
    return np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_simulated_gpu_is_bit_identical_to_the_cpu_kernel(simulated, name):
    cpu = fastsim.replicate(build(name), N_REP, seed=7, progress=False).per_replication.to_numpy()
    gpu = simulated[name]
    assert gpu.shape == cpu.shape
    bad = ~((gpu == cpu) | (np.isnan(gpu) & np.isnan(cpu)))
    assert not bad.any(), [(K.COLUMNS[j], cpu[i, j], gpu[i, j]) for i, j in np.argwhere(bad)[:5]]
    # and the scenario is not trivial: requests completed, every arrival accounted for
    c = {n: cpu[:, K.COLUMNS.index(n)] for n in K.COUNTS}
    assert (c["n_completed"] > 0).all()
    assert np.array_equal(c["n_arrived"], c["n_completed"] + c["n_rejected"] + c["n_dropped"] + c["n_unfinished"])


def test_simulated_features_are_exercised(simulated):
    """The grid reaches preemption, swaps, prefix hits, drops and rejections."""
    col = {n: K.COLUMNS.index(n) for n in K.COLUMNS}
    assert simulated["tight-kv"][:, col["n_preemptions"]].sum() > 0
    assert simulated["priority-swap"][:, col["n_swaps"]].sum() > 0
    assert np.nanmax(simulated["cache-sjf-aging"][:, col["prefix_hit_rate"]]) > 0
    assert simulated["admission-slo-warmup"][:, col["n_rejected_admission"]].sum() > 0
    assert simulated["multi-user-horizon"][:, col["n_unfinished"]].sum() + \
        simulated["multi-user-horizon"][:, col["n_dropped"]].sum() > 0


def test_both_engines_kernels_are_in_the_grid(simulated):
    """The grid runs the common engine's simulate kernel and the full engine's
    (`replica.engine_variant`), and the common one under preemption."""
    from fastsim._replicate import pack_scenario

    common = {name for name in SCENARIOS if K.engine_variant(pack_scenario(build(name))["ipar"]) is None}
    assert common == {"common-tight-kv", "common-sync"}
    assert simulated["common-tight-kv"][:, K.COLUMNS.index("n_preemptions")].sum() > 0


def test_chunks_and_memory_groups_do_not_change_results(simulated):
    assert same(simulated["tight-kv/chunked"], simulated["tight-kv"])


def test_groups_fit_the_budget_and_cover_every_replication():
    rng = np.random.default_rng(0)
    ni = rng.integers(1, 100, 50)
    nf = rng.integers(1, 100, 50)
    for budget in (1, 500, 3000, 10 ** 9):
        groups = _groups(ni, nf, budget)
        assert groups[0][0] == 0 and groups[-1][1] == 50
        assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
        for g0, g1 in groups:
            assert g1 > g0
            size = 8 * (ni[g0:g1] + nf[g0:g1]).sum()
            assert size <= budget or g1 - g0 == 1


@pytest.mark.skipif(REAL_GPU, reason="a usable GPU is present")
def test_cuda_backend_without_a_gpu_says_what_is_missing():
    sc = build("tight-kv")
    with pytest.raises(RuntimeError, match="backend='cuda' is not available: .*(GPU|CuPy|numba)"):
        fastsim.replicate(sc, 4, backend="cuda")
    with pytest.raises(RuntimeError, match="backend='cuda' is not available"):
        fastsim.compare({"a": sc, "b": sc}, 4, backend="cuda")
    with pytest.raises(RuntimeError, match="backend='cuda' is not available"):
        fastsim.sweep(sc, {"engine.max_num_seqs": [2, 4]}, 4, backend="cuda")


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="backend must be one of"):
        fastsim.replicate(build("tight-kv"), 4, backend="opencl")
    with pytest.raises(ValueError, match="backend"):
        fastsim.simulate_requests(build("tight-kv"), {"arrival_s": [0.0], "prompt_len": [5], "output_len": [3]},
                                  backend="cuda")


def test_kernels_compile_for_a_real_gpu(tmp_path):
    """The draw kernel and the full engine's simulate kernel compile to PTX for
    sm_90 (needs numba-cuda and NVVM, no GPU), and assemble with ptxas where it
    is installed."""
    pytest.importorskip("numba_cuda")
    from fastsim._cuda import compile_ptx

    try:
        # the common engine's kernel is the full one's code with branches pruned: not compiled here
        ptx = compile_ptx(cc=(9, 0), kernels=("_draw_kernel", "_simulate_kernel"))
    except Exception as exc:  # no NVVM library on this machine
        if "NVVM" in str(exc) or "nvvm" in str(exc) or "libNVVM" in str(exc):
            pytest.skip(f"NVVM not available: {exc}")
        raise
    for text in ptx.values():
        assert ".visible .entry" in text and ".target sm_90" in text
    # ... and assemble to sm_90 machine code where ptxas is at hand (nvidia-cuda-nvcc)
    ptxas = _ptxas()
    if ptxas is None:
        return
    for name, text in ptx.items():
        src = tmp_path / f"{name}.ptx"
        src.write_text(text)
        res = subprocess.run([ptxas, "-arch=sm_90", "-v", str(src), "-o", str(tmp_path / f"{name}.cubin")],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        regs = [int(w) for line in res.stderr.splitlines() if "Used" in line and "registers" in line
                for w in [line.split("Used")[1].split()[0]]]
        assert regs and max(regs) <= 255


def _ptxas():
    import shutil

    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc as nvcc
    except ImportError:
        return None
    path = os.path.join(list(nvcc.__path__)[0], "bin", "ptxas")
    return path if os.path.exists(path) else None


@pytest.mark.skipif(not REAL_GPU, reason="no usable GPU")
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_real_gpu_agrees_with_the_cpu_kernel(name):
    """On a GPU: the same counts in >= 95% of replications, metrics within 1e-6 relative."""
    sc = build(name)
    cpu = fastsim.replicate(sc, 200, seed=3, progress=False).per_replication.to_numpy()
    gpu = fastsim.replicate(sc, 200, seed=3, backend="cuda", progress=False).per_replication.to_numpy()
    counts = [K.COLUMNS.index(n) for n in ("n_arrived", "n_completed", "n_rejected", "n_dropped", "n_preemptions")]
    same_counts = (cpu[:, counts] == gpu[:, counts]).all(axis=1)
    assert same_counts.mean() >= 0.95
    a, b = cpu[same_counts], gpu[same_counts]
    assert np.allclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("kw, match", [(dict(memory_budget=-1), "memory_budget=-1"),
                                       (dict(threads_per_block=0), "threads_per_block=0"),
                                       (dict(threads_per_block=2048), "threads_per_block=2048")])
def test_launch_settings_are_checked_before_anything_runs(kw, match):
    from fastsim._cuda import run_replications_cuda
    from fastsim._replicate import pack_scenario

    with pytest.raises(ValueError, match=match):
        run_replications_cuda(pack_scenario(build("tight-kv")), 1, 2, 0, 2, np.empty((2, len(K.COLUMNS))), **kw)


def test_kernels_compile_without_fma_contraction_and_restore_nvvm(monkeypatch):
    """While fastsim's kernels compile, NVVM is told -fma=0 (unless fastmath asks for
    FMAs); nested and repeated uses restore numba-cuda's own function."""
    pytest.importorskip("numba_cuda")
    from numba.cuda.cudadrv import nvvm

    from fastsim._cuda import _rounded_as_on_the_cpu

    seen = []

    def recorder(llvmir, **options):
        seen.append(options)
        return "ptx"

    monkeypatch.setattr(nvvm, "compile_ir", recorder)
    with _rounded_as_on_the_cpu():
        with _rounded_as_on_the_cpu():
            nvvm.compile_ir("ir", opt=3, fastmath=False)
        nvvm.compile_ir("ir", opt=3, fastmath=True)
    nvvm.compile_ir("ir", opt=3)
    assert seen == [dict(opt=3, fastmath=False, fma=False), dict(opt=3, fastmath=True), dict(opt=3)]
    assert nvvm.compile_ir is recorder


def test_the_device_check_scripts_run_under_the_simulator(tmp_path):
    """`benchmarks/gpu_vs_cpu.py` (with `gpu_bits.py`'s comparisons and the launch
    variants) runs end to end, so a lent GPU's short lease is not lost to a broken
    script; under the simulator every comparison is bit for bit."""
    pytest.importorskip("numba.cuda")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, "-W", "ignore", os.path.join(root, "benchmarks", "gpu_vs_cpu.py"),
                           "--requests", "12", "--replications", "3", "6", "--cpu-max", "3",
                           "--agreement-replications", "3", "--variants", "--variant-replications", "2",
                           "--bits", "--json", str(out)], env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    for entry in report["workloads"].values():
        assert entry["agreement"]["bit_identical"] == 1.0
        assert [r["replications"] for r in entry["rows"]] == [3, 6]
    assert len(report["variants"]) == 9
    lines = proc.stdout.splitlines()
    bits = [ln for ln in lines if "bit-identical" in ln and "%" in ln]
    assert len(bits) == 3 * 4 and all("100.0%" in ln for ln in bits), "\n".join(lines)


@pytest.mark.skipif(REAL_GPU, reason="a usable GPU is present")
def test_cli_reports_a_missing_gpu_as_a_usage_error(capsys):
    from fastsim._cli import main

    assert main(["demo", "--backend", "cuda", "--replications", "2"]) == 2
    err = capsys.readouterr().err
    assert "fastsim: error: backend='cuda' is not available" in err
