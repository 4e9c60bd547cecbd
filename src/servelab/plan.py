"""The plan: a persistent todo list whose items can be bound to experiments.

Pure: a `Plan` (items) goes in, a new `Plan` plus the `Event`s that explain it come out; the store writes
both in one transaction. Every operation builds the whole new state, then checks the rules on it, so an
invalid command raises before anything could be written:

* statuses and priorities come from fixed lists; dependencies name existing items and form no cycle;
* a worker has at most one item `in_progress`;
* an item enters `in_progress` or `completed` only when every dependency is `completed`;
* an item bound to an experiment (a study candidate, or a requested configuration) enters `completed`
  only with evidence from a run that shows the requested configuration took effect. A run that shows it
  did not (not applied) reopens the item, evidence attached.

The todowrite format (a list of {"content", "status", "priority", "id"?}) is what coding agents keep
their todo list in; `import_todowrite`/`export_todowrite` make it the same list as servelab's plan.
`check` holds open items against an observation (`servelab status`) and flags stale assumptions.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any, TypedDict

from servelab.applied import compare
from servelab.engines.base import NORMALIZED_KEYS
from servelab.errors import ConfigError, NotFoundError

STATUSES: tuple[str, ...] = ("pending", "in_progress", "completed", "cancelled", "blocked")
OPEN_STATUSES: tuple[str, ...] = ("pending", "in_progress", "blocked")
PRIORITIES: tuple[str, ...] = ("high", "medium", "low")
DEFAULT_WORKER = "default"
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
JSON_FORMAT = "servelab-plan"
_TODOWRITE_KEYS = ("id", "content", "status", "priority")
_BINDING_KEYS = ("study", "candidate", "requested", "predicted", "url", "unit")


@dataclass(frozen=True)
class Item:
    id: str
    content: str
    status: str = "pending"
    priority: str = "medium"
    worker: str | None = None
    depends_on: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    binding: dict[str, Any] | None = None  # {"study", "candidate", "requested", "predicted", "url", "unit"}
    evidence: tuple[dict[str, Any], ...] = ()  # run records, newest last (see `assess`)
    extra: dict[str, Any] = field(default_factory=dict)  # todowrite keys servelab does not use, kept verbatim
    created_at: str = ""
    updated_at: str = ""

    @property
    def bound(self) -> bool:
        """Bound to an experiment: completing it needs a run that shows the configuration applied."""
        b = self.binding or {}
        return bool(b.get("candidate") or b.get("requested"))

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["depends_on"], d["notes"], d["evidence"] = (
            list(self.depends_on),
            list(self.notes),
            list(self.evidence),
        )
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "item") -> Item:
        """An item from a servelab JSON export; every field is checked, unknown fields are errors."""
        if not isinstance(d, dict):
            raise ConfigError(f"{where} is not an object", hint=_JSON_HINT)
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"{where} has unknown field(s) {', '.join(sorted(unknown))}",
                hint=f"known fields: {', '.join(cls.__dataclass_fields__)}",
            )
        if "id" not in d or "content" not in d:
            raise ConfigError(f"{where} needs an id and a content", hint=_JSON_HINT)
        return cls(
            id=_id(d["id"], where),
            content=_content(d["content"], where),
            status=check_status(d.get("status", "pending"), where),
            priority=check_priority(d.get("priority", "medium"), where),
            worker=_worker(d.get("worker"), where),
            depends_on=tuple(_id(x, where) for x in _list(d, "depends_on", where)),
            notes=tuple(str(n) for n in _list(d, "notes", where)),
            binding=_binding(d.get("binding"), where),
            evidence=tuple(_objects(d, "evidence", where)),
            extra=dict(d.get("extra") or {}),
            created_at=str(d.get("created_at") or ""),
            updated_at=str(d.get("updated_at") or ""),
        )


@dataclass(frozen=True)
class Event:
    """One change to one item: the plan's history is the list of these."""

    item: str
    at: str
    from_status: str | None  # None when the item was created
    to_status: str
    reason: str
    actor: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    name: str
    items: tuple[Item, ...] = ()

    def find(self, key: str) -> Item | None:
        return next((i for i in self.items if i.id == key), None)

    def get(self, key: str) -> Item:
        item = self.find(str(key))
        if item is None:
            known = ", ".join(i.id for i in self.items[:20]) or "none yet"
            raise NotFoundError(
                f"no item {key!r} in plan {self.name!r} (items: {known})",
                hint=f"`servelab plan show{_plan_flag(self.name)}` lists the items and their ids.",
            )
        return item

    def next_id(self) -> str:
        nums = [int(i.id) for i in self.items if i.id.isdigit()]
        return str(max(nums, default=0) + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": JSON_FORMAT,
            "version": 1,
            "plan": self.name,
            "items": [i.to_dict() for i in self.items],
        }


