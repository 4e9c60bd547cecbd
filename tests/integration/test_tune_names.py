"""A real study on the simulator whose candidate labels carry `=`, `/` and `?` (issue 15, items 2 and 8):
it finishes, every candidate is measured, each trial ran under its own marker and wrote its own log."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from tests.integration.test_tune_sim import by_label, markers_alive, servelab, write_study

from servelab.naming import STUDY_MARKER_PREFIX as MARKER_PREFIX

pytestmark = pytest.mark.integration


def test_a_study_with_nasty_labels_finishes_with_one_log_per_candidate(tmp_path: Path) -> None:
    study = write_study(
        tmp_path / "names.toml",
        "names",
        [
            {"tp": 8, "env": {"NCCL_P2P_DISABLE": "1"}},  # labelled tp8-NCCL_P2P_DISABLE=1
            {"name": "a/b", "tp": 1, "baseline": True},  # tp8 beats it: no collapse flagged
            {"name": "a_b", "tp": 1},
            {"name": "a?b", "tp": 1},
        ],
        num_gpus=8,
        levels=[1],
    )
    home = tmp_path / "home"
    dry = json.loads(servelab("tune", str(study), "--dry-run", "--json", home=home).stdout)
    labels = {"tp8-NCCL_P2P_DISABLE=1", "a/b", "a_b", "a?b"}
    assert {c["label"] for c in dry["candidates"]} == labels
    out = json.loads(servelab("tune", str(study), "--json", home=home, timeout=600).stdout)
    assert out["status"] == "completed"
    cands = by_label(out)
    assert set(cands) == labels
    # every candidate measured (an anomaly verdict against the baseline is not what this test is about:
    # a loaded box once flagged one; tests/integration/test_tune_sim.py tests the verdicts)
    assert {c["status"] for c in cands.values()} <= {"measured", "anomalous"}, {
        k: v["status"] for k, v in cands.items()
    }
    with sqlite3.connect(home / "servelab.db") as db:
        rows = db.execute(
            "SELECT c.label, t.marker, t.log_path FROM study_trials t"
            " JOIN study_candidates c ON c.id = t.candidate_id"
        ).fetchall()
    assert {r[0] for r in rows} == labels and len(rows) == 4
    assert len({r[1] for r in rows}) == 4 and all("=" not in r[1] for r in rows)
    logs = [Path(r[2]) for r in rows]
    assert len(set(logs)) == 4
    texts = [p.read_text() for p in logs]
    assert all(texts) and len(set(texts)) == 4  # nothing truncated another candidate's log
    assert markers_alive(f"{MARKER_PREFIX}:{out['study']}:") == []
