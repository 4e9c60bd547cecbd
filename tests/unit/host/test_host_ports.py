"""servelab.host.ports against real sockets: our own and a child process's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from servelab.host.ports import addresses_overlap, free_port, listeners, port_is_free

LISTEN_CHILD = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(sys.argv[2]))
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("up", flush=True)
time.sleep(120)
"""


def _listener(port: int = 0, reuseport: bool = False, host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    if reuseport:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    s.listen()
    return s


@pytest.fixture
def child_listener() -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTEN_CHILD, str(port), "1"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    yield proc, port
    proc.kill()
    proc.wait()


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert port_is_free("127.0.0.1", port)
    _listener(port).close()


def test_port_with_a_listener_is_not_free_and_lists_our_pid_and_fd() -> None:
    s = _listener()
    port = s.getsockname()[1]
    try:
        assert not port_is_free("127.0.0.1", port)
        found = listeners(port)
        assert [(x.pid, x.fd) for x in found] == [(os.getpid(), s.fileno())]
        assert found[0].address == "127.0.0.1"
        assert found[0].inode > 0
        assert "pytest" in found[0].cmdline or "python" in found[0].cmdline
    finally:
        s.close()
    assert listeners(port) == []
    assert port_is_free("127.0.0.1", port)


def test_a_reuseport_listener_makes_the_port_busy_for_an_ordinary_server() -> None:
    s = _listener(reuseport=True)
    try:
        assert not port_is_free("127.0.0.1", s.getsockname()[1])
    finally:
        s.close()


def test_two_reuseport_listeners_are_two_sockets_of_two_processes(
    child_listener: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = child_listener
    mine = _listener(port, reuseport=True)  # succeeds: that is the SO_REUSEPORT trap
    try:
        found = listeners(port)
        assert {x.pid for x in found} == {proc.pid, os.getpid()}
        assert len({x.inode for x in found}) == 2
        child = next(x for x in found if x.pid == proc.pid)
        assert "-c" in child.cmdline
        assert str(proc.pid) in child.describe()
    finally:
        mine.close()


def test_host_filter_keeps_overlapping_addresses_only() -> None:
    s = _listener()
    port = s.getsockname()[1]
    try:
        assert len(listeners(port, host="127.0.0.1")) == 1
        assert len(listeners(port, host="0.0.0.0")) == 1
        assert listeners(port, host="127.0.0.2") == []
    finally:
        s.close()


def test_addresses_overlap() -> None:
    assert addresses_overlap("0.0.0.0", "127.0.0.1")
    assert addresses_overlap("127.0.0.1", "::")
    assert addresses_overlap("10.0.0.1", "10.0.0.1")
    assert not addresses_overlap("10.0.0.1", "127.0.0.1")


def test_to_dict_is_plain() -> None:
    s = _listener()
    try:
        d = listeners(s.getsockname()[1])[0].to_dict()
        assert set(d) == {"port", "address", "inode", "pid", "fd", "cmdline"}
    finally:
        s.close()
