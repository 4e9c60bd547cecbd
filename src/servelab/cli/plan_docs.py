"""The documents `servelab plan ... --json` prints, as types: a renderer reads only the keys its document
declares (`cli.output.emit` is generic over them)."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from servelab.jsontypes import JsonValue


class EvidenceDoc(TypedDict, total=False):
    """An evidence record (`plan.study.assess`): what the plan's table shows of the latest one."""

    run: str
    status: str
    applied: bool | None


class ItemDoc(TypedDict):
    """`Item.to_dict()`: the keys the views read."""

    id: str
    content: str
    status: str
    priority: str
    worker: str | None
    depends_on: list[str]
    evidence: list[EvidenceDoc]


class EventDetail(TypedDict, total=False):
    note: str


class EventDoc(TypedDict):
    """`Event.to_dict()`: one change to one item."""

    item: str
    at: str
    from_status: str | None
    to_status: str
    reason: str
    actor: str
    detail: EventDetail


class FindingDoc(TypedDict):
    """`Finding.to_dict()`: the keys the view reads."""

    kind: str
    severity: str
    message: str


class Shown(TypedDict):
    plan: str
    items: list[ItemDoc]
    counts: dict[str, int]


class Changed(TypedDict):
    plan: str
    item: ItemDoc | None
    changed: bool
    events: list[EventDoc]


class History(TypedDict):
    plan: str
    events: list[EventDoc]


class Imported(TypedDict):
    plan: str
    format: str
    added: list[str]
    updated: list[str]
    unchanged: list[str]
    missing: list[str]
    pruned: list[str]


class Observed(TypedDict):
    servers: int
    services: int
    host: NotRequired[JsonValue]
    hostname: NotRequired[JsonValue]


class Checked(TypedDict):
    plan: str
    checked: int
    observed: Observed
    findings: list[FindingDoc]


class CandidateRef(TypedDict):
    """`--bind-candidate STUDY:LABEL` resolved: the study's uid and the candidate's label."""

    study: str
    candidate: str
