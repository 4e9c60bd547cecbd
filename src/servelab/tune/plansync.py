"""The plan moved as a study runs: one item per candidate, filled when the study opens and moved by each
trial. Plan bookkeeping never stops a study: a refusal is reported (`plan_warning`) and the study goes on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servelab.config.sections import CandidateSpec
from servelab.config.study import Study
from servelab.engines.base import Engine
from servelab.errors import ServelabError
from servelab.events import Observer, PlanWarning
from servelab.jsontypes import JsonObject
from servelab.plan.study import TUNE_WORKER
from servelab.store import plans
from servelab.store.db import Store
from servelab.store.studies import StoredCandidate, StudyRepo
from servelab.trial.prepare import settings_for

# Requested keys that describe where a server runs, not what is being tried: not part of a plan item.
_NOT_PLANNED = ("port", "host", "model", "served_model_name")


class PlanSync:
    """The plan items of one study's candidates. On a cluster each candidate is a worker of its own
    (`parallel`): their trials run at once."""

    def __init__(self, study: Study, store: Store, engine: Engine, notify: Observer, parallel: bool) -> None:
        self.study, self.store, self.engine, self.notify = study, store, engine, notify
        self.repo = StudyRepo(store)
        self.parallel = parallel

    def fill(self, uid: str, cands: list[StoredCandidate]) -> None:
        """One item per candidate not pruned, with what it requests of the engine and its prediction."""
        specs = {c.label(): c for c in self.study.candidates}
        rows = []
        for c in cands:
            if c.status == "pruned":
                continue
            spec = specs.get(c.label) or CandidateSpec.model_validate(c.spec)  # a search's own
            req = self.engine.requested(settings_for(self.study, spec))
            own = {k: v for k, v in req.items() if k not in _NOT_PLANNED}
            p = (c.predicted or {}).get("output_throughput")
            rows.append((c.label, p if isinstance(p, int | float) else None, own))
        self._call(lambda: plans.fill_from_study(self.store, uid, rows))

    def move(self, uid: str, label: str, status: str, evidence: JsonObject) -> None:
        actor = f"{TUNE_WORKER}:{label}" if self.parallel else TUNE_WORKER
        self._call(lambda: plans.on_trial(self.store, uid, label, status, evidence, actor=actor))

    def trial(self, uid: str, label: str, tid: int, status: str, evidence: JsonObject) -> None:
        """A trial's step, with the trial and its run as the item's evidence (empty values left out)."""
        ref: JsonObject = {"trial": tid, "run": f"{uid}/{label}/t{tid}"}
        self.move(uid, label, status, {**ref, **{k: v for k, v in evidence.items() if v is not None}})

    def close_not_applied(self, uid: str, cand: StoredCandidate, outcome: JsonObject) -> None:
        """The study is over: a not-applied candidate's item is closed as not applied, with its last
        trial's evidence (what was requested, what runs, the log line), so no item is left pending."""
        trials = self.repo.trials(cand.id)
        last = trials[-1] if trials else None
        evidence: JsonObject = {
            "run": f"{uid}/{cand.label}" + (f"/t{last.id}" if last is not None else ""),
            "not_applied": outcome.get("not_applied")
            or ([*last.not_applied] if last is not None and last.not_applied else None)
            or [],
            "unconfirmed": outcome.get("unconfirmed") or [],
        }
        if last is not None:
            evidence["trial"] = last.id
            if last.effective:  # the mismatches are found again from what runs (not twice)
                evidence["effective"] = last.effective
                evidence.pop("not_applied")
        self._call(lambda: plans.close_not_applied(self.store, uid, cand.label, evidence))

    def _call(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except ServelabError as exc:
            self.notify(PlanWarning(exc.message))
