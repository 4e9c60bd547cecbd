"""`servelab verify-output` option errors: exit 2 with a hint before any request; unreachable: exit 1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab", "verify-output", *args], capture_output=True, text=True, timeout=60
    )


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_unknown_reference(tmp_path: Path) -> None:
    p = run("--url", dead_url(), "--model", "m", "--reference", "gpt4")
    assert p.returncode == 2 and "unknown reference 'gpt4'" in p.stderr and "hf:PATH" in p.stderr
    assert "Traceback" not in p.stderr


def test_hf_reference_must_be_a_model_dir(tmp_path: Path) -> None:
    p = run("--url", dead_url(), "--model", "m", "--reference", f"hf:{tmp_path}", "--json")
    assert p.returncode == 2
    err = json.loads(p.stdout)
    assert err["error"] == "ConfigError" and "no config.json" in err["message"]


def test_missing_reference_python(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    p = run(
        "--url",
        dead_url(),
        "--model",
        "m",
        "--reference",
        f"hf:{tmp_path}",
        "--reference-python",
        str(tmp_path / "python"),
    )
    assert p.returncode == 2 and "does not exist" in p.stderr and "hint:" in p.stderr


def test_bad_known_answers_file() -> None:
    p = run("--url", dead_url(), "--model", "m", "--known-answers", "/nonexistent.toml")
    assert p.returncode == 2 and "neither" in p.stderr


def test_unreachable_server_exits_1() -> None:
    p = run("--url", dead_url(), "--model", "m", "--known-answers", "none")
    assert p.returncode == 1 and "cannot reach" in p.stderr and "hint:" in p.stderr
