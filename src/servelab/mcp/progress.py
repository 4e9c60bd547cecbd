"""A study's progress from what its driver stored: the store is the one place a study's state is
written (every step commits), so any number of readers can poll it while a `servelab tune` runs."""

from __future__ import annotations

from datetime import UTC, datetime

from servelab import load as load_kinds
from servelab.jsontypes import JsonObject
from servelab.mcp.models import (
    CandidateProgress,
    Driver,
    Finding,
    LevelFigures,
    TrialProgress,
    TuneProgress,
)
from servelab.store.db import Store
from servelab.store.leases import holder
from servelab.store.studies import TERMINAL_TRIAL, StoredCandidate, StoredTrial, StudyRepo

_ENDED_TRIAL = (*TERMINAL_TRIAL, "interrupted", "lost")


def _ts(text: str | None) -> datetime | None:
    return None if not text else datetime.fromisoformat(text)


def _levels(trial: StoredTrial) -> list[float]:
    return [float(x) for lv in trial.levels or [] if isinstance(x := lv.get("level"), int | float)]


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _dicts(v: object) -> list[JsonObject]:
    """The objects of a stored JSON list (an absent or malformed one: none)."""
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _figures(trial: StoredTrial) -> list[LevelFigures]:
    """The trial's measured levels with their throughput, energy and cost, as its digests stored them."""
    return [
        LevelFigures(
            repeat=trial.repeat,
            level=_number(lv["level"]) or 0.0,
            output_throughput=_number(lv.get("output_throughput")),
            energy_j=_number(lv.get("energy_j")),
            j_per_output_token=_number(lv.get("j_per_output_token")),
            j_per_output_token_above_idle=_number(lv.get("j_per_output_token_above_idle")),
            usd_per_m_output_tokens=_number(lv.get("usd_per_m_output_tokens")),
        )
        for lv in trial.levels or []
        if lv.get("level") is not None
    ]


def _findings(cand: StoredCandidate, trials: list[StoredTrial]) -> list[Finding]:
    label = cand.label
    out = [
        Finding(
            candidate=label,
            kind="not_applied",
            detail=f"requested {n.get('key')}={n.get('requested')!r}, the engine runs {n.get('effective')!r}",
        )
        for n in _dicts((cand.outcome or {}).get("not_applied"))
    ]
    out += [
        Finding(
            candidate=label, kind=str(a.get("kind")), detail=f"level {a.get('level'):g}: {a.get('detail')}"
        )
        for a in _dicts((cand.outcome or {}).get("anomalies"))
    ]
    if not out:  # a trial that ended without its candidate's outcome yet (the study still runs)
        for t in trials:
            if t.status == "not_applied":
                out += [
                    Finding(
                        candidate=label,
                        kind="not_applied",
                        detail=f"requested {n.get('key')}={n.get('requested')!r}, "
                        f"the engine runs {n.get('effective')!r}",
                    )
                    for n in t.not_applied or []
                ]
    out += [
        Finding(candidate=label, kind="failed", detail=str(t.error or "the trial failed"))
        for t in trials
        if t.status == "failed"
    ]
    return out


def progress(store: Store, ref: str, now: datetime | None = None) -> TuneProgress:
    """The study `ref` (uid, name or `last`) as it stands: trials under way, levels measured of the
    levels planned, the ETA at the pace of the trials that ended, and what was found so far."""
    repo = StudyRepo(store)
    st = repo.resolve(ref)
    now = now or datetime.now(UTC)
    spec = st.spec
    adaptive = bool(spec.get("search"))
    repeats = r if isinstance(r := spec.get("repeats"), int) and r else 1
    load, workload = spec.get("load"), spec.get("workload")
    kind = load_kinds.of_spec(
        load if isinstance(load, dict) else None, workload if isinstance(workload, dict) else None
    )
    planned_levels = len(kind.levels) if kind is not None else None
    cands = repo.candidates(st.id)
    running: list[TrialProgress] = []
    rows: list[CandidateProgress] = []
    findings: list[Finding] = []
    ended: list[float] = []
    levels_done = 0
    trials_done = 0
    for c in cands:
        trials = repo.trials(c.id)
        done_here = 0
        figures: list[LevelFigures] = []
        for t in trials:
            figures += _figures(t)
            got = _levels(t)
            done_here += len(got)
            if t.status in _ENDED_TRIAL:
                trials_done += 1
                start, end = _ts(t.started_at), _ts(t.finished_at)
                if start and end:
                    ended.append((end - start).total_seconds())
            else:
                running.append(
                    TrialProgress(
                        candidate=c.label,
                        repeat=t.repeat,
                        status=t.status,
                        levels_done=got,
                        started_at=t.started_at,
                    )
                )
        levels_done += done_here
        findings += _findings(c, trials)
        rows.append(
            CandidateProgress(
                label=c.label, status=c.status, trials=len(trials), levels_done=done_here, levels=figures
            )
        )
    total = None if adaptive else len(cands) * repeats
    owner = holder(store, st.id)
    started = _ts(st.created_at) or now
    finished = _ts(st.finished_at)
    eta: float | None = None
    if st.status != "running":
        eta = 0.0
    elif ended and total is not None:
        eta = sum(ended) / len(ended) * max(total - trials_done, 0)
    return TuneProgress(
        study=st.uid,
        name=st.name,
        status=st.status,
        driver=None if owner is None else Driver(pid=owner.pid, host=owner.host, alive=owner.alive()),
        running=running,
        candidates=rows,
        trials_done=trials_done,
        trials_total=total,
        levels_done=levels_done,
        levels_total=None if total is None or planned_levels is None else total * planned_levels,
        elapsed_s=((finished or now) - started).total_seconds(),
        eta_s=eta,
        findings=findings,
    )
