"""The agent's own operations: who it is, and a server's life on this host (launch, poll, teardown, sweep,
the /dev/shm ledger, ports, GPU memory, reading a file). Each is the function servelab runs on a local host
(lifecycle, processes, shm, ports), so the remote side is the same code path as the local one."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from servelab import __version__
from servelab.agent import registry
from servelab.agent.registry import READ_MAX, AgentState, Op
from servelab.errors import ConfigError, NotFoundError
from servelab.host import ops as h
from servelab.host.agent_op import NoArgs
from servelab.host.processes import KilledProcess
from servelab.host.shm import ShmCleanup
from servelab.host.wire import PROTOCOL, b64
from servelab.lifecycle import ops as lc


def _server(state: AgentState, marker: str) -> Any:
    try:
        return state.servers[marker]
    except KeyError:
        raise NotFoundError(
            f"no server launched by this agent carries the marker {marker!r}",
            hint="it was torn down already, or launched by another agent (a dropped connection's)",
        ) from None


def _read(path: Path, offset: int, max_bytes: int) -> tuple[bytes, int]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(max_bytes)
    except OSError:
        return b"", offset
    return data, offset + len(data)


def op_hello(state: AgentState, req: h.HelloRequest) -> h.Hello:
    if req.workdir:
        state.workdir = Path(req.workdir).expanduser()
    return h.Hello(
        version=__version__,
        protocol=PROTOCOL,
        hostname=socket.gethostname(),
        python=sys.executable,
        pid=os.getpid(),
        uid=os.getuid(),
        workdir=str(registry.workdir(state)),
    )


def op_ping(state: AgentState, req: NoArgs) -> None:
    """Nothing: its round trip is the SSH path's (the bench records it with every run)."""


def op_launch(state: AgentState, req: lc.LaunchRequest) -> lc.Launched:
    from servelab.lifecycle import local

    if req.marker in state.servers:
        raise ConfigError(f"a server marked {req.marker!r} already runs", hint="tear it down first")
    name = Path(req.log_name).name
    if not name or name in (".", ".."):
        raise ConfigError(f"invalid log name {req.log_name!r}", hint="a file name, no directory")
    log_path = registry.workdir(state) / "logs" / name
    server = local.launch(
        req.spec,
        log_path,
        req.marker,
        cpus=set(req.cpus) if req.cpus else None,
        check_port=req.check_port,
    )
    state.servers[req.marker] = server
    return lc.Launched(
        pid=server.pid,
        started_at=server.started_at,
        log_path=str(log_path),
        gpu_baseline_mib=server.gpu_baseline_mib,
    )


def op_poll(state: AgentState, req: lc.PollRequest) -> lc.Polled:
    """The leader's exit code and the log written since `offset`."""
    server = _server(state, req.marker)
    rc = server.exit_code()
    data, end = _read(server.log_path, req.offset, READ_MAX)
    return lc.Polled(rc=rc, log=b64(data), offset=end)


def op_record_shm(state: AgentState, req: lc.MarkerRequest) -> None:
    from servelab.lifecycle import local

    local.record_shm(_server(state, req.marker))


def op_port_owners(state: AgentState, req: lc.MarkerRequest) -> lc.PortOwners:
    from servelab.lifecycle import local

    ours, foreign = local.check_port_owner(_server(state, req.marker))
    return lc.PortOwners(ours=ours, foreign=foreign)


def op_append_log(state: AgentState, req: lc.AppendLogRequest) -> None:
    """A line of servelab's own in the server's log (the start-up timeout marker)."""
    server = _server(state, req.marker)
    with open(server.log_path, "a", encoding="utf-8") as f:
        f.write(req.text)


def op_teardown(state: AgentState, req: lc.TeardownRequest) -> lc.TornDown:
    from servelab.lifecycle.serving import teardown

    server = _server(state, req.marker)
    report = teardown(server, req.grace_s)
    state.servers.pop(req.marker, None)
    data, end = _read(server.log_path, req.offset, READ_MAX)
    return lc.TornDown(report=report, log=b64(data), offset=end)


def op_sweep(state: AgentState, req: lc.SweepRequest) -> list[KilledProcess]:
    from servelab.lifecycle.serving import sweep_orphans

    live = set(state.servers)
    return [k for k in sweep_orphans(req.prefix, req.grace_s) if k.marker is None or k.marker not in live]


def op_shm_remove_orphaned(state: AgentState, req: h.ShmRequest) -> ShmCleanup:
    from servelab.host import shm

    return shm.remove_orphaned(min_age_s=req.min_age_s)


def op_free_port(state: AgentState, req: h.FreePortRequest) -> int:
    from servelab.host.ports import free_port

    return free_port(req.host)


def op_port_is_free(state: AgentState, req: h.PortRequest) -> bool:
    from servelab.host.ports import port_is_free

    return port_is_free(req.host, req.port)


def op_port_open(state: AgentState, req: h.PortOpenRequest) -> bool:
    """Whether `host:port` accepts a TCP connection here."""
    try:
        with socket.create_connection((req.host, req.port), timeout=req.timeout_s):
            return True
    except OSError:
        return False


def op_gpu_memory(state: AgentState, req: NoArgs) -> list[int] | None:
    from servelab.host.gpu_memory import nvidia_smi_reader

    return nvidia_smi_reader()


def op_read(state: AgentState, req: h.ReadRequest) -> h.ReadAnswer:
    """Bytes of a file on this host; a negative offset counts from the end."""
    p = Path(req.path).expanduser()
    try:
        size = p.stat().st_size
    except OSError as exc:
        return h.ReadAnswer(exists=False, error=exc.strerror or str(exc), data="", size=0, offset=0)
    start = max(0, size + req.offset) if req.offset < 0 else req.offset
    data, end = _read(p, start, min(req.max_bytes, READ_MAX))
    return h.ReadAnswer(exists=True, data=b64(data), size=size, offset=end)


OPS: dict[str, Op] = dict(
    [
        h.HELLO.entry(op_hello),
        h.PING.entry(op_ping),
        lc.LAUNCH.entry(op_launch),
        lc.POLL.entry(op_poll),
        lc.RECORD_SHM.entry(op_record_shm),
        lc.PORT_OWNERS.entry(op_port_owners),
        lc.APPEND_LOG.entry(op_append_log),
        lc.TEARDOWN.entry(op_teardown),
        lc.SWEEP.entry(op_sweep),
        h.SHM_REMOVE_ORPHANED.entry(op_shm_remove_orphaned),
        h.FREE_PORT.entry(op_free_port),
        h.PORT_IS_FREE.entry(op_port_is_free),
        h.PORT_OPEN.entry(op_port_open),
        h.GPU_MEMORY.entry(op_gpu_memory),
        h.READ.entry(op_read),
    ]
)
