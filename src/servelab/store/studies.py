"""Repository for studies, their candidates and trials (one launch + verify + benchmark of a candidate).

Every state change commits at once, so a study killed at any point (Ctrl-C, `kill -9`, a reboot) can be
resumed from exactly what the store says happened.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from servelab.errors import NotFoundError
from servelab.jsontypes import JsonObject
from servelab.redact import redact
from servelab.results import Node
from servelab.startup import StartupPhases
from servelab.store.db import Store, utcnow

TERMINAL_TRIAL = ("measured", "not_applied", "failed")
_TRIAL_JSON = (
    "argv",
    "env",
    "requested",
    "effective",
    "not_applied",
    "diagnosis",
    "verify",
    "levels",
    "teardown",
    "node",
    "startup",
)


class SearchPredicted(BaseModel):
    """What the model predicted for a search's candidate when it was proposed: the prior and, once runs
    were fitted, the refitted model's objective value."""

    model_config = ConfigDict(frozen=True, extra="allow")

    prior: float | None = None
    refit: float | None = None
    refit_from_runs: int = 0
    refit_factors: list[str] | None = None  # the factors the refit freed (their names)


class CandidateSearch(BaseModel):
    """What the search knows of a candidate (its `search_json`), read by attribute by the search and the
    tuner. Keeps the stored keys only (`to_json`), so a rewrite merged onto it stores what it always did."""

    model_config = ConfigDict(frozen=True, extra="allow")

    origin: str | None = None  # listed | grid | tpe | ... (None: not told; readers choose the default)
    point: JsonObject | None = None
    rung: int = 0
    repeats: int = 1
    predicted: SearchPredicted | None = None
    region: JsonObject | None = None  # the pruned region (`search.base.Region.to_dict`)
    promoted: bool = False
    contender: bool = False

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json", exclude_unset=True)


class StoredStudy(BaseModel):
    """A study as stored, its JSON columns parsed once here (readers use attributes, not keys)."""

    model_config = ConfigDict(frozen=True)

    id: int
    uid: str
    name: str
    created_at: str
    finished_at: str | None
    status: str
    source: str | None
    spec: JsonObject  # the validated study file, redacted (config's Study is a layer above the store)
    spec_hash: str
    result: JsonObject | None  # ranking, baseline, search view


class StoredCandidate(BaseModel):
    """A study's candidate as stored."""

    model_config = ConfigDict(frozen=True)

    id: int
    study_id: int
    idx: int
    label: str
    spec: JsonObject  # a CandidateSpec dumped (space/config sit a layer above the store)
    predicted: JsonObject | None  # the model's prediction at the main level
    status: str
    outcome: JsonObject | None  # the trial's record (diagnosis, what was not applied, score, ...)
    search: CandidateSearch | None  # origin, point, rung, contender, region: what the search knows of it


class StoredTrial(BaseModel):
    """One trial as stored. `levels` stays the stored level digests (`LevelResult.stored()` dicts)."""

    model_config = ConfigDict(frozen=True)

    id: int
    candidate_id: int
    repeat: int
    status: str
    started_at: str
    finished_at: str | None
    marker: str
    url: str | None
    log_path: str | None
    pid: int | None
    engine_version: str | None
    bench_run_id: int | None
    ready_s: float | None
    error: str | None
    bench_open: str | None  # the uid of the bench run a level was measuring when the trial stopped
    resumed_from: int | None
    rung: int | None
    argv: list[str] | None
    env: dict[str, str] | None
    requested: JsonObject | None
    effective: JsonObject | None  # {"effective": {...}, "evidence": {...}}
    not_applied: list[JsonObject] | None  # `applied.Mismatch.to_dict()`s
    diagnosis: JsonObject | None
    verify: JsonObject | None
    levels: list[JsonObject] | None
    teardown: JsonObject | None
    node: Node | None  # the cluster node it ran on (stored as `Node.model_dump`)
    startup: StartupPhases | None  # its launch, phase by phase (None: attached, or stored before 0014)


