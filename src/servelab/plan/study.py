"""A plan bound to a study: one item per candidate, moved as its trials end, with each run as evidence.

`assess` turns a run into an evidence record (did the requested configuration take effect?); a run that
shows it did not (not applied) reopens the item, evidence attached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servelab.applied import compare
from servelab.errors import ConfigError, NotFoundError
from servelab.jsontypes import JsonObject, JsonValue
from servelab.plan.items import Binding, Event, Item, Outcome, Plan
from servelab.plan.machine import add, transition

TUNE_WORKER = "tune"
TRIAL_STATUSES: tuple[str, ...] = (
    "running",
    "measured",
    "not_applied",
    "failed",
    "anomalous",
    "interrupted",
    "lost",
)


# -- evidence ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Assessment:
    """What `assess` found, typed for the item's move (on_trial), and the record stored as its evidence."""

    applied: bool | None
    mismatches_text: list[str]
    unconfirmed: list[str]
    record: JsonObject


def assess(
    requested: Mapping[str, JsonValue] | None, run: Mapping[str, JsonValue], at: str = ""
) -> JsonObject:
    """An evidence record: did `run` show the `requested` configuration took effect?

    `run` is a plain JSON object: {"run": ref, "status"?, "effective": {...} (or a trial's {"effective",
    "evidence"}), "not_applied": [{key, requested, effective, evidence}]?, "diagnosis"?, "anomalies"?}.
    `applied` is True when every requested key (or, without requested keys, the run's own check) matches,
    False when one differs, None when the run does not show it.
    """
    return assessment(requested, run, at).record


def assessment(
    requested: Mapping[str, JsonValue] | None, run: Mapping[str, JsonValue], at: str = ""
) -> Assessment:
    """`assess`, with its verdict typed beside the record."""
    raw = run.get("effective") or {}
    eff: JsonObject = raw if isinstance(raw, dict) else {}
    log_evidence: dict[str, str] = {}
    inner = eff.get("effective")
    if isinstance(inner, dict):
        lines = eff.get("evidence") or {}
        log_evidence = (
            {k: v for k, v in lines.items() if isinstance(v, str)} if isinstance(lines, dict) else {}
        )
        eff = inner
    listed = run.get("not_applied") or []
    not_applied: list[JsonValue] = list(listed) if isinstance(listed, list) else []
    mismatches, unconfirmed = compare(dict(requested or {}), eff, log_evidence)
    texts = [m.sentence() for m in mismatches] + [
        f"requested {m.get('key')}={m.get('requested')!r} but the engine runs {m.get('key')}={m.get('effective')!r}"
        for m in not_applied
        if isinstance(m, dict)
    ]
    if texts or run.get("status") == "not_applied":
        applied: bool | None = False
    elif unconfirmed or not eff:
        applied = None
    else:
        applied = True
    shown: list[JsonValue] = [m.to_dict() for m in mismatches]
    rec: JsonObject = {
        "run": run.get("run"),
        "status": run.get("status"),
        "applied": applied,
        "mismatches": shown + not_applied,
        "mismatches_text": list(texts),
        "unconfirmed": list(unconfirmed),
        "at": at,
    }
    for key in ("trial", "diagnosis", "anomalies"):
        if run.get(key) is not None:
            rec[key] = run[key]
    return Assessment(applied, texts, unconfirmed, rec)


# -- study bindings ---------------------------------------------------------------------------------
def fill(
    plan: Plan,
    study_uid: str,
    candidates: Sequence[tuple[str, float | None, Mapping[str, JsonValue]]],
    *,
    now: str,
    actor: str = TUNE_WORKER,
) -> Outcome:
    """One item per candidate, in the order given (tune orders them by predicted value). Idempotent:
    a candidate that already has an item keeps it untouched, so a resumed study adds nothing twice."""
    have = {
        (i.binding or {}).get("candidate") for i in plan.items if (i.binding or {}).get("study") == study_uid
    }
    out = plan
    added: list[str] = []
    events: list[Event] = []
    for label, predicted, requested in candidates:
        if label in have:
            continue
        binding: Binding = {
            "study": study_uid,
            "candidate": label,
            "requested": dict(requested or {}),
            "predicted": predicted,
        }
        pred = "" if predicted is None else f" (predicted {predicted:,.4g})"
        o = add(
            out,
            f"run candidate {label}{pred}",
            now=now,
            actor=actor,
            binding=binding,
            reason=f"filled from study {study_uid}",
        )
        out, added = o.plan, [*added, o.info["item"]]
        events.extend(o.events)
        have.add(label)
    return Outcome(out, tuple(events), {"added": added})


def item_for(plan: Plan, study_uid: str, label: str) -> Item:
    it = next(
        (
            i
            for i in plan.items
            if (i.binding or {}).get("study") == study_uid and (i.binding or {}).get("candidate") == label
        ),
        None,
    )
    if it is None:
        raise NotFoundError(
            f"plan {plan.name!r} has no item for candidate {label!r} of study {study_uid}",
            hint="fill the plan from the study first (servelab tune does).",
        )
    return it


