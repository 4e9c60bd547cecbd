"""A trial's steps written to its row (and the plan moved) before the trial's next step starts, so a study
stopped at any point resumes from what is stored; and what a resume keeps of an interrupted trial."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from servelab import crashpoint
from servelab.engines.base import LaunchSpec
from servelab.errors import HostLost
from servelab.events import (
    BenchEvent,
    LevelDone,
    LevelStarted,
    NotApplied,
    Observer,
    RunStarted,
    ServerDied,
    StoppedEarly,
    TrialBench,
    TrialFinished,
    TrialLost,
    TrialPlaced,
    TrialReady,
    TrialTeardown,
)
from servelab.executors.base import Placement
from servelab.jsontypes import JsonObject
from servelab.lifecycle.handle import ServerHandle, TeardownReport
from servelab.results import Node
from servelab.startup import StartupPhases
from servelab.store.studies import StoredTrial, StudyRepo
from servelab.trial.outcome import AppliedCheck, Finding, LevelResult, TrialObserver, TrialOutcome
from servelab.tune.plansync import PlanSync

if TYPE_CHECKING:
    from servelab.verify import VerifyResult


class TrialRecorder(TrialObserver):
    """Stores each step of one trial in its row (and moves the plan) before the trial's next step starts."""

    def __init__(
        self,
        repo: StudyRepo,
        notify: Observer,
        plan: PlanSync,
        uid: str,
        tid: int,
        label: str,
        cand_id: int,
        last_repeat: bool = True,
    ) -> None:
        self.repo, self.notify, self.plan = repo, notify, plan
        self.uid, self.tid, self.label, self.cand_id = uid, tid, label, cand_id
        self.last_repeat = last_repeat  # a measured trial ends its candidate as measured
        self.effective: JsonObject | None = None

    def launching(self, launch: LaunchSpec, log_path: Path) -> None:
        self.repo.update_trial(
            self.tid, argv=launch.argv, env=launch.env, url=launch.url, log_path=str(log_path)
        )
        crashpoint.reached("launching")

    def launched(self, server: ServerHandle) -> None:
        self.repo.update_trial(self.tid, pid=server.pid)
        crashpoint.reached("launched")

    def startup(self, phases: StartupPhases) -> None:
        self.repo.update_trial(self.tid, startup=phases.model_dump(mode="json"))

    def ready(self, url: str, ready_s: float) -> None:
        self.repo.update_trial(self.tid, ready_s=ready_s, status="verifying")
        self.notify(TrialReady(self.label, url, ready_s))
        crashpoint.reached("ready")

    def applied(self, check: AppliedCheck) -> None:
        self.effective = check.effective.to_dict()
        self.repo.update_trial(
            self.tid,
            requested=check.requested,
            effective=self.effective,
            engine_version=check.effective.effective.get("version"),
            not_applied=[m.to_dict() for m in check.mismatches],
        )
        if check.mismatches:
            self.notify(NotApplied(self.label, [m.sentence() for m in check.mismatches]))

    def verified(self, result: VerifyResult) -> None:
        self.repo.update_trial(self.tid, verify=result.to_dict())
        crashpoint.reached("verified")

    def benchmarking(self) -> None:
        self.repo.update_trial(self.tid, status="benchmarking")

    def bench_event(self, event: BenchEvent) -> None:
        if isinstance(event, RunStarted):
            self.repo.update_trial(self.tid, bench_open=event.uid)
        self.notify(TrialBench(self.label, event))
        if isinstance(event, LevelStarted):
            crashpoint.reached("level-started")

    def level_done(self, level: LevelResult, levels: list[LevelResult]) -> None:
        if len(levels) == 1:
            self.repo.update_trial(self.tid, bench_run_id=level.bench_run_id)
        self.repo.update_trial(self.tid, levels=[lv.stored() for lv in levels], bench_open=None)
        self.notify(LevelDone(self.label, level.stored()))
        crashpoint.reached("level-done")

    def stopped_early(self, reason: str) -> None:
        self.notify(StoppedEarly(self.label, reason))

    def server_died(self, levels: list[LevelResult], diagnosis: Finding) -> None:
        diag = diagnosis.to_dict()
        self.repo.update_trial(self.tid, levels=[lv.stored() for lv in levels], diagnosis=diag)
        self.notify(ServerDied(self.label, diag))

    def finished(self, outcome: TrialOutcome) -> None:
        """The trial's end and, when it decides it, its candidate's status: one transaction (a kill
        between the two used to leave a measured trial under a `running` candidate, dropped from the
        ranking on resume)."""
        record = outcome.record()
        with self.repo.transaction():
            if outcome.status == "measured":
                levels = [lv.stored() for lv in outcome.levels]
                self.repo.update_trial(self.tid, levels=levels, status="measured", bench_open=None)
                if self.last_repeat:
                    self.repo.set_candidate(self.cand_id, "measured", {})
            else:
                if outcome.diagnosis is not None and outcome.stage != "command":
                    self.repo.update_trial(self.tid, diagnosis=outcome.diagnosis.to_dict())
                self.repo.update_trial(self.tid, status=outcome.status, bench_open=None)
                self.repo.set_candidate(self.cand_id, outcome.status, record)
        if outcome.status == "measured":
            self._plan("measured", {"effective": self.effective})
        else:
            self.notify(TrialFinished(self.label, outcome.status, record))
            self._plan(outcome.status, {"effective": self.effective, **record})
        crashpoint.reached("finished")

    def _plan(self, status: str, evidence: JsonObject) -> None:
        self.plan.trial(self.uid, self.label, self.tid, status, evidence)

    def placed(self, placement: Placement) -> None:
        """The node the trial runs on (a cluster's), stored before anything launches there."""
        if placement.node is not None:
            node = placement.node.model_dump(mode="json")
            self.repo.update_trial(self.tid, node=node)
            self.notify(TrialPlaced(self.label, placement.node.name, node["gpu_ids"]))

    def place_failed(self, why: str) -> TrialOutcome:
        outcome = TrialOutcome(
            "failed",
            "place",
            Finding("does_not_fit", why, "add a node with enough GPUs, or drop the candidate"),
        )
        self.finished(outcome)
        return outcome

    def node_lost(self, exc: HostLost, node: Node | None) -> None:
        """The trial's node died under it: the trial is `lost`, and runs again elsewhere."""
        where = node.name if node is not None else "its node"
        self.notify(TrialLost(self.label, where, exc.message, rerun=True))
        self.repo.update_trial(self.tid, status="lost", error=exc.message, bench_open=None)
        self._plan("lost", {"node": where, "error": exc.message})

    def node_failed(self, exc: HostLost, node: Node | None) -> TrialOutcome:
        """The rerun's node died too: the trial fails with that diagnosis."""
        where = node.name if node is not None else "its node"
        self.notify(TrialLost(self.label, where, exc.message, rerun=False))
        outcome = TrialOutcome(
            "failed",
            "place",
            Finding(
                "node_lost",
                f"{exc.message}; the trial was run again on another node and lost that one too",
                "check the cluster's nodes (`ray status`); `servelab tune STUDY --resume --retry-failed` "
                "tries the candidate again",
            ),
        )
        self.finished(outcome)
        return outcome

    def torn_down(self, report: TeardownReport) -> None:
        self.repo.update_trial(self.tid, teardown=report.to_dict())
        self.notify(TrialTeardown(self.label, self.repo.trials(self.cand_id)[-1].teardown or {}))
        crashpoint.reached("torn-down")


def kept_levels(trials: list[StoredTrial], repeat: int) -> tuple[list[LevelResult], JsonObject]:
    """The levels the last trial of this repeat had measured when it was interrupted (kept, not run
    again), and the columns the new trial starts with. None are kept when a level saw the server die:
    that trial's end is unknown, so it is redone whole."""
    last = next((t for t in reversed(trials) if t.repeat == repeat), None)
    if last is None or last.status != "interrupted" or not last.levels:
        return [], {}
    if any(d.get("died") for d in last.levels):
        return [], {}
    kept = [LevelResult.from_stored(d) for d in last.levels]
    return kept, {"levels": [*last.levels], "resumed_from": last.id, "bench_run_id": last.bench_run_id}


def record_of(trial: StoredTrial) -> JsonObject:
    """A candidate's outcome as its final trial's row shows it (repairing a store written before a trial's
    end and its candidate's status went in one transaction)."""
    if trial.status == "not_applied":
        return {"not_applied": [*(trial.not_applied or [])], "unconfirmed": []}
    return {"diagnosis": trial.diagnosis} if trial.diagnosis else {}
