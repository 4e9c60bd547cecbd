"""The plan's data: items, the events that explain each change, and the checks on a single field.

A `Plan` is a tuple of `Item`s; every operation (machine.py, study.py, formats.py) builds a new one and
returns it in an `Outcome` with its `Event`s, so the store writes both in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

from servelab.errors import ConfigError, NotFoundError
from servelab.jsontypes import JsonObject

STATUSES: tuple[str, ...] = ("pending", "in_progress", "completed", "cancelled", "blocked")
OPEN_STATUSES: tuple[str, ...] = ("pending", "in_progress", "blocked")
PRIORITIES: tuple[str, ...] = ("high", "medium", "low")
DEFAULT_WORKER = "default"
JSON_FORMAT = "servelab-plan"
_BINDING_KEYS = ("study", "candidate", "requested", "predicted", "url", "unit")


class Binding(TypedDict, total=False):
    """What an item is bound to. A TypedDict, not a model: it is stored as given (keys, order, omissions),
    and the readers (study, checks, the CLI) get its keys typed."""

    study: str
    candidate: str
    requested: JsonObject  # normalized engine keys the experiment asks for
    predicted: float | None
    url: str
    unit: str


class OutcomeInfo(TypedDict, total=False):
    """An operation's summary for its caller: the item it moved, or what an import or a fill did."""

    item: str
    unchanged: (
        bool | list[str]
    )  # an operation that changed nothing: True; an import: the ids it left as they were
    added: list[str]
    updated: list[str]
    missing: list[str]
    pruned: list[str]


@dataclass(frozen=True)
class Item:
    id: str
    content: str
    status: str = "pending"
    priority: str = "medium"
    worker: str | None = None
    depends_on: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    binding: Binding | None = None
    evidence: tuple[
        JsonObject, ...
    ] = ()  # run records, newest last (see study.assess); an import keeps any object
    extra: JsonObject = field(default_factory=dict)  # todowrite keys servelab does not use, kept verbatim
    created_at: str = ""
    updated_at: str = ""

    @property
    def bound(self) -> bool:
        """Bound to an experiment: completing it needs a run that shows the configuration applied."""
        b = self.binding or {}
        return bool(b.get("candidate") or b.get("requested"))

    @property
    def requested(self) -> JsonObject | None:
        """The configuration the binding asks for (None when it asks for none)."""
        return (self.binding or {}).get("requested")

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    def to_dict(self) -> JsonObject:
        d: JsonObject = asdict(self)
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
            raise ConfigError(f"{where} is not an object", hint=JSON_HINT)
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"{where} has unknown field(s) {', '.join(sorted(unknown))}",
                hint=f"known fields: {', '.join(cls.__dataclass_fields__)}",
            )
        if "id" not in d or "content" not in d:
            raise ConfigError(f"{where} needs an id and a content", hint=JSON_HINT)
        return cls(
            id=check_id(d["id"], where),
            content=check_content(d["content"], where),
            status=check_status(d.get("status", "pending"), where),
            priority=check_priority(d.get("priority", "medium"), where),
            worker=_worker(d.get("worker"), where),
            depends_on=tuple(check_id(x, where) for x in _list(d, "depends_on", where)),
            notes=tuple(str(n) for n in _list(d, "notes", where)),
            binding=check_binding(d.get("binding"), where),
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
    detail: JsonObject = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        d: JsonObject = asdict(self)
        return d


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
                hint=f"`servelab plan show{plan_flag(self.name)}` lists the items and their ids.",
            )
        return item

    def next_id(self) -> str:
        nums = [int(i.id) for i in self.items if i.id.isdigit()]
        return str(max(nums, default=0) + 1)

    def to_dict(self) -> JsonObject:
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
    info: OutcomeInfo = field(default_factory=lambda: OutcomeInfo())

    @property
    def changed(self) -> tuple[Item, ...]:
        keys = {e.item for e in self.events}
        return tuple(i for i in self.plan.items if i.id in keys)


JSON_HINT = "`servelab plan export --format json` shows the expected shape."
TODO_HINT = 'todowrite is a JSON list of {"content": ..., "status": ..., "priority": ..., "id": ...} objects.'


# -- field checks -------------------------------------------------------------------------------------
def check_status(value: Any, where: str = "status") -> str:
    if value not in STATUSES:
        raise ConfigError(f"{where}: unknown status {value!r}", hint=f"use one of {', '.join(STATUSES)}.")
    return str(value)


def check_priority(value: Any, where: str = "priority") -> str:
    if value not in PRIORITIES:
        raise ConfigError(f"{where}: unknown priority {value!r}", hint=f"use one of {', '.join(PRIORITIES)}.")
    return str(value)


def check_id(value: Any, where: str) -> str:
    if (
        isinstance(value, bool)
        or not isinstance(value, str | int)
        or not str(value).strip()
        or any(c.isspace() for c in str(value))
    ):
        raise ConfigError(f"{where}: id {value!r} must be a non-empty string without spaces", hint=TODO_HINT)
    return str(value)


def check_content(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: content must be non-empty text", hint=TODO_HINT)
    return value


def _list(d: Mapping[str, object], key: str, where: str) -> list[Any]:
    v = d.get(key) or []
    if not isinstance(v, list):
        raise ConfigError(f"{where}: {key} must be a list", hint=JSON_HINT)
    return v


def _worker(value: Any, where: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(f"{where}: worker must be a name or null", hint=JSON_HINT)
    return value


def _objects(d: Mapping[str, object], key: str, where: str) -> list[JsonObject]:
    v = _list(d, key, where)
    if not all(isinstance(x, dict) for x in v):
        raise ConfigError(f"{where}: every entry of {key} must be an object", hint=JSON_HINT)
    return v


def check_binding(value: object, where: str) -> Binding | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - set(_BINDING_KEYS):
        raise ConfigError(
            f"{where}: binding must be an object with keys among {', '.join(_BINDING_KEYS)}", hint=JSON_HINT
        )
    if value.get("requested") is not None and not isinstance(value["requested"], dict):
        raise ConfigError(f"{where}: binding.requested must be an object of normalized keys", hint=JSON_HINT)
    return cast(Binding, dict(value))  # its keys checked above; kept as given, in their order


def plan_flag(name: str) -> str:
    return "" if name == "workspace" else f" --plan {name}"