@dataclass(frozen=True)
class Outcome:
    """What an operation produced: the new plan, the events to record, and a summary for the CLI."""

    plan: Plan
    events: tuple[Event, ...]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> tuple[Item, ...]:
        keys = {e.item for e in self.events}
        return tuple(i for i in self.plan.items if i.id in keys)


@dataclass(frozen=True)
class Finding:
    """A stale assumption `check` found: an open item that no longer matches what is observed."""

    item: str
    kind: str  # server_down | server_healthy | server_unobserved | config_mismatch | config_unconfirmed | service_healthy
    #            | service_down | service_unobserved | dependency_cancelled
    severity: str  # warning | info
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_JSON_HINT = "`servelab plan export --format json` shows the expected shape."
TODO_HINT = 'todowrite is a JSON list of {"content": ..., "status": ..., "priority": ..., "id": ...} objects.'


# -- validation helpers -------------------------------------------------------------------------------
def check_status(value: Any, where: str = "status") -> str:
    if value not in STATUSES:
        raise ConfigError(f"{where}: unknown status {value!r}", hint=f"use one of {', '.join(STATUSES)}.")
    return str(value)


def check_priority(value: Any, where: str = "priority") -> str:
    if value not in PRIORITIES:
        raise ConfigError(f"{where}: unknown priority {value!r}", hint=f"use one of {', '.join(PRIORITIES)}.")
    return str(value)


def _id(value: Any, where: str) -> str:
    if (
        isinstance(value, bool)
        or not isinstance(value, str | int)
        or not str(value).strip()
        or any(c.isspace() for c in str(value))
    ):
        raise ConfigError(f"{where}: id {value!r} must be a non-empty string without spaces", hint=TODO_HINT)
    return str(value)


