"""`servelab plan` end to end through the CLI: what is printed, what is stored, and bad input changing nothing."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from servelab.cli.main import cli
from servelab.plan.items import Plan
from servelab.store import open_store
from servelab.store.plans import PlanRepo
from servelab.store.studies import StudyRepo


@pytest.fixture(autouse=True, params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: on the SQLite file in $SERVELAB_HOME, and on a fresh PostgreSQL database named by
    $SERVELAB_DB (what the CLI and `open_store()` resolve alike)."""
    if request.param == "postgresql":
        monkeypatch.setenv("SERVELAB_DB", request.getfixturevalue("pg_url"))
    return str(request.param)


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def ok(*args: str) -> Any:
    r = run(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def stored(name: str = "workspace") -> tuple[Plan, int]:
    with open_store() as s:
        repo = PlanRepo(s)
        return repo.load(name), len(repo.history(name))


def test_add_start_done_show_history() -> None:
    d = ok("plan", "add", "check the container", "--priority", "high")
    assert d["changed"] and d["item"]["id"] == "1" and d["item"]["priority"] == "high"
    assert set(d) == {"plan", "item", "changed", "events"}
    ok("plan", "add", "kill leftover processes", "--after", "1")
    d = ok("plan", "start", "1", "--worker", "agent-a")
    assert d["item"]["status"] == "in_progress" and d["events"][0]["from_status"] == "pending"
    ok("plan", "done", "1", "--reason", "GPUs visible")
    ok("plan", "note", "2", "pid 4242 holds GPU 0")
    show = ok("plan")
    assert show["counts"]["completed"] == 1 and show["counts"]["pending"] == 1
    assert [i["status"] for i in show["items"]] == ["completed", "pending"]
    assert show["items"][1]["notes"] == ["pid 4242 holds GPU 0"]
    p, n = stored()
    assert p.get("1").status == "completed" and n == 5
    hist = ok("plan", "history", "1")
    assert [e["reason"] for e in hist["events"]] == ["added", "started", "GPUs visible"]
    human = run("plan", "show")
    assert "check the container" in human.stdout and "completed 1" in human.stdout
    assert "pending → in_progress" in run("plan", "start", "2").stdout
    assert "already in_progress" in run("plan", "start", "2").stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["plan", "add", "x", "--priority", "urgent"], "unknown priority 'urgent'"),
        (["plan", "start", "9"], "no item '9'"),
        (["plan", "start", "2"], "waits for item 1 "),
        (["plan", "add", "x", "--after", "7"], "unknown item(s) 7"),
        (["plan", "add", "x", "--id", "1"], "already exists"),
        (["plan", "block", "1", "--reason", ""], "needs a reason"),
        (["plan", "block", "1"], "Missing option '--reason'"),
        (["plan", "done", "9"], "no item '9'"),
        (["plan", "show", "--plan", "s-nope"], "no plan 's-nope'"),
        (["plan", "add", "x", "--bind-candidate", "nolabel"], "is not STUDY:LABEL"),
        (["plan", "add", "x", "--requested", "tp_size"], "is not KEY=VALUE"),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(args: list[str], msg: str) -> None:
    ok("plan", "add", "a")
    ok("plan", "add", "b", "--after", "1")
    before = stored()
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert msg in r.stderr and "Traceback" not in r.stderr
    assert stored() == before


def test_import_export_todowrite_round_trip(tmp_path: Path) -> None:
    todo = tmp_path / "todos.json"
    todo.write_text(
        json.dumps(
            [
                {"id": "a", "content": "check the container", "status": "completed", "priority": "high"},
                {"id": "b", "content": "run the study", "status": "in_progress", "priority": "medium"},
                {"content": "write the report", "status": "pending", "priority": "low"},
            ]
        )
    )
    d = ok("plan", "import", str(todo))
    assert d["format"] == "todowrite" and d["added"] == ["a", "b", "1"]
    assert set(d) == {"plan", "format", "added", "updated", "unchanged", "missing", "pruned"}
    out = run("plan", "export", "--format", "todowrite")
    exported = json.loads(out.stdout)
    assert exported[:2] == json.loads(todo.read_text())[:2] and exported[2]["id"] == "1"
    # Back again: nothing changes, and no event is written.
    back = tmp_path / "back.json"
    back.write_text(out.stdout)
    before = stored()
    d = ok("plan", "import", str(back), "--format", "todowrite")
    assert d["unchanged"] == ["a", "b", "1"] and stored() == before
    # A list missing an item leaves it, and says so; --prune cancels it.
    back.write_text(json.dumps(exported[:2]))
    assert ok("plan", "import", str(back))["missing"] == ["1"] and stored()[0].get("1").status == "pending"
    assert "left as they are: 1" in run("plan", "import", str(back)).stdout
    assert ok("plan", "import", str(back), "--prune")["pruned"] == ["1"]
    assert stored()[0].get("1").status == "cancelled"


