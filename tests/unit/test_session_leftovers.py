"""The session-end check (tests/support/leftovers.py): a process a test leaves running fails the run, and is
stopped; a run that leaves nothing passes. Checked on an inner pytest run, for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

LEAVES_ONE = """
import os, subprocess, sys

def test_starts_a_server_and_forgets_it():
    env = {**os.environ, "SERVELAB_RUN": "test-leftovers/forgotten"}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True)
    open(os.environ["PID_FILE"], "w").write(str(p.pid))
"""

CLEAN = """
import subprocess, sys
from multiprocessing import shared_memory


def test_uses_shared_memory_in_process():  # starts multiprocessing's resource tracker: not a leftover
    m = shared_memory.SharedMemory(create=True, size=16)
    m.close()
    m.unlink()


def test_starts_and_stops():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    p.kill()
    p.wait()
"""


def _inner(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PID_FILE": str(tmp_path / "pid")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.support.leftovers"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_process_left_running_fails_the_run_and_is_stopped(tmp_path: Path) -> None:
    res = _inner(tmp_path, LEAVES_ONE)
    out = res.stdout + res.stderr
    pid = int((tmp_path / "pid").read_text())
    assert res.returncode == 1, out  # its only test passed: the leftover alone fails it
    assert "1 passed" in out and "still running at its end" in out, out
    assert f"pid {pid} " in out and "SERVELAB_RUN=test-leftovers/forgotten" in out, out
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_run_that_leaves_nothing_passes(tmp_path: Path) -> None:
    res = _inner(tmp_path, CLEAN)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "still running" not in res.stdout
