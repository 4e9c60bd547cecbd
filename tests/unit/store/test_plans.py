"""The plan repository on a real SQLite store: one transaction per change, history, the study loop's API."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.errors import ConfigError, NotFoundError
from servelab.plan.formats import export_json, import_json, import_todowrite
from servelab.plan.items import Outcome, Plan
from servelab.plan.machine import add, done, note, start
from servelab.store import open_store
from servelab.store.db import Store
from servelab.store.plans import PlanRepo, PlanSummary, fill_from_study, on_trial

KW = {"now": "2026-11-29T12:00:00.000+00:00", "actor": "test"}


@pytest.fixture
def store(where: Path | str) -> Store:
    s = open_store(where)
    yield s  # type: ignore[misc]
    s.close()


def count(store: Store, table: str) -> int:
    return int(store.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def test_migration_is_applied_and_an_unwritten_plan_is_empty(store: Store) -> None:
    assert "0004_plan" in store.applied_migrations()
    assert PlanRepo(store).load().items == ()
    assert count(store, "plans") == 0


def test_changes_are_stored_with_their_history(where: Path | str, store: Store) -> None:
    repo = PlanRepo(store)
    repo.apply("workspace", lambda p: add(p, "check the container", priority="high", **KW))
    repo.apply("workspace", lambda p: add(p, "run it", depends_on=["1"], binding={"url": "http://h:1"}, **KW))
    repo.apply("workspace", lambda p: start(p, "1", worker="agent", **KW))
    repo.apply("workspace", lambda p: note(p, "1", "2 GPUs visible", **KW))
    store.close()
    with open_store(where) as again:
        r = PlanRepo(again)
        p = r.load()
        assert [(i.id, i.status, i.worker) for i in p.items] == [
            ("1", "in_progress", "agent"),
            ("2", "pending", None),
        ]
        assert p.get("1").notes == ("2 GPUs visible",) and p.get("2").depends_on == ("1",)
        assert p.get("2").binding == {"url": "http://h:1"}
        hist = r.history("workspace", "1")
        assert [(e.from_status, e.to_status, e.reason) for e in hist] == [
            (None, "pending", "added"),
            ("pending", "in_progress", "started"),
            ("in_progress", "in_progress", "note"),
        ]
        assert hist[1].detail == {"worker": "agent"} and hist[1].actor == "test"
        assert len(r.history("workspace")) == 4
        assert r.plans() == [
            PlanSummary(
                name="workspace",
                kind="workspace",
                study_uid=None,
                created_at=r.plans()[0].created_at,
                items=2,
                open=2,
            )
        ]


def test_an_invalid_change_writes_nothing(store: Store) -> None:
    repo = PlanRepo(store)
    repo.apply("workspace", lambda p: add(p, "a", **KW))
    repo.apply("workspace", lambda p: start(p, "1", **KW))
    before = (repo.load(), count(store, "plan_events"))

    def half_then_fail(p: Plan) -> Outcome:
        return import_todowrite(
            p,
            [
                {"id": "1", "content": "a", "status": "completed"},
                {"id": "2", "content": "b", "status": "in_progress"},
                {"id": "3", "content": "c", "status": "in_progress"},
            ],
            **KW,
        )

    with pytest.raises(ConfigError, match="two items in progress"):
        repo.apply("workspace", half_then_fail)
    with pytest.raises(NotFoundError):
        repo.apply("workspace", lambda p: done(p, "9", **KW))
    with pytest.raises(ConfigError):
        repo.apply("other", lambda p: add(p, "x", priority="urgent", **KW))
    assert (repo.load(), count(store, "plan_events")) == before
    assert count(store, "plans") == 1  # the failed first write to "other" created no plan row
    assert not store.in_transaction


def test_json_round_trip_through_the_store(store: Store) -> None:
    repo = PlanRepo(store)
    repo.apply("workspace", lambda p: add(p, "a", binding={"requested": {"tp_size": 2}}, **KW))
    repo.apply(
        "workspace",
        lambda p: import_todowrite(p, [{"content": "b", "status": "pending", "activeForm": "Doing b"}], **KW),
    )
    exported = export_json(repo.load())
    repo.apply("copy", lambda p: import_json(p, exported, **KW))
    assert export_json(repo.load("copy"))["items"] == exported["items"]


def test_study_loop_api(store: Store) -> None:
    cands = [("trtllm", 1200.0, {"moe_runner_backend": "flashinfer_trtllm"}), ("base", None, {})]
    assert fill_from_study(store, "s-abc", cands) == ["1", "2"]
    assert fill_from_study(store, "s-abc", cands) == []  # resume adds nothing
    assert on_trial(store, "s-abc", "trtllm", "running", {"run": "b-1"}).status == "in_progress"
    it = on_trial(
        store,
        "s-abc",
        "trtllm",
        "not_applied",
        {
            "run": "b-1",
            "trial": 7,
            "effective": {
                "effective": {"moe_runner_backend": "flashinfer_cutlass"},
                "evidence": {"moe_runner_backend": "backend=cutlass"},
            },
        },
    )
    assert it.status == "pending" and it.evidence[-1]["mismatches"][0]["evidence"] == "backend=cutlass"
    on_trial(store, "s-abc", "trtllm", "running", {"run": "b-2"})
    finished = on_trial(
        store,
        "s-abc",
        "trtllm",
        "measured",
        {"run": "b-2", "effective": {"moe_runner_backend": "flashinfer_trtllm"}},
    )
    assert finished.status == "completed"
    repo = PlanRepo(store)
    assert repo.plans()[0].kind == "study" and repo.plans()[0].study_uid == "s-abc"
    assert [e.to_status for e in repo.history("s-abc", "1")] == [
        "pending",
        "in_progress",
        "pending",
        "in_progress",
        "completed",
    ]
    assert repo.load("workspace").items == ()
