"""Scenarios shared by the benchmarks."""

import fastsim

#: The workload of the performance targets (issue "Performance"): Poisson
#: 4 req/s, lognormal prompt (median 256, sigma 0.55) and output (median 128,
#: sigma 0.70), KV-reservation admission over 16,384 tokens, batch 32.
def reference_workload(num_requests=1000):
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=32, block_size=16, num_gpu_blocks=1024,
                                    admission="kv_reservation"),
        workload=fastsim.Workload(arrival_rate=4.0, num_requests=num_requests,
                                  prompt_len=fastsim.LogNormal(256, 0.55),
                                  output_len=fastsim.LogNormal(128, 0.70)),
        latency=fastsim.LatencyModel.default())


def output_length_scenario(median, num_requests=1000):
    """The issue-7 workload with the output median scaled and the arrival rate
    scaled inversely (the same decode load), the KV budget with the lengths
    (`benchmarks/output_length.py` and the asv `OutputLength` benchmarks)."""
    scale = median / 128
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=32, block_size=16, num_gpu_blocks=int(1024 * max(1.0, scale)),
                                    admission="kv_reservation"),
        workload=fastsim.Workload(arrival_rate=4.0 / scale, num_requests=num_requests,
                                  prompt_len=fastsim.LogNormal(256, 0.55),
                                  output_len=fastsim.LogNormal(median, 0.70)),
        latency=fastsim.LatencyModel.default())


def sharegpt_80pct(num_requests=1000):
    """ShareGPT lengths, max_num_seqs=64, A10G latency model, ~80% of capacity."""
    return fastsim.Scenario(
        engine=fastsim.EngineConfig(max_num_seqs=64, num_gpu_blocks=6822, max_model_len=2048),
        workload=fastsim.Workload(arrival_rate=12.0, num_requests=num_requests,
                                  lengths=fastsim.sharegpt_lengths("sample")),
        latency=fastsim.LatencyModel.default())


def warm_up():
    """Compile every kernel (or load it from Numba's cache) outside the timed body."""
    fastsim.replicate(reference_workload(20), n_replications=2, seed=0)
