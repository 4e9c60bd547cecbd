"""Repository for benchmark runs, levels and requests. Every write commits at once (WAL), so a
killed benchmark keeps every request that had finished."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from servelab.bench.metrics import RequestRecord
from servelab.errors import NotFoundError
from servelab.redact import redact
from servelab.store.db import Store, utcnow


def _j(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


class BenchRepo:
    def __init__(self, store: Store) -> None:
        self.db = store.conn

    def create_run(
        self, url: str, model: str, api: str, config: dict[str, Any], dataset_hash: str | None
    ) -> tuple[int, str]:
        uid = "b-" + uuid.uuid4().hex[:10]
        cur = self.db.execute(
            "INSERT INTO bench_runs (uid, created_at, status, url, model, api, dataset_hash, config_json)"
            " VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
            (uid, utcnow(), url, model, api, dataset_hash, _j(redact(config))),
        )
        return int(cur.lastrowid or 0), uid

    def set_run_info(self, run_id: int, engine: str | None = None, warnings: list[str] | None = None) -> None:
        if engine is not None:
            self.db.execute("UPDATE bench_runs SET engine = ? WHERE id = ?", (engine, run_id))
        if warnings is not None:
            self.db.execute(
                "UPDATE bench_runs SET warnings_json = ? WHERE id = ?", (_j(redact(warnings)), run_id)
            )

    def finish_run(self, run_id: int, status: str, summary: dict[str, Any] | None) -> None:
        self.db.execute(
            "UPDATE bench_runs SET status = ?, finished_at = ?, summary_json = ? WHERE id = ?",
            (status, utcnow(), _j(summary) if summary is not None else None, run_id),
        )

    def create_level(
        self, run_id: int, idx: int, mode: str, value: float, max_concurrency: int | None
    ) -> int:
        cur = self.db.execute(
            "INSERT INTO bench_levels (run_id, idx, mode, value, max_concurrency, started_at, status)"
            " VALUES (?, ?, ?, ?, ?, ?, 'running')",
            (run_id, idx, mode, value, max_concurrency, utcnow()),
        )
        return int(cur.lastrowid or 0)

    def finish_level(
        self,
        level_id: int,
        status: str,
        summary: dict[str, Any],
        server: dict[str, Any],
        client: dict[str, Any],
    ) -> None:
        self.db.execute(
            "UPDATE bench_levels SET status = ?, finished_at = ?, summary_json = ?, server_metrics_json = ?,"
            " client_stats_json = ? WHERE id = ?",
            (status, utcnow(), _j(summary), _j(server), _j(client), level_id),
        )

    def add_request(self, level_id: int, r: RequestRecord) -> None:
        self.db.execute(
            "INSERT INTO bench_requests (level_id, idx, prompt_idx, scheduled_s, start_s, ok, ttft_s, e2e_s, itl_json,"
            " input_tokens, output_tokens, requested_output_tokens, token_source, error_kind, error_message)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                level_id,
                r.idx,
                r.prompt_idx,
                r.scheduled_s,
                r.start_s,
                int(r.ok),
                r.ttft_s,
                r.e2e_s,
                _j(r.itl_s) if r.itl_s else None,
                r.input_tokens,
                r.output_tokens,
                r.requested_output_tokens,
                r.token_source,
                r.error_kind,
                redact(r.error_message) if r.error_message else None,
            ),
        )

    # reading ---------------------------------------------------------------------------------------
    def resolve(self, ref: str) -> dict[str, Any]:
        """A run by uid, numeric id, or `last`."""
        if ref == "last":
            row = self.db.execute("SELECT * FROM bench_runs ORDER BY id DESC LIMIT 1").fetchone()
        elif ref.isdigit():
            row = self.db.execute("SELECT * FROM bench_runs WHERE id = ?", (int(ref),)).fetchone()
        else:
            row = self.db.execute("SELECT * FROM bench_runs WHERE uid = ?", (ref,)).fetchone()
        if row is None:
            raise NotFoundError(
                f"no benchmark run {ref!r}", hint="`servelab runs list` shows the stored runs."
            )
        return _run_dict(row)

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM bench_runs ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [_run_dict(r) for r in rows]

    def levels(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT * FROM bench_levels WHERE run_id = ? ORDER BY idx", (run_id,)
        ).fetchall()
        out = []
        for r in rows:
            d = dict(r)
            for k in ("summary_json", "server_metrics_json", "client_stats_json"):
                d[k.removesuffix("_json")] = orjson.loads(d.pop(k)) if d.get(k) else None
            out.append(d)
        return out

    def requests(self, level_id: int) -> list[RequestRecord]:
        rows = self.db.execute(
            "SELECT * FROM bench_requests WHERE level_id = ? ORDER BY idx", (level_id,)
        ).fetchall()
        return [
            RequestRecord(
                idx=r["idx"],
                prompt_idx=r["prompt_idx"],
                start_s=r["start_s"],
                ok=bool(r["ok"]),
                scheduled_s=r["scheduled_s"],
                ttft_s=r["ttft_s"],
                e2e_s=r["e2e_s"],
                itl_s=orjson.loads(r["itl_json"]) if r["itl_json"] else [],
                input_tokens=r["input_tokens"],
                output_tokens=r["output_tokens"],
                requested_output_tokens=r["requested_output_tokens"],
                token_source=r["token_source"],
                error_kind=r["error_kind"],
                error_message=r["error_message"],
            )
            for r in rows
        ]


def _run_dict(row: Any) -> dict[str, Any]:
    d = dict(row)
    d["config"] = orjson.loads(d.pop("config_json"))
    d["warnings"] = orjson.loads(d.pop("warnings_json") or "[]")
    s = d.pop("summary_json")
    d["summary"] = orjson.loads(s) if s else None
    return d
