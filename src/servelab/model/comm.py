"""Collectives: a latency term (per call, grows with hops) and a bandwidth term (bytes on the wire).

Decode allreduces are a few KB (tokens × hidden × 2 bytes), so over PCIe they are latency-bound:
tens of µs each, and a 78-layer model does 156 of them per step. Prefill allreduces are MBs and
bandwidth-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.model.factors import Factors
from servelab.model.hardware import Interconnect


@dataclass(frozen=True)
class Fabric:
    """The numbers a collective needs, after host measurements replace catalog values."""

    bus_gbs: float
    base_us: float
    hop_us: float
    measured_us: tuple[tuple[int, float], ...] = ()

    def latency_us(self, ranks: int) -> float:
        """Small-message latency of one allreduce over `ranks` GPUs."""
        if ranks <= 1:
            return 0.0
        if self.measured_us:
            pts = sorted(self.measured_us)
            for n, us in pts:
                if n == ranks:
                    return us
            # nearest measured rank count, scaled by the ring's hop count
            n, us = min(pts, key=lambda p: abs(p[0] - ranks))
            return (
                us
                * (self.base_us + self.hop_us * 2 * (ranks - 1))
                / (self.base_us + self.hop_us * 2 * (n - 1))
            )
        return self.base_us + self.hop_us * 2 * (ranks - 1)


def make_fabric(ic: Interconnect, factors: Factors) -> Fabric:
    measured = tuple(sorted((int(k), float(v)) for k, v in (factors.allreduce_us or {}).items()))
    return Fabric(
        bus_gbs=factors.bus_gbs or ic.bus_gbs,
        base_us=ic.base_us,
        hop_us=ic.hop_us,
        measured_us=measured,
    )


def allreduce_bw_s(fabric: Fabric, ranks: int, nbytes: float) -> float:
    """Bandwidth term of a ring allreduce, seconds (latency excluded)."""
    if ranks <= 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * nbytes / (fabric.bus_gbs * 1e9)


def allreduce_s(fabric: Fabric, ranks: int, nbytes: float, lat_scale: float = 1.0) -> float:
    """One allreduce: latency + bandwidth, seconds."""
    if ranks <= 1:
        return 0.0
    return fabric.latency_us(ranks) * 1e-6 * lat_scale + allreduce_bw_s(fabric, ranks, nbytes)


def gather_bw_s(fabric: Fabric, ranks: int, nbytes: float) -> float:
    """Bandwidth term of an all-gather / reduce-scatter / all-to-all of `nbytes` in total."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * nbytes / (fabric.bus_gbs * 1e9)
