"""What a study run is asked for (`TuneOptions`) and what it answers (`StudyOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.events import Observer


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
    candidates: list[dict[str, Any]]
    ranking: dict[str, Any]
    swept: list[dict[str, Any]] = field(default_factory=list)
    search: dict[str, Any] | None = None  # [search]: strategy, budget, pruned regions, model errors, Pareto
    load: dict[str, Any] | None = None  # the study's load kind: mode, levels, main level, unit

    def to_dict(self) -> dict[str, Any]:
        out = {
            "study": self.uid,
            "status": self.status,
            "candidates": self.candidates,
            "ranking": self.ranking,
            "orphans_cleaned": self.swept,
        }
        if self.load is not None:
            out["load"] = self.load
        if self.search is not None:
            out["search"] = self.search
        return out
