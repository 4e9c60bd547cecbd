"""`servelab logs parse|diagnose`, run as users run it (a subprocess), on the real fixture logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab", "logs", *args], capture_output=True, text=True, timeout=60
    )


def test_parse_json() -> None:
    p = run("parse", "--engine", "vllm", str(LOGS / "vllm_cpu_startup.log"), "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert set(data) == {"effective", "evidence"}
    assert data["effective"]["max_running_requests"] == 8
    assert data["effective"]["cuda_graph"] is False
    assert "non-default args" in data["evidence"]["max_running_requests"]
    assert set(data["effective"]) == set(data["evidence"])


def test_parse_human_view_and_server_info(tmp_path: Path) -> None:
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"version": "0.5.5", "max_total_num_tokens": 7}))
    p = run("parse", "--engine", "sim", "--server-info", str(info), str(LOGS / "sim_sglang_glm5_tp8.log"))
    assert p.returncode == 0, p.stderr
    assert "moe_runner_backend" in p.stdout and "flashinfer_cutlass" in p.stdout
    assert "0.5.5" in p.stdout and "GET /get_server_info" in p.stdout


def test_diagnose_json_and_human() -> None:
    p = run("diagnose", str(LOGS / "sim_fault_nccl_shm_sglang.log"), "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["class"] == "nccl_shm" and data["fatal"] is True
    assert "/dev/shm" in data["evidence"] and "--shm-size" in data["advice"]
    assert "tail" not in data
    # a real vLLM-CPU start that came up: no failure in it (issue 14: it used to say "unknown")
    p = run("diagnose", "--engine", "vllm", str(LOGS / "vllm_cpu_startup.log"))
    assert p.returncode == 0 and "class: no_failure" in p.stdout and "startup complete" in p.stdout


def test_diagnose_unknown_has_a_tail_in_json(tmp_path: Path) -> None:
    """The same start cut before it came up: nothing known matched, and it never said it was up."""
    lines = (LOGS / "vllm_cpu_startup.log").read_text().splitlines()
    cut = next(i for i, ln in enumerate(lines) if "Application startup complete" in ln)
    partial = tmp_path / "partial.log"
    partial.write_text("\n".join(lines[:cut]) + "\n")
    data = json.loads(run("diagnose", str(partial), "--json").stdout)
    assert data["class"] == "unknown" and data["tail"]


def test_errors_exit_2_with_hints(tmp_path: Path) -> None:
    p = run("parse", "--engine", "tensorrt", str(LOGS / "vllm_cpu_startup.log"))
    assert p.returncode == 2 and "unknown engine 'tensorrt'" in p.stderr and "vllm" in p.stderr
    assert "Traceback" not in p.stderr
    p = run("diagnose", str(tmp_path / "missing.log"), "--json")
    assert p.returncode == 2 and json.loads(p.stdout)["error"] == "NotFoundError"
    p = run("diagnose", "--engine", "nope", str(LOGS / "vllm_cpu_startup.log"))
    assert p.returncode == 2 and "known engines:" in p.stderr
    bad = tmp_path / "info.json"
    bad.write_text("[1, 2]")
    p = run("parse", "--engine", "sglang", "--server-info", str(bad), str(LOGS / "sglang_qwq32b_tp4_l4.log"))
    assert p.returncode == 2 and "not an object" in p.stderr
