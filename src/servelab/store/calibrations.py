"""Named calibrations of the performance model: fitted factors or host measurements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from servelab.errors import NotFoundError
from servelab.jsontypes import JsonObject
from servelab.store.db import Store, utcnow


@dataclass(frozen=True)
class Calibration:
    name: str
    created_at: str
    kind: str
    source: str
    gpu: str | None
    factors: JsonObject  # the model's factor names and values, as fitted or measured
    report: JsonObject  # how they were found, shown as stored


def _row(r: Any) -> Calibration:
    return Calibration(
        name=r["name"],
        created_at=r["created_at"],
        kind=r["kind"],
        source=r["source"],
        gpu=r["gpu"],
        factors=orjson.loads(r["factors_json"]),
        report=orjson.loads(r["report_json"] or "{}"),
    )


def save(
    store: Store,
    name: str,
    kind: str,
    source: str,
    factors: Mapping[str, object],
    report: Mapping[str, object] | None = None,
    gpu: str | None = None,
) -> Calibration:
    """Insert or replace the calibration called `name`."""
    store.execute(
        """INSERT INTO calibrations (name, created_at, kind, source, gpu, factors_json, report_json)
           VALUES (?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT(name) DO UPDATE SET created_at=excluded.created_at, kind=excluded.kind,
             source=excluded.source, gpu=excluded.gpu, factors_json=excluded.factors_json,
             report_json=excluded.report_json""",
        (
            name,
            utcnow(),
            kind,
            source,
            gpu,
            orjson.dumps(factors).decode(),
            orjson.dumps(report or {}).decode(),
        ),
    )
    return get(store, name)


def get(store: Store, name: str) -> Calibration:
    r = store.execute("SELECT * FROM calibrations WHERE name = ?", (name,)).fetchone()
    if r is None:
        known = [c.name for c in list_all(store)]
        raise NotFoundError(
            f"no calibration named {name!r}",
            hint=("known calibrations: " + ", ".join(known))
            if known
            else "create one with `servelab calibrate`",
        )
    return _row(r)


def list_all(store: Store) -> list[Calibration]:
    return [_row(r) for r in store.execute("SELECT * FROM calibrations ORDER BY created_at, name")]
