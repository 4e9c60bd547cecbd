"""GPU telemetry beside a level's `/metrics` samples, from wherever the server's GPUs can be seen.

Two sources, both the ones servelab already reads elsewhere: the server's own telemetry route (the
engine's declared `capabilities.telemetry_path`, the simulator's `/servelab/gpus`, parsed by
`host.gpus.from_sim` as `servelab status` parses it), or, when the server runs on this machine, this
machine's GPUs (`host.gpus.read_local`: NVML, else nvidia-smi). A server on another machine (reached
directly or through an SSH forward) has neither: its GPU figures stay None rather than being guessed.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson

from servelab.bench.client import Client
from servelab.bench.scrape import GpuReading
from servelab.engines import registry
from servelab.errors import NotFoundError
from servelab.host import gpus as gpumod
from servelab.results import RunContext

GpuReader = Callable[[], Awaitable[GpuReading | None]]


@dataclass(frozen=True)
class GpuSource:
    name: str  # recorded as LevelSeries.gpu_source
    read: GpuReader


def reading(rep: gpumod.GpuReport) -> GpuReading | None:
    """The GPUs the server holds (a compute process, or memory in use) summed up: mean power and
    utilization, memory summed; None when none is held (an idle box says nothing about the server)."""
    held = [g for g in rep.gpus if not g.idle]
    if not held:
        return None
    power = [g.power_w for g in held if g.power_w is not None]
    util = [g.utilization_pct for g in held if g.utilization_pct is not None]
    mem = [g.memory_used_mib for g in held if g.memory_used_mib is not None]
    return GpuReading(
        power_w=sum(power) / len(power) if power else None,
        util=sum(util) / len(util) / 100 if util else None,
        memory_used_mib=float(sum(mem)) if mem else None,
        gpus=len(held),
    )


def telemetry_path(engine: str | None) -> str | None:
    """The HTTP route the engine declares for GPU telemetry (None: none, or an engine we do not know)."""
    if not engine:
        return None
    try:
        return registry.get(engine).capabilities.telemetry_path
    except NotFoundError:
        return None


def on_this_machine(url: str, via: str | None) -> bool:
    """The server's GPUs are this machine's: a loopback URL not reached through an SSH forward."""
    if via == "ssh-forward":
        return False
    host = (urlsplit(url).hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_source(client: Client, path: str) -> GpuSource:
    async def read() -> GpuReading | None:
        res = await client.get(path, timeout_s=2.0)
        if res.status != 200:
            return None
        try:
            payload = orjson.loads(res.body)
        except orjson.JSONDecodeError:
            return None
        return reading(gpumod.from_sim(payload, path)) if isinstance(payload, dict) else None

    return GpuSource(f"http:{path}", read)


async def source_for(client: Client, url: str, context: RunContext) -> GpuSource | None:
    """Where this run's GPU telemetry comes from, decided once before the first level."""
    path = telemetry_path(context.engine)
    if path:
        return http_source(client, path)
    if not on_this_machine(url, context.path.via):
        return None
    first = await asyncio.to_thread(gpumod.read_local)
    if not first.available:
        return None

    async def read() -> GpuReading | None:
        return reading(await asyncio.to_thread(gpumod.read_local))

    return GpuSource(first.source, read)
