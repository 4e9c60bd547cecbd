"""Repository for plans: items and their history, each change one transaction.

`PlanRepo.apply(name, op)` loads the plan inside a write transaction (`Store.transaction`, so two workers
cannot interleave), runs a pure `servelab.plan` operation on it, and writes the changed items plus their
events; if the operation raises, the transaction rolls back and nothing changed.

`fill_from_study` and `on_trial` are the two calls the study loop makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from servelab.jsontypes import JsonObject
from servelab.plan import study
from servelab.plan.items import Event, Item, Outcome, Plan
from servelab.redact import redact
from servelab.store.db import Row, Store, utcnow

WORKSPACE = "workspace"


@dataclass(frozen=True)
class PlanSummary:
    """One stored plan as `PlanRepo.plans` lists it: its items, and how many are still open."""

    name: str
    kind: str
    study_uid: str | None
    created_at: str
    items: int
    open: int


def _j(obj: Any) -> str:
    return orjson.dumps(redact(obj), option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


class PlanRepo:
    def __init__(self, store: Store) -> None:
        self.db = store

    # -- reading ----------------------------------------------------------------------------------
    def _plan_row(self, name: str) -> Row | None:
        return self.db.execute("SELECT * FROM plans WHERE name = ?", (name,)).fetchone()

    def load(self, name: str = WORKSPACE) -> Plan:
        """The plan as stored (an empty plan when nothing was written to it yet)."""
        row = self._plan_row(name)
        if row is None:
            return Plan(name)
        rows = self.db.execute(
            "SELECT * FROM plan_items WHERE plan_id = ? ORDER BY position, id", (row["id"],)
        )
        return Plan(name, tuple(_item(r) for r in rows.fetchall()))

    def plans(self) -> list[PlanSummary]:
        rows = self.db.execute(
            "SELECT p.name, p.kind, p.study_uid, p.created_at, COUNT(i.id) AS items,"
            " SUM(CASE WHEN i.status IN ('pending', 'in_progress', 'blocked') THEN 1 ELSE 0 END) AS open"
            " FROM plans p LEFT JOIN plan_items i ON i.plan_id = p.id GROUP BY p.id ORDER BY p.id"
        )
        return [
            PlanSummary(
                name=r["name"],
                kind=r["kind"],
                study_uid=r["study_uid"],
                created_at=r["created_at"],
                items=int(r["items"]),
                open=int(r["open"] or 0),
            )
            for r in rows.fetchall()
        ]

    def history(self, name: str = WORKSPACE, key: str | None = None) -> list[Event]:
        """Every recorded change, oldest first (of one item when `key` is given)."""
        sql = (
            "SELECT e.*, i.key FROM plan_events e JOIN plan_items i ON i.id = e.item_id"
            " JOIN plans p ON p.id = i.plan_id WHERE p.name = ?"
        )
        args: list[Any] = [name]
        if key is not None:
            sql += " AND i.key = ?"
            args.append(key)
        rows = self.db.execute(sql + " ORDER BY e.id", args).fetchall()
        return [
            Event(
                r["key"],
                r["at"],
                r["from_status"],
                r["to_status"],
                r["reason"],
                r["actor"],
                orjson.loads(r["detail_json"]),
            )
            for r in rows
        ]

    # -- writing ----------------------------------------------------------------------------------
    def apply(self, name: str, op: Callable[[Plan], Outcome], study_uid: str | None = None) -> Outcome:
        """Run `op` on the stored plan and write its outcome, all in one transaction."""
        with self.db.transaction("plan"):
            before = self.load(name)
            outcome = op(before)
            if outcome.events:
                self._write(name, before, outcome, study_uid)
        return outcome

    def _write(self, name: str, before: Plan, outcome: Outcome, study_uid: str | None) -> None:
        row = self._plan_row(name)
        if row is None:
            kind = "workspace" if name == WORKSPACE else "study"
            new_id = self.db.insert(
                "INSERT INTO plans (name, kind, study_uid, created_at) VALUES (?, ?, ?, ?)",
                (name, kind, study_uid or (None if kind == "workspace" else name), utcnow()),
            )
            plan_id = new_id
        else:
            plan_id = int(row["id"])
        old = {i.id: i for i in before.items}
        row_ids: dict[str, int] = {}
        for pos, it in enumerate(outcome.plan.items):
            values = (
                pos,
                it.content,
                it.status,
                it.priority,
                it.worker,
                _j(list(it.depends_on)),
                _j(list(it.notes)),
                _j(it.binding) if it.binding is not None else None,
                _j(list(it.evidence)),
                _j(it.extra),
                it.created_at,
                it.updated_at,
            )
            if it.id not in old:
                new_id = self.db.insert(
                    "INSERT INTO plan_items (position, content, status, priority, worker, depends_on_json, notes_json,"
                    " binding_json, evidence_json, extra_json, created_at, updated_at, plan_id, key)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*values, plan_id, it.id),
                )
                row_ids[it.id] = new_id
            elif it != old[it.id]:
                self.db.execute(
                    "UPDATE plan_items SET position = ?, content = ?, status = ?, priority = ?, worker = ?,"
                    " depends_on_json = ?, notes_json = ?, binding_json = ?, evidence_json = ?, extra_json = ?,"
                    " created_at = ?, updated_at = ? WHERE plan_id = ? AND key = ?",
                    (*values, plan_id, it.id),
                )
        for ev in outcome.events:
            item_id = row_ids.get(ev.item) or self._item_id(plan_id, ev.item)
            self.db.execute(
                "INSERT INTO plan_events (item_id, at, from_status, to_status, reason, actor, detail_json)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (item_id, ev.at, ev.from_status, ev.to_status, ev.reason, ev.actor, _j(ev.detail)),
            )

    def _item_id(self, plan_id: int, key: str) -> int:
        row = self.db.execute(
            "SELECT id FROM plan_items WHERE plan_id = ? AND key = ?", (plan_id, key)
        ).fetchone()
        assert row is not None, (plan_id, key)  # an event names an item of the plan it changed
        return int(row["id"])


def _load(text: str | None, default: Any) -> Any:
    return default if text is None else orjson.loads(text)


def _item(r: Row) -> Item:
    return Item(
        id=r["key"],
        content=r["content"],
        status=r["status"],
        priority=r["priority"],
        worker=r["worker"],
        depends_on=tuple(_load(r["depends_on_json"], [])),
        notes=tuple(_load(r["notes_json"], [])),
        binding=_load(r["binding_json"], None),
        evidence=tuple(_load(r["evidence_json"], [])),
        extra=_load(r["extra_json"], {}),
        created_at=r["created_at"],
        updated_at=r["updated_at"],
    )


# -- the study loop's API ---------------------------------------------------------------------------
def fill_from_study(
    store: Store, study_uid: str, candidates: list[tuple[str, float | None, JsonObject]]
) -> list[str]:
    """Add one item per candidate (label, predicted value or None, requested normalized config) to the
    study's plan, in the order given. Idempotent: candidates that already have an item are skipped, so a
    resumed study adds nothing twice. Returns the ids of the items added."""
    out = PlanRepo(store).apply(
        study_uid, lambda p: study.fill(p, study_uid, candidates, now=utcnow()), study_uid
    )
    added: list[str] = out.info["added"]
    return added


def on_trial(
    store: Store,
    study_uid: str,
    label: str,
    status: str,
    evidence: JsonObject,
    *,
    actor: str = study.TUNE_WORKER,
) -> Item:
    """Move a candidate's item: status is one of running | measured | not_applied | failed | anomalous |
    interrupted | lost; evidence is {"run"?, "trial"?, "effective"?, "not_applied"?, "diagnosis"?,
    "anomalies"?} (see `servelab.plan.study.on_trial` for what each status does, and `actor`). Returns the item
    as stored."""
    out = PlanRepo(store).apply(
        study_uid,
        lambda p: study.on_trial(p, study_uid, label, status, evidence, now=utcnow(), actor=actor),
        study_uid,
    )
    return out.plan.get(study.item_for(out.plan, study_uid, label).id)


def close_not_applied(store: Store, study_uid: str, label: str, evidence: JsonObject) -> Item:
    """At the end of a study: close a not-applied candidate's item as not applied (`plan.study.close_not_applied`),
    evidence {"run"?, "trial"?, "effective"?, "not_applied", "unconfirmed"?}. Returns the item as stored."""
    out = PlanRepo(store).apply(
        study_uid,
        lambda p: study.close_not_applied(p, study_uid, label, evidence, now=utcnow()),
        study_uid,
    )
    return out.plan.get(study.item_for(out.plan, study_uid, label).id)
