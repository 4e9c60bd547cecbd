"""Load kinds as types (issue 30): how a study (or a bench run) loads a server, each kind owning its axis
label, its unit, its main-level rule, its warm-up and what one of its levels means as a concurrency for the
performance model, which predicts a number of requests in flight.

    ConcurrencyLoad  closed loop: a level is that many requests in flight
    SessionsLoad     closed loop of multi-turn conversations: a level is that many conversations at once
    RateLoad         open loop: a level is a request rate (req/s) on the server's clock
    TraceLoad        open loop at a trace's own timestamps: a level is its time scale (×2 = twice as fast)

The bench driver calls a level's kind its `mode` ("concurrency", "rate", "trace"; sessions run as
"concurrency"); `kind_of(mode)` gives the class for a level that only knows its mode. Pure: imports nothing
of ours, so results' readers, bench, search, tune, report and the CLI all take it from here.
Adding a kind is adding a class here and naming it in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from servelab.jsontypes import JsonObject, JsonValue

Mode = Literal["concurrency", "rate", "trace"]
# the model's largest batch a rate is searched over (no engine keeps more requests in flight)
_MAX_MODEL_CONCURRENCY = 4096


@dataclass(frozen=True, slots=True)
class ModelConcurrency:
    """A level as the model takes it: `concurrency` requests in flight, or None with the `reason` it has
    none (an open loop whose offered rate is unknown)."""

    concurrency: int | None
    reason: str | None = None


@dataclass(frozen=True)
class _Load:
    levels: tuple[float, ...]
    main_given: float | None = None

    kind: ClassVar[str]
    mode: ClassVar[Mode]
    unit: ClassVar[str]
    axis_label: ClassVar[str]
    closed_loop: ClassVar[bool]
    study_key: ClassVar[str]  # the [load] key that lists the levels

    # -- the main level: the one rule --------------------------------------------------------------------
    @property
    def main(self) -> float:
        """The level `tune` predicts, halving's rung 0 runs and deployment checks use: the study's
        `load.main`, else its highest level."""
        if self.main_given is not None:
            return float(self.main_given)
        if not self.levels:
            raise ValueError("a load with no levels has no main level")
        return float(max(self.levels))

    @classmethod
    def level_value(cls, value: float) -> float | int:
        """A level as the study file spells it (a concurrency is a whole number)."""
        return float(value)

    # -- what it is called --------------------------------------------------------------------------------
    @classmethod
    def label(cls, value: float) -> str:
        return f"{value:g} {cls.unit}"

    def describe(self, value: float | None = None) -> JsonObject:
        """One level (the main one unless given) as the views show it."""
        v = self.main if value is None else value
        return {"mode": self.mode, "level": self.level_value(v), "unit": self.unit}

    def summary(self) -> JsonObject:
        """The whole load as the views show it."""
        levels: list[JsonValue] = [self.level_value(v) for v in self.levels]
        return {
            "mode": self.mode,
            "levels": levels,
            "main": self.level_value(self.main),
            "unit": self.unit,
        }

    # -- behaviour ----------------------------------------------------------------------------------------
    @classmethod
    def warmup_streams(cls, value: float, max_concurrency: int | None) -> int:
        """How many streams a level's warm-up fills (closed loop: the level; open loop: its cap, or 4)."""
        return int(value) if cls.closed_loop else int(max_concurrency or 4)

    @classmethod
    def measured_concurrency(
        cls, value: float, request_throughput: float | None, e2e_ms_mean: float | None
    ) -> int:
        """The requests in flight a measured level had: a closed loop's level; an open loop's by Little's law
        (completed requests/s × mean time in the system), which holds in any one time base."""
        if cls.closed_loop:
            return int(value)
        if not request_throughput or not e2e_ms_mean:
            return 1
        return max(1, round(request_throughput * e2e_ms_mean / 1000.0))

    def offered_rate(self, value: float) -> float | None:
        """Requests/s a level offers on the server's clock (None: a closed loop, or unknown)."""
        return None

    def as_concurrency_for_model(
        self, value: float, request_rate_at: Callable[[int], float | None], speed: float = 1.0
    ) -> ModelConcurrency:
        """The concurrency the model predicts a level at. A closed loop is its level. An open loop offers a
        rate: the model's batch is the smallest concurrency whose predicted request rate reaches it (in the
        GPU's time: the server's rate ÷ `speed`, a simulator's clock), else its busiest feasible batch.
        `request_rate_at(c)` is the model's requests/s at concurrency c (None: not feasible)."""
        if self.closed_loop:
            return ModelConcurrency(int(value))
        rate = self.offered_rate(value)
        if rate is None:
            return ModelConcurrency(
                None, f"{self.label(value)} offers an unknown request rate; the model predicts a concurrency"
            )
        target = rate / (speed or 1.0)
        lo, hi = 1, _MAX_MODEL_CONCURRENCY
        reached = request_rate_at(hi)
        if reached is not None and reached < target:
            return ModelConcurrency(
                hi, f"{self.label(value)} is above the model's peak ({reached:.3g} req/s)"
            )
        while lo < hi:  # the predicted rate grows with the batch until it stops being feasible
            mid = (lo + hi) // 2
            got = request_rate_at(mid)
            if got is not None and got < target:
                lo = mid + 1
            else:
                hi = mid
        return ModelConcurrency(lo)