def test_import_from_stdin_and_bad_files(tmp_path: Path) -> None:
    r = run("plan", "import", "-", "--json", input='[{"content": "x", "status": "pending"}]')
    assert r.exit_code == 0 and json.loads(r.stdout)["added"] == ["1"]
    before = stored()
    bad = tmp_path / "bad.json"
    for text, msg in [
        ("{nope", "not valid JSON"),
        ('[{"content": "y", "status": "done"}]', "unknown status"),
        (
            '[{"content": "y", "status": "in_progress"}, {"content": "z", "status": "in_progress"}]',
            "two items in progress",
        ),
    ]:
        bad.write_text(text)
        r = run("plan", "import", str(bad))
        assert r.exit_code == 2 and msg in r.stderr, r.output
    assert run("plan", "import", str(tmp_path / "missing.json")).exit_code == 2
    cyc = {
        "format": "servelab-plan",
        "items": [
            {"id": "1", "content": "x", "depends_on": ["2"]},
            {"id": "2", "content": "y", "depends_on": ["1"]},
        ],
    }
    bad.write_text(json.dumps(cyc))
    r = run("plan", "import", str(bad))
    assert r.exit_code == 2 and "dependency cycle" in r.stderr
    assert stored() == before


def test_json_export_is_lossless_and_markdown_is_readable(tmp_path: Path) -> None:
    ok(
        "plan",
        "add",
        "check http://127.0.0.1:8000",
        "--requested",
        "moe_runner_backend=flashinfer_trtllm",
        "--url",
        "http://127.0.0.1:8000",
        "--unit",
        "servelab-glm.service",
    )
    ok("plan", "add", "b", "--after", "1")
    ok("plan", "block", "2", "--reason", "needs root")
    dump = tmp_path / "plan.json"
    assert run("plan", "export", "--format", "json", "-o", str(dump)).exit_code == 0
    data = json.loads(dump.read_text())
    assert data["items"][0]["binding"] == {
        "requested": {"moe_runner_backend": "flashinfer_trtllm"},
        "url": "http://127.0.0.1:8000",
        "unit": "servelab-glm.service",
    }
    # Into a study's plan, then out again: identical items.
    with open_store() as s:
        _, uid = StudyRepo(s).create_study("glm", None, {}, "h")
    assert ok("plan", "import", str(dump), "--plan", "glm")["added"] == ["1", "2"]
    again = json.loads(run("plan", "export", "--format", "json", "--plan", uid).stdout)
    assert again["items"] == data["items"] and again["plan"] == uid
    md = run("plan", "export", "--format", "markdown").stdout
    assert "- [!] **2** [medium] b (after 1)" in md and "why: needs root" in md


def make_trial(status: str, effective: dict[str, Any], not_applied: list[dict[str, Any]]) -> str:
    with open_store() as s:
        repo = StudyRepo(s)
        sid, uid = repo.create_study("glm", None, {}, "h")
        cid = repo.add_candidate(sid, 0, "trtllm", {}, None)
        tid = repo.start_trial(cid, 0, "m")
        repo.update_trial(
            tid, status=status, effective={"effective": effective, "evidence": {}}, not_applied=not_applied
        )
    return uid


def test_bound_item_completes_only_with_an_applied_run() -> None:
    uid = make_trial(
        "not_applied",
        {"moe_runner_backend": "flashinfer_cutlass"},
        [
            {
                "key": "moe_runner_backend",
                "requested": "flashinfer_trtllm",
                "effective": "flashinfer_cutlass",
                "evidence": "moe_runner_backend='flashinfer_cutlass'",
            }
        ],
    )
    d = ok(
        "plan",
        "add",
        "run trtllm",
        "--bind-candidate",
        f"{uid}:trtllm",
        "--requested",
        "moe_runner_backend=flashinfer_trtllm",
    )
    assert d["item"]["binding"] == {
        "study": uid,
        "candidate": "trtllm",
        "requested": {"moe_runner_backend": "flashinfer_trtllm"},
    }
    ok("plan", "start", "1")
    before = stored()
    for extra, msg in [
        ([], "completes only with a run"),
        (["--run", f"{uid}:trtllm"], "did not take effect"),
        (["--run", f"{uid}:nope"], "no candidate 'nope'"),
    ]:
        r = run("plan", "done", "1", *extra)
        assert r.exit_code == 2 and msg in r.stderr, r.output
    assert stored() == before
    with open_store() as s:
        repo = StudyRepo(s)
        cid = repo.candidates(repo.resolve(uid).id)[0].id
        tid = repo.start_trial(cid, 1, "m")
        repo.update_trial(
            tid,
            status="measured",
            effective={"effective": {"moe_runner_backend": "flashinfer_trtllm"}, "evidence": {}},
            not_applied=[],
        )
    d = ok("plan", "done", "1", "--run", f"{uid}:trtllm")
    assert d["item"]["status"] == "completed" and d["item"]["evidence"][-1]["applied"] is True
    assert d["item"]["evidence"][-1]["run"] == f"{uid}:trtllm#1"


