"""A study of `workload.kind = "sessions"` against the simulator: each level is a bench run of multi-turn
conversations (bench/sessions.py) with the study's session options; the dry run refuses what the real
run refuses, with the same message, before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.test_tune_sim import servelab, write_study

pytestmark = pytest.mark.integration

SESSIONS = """kind = "sessions"
api = "chat"
turns = 3
think_time_s = 0.5
think_dist = "constant"
system_prompt_len = 128
tool_turns = 0.0
input_len = 64
output_len = 16
timeout_s = 20
"""


def _study(tmp_path: Path, name: str, workload: str, load: str = "concurrency = [2]", top: str = "") -> Path:
    path = write_study(
        tmp_path / f"{name}.toml",
        name,
        [{"name": "tp8", "tp": 8}],
        model="GLM-5-NVFP4",
        gpu="rtx-pro-6000",
        num_gpus=8,
        personality="vllm",
        speed=20,
        top=top,
    )
    text = path.read_text()
    head, _, _ = text.partition("[workload]\n")
    path.write_text(f"{head}[workload]\n{workload}[load]\n{load}\n")
    return path


def test_a_sessions_study_runs_conversations_at_its_levels(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = _study(tmp_path, "agent-sessions", SESSIONS)
    dry = servelab("tune", str(path), "--dry-run", home=home)
    assert "tp8" in dry.stdout
    servelab("tune", str(path), "--json", home=home, timeout=300)
    out = json.loads(servelab("runs", "study", "last", "--json", home=home).stdout)
    (cand,) = out["candidates"]
    (trial,) = cand["trials"]
    (level,) = trial["levels"]
    run = json.loads(servelab("runs", "show", level["bench_run"], "--json", home=home).stdout)
    assert run["config"]["workload"] == "sessions" and run["config"]["turns"] == 3
    assert run["config"]["think_dist"] == "constant" and run["config"]["system_prompt_len"] == 128
    (lv,) = run["levels"]
    ss = lv["summary"]["sessions"]
    assert ss["sessions"] == 2 and ss["sessions_completed"] == 2, ss
    assert ss["turns_completed"] == 6 and ss["turns_failed"] == 0 and ss["turns_not_sent"] == 0, ss
    # every turn resends the history: the prompts grow turn by turn
    grown = [t["mean_input_tokens"] for t in ss["per_turn"]]
    assert len(grown) == 3 and grown[0] >= 128 and grown[0] < grown[1] < grown[2], grown
    assert lv["saturation"] is None  # a closed loop: not checked


@pytest.mark.parametrize(
    "name,workload,load,top,words",
    [
        ("sized", SESSIONS + "num_requests = 8\n", "concurrency = [2]", "", "give duration_s to cap its time"),
        ("open", SESSIONS, "rate = [2.0]", "", "runs load.concurrency"),
        ("search", SESSIONS, "concurrency = [2]", 'objective = "capacity"\n[slo]\ntpot_ms = { p99 = 100 }', "does not search"),
    ],
    ids=["sized", "open-loop", "capacity"],
)  # fmt: skip
def test_the_dry_run_refuses_what_the_real_run_refuses(
    tmp_path: Path, name: str, workload: str, load: str, top: str, words: str
) -> None:
    path = _study(tmp_path, name, workload, load, top)
    dry = servelab("tune", str(path), "--dry-run", home=tmp_path / "home", check=False)
    real = servelab("tune", str(path), home=tmp_path / "home", check=False, timeout=60)
    for res in (dry, real):
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert dry.stderr == real.stderr
    listed = servelab("runs", "--json", home=tmp_path / "home")
    assert json.loads(listed.stdout) == {"studies": []}  # nothing was stored
