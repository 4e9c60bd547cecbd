"""A server the agent of another host launched and watches there (servelab.agent runs `local` over there).

Its log is mirrored into a local file on every poll, and its `url` is a local port forwarded to where it
listens (it may bind the remote's loopback only). It answers the `ServerHandle` questions by asking the agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servelab.engines.base import LaunchSpec
from servelab.errors import HostLost
from servelab.host.ops import PORT_OPEN, PortOpenRequest
from servelab.host.ports import Listener
from servelab.host.shm import ShmCleanup
from servelab.host.wire import unb64
from servelab.jsontypes import JsonObject
from servelab.lifecycle import ops
from servelab.lifecycle.handle import (
    LOG_DIAGNOSE_BYTES,
    TeardownReport,
    check_marker,
    describe,
    dial_host,
    log_tail,
)

if TYPE_CHECKING:  # annotations only (the agent, above, runs `local` over there)
    from servelab.host.transport import AgentHost


@dataclass
class RemoteServer:
    """A server the agent of a remote host launched and watches there: its log is mirrored into `log_path`
    here on every poll, and `url` is a local port forwarded to where it listens."""

    spec: LaunchSpec  # as launched over there: host and port are the remote's
    host: AgentHost
    log_path: Path  # the local mirror
    remote_log: str
    run_marker: str
    remote_pid: int
    started_at: float
    started_mono: float
    local_port: int
    gpu_baseline_mib: list[int] | None = None
    teardown_report: TeardownReport | None = None
    offset: int = 0  # bytes of the remote log mirrored so far
    rc: int | None = None
    local_host: str = "127.0.0.1"  # where `local_port` is reached from here

    @property
    def pid(self) -> int:
        return self.remote_pid

    @property
    def pgid(self) -> int:
        return self.remote_pid

    @property
    def url(self) -> str:
        return f"{self.spec.scheme}://{self.local_host}:{self.local_port}"

    @property
    def remote_url(self) -> str | None:
        return self.spec.url

    @property
    def forwarded(self) -> bool:
        return True  # ssh listens on the local port before the server does

    def _mirror(self, got: ops.LogChunk) -> None:
        raw = unb64(got.log)
        if raw:
            with open(self.log_path, "ab") as f:
                f.write(raw)
        self.offset = got.offset

    def exit_code(self) -> int | None:
        """The leader's exit code over there (None while it runs); mirrors the log. Raises HostLost."""
        if self.rc is not None:
            return self.rc
        got = ops.POLL.call(self.host, ops.PollRequest(marker=self.run_marker, offset=self.offset))
        self._mirror(got)
        self.rc = got.rc
        return self.rc

    def log_text(self, max_bytes: int = LOG_DIAGNOSE_BYTES) -> str:
        """The end of the server's log (as mirrored by the last poll)."""
        return log_tail(self.log_path, max_bytes)

    def to_dict(self) -> JsonObject:
        return describe(self, self.rc, {"remote": self.host.name, "remote_log": self.remote_log})

    def record_shm(self) -> None:
        ops.RECORD_SHM.call(self.host, ops.MarkerRequest(marker=self.run_marker))

    def port_owners(self) -> tuple[list[Listener], list[Listener]]:
        got = ops.PORT_OWNERS.call(self.host, ops.MarkerRequest(marker=self.run_marker))
        return got.ours, got.foreign

    async def port_open(self, timeout_s: float) -> bool:
        """Asked over there: the forwarded local port always accepts (ssh listens)."""
        req = PortOpenRequest(host=dial_host(self.spec), port=self.spec.port)
        return await asyncio.to_thread(PORT_OPEN.call, self.host, req)

    def teardown(
        self, grace_s: float = 15.0, *, orphan_grace_s: float = 5.0, gpu_timeout_s: float = 60.0
    ) -> TeardownReport:
        """The agent's teardown over there (its own `orphan_grace_s` and GPU wait), its report brought back;
        a host that is gone gives a report that says so (not clean) instead of an error: its agent ends the
        server when the link drops."""
        self.host.close_forward(self.spec.host, self.spec.port)
        try:
            req = ops.TeardownRequest(marker=self.run_marker, grace_s=grace_s, offset=self.offset)
            got = ops.TEARDOWN.call(self.host, req, timeout=grace_s + 180)
        except HostLost as exc:
            report = TeardownReport(
                pid=self.pid,
                run_marker=self.run_marker,
                exit_code=self.rc,
                stopped_by="host lost",
                stop_s=0.0,
                shm=ShmCleanup(
                    errors=[f"{exc.message}: not checked; `tune --resume` ends what is left there"]
                ),
                port_free=False,
            )
        else:
            self._mirror(got)
            report = got.report
            self.rc = report.exit_code
        self.teardown_report = report
        return report


def launch_remote(
    host: AgentHost,
    spec: LaunchSpec,
    log_path: Path,
    run_marker: str,
    *,
    cpus: set[int] | None = None,
    check_port: bool = True,
) -> RemoteServer:
    """`local.launch` through `host`'s agent (the spec, environment and keys included, travels on the
    agent's stdin, never on a command line), then a forward to its port. `sys.executable` in the argv
    (the simulator's default interpreter) becomes the remote host's python."""
    check_marker(run_marker)
    if spec.argv and spec.argv[0] == sys.executable:
        spec = dataclasses.replace(spec, argv=[host.python, *spec.argv[1:]])
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    started_mono = time.monotonic()
    req = ops.LaunchRequest(
        spec=spec,
        log_name=log_path.name,
        marker=run_marker,
        cpus=sorted(cpus) if cpus else None,
        check_port=check_port,
    )
    got = ops.LAUNCH.call(host, req)
    server = RemoteServer(
        spec,
        host,
        log_path,
        got.log_path,
        run_marker,
        got.pid,
        got.started_at,
        started_mono,
        0,
        got.gpu_baseline_mib,
    )
    try:
        server.local_host, server.local_port = host.open_forward(spec.host, spec.port)
    except BaseException:
        server.teardown(10.0)
        raise
    return server
