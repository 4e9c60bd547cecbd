"""The real sshd of tests/support/sshd.py does what the remote-host tests rely on: the client config reaches
it by alias and by address, each fault config fails the way OpenSSH fails (exit 255, a known message, never
a prompt), it can go away and come back on the same port, and a ControlMaster dies with the host."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.sshd import HOST, SshdHandle, sshd_server

TIMEOUT_S = 15


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """stdin from /dev/null and a timeout: a prompt would fail the test instead of hanging it."""
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S)


def mux_opts(control_dir: Path) -> tuple[str, ...]:
    return ("-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C", "-o", "ControlPersist=30")


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


@pytest.fixture
def running_sshd(sshd: SshdHandle) -> Iterator[SshdHandle]:
    """The session's sshd, running again after the test whatever the test did to it, masters ended."""
    try:
        yield sshd
    finally:
        sshd.end_masters()
        sshd.start()


def test_alias_address_and_url_reach_the_server(sshd: SshdHandle) -> None:
    cfg = str(sshd.config_path)
    for target in (
        ["gpubox"],
        ["-p", str(sshd.port), f"{sshd.user}@{HOST}"],
        [sshd.url],
    ):
        r = run(["ssh", "-F", cfg, *target, "echo", "hi"])
        assert (r.returncode, r.stdout) == (0, "hi\n"), (target, r.stderr)
    assert sshd.env()["SERVELAB_SSH_CONFIG"] == cfg
    assert len(sshd.env()["SERVELAB_SSH_CONTROL_DIR"]) < 40  # room for /%C under the ~104-byte socket limit


def test_wrong_host_key_fails_without_a_prompt(sshd: SshdHandle) -> None:
    r = run(sshd.ssh("true", config=sshd.config_with_wrong_host_key()))
    assert r.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr
    assert "Host key verification failed" in r.stderr


def test_unknown_host_fails_without_a_prompt(sshd: SshdHandle) -> None:
    r = run(sshd.ssh("true", config=sshd.config_with_unknown_host()))
    assert r.returncode == 255
    assert "No ED25519 host key is known" in r.stderr
    assert "Host key verification failed" in r.stderr


def test_refused_key_is_denied(sshd: SshdHandle) -> None:
    r = run(sshd.ssh("true", config=sshd.config_with_refused_key()))
    assert r.returncode == 255
    assert "Permission denied (publickey)" in r.stderr


def test_host_goes_away_and_comes_back_on_the_same_port(running_sshd: SshdHandle) -> None:
    sshd = running_sshd
    port, old_pid = sshd.port, sshd.pid
    sshd.stop(kill_sessions=True)
    assert not sshd.alive()
    r = run(sshd.ssh("true"))
    assert r.returncode == 255
    assert "Connection refused" in r.stderr
    sshd.start()
    assert sshd.alive()
    assert (sshd.port, sshd.pid != old_pid) == (port, True)
    r = run(sshd.ssh("echo", "back"))
    assert (r.returncode, r.stdout) == (0, "back\n"), r.stderr


def test_master_dies_with_the_host(running_sshd: SshdHandle) -> None:
    sshd = running_sshd
    mux = mux_opts(sshd.control_dir)
    r = run(sshd.ssh("true", opts=mux))
    assert r.returncode == 0, r.stderr
    check = sshd.ssh(opts=(*mux, "-O", "check"))
    r = run(check)
    assert r.returncode == 0 and "Master running" in r.stderr, r.stderr
    sshd.stop(kill_sessions=True)
    assert wait_until(lambda: run(check).returncode != 0), "the master outlived the host"


def test_master_survives_a_listener_restart(running_sshd: SshdHandle) -> None:
    """sshd's per-connection children keep established connections: a master still runs commands while no
    new connection can be made, as on a host whose sshd is restarted."""
    sshd = running_sshd
    mux = mux_opts(sshd.control_dir)
    assert run(sshd.ssh("true", opts=mux)).returncode == 0
    sshd.stop()
    r = run(sshd.ssh("echo", "via-master", opts=mux))
    assert (r.returncode, r.stdout) == (0, "via-master\n"), r.stderr
    assert run(sshd.ssh("true", opts=("-o", "ControlPath=none"))).returncode == 255


_NETNS_SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("READY", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"inside the namespace\\n")
    c.close()
"""


def test_netns_port_is_reached_only_through_a_forward(tmp_path: Path) -> None:
    """sshd in its own network namespace: the 'remote' 127.0.0.1 is not the host's, only ssh -L reaches it."""
    with sshd_server(tmp_path / "sshd-netns", netns=True) as sshd:
        assert sshd.netns is not None
        remote_port, local_port = _free_port(), _free_port()
        server = subprocess.Popen(
            ["ip", "netns", "exec", sshd.netns, sys.executable, "-c", _NETNS_SERVER, str(remote_port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        forward = None
        try:
            assert server.stdout is not None and server.stdout.readline() == "READY\n"
            with socket.socket() as s:
                assert s.connect_ex((HOST, remote_port)) != 0  # not on the host's loopback
            forward = subprocess.Popen(
                sshd.ssh(
                    opts=("-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{local_port}:{HOST}:{remote_port}")
                ),
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            assert wait_until(lambda: _read(local_port) == b"inside the namespace\n")
        finally:
            for proc in (forward, server):
                if proc is not None:
                    proc.kill()
                    proc.wait(timeout=5)
                    for stream in (proc.stdout, proc.stderr):
                        if stream is not None:
                            stream.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _read(port: int) -> bytes | None:
    try:
        with socket.create_connection((HOST, port), timeout=2) as s:
            return s.recv(100)
    except OSError:
        return None
