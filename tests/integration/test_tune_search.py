"""Adaptive search on the simulator: the shipped examples/glm5-search.toml (72 points: layouts x MoE
backends x batch caps x prefill chunks x allreduce fusion), reduced to one load level and a 12-trial
budget. What the search learned is asserted from the stored candidates and trials: the not-applied and
collapse regions, that nothing ran inside a region once it was learned, the contenders' repeats, the
budget. `kill -9` twice mid-search (a trial just measured, then a level open) and `--resume`: nothing
measured is lost, no finished trial runs again, and the search goes on to its budget. Halving: its short
rung-0 trials and full rung-1 ones, stored apart. Real processes, the real simulator, the real store
(read, never written, by the tests)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_tune_sim import ROOT, markers_alive, servelab

pytestmark = pytest.mark.integration

BUDGET = 12


def reduced(strategy: str = "optuna", budget: int = BUDGET) -> str:
    """The shipped example with one load level, one request per stream, two contenders, a faster clock."""
    text = (ROOT / "examples" / "glm5-search.toml").read_text()
    for old, new in (
        ("concurrency = [32, 128]\nmain = 128", "concurrency = [32]"),
        ("requests_per_stream = 2", "requests_per_stream = 1"),
        ("budget_trials = 24", f"budget_trials = {budget}"),
        ("contenders = 3", "contenders = 2"),
        ('strategy = "optuna"', f'strategy = "{strategy}"'),
        ("speed = 50 ", "speed = 100 "),  # the bookkeeping is under test, not the figures
    ):
        assert old in text, f"examples/glm5-search.toml changed: {old!r} is gone; update reduced()"
        text = text.replace(old, new, 1)
    return text


def _rows(home: Path) -> list[dict[str, Any]]:
    """Every candidate of the (one) study with its search record and trials, from the store."""
    con = sqlite3.connect(home / "servelab.db", timeout=10)
    con.row_factory = sqlite3.Row
    try:
        cands = con.execute("SELECT * FROM study_candidates ORDER BY idx").fetchall()
        out = []
        for c in cands:
            trials = con.execute(
                "SELECT id, repeat, status, rung, levels_json FROM study_trials WHERE candidate_id = ? ORDER BY id",
                (c["id"],),
            ).fetchall()
            out.append(
                {
                    "idx": c["idx"],
                    "label": c["label"],
                    "status": c["status"],
                    "search": json.loads(c["search_json"]) if c["search_json"] else {},
                    "trials": [dict(t) for t in trials],
                }
            )
        return out
    finally:
        con.close()


def _point(row: dict[str, Any]) -> dict[str, Any]:
    return dict(row["search"].get("point") or {})


def assert_search_learned(rows: list[dict[str, Any]], budget: int) -> None:
    ran = [r for r in rows if r["trials"]]
    # the budget counts trials that ran to an end (a kill's interrupted one is redone, not charged)
    assert sum(t["status"] != "interrupted" for r in rows for t in r["trials"]) <= budget
    # the model's best points first: the space's first values, then what it cannot tell apart
    assert [r["search"]["origin"] for r in ran[:3]] == ["prior"] * 3
    # trtllm: the first run is not applied; every trtllm point proposed after it was pruned for that
    na = next(r for r in rows if r["status"] == "not_applied")
    assert _point(na)["moe_runner_backend"] == "flashinfer_trtllm"
    later = [
        r for r in rows if r["idx"] > na["idx"] and _point(r)["moe_runner_backend"] == "flashinfer_trtllm"
    ]
    assert later and all(r["status"] == "pruned" and not r["trials"] for r in later)
    assert {r["search"]["region"]["kind"] for r in later} <= {"not_applied", "collapsed"}
    assert any(r["search"]["region"]["where"] == "moe_runner_backend = 'flashinfer_trtllm'" for r in later)
    # fusion: once the region {fusion = true} is learned, no fusion point runs
    fusion = "enable_flashinfer_allreduce_fusion"
    first = next(
        r for r in rows if r["status"] == "pruned" and r["search"]["region"]["where"] == f"{fusion} = True"
    )
    assert all(not r["trials"] for r in rows if r["idx"] > first["idx"] and _point(r).get(fusion) is True)
    collapsed = rows[[r["label"] for r in rows].index(first["search"]["region"]["source"])]
    assert _point(collapsed)[fusion] is True and collapsed["trials"]  # measured once, collapsed
    # no finished trial twice: one measured trial per (candidate, repeat)
    for r in rows:
        reps = [t["repeat"] for t in r["trials"] if t["status"] == "measured"]
        assert len(reps) == len(set(reps)), r
    # the contenders got the study's two repeats; the others one trial each
    contenders = [r for r in rows if r["search"].get("contender")]
    assert len(contenders) == 2
    assert all(sum(t["status"] == "measured" for t in r["trials"]) == 2 for r in contenders)
    assert all(
        sum(t["status"] != "interrupted" for t in r["trials"]) <= 1
        for r in ran
        if not r["search"].get("contender")
    )


def test_search_prunes_what_failures_teach_and_reports_it(tmp_path: Path) -> None:
    """Two objectives (NSGA-II): throughput and median TPOT, the Pareto front in the report."""
    study = tmp_path / "search.toml"
    study.write_text(
        reduced().replace(
            "contenders = 2", 'contenders = 2\nobjectives = ["output_throughput", "tpot_ms_p50"]'
        )
    )
    home = tmp_path / "home"
    res = servelab("tune", str(study), "--json", home=home, timeout=900)
    out = json.loads(res.stdout)
    rows = _rows(home)
    assert_search_learned(rows, BUDGET)
    s = out["search"]
    assert s["strategy"] == "optuna" and s["seed"] == 7 and s["space_size"] == 72
    assert s["used"]["trials"] == sum(len(r["trials"]) for r in rows) <= BUDGET
    wheres = {r["where"]: r for r in s["regions"]}
    assert wheres["moe_runner_backend = 'flashinfer_trtllm'"]["kind"] == "not_applied"
    assert wheres["enable_flashinfer_allreduce_fusion = True"]["kind"] == "collapsed"
    assert sum(r["pruned"] for r in s["regions"]) == sum(r["status"] == "pruned" for r in rows)
    # the model's error per measured candidate at the main level, before and after refitting on the
    # trials before it
    measured = [c for c in s["candidates"] if c["measured_at_main"] is not None]
    assert measured and all(c["error_prior"] is not None for c in measured)
    assert sum(c["error_refit"] is not None for c in measured) >= len(measured) - 3  # after the first fits
    assert s["model_error"]["prior"]["n"] == len(measured)
    # the winner is a contender, judged against the noise (two repeats each): a verdict, or a tie
    assert out["ranking"]["winner"] in s["contenders"]
    assert out["ranking"]["significant"] is not None
    assert ("tied" in s) == (out["ranking"]["significant"] is False)
    # the Pareto front: measured candidates no other beats on both throughput and TPOT (at one level)
    front = s["pareto"]["front"]
    assert s["pareto"]["objectives"] == ["output_throughput", "tpot_ms_p50"] and front
    pairs = {}
    for c in out["candidates"]:
        lvl = (c.get("score") or {}).get("level")
        d = next((d for d in c.get("levels") or [] if d["level"] == lvl), None)
        if d is not None:
            pairs[c["label"]] = (d["output_throughput"], d["tpot_ms_p50"])
    for p in front:
        thr, tpot = pairs[p["label"]]
        assert (p["output_throughput"], p["tpot_ms_p50"]) == (thr, tpot)
        assert not any(a >= thr and b <= tpot and (a, b) != (thr, tpot) for a, b in pairs.values())
    on_front = {p["label"] for p in front}
    for label, (thr, tpot) in pairs.items():  # everything off the front is dominated by something on it
        if label not in on_front:
            assert any(a >= thr and b <= tpot for a, b in (pairs[x] for x in on_front)), label
    # the human view says the same
    text = servelab("runs", "--json", home=home).stdout
    assert out["study"] in text
    assert not markers_alive(f"servelab-study:{out['study']}:")


def test_kill_9_mid_search_then_resume_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    study = tmp_path / "search.toml"
    study.write_text(reduced())
    home = tmp_path / "home"
    env = {**os.environ, "SERVELAB_HOME": str(home)}

    def killed_at(step: str, *extra: str) -> None:
        res = subprocess.run(
            [sys.executable, "-m", "servelab", "tune", str(study), *extra],
            capture_output=True,
            text=True,
            env={**env, "SERVELAB_TEST_CRASH_AT": step},
            timeout=900,
            cwd=ROOT,
        )
        assert res.returncode == -9, res.stderr[-3000:]

    killed_at("finished#5")  # the fifth trial measured, its server still up
    before = _rows(home)
    done = {t["id"]: r["label"] for r in before for t in r["trials"] if t["status"] == "measured"}
    assert len(done) == 4  # the fifth's candidate status went with it in one transaction: measured too
    killed_at("level-started#4", "--resume")  # mid-level, four trials later
    middle = _rows(home)
    res = servelab("tune", str(study), "--resume", "--json", home=home, timeout=900)
    out = json.loads(res.stdout)
    after = _rows(home)
    trials = {t["id"]: (r["label"], t["status"]) for r in after for t in r["trials"]}
    for tid, label in done.items():  # nothing measured is lost
        assert trials[tid] == (label, "measured")
    # the candidates proposed before each kill are still the first ones, in the same order
    assert [r["label"] for r in after[: len(before)]] == [r["label"] for r in before]
    assert [r["label"] for r in after[: len(middle)]] == [r["label"] for r in middle]
    assert_search_learned(after, BUDGET)
    interrupted = [t for r in after for t in r["trials"] if t["status"] == "interrupted"]
    assert len(interrupted) == 1  # the level the second kill cut short; its trial was run again
    assert out["search"]["used"]["trials"] <= BUDGET
    assert not markers_alive(f"servelab-study:{out['study']}:")


def test_halving_keeps_its_short_and_full_trials_apart(tmp_path: Path) -> None:
    study = tmp_path / "halving.toml"
    text = reduced("halving", budget=10).replace("concurrency = [32]", "concurrency = [8, 32]\nmain = 32")
    study.write_text(text)
    home = tmp_path / "home"
    out = json.loads(servelab("tune", str(study), "--json", home=home, timeout=900).stdout)
    rows = _rows(home)
    rung0 = [t for r in rows for t in r["trials"] if not t["rung"]]
    rung1 = [(r, t) for r in rows for t in r["trials"] if t["rung"] == 1]
    assert rung0 and rung1
    for t in rung0:  # the short benchmark: the main level only
        if t["status"] == "measured":
            assert [d["level"] for d in json.loads(t["levels_json"])] == [32]
    for _r, t in rung1:  # the full levels
        if t["status"] == "measured":
            assert [d["level"] for d in json.loads(t["levels_json"])] == [8, 32]
    promoted = {r["label"] for r, _t in rung1}
    assert out["ranking"]["winner"] in promoted and out["ranking"]["winner"] in out["search"]["contenders"]
    # only candidates that reached rung 1 compete: the others are eliminated, with the reason
    for s in out["ranking"]["ranked"]:
        if s["label"] not in promoted and s["status"] == "measured":
            assert s["value"] is None and "eliminated" in s["why"]
        elif s["label"] not in out["search"]["contenders"] and s["status"] == "measured":
            assert s["value"] is None and "not a contender" in s["why"]
    assert sum(len(r["trials"]) for r in rows) <= 10
