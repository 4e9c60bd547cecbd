"""The GPU and interconnect catalog, kept as data in `servelab/data/gpus.toml`.

An entry is a GPU (`kind = "gpu"`, the default) or a CPU host (`kind = "cpu"`: an engine such as
vLLM-CPU running on `cores` cores, priced by the same roofline with the host's DRAM bandwidth and its
cores' FMA peak)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from servelab.errors import NotFoundError


@dataclass(frozen=True)
class Gpu:
    """One GPU kind: the numbers a roofline needs."""

    name: str
    description: str
    memory_gb: float
    memory_bw_gbs: float
    tflops_bf16: float
    tflops_fp8: float
    tflops_fp4: float
    sm: int
    interconnect: str
    kind: str = "gpu"  # "gpu" | "cpu"
    cores: int = 0  # CPU hosts: cores the engine runs on
    silicon_system: str = ""  # aiconfigurator-core's name for this GPU's measured system (model/silicon.py)
    gpu_hour_usd: float = 0.0  # a typical on-demand cloud price per GPU-hour, USD (0: none in the catalog)
    price_date: str = ""  # when that price was read (YYYY-MM-DD)

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def tflops(self, compute_dtype: str) -> float:
        """Dense tensor TFLOPS for a compute dtype, falling back to the next wider type the GPU has."""
        if compute_dtype == "fp4" and self.tflops_fp4 > 0:
            return self.tflops_fp4
        if compute_dtype in ("fp4", "fp8") and self.tflops_fp8 > 0:
            return self.tflops_fp8
        return self.tflops_bf16


@dataclass(frozen=True)
class Interconnect:
    """A GPU-to-GPU fabric: latency per collective (base + per hop) and achieved bus bandwidth."""

    name: str
    description: str
    bus_gbs: float
    base_us: float
    hop_us: float

    @property
    def is_pcie(self) -> bool:
        return self.name.startswith("pcie")


@dataclass(frozen=True)
class Host:
    """A box: `num_gpus` GPUs of one kind joined by one interconnect."""

    gpu: Gpu
    num_gpus: int
    interconnect: Interconnect


@cache
def _catalog() -> dict[str, dict[str, dict[str, object]]]:
    text = resources.files("servelab.data").joinpath("gpus.toml").read_text()
    return tomllib.loads(text)


def gpu_names() -> list[str]:
    return sorted(_catalog()["gpu"])


def interconnect_names() -> list[str]:
    return sorted(_catalog()["interconnect"])


ALIASES = {
    "h100": "h100-sxm",
    "h200": "h200-sxm",
    "a100": "a100-sxm",
    "b200-sxm": "b200",
    "b300-sxm": "b300",
    "rtx-pro-6000-blackwell": "rtx-pro-6000",
    "rtxpro6000": "rtx-pro-6000",
    "cpu": "cpu-host",
}


def _norm(name: str) -> str:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    return ALIASES.get(key, key)


def get_gpu(name: str) -> Gpu:
    """Look a GPU up by name (case, `_` and `-` are forgiven); unknown names list the known ones."""
    key = _norm(name)
    spec = _catalog()["gpu"].get(key)
    if spec is None:
        raise NotFoundError(
            f"unknown GPU {name!r}",
            hint="known GPUs: " + ", ".join(gpu_names()),
        )
    return Gpu(name=key, **spec)  # type: ignore[arg-type]


def default_price(name: str) -> tuple[float, str] | None:
    """The catalog's price per GPU-hour of the GPU kind `name` and its source as shown, "catalog default
    (DATE)"; None for a kind the catalog has no price for (or does not know)."""
    try:
        g = get_gpu(name)
    except NotFoundError:
        return None
    if g.gpu_hour_usd <= 0:
        return None
    return g.gpu_hour_usd, f"catalog default ({g.price_date})"


def get_interconnect(name: str) -> Interconnect:
    key = _norm(name)
    spec = _catalog()["interconnect"].get(key)
    if spec is None:
        raise NotFoundError(
            f"unknown interconnect {name!r}",
            hint="known interconnects: " + ", ".join(interconnect_names()),
        )
    return Interconnect(name=key, **spec)  # type: ignore[arg-type]


def make_host(gpu: str, num_gpus: int, interconnect: str | None = None) -> Host:
    """Build a host; the interconnect defaults to the GPU's usual one."""
    g = get_gpu(gpu)
    if num_gpus < 1:
        raise NotFoundError(f"--num-gpus must be at least 1, got {num_gpus}")
    return Host(gpu=g, num_gpus=num_gpus, interconnect=get_interconnect(interconnect or g.interconnect))
