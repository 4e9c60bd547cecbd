"""Bridge stdin/stdout to a TCP address: the ssh ``ProxyCommand`` that reaches an sshd inside a network
namespace (``ip netns exec NAME python tcpbridge.py 127.0.0.1 PORT``); socat and nc are not installed
on the test machines, and this file needs nothing but the standard library.

Exits when the server closes its side (stdin EOF only half-closes the connection, as ``nc -N`` does).
"""

from __future__ import annotations

import os
import selectors
import socket
import sys

_CHUNK = 65536


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def bridge(host: str, port: int) -> int:
    try:
        sock = socket.create_connection((host, port), timeout=5.0)
    except OSError as exc:
        print(f"tcpbridge: {host}:{port}: {exc}", file=sys.stderr)
        return 1
    sock.settimeout(None)
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, "stdin")
    sel.register(sock, selectors.EVENT_READ, "sock")
    with sock:
        while True:
            for key, _ in sel.select():
                if key.data == "stdin":
                    data = os.read(0, _CHUNK)
                    if not data:
                        sel.unregister(0)
                        sock.shutdown(socket.SHUT_WR)
                        continue
                    sock.sendall(data)
                else:
                    data = sock.recv(_CHUNK)
                    if not data:
                        return 0
                    _write_all(1, data)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: tcpbridge.py HOST PORT")
    sys.exit(bridge(sys.argv[1], int(sys.argv[2])))
