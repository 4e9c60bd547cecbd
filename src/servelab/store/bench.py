"""Repository for benchmark runs, levels and requests. Every write commits at once (WAL), so a
killed benchmark keeps every request that had finished. Reading gives the typed `results.Run`: the
stored JSON is parsed here, once, and nowhere else."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from servelab.errors import NotFoundError
from servelab.jsontypes import JsonObject
from servelab.redact import redact
from servelab.results import (
    CapacityResult,
    Level,
    LevelSeries,
    LevelSummary,
    RequestRecord,
    Run,
    RunContext,
    Saturation,
    WorkloadInfo,
)
from servelab.store.db import Store, utcnow


def _j(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


class BenchRepo:
    def __init__(self, store: Store) -> None:
        self.db = store

    def create_run(
        self,
        url: str,
        model: str,
        api: str,
        config: Mapping[str, object],
        dataset_hash: str | None,
        context: RunContext | None = None,
        *,
        uid: str | None = None,
        created_at: str | None = None,
    ) -> tuple[int, str]:
        """A new run, `running`. `uid`/`created_at`: a run measured elsewhere keeps its own (an import)."""
        uid = uid or "b-" + uuid.uuid4().hex[:10]
        ctx = context or RunContext()
        new_id = self.db.insert(
            "INSERT INTO bench_runs (uid, created_at, status, url, model, api, engine, dataset_hash, config_json,"
            " context_json) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
            (
                uid,
                created_at or utcnow(),
                url,
                model,
                api,
                ctx.engine,
                dataset_hash,
                _j(redact(config)),
                _j(ctx.to_json()),
            ),
        )
        return new_id, uid

    def set_run_info(self, run_id: int, engine: str | None = None, warnings: list[str] | None = None) -> None:
        if engine is not None:
            self.db.execute("UPDATE bench_runs SET engine = ? WHERE id = ?", (engine, run_id))
        if warnings is not None:
            self.db.execute(
                "UPDATE bench_runs SET warnings_json = ? WHERE id = ?", (_j(redact(warnings)), run_id)
            )

    def set_capacity(self, run_id: int, result: CapacityResult) -> None:
        """The run's capacity search so far (written after every probe: a killed search keeps its curve)."""
        self.db.execute(
            "UPDATE bench_runs SET capacity_json = ? WHERE id = ?", (_j(result.to_json()), run_id)
        )

    def set_saturation(self, level_id: int, saturation: Saturation) -> None:
        self.db.execute(
            "UPDATE bench_levels SET saturation_json = ? WHERE id = ?",
            (_j(saturation.model_dump(mode="json")), level_id),
        )

    def finish_run(self, run_id: int, status: str, levels: list[LevelSummary] | None) -> None:
        summary = None if levels is None else {"levels": [lv.to_json() for lv in levels]}
        self.db.execute(
            "UPDATE bench_runs SET status = ?, finished_at = ?, summary_json = ? WHERE id = ?",
            (status, utcnow(), _j(summary) if summary is not None else None, run_id),
        )

    def interrupt_run(self, uid: str) -> bool:
        """Mark a run its process left `running` (killed) as interrupted, with its open levels; the
        requests that had finished stay. False when the run is not running (finished, or unknown)."""
        now = utcnow()
        cur = self.db.execute(
            "UPDATE bench_runs SET status = 'interrupted', finished_at = ? WHERE uid = ? AND status = 'running'",
            (now, uid),
        )
        if cur.rowcount != 1:
            return False
        self.db.execute(
            "UPDATE bench_levels SET status = 'interrupted', finished_at = ?"
            " WHERE run_id = (SELECT id FROM bench_runs WHERE uid = ?) AND status = 'running'",
            (now, uid),
        )
        return True

    def create_level(
        self, run_id: int, idx: int, mode: str, value: float, max_concurrency: int | None
    ) -> int:
        new_id = self.db.insert(
            "INSERT INTO bench_levels (run_id, idx, mode, value, max_concurrency, started_at, status)"
            " VALUES (?, ?, ?, ?, ?, ?, 'running')",
            (run_id, idx, mode, value, max_concurrency, utcnow()),
        )
        return new_id

    def finish_level(
        self,
        level_id: int,
        status: str,
        summary: LevelSummary,
        server: Mapping[str, object],
        client: Mapping[str, object],
        series: LevelSeries | None = None,
    ) -> None:
        """The level's outcome; `series`: its telemetry time series on the client's clock."""
        self.db.execute(
            "UPDATE bench_levels SET status = ?, finished_at = ?, summary_json = ?, server_metrics_json = ?,"
            " client_stats_json = ?, series_json = ? WHERE id = ?",
            (
                status,
                utcnow(),
                _j(summary.to_json()),
                _j(server),
                _j(client),
                _j(series.to_json()) if series is not None else None,
                level_id,
            ),
        )

    def add_request(self, level_id: int, r: RequestRecord) -> None:
        self.db.execute(
            "INSERT INTO bench_requests (level_id, idx, prompt_idx, scheduled_s, start_s, ok, ttft_s, e2e_s, itl_json,"
            " input_tokens, output_tokens, requested_output_tokens, token_source, error_kind, error_message,"
            " session_id, turn) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                r.session_id,
                r.turn,
            ),
        )

    # reading ---------------------------------------------------------------------------------------
    def _row(self, ref: str) -> Any:
        """A run's row by uid, numeric id, or `last`."""
        if ref == "last":
            row = self.db.execute("SELECT * FROM bench_runs ORDER BY id DESC LIMIT 1").fetchone()
        elif ref.isdigit():
            row = self.db.execute("SELECT * FROM bench_runs WHERE id = ?", (int(ref),)).fetchone()
        else:
            row = self.db.execute("SELECT * FROM bench_runs WHERE uid = ?", (ref,)).fetchone()
            if row is None and ref:
                like = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
                rows = self.db.execute(
                    "SELECT * FROM bench_runs WHERE uid LIKE ? ESCAPE '\\' LIMIT 6", (like,)
                ).fetchall()
                if len(rows) > 1:
                    raise NotFoundError(
                        f"run id {ref!r} is ambiguous: " + ", ".join(r["uid"] for r in rows),
                        hint="give more of the uid",
                    )
                row = rows[0] if rows else None
        if row is None:
            hint = "`servelab runs list` shows the stored runs."
            if ref == "last":
                hint = "no benchmark run is stored yet; `servelab bench --help` shows how to make one."
            raise NotFoundError(f"no benchmark run {ref!r}", hint=hint)
        return row

    def load(self, ref: str) -> Run:
        """A run by uid, numeric id, or `last`, with every stored level, parsed into the contract."""
        row = self._row(ref)
        levels = self.db.execute(
            "SELECT * FROM bench_levels WHERE run_id = ? ORDER BY idx", (row["id"],)
        ).fetchall()
        return _run(row, levels)

    def list_runs(self, limit: int = 50) -> list[Run]:
        """The most recent runs, newest first, each with its levels."""
        rows = self.db.execute("SELECT * FROM bench_runs ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        if not rows:
            return []
        ids = [r["id"] for r in rows]
        marks = ",".join("?" * len(ids))
        by_run: dict[int, list[Any]] = {i: [] for i in ids}
        for lv in self.db.execute(
            f"SELECT * FROM bench_levels WHERE run_id IN ({marks}) ORDER BY run_id, idx",
            ids,
        ).fetchall():
            by_run[lv["run_id"]].append(lv)
        return [_run(r, by_run[r["id"]]) for r in rows]

    def run_id(self, uid: str) -> int | None:
        """The store id of the run `uid` (None: no such run)."""
        row = self.db.execute("SELECT id FROM bench_runs WHERE uid = ?", (uid,)).fetchone()
        return int(row[0]) if row else None

    def level_id(self, uid: str, idx: int) -> int | None:
        """The store id of level `idx` of the run `uid` (None: not stored)."""
        row = self.db.execute(
            "SELECT l.id FROM bench_levels l JOIN bench_runs r ON r.id = l.run_id WHERE r.uid = ? AND l.idx = ?",
            (uid, idx),
        ).fetchone()
        return int(row[0]) if row else None

    def level_ids(self, run_id: int) -> dict[int, int]:
        """The stored levels of run `run_id`: index → level id (what `requests` takes)."""
        rows = self.db.execute("SELECT idx, id FROM bench_levels WHERE run_id = ?", (run_id,)).fetchall()
        return {int(r["idx"]): int(r["id"]) for r in rows}

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
                session_id=r["session_id"],
                turn=r["turn"],
            )
            for r in rows
        ]


