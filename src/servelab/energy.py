"""What a level costs: its GPU energy and its price (issue 31). Pure; imports nothing of ours, so the
results contract (`results.LevelSummary.energy`, `.cost`) can hold these models.

**Energy.** A level's GPU power is sampled beside its `/metrics` samples (`results.SeriesPoint`:
`gpu_power_w`, the mean over the GPUs the server holds, and `gpus`, how many). The trace integrated is
their product, the power of all those GPUs, at each sample's time `t_s` (seconds since the level's start).
`integrate` takes the trace as piecewise linear between the samples (trapezoids), held flat before the
first sample and after the last one (the sampler's first reading comes one interval after the level
starts; its last is at most one interval before it ends), and clipped to the window: samples outside it
count only through the value interpolated at its edge. The window is the level's own, [0, `wall_s`] on
the client's clock: from the first request due to the end of the level's driver, which covers every
token the level counts. No sample with a power reading: no energy (None).

**Idle.** `idle_w` is the same GPUs' power measured before the level's first request (the lowest of a few
readings right before it; `bench` takes them), and `j_per_output_token_above_idle` is what the level drew
above it: (energy_j − idle_w × window_s) / output tokens.

**Money.** `usd_per_m_output_tokens` = gpu_hour_usd × gpus / 3600 / (output tokens/s) × 1e6: the GPUs the
level held, for the time one million output tokens take at the level's throughput. With a price per kWh,
`energy_usd_per_m_output_tokens` = j_per_output_token × 1e6 / 3.6e6 × kwh_usd, the electricity alone.

**Time base.** A run against `servelab sim --speed X` is measured on a clock X times faster than the GPU it
simulates, at the simulated GPU's power: in that GPU's time (`in_gpu_time`) the window and the energy are
X times longer and larger, so J/token and $/M tokens × X, tokens/J ÷ X; watts stay as they are.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

J_PER_KWH = 3.6e6


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class LevelEnergy(_Frozen):
    """A level's GPU energy (module docstring: how each figure is made). Units are in the names."""

    energy_j: float  # the GPUs' energy over the window, joules
    window_s: float  # the window integrated over, seconds
    mean_power_w: float  # energy_j / window_s: the GPUs' mean power together, watts
    j_per_output_token: float | None = None
    j_per_request: float | None = None  # per completed request
    output_tokens_per_j: float | None = None
    idle_w: float | None = None  # the same GPUs' power before the level, together, watts
    j_per_output_token_above_idle: float | None = None
    samples: int = 0  # power samples inside the window
    interval_s: float | None = None  # their mean spacing
    gpus: int | None = None  # how many GPUs the samples covered (the most any sample did)

    def in_gpu_time(self, speed: float) -> LevelEnergy:
        """In the simulated GPU's time (module docstring): joules and seconds × speed, watts unchanged."""
        if speed == 1:
            return self

        def mul(v: float | None, f: float) -> float | None:
            return None if v is None else v * f

        return self.model_copy(
            update={
                "energy_j": self.energy_j * speed,
                "window_s": self.window_s * speed,
                "j_per_output_token": mul(self.j_per_output_token, speed),
                "j_per_request": mul(self.j_per_request, speed),
                "output_tokens_per_j": mul(self.output_tokens_per_j, 1 / speed),
                "j_per_output_token_above_idle": mul(self.j_per_output_token_above_idle, speed),
                "interval_s": mul(self.interval_s, speed),
            }
        )


PriceSource = str  # "flag", "study" or "catalog default (YYYY-MM-DD)"


class Price(_Frozen):
    """What a GPU-hour (and a kWh) costs, and who said so: `source` is "flag" (`--gpu-hour-usd`),
    "study" (its `[cost]`) or "catalog default (YYYY-MM-DD)" (gpus.toml's dated on-demand price)."""

    gpu_hour_usd: float
    source: PriceSource
    kwh_usd: float | None = None

    @property
    def is_default(self) -> bool:
        return self.source.startswith("catalog default")