@dataclass(frozen=True)
class ConcurrencyLoad(_Load):
    kind: ClassVar[str] = "concurrency"
    mode: ClassVar[Mode] = "concurrency"
    unit: ClassVar[str] = "in flight"
    axis_label: ClassVar[str] = "concurrency (requests in flight)"
    closed_loop: ClassVar[bool] = True
    study_key: ClassVar[str] = "concurrency"

    @classmethod
    def level_value(cls, value: float) -> float | int:
        return int(value)

    @classmethod
    def label(cls, value: float) -> str:
        return f"concurrency {int(value)}"


@dataclass(frozen=True)
class SessionsLoad(ConcurrencyLoad):
    kind: ClassVar[str] = "sessions"
    unit: ClassVar[str] = "sessions"
    axis_label: ClassVar[str] = "sessions (conversations at once)"

    @classmethod
    def label(cls, value: float) -> str:
        return f"{int(value)} sessions"


@dataclass(frozen=True)
class RateLoad(_Load):
    kind: ClassVar[str] = "rate"
    mode: ClassVar[Mode] = "rate"
    unit: ClassVar[str] = "req/s"
    axis_label: ClassVar[str] = "request rate (req/s)"
    closed_loop: ClassVar[bool] = False
    study_key: ClassVar[str] = "rate"

    @classmethod
    def label(cls, value: float) -> str:
        return f"rate {value:g} req/s"

    def offered_rate(self, value: float) -> float | None:
        return float(value)


@dataclass(frozen=True)
class TraceLoad(_Load):
    # requests/s of the trace (as sliced) at time scale 1; None where it was not read
    trace_rate: float | None = None

    kind: ClassVar[str] = "trace"
    mode: ClassVar[Mode] = "trace"
    unit: ClassVar[str] = "× trace time"
    axis_label: ClassVar[str] = "trace time scale (× its timestamps' speed)"
    closed_loop: ClassVar[bool] = False
    study_key: ClassVar[str] = "time_scale"

    @classmethod
    def label(cls, value: float) -> str:
        return f"trace ×{value:g}"

    def offered_rate(self, value: float) -> float | None:
        return None if self.trace_rate is None else self.trace_rate * value


LoadKind = ConcurrencyLoad | SessionsLoad | RateLoad | TraceLoad
KINDS: dict[str, type[_Load]] = {k.kind: k for k in (ConcurrencyLoad, SessionsLoad, RateLoad, TraceLoad)}


def in_flight_text(mode: str | None, level: float | None, concurrency: int) -> str:
    """An explained level's concurrency cell: `16`; an open loop's `1 (rate 1.5 req/s)`, so a rate is
    never read as a concurrency."""
    kind = KINDS.get(mode or "concurrency", ConcurrencyLoad)
    if kind.closed_loop or level is None:
        return str(concurrency)
    return f"{concurrency} ({kind.label(level)})"


def kind_of(mode: str) -> type[_Load]:
    """The kind of a level that knows only its mode (a stored level, a bench LevelSpec)."""
    try:
        return KINDS[mode]
    except KeyError:
        raise ValueError(f"unknown load mode {mode!r}; known: {', '.join(KINDS)}") from None


def make(
    mode: str,
    levels: Sequence[float],
    main: float | None = None,
    *,
    sessions: bool = False,
    trace_rate: float | None = None,
) -> LoadKind:
    """The typed load of a study's `[load]` (mode and levels) and its workload (sessions or not)."""
    lv = tuple(float(v) for v in levels)
    if mode == "concurrency":
        return SessionsLoad(lv, main) if sessions else ConcurrencyLoad(lv, main)
    if mode == "rate":
        return RateLoad(lv, main)
    if mode == "trace":
        return TraceLoad(lv, main, trace_rate)
    raise ValueError(f"unknown load mode {mode!r}; known: concurrency, rate, trace")


def of_spec(
    load: Mapping[str, object] | None, workload: Mapping[str, object] | None = None
) -> LoadKind | None:
    """`from_spec`, or None for a stored study whose load names no levels (the readers show none)."""
    try:
        return from_spec(load or {}, workload)
    except ValueError:
        return None


def from_spec(load: Mapping[str, object], workload: Mapping[str, object] | None = None) -> LoadKind:
    """The typed load of a stored study's `load` and `workload` tables (the report's dicts); ValueError when
    they name no levels or are not numbers."""
    for mode, key in (("concurrency", "concurrency"), ("rate", "rate"), ("trace", "trace")):
        if load.get(key) is not None:
            levels = (load.get("time_scale") or [1.0]) if mode == "trace" else load[key]
            main = load.get("main")
            sessions = (workload or {}).get("kind") == "sessions"
            return make(mode, _numbers(levels), _number(main), sessions=sessions)
    raise ValueError("the load names no concurrency, rate or trace")


def _number(v: object) -> float | None:
    """A stored number as `float()` reads it (None stays None); TypeError for what it cannot read."""
    if v is None:
        return None
    if isinstance(v, int | float | str):
        return float(v)
    raise TypeError(f"{v!r} is not a number")


def _numbers(v: object) -> list[float]:
    """A stored list of levels as numbers; TypeError for what is not one."""
    if not isinstance(v, list | tuple):
        raise TypeError(f"{v!r} is not a list of levels")
    out = []
    for x in v:
        n = _number(x)
        if n is None:
            raise TypeError("a level is missing")
        out.append(n)
    return out
