"""servelab.host.transport against a real sshd: argv quoting, the agent, forwards, and what a dropped master
means (a lost host, never a quiet reconnect that would forget the servers the old agent held)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from tests.support.sshd import SshdHandle

from servelab.errors import HostLost
from servelab.host.transport import SshHost, SshTarget

pytestmark = pytest.mark.integration


@pytest.fixture
def host(sshd: SshdHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[SshHost]:
    for k, v in sshd.env().items():
        monkeypatch.setenv(k, v)
    h = SshHost(SshTarget.parse(sshd.alias), python=sys.executable)
    yield h
    h.close()


def test_run_passes_arguments_as_given(host: SshHost) -> None:
    tricky = ["a b", "$HOME", "'quoted'", "; echo injected", "*"]
    out = host.run([sys.executable, "-c", "import sys; print(repr(sys.argv[1:]))", *tricky])
    assert out.rc == 0 and out.stdout.strip() == repr(tricky)
    missing = host.run(["/no/such/program"])
    assert missing.rc == 127


def test_the_agent_answers_and_a_forward_reaches_the_remote_loopback(host: SshHost) -> None:
    hello = host.call("hello")
    assert hello["pid"] != os.getpid() and hello["python"] == sys.executable
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]

    def answer() -> None:
        conn, _ = srv.accept()
        conn.sendall(b"over there\n")
        conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with host.forward("127.0.0.1", port) as (h, p), socket.create_connection((h, p), timeout=5) as c:
            assert p != port and c.recv(100) == b"over there\n"
    finally:
        srv.close()
        t.join(5)


def test_a_killed_master_is_a_lost_host_until_closed(host: SshHost) -> None:
    host.call("ping")
    pid = host.master_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while host.master_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the agent's ssh (a client of the master) ends with it
    with pytest.raises(HostLost):
        host.call("ping")
    with pytest.raises(HostLost):  # still lost: no silent new agent
        host.call("ping")
    host.close()  # the caller gave up on what the old agent held: a new connection is fine
    host.call("ping")
    assert host.master_pid() not in (None, pid)
