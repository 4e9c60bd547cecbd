"""GPU power and utilization sampled while a level runs (the simulator's endpoint, or nvidia-smi)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import orjson

from servelab import tasks
from servelab.bench.client import Client

TelemetryReader = Callable[[], Awaitable[tuple[float, float] | None]]


class Telemetry:
    """Samples GPU power/utilization while a level runs (the simulator's endpoint, or nvidia-smi)."""

    def __init__(self, read: TelemetryReader | None) -> None:
        self.read = read
        self.samples: list[tuple[float, float]] = []
        self.task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        assert self.read is not None
        while True:
            with contextlib.suppress(Exception):
                got = await self.read()
                if got:
                    self.samples.append(got)
            await asyncio.sleep(0.1)

    def start(self) -> None:
        self.samples = []
        if self.read is not None:
            self.task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> dict[str, float]:
        if self.task is not None:
            await tasks.stop(self.task)
            self.task = None
        if not self.samples:
            return {}
        # the busiest half of the level (ramp-up and drain excluded)
        top = sorted(self.samples, reverse=True)[: max(1, len(self.samples) // 2)]
        return {
            "gpu_power_w": sum(p for p, _ in top) / len(top),
            "gpu_util": sum(u for _, u in top) / len(top),
        }


def http_telemetry(url: str, path: str) -> TelemetryReader:
    """Reads GPU telemetry an engine serves over HTTP (the simulator's /servelab/gpus)."""
    client = Client(url, timeout_s=5)

    async def read() -> tuple[float, float] | None:
        res = await client.get(path, timeout_s=2.0)
        if not res.ok:
            return None
        gpus = [g for g in orjson.loads(res.body).get("gpus", []) if g.get("processes")]
        if not gpus:
            return None
        return (
            sum(g["power_w"] for g in gpus) / len(gpus),
            sum(g["utilization_pct"] for g in gpus) / len(gpus) / 100,
        )

    return read
