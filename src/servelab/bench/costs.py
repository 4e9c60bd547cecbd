"""What a level costs, as `bench` measures it: the GPUs' idle power before the first level, the price of a
GPU-hour (the flag's, the study's or the catalog's dated default), and each level's `LevelEnergy` and
`LevelCost` from its stored power series (the formulas: servelab.energy, docs/metrics.md)."""

from __future__ import annotations

import asyncio

from servelab.bench.config import BenchConfig
from servelab.bench.telemetry import GpuSource
from servelab.energy import LevelCost, LevelEnergy, Price, level_cost, level_energy
from servelab.model.hardware import default_price
from servelab.results import LevelSeries, LevelSummary, RunContext

IDLE_READINGS = 3
IDLE_GAP_S = 0.1


async def idle_power(
    source: GpuSource, readings: int = IDLE_READINGS, gap_s: float = IDLE_GAP_S
) -> float | None:
    """The server's GPUs before the first level, watts together: the lowest of `readings` readings
    `gap_s` apart (the lowest, so a reading still warm from the probe's requests does not count); None
    when none has a power figure."""
    seen: list[float] = []
    for i in range(readings):
        if i:
            await asyncio.sleep(gap_s)
        try:
            r = await source.read()
        except Exception:  # telemetry is a side view: never stop a run
            r = None
        if r is not None and r.power_w is not None:
            seen.append(r.power_w * (r.gpus or 1))
    return min(seen) if seen else None


def price_for(cfg: BenchConfig, context: RunContext) -> Price | None:
    """The run's price: `cfg.gpu_hour_usd` (its `price_source`: the flag or the study), else the GPU
    kind's catalog default; None when neither is known."""
    if cfg.gpu_hour_usd is not None:
        return Price(gpu_hour_usd=cfg.gpu_hour_usd, source=cfg.price_source, kwh_usd=cfg.kwh_usd)
    found = default_price(context.host.gpu) if context.host.gpu else None
    if found is None:
        return None
    return Price(gpu_hour_usd=found[0], source=found[1], kwh_usd=cfg.kwh_usd)


def level_costs(
    summary: LevelSummary,
    series: LevelSeries,
    idle_w: float | None,
    price: Price | None,
    context: RunContext,
) -> tuple[LevelEnergy | None, LevelCost | None]:
    """A level's energy and cost on the client's clock (the wall summary and series, as stored): the
    power trace over [0, wall_s]; the cost for the layout's GPUs (else those the telemetry saw, else the
    host's, else one)."""
    trace = series.power_trace()
    seen_gpus = max((p.gpus or 0 for p in series.points if p.gpu_power_w is not None), default=0) or None
    energy = level_energy(
        trace,
        summary.wall_s or summary.duration_s,
        summary.total_output_tokens,
        summary.completed,
        idle_w,
        seen_gpus,
    )
    gpus = context.layout.gpus or seen_gpus or context.host.num_gpus or 1
    cost = level_cost(price, gpus, summary.output_throughput, energy) if price is not None else None
    return energy, cost
