"""GPUs: the datasheet figures a deployment needs, and the packaged catalogue.

The catalogue lives in ``fastsim/data/gpus.toml`` (one table per GPU, with the
source of every figure); :func:`get_gpu` looks a name up case-insensitively
through its aliases, and :func:`register_gpu` adds a user's own.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources

from ._validation import check_bool, check_float

#: Bytes per element of the weight and KV-cache dtypes a deployment may name
#: (vLLM's ``dtype`` and ``kv_cache_dtype``; ``None``: the model's dtype).
DTYPES = {"bfloat16": 2, "float16": 2, "half": 2, "auto": 2}
KV_DTYPES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

GIB = 1024 ** 3
MIB = 1024 ** 2
#: Device memory the driver keeps for itself (CUDA context excluded): the
#: marketed 24 GiB of the RTX 4090 minus the 25,250,627,584 B torch reports as
#: its total (``../shared/data/vllm-rtx4090-llama3.1-8b/meta.json``), 495 MiB.
DRIVER_RESERVED_BYTES = 24 * GIB - 25_250_627_584


@dataclass(frozen=True)
class GPU:
    """One GPU's datasheet figures (dense peaks).

    Parameters
    ----------
    name : str
        A label (the catalogue's name for catalogue GPUs).
    memory_gib : float
        Marketed device memory, GiB (> 0).
    memory_bandwidth_tbs : float
        Peak DRAM bandwidth, TB/s (10**12 B/s, > 0).
    bf16_tflops : float
        Dense BF16 tensor-core peak (FP32 accumulate, no sparsity), TFLOP/s (> 0).
    fp8_tflops : float
        Dense FP8 tensor-core peak, TFLOP/s; 0 for GPUs without FP8 (Ampere),
        where FP8 weights run as weight-only (W8A16) kernels at the BF16 peak.
    interconnect_gbs : float
        GPU-to-GPU bandwidth per direction, GB/s (NVLink, else PCIe), used by
        the tensor-parallel all-reduce.
    ecc_reserves_memory : bool
        ECC takes 1/16 of the DRAM (data-centre GDDR6 parts).
    usable_memory_gib : float, optional
        Total memory as ``torch.cuda.mem_get_info`` reports it, GiB. By default
        ``memory_gib`` (less 1/16 with ECC) less the driver's reservation
        :data:`DRIVER_RESERVED_BYTES`.
    roofline_class : str
        The microbenchmarked GPU (``fastsim/data/roofline_efficiencies.json``)
        whose kernel efficiencies this GPU borrows (``"a100_sxm"``,
        ``"b200_sxm"``, ``"h100_sxm"``, ``"h200_sxm"``, ``"l40s"``); ``""``
        (a user's GPU) takes the median over the five.
    sources : tuple of str
        Where the figures come from.
    """

    name: str
    memory_gib: float
    memory_bandwidth_tbs: float
    bf16_tflops: float
    fp8_tflops: float = 0.0
    interconnect_gbs: float = 32.0
    ecc_reserves_memory: bool = False
    usable_memory_gib: float | None = None
    roofline_class: str = ""
    sources: tuple = field(default=(), compare=False)

    def __post_init__(self):
        s = object.__setattr__
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"GPU.name must be a non-empty string, got {self.name!r}")
        for key in ("memory_gib", "memory_bandwidth_tbs", "bf16_tflops", "interconnect_gbs"):
            s(self, key, check_float(f"GPU.{key}", getattr(self, key), low=0, low_open=True))
        s(self, "fp8_tflops", check_float("GPU.fp8_tflops", self.fp8_tflops, low=0))
        s(self, "ecc_reserves_memory", check_bool("GPU.ecc_reserves_memory", self.ecc_reserves_memory))
        s(self, "usable_memory_gib", check_float("GPU.usable_memory_gib", self.usable_memory_gib, low=0,
                                                 low_open=True, high=self.memory_gib, optional=True))
        s(self, "sources", tuple(self.sources))

    @property
    def total_memory_bytes(self) -> int:
        """Memory as torch reports its total (what ``gpu_memory_utilization`` multiplies)."""
        if self.usable_memory_gib is not None:
            return int(self.usable_memory_gib * GIB)
        dram = self.memory_gib * GIB * (15 / 16 if self.ecc_reserves_memory else 1.0)
        return int(dram - DRIVER_RESERVED_BYTES)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.memory_bandwidth_tbs * 1e12

    def peak_flops(self, dtype: str = "bfloat16") -> float:
        """Dense tensor peak, FLOP/s, for ``"bfloat16"``/``"float16"`` or ``"fp8"``
        (the BF16 peak on a GPU without FP8)."""
        if dtype == "fp8" and self.fp8_tflops > 0:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


def _load_catalogue() -> dict[str, GPU]:
    text = resources.files("fastsim").joinpath("data/gpus.toml").read_text()
    out = {}
    for name, spec in tomllib.loads(text).items():
        spec = dict(spec)
        spec.pop("aliases", None)
        out[name] = GPU(name=name, **spec)
    return out


def _load_aliases() -> dict[str, str]:
    text = resources.files("fastsim").joinpath("data/gpus.toml").read_text()
    aliases = {}
    for name, spec in tomllib.loads(text).items():
        for a in [name, *spec.get("aliases", ())]:
            aliases[_norm(a)] = name
    return aliases


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


_CATALOGUE: dict[str, GPU] = _load_catalogue()
_ALIASES: dict[str, str] = _load_aliases()


def gpu_names() -> list[str]:
    """The catalogue's GPU names (packaged and registered)."""
    return list(_CATALOGUE)


def get_gpu(gpu) -> GPU:
    """A :class:`GPU` from a catalogue name or alias (case-insensitive), or the GPU itself.

    Raises
    ------
    ValueError
        An unknown name; the message lists the known ones.
    """
    if isinstance(gpu, GPU):
        return gpu
    if isinstance(gpu, str):
        key = _ALIASES.get(_norm(gpu))
        if key is not None:
            return _CATALOGUE[key]
    raise ValueError(f"gpu must be a catalogue name or a fastsim.GPU(...), got {gpu!r}; known GPUs: "
                     f"{', '.join(gpu_names())} (aliases such as 'h100' or '4090' work; add your own "
                     f"with fastsim.GPU(name=..., memory_gib=..., memory_bandwidth_tbs=..., "
                     f"bf16_tflops=...))")


def register_gpu(gpu: GPU, aliases=()) -> GPU:
    """Add a GPU to the catalogue under its name (and ``aliases``), replacing any of that name."""
    if not isinstance(gpu, GPU):
        raise ValueError(f"gpu must be a fastsim.GPU, got {gpu!r}")
    _CATALOGUE[gpu.name] = gpu
    for a in (gpu.name, *aliases):
        _ALIASES[_norm(a)] = gpu.name
    return gpu
