"""`servelab status|doctor|wait-ready --host` against the session's real sshd: what the host side reads is
read over there by the agent (one call), the simulator bound to the "remote" loopback is probed through a
port forward, and the faults (no sshd, no servelab for that python) exit 2 with a message, no traceback.

The "remote" is this machine reached over SSH; its python is this venv's (the remote PATH has no servelab).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.simruns import SimProcess, start_sim
from tests.support.sshd import SshdHandle

pytestmark = pytest.mark.integration

MODEL = "Qwen3-30B-A3B"
SIM_ARGS = ("--model", MODEL, "--gpu", "h100-sxm", "--num-gpus", "2", "--tp", "2")
NO_SERVELAB_PYTHON = "/usr/bin/python3"  # the system python: servelab is installed in the venv only


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    proc = start_sim(tmp_path_factory.mktemp("sim"), *SIM_ARGS, speed=50.0)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def leftover() -> Iterator[subprocess.Popen[bytes]]:
    """A process of a finished study: it carries a servelab marker that no store of this test knows."""
    marker = "servelab-study:deadbeef0001:3"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, "SERVELAB_RUN": marker},
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def servelab(
    sshd: SshdHandle, home: Path, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **sshd.env(), "SERVELAB_HOME": str(home)}
    env.pop("SERVELAB_HOST", None)
    env.pop("SERVELAB_REMOTE_PYTHON", None)
    return subprocess.run(
        [sys.executable, "-m", "servelab", *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def test_status_host_observes_the_remote(
    sshd: SshdHandle, sim: SimProcess, leftover: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    r = servelab(
        sshd,
        tmp_path,
        "status",
        "--host",
        sshd.url,
        "--remote-python",
        sys.executable,
        "--url",
        sim.url,
        "--json",
    )
    assert r.returncode == 0, r.stderr
    obs = json.loads(r.stdout)
    assert obs["host"] == {"target": sshd.url, "hostname": socket.gethostname(), "via": "ssh"}
    (server,) = obs["servers"]
    assert server["url"] == sim.url  # reported as the remote sees it, probed through a forward
    assert server["up"] and server["engine"] == "sim" and server["models"] == [MODEL]
    assert obs["gpus"]["available"] and obs["gpus"]["source"] == f"sim:{sim.url}"
    assert len(obs["gpus"]["gpus"]) == 2
    marked = {p["pid"]: p for p in obs["leftovers"]["marked_processes"]}
    assert leftover.pid in marked, marked
    assert marked[leftover.pid]["belongs_to"] == "other servelab run"
    # the listener on the simulator's port, found on the remote
    assert any(p["port"] == sim.port for p in obs["leftovers"]["ports"])


def test_status_host_reads_the_log_over_there(sshd: SshdHandle, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO:     Shutting down\nINFO:     Application shutdown complete.\n")
    r = servelab(
        sshd,
        tmp_path,
        "status",
        "--host",
        "gpubox",
        "--remote-python",
        sys.executable,
        "--log",
        str(log),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    obs = json.loads(r.stdout)
    assert obs["host"]["via"] == "ssh" and obs["host"]["target"] == "gpubox"
    assert obs["log"]["available"] and obs["log"]["clean_shutdown"]
    assert obs["servers"] == []
    if shutil.which("nvidia-smi") is None:  # this box is the remote: no nvidia-smi there either
        assert not obs["gpus"]["available"]
        assert "nvidia-smi is not installed" in obs["gpus"]["note"]
        assert any(f["what"] == "no GPUs on this host" for f in obs["findings"])


def test_doctor_host_returns_its_checks(sshd: SshdHandle, tmp_path: Path) -> None:
    r = servelab(sshd, tmp_path, "doctor", "--host", sshd.url, "--remote-python", sys.executable, "--json")
    assert r.returncode in (0, 1), r.stderr  # 1: a check of this machine failed (reported, not an error)
    rep = json.loads(r.stdout)
    assert rep["host"] == {"target": sshd.url, "hostname": socket.gethostname(), "via": "ssh"}
    names = {c["name"] for c in rep["checks"]}
    assert {"/dev/shm size", "open-file limit", "GPU P2P"} <= names
    assert rep["worst"] in ("ok", "warn", "fail")


def test_wait_ready_host_probes_through_a_forward(sshd: SshdHandle, sim: SimProcess, tmp_path: Path) -> None:
    r = servelab(
        sshd,
        tmp_path,
        "wait-ready",
        sim.url,
        "--model",
        MODEL,
        "--host",
        sshd.url,
        "--timeout",
        "30",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["url"] == sim.url and rep["served_model"] == MODEL


def test_bad_target_exits_2_with_a_message(sshd: SshdHandle, tmp_path: Path) -> None:
    r = servelab(sshd, tmp_path, "status", "--host", "ssh://nobody@127.0.0.1:1", "--json")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "cannot connect to ssh://nobody@127.0.0.1:1" in r.stderr
    assert "Traceback" not in r.stderr
    assert json.loads(r.stdout)["error"] == "HostUnusable"  # --json: the error as JSON on stdout


def test_remote_python_without_servelab_exits_2(sshd: SshdHandle, tmp_path: Path) -> None:
    probe = subprocess.run([NO_SERVELAB_PYTHON, "-c", "import servelab"], capture_output=True, timeout=30)
    assert probe.returncode != 0, f"{NO_SERVELAB_PYTHON} has servelab: this test needs one that lacks it"
    r = servelab(
        sshd, tmp_path, "status", "--host", sshd.url, "--remote-python", NO_SERVELAB_PYTHON, "--json"
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "servelab is not installed" in r.stderr
    assert "Traceback" not in r.stderr