def on_trial(
    plan: Plan,
    study_uid: str,
    label: str,
    status: str,
    evidence: Mapping[str, JsonValue],
    *,
    now: str,
    actor: str = TUNE_WORKER,
) -> Outcome:
    """Move a candidate's item as its trial progresses. `actor` works one item at a time: a study on one box
    is one worker (`tune`), a study on a cluster one worker per candidate (`tune:LABEL`), its trials in
    parallel.

    running: start it (an item the study left in progress, e.g. before a kill, goes back to pending);
    measured: complete it when the run shows the requested configuration applied, reopen it when it shows
    it did not, block it when the run does not show it; not_applied: reopen it with the evidence;
    failed: block it with the diagnosis; anomalous: block it (applied, but the numbers need a look);
    interrupted, lost (its cluster node died; it runs again): back to pending.
    """
    if status not in TRIAL_STATUSES:
        raise ConfigError(f"unknown trial status {status!r}", hint=f"use one of {', '.join(TRIAL_STATUSES)}.")
    it = item_for(plan, study_uid, label)
    if status == "running":
        out = plan
        events: list[Event] = []
        for other in plan.items:
            if other.id != it.id and other.status == "in_progress" and other.worker == actor:
                o = transition(
                    out,
                    other.id,
                    "pending",
                    now=now,
                    actor=actor,
                    reason=f"interrupted: the study moved on to candidate {label}",
                )
                out, events = o.plan, [*events, *o.events]
        o = transition(
            out,
            it.id,
            "in_progress",
            now=now,
            actor=actor,
            worker=actor,
            reason=f"trial running{_run_suffix(evidence)}",
        )
        return Outcome(o.plan, (*events, *o.events), o.info)
    if status in ("interrupted", "lost"):
        why = (
            "trial interrupted"
            if status == "interrupted"
            else f"trial lost with its node {evidence.get('node')}"
        )
        return transition(plan, it.id, "pending", now=now, actor=actor, reason=why)
    found = assessment(it.requested, {**evidence, "status": status}, now)
    rec = found.record
    if status == "failed":
        diag = evidence.get("diagnosis") or {}
        d: JsonObject = diag if isinstance(diag, dict) else {}
        why = str(d.get("class") or "failed")
        text = d.get("advice") or d.get("message") or evidence.get("error") or ""
        setting = d.get("setting")
        if isinstance(setting, dict):  # the log's own figures name the setting to change
            why += f" (try {setting.get('name')} = {setting.get('value')!r}: {setting.get('reason')})"
        return transition(
            plan,
            it.id,
            "blocked",
            now=now,
            actor=actor,
            evidence=rec,
            reason=f"trial failed: {why}" + (f" — {text}" if text else ""),
        )
    if found.applied is False:
        return transition(
            plan,
            it.id,
            "pending",
            now=now,
            actor=actor,
            evidence=rec,
            reason="not applied: " + "; ".join(found.mismatches_text or ["configuration not applied"]),
        )
    if status == "anomalous":
        return transition(
            plan,
            it.id,
            "blocked",
            now=now,
            actor=actor,
            evidence=rec,
            reason="measured but anomalous; look at the run before trusting it",
        )
    if found.applied is None:
        return transition(
            plan,
            it.id,
            "blocked",
            now=now,
            actor=actor,
            evidence=rec,
            reason="measured, but the run does not show "
            f"{', '.join(found.unconfirmed) or 'the configuration'}; confirm by hand",
        )
    return transition(
        plan,
        it.id,
        "completed",
        now=now,
        actor=actor,
        evidence=rec,
        reason=f"measured{_run_suffix(evidence)}; requested configuration applied",
    )


def close_not_applied(
    plan: Plan,
    study_uid: str,
    label: str,
    evidence: Mapping[str, JsonValue],
    *,
    now: str,
    actor: str = TUNE_WORKER,
) -> Outcome:
    """The study finished and this candidate's configuration never took effect: its item is closed
    (cancelled) as not applied, with the evidence, so a finished study leaves no item pending. An item
    already closed (or moved by hand out of pending/in progress) is left as it is."""
    it = item_for(plan, study_uid, label)
    if it.status not in ("pending", "in_progress"):
        return Outcome(plan, (), {"item": it.id, "unchanged": True})
    found = assessment(it.requested, {**evidence, "status": "not_applied"}, now)
    texts = found.mismatches_text or ["the requested configuration did not take effect"]
    return transition(
        plan,
        it.id,
        "cancelled",
        now=now,
        actor=actor,
        evidence=found.record,
        reason=f"not applied (study {study_uid} finished): " + "; ".join(texts),
    )


def _run_suffix(evidence: Mapping[str, JsonValue]) -> str:
    return f" (run {evidence['run']})" if evidence.get("run") else ""