class LevelCost(_Frozen):
    """A level's price per million output tokens (module docstring: the formulas)."""

    usd_per_m_output_tokens: float
    gpu_hour_usd: float
    gpus: int
    price_source: PriceSource
    kwh_usd: float | None = None
    energy_usd_per_m_output_tokens: float | None = None  # the electricity alone, with kwh_usd

    @property
    def is_default(self) -> bool:
        return self.price_source.startswith("catalog default")

    def in_gpu_time(self, speed: float) -> LevelCost:
        """Throughput ÷ speed in the simulated GPU's time, so dollars per token × speed."""
        if speed == 1:
            return self
        e = self.energy_usd_per_m_output_tokens
        return self.model_copy(
            update={
                "usd_per_m_output_tokens": self.usd_per_m_output_tokens * speed,
                "energy_usd_per_m_output_tokens": None if e is None else e * speed,
            }
        )


def integrate(trace: Sequence[tuple[float, float]], start_s: float, end_s: float) -> float:
    """Joules of a power trace ((t_s, watts) samples) over [start_s, end_s]: trapezoids between the
    samples, the first and last held flat out to the window's edges, samples outside it clipped (the
    value at an edge interpolated between the samples around it). An empty trace or window: 0."""
    pts = sorted(trace)
    if not pts or end_s <= start_s:
        return 0.0

    def at(t: float) -> float:
        if t <= pts[0][0]:
            return pts[0][1]
        if t >= pts[-1][0]:
            return pts[-1][1]
        for (t0, p0), (t1, p1) in itertools.pairwise(pts):
            if t0 <= t <= t1:
                return p0 if t1 == t0 else p0 + (p1 - p0) * (t - t0) / (t1 - t0)
        raise AssertionError("unreachable: t lies between the first and last sample")

    knots = [start_s, *(t for t, _ in pts if start_s < t < end_s), end_s]
    values = [at(t) for t in knots]
    total = 0.0
    for i in range(len(knots) - 1):
        total += (values[i] + values[i + 1]) / 2 * (knots[i + 1] - knots[i])
    return total


def level_energy(
    trace: Sequence[tuple[float, float]],
    window_s: float,
    output_tokens: int,
    requests: int,
    idle_w: float | None = None,
    gpus: int | None = None,
) -> LevelEnergy | None:
    """The level's `LevelEnergy` from its power trace ((t_s, watts of all its GPUs)) over [0, window_s];
    None without a sample or a window."""
    if not trace or window_s <= 0:
        return None
    energy = integrate(trace, 0.0, window_s)
    inside = sorted(t for t, _ in trace if 0.0 <= t <= window_s)
    interval = (inside[-1] - inside[0]) / (len(inside) - 1) if len(inside) >= 2 else None
    above = None
    if idle_w is not None and output_tokens > 0:
        above = (energy - idle_w * window_s) / output_tokens
    return LevelEnergy(
        energy_j=energy,
        window_s=window_s,
        mean_power_w=energy / window_s,
        j_per_output_token=energy / output_tokens if output_tokens > 0 else None,
        j_per_request=energy / requests if requests > 0 else None,
        output_tokens_per_j=output_tokens / energy if energy > 0 else None,
        idle_w=idle_w,
        j_per_output_token_above_idle=above,
        samples=len(inside),
        interval_s=interval,
        gpus=gpus,
    )


def level_cost(
    price: Price, gpus: int, output_tokens_per_s: float, energy: LevelEnergy | None = None
) -> LevelCost | None:
    """The level's `LevelCost` at `price` for `gpus` GPUs; None when the level produced no tokens."""
    if output_tokens_per_s <= 0 or gpus < 1:
        return None
    per_m = price.gpu_hour_usd * gpus / 3600.0 / output_tokens_per_s * 1e6
    energy_usd = None
    if price.kwh_usd is not None and energy is not None and energy.j_per_output_token is not None:
        energy_usd = energy.j_per_output_token * 1e6 / J_PER_KWH * price.kwh_usd
    return LevelCost(
        usd_per_m_output_tokens=per_m,
        gpu_hour_usd=price.gpu_hour_usd,
        gpus=gpus,
        price_source=price.source,
        kwh_usd=price.kwh_usd,
        energy_usd_per_m_output_tokens=energy_usd,
    )
