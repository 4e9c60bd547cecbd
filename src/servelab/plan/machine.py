"""The plan's state machine: the rules every new plan is checked against, and the operations on one item.

Every operation builds the whole new plan, then checks the rules on it, so an invalid command raises
before anything could be written:

* dependencies name existing items and form no cycle;
* a worker has at most one item `in_progress`;
* an item enters `in_progress` or `completed` only when every dependency is `completed`;
* an item bound to an experiment (a study candidate, or a requested configuration) enters `completed`
  only with evidence from a run that shows the requested configuration took effect (study.assess).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servelab.errors import ConfigError, NotFoundError
from servelab.jsontypes import JsonObject, JsonValue
from servelab.plan.items import (
    DEFAULT_WORKER,
    Event,
    Item,
    Outcome,
    Plan,
    check_binding,
    check_content,
    check_id,
    check_priority,
    check_status,
    plan_flag,
)


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


def validate(before: Plan, after: Plan, accepted: frozenset[str] = frozenset()) -> None:
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
                hint=f"`servelab plan show{plan_flag(after.name)}` lists the ids.",
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
            require_applied(it, it.id in accepted)


def require_applied(it: Item, accepted: bool) -> None:
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
            f"effect ({'; '.join(_texts(last.get('mismatches_text'))) or 'not applied'})",
            hint="fix the launch and run it again; a not-applied run cannot complete the item.",
        )
    if not accepted:
        raise ConfigError(
            f"item {it.id}: run {last.get('run')} does not show whether the requested configuration "
            f"took effect (not shown: {', '.join(_texts(last.get('unconfirmed'))) or 'anything'})",
            hint="check the server's log by hand, then `servelab plan done ID --accept-unconfirmed "
            "--reason WHY`.",
        )


def _texts(value: JsonValue | None) -> list[str]:
    """A stored list of texts (an imported record may hold anything: what is not a list shows nothing)."""
    return [str(v) for v in value] if isinstance(value, list) else []


# -- operations -------------------------------------------------------------------------------------
def touch(it: Item, now: str, **changes: Any) -> Item:
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
    binding: Mapping[str, object] | None = None,
    key: str | None = None,
    reason: str = "added",
) -> Outcome:
    """A new pending item at the end of the plan."""
    key = check_id(key, "id") if key is not None else plan.next_id()
    if plan.find(key):
        raise ConfigError(f"item {key} already exists in plan {plan.name!r}", hint="pick another id.")
    it = Item(
        id=key,
        content=check_content(content, "content"),
        priority=check_priority(priority),
        depends_on=tuple(str(d) for d in depends_on),
        binding=check_binding(binding, "binding"),
        created_at=now,
        updated_at=now,
    )
    after = replace(plan, items=(*plan.items, it))
    validate(plan, after)
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
    evidence: JsonObject | None = None,
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
    new = touch(it, now, status=to, worker=new_worker, evidence=tuple(evs))
    after = _swap(plan, new)
    validate(plan, after, frozenset({key}) if accept_unconfirmed else frozenset())
    detail: JsonObject = {}
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
    evidence: JsonObject | None = None,
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
    text = check_content(text, "note")
    new = touch(it, now, notes=(*it.notes, text))
    return Outcome(
        _swap(plan, new),
        (Event(key, now, it.status, it.status, "note", actor, {"note": text}),),
        {"item": key},
    )
