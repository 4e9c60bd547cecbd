"""`kill -9` of `servelab tune` at every step boundary of a trial, then `--resume`: the same outcome as an
uninterrupted run of the same study (ranking, who meets the SLOs, which levels were measured), no level
measured twice, no bench run left `running`, nothing left behind. And two real drivers of one study: the
second is refused, naming the first, which finishes undisturbed; `servelab status` tells a live study from
a killed one. Real processes, the real simulator, the real store (read, never written, by the tests)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_tune_sim import ROOT, markers_alive, servelab, write_study

pytestmark = pytest.mark.integration

# Two candidates, the baseline `a` first; `b` runs one request at a time, so at c=4 its requests queue:
# its TTFT breaks the SLO there (it meets it at c=1 only) and `a` wins. At speed 5 a millisecond of the
# box's jitter is 5 simulated ones: a (TTFT ~75 ms at c=4) and b (~540 ms) stay on their sides of 250 ms
# on a busy 2-core box, also with a second driver and `status` starting beside the first (at 20 they did not).
CANDIDATES = [{"name": "a", "baseline": True}, {"name": "b", "max_concurrency": 1}]
# The anomaly limits far from b's throughput and utilization (about half of a's at c=4), so that noise
# cannot flag it.
TOP = "[slo]\nttft_ms = { p50 = 250 }\n[anomalies]\ncollapse_ratio = 0.1\npower_drop_ratio = 0.1"

# (SERVELAB_TEST_CRASH_AT, what the kill leaves): every boundary of a's trial, then two of b's.
STEPS = [
    "launching",  # command stored, nothing started
    "launched",  # server running, not ready
    "ready",
    "verified",
    "level-started",  # level 1's bench run open
    "level-done",  # level 1 stored
    "level-started#2",  # level 4's bench run open, level 1 stored
    "level-done#2",  # every level stored, the trial not yet measured
    "finished",  # trial measured, server still running
    "teardown",  # server stopped, teardown not stored
    "torn-down",  # after the teardown
    "level-started#3",  # b's first level open
    "torn-down#2",  # after the last teardown, the study not yet ranked
]


def _study(tmp: Path) -> Path:
    return write_study(tmp / "crash.toml", "crash", CANDIDATES, levels=[1, 4], speed=5, top=TOP)


def outcome(result: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on a kill: the ranking's order and winner, each candidate's status, the levels
    it was measured at, and the levels meeting the SLOs."""
    return {
        "winner": result["ranking"]["winner"],
        "ranked": [
            (r["label"], r["status"], r["level"], r["levels_meeting_slo"])
            for r in result["ranking"]["ranked"]
        ],
        "candidates": {
            c["label"]: (c["status"], [lv["level"] for lv in c["levels"]]) for c in result["candidates"]
        },
    }