def _content(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: content must be non-empty text", hint=TODO_HINT)
    return value


def _list(d: dict[str, Any], key: str, where: str) -> list[Any]:
    v = d.get(key) or []
    if not isinstance(v, list):
        raise ConfigError(f"{where}: {key} must be a list", hint=_JSON_HINT)
    return v


def _worker(value: Any, where: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(f"{where}: worker must be a name or null", hint=_JSON_HINT)
    return value


def _objects(d: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    v = _list(d, key, where)
    if not all(isinstance(x, dict) for x in v):
        raise ConfigError(f"{where}: every entry of {key} must be an object", hint=_JSON_HINT)
    return v


def _binding(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - set(_BINDING_KEYS):
        raise ConfigError(
            f"{where}: binding must be an object with keys among {', '.join(_BINDING_KEYS)}", hint=_JSON_HINT
        )
    if value.get("requested") is not None and not isinstance(value["requested"], dict):
        raise ConfigError(f"{where}: binding.requested must be an object of normalized keys", hint=_JSON_HINT)
    return dict(value)


def _plan_flag(name: str) -> str:
    return "" if name == "workspace" else f" --plan {name}"


def find_cycle(items: tuple[Item, ...] | list[Item]) -> list[str] | None:
    """A dependency cycle as a path of ids (first == last), or None. Iterative and linear: a chain of
    100k dependencies neither recurses 100k deep nor copies its path at every step."""
    deps = {i.id: i.depends_on for i in items}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in deps:
        if root in state:
            continue
        path, pos, stack = [root], {root: 0}, [iter(deps[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                done = path.pop()
                del pos[done]
                state[done] = 2
                stack.pop()
                continue
            seen = state.get(nxt)
            if seen == 1:
                return [*path[pos[nxt] :], nxt]
            if seen is None and nxt in deps:
                state[nxt] = 1
                pos[nxt] = len(path)
                path.append(nxt)
                stack.append(iter(deps[nxt]))
    return None


def _validate(before: Plan, after: Plan, accepted: frozenset[str] = frozenset()) -> None:
    """Raise if `after` breaks a rule; checks that depend on a transition apply to items that changed status."""
    ids = [i.id for i in after.items]
    dup = {k for k, n in Counter(ids).items() if n > 1}
    if dup:
        raise ConfigError(
            f"duplicate item id(s) {', '.join(sorted(dup))}", hint="every item needs its own id."
        )
    known = set(ids)
    for it in after.items:
        missing = [d for d in it.depends_on if d not in known]
        if missing:
            raise NotFoundError(
                f"item {it.id} depends on unknown item(s) {', '.join(missing)}",
                hint=f"`servelab plan show{_plan_flag(after.name)}` lists the ids.",
            )
        if it.id in it.depends_on:
            raise ConfigError(f"item {it.id} depends on itself", hint="drop it from its own --after list.")
    cycle = find_cycle(after.items)
    if cycle:
        raise ConfigError(
            f"dependency cycle: {' -> '.join(cycle)}", hint="an item cannot (indirectly) wait for itself."
        )
    busy: dict[str, str] = {}
    for it in after.items:
        if it.status == "in_progress":
            w = it.worker or DEFAULT_WORKER
            if w in busy:
                raise ConfigError(
                    f"worker {w!r} would have two items in progress ({busy[w]} and {it.id})",
                    hint=f"finish, block or cancel item {busy[w]} first, or start this one with "
                    "another --worker.",
                )
            busy[w] = it.id
    old = {i.id: i.status for i in before.items}
    by_id = {i.id: i for i in after.items}
    for it in after.items:
        if old.get(it.id) == it.status or it.status not in ("in_progress", "completed"):
            continue
        waiting = [d for d in it.depends_on if by_id[d].status != "completed"]
        if waiting:
            states = "; ".join(f"item {d} {by_id[d].content!r} ({by_id[d].status})" for d in waiting)
            raise ConfigError(
                f"item {it.id} cannot become {it.status}: it waits for {states}",
                hint="complete those first (a cancelled dependency never completes: cancel this "
                "item too, or add it again without that dependency).",
            )
        if it.status == "completed" and it.bound:
            _require_applied(it, it.id in accepted)


def _require_applied(it: Item, accepted: bool) -> None:
    last = it.evidence[-1] if it.evidence else None
    if last is None:
        raise ConfigError(
            f"item {it.id} is bound to an experiment and completes only with a run as evidence",
            hint="pass --run RUN (a bench run of the study's trial, or STUDY:LABEL) that shows the "
            "requested configuration took effect.",
        )
    if last.get("applied") is True:
        return
    if last.get("applied") is False:
        raise ConfigError(
            f"item {it.id}: run {last.get('run')} shows the requested configuration did not take "
            f"effect ({'; '.join(last.get('mismatches_text') or []) or 'not applied'})",
            hint="fix the launch and run it again; a not-applied run cannot complete the item.",
        )
    if not accepted:
        raise ConfigError(
            f"item {it.id}: run {last.get('run')} does not show whether the requested configuration "
            f"took effect (not shown: {', '.join(last.get('unconfirmed') or []) or 'anything'})",
            hint="check the server's log by hand, then `servelab plan done ID --accept-unconfirmed "
            "--reason WHY`.",
        )


# -- evidence ---------------------------------------------------------------------------------------
def assess(requested: dict[str, Any] | None, run: dict[str, Any], at: str = "") -> dict[str, Any]:
    """An evidence record: did `run` show the `requested` configuration took effect?

    `run` is a plain dict: {"run": ref, "status"?, "effective": {...} (or a trial's {"effective", "evidence"}),
    "not_applied": [{key, requested, effective, evidence}]?, "diagnosis"?, "anomalies"?}. `applied` is True
    when every requested key (or, without requested keys, the run's own check) matches, False when one
    differs, None when the run does not show it.
    """
    eff = run.get("effective") or {}
    log_evidence: dict[str, str] = {}
    if isinstance(eff.get("effective"), dict):
        log_evidence = dict(eff.get("evidence") or {})
        eff = eff["effective"]
    not_applied = list(run.get("not_applied") or [])
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
    rec: dict[str, Any] = {
        "run": run.get("run"),
        "status": run.get("status"),
        "applied": applied,
        "mismatches": [m.to_dict() for m in mismatches] + not_applied,
        "mismatches_text": texts,
        "unconfirmed": unconfirmed,
        "at": at,
    }
    for key in ("trial", "diagnosis", "anomalies"):
        if run.get(key) is not None:
            rec[key] = run[key]
    return rec


# -- operations -------------------------------------------------------------------------------------
def _touch(it: Item, now: str, **changes: Any) -> Item:
    return replace(it, **changes, updated_at=now)


def _swap(plan: Plan, new: Item) -> Plan:
    return replace(plan, items=tuple(new if i.id == new.id else i for i in plan.items))


def add(
    plan: Plan,
    content: str,
    *,
    now: str,
    actor: str,
    priority: str = "medium",
    depends_on: tuple[str, ...] | list[str] = (),
    binding: dict[str, Any] | None = None,
    key: str | None = None,
    reason: str = "added",
) -> Outcome:
    """A new pending item at the end of the plan."""
    key = _id(key, "id") if key is not None else plan.next_id()
    if plan.find(key):
        raise ConfigError(f"item {key} already exists in plan {plan.name!r}", hint="pick another id.")
    it = Item(
        id=key,
        content=_content(content, "content"),
        priority=check_priority(priority),
        depends_on=tuple(str(d) for d in depends_on),
        binding=_binding(binding, "binding"),
        created_at=now,
        updated_at=now,
    )
    after = replace(plan, items=(*plan.items, it))
    _validate(plan, after)
    return Outcome(
        after, (Event(key, now, None, "pending", reason, actor, {"item": it.to_dict()}),), {"item": key}
    )


def transition(
    plan: Plan,
    key: str,
    to: str,
    *,
    now: str,
    actor: str,
    reason: str = "",
    worker: str | None = None,
    evidence: dict[str, Any] | None = None,
    accept_unconfirmed: bool = False,
) -> Outcome:
    """Move one item to status `to` (with optional evidence); the rules decide whether it may."""
    check_status(to)
    it = plan.get(key)
    if it.status == to and evidence is None and (to != "in_progress" or worker in (None, it.worker)):
        return Outcome(plan, (), {"item": it.id, "unchanged": True})
    if to in ("blocked", "cancelled") and not reason.strip():
        raise ConfigError(
            f"{'blocking' if to == 'blocked' else 'cancelling'} item {key} needs a reason",
            hint="pass --reason TEXT: the plan keeps why, with the time.",
        )
    if accept_unconfirmed and not reason.strip():
        raise ConfigError(
            "--accept-unconfirmed needs a --reason", hint="say how you checked the configuration."
        )
    evs = list(it.evidence)
    if evidence is not None:
        evs.append(evidence)
    if accept_unconfirmed and evs:
        evs[-1] = {**evs[-1], "accepted_by": actor, "accepted_reason": reason}
    new_worker = (worker or it.worker or DEFAULT_WORKER) if to == "in_progress" else None
    new = _touch(it, now, status=to, worker=new_worker, evidence=tuple(evs))
    after = _swap(plan, new)
    _validate(plan, after, frozenset({key}) if accept_unconfirmed else frozenset())
    detail: dict[str, Any] = {}
    if evidence is not None:
        detail["evidence"] = evidence
    if new_worker:
        detail["worker"] = new_worker
    why = reason or {"in_progress": "started", "completed": "done", "pending": "reopened"}.get(to, to)
    return Outcome(after, (Event(key, now, it.status, to, why, actor, detail),), {"item": key})


def start(
    plan: Plan, key: str, *, now: str, actor: str, worker: str | None = None, reason: str = ""
) -> Outcome:
    return transition(plan, key, "in_progress", now=now, actor=actor, worker=worker, reason=reason)


def done(
    plan: Plan,
    key: str,
    *,
    now: str,
    actor: str,
    evidence: dict[str, Any] | None = None,
    reason: str = "",
    accept_unconfirmed: bool = False,
) -> Outcome:
    return transition(
        plan,
        key,
        "completed",
        now=now,
        actor=actor,
        evidence=evidence,
        reason=reason,
        accept_unconfirmed=accept_unconfirmed,
    )


def block(plan: Plan, key: str, *, now: str, actor: str, reason: str) -> Outcome:
    return transition(plan, key, "blocked", now=now, actor=actor, reason=reason)


def cancel(plan: Plan, key: str, *, now: str, actor: str, reason: str) -> Outcome:
    return transition(plan, key, "cancelled", now=now, actor=actor, reason=reason)


def note(plan: Plan, key: str, text: str, *, now: str, actor: str) -> Outcome:
    it = plan.get(key)
    text = _content(text, "note")
    new = _touch(it, now, notes=(*it.notes, text))
    return Outcome(
        _swap(plan, new),
        (Event(key, now, it.status, it.status, "note", actor, {"note": text}),),
        {"item": key},
    )


# -- study bindings ---------------------------------------------------------------------------------
def fill(
    plan: Plan,
    study_uid: str,
    candidates: list[tuple[str, float | None, dict[str, Any]]],
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
        binding = {
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
    evidence: dict[str, Any],
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
    rec = assess((it.binding or {}).get("requested"), {**evidence, "status": status}, now)
    if status == "failed":
        d = evidence.get("diagnosis") or {}
        why = d.get("class") or "failed"
        text = d.get("advice") or d.get("message") or evidence.get("error") or ""
        return transition(
            plan,
            it.id,
            "blocked",
            now=now,
            actor=actor,
            evidence=rec,
            reason=f"trial failed: {why}" + (f" — {text}" if text else ""),
        )
    if rec["applied"] is False:
        return transition(
            plan,
            it.id,
            "pending",
            now=now,
            actor=actor,
            evidence=rec,
            reason="not applied: " + "; ".join(rec["mismatches_text"] or ["configuration not applied"]),
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
    if rec["applied"] is None:
        return transition(
            plan,
            it.id,
            "blocked",
            now=now,
            actor=actor,
            evidence=rec,
            reason="measured, but the run does not show "
            f"{', '.join(rec['unconfirmed']) or 'the configuration'}; confirm by hand",
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
    evidence: dict[str, Any],
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
    rec = assess((it.binding or {}).get("requested"), {**evidence, "status": "not_applied"}, now)
    texts = rec["mismatches_text"] or ["the requested configuration did not take effect"]
    return transition(
        plan,
        it.id,
        "cancelled",
        now=now,
        actor=actor,
        evidence=rec,
        reason=f"not applied (study {study_uid} finished): " + "; ".join(texts),
    )


def _run_suffix(evidence: dict[str, Any]) -> str:
    return f" (run {evidence['run']})" if evidence.get("run") else ""


# -- formats ----------------------------------------------------------------------------------------
def export_todowrite(plan: Plan) -> list[dict[str, Any]]:
    """The agent's view: id, content, status, priority (and any extra todowrite keys an import carried)."""
    return [
        {"id": i.id, "content": i.content, "status": i.status, "priority": i.priority, **i.extra}
        for i in plan.items
    ]


def export_json(plan: Plan) -> dict[str, Any]:
    return plan.to_dict()


_MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]", "cancelled": "[-]", "blocked": "[!]"}


def export_markdown(plan: Plan, events: list[Event] | None = None) -> str:
    """A readable checklist; the last reason for each item (from `events`) when given."""
    last = {e.item: e for e in events or [] if e.reason != "note"}
    lines = [
        f"# Plan: {plan.name}",
        "",
        "`[ ]` pending · `[~]` in progress · `[x]` completed · `[!]` blocked · `[-]` cancelled",
        "",
    ]
    for i in plan.items:
        after = f" (after {', '.join(i.depends_on)})" if i.depends_on else ""
        who = f" — {i.worker}" if i.status == "in_progress" and i.worker else ""
        lines.append(f"- {_MARK[i.status]} **{i.id}** [{i.priority}] {_md(i.content)}{after}{who}")
        ev = last.get(i.id)
        if ev and i.status in ("blocked", "cancelled", "pending") and ev.from_status is not None:
            lines.append(f"  - why: {_md(ev.reason)}")
        for n in i.notes:
            lines.append(f"  - note: {_md(n)}")
        for e in i.evidence:
            verdict = {True: "applied", False: "NOT applied", None: "not shown"}[e.get("applied")]
            lines.append(
                f"  - evidence: run {e.get('run') or '-'} ({e.get('status') or '-'}), config {verdict}"
            )
    if not plan.items:
        lines.append("(empty)")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("\n", " ")


class TodoEntry(TypedDict):
    """One validated todowrite entry; `extra` keeps the keys servelab does not use, verbatim."""

    content: str
    status: str
    priority: str
    id: str | None
    extra: dict[str, Any]


def parse_todowrite(data: Any) -> list[TodoEntry]:
    """Validate a todowrite document (a list, or {"todos": [...]}) into clean entries."""
    if isinstance(data, dict) and isinstance(data.get("todos"), list):
        data = data["todos"]
    if not isinstance(data, list):
        raise ConfigError("a todowrite file holds a JSON list of todo objects", hint=TODO_HINT)
    out: list[TodoEntry] = []
    for n, raw in enumerate(data):
        where = f"todo #{n + 1}"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} is not an object", hint=TODO_HINT)
        if "content" not in raw or "status" not in raw:
            raise ConfigError(f"{where} needs content and status", hint=TODO_HINT)
        entry: TodoEntry = {
            "content": _content(raw["content"], where),
            "status": check_status(raw["status"], where),
            "priority": check_priority(raw.get("priority", "medium"), where),
            "id": _id(raw["id"], where) if raw.get("id") is not None else None,
            "extra": {k: v for k, v in raw.items() if k not in _TODOWRITE_KEYS},
        }
        out.append(entry)
    ids = [e["id"] for e in out if e["id"] is not None]
    dup = {k for k, n in Counter(ids).items() if n > 1}
    if dup:
        raise ConfigError(
            f"the todo list repeats id(s) {', '.join(sorted(dup))}", hint="every todo needs its own id."
        )
    return out


def import_todowrite(
    plan: Plan, data: Any, *, now: str, actor: str, prune: bool = False, source: str = "todowrite"
) -> Outcome:
    """Merge an agent's todo list into the plan.

    A todo whose id matches an item updates it in place (content, priority, status, extra keys); a todo
    without an id matches the one item with exactly its content; anything else is added. Items the list
    does not mention are never deleted: they are reported as `missing`, and with `prune` cancelled (the
    history keeps them). Status changes obey the plan's rules (one in progress per worker, dependencies,
    bound items need evidence), so an agent's list cannot silently complete an experiment.
    """
    entries = parse_todowrite(data)
    # Indexes, not scans: by id, the unseen items by content, and the largest numeric id so far keep
    # the merge linear (it scanned the whole plan per todo: 32k todos took a minute).
    items: dict[str, Item] = {i.id: i for i in plan.items}
    unseen: dict[str, dict[str, None]] = {}
    for i in plan.items:
        unseen.setdefault(i.content, {})[i.id] = None
    top = max((int(i.id) for i in plan.items if i.id.isdigit()), default=0)
    events: list[Event] = []
    info: dict[str, list[str]] = {"added": [], "updated": [], "unchanged": [], "missing": [], "pruned": []}
    seen: set[str] = set()
    reserved = {e["id"] for e in entries if e["id"] is not None}  # numbers for id-less todos skip these
    why = f"imported from {source}"

    def mark_seen(it: Item) -> None:
        seen.add(it.id)
        unseen.get(it.content, {}).pop(it.id, None)

    def status_change(it: Item, to: str) -> dict[str, Any]:
        if to == it.status:
            return {}
        worker = (it.worker or DEFAULT_WORKER) if to == "in_progress" else None
        return {"status": to, "worker": worker}

    for e in entries:
        if e["id"] is not None:
            it = items.get(e["id"])
        else:  # the one item not yet matched with exactly this content
            same = unseen.get(e["content"], {})
            it = items[next(iter(same))] if len(same) == 1 else None
        if it is None:
            if e["id"] is not None:
                key = e["id"]
            else:
                n = top + 1
                while str(n) in reserved:
                    n += 1
                key = str(n)
            if key.isdigit():
                top = max(top, int(key))
            new = Item(
                id=key,
                content=e["content"],
                priority=e["priority"],
                extra=e["extra"],
                created_at=now,
                updated_at=now,
            )
            new = replace(new, **status_change(new, e["status"]))
            items[key] = new
            events.append(Event(key, now, None, new.status, why, actor, {"item": new.to_dict()}))
            info["added"].append(key)
            seen.add(key)
            continue
        mark_seen(it)
        wanted = (("content", e["content"]), ("priority", e["priority"]), ("extra", e["extra"]))
        fields: dict[str, Any] = {k: v for k, v in wanted if getattr(it, k) != v}
        fields.update(status_change(it, e["status"]))
        if not fields:
            info["unchanged"].append(it.id)
            continue
        new = _touch(it, now, **fields)
        items[it.id] = new
        events.append(
            Event(
                it.id,
                now,
                it.status,
                new.status,
                why,
                actor,
                {"fields": {k: [getattr(it, k), v] for k, v in fields.items()}},
            )
        )
        info["updated"].append(it.id)
    for it in plan.items:
        if it.id in seen or not it.is_open:
            continue
        info["missing"].append(it.id)
        if prune:
            new = _touch(items[it.id], now, status="cancelled", worker=None)
            items[it.id] = new
            events.append(
                Event(
                    it.id,
                    now,
                    it.status,
                    "cancelled",
                    f"absent from the imported todo list ({source})",
                    actor,
                    {},
                )
            )
            info["pruned"].append(it.id)
    after = replace(plan, items=tuple(items.values()))
    _validate(plan, after)
    return Outcome(after, tuple(events), info)


def import_json(plan: Plan, data: Any, *, now: str, actor: str, source: str = "json") -> Outcome:
    """Restore items from a servelab JSON export: every field, by id. Items absent from the file stay."""
    if (
        not isinstance(data, dict)
        or data.get("format") != JSON_FORMAT
        or not isinstance(data.get("items"), list)
    ):
        raise ConfigError(
            f'not a servelab plan export (expected {{"format": "{JSON_FORMAT}", "items": [...]}})',
            hint="for an agent's todo list use --format todowrite.",
        )
    incoming = [Item.from_dict(d, f"item #{n + 1}") for n, d in enumerate(data["items"])]
    dup = {k for k, n in Counter(i.id for i in incoming).items() if n > 1}
    if dup:
        raise ConfigError(
            f"duplicate item id(s) {', '.join(sorted(dup))}", hint="every item needs its own id."
        )
    items: dict[str, Item] = {i.id: i for i in plan.items}
    events: list[Event] = []
    info: dict[str, list[str]] = {"added": [], "updated": [], "unchanged": [], "missing": []}
    for new in incoming:
        new = replace(new, created_at=new.created_at or now, updated_at=new.updated_at or now)
        old = items.get(new.id)
        if old is None:
            items[new.id] = new
            events.append(
                Event(
                    new.id, now, None, new.status, f"imported from {source}", actor, {"item": new.to_dict()}
                )
            )
            info["added"].append(new.id)
        elif old != new:
            items[new.id] = new
            events.append(
                Event(
                    new.id,
                    now,
                    old.status,
                    new.status,
                    f"imported from {source}",
                    actor,
                    {"item": new.to_dict()},
                )
            )
            info["updated"].append(new.id)
        else:
            info["unchanged"].append(new.id)
    ids = {i.id for i in incoming}
    info["missing"] = [i.id for i in plan.items if i.id not in ids and i.is_open]
    after = replace(plan, items=tuple(items.values()))
    _validate(plan, after)
    return Outcome(after, tuple(events), info)


# -- check: open items against what is observed -----------------------------------------------------
@cache
def recognizers() -> dict[str, Any]:
    text = resources.files("servelab.data").joinpath("plan_recognizers.toml").read_text()
    return tomllib.loads(text)


_KV = re.compile(r"\b(" + "|".join(NORMALIZED_KEYS) + r")\s*=\s*([A-Za-z0-9_.:/-]+)")


def targets(item: Item, unit_names: list[str] | None = None) -> dict[str, Any]:
    """What an item refers to: its binding first, then what its text names (see plan_recognizers.toml)."""
    rec = recognizers()
    b = item.binding or {}
    text = item.content
    requested: dict[str, Any] = {}
    for r in rec.get("config", []):
        m = re.search(r["pattern"], text, re.IGNORECASE)
        if m:
            requested[r["key"]] = m.group(1)
    for m in _KV.finditer(text):
        requested[m.group(1)] = m.group(2)
    source = "text" if requested else None
    if b.get("requested"):
        requested, source = {**requested, **b["requested"]}, "binding"
    url = b.get("url")
    if not url:
        m = re.search(rec["url"]["pattern"], text)
        url = m.group(1).rstrip(".,;") if m else None
    unit = b.get("unit")
    if not unit:
        m = re.search(rec["unit"]["pattern"], text)
        unit = m.group(1) if m else None
    if not unit:
        for name in unit_names or []:
            short = name.removesuffix(".service")
            if re.search(rf"(?<![\w.-]){re.escape(short)}(?![\w-])", text):
                unit = name
                break
    repair = bool(re.search(rec["repair"]["pattern"], text, re.IGNORECASE))
    return {"url": url, "unit": unit, "requested": requested, "requested_from": source, "repair": repair}


def referenced(items: list[Item] | tuple[Item, ...]) -> tuple[list[str], list[str]]:
    """(urls, units) the open items name, so `plan check` observes what the plan is about."""
    urls: list[str] = []
    units: list[str] = []
    for it in items:
        if it.is_open:
            t = targets(it)
            if t["url"] and t["url"] not in urls:
                urls.append(t["url"])
            if t["unit"] and t["unit"] not in units:
                units.append(t["unit"])
    return urls, units


def _norm_url(url: str) -> str:
    return url.strip().rstrip("/").lower().removesuffix("/v1")


def check(items: list[Item] | tuple[Item, ...], observation: dict[str, Any]) -> list[Finding]:
    """Hold every open item against an observation (the dict `servelab status` produces)."""
    servers = [s for s in observation.get("servers") or [] if isinstance(s, dict)]
    services = [s for s in observation.get("services") or [] if isinstance(s, dict)]
    units = [str(s.get("unit")) for s in services if s.get("unit")]
    by_id = {i.id: i for i in items}
    out: list[Finding] = []
    for it in items:
        if not it.is_open:
            continue
        gone = [d for d in it.depends_on if d in by_id and by_id[d].status == "cancelled"]
        if gone:
            out.append(
                Finding(
                    it.id,
                    "dependency_cancelled",
                    "warning",
                    f"item {it.id} waits for cancelled item(s) {', '.join(gone)}; it can never start",
                    {"dependencies": gone},
                )
            )
        t = targets(it, units)
        healthy = _repaired_server(it, t, servers)
        if healthy is not None:
            out.append(healthy)
        elif it.status == "in_progress":
            out.extend(_check_server(it, t, servers))
        out.extend(_check_service(it, t, services))
    return out


def _repaired_server(it: Item, t: dict[str, Any], servers: list[dict[str, Any]]) -> Finding | None:
    """An item about repairing the server it names ("restart the crashed server at URL") while that server
    answers healthy: the assumption that it is down no longer holds."""
    if not (t["repair"] and t["url"]):
        return None
    srv = next((s for s in servers if _norm_url(str(s.get("url", ""))) == _norm_url(t["url"])), None)
    if srv is None or not srv.get("up"):
        return None
    return Finding(
        it.id,
        "server_healthy",
        "warning",
        f"item {it.id} is about repairing {t['url']}, which answers healthy "
        f"({srv.get('engine') or 'a server'}, {srv.get('running', 0)} running, {srv.get('waiting', 0)} waiting)",
        {"url": t["url"], "server": srv},
    )


def _check_server(it: Item, t: dict[str, Any], servers: list[dict[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    pool = servers
    if t["url"]:
        srv = next((s for s in servers if _norm_url(str(s.get("url", ""))) == _norm_url(t["url"])), None)
        if srv is None:
            return [
                Finding(
                    it.id,
                    "server_unobserved",
                    "info",
                    f"item {it.id} is about {t['url']}, which the observation does not include",
                    {"url": t["url"], "hint": f"servelab plan check --url {t['url']}"},
                )
            ]
        if not srv.get("up"):
            return [
                Finding(
                    it.id,
                    "server_down",
                    "warning",
                    f"item {it.id} is in progress but its server {t['url']} is down",
                    {"url": t["url"], "server": srv},
                )
            ]
        pool = [srv]
    elif t["requested"]:
        if not servers:
            return [
                Finding(
                    it.id,
                    "server_unobserved",
                    "info",
                    f"item {it.id} is an experiment in progress but no server was observed",
                    {"hint": "pass --url URL to say which server runs it"},
                )
            ]
        if not any(s.get("up") for s in servers):
            return [
                Finding(
                    it.id,
                    "server_down",
                    "warning",
                    f"item {it.id} is an experiment in progress but no observed server is up",
                    {"servers": [s.get("url") for s in servers]},
                )
            ]
    if not t["requested"]:
        return out
    up = [s for s in pool if s.get("up")]
    results = []
    for s in up:
        mism, unconfirmed = compare(
            t["requested"], dict(s.get("effective") or {}), dict(s.get("evidence") or {})
        )
        results.append((s, mism, unconfirmed))
    if any(not m and not u for _s, m, u in results) or not results:
        return out
    wrong = [(s, m) for s, m, _u in results if m]
    if wrong and len(wrong) == len(results):
        sentences = [f"{s.get('url')}: {m.sentence()}" for s, ms in wrong for m in ms]
        out.append(
            Finding(
                it.id,
                "config_mismatch",
                "warning",
                f"item {it.id} assumes {_kv(t['requested'])}, but " + "; ".join(sentences),
                {
                    "requested": t["requested"],
                    "requested_from": t["requested_from"],
                    "mismatches": [{"url": s.get("url"), **m.to_dict()} for s, ms in wrong for m in ms],
                },
            )
        )
    elif not wrong:
        out.append(
            Finding(
                it.id,
                "config_unconfirmed",
                "info",
                f"item {it.id} assumes {_kv(t['requested'])}; no observed server shows "
                f"{', '.join(sorted({k for _s, _m, u in results for k in u}))}",
                {"requested": t["requested"], "requested_from": t["requested_from"]},
            )
        )
    return out


def _check_service(it: Item, t: dict[str, Any], services: list[dict[str, Any]]) -> list[Finding]:
    unit, how = t["unit"], "named"
    if (
        not unit
        and t["repair"]
        and re.search(r"\bservice\b", it.content, re.IGNORECASE)
        and len(services) == 1
    ):
        unit, how = str(services[0].get("unit")), "the only observed service"
    if not unit:
        return []
    svc = next(
        (
            s
            for s in services
            if str(s.get("unit", "")).removesuffix(".service") == unit.removesuffix(".service")
        ),
        None,
    )
    if svc is None:
        return [
            Finding(
                it.id,
                "service_unobserved",
                "info",
                f"item {it.id} is about {unit}, which the observation does not include",
                {"unit": unit},
            )
        ]
    active, sub = svc.get("active_state"), svc.get("sub_state")
    ev = {
        "unit": svc.get("unit"),
        "active_state": active,
        "sub_state": sub,
        "restarts": svc.get("restarts"),
        "since": svc.get("since"),
        "recognized_from": how,
    }
    if t["repair"] and active == "active" and sub in ("running", None):
        restarts = svc.get("restarts") or 0
        tail = f"; it restarted {restarts} time(s), check it is not flapping" if restarts else ""
        return [
            Finding(
                it.id,
                "service_healthy",
                "warning",
                f"item {it.id} is about repairing {svc.get('unit')}, which is active ({sub or 'running'})"
                f"{' since ' + str(svc['since']) if svc.get('since') else ''}{tail}",
                ev,
            )
        ]
    if it.status == "in_progress" and not t["repair"] and active in ("failed", "inactive"):
        return [
            Finding(
                it.id,
                "service_down",
                "warning",
                f"item {it.id} is in progress but {svc.get('unit')} is {active} ({sub})",
                ev,
            )
        ]
    return []


def _kv(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())