def test_study_plan_is_separate_from_the_workspace() -> None:
    with open_store() as s:
        _, uid = StudyRepo(s).create_study("glm", None, {}, "h")
    ok("plan", "add", "study item", "--plan", "last")
    assert ok("plan", "show", "--plan", uid)["items"][0]["content"] == "study item"
    assert ok("plan", "--plan", "glm")["plan"] == uid
    assert ok("plan", "show")["items"] == []


OBS = {
    "servers": [
        {
            "url": "http://127.0.0.1:8000",
            "up": True,
            "models": ["m"],
            "engine": "sglang",
            "effective": {"moe_runner_backend": "flashinfer_cutlass"},
        }
    ],
    "services": [
        {
            "unit": "servelab-glm.service",
            "active_state": "active",
            "sub_state": "running",
            "restarts": 0,
            "since": "Sun 2026-11-29 10:00:00 UTC",
        }
    ],
    "gpus": [],
    "leftovers": {},
}


def test_check_against_an_observation(tmp_path: Path) -> None:
    ok("plan", "add", "running flashinfer_trtllm")
    ok("plan", "start", "1")
    ok("plan", "add", "fix the failing service")
    ok("plan", "add", "done already")
    ok("plan", "done", "3")
    obs = tmp_path / "obs.json"
    obs.write_text(json.dumps(OBS))
    d = ok("plan", "check", "--observation", str(obs))
    assert set(d) == {"plan", "checked", "observed", "findings"}
    assert d["checked"] == 2 and d["observed"] == {"servers": 1, "services": 1}
    assert [(f["item"], f["kind"], f["severity"]) for f in d["findings"]] == [
        ("1", "config_mismatch", "warning"),
        ("2", "service_healthy", "warning"),
    ]
    human = run("plan", "check", "--observation", str(obs)).stdout
    assert "config_mismatch" in human and "flashinfer_cutlass" in human
    obs.write_text("[]")
    assert run("plan", "check", "--observation", str(obs)).exit_code == 2


def test_check_says_plainly_when_status_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    ok("plan", "add", "a")
    monkeypatch.setitem(
        sys.modules, "servelab.status.service", None
    )  # import fails as if it were not installed
    r = run("plan", "check")
    assert r.exit_code == 1 and "servelab status is not available" in r.stderr and "--observation" in r.stderr


def test_check_observes_the_servers_the_items_name(monkeypatch: pytest.MonkeyPatch) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there: a real probe finds it down
    ok("plan", "add", f"benchmark {url} at concurrency 8")
    ok("plan", "start", "1")
    import servelab.status.service as status

    seen: dict[str, Any] = {}
    real = status.observe

    def spy(urls: list[str] | None = None, units: list[str] | None = None, **kw: Any) -> dict[str, Any]:
        seen.update(urls=urls, units=units)
        return real(urls=urls, units=units, **kw)

    monkeypatch.setattr(status, "observe", spy)
    d = ok("plan", "check")
    assert seen["urls"] == [url]
    assert [f["kind"] for f in d["findings"]] == ["server_down"]


def test_done_with_a_bench_run_uses_the_trial_that_made_it() -> None:
    from servelab.store.bench import BenchRepo

    uid = make_trial("measured", {"moe_runner_backend": "flashinfer_trtllm"}, [])
    with open_store() as s:
        run_id, run_uid = BenchRepo(s).create_run("http://h:1", "m", "chat", {}, None)
        _, plain_uid = BenchRepo(s).create_run("http://h:2", "m", "chat", {}, None)
        s.execute("UPDATE study_trials SET bench_run_id = ?", (run_id,))
    ok("plan", "add", "plain item")
    d = ok("plan", "done", "1", "--run", plain_uid)  # an unbound item takes any run as evidence
    assert d["item"]["evidence"][0]["run"] == plain_uid and d["item"]["evidence"][0]["applied"] is None
    ok("plan", "add", "run trtllm", "--requested", "moe_runner_backend=flashinfer_trtllm")
    r = run("plan", "done", "2", "--run", plain_uid)
    assert r.exit_code == 2 and "does not show" in r.stderr
    d = ok("plan", "done", "2", "--run", run_uid)
    assert d["item"]["status"] == "completed" and d["item"]["evidence"][-1]["trial"] is not None
    assert run("plan", "done", "2", "--run", "b-missing").exit_code == 2
    assert uid


def test_plan_option_before_the_subcommand_applies_to_it() -> None:
    with open_store() as s:
        _, uid = StudyRepo(s).create_study("glm", None, {}, "h")
    r = run("plan", "--plan", "glm", "add", "study item")
    assert r.exit_code == 0, r.output
    assert [i.content for i in stored(uid)[0].items] == ["study item"] and stored()[0].items == ()
    assert "note pid 1" in run("plan", "--plan", uid, "note", "1", "pid 1").stdout