def _db(home: Path, sql: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(home / "servelab.db", timeout=10)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _trials(home: Path) -> list[tuple[str, str]]:
    if not (home / "servelab.db").exists():
        return []
    try:
        return [
            (str(r[0]), str(r[1]))
            for r in _db(
                home,
                "SELECT c.label, t.status FROM study_trials t JOIN study_candidates c ON c.id = t.candidate_id"
                " ORDER BY t.id",
            )
        ]
    except sqlite3.OperationalError:
        return []


def _server_of(home: Path, label: str) -> int | None:
    """The pid of `label`'s launched server, once stored."""
    if not (home / "servelab.db").exists():
        return None
    try:
        rows = _db(
            home,
            "SELECT t.pid FROM study_trials t JOIN study_candidates c ON c.id = t.candidate_id"
            f" WHERE c.label = '{label}' AND t.pid IS NOT NULL",
        )
    except sqlite3.OperationalError:
        return None
    return int(rows[0][0]) if rows else None


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run of the study."""
    tmp = tmp_path_factory.mktemp("crash-ref")
    res = servelab("tune", str(_study(tmp)), "--json", home=tmp / "home")
    return outcome(json.loads(res.stdout))


def test_the_reference_outcome_is_the_one_the_study_is_built_for(reference: dict[str, Any]) -> None:
    assert reference["winner"] == "a"
    assert reference["candidates"] == {"a": ("measured", [1.0, 4.0]), "b": ("measured", [1.0, 4.0])}
    assert [(label, meets) for label, _s, _l, meets in reference["ranked"]] == [
        ("a", [1.0, 4.0]),
        ("b", [1.0]),
    ]


@pytest.mark.parametrize("step", STEPS)
def test_kill_at_every_step_then_resume_gives_the_uninterrupted_outcome(
    step: str, reference: dict[str, Any], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    study = _study(tmp_path)
    env = {**os.environ, "SERVELAB_HOME": str(home), "SERVELAB_TEST_CRASH_AT": step}
    killed = subprocess.run(
        [sys.executable, "-m", "servelab", "tune", str(study), "--quiet"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, f"never reached {step}: {killed.stderr[-2000:]}"
    [(uid, status)] = _db(home, "SELECT uid, status FROM studies")
    assert status == "running"  # what a kill leaves: nobody marked it

    if step == "finished":  # the server outlives its driver: status says the study was killed
        st = json.loads(servelab("status", "--json", home=home).stdout)
        [entry] = [s for s in st["studies"] if s["uid"] == uid]
        assert entry["state"] == "killed" and entry["processes"], entry
        assert any(f["what"].startswith(f"study {uid} (crash) was killed") for f in st["findings"])

    res = servelab("tune", str(study), "--resume", "--json", home=home)
    got = json.loads(res.stdout)
    assert got["study"] == uid and got["status"] == "completed"
    assert outcome(got) == reference

    # every level measured once: the completed bench runs are exactly those the ranking uses (none redone)
    measured = _db(home, "SELECT levels_json FROM study_trials WHERE status = 'measured'")
    assert len(measured) == 2  # one measured trial per candidate
    used = {lv["bench_run"] for (levels,) in measured for lv in json.loads(levels)}
    completed = {r[0] for r in _db(home, "SELECT uid FROM bench_runs WHERE status = 'completed'")}
    assert completed == used and len(used) == 4
    # the level open at the kill is interrupted, not `running` forever
    assert _db(home, "SELECT uid FROM bench_runs WHERE status = 'running'") == []
    assert _db(home, "SELECT id FROM bench_levels WHERE status = 'running'") == []
    if step.startswith("level-started"):
        assert len(_db(home, "SELECT uid FROM bench_runs WHERE status = 'interrupted'")) == 1
    if step in ("level-done", "level-started#2"):  # level 1 kept from the interrupted trial
        [(kept_from,)] = _db(home, "SELECT resumed_from FROM study_trials WHERE resumed_from IS NOT NULL")
        assert kept_from is not None
    assert _db(home, "SELECT * FROM study_leases") == []  # released at exit
    assert markers_alive(f"servelab-study:{uid}:") == []
    plan = _db(
        home, f"SELECT i.status FROM plan_items i JOIN plans p ON p.id = i.plan_id WHERE p.name = '{uid}'"
    )
    assert plan == [("completed",), ("completed",)]  # no item left in progress by the kill


def test_a_second_driver_is_refused_and_the_first_finishes_undisturbed(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    study = _study(tmp_path)
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    first = subprocess.Popen(
        [sys.executable, "-m", "servelab", "tune", str(study), "--json", "--quiet"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _server_of(home, "a"):  # a's server runs: what a careless second driver would kill
            assert time.monotonic() < deadline and first.poll() is None, _trials(home)
            time.sleep(0.05)
        # the second driver and `status` side by side, while the first runs a's trial
        cmd = [sys.executable, "-m", "servelab"]
        second = subprocess.Popen(
            [*cmd, "tune", str(study), "--resume"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        status = subprocess.Popen(
            [*cmd, "status", "--json"], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        _, second_err = second.communicate(timeout=120)
        st = json.loads(status.communicate(timeout=120)[0])
        assert first.poll() is None, "the first driver ended before the others looked: make its study longer"
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert second.returncode == 1, second_err
    assert f"is being driven by pid {first.pid} on " in second_err and "hint:" in second_err
    [entry] = st["studies"]
    assert entry["state"] == "live" and entry["owner"]["pid"] == first.pid
    assert "running (driven by pid" in st["verdict"]

    assert first.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert outcome(result) == reference
    assert result["orphans_cleaned"] == []
    # nobody measured twice: one trial per candidate, all measured
    assert sorted(_trials(home)) == [("a", "measured"), ("b", "measured")]
    assert _db(home, "SELECT * FROM study_leases") == []
    assert markers_alive(f"servelab-study:{result['study']}:") == []


# The CLI as an older servelab ran it: the same code, but unnamed candidates labelled the way it did
# (only tp and max_concurrency's value as a bare suffix, which the matrix-label change replaced).
_OLDER_SERVELAB = (
    "import sys, servelab.config.sections as c\n"
    "c.CandidateSpec.label = lambda self: self.name or f'tp{self.tp}-{self.max_concurrency}'\n"
    "from servelab.cli.main import main\n"
    "sys.argv[0] = 'servelab'\n"
    "main()\n"
)


def test_resume_of_a_study_an_older_labelling_started_is_refused_naming_the_candidate(tmp_path: Path) -> None:
    """Labels derived differently (a servelab upgrade between kill and resume) must not end in a KeyError
    with servers swept: the resume refuses before it touches anything and says what to do."""
    home = tmp_path / "home"
    study = write_study(
        tmp_path / "old.toml",
        "old",
        [{"name": "a", "baseline": True}, {"max_concurrency": 1}],
        levels=[1],
        speed=5,
    )
    env = {**os.environ, "SERVELAB_HOME": str(home), "SERVELAB_TEST_CRASH_AT": "level-started"}
    killed = subprocess.run(
        [sys.executable, "-c", _OLDER_SERVELAB, "tune", str(study), "--quiet"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = _trials(home)
    assert [label for label, _ in left] == ["a"]
    uid = _db(home, "SELECT uid FROM studies")[0][0]
    try:
        res = servelab("tune", str(study), "--resume", home=home, check=False)
        assert res.returncode == 2, res.stderr
        assert "'tp1-1'" in res.stderr and "hint:" in res.stderr and "Traceback" not in res.stderr
        # refused before touching anything: the trial as the kill left it, its server not swept
        assert _trials(home) == left
        assert markers_alive(f"servelab-study:{uid}:"), "the refusal swept the killed run's server"
    finally:
        for pid in markers_alive(f"servelab-study:{uid}:"):
            os.kill(pid, 9)
