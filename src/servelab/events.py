"""Progress as typed events: what a benchmark, a study, its search and a deployment's install report as
they go, and what the fronts (the CLI's progress lines and bars) render by the event's type.

Each event is a small frozen dataclass with its `kind` (the name it always had) and `to_dict()`, the
dict it was sent as before it had a type, so a log or a test that reads events as JSON sees the same.
A trial's benchmark events reach the study wrapped in `TrialBench`, the candidate beside the level
(`to_dict` keeps the old merged form, where the level's label wins). Imports nothing of ours but `jsontypes`: every
room below the fronts may report, and every front may render."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import ClassVar

from servelab.jsontypes import JsonObject


@dataclass(frozen=True)
class Event:
    """One step of progress; `kind` names it, `to_dict()` is its JSON form."""

    kind: ClassVar[str] = ""

    def to_dict(self) -> JsonObject:
        return {f.name: getattr(self, f.name) for f in fields(self)}


Observer = Callable[[Event], None]


# -- a benchmark run (bench.runner, bench.level, bench.remote) --------------------------------------


@dataclass(frozen=True)
class BenchEvent(Event):
    """What `run_bench` / `find_capacity` / `bench_remote` report."""


BenchObserver = Callable[[BenchEvent], None]


@dataclass(frozen=True)
class RunStarted(BenchEvent):
    kind: ClassVar[str] = "run_started"
    uid: str
    levels: int
    workload: JsonObject
    warnings: list[str]
    time_base: str


@dataclass(frozen=True)
class LevelStarted(BenchEvent):
    kind: ClassVar[str] = "level_started"
    index: int
    label: str
    num_requests: int | None
    duration_s: float | None
    warmup: int


@dataclass(frozen=True)
class RequestDone(BenchEvent):
    kind: ClassVar[str] = "request_done"
    index: int
    done: int
    ok: bool
    output_tokens: int | None
    ttft_s: float | None
    end_s: float | None
    speed: float


@dataclass(frozen=True)
class LevelFinished(BenchEvent):
    kind: ClassVar[str] = "level_finished"
    index: int
    label: str
    status: str
    client: JsonObject


@dataclass(frozen=True)
class RunFinished(BenchEvent):
    kind: ClassVar[str] = "run_finished"
    uid: str
    status: str


@dataclass(frozen=True)
class ProbeStarted(BenchEvent):
    kind: ClassVar[str] = "probe_started"
    load: float
    why: str


@dataclass(frozen=True)
class ProbeFinished(BenchEvent):
    """A capacity probe's verdict (its `CapacityProbe`, as JSON)."""

    kind: ClassVar[str] = "probe_finished"
    probe: JsonObject

    def to_dict(self) -> JsonObject:
        return dict(self.probe)


@dataclass(frozen=True)
class TrialBench(Event):
    """A trial's benchmark event, with the candidate it measures (`label`; None: a deployment's check)."""

    label: str | None
    event: BenchEvent

    @property
    def kind(self) -> str:  # type: ignore[override]
        return f"bench_{self.event.kind}"

    def to_dict(self) -> JsonObject:
        inner = self.event.to_dict()
        return inner if self.label is None else {"label": self.label, **inner}


# -- a study (tune/, search/) -----------------------------------------------------------------------


@dataclass(frozen=True)
class StudyStarted(Event):
    kind: ClassVar[str] = "study_started"
    uid: str
    candidates: int
    search: str | None


@dataclass(frozen=True)
class StudyResumed(Event):
    kind: ClassVar[str] = "study_resumed"
    uid: str
    orphans: list[JsonObject]


@dataclass(frozen=True)
class StudyFinished(Event):
    """The study's outcome (`StudyOutcome.to_dict()`, what `tune --json` prints)."""

    kind: ClassVar[str] = "study_finished"
    outcome: JsonObject

    def to_dict(self) -> JsonObject:
        return dict(self.outcome)


@dataclass(frozen=True)
class ExecutorStarted(Event):
    kind: ClassVar[str] = "executor_started"
    executor: str
    gpus: int
    s: float

    def to_dict(self) -> JsonObject:
        return {"kind": self.executor, "gpus": self.gpus, "s": self.s}


@dataclass(frozen=True)
class PlanWarning(Event):
    kind: ClassVar[str] = "plan_warning"
    message: str


@dataclass(frozen=True)
class CandidateEvent(Event):
    """An event about one candidate (its trial, or the search's choice of it)."""

    label: str


@dataclass(frozen=True)
class CandidateSkipped(CandidateEvent):
    kind: ClassVar[str] = "candidate_skipped"
    status: str


@dataclass(frozen=True)
class TrialStarted(CandidateEvent):
    kind: ClassVar[str] = "trial_started"
    repeat: int


@dataclass(frozen=True)
class LevelsKept(CandidateEvent):
    kind: ClassVar[str] = "levels_kept"
    levels: list[float]


@dataclass(frozen=True)
class TrialPlaced(CandidateEvent):
    kind: ClassVar[str] = "trial_placed"
    node: str
    gpus: list[str]


@dataclass(frozen=True)
class TrialReady(CandidateEvent):
    kind: ClassVar[str] = "trial_ready"
    url: str
    ready_s: float


@dataclass(frozen=True)
class NotApplied(CandidateEvent):
    kind: ClassVar[str] = "not_applied"
    mismatches: list[str]


@dataclass(frozen=True)
class LevelDone(CandidateEvent):
    """A level measured: its stored digest (`LevelResult.stored()`)."""

    kind: ClassVar[str] = "level_done"
    digest: JsonObject


@dataclass(frozen=True)
class StoppedEarly(CandidateEvent):
    kind: ClassVar[str] = "stopped_early"
    reason: str


@dataclass(frozen=True)
class ServerDied(CandidateEvent):
    kind: ClassVar[str] = "server_died"
    diagnosis: JsonObject


@dataclass(frozen=True)
class TrialFinished(CandidateEvent):
    """A trial that ended other than measured; `record` is its candidate's outcome (`TrialOutcome.record()`:
    the diagnosis, or what was not applied), merged into the JSON form as it always was."""

    kind: ClassVar[str] = "trial_finished"
    status: str
    record: JsonObject

    @property
    def diagnosis(self) -> JsonObject | None:
        found = self.record.get("diagnosis")
        return found if isinstance(found, dict) else None

    def to_dict(self) -> JsonObject:
        return {"label": self.label, "status": self.status, **self.record}


@dataclass(frozen=True)
class TrialLost(CandidateEvent):
    kind: ClassVar[str] = "trial_lost"
    node: str
    error: str
    rerun: bool


@dataclass(frozen=True)
class TrialTeardown(CandidateEvent):
    kind: ClassVar[str] = "trial_teardown"
    teardown: JsonObject


@dataclass(frozen=True)
class SearchProposed(CandidateEvent):
    kind: ClassVar[str] = "search_proposed"
    origin: str
    predicted: float | None


@dataclass(frozen=True)
class SearchPruned(CandidateEvent):
    kind: ClassVar[str] = "search_pruned"
    region: JsonObject | None


@dataclass(frozen=True)
class SearchPromoted(CandidateEvent):
    kind: ClassVar[str] = "search_promoted"
    rung: int


# -- a deployment's install (deploy.install) --------------------------------------------------------


@dataclass(frozen=True)
class Systemctl(Event):
    kind: ClassVar[str] = "systemctl"
    args: list[str]
