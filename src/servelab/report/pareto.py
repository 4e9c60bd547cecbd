"""The Pareto front of a study's (or a bench run's) levels: output tokens per second per GPU against tokens per
second per user (1000 / the median TPOT in ms), the two figures the field compares serving configurations on
(vLLM's `bench sweep plot_pareto`, the InferenceMAX charts). Pure and typed: `front` over any points with
accessors for the two axes, so another pair (J/token against throughput) is one more call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

from servelab.results import Layout

P = TypeVar("P")


def front(
    points: Sequence[P],
    x: Callable[[P], float],
    y: Callable[[P], float],
    *,
    maximise: tuple[bool, bool] = (True, True),
) -> list[P]:
    """The points no other point dominates: another point dominates p when it is at least as good on both
    axes and better on one (`maximise`: per axis, whether higher is better). Points equal on both axes do
    not dominate each other: every one of a tie is on the front. In the order of x, ascending (a line
    through them in that order is the front)."""
    sx = 1.0 if maximise[0] else -1.0
    sy = 1.0 if maximise[1] else -1.0
    keyed = [(sx * x(p), sy * y(p), p) for p in points]
    out = [
        p for a, b, p in keyed if not any(a2 >= a and b2 >= b and (a2 > a or b2 > b) for a2, b2, _q in keyed)
    ]
    return sorted(out, key=x)


# J per output token against output tok/s: more throughput is better, fewer joules are
ENERGY_AXES = (True, False)


@dataclass(frozen=True)
class EnergyPoint:
    """One measured level's output tok/s and J per output token (`servelab.energy`)."""

    candidate: str
    level: float
    output_throughput: float
    j_per_output_token: float

    @property
    def name(self) -> str:
        return f"{self.candidate} @ {self.level:g}"

    def to_json(self) -> dict[str, str | float]:
        return asdict(self)

    @classmethod
    def of(cls, d: Mapping[str, str | float]) -> EnergyPoint:
        """A point read back from its JSON (`to_json`)."""
        return cls(
            str(d["candidate"]),
            float(d["level"]),
            float(d["output_throughput"]),
            float(d["j_per_output_token"]),
        )


@dataclass(frozen=True)
class ParetoPoint:
    """One measured level: `candidate` (a study's candidate, or a bench run's uid) at `level`, its output
    tok/s divided by the `gpus` its server held, and tok/s per user = 1000 / TPOT p50 (ms)."""

    candidate: str
    level: float
    output_tps_per_gpu: float
    tps_per_user: float
    gpus: int

    @property
    def name(self) -> str:
        """How a chart and the text name it: the candidate and the level."""
        return f"{self.candidate} @ {self.level:g}"

    def to_json(self) -> dict[str, str | float | int]:
        return asdict(self)

    @classmethod
    def of(cls, d: Mapping[str, str | float | int]) -> ParetoPoint:
        """A point read back from its JSON (`to_json`)."""
        return cls(
            str(d["candidate"]),
            float(d["level"]),
            float(d["output_tps_per_gpu"]),
            float(d["tps_per_user"]),
            int(d["gpus"]),
        )


def tps_per_user(tpot_ms_p50: float | None) -> float | None:
    """Tokens per second one user sees: 1000 / the median time per output token in ms (None: no TPOT)."""
    return None if tpot_ms_p50 is None or tpot_ms_p50 <= 0 else 1000.0 / tpot_ms_p50


def point(
    candidate: str, level: float, output_throughput: float | None, tpot_ms_p50: float | None, gpus: int
) -> ParetoPoint | None:
    """The point of one level (None: the level has no throughput or no TPOT)."""
    per_user = tps_per_user(tpot_ms_p50)
    if output_throughput is None or per_user is None:
        return None
    return ParetoPoint(candidate, float(level), output_throughput / max(gpus, 1), per_user, max(gpus, 1))


def throughput_front(points: Sequence[ParetoPoint]) -> list[ParetoPoint]:
    """The front that maximises both output tok/s per GPU and tok/s per user, in the order of tok/s per user."""
    return front(points, lambda p: p.tps_per_user, lambda p: p.output_tps_per_gpu)


def layout_gpus(tp: int | None, pp: int | None = None, dp: int | None = None) -> int:
    """The GPUs a server of this layout holds: tp × pp × dp (`results.Layout.gpus`; 1 when unknown)."""
    return Layout(tp=tp or 1, pp=pp, dp=dp).gpus or 1


def members_text(members: Sequence[ParetoPoint], name: Callable[[ParetoPoint], str] | None = None) -> str:
    """The front's members in words (`name`: how a member is called; by default `ParetoPoint.name`), one
    wording for Markdown and HTML."""
    if not members:
        return "no measured level"
    call = name or (lambda p: p.name)
    return "; ".join(
        f"{call(p)} ({p.output_tps_per_gpu:,.1f} tok/s per GPU, {p.tps_per_user:,.1f} tok/s per user)"
        for p in members
    )
