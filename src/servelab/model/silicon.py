"""Measured operator times from aiconfigurator-core's operator databases (the `silicon` extra).

The `aiconfigurator-core` package (Apache-2.0, PyPI) ships per-operator timings collected on real
machines as parquet tables under `aiconfigurator_core/systems/data/<system>/`: collectives per message
size and rank count (NCCL, and each engine's own allreduce as it runs under CUDA graphs), GEMMs, attention,
MoE. This module reads them through the installed package's files; nothing is copied into servelab, and
without the extra every lookup answers None and the model keeps its formulas.

A lookup interpolates between measured points (log-log, the way collective and GEMM times scale) and says
which it did: `measured` (a row of the table), `interpolated` (between two rows) or `extrapolated` (past
the last row, along the last segment: never silently). Message sizes in the tables are element counts of
the collective's dtype (BF16/FP16 here: 2 bytes each).
"""

from __future__ import annotations

import importlib.util
import math
from bisect import bisect_left
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Literal

from servelab.errors import ConfigError
from servelab.model.hardware import Host

Source = Literal["measured", "interpolated", "extrapolated"]
PACKAGE = "aiconfigurator_core"
EXTRA_HINT = "install the extra: pip install 'servelab[silicon]' (the aiconfigurator-core package)"
ELEMENT_BYTES = 2.0  # the allreduce tables are BF16/FP16 element counts
# servelab engine name -> the folder of its own collectives and kernels in the databases
ENGINE_COMM = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}
# servelab's expert weight format -> the MoE tables' `moe_dtype`, most specific first (block-scaled FP8 is
# what the FP8 MoE checkpoints we serve ship)
MOE_DTYPES = {
    "fp8": ("fp8_block", "fp8"),
    "nvfp4": ("nvfp4",),
    "bf16": ("bfloat16",),
    "fp16": ("bfloat16",),
    "mxfp4": ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8"),
    "int4": ("int4_wo",),
}
# routing skew the MoE kernels were timed under: a power law (real routers are not uniform)
MOE_DISTRIBUTION = "power_law_1.01"


@dataclass(frozen=True)
class Lookup:
    """One value read off a table, and how."""

    seconds: float
    source: Source
    table: str  # which table and slice, e.g. "rtx_pro_6000_server comm/vllm/0.24.0 … 8 GPUs"
    lo: float  # the measured keys either side (equal when measured; one end when extrapolated)
    hi: float


@dataclass(frozen=True)
class Curve:
    """A measured time against one key (sorted, distinct, positive), with its provenance."""

    table: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]  # seconds

    def __post_init__(self) -> None:
        if len(self.xs) < 2 or len(self.xs) != len(self.ys):
            raise ValueError(f"{self.table}: a curve needs two or more points")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:], strict=False)) or min(self.xs) <= 0:
            raise ValueError(f"{self.table}: keys must be positive and increasing")

    def at(self, x: float) -> Lookup:
        """The time at key `x`: a measured row, log-log interpolation between the two rows around it, or
        the end segment carried past the table (flagged `extrapolated`)."""
        xs, ys = self.xs, self.ys
        x = max(x, 1e-12)
        i = bisect_left(xs, x)
        if i < len(xs) and xs[i] == x:
            return Lookup(ys[i], "measured", self.table, x, x)
        if 0 < i < len(xs):
            return Lookup(
                _loglog(xs[i - 1], ys[i - 1], xs[i], ys[i], x), "interpolated", self.table, xs[i - 1], xs[i]
            )
        j = 0 if i == 0 else len(xs) - 2
        end = xs[0] if i == 0 else xs[-1]
        if i == 0:
            # below the smallest message a collective costs its latency floor: flat, not a falling line
            return Lookup(ys[0], "extrapolated", self.table, end, end)
        return Lookup(_loglog(xs[j], ys[j], xs[j + 1], ys[j + 1], x), "extrapolated", self.table, end, end)


def _loglog(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))


