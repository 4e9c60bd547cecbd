"""`servelab deploy --install --host` and `servelab preflight --host` through the session's real sshd.

The "remote" is this machine reached over SSH: its sessions get a stand-in systemctl
(`$SERVELAB_SYSTEMCTL`, tests/support/fake_systemctl.py) and a unit directory (`$SERVELAB_UNIT_DIR`) from the
sshd's SetEnv, which is where the unit must land; the check runs here, through a port forward."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from tests.support.sshd import SshdHandle
from tests.unit.deploy.stored import DIGEST, store_study

from servelab.cli.deploy import deploy_cmd, preflight_cmd
from servelab.host import processes
from servelab.host.ports import free_port
from servelab.lifecycle.serving import sweep_orphans

# Run apart from the other deploy module, on one worker: both install units on this machine (test_deploy
# through a fake systemctl, test_deploy_remote through a real sshd on 127.0.0.1), and a unit's preflight
# refuses to start while any process of another live unit holds its port: side by side, one found the
# other's server in its way (twice, in clean-clone runs).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("deploy")]


@pytest.fixture
def remote(sshd: SshdHandle, monkeypatch: pytest.MonkeyPatch) -> SshdHandle:
    for k, v in sshd.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SERVELAB_REMOTE_PYTHON", sys.executable)
    return sshd


def _ssh(sshd: SshdHandle, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sshd.ssh(command), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )


def test_install_on_a_remote_host(remote: SshdHandle, tmp_path: Path) -> None:
    from servelab.deploy.records import DeploymentRepo, installed_units
    from servelab.store import open_store
    from servelab.store.bench import BenchRepo

    units = Path(remote.set_env["SERVELAB_UNIT_DIR"])
    name = f"rdep-{uuid.uuid4().hex[:8]}"
    marker = f"servelab-deploy:{name}"
    secret = f"hf_{uuid.uuid4().hex}"
    env_file = tmp_path / "llm.env"
    env_file.write_text(f"HF_TOKEN={secret}\n")
    env_file.chmod(0o644)  # the remote side writes it again, 0600
    tuned = {**DIGEST, "output_throughput": 1.0, "tpot_ms_p50": None, "ttft_ms_p50": None}
    with open_store() as store:
        ids = store_study(store, "sim", env={"HF_TOKEN": secret}, port=free_port(), digest=tuned)
    out = tmp_path / "out"
    try:
        res = CliRunner().invoke(
            deploy_cmd,
            [
                f"{ids['uid']}:tp1",
                "--name",
                name,
                "--install",
                "--host",
                remote.alias,
                "--env-file",
                str(env_file),
                "--json",
                "--out",
                str(out),
            ],
        )
        assert res.exit_code == 0, (res.output, res.exception)
        d = json.loads(res.output)
        # the unit in the remote's unit directory, exactly the file written and verified here
        unit = units / f"{name}.service"
        text = unit.read_text()
        assert text == (out / f"{name}.service").read_text() and oct(unit.stat().st_mode & 0o777) == "0o644"
        assert f"ExecStartPre={sys.executable} -m servelab preflight --address" in text
        assert f"EnvironmentFile={env_file}" in text and secret not in text
        assert (
            oct(env_file.stat().st_mode & 0o777) == "0o600" and env_file.read_text() == f"HF_TOKEN={secret}\n"
        )
        ins = d["install"]
        assert d["host"] == ins["host"] == remote.alias and ins["unit"] == str(unit)
        assert ins["check"]["ok"] is True and ins["check"]["level"] == 4.0, ins["check"]
        assert ins["status"]["state"] == "active" and secret not in res.output
        # the server the stand-in started runs with the EnvironmentFile's secret, and the run's marker
        (main,) = [p for p in processes.with_marker(value=marker) if p.pid == int(ins["status"]["main_pid"])]
        assert f"HF_TOKEN={secret}".encode() in Path(f"/proc/{main.pid}/environ").read_bytes()
        # the check was measured here, through the forward: a local port other than the unit's
        with open_store() as store:
            (rec,) = DeploymentRepo(store).list(installed_only=True)
            (shown,) = installed_units(store)
            bench = BenchRepo(store).load(str(rec["check"]["bench_run_id"]))
        assert urlsplit(bench.url).port != urlsplit(d["url"]).port
        assert rec["status"] == "ready" and rec["spec"]["host"] == remote.alias
        assert rec["check"]["measured"]["completed"] > 0 and rec["check"]["verify"]["ok"] is True
        assert shown["host"] == remote.alias and shown["unit"]["state"] == f"unknown (on {remote.alias})"
    finally:
        stop = _ssh(remote, f'"$SERVELAB_SYSTEMCTL" stop {shlex.quote(name)}.service')
        sweep_orphans(marker, grace_s=2.0)
        (units / f"{name}.service").unlink(missing_ok=True)
    assert stop.returncode == 0, stop.stderr
    assert processes.with_marker(value=marker) == []


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_preflight_on_a_remote_host_ends_a_marked_leftover(remote: SshdHandle) -> None:
    port = free_port()
    marker = f"test-preflight-remote-{uuid.uuid4().hex[:8]}/0"
    seg = Path(f"/dev/shm/nccl-slpf-{uuid.uuid4().hex[:8]}")
    # a leftover server on the remote: started there, in a session of its own, outliving its ssh
    sim = [sys.executable, "-m", "servelab", "sim", "--model", "Qwen3-30B-A3B", "--gpu", "h100-sxm"]
    sim += ["--port", str(port), "--speed", "50", "--cpu", "0", "--fast-start"]
    started = _ssh(
        remote,
        shlex.join(["env", f"SERVELAB_RUN={marker}", "SPT_NOENV=1", "setsid", "-f", *sim])
        + " </dev/null >/dev/null 2>&1",
    )
    try:
        assert started.returncode == 0, started.stderr
        end = time.monotonic() + 30
        while not _port_open(port) and time.monotonic() < end:
            time.sleep(0.05)
        assert _port_open(port), "the leftover simulator did not start"
        (left,) = processes.with_marker(value=marker)
        seg.write_bytes(b"\0" * 64)  # a segment nobody holds (young: only --kill-stale removes it)
        args = ["--host", remote.alias, "--port", str(port), "--gpus", "none", "--json"]
        res = CliRunner().invoke(preflight_cmd, args)
        assert res.exit_code == 1, (res.output, res.exception)
        d = json.loads(res.output)
        (holder,) = d["holders"]
        assert d["on"] == remote.alias and (holder["pid"], holder["marker"]) == (left.pid, marker)
        assert holder["verdict"] == "stale" and "--kill-stale" in d["refusals"][0] and seg.exists()
        res = CliRunner().invoke(preflight_cmd, [*args, "--kill-stale"])
        assert res.exit_code == 0, (res.output, res.exception)
        d = json.loads(res.output)
        assert [k["pid"] for k in d["killed"]] == [left.pid] and d["refusals"] == []
        assert seg.name in d["shm_removed"] and not seg.exists()
        assert processes.with_marker(value=marker) == []
    finally:
        sweep_orphans(marker, grace_s=2.0)
        seg.unlink(missing_ok=True)
        if os.path.exists(seg):
            raise AssertionError(f"{seg} left behind")
