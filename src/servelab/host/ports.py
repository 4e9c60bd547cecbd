"""TCP ports: pick a free one, check one is free, and find every process listening on one.

Why `listeners` reads /proc instead of `psutil.net_connections`: psutil needs root to attribute other
users' sockets and then silently drops them, while /proc/net/tcp{,6} lists every listening socket of
this network namespace (with its inode) to anybody. The inode is then mapped to processes through
/proc/PID/fd, which works for our own user's processes (all processes when root). A listening socket
whose holder cannot be read (another user's process) is still reported, with `pid=None`: for the
SO_REUSEPORT guard an unknown listener is as foreign as a known one.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from servelab.jsontypes import JsonObject

_TCP_LISTEN = "0A"
_PROC = Path("/proc")
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class Listener:
    """One process holding one listening TCP socket (a socket shared by forked processes: one each)."""

    port: int
    address: str  # the local address it is bound to ("0.0.0.0", "::", "127.0.0.1", ...)
    inode: int
    pid: int | None  # None: the socket is listed, but its holder is not readable (another user's)
    fd: int | None
    cmdline: str = ""

    def to_dict(self) -> JsonObject:
        return asdict(self)

    def describe(self) -> str:
        who = f"pid {self.pid} ({self.cmdline or '?'})" if self.pid is not None else "an unreadable process"
        return f"{who} on {self.address}:{self.port}"


# Where `free_port` picks: below Linux's ephemeral range (32768-60999), which the kernel hands out for
# bind(0) and for outgoing connections, so a port picked here is not the next one a server started with
# --port 0 (or a client's connection) is given while ours is not yet bound.
PICK_RANGE = (20000, 32768)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, drawn at random from `PICK_RANGE` (callers must expect a race;
    a draw makes two pickers' collision unlikely where the kernel's bind(0) may hand a just-released port
    to the next caller). Falls back to bind(0) when no drawn port is free."""
    draw = random.SystemRandom()
    for _ in range(64):
        port = draw.randrange(*PICK_RANGE)
        if port_is_free(host, port):
            return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind `host:port` now, tested the way servers bind (SO_REUSEADDR, no
    SO_REUSEPORT), so a port held by a SO_REUSEPORT listener counts as busy."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or "0.0.0.0", port))
        except OSError:
            return False
    return True


def addresses_overlap(a: str, b: str) -> bool:
    """Two listeners on one port share traffic when their addresses are equal or either is a wildcard."""
    return a == b or a in WILDCARDS or b in WILDCARDS or {a, b} <= {"127.0.0.1", "::ffff:127.0.0.1"}


def _decode_addr(hex_addr: str) -> str:
    """/proc/net/tcp addresses are the raw in_addr bytes as host-order 32-bit words, in hex."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    text = socket.inet_ntop(socket.AF_INET6, words)
    return text


def listening_sockets(port: int, proc: Path = _PROC) -> dict[int, str]:
    """Inodes of the sockets listening on `port` in this network namespace -> their local address."""
    found: dict[int, str] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            addr, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) != port:
                continue
            inode = int(fields[9])
            if inode:
                found[inode] = _decode_addr(addr)
    return found


def socket_holders(inodes: set[int], proc: Path = _PROC) -> dict[int, list[tuple[int, int]]]:
    """inode -> [(pid, fd)] for the processes whose file descriptors we can read."""
    holders: dict[int, list[tuple[int, int]]] = {i: [] for i in inodes}
    if not inodes:
        return holders
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            try:
                target = os.readlink(entry / "fd" / fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in holders:
                    holders[inode].append((pid, int(fd)))
    return holders


def cmdline(pid: int) -> str:
    """The process's command line, space-joined ("" when gone or unreadable)."""
    with contextlib.suppress(OSError):
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
        return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return ""


def listeners(port: int, host: str | None = None) -> list[Listener]:
    """Every (process, socket) listening on `port`; with `host`, only sockets whose address overlaps it."""
    socks = listening_sockets(port)
    if host is not None:
        socks = {i: a for i, a in socks.items() if addresses_overlap(a, host)}
    out: list[Listener] = []
    for inode, holders in socket_holders(set(socks)).items():
        if not holders:
            out.append(Listener(port, socks[inode], inode, None, None))
        for pid, fd in holders:
            out.append(Listener(port, socks[inode], inode, pid, fd, cmdline(pid)))
    return sorted(out, key=lambda x: (x.pid is None, x.pid or 0, x.inode))