@cache
def data_root() -> Path | None:
    """`aiconfigurator_core/systems/data` of the installed package, or None without the extra (found
    without importing the package: its import pulls pandas and a Rust engine we do not need)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        root = Path(base) / "systems" / "data"
        if root.is_dir():
            return root
    return None


def available() -> bool:
    return data_root() is not None


def require() -> Path:
    """The data root, or a clear error naming the extra."""
    root = data_root()
    if root is None:
        raise ConfigError("measured operator data needs the aiconfigurator-core package", hint=EXTRA_HINT)
    return root


def _version_key(v: str) -> tuple[Any, ...]:
    """Order engine versions such as 0.5.6.post2, 1.3.0rc20 and 0.24.0 numerically."""
    out: list[Any] = []
    for part in v.replace("rc", ".rc.").replace("post", ".post.").split("."):
        out.append((0, int(part)) if part.isdigit() else (1, part))
    return tuple(out)


def _read(path: Path, columns: list[str]) -> dict[str, list[Any]]:
    import pyarrow.parquet as pq  # a dependency of aiconfigurator-core, present whenever its files are

    table = pq.read_table(path, columns=[c for c in columns if c in pq.read_schema(path).names])
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _curve(table: str, sizes: list[Any], lats: list[Any]) -> Curve | None:
    """Element counts -> bytes, ms -> s; duplicate sizes keep their fastest row."""
    best: dict[float, float] = {}
    for s, lat in zip(sizes, lats, strict=True):
        if s and lat and lat > 0:
            b = float(s) * ELEMENT_BYTES
            best[b] = min(best.get(b, math.inf), float(lat) * 1e-3)
    if len(best) < 2:
        return None
    xs = tuple(sorted(best))
    return Curve(table, xs, tuple(best[x] for x in xs))


@cache
def allreduce_curve(system: str, engine: str | None, ranks: int) -> Curve | None:
    """Time of one allreduce against its message in bytes, on `ranks` GPUs of `system`.

    The engine's own allreduce as it runs in decode (CUDA-graph rows of its custom-allreduce table, the
    newest engine version that measured this rank count) when there is one; NCCL's all_reduce otherwise.
    None when the package, the system or this rank count is missing."""
    root = data_root()
    if root is None or ranks < 2:
        return None
    comm = root / system / "comm"
    own = ENGINE_COMM.get(engine or "")
    if own and (comm / own).is_dir():
        for ver in sorted(
            (d.name for d in (comm / own).iterdir() if d.is_dir()), key=_version_key, reverse=True
        ):
            path = comm / own / ver / "custom_allreduce_perf.parquet"
            if not path.is_file():
                continue
            rows = _read(path, ["num_gpus", "message_size", "latency", "backend"])
            keep = [
                i
                for i, n in enumerate(rows["num_gpus"])
                if n == ranks
                and str((rows.get("backend") or ["graph"] * len(rows["num_gpus"]))[i]).endswith("graph")
            ]
            c = _curve(
                f"{system} comm/{own}/{ver}/custom_allreduce_perf.parquet (CUDA graph) {ranks} GPUs",
                [rows["message_size"][i] for i in keep],
                [rows["latency"][i] for i in keep],
            )
            if c is not None:
                return c
    nccl = comm / "nccl"
    if nccl.is_dir():
        for ver in sorted((d.name for d in nccl.iterdir() if d.is_dir()), key=_version_key, reverse=True):
            path = nccl / ver / "nccl_perf.parquet"
            if not path.is_file():
                continue
            rows = _read(path, ["op_name", "nccl_dtype", "num_gpus", "message_size", "latency"])
            keep = [
                i
                for i, (op, dt, n) in enumerate(
                    zip(rows["op_name"], rows["nccl_dtype"], rows["num_gpus"], strict=True)
                )
                if op == "all_reduce" and dt == "half" and n == ranks
            ]
            c = _curve(
                f"{system} comm/nccl/{ver}/nccl_perf.parquet all_reduce half {ranks} GPUs",
                [rows["message_size"][i] for i in keep],
                [rows["latency"][i] for i in keep],
            )
            if c is not None:
                return c
    return None


@dataclass(frozen=True)
class _MoeRow:
    """One measured fused-MoE kernel of a `moe_perf.parquet` (the columns `moe_curve` reads)."""

    moe_dtype: str
    num_tokens: float
    hidden_size: int
    inter_size: int
    topk: int
    num_experts: int
    moe_tp_size: int
    moe_ep_size: int
    distribution: str
    latency: float | None


@cache
def _moe_rows(path: Path) -> list[_MoeRow]:
    import pyarrow.parquet as pq

    cols = [f.name for f in fields(_MoeRow)]
    return [_MoeRow(**row) for row in pq.read_table(path, columns=cols).to_pylist()]


@cache
def moe_curve(
    system: str,
    engine: str | None,
    expert_format: str,
    hidden: int,
    inter: int,
    topk: int,
    experts: int,
    moe_tp: int,
    moe_ep: int,
) -> Curve | None:
    """Time of one MoE layer's routed experts on one GPU against the tokens entering it, as the engine's
    own fused-MoE kernel ran on `system` for exactly this shape and split (the newest engine version that
    measured it). None when the package, the engine's tables, the format or the shape is missing."""
    root = data_root()
    own = ENGINE_COMM.get(engine or "")
    if root is None or not own or expert_format not in MOE_DTYPES:
        return None
    base = root / system / "moe" / own
    if not base.is_dir():
        return None
    for ver in sorted((d.name for d in base.iterdir() if d.is_dir()), key=_version_key, reverse=True):
        path = base / ver / "moe_perf.parquet"
        if not path.is_file():
            continue
        rows = _moe_rows(path)
        for dtype in MOE_DTYPES[expert_format]:
            pts: dict[float, float] = {}
            for r in rows:
                if (
                    r.moe_dtype == dtype
                    and r.distribution == MOE_DISTRIBUTION
                    and r.hidden_size == hidden
                    and r.inter_size == inter
                    and r.topk == topk
                    and r.num_experts == experts
                    and r.moe_tp_size == moe_tp
                    and r.moe_ep_size == moe_ep
                    and r.latency
                    and r.latency > 0
                ):
                    x = float(r.num_tokens)
                    pts[x] = min(pts.get(x, math.inf), float(r.latency) * 1e-3)
            if len(pts) >= 2:
                xs = tuple(sorted(pts))
                label = (
                    f"{system} moe/{own}/{ver}/moe_perf.parquet {dtype} h{hidden} i{inter} top{topk} "
                    f"E{experts} tp{moe_tp} ep{moe_ep} {MOE_DISTRIBUTION}"
                )
                return Curve(label, xs, tuple(pts[x] for x in xs))
    return None


def host_system(host: Host) -> tuple[str | None, str]:
    """The database system measured on this host's GPUs and fabric, or None with the reason."""
    gpu = host.gpu
    if not gpu.silicon_system:
        return None, f"no measured operator data for {gpu.name}"
    if host.interconnect.name != gpu.interconnect:
        return None, (
            f"the {gpu.silicon_system} tables were measured over {gpu.interconnect}, this host is "
            f"{host.interconnect.name}"
        )
    if host.num_gpus > 8:
        return None, f"the tables cover one {gpu.silicon_system} node (8 GPUs), this host has {host.num_gpus}"
    return gpu.silicon_system, ""


def host_allreduce(host: Host, engine: str | None, ranks: int) -> tuple[Curve | None, str]:
    """The allreduce curve for `ranks` GPUs of this host and engine, or None with why the formula applies."""
    if ranks < 2:
        return None, "one GPU: no allreduce"
    if data_root() is None:
        return None, "the silicon extra is not installed"
    system, why = host_system(host)
    if system is None:
        return None, why
    curve = allreduce_curve(system, engine, ranks)
    if curve is None:
        return None, f"no {ranks}-GPU allreduce table for {system}"
    return curve, ""