def _loads(text: str | None) -> Any:
    return orjson.loads(text) if text else None


def _run(row: Any, level_rows: list[Any]) -> Run:
    """One stored run into the contract. A run stored before `context_json` existed has an empty context
    (its engine name only): its host and layout are unknown, not guessed."""
    config: JsonObject = _loads(row["config_json"]) or {}
    raw_ctx = _loads(row["context_json"])
    context = RunContext.model_validate(raw_ctx) if raw_ctx else RunContext()
    if context.engine is None and row["engine"]:
        context = context.model_copy(update={"engine": row["engine"]})
    speed = context.clock.speed
    levels = []
    for lv in level_rows:
        raw = _loads(lv["summary_json"])
        if raw is None:
            continue
        wall = LevelSummary.model_validate(raw)
        raw_series = _loads(lv["series_json"])
        series = LevelSeries.model_validate(raw_series) if raw_series else LevelSeries()
        levels.append(
            Level(
                index=lv["idx"],
                status=lv["status"],
                mode=lv["mode"],
                value=lv["value"],
                summary=wall.in_gpu_time(speed),
                wall=wall,
                server_metrics=_loads(lv["server_metrics_json"]) or {},
                client=_loads(lv["client_stats_json"]) or {},
                saturation=_saturation(lv),
                series=series.in_gpu_time(speed),
                wall_series=series,
            )
        )
    return Run(
        id=row["id"],
        uid=row["uid"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        status=row["status"],
        url=row["url"],
        model=row["model"],
        api=row["api"],
        context=context,
        workload=WorkloadInfo.model_validate(config.get("workload_info") or {}),
        capabilities=caps if isinstance(caps := config.get("capabilities"), dict) else {},
        config=config,
        warnings=_loads(row["warnings_json"]) or [],
        levels=levels,
        capacity=CapacityResult.model_validate(raw_cap)
        if (raw_cap := _column(row, "capacity_json"))
        else None,
    )


def _column(row: Any, name: str) -> Any:
    return _loads(row[name])


def _saturation(row: Any) -> Saturation | None:
    raw = _column(row, "saturation_json")
    return Saturation.model_validate(raw) if raw else None
