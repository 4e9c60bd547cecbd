"""The one server handle: what readiness, a benchmark, a study and teardown need of a launched server.

Two kinds implement it: `local.Server` (a process tree on this machine) and `remote.RemoteServer` (one the
agent of another host runs). Each answers for itself (its log, whether it lives, who holds its port, its
teardown), so no caller asks which kind it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from servelab.engines.base import LaunchSpec
from servelab.errors import ConfigError
from servelab.host.gpu_memory import GpuMemoryReport
from servelab.host.ports import WILDCARDS, Listener
from servelab.host.processes import KilledProcess, ProcInfo
from servelab.host.shm import ShmCleanup
from servelab.jsontypes import JsonObject
from servelab.redact import redact_argv

LOG_DIAGNOSE_BYTES = 512 * 1024  # how much of the log's end a diagnosis reads


@dataclass
class TeardownReport:
    """What stopping a server took, and the proof that nothing of it is left."""

    pid: int
    run_marker: str
    exit_code: int | None
    stopped_by: str  # "already exited", "SIGTERM", "SIGKILL"
    stop_s: float
    orphans: list[KilledProcess] = field(default_factory=list)  # survivors of the group kill we killed
    survivors: list[ProcInfo] = field(default_factory=list)  # still alive at the end: should be empty
    shm: ShmCleanup = field(default_factory=ShmCleanup)
    gpu: GpuMemoryReport = field(default_factory=lambda: GpuMemoryReport("no GPUs"))
    port_free: bool = True
    duration_s: float = 0.0

    @property
    def clean(self) -> bool:
        """No process, listening port, held segment or GPU memory of this run is left."""
        return not self.survivors and self.port_free and self.gpu.ok and not self.shm.errors

    def to_dict(self) -> JsonObject:
        return {
            "pid": self.pid,
            "run_marker": self.run_marker,
            "exit_code": self.exit_code,
            "stopped_by": self.stopped_by,
            "stop_s": round(self.stop_s, 3),
            "orphans": [o.to_dict() for o in self.orphans],
            "survivors": [s.to_dict() for s in self.survivors],
            "shm": self.shm.to_dict(),
            "gpu": self.gpu.to_dict(),
            "port_free": self.port_free,
            "duration_s": round(self.duration_s, 3),
            "clean": self.clean,
        }


class ServerHandle(Protocol):
    """A server servelab launched, wherever it runs. `log_path` is a file here (for a remote server, the
    mirror its polls fill); `url` is how it is reached from here."""

    spec: LaunchSpec  # as launched: host and port are those of the machine it runs on
    log_path: Path
    run_marker: str
    started_at: float  # wall clock, for the store
    started_mono: float  # monotonic, for durations
    gpu_baseline_mib: list[int] | None
    teardown_report: TeardownReport | None

    @property
    def pid(self) -> int: ...
    @property
    def pgid(self) -> int: ...
    @property
    def url(self) -> str: ...
    @property
    def remote_url(self) -> str | None:
        """Its URL on the host it runs on when that is not this machine (a benchmark may run there)."""
        ...

    @property
    def forwarded(self) -> bool:
        """`url` is a forward that accepts before the server does: ask for its port before any HTTP."""
        ...

    def exit_code(self) -> int | None:
        """The leader's exit code (negative: killed by that signal), None while it runs."""
        ...

    def log_text(self, max_bytes: int = LOG_DIAGNOSE_BYTES) -> str:
        """The end of the server's log."""
        ...

    def to_dict(self) -> JsonObject:
        """As the store and `--json` show it."""
        ...

    def record_shm(self) -> None:
        """Note the /dev/shm segments its live processes hold (the only ones teardown may remove)."""
        ...

    def port_owners(self) -> tuple[list[Listener], list[Listener]]:
        """(ours, foreign): the sockets listening on its port, split by whether this run holds them."""
        ...

    async def port_open(self, timeout_s: float) -> bool:
        """Whether its port accepts a connection where it runs."""
        ...

    def teardown(
        self, grace_s: float = 15.0, *, orphan_grace_s: float = 5.0, gpu_timeout_s: float = 60.0
    ) -> TeardownReport:
        """Stop its whole process tree and prove nothing of it is left; the report also lands on
        `teardown_report`. Idempotent."""
        ...


def check_marker(marker: str) -> None:
    """A marker travels in the environment (`SERVELAB_RUN=...`): no NUL, newline or `=`."""
    if not marker or "\0" in marker or "=" in marker or "\n" in marker:
        raise ConfigError(
            f"invalid run marker {marker!r}",
            hint="use a non-empty id without '=', NUL or newlines, e.g. 'study-7/cand-3/try-1'",
        )


def log_tail(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def describe(server: ServerHandle, exit_code: int | None, extra: JsonObject) -> JsonObject:
    """A launched server as the store and `--json` show it (env: names only, values may be secrets)."""
    return {
        "pid": server.pid,
        "pgid": server.pgid,
        "url": server.url,
        "host": server.spec.host,
        "port": server.spec.port,
        **extra,
        "served_model": server.spec.served_model,
        "command": shlex.join(redact_argv(server.spec.argv)),
        "env": list(sorted(server.spec.env)),
        "log_path": str(server.log_path),
        "run_marker": server.run_marker,
        "started_at": server.started_at,
        "exit_code": exit_code,
        "gpu_baseline_mib": None if server.gpu_baseline_mib is None else list(server.gpu_baseline_mib),
    }


def dial_host(spec: LaunchSpec) -> str:
    """The address to reach a server at on its own machine (a wildcard bind is reached on loopback)."""
    return "127.0.0.1" if spec.host in WILDCARDS else spec.host


async def connects(host: str, port: int, timeout_s: float) -> bool:
    """Whether `host:port` accepts a TCP connection from here within `timeout_s`."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
