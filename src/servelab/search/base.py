"""What a search knows: the points tried so far and how each ended, read back from the store."""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field
from typing import Literal

from servelab.config.sections import CandidateSpec
from servelab.jsontypes import JsonObject
from servelab.space import Point, Space, Value, candidate_fields

Origin = Literal["listed", "prior", "model", "sampler", "grid", "rung", "pruned"]
# A tried point's outcome as the search sees it.
Outcome = Literal["pending", "measured", "collapsed", "failed", "not_applied", "pruned"]


@dataclass(frozen=True)
class NamedSetting:
    """The setting a failed trial's diagnosis names, as the store keeps it (`diagnosis.setting`, written by
    servelab.engines.base.Setting): its name, the value to try and the engine flags that give it."""

    name: str
    value: Value
    flags: tuple[tuple[str, Value], ...] = ()

    @classmethod
    def from_stored(cls, d: object) -> NamedSetting | None:
        """A stored diagnosis's `setting`; None when `d` is not one."""
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            return None
        value, flags = d.get("value"), d.get("flags")
        if not isinstance(value, str | int | float):
            return None
        pairs = flags.items() if isinstance(flags, dict) else ()
        return cls(d["name"], value, tuple((str(k), v) for k, v in pairs if isinstance(v, str | int | float)))


@dataclass(frozen=True)
class Tried:
    """One candidate of the search: its point, how it ended, and its objective values (None unless
    measured). `rung`: the highest fidelity it was measured at (halving: 0 is the short benchmark)."""

    label: str
    point: Point
    outcome: Outcome
    values: tuple[float | None, ...] = ()
    rung: int = 0
    origin: Origin = "sampler"
    not_applied: tuple[str, ...] = ()  # the requested keys that did not take effect
    reason: str = ""  # the diagnosis, the anomaly, or the region that pruned it
    setting: NamedSetting | None = None  # failed: the setting its diagnosis names, from the log's figures

    @property
    def ok(self) -> bool:
        return self.outcome == "measured"

    @property
    def bad(self) -> bool:
        return self.outcome in ("collapsed", "failed", "not_applied")


_OPS = {">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le}


@dataclass(frozen=True)
class Region:
    """Points holding every (key, value) of `values` and within every (key, op, bound) of `bounds` (op
    `>`, `<`, `>=` or `<=`, numbers) are not tried: `kind` says what a trial there did."""

    values: tuple[tuple[str, Value], ...]
    kind: str
    source: str  # the candidate that taught it
    reason: str
    bounds: tuple[tuple[str, str, float], ...] = ()

    def holds(self, point: Point) -> bool:
        return all(
            k in point and type(point[k]) is type(v) and point[k] == v for k, v in self.values
        ) and all(
            k in point
            and isinstance(x := point[k], int | float)
            and not isinstance(x, bool)
            and _OPS[op](x, b)
            for k, op, b in self.bounds
        )

    def text(self) -> str:
        parts = [f"{k} = {v!r}" for k, v in self.values] + [f"{k} {op} {b:g}" for k, op, b in self.bounds]
        return " and ".join(parts)

    def to_dict(self) -> JsonObject:
        d = {**asdict(self), "values": dict(self.values), "where": self.text()}
        d["bounds"] = [list(b) for b in self.bounds]
        return d


@dataclass(frozen=True)
class Proposal:
    """The next candidate: a point to run at `rung`, or (pruned) one the search will not run, and why."""

    point: Point
    origin: Origin
    rung: int = 0
    region: Region | None = None
    predicted: float | None = None  # the (refitted) model's objective value for it

    @property
    def pruned(self) -> bool:
        return self.region is not None


@dataclass
class History:
    tried: list[Tried] = field(default_factory=list)
    # candidate trials launched so far (repeats and rungs included), and their wall time in seconds
    trials_used: int = 0
    elapsed_s: float = 0.0

    def labels(self) -> set[str]:
        return {t.label for t in self.tried}

    def keyset(self) -> set[tuple[tuple[str, Value], ...]]:
        return {point_key(t.point) for t in self.tried}


def point_key(point: Point) -> tuple[tuple[str, Value], ...]:
    return tuple(sorted(((k, v) for k, v in point.items()), key=lambda kv: kv[0]))


def candidate(point: Point, space: Space | None = None) -> CandidateSpec:
    """The candidate a point is (`space.candidate_fields`, validated)."""
    return CandidateSpec.model_validate(candidate_fields(point, space))
