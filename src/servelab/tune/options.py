"""What a study run is asked for (`TuneOptions`) and what it answers (`StudyOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.events import Observer
from servelab.jsontypes import JsonObject


@dataclass
class TuneOptions:
    resume: bool = False
    retry_failed: bool = False
    observe: Observer | None = None
    startup_timeout_s: float | None = None  # overrides the study's and the engine's
    host: str | None = None  # --host: overrides $SERVELAB_HOST and the study's [host] ssh
    executor: str | None = None  # --executor: overrides the study's [executor] kind
    ray_address: str | None = None  # --ray-address: overrides [executor] address and $RAY_ADDRESS


@dataclass
class StudyOutcome:
    uid: str
    status: str
    candidates: list[JsonObject]
    ranking: JsonObject
    swept: list[JsonObject] = field(default_factory=list)
    search: JsonObject | None = None  # [search]: strategy, budget, pruned regions, model errors, Pareto
    load: JsonObject | None = None  # the study's load kind: mode, levels, main level, unit

    def to_dict(self) -> JsonObject:
        """What `tune --json` prints (and `StudyFinished` carries): written out, not read back by key."""
        out: JsonObject = {
            "study": self.uid,
            "status": self.status,
            "candidates": [*self.candidates],
            "ranking": self.ranking,
            "orphans_cleaned": [*self.swept],
        }
        if self.load is not None:
            out["load"] = self.load
        if self.search is not None:
            out["search"] = self.search
        return out
