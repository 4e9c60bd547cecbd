"""`servelab tune` with `[host] ssh`: the study's servers run on the "remote" side of a real sshd (this same
machine, reached only through OpenSSH), the benchmark reaches them through a port forward, and the faults
of a remote host happen for real: a killed SSH master mid-level, a killed control-side servelab, a wrong
host key, a refused key, no servelab over there."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_tune_sim import _db_trials as trials
from tests.integration.test_tune_sim import by_label, markers_alive, write_study
from tests.support.sshd import SshdHandle

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

GLM5 = [
    {
        "name": "tp8-cutlass",
        "tp": 8,
        "args": ["--moe-runner-backend", "flashinfer_cutlass"],
        "baseline": True,
    },
    {"name": "tp8-trtllm", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_trtllm"]},
    {
        "name": "tp8-cutlass-arfusion",
        "tp": 8,
        "args": ["--moe-runner-backend", "flashinfer_cutlass", "--enable-flashinfer-allreduce-fusion"],
    },
]


def remote_study(path: Path, name: str, target: str, candidates: list[dict[str, Any]], **kw: Any) -> Path:
    """A simulator study whose servers run on `target` (the remote python is this venv's)."""
    write_study(path, name, candidates, **kw)
    host = (
        f"[host]\nssh = {json.dumps(target)}\npython = {json.dumps(sys.executable)}\n"
        f"workdir = {json.dumps(str(path.parent / 'remote'))}\n"
    )
    path.write_text(path.read_text().replace("[host]\n", host, 1))
    return path


def run(
    *args: str, home: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SERVELAB_HOME": str(home), **env},
        timeout=timeout,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )


def study_uid(home: Path) -> str:
    con = sqlite3.connect(home / "servelab.db")
    try:
        return str(con.execute("SELECT uid FROM studies").fetchone()[0])
    finally:
        con.close()


def wait_gone(prefix: str, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    left = markers_alive(prefix)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = markers_alive(prefix)
    return left


def wait_benchmarking(proc: subprocess.Popen[bytes], home: Path, label: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (home / "servelab.db").exists() and (label, "benchmarking") in trials(home):
            time.sleep(0.5)  # into the level
            return
        assert proc.poll() is None, "the study ended before the fault"
        time.sleep(0.1)
    pytest.fail(f"never reached {label}'s benchmark: {trials(home)}")


def test_glm5_study_over_ssh_has_the_local_outcomes_and_leaves_nothing(
    tmp_path: Path, sshd: SshdHandle
) -> None:
    home = tmp_path / "home"
    study = remote_study(
        tmp_path / "glm5.toml",
        "glm5-remote",
        sshd.alias,
        GLM5,
        model="GLM-5-NVFP4",
        gpu="rtx-pro-6000",
        num_gpus=8,
        personality="sglang",
        levels=[1, 16],
        speed=50,
        extra_engine={"args": ["--disable-radix-cache"]},
    )
    res = run("tune", str(study), "--json", home=home, env=sshd.env())
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    got = by_label(out)
    assert got["tp8-trtllm"]["status"] == "not_applied"
    assert got["tp8-cutlass-arfusion"]["status"] == "anomalous"
    assert got["tp8-cutlass"]["status"] == "measured"
    assert out["ranking"]["winner"] == "tp8-cutlass"
    # Nothing of the study runs on the remote side (the same machine: one marker scan sees both).
    assert markers_alive(f"servelab-study:{out['study']}:") == []
    # The logs were mirrored back, and every run says how it reached the server.
    logs = list((home / "logs" / out["study"]).glob("*.log"))
    assert logs and all("moe_runner_backend" in p.read_text() for p in logs)
    assert (tmp_path / "remote" / "logs").is_dir()  # written over there first
    from servelab.results import RunContext

    con = sqlite3.connect(home / "servelab.db")
    contexts = [
        RunContext.model_validate_json(r[0]) for r in con.execute("SELECT context_json FROM bench_runs")
    ]
    con.close()
    assert contexts
    for c in contexts:
        assert c.path.via == "ssh-forward" and c.path.target == sshd.alias
        assert c.path.rtt_ms is not None and 0 < c.path.rtt_ms < 1000


def _master_pid(sshd: SshdHandle, env: dict[str, str]) -> int:
    control = f"ControlPath={env['SERVELAB_SSH_CONTROL_DIR']}/%C"
    out = subprocess.run(
        ["ssh", "-F", str(sshd.config_path), "-o", control, "-O", "check", sshd.alias],
        capture_output=True,
        text=True,
        timeout=10,
        stdin=subprocess.DEVNULL,
    )
    m = re.search(r"pid=(\d+)", out.stderr + out.stdout)
    assert m, out.stderr
    return int(m.group(1))


def _start(study: Path, home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "servelab", "tune", str(study), "--quiet"],
        env={**os.environ, "SERVELAB_HOME": str(home), **env},
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _two_candidates(tmp_path: Path, target: str) -> Path:
    return remote_study(
        tmp_path / "drop.toml",
        "drop",
        target,
        [{"name": "first"}, {"name": "second", "max_concurrency": 64}],
        levels=[1, 8, 16],
        speed=10,
    )


def test_a_killed_ssh_master_interrupts_the_study_and_resume_finishes_it(
    tmp_path: Path, sshd: SshdHandle
) -> None:
    home = tmp_path / "home"
    env = sshd.env()
    study = _two_candidates(tmp_path, sshd.alias)
    proc = _start(study, home, env)
    wait_benchmarking(proc, home, "first")
    os.kill(_master_pid(sshd, env), signal.SIGKILL)  # the link drops mid-level
    _, err = proc.communicate(timeout=90)
    text = err.decode()
    assert proc.returncode == 1, text[-2000:]
    assert "dropped" in text and "--resume" in text and "Traceback" not in text
    assert ("first", "interrupted") in trials(home)
    uid = study_uid(home)
    # The agent saw its stdin end and tore its server down: nothing runs over there.
    assert wait_gone(f"servelab-study:{uid}:") == []

    res = run("tune", str(study), "--resume", "--json", home=home, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["study"] == uid and out["status"] == "completed"
    assert [c["status"] for c in out["candidates"]] == ["measured", "measured"]
    assert ("first", "measured") in trials(home)
    assert markers_alive(f"servelab-study:{uid}:") == []


def test_a_killed_control_side_servelab_leaves_nothing_running_over_there(
    tmp_path: Path, sshd: SshdHandle
) -> None:
    home = tmp_path / "home"
    env = sshd.env()
    study = _two_candidates(tmp_path, sshd.alias)
    proc = _start(study, home, env)
    wait_benchmarking(proc, home, "first")
    uid = study_uid(home)
    assert markers_alive(f"servelab-study:{uid}:"), "the remote server should be running"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    # Our ssh to the agent saw its stdin close; the agent there ended the server.
    assert wait_gone(f"servelab-study:{uid}:") == []
    res = run("tune", str(study), "--resume", "--json", home=home, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["status"] == "completed"


def _fault_env(sshd: SshdHandle, config: Path) -> dict[str, str]:
    # A control directory of its own: a live master of the good config would otherwise carry the command.
    return {"SERVELAB_SSH_CONFIG": str(config), "SERVELAB_SSH_CONTROL_DIR": tempfile.mkdtemp(prefix="slf-")}


@pytest.mark.parametrize(
    "fault,words",
    [
        ("wrong_host_key", "has changed since it was recorded in known_hosts"),
        ("unknown_host", "not in known_hosts"),
        ("refused_key", "refused our key"),
        ("no_servelab", "servelab is not installed"),
        ("no_sshd", "refused the connection"),
    ],
)
def test_host_faults_are_clear_errors_before_anything_is_stored(
    fault: str, words: str, tmp_path: Path, sshd: SshdHandle
) -> None:
    home = tmp_path / "home"
    env = sshd.env()
    target = sshd.alias
    if fault == "wrong_host_key":
        env = _fault_env(sshd, sshd.config_with_wrong_host_key())
    elif fault == "unknown_host":
        env = _fault_env(sshd, sshd.config_with_unknown_host())
    elif fault == "refused_key":
        env = _fault_env(sshd, sshd.config_with_refused_key())
    elif fault == "no_sshd":
        from servelab.host.ports import free_port

        target = f"ssh://root@127.0.0.1:{free_port()}"
    study = _two_candidates(tmp_path, target)
    if fault == "no_servelab":  # an interpreter without servelab: the system's
        study.write_text(study.read_text().replace(json.dumps(sys.executable), '"/usr/bin/python3"', 1))
    t0 = time.monotonic()
    res = run("tune", str(study), home=home, env=env, timeout=60)
    assert res.returncode == 2, res.stderr
    assert words in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert time.monotonic() - t0 < 30  # never a prompt, never a hang
    # Nothing was stored: the study can simply be run again once the host is fixed.
    if (home / "servelab.db").exists():
        con = sqlite3.connect(home / "servelab.db")
        assert con.execute("SELECT count(*) FROM studies").fetchone()[0] == 0
        con.close()


def test_ctrl_c_tears_the_remote_server_down_before_servelab_exits(tmp_path: Path, sshd: SshdHandle) -> None:
    home = tmp_path / "home"
    env = sshd.env()
    study = _two_candidates(tmp_path, sshd.alias)
    proc = _start(study, home, env)
    wait_benchmarking(proc, home, "first")
    uid = study_uid(home)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert markers_alive(f"servelab-study:{uid}:") == []  # gone by the time servelab exited
    assert ("first", "interrupted") in trials(home)


def test_a_study_on_a_host_whose_loopback_is_its_own(tmp_path: Path) -> None:
    """The remote side in its own network namespace (loopback only): its servers bind 127.0.0.1 there,
    which nothing on this side can reach but the SSH forward, and the study still measures them."""
    from tests.support.sshd import sshd_server

    with sshd_server(tmp_path / "sshd-ns", netns=True) as ns:
        home = tmp_path / "home"
        study = remote_study(
            tmp_path / "ns.toml", "netns", ns.alias, [{"name": "only"}], levels=[1], speed=50
        )
        res = run("tune", str(study), "--json", home=home, env=ns.env())
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout)
        assert [c["status"] for c in out["candidates"]] == ["measured"]
        assert markers_alive(f"servelab-study:{out['study']}:") == []


def test_a_link_that_drops_while_the_server_starts_interrupts_and_resumes(
    tmp_path: Path, sshd: SshdHandle
) -> None:
    home = tmp_path / "home"
    env = sshd.env()
    # slow_start: the simulated start-up takes 50 s of GPU time, 5 s here at speed 10.
    study = remote_study(
        tmp_path / "slow.toml",
        "slow-start",
        sshd.alias,
        [{"name": "slow"}],
        levels=[1],
        speed=10,
        options={"faults": ["slow_start:50"]},
    )
    proc = _start(study, home, env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ("slow", "launching") in trials(home) and markers_alive(f"servelab-study:{study_uid(home)}:"):
            break
        assert proc.poll() is None, "the study ended before the fault"
        time.sleep(0.1)
    else:
        pytest.fail(f"the server never started: {trials(home)}")
    uid = study_uid(home)
    os.kill(_master_pid(sshd, env), signal.SIGKILL)  # mid-launch: the server is still loading
    _, err = proc.communicate(timeout=90)
    text = err.decode()
    assert proc.returncode == 1 and "dropped" in text and "Traceback" not in text, text[-2000:]
    assert ("slow", "interrupted") in trials(home)
    assert wait_gone(f"servelab-study:{uid}:") == []
    res = run("tune", str(study), "--resume", "--json", home=home, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [c["status"] for c in json.loads(res.stdout)["candidates"]] == ["measured"]