def _j(obj: Any) -> str:
    return orjson.dumps(redact(obj), option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


def _load(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


class StudyRepo:
    """Writes take any JSON-serializable mapping (stored redacted, as is); reads give the typed rows."""

    def __init__(self, store: Store) -> None:
        self.db = store

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Several writes as one (`Store.transaction`): a kill leaves all of them or none."""
        with self.db.transaction("study"):
            yield

    # -- studies ----------------------------------------------------------------------------------
    def create_study(
        self, name: str, source: str | None, spec: Mapping[str, object], spec_hash: str
    ) -> tuple[int, str]:
        uid = "s-" + uuid.uuid4().hex[:10]
        new_id = self.db.insert(
            "INSERT INTO studies (uid, name, created_at, status, source, spec_json, spec_hash)"
            " VALUES (?, ?, ?, 'running', ?, ?, ?)",
            (uid, name, utcnow(), source, _j(spec), spec_hash),
        )
        return new_id, uid

    def set_study_status(
        self, study_id: int, status: str, result: Mapping[str, object] | None = None
    ) -> None:
        finished = utcnow() if status in ("completed", "failed") else None
        self.db.execute(
            "UPDATE studies SET status = ?, finished_at = ?, result_json = COALESCE(?, result_json) WHERE id = ?",
            (status, finished, _j(result) if result is not None else None, study_id),
        )

    def latest_unfinished(self, name: str) -> StoredStudy | None:
        row = self.db.execute(
            "SELECT * FROM studies WHERE name = ? AND status != 'completed' ORDER BY id DESC LIMIT 1", (name,)
        ).fetchone()
        return _study(row) if row else None

    def resolve(self, ref: str) -> StoredStudy:
        """A study by uid, numeric id, name (latest) or `last`."""
        if ref == "last":
            row = self.db.execute("SELECT * FROM studies ORDER BY id DESC LIMIT 1").fetchone()
        elif ref.isdigit():
            row = self.db.execute("SELECT * FROM studies WHERE id = ?", (int(ref),)).fetchone()
        else:
            row = self.db.execute(
                "SELECT * FROM studies WHERE uid = ? OR name = ? ORDER BY id DESC LIMIT 1", (ref, ref)
            ).fetchone()
        if row is None:
            raise NotFoundError(
                f"no study {ref!r} in the store",
                hint="`servelab runs` lists the stored studies; `servelab tune STUDY.toml` makes one.",
            )
        return _study(row)

    def list_studies(self, limit: int = 50) -> list[StoredStudy]:
        rows = self.db.execute("SELECT * FROM studies ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [_study(r) for r in rows]

    # -- candidates -------------------------------------------------------------------------------
    def add_candidate(
        self,
        study_id: int,
        idx: int,
        label: str,
        spec: Mapping[str, object],
        predicted: Mapping[str, object] | None,
        search: Mapping[str, object] | None = None,
        status: str = "pending",
    ) -> int:
        new_id = self.db.insert(
            "INSERT INTO study_candidates (study_id, idx, label, spec_json, predicted_json, status, search_json)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                study_id,
                idx,
                label,
                _j(spec),
                _j(predicted) if predicted is not None else None,
                status,
                _j(search) if search is not None else None,
            ),
        )
        return new_id

    def set_search(self, cand_id: int, search: Mapping[str, object]) -> None:
        self.db.execute("UPDATE study_candidates SET search_json = ? WHERE id = ?", (_j(search), cand_id))

    def candidates(self, study_id: int) -> list[StoredCandidate]:
        rows = self.db.execute("SELECT * FROM study_candidates WHERE study_id = ? ORDER BY idx", (study_id,))
        return [_candidate(r) for r in rows.fetchall()]

    def set_candidate(self, cand_id: int, status: str, outcome: Mapping[str, object] | None = None) -> None:
        self.db.execute(
            "UPDATE study_candidates SET status = ?, outcome_json = COALESCE(?, outcome_json) WHERE id = ?",
            (status, _j(outcome) if outcome is not None else None, cand_id),
        )

    # -- trials -----------------------------------------------------------------------------------
    def start_trial(self, cand_id: int, repeat: int, marker: str, **fields: Any) -> int:
        """A new trial, `launching`; `fields` (as `update_trial` takes them) are written with it, at once."""
        with self.transaction():
            new_id = self.db.insert(
                "INSERT INTO study_trials (candidate_id, repeat, status, started_at, marker)"
                " VALUES (?, ?, 'launching', ?, ?)",
                (cand_id, repeat, utcnow(), marker),
            )
            tid = new_id
            if fields:
                self.update_trial(tid, **fields)
        return tid

    def update_trial(self, trial_id: int, **fields: Any) -> None:
        """Set columns of a trial; `argv`, `effective`, … are stored as JSON (redacted)."""
        cols, vals = [], []
        for key, value in fields.items():
            if key in _TRIAL_JSON:
                cols.append(f"{key}_json = ?")
                vals.append(_j(value) if value is not None else None)
            elif key in (
                "status",
                "url",
                "log_path",
                "pid",
                "engine_version",
                "bench_run_id",
                "ready_s",
                "error",
                "bench_open",
                "resumed_from",
                "rung",
            ):
                cols.append(f"{key} = ?")
                vals.append(redact(value) if isinstance(value, str) else value)
            else:
                raise ValueError(f"unknown trial field {key}")
        if fields.get("status") in (*TERMINAL_TRIAL, "interrupted", "lost"):
            cols.append("finished_at = ?")
            vals.append(utcnow())
        self.db.execute(f"UPDATE study_trials SET {', '.join(cols)} WHERE id = ?", (*vals, trial_id))

    def trials(self, cand_id: int) -> list[StoredTrial]:
        rows = self.db.execute("SELECT * FROM study_trials WHERE candidate_id = ? ORDER BY id", (cand_id,))
        return [_trial(r) for r in rows.fetchall()]

    def trial_owner(self, trial_id: int) -> tuple[int, int] | None:
        """The (study id, candidate id) a trial belongs to (None: no such trial)."""
        row = self.db.execute(
            "SELECT c.study_id, c.id FROM study_trials t JOIN study_candidates c ON c.id = t.candidate_id"
            " WHERE t.id = ?",
            (trial_id,),
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def trial_of_run(self, run_id: int) -> int | None:
        """The latest trial whose benchmark was the bench run `run_id` (None: a run of no study)."""
        row = self.db.execute(
            "SELECT id FROM study_trials WHERE bench_run_id = ? ORDER BY id DESC LIMIT 1", (run_id,)
        ).fetchone()
        return int(row[0]) if row else None

    def study_of_run(self, uid: str) -> dict[str, str] | None:
        """The study and candidate whose trial made the bench run `uid` (its benchmark, or one of its
        levels' runs); None when no study's trial did."""
        row = self.db.execute(
            "SELECT s.uid, c.label FROM study_trials t JOIN study_candidates c ON c.id = t.candidate_id"
            " JOIN studies s ON s.id = c.study_id JOIN bench_runs b ON b.id = t.bench_run_id WHERE b.uid = ?"
            " UNION SELECT s.uid, c.label FROM study_trials t JOIN study_candidates c ON c.id = t.candidate_id"
            " JOIN studies s ON s.id = c.study_id WHERE t.levels_json LIKE ? LIMIT 1",
            (uid, f'%"{uid}"%'),
        ).fetchone()
        return None if row is None else {"uid": str(row["uid"]), "label": str(row["label"])}

    def open_trials(self, study_id: int) -> list[StoredTrial]:
        """Trials that never reached an end (the servelab running them was killed)."""
        rows = self.db.execute(
            "SELECT t.* FROM study_trials t JOIN study_candidates c ON c.id = t.candidate_id"
            " WHERE c.study_id = ? AND t.status NOT IN ('measured', 'not_applied', 'failed', 'interrupted', 'lost')",
            (study_id,),
        )
        return [_trial(r) for r in rows.fetchall()]


def _study(row: Any) -> StoredStudy:
    return StoredStudy.model_validate(
        {
            "id": row["id"],
            "uid": row["uid"],
            "name": row["name"],
            "created_at": row["created_at"],
            "finished_at": row["finished_at"],
            "status": row["status"],
            "source": row["source"],
            "spec": _load(row["spec_json"]),
            "spec_hash": row["spec_hash"],
            "result": _load(row["result_json"]),
        }
    )


def _candidate(row: Any) -> StoredCandidate:
    return StoredCandidate.model_validate(
        {
            "id": row["id"],
            "study_id": row["study_id"],
            "idx": row["idx"],
            "label": row["label"],
            "spec": _load(row["spec_json"]),
            "predicted": _load(row["predicted_json"]),
            "status": row["status"],
            "outcome": _load(row["outcome_json"]),
            "search": _load(row["search_json"]),
        }
    )


def _trial(row: Any) -> StoredTrial:
    """The columns are the model's fields; a JSON one is stored as `<field>_json`."""
    return StoredTrial.model_validate(
        {k: _load(row[f"{k}_json"]) if k in _TRIAL_JSON else row[k] for k in StoredTrial.model_fields}
    )
