"""The plan in and out: todowrite (the list coding agents keep their todos in), servelab's JSON, markdown.

`import_todowrite`/`export_todowrite` make an agent's todo list the same list as servelab's plan; an
import obeys the plan's rules (machine.validate), so an agent's list cannot silently complete an experiment.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, TypedDict

from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject, JsonValue
from servelab.plan.items import (
    DEFAULT_WORKER,
    JSON_FORMAT,
    TODO_HINT,
    Event,
    Item,
    Outcome,
    OutcomeInfo,
    Plan,
    check_content,
    check_id,
    check_priority,
    check_status,
)
from servelab.plan.machine import touch, validate

_TODOWRITE_KEYS = ("id", "content", "status", "priority")


def export_todowrite(plan: Plan) -> list[JsonObject]:
    """The agent's view: id, content, status, priority (and any extra todowrite keys an import carried)."""
    return [
        {"id": i.id, "content": i.content, "status": i.status, "priority": i.priority, **i.extra}
        for i in plan.items
    ]


def export_json(plan: Plan) -> JsonObject:
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
            verdict = _VERDICT[e.get("applied")]
            lines.append(
                f"  - evidence: run {e.get('run') or '-'} ({e.get('status') or '-'}), config {verdict}"
            )
    if not plan.items:
        lines.append("(empty)")
    return "\n".join(lines) + "\n"


_VERDICT: dict[JsonValue, str] = {True: "applied", False: "NOT applied", None: "not shown"}


def _md(text: str) -> str:
    return text.replace("\n", " ")


class TodoEntry(TypedDict):
    """One validated todowrite entry; `extra` keeps the keys servelab does not use, verbatim."""

    content: str
    status: str
    priority: str
    id: str | None
    extra: JsonObject


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
            "content": check_content(raw["content"], where),
            "status": check_status(raw["status"], where),
            "priority": check_priority(raw.get("priority", "medium"), where),
            "id": check_id(raw["id"], where) if raw.get("id") is not None else None,
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

    def status_change(it: Item, to: str) -> tuple[str, str | None] | None:
        """(status, worker) when the todo moves the item, else None."""
        if to == it.status:
            return None
        return to, ((it.worker or DEFAULT_WORKER) if to == "in_progress" else None)

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
            moved = status_change(new, e["status"])
            if moved is not None:
                new = replace(new, status=moved[0], worker=moved[1])
            items[key] = new
            events.append(Event(key, now, None, new.status, why, actor, {"item": new.to_dict()}))
            info["added"].append(key)
            seen.add(key)
            continue
        mark_seen(it)
        wanted = (("content", e["content"]), ("priority", e["priority"]), ("extra", e["extra"]))
        fields: dict[str, JsonValue] = {k: v for k, v in wanted if getattr(it, k) != v}
        moved = status_change(it, e["status"])
        if moved is not None:
            fields["status"], fields["worker"] = moved
        if not fields:
            info["unchanged"].append(it.id)
            continue
        new = touch(it, now, **fields)
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
            new = touch(items[it.id], now, status="cancelled", worker=None)
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
    validate(plan, after)
    summary: OutcomeInfo = {
        "added": info["added"],
        "updated": info["updated"],
        "unchanged": info["unchanged"],
        "missing": info["missing"],
        "pruned": info["pruned"],
    }
    return Outcome(after, tuple(events), summary)


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
    validate(plan, after)
    summary: OutcomeInfo = {
        "added": info["added"],
        "updated": info["updated"],
        "unchanged": info["unchanged"],
        "missing": info["missing"],
    }
    return Outcome(after, tuple(events), summary)
