"""Deployments and their checks in the store (migration 0005_deployments), for `servelab status`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from servelab.deploy.unit_state import UnitStatus, unit_status
from servelab.jsontypes import JsonObject
from servelab.redact import redact
from servelab.store.db import Store, utcnow


def _j(obj: Any) -> str | None:
    return None if obj is None else orjson.dumps(redact(obj), option=orjson.OPT_NON_STR_KEYS).decode()


def _load(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


class DeploymentRepo:
    def __init__(self, store: Store) -> None:
        self.db = store

    def add(
        self,
        name: str,
        target: str,
        source: str,
        trial_id: int | None,
        path: str | None,
        spec: Mapping[str, object],  # the deployment as `deploy` printed it: stored as JSON
        status: str = "written",
    ) -> int:
        new_id = self.db.insert(
            "INSERT INTO deployments (name, created_at, target, source, trial_id, path, spec_json, status)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (name, utcnow(), target, source, trial_id, path, _j(spec), status),
        )
        return new_id

    def set_status(self, dep_id: int, status: str, installed: bool | None = None) -> None:
        self.db.execute(
            "UPDATE deployments SET status = ?, installed = COALESCE(?, installed) WHERE id = ?",
            (status, None if installed is None else int(installed), dep_id),
        )

    def add_check(
        self,
        dep_id: int,
        ok: bool,
        tolerance: float,
        level: float | None,
        tuned: Any,
        measured: Any,
        verify: Any,
        bench_run_id: int | None,
        verdict: str,
    ) -> int:
        new_id = self.db.insert(
            "INSERT INTO deployment_checks (deployment_id, created_at, ok, tolerance, level, tuned_json,"
            " measured_json, verify_json, bench_run_id, verdict) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                dep_id,
                utcnow(),
                int(ok),
                tolerance,
                level,
                _j(tuned),
                _j(measured),
                _j(verify),
                bench_run_id,
                verdict,
            ),
        )
        return new_id

    def list(self, installed_only: bool = False, limit: int = 50) -> list[JsonObject]:
        """Latest first; each with its latest check (None when never checked)."""
        where = "WHERE installed = 1" if installed_only else ""
        rows = self.db.execute(
            f"SELECT * FROM deployments {where} ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [self._with_check(r) for r in rows]

    def latest(self, name: str) -> JsonObject | None:
        row = self.db.execute(
            "SELECT * FROM deployments WHERE name = ? ORDER BY id DESC LIMIT 1", (name,)
        ).fetchone()
        return self._with_check(row) if row else None

    def _with_check(self, row: Any) -> JsonObject:
        """The row as its stored JSON (`spec`, the check's documents) reads back: open JSON, printed as is."""
        d: JsonObject = {
            k: row[k] for k in ("id", "name", "created_at", "target", "source", "trial_id", "path", "status")
        }
        d["installed"] = bool(row["installed"])
        d["spec"] = _load(row["spec_json"])
        c = self.db.execute(
            "SELECT * FROM deployment_checks WHERE deployment_id = ? ORDER BY id DESC LIMIT 1", (row["id"],)
        ).fetchone()
        d["check"] = (
            None
            if c is None
            else {
                "ok": bool(c["ok"]),
                "tolerance": c["tolerance"],
                "level": c["level"],
                "tuned": _load(c["tuned_json"]),
                "measured": _load(c["measured_json"]),
                "verify": _load(c["verify_json"]),
                "bench_run_id": c["bench_run_id"],
                "verdict": c["verdict"],
                "created_at": c["created_at"],
            }
        )
        return d


def installed_units(store: Store) -> list[JsonObject]:
    """Each installed deployment (latest per name) with what systemd says of it now and its latest check:
    what `servelab status` shows. Keys: name, source, target, status, check, unit ({unit, state, sub,
    main_pid, restarts, since}), host (None: this machine)."""
    seen: set[str] = set()
    out: list[JsonObject] = []
    for d in DeploymentRepo(store).list(installed_only=True):
        name = str(d["name"])
        if name in seen:
            continue
        seen.add(name)
        spec = d["spec"]
        host = spec.get("host") if isinstance(spec, dict) else None
        # a unit on another host: this machine's systemd knows nothing of it (`status --host` asks there)
        unit = UnitStatus(unit=f"{name}.service", state=f"unknown (on {host})") if host else unit_status(name)
        out.append(
            {k: d[k] for k in ("name", "source", "target", "status", "check", "created_at")}
            | {"host": host, "unit": unit.to_json()}
        )
    return out
