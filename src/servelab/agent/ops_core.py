"""The agent's own operations: who it is, and a server's life on this host (launch, poll, teardown, sweep,
the /dev/shm ledger, ports, GPU memory, reading a file). Each is the function servelab runs on a local host
(lifecycle, processes, shm, ports), so the remote side is the same code path as the local one."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from pathlib import Path
from typing import Any

from servelab import __version__
from servelab.agent import registry
from servelab.agent.registry import READ_MAX, AgentState, Op
from servelab.errors import ConfigError, NotFoundError
from servelab.host.wire import PROTOCOL


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


def op_hello(state: AgentState, workdir: str | None = None) -> dict[str, Any]:
    if workdir:
        state.workdir = Path(workdir).expanduser()
    return {
        "version": __version__,
        "protocol": PROTOCOL,
        "hostname": socket.gethostname(),
        "python": sys.executable,
        "pid": os.getpid(),
        "uid": os.getuid(),
        "workdir": str(registry.workdir(state)),
    }


def op_ping(state: AgentState) -> None:
    """Nothing: its round trip is the SSH path's (the bench records it with every run)."""


def op_launch(
    state: AgentState,
    spec: dict[str, Any],
    log_name: str,
    marker: str,
    cpus: list[int] | None = None,
    check_port: bool = True,
) -> dict[str, Any]:
    from servelab.engines.base import LaunchSpec
    from servelab.lifecycle import local

    if marker in state.servers:
        raise ConfigError(f"a server marked {marker!r} already runs", hint="tear it down first")
    name = Path(log_name).name
    if not name or name in (".", ".."):
        raise ConfigError(f"invalid log name {log_name!r}", hint="a file name, no directory")
    log_path = registry.workdir(state) / "logs" / name
    server = local.launch(
        LaunchSpec(**spec), log_path, marker, cpus=set(cpus) if cpus else None, check_port=check_port
    )
    state.servers[marker] = server
    return {
        "pid": server.pid,
        "started_at": server.started_at,
        "log_path": str(log_path),
        "gpu_baseline_mib": server.gpu_baseline_mib,
    }


def op_poll(state: AgentState, marker: str, offset: int = 0) -> dict[str, Any]:
    """The leader's exit code and the log written since `offset`."""
    from servelab.host.wire import b64

    server = _server(state, marker)
    rc = server.exit_code()
    data, end = _read(server.log_path, offset, READ_MAX)
    return {"rc": rc, "log": b64(data), "offset": end}


def op_record_shm(state: AgentState, marker: str) -> None:
    from servelab.lifecycle import local

    local.record_shm(_server(state, marker))


def op_port_owners(state: AgentState, marker: str) -> dict[str, Any]:
    from servelab.lifecycle import local

    ours, foreign = local.check_port_owner(_server(state, marker))
    return {
        "ours": [dataclasses.asdict(x) for x in ours],
        "foreign": [dataclasses.asdict(x) for x in foreign],
    }


def op_append_log(state: AgentState, marker: str, text: str) -> None:
    """A line of servelab's own in the server's log (the start-up timeout marker)."""
    server = _server(state, marker)
    with open(server.log_path, "a", encoding="utf-8") as f:
        f.write(text)


def op_teardown(state: AgentState, marker: str, grace_s: float = 15.0, offset: int = 0) -> dict[str, Any]:
    from servelab.host.wire import b64
    from servelab.lifecycle.serving import teardown

    server = _server(state, marker)
    report = teardown(server, grace_s)
    state.servers.pop(marker, None)
    data, end = _read(server.log_path, offset, READ_MAX)
    return {"report": dataclasses.asdict(report), "log": b64(data), "offset": end}


def op_sweep(state: AgentState, prefix: str, grace_s: float = 5.0) -> list[dict[str, Any]]:
    from servelab.lifecycle.serving import sweep_orphans

    live = {m for m in state.servers}
    return [
        dataclasses.asdict(k)
        for k in sweep_orphans(prefix, grace_s)
        if k.marker is None or k.marker not in live
    ]


def op_shm_remove_orphaned(state: AgentState, min_age_s: float = 5.0) -> dict[str, Any]:
    from servelab.host import shm

    return dataclasses.asdict(shm.remove_orphaned(min_age_s=min_age_s))


def op_free_port(state: AgentState, host: str = "127.0.0.1") -> int:
    from servelab.host.ports import free_port

    return free_port(host)


def op_port_is_free(state: AgentState, host: str, port: int) -> bool:
    from servelab.host.ports import port_is_free

    return port_is_free(host, port)


def op_port_open(state: AgentState, host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether `host:port` accepts a TCP connection here."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def op_gpu_memory(state: AgentState) -> list[int] | None:
    from servelab.host.gpu_memory import nvidia_smi_reader

    return nvidia_smi_reader()


def op_read(state: AgentState, path: str, offset: int = 0, max_bytes: int = READ_MAX) -> dict[str, Any]:
    """Bytes of a file on this host; a negative offset counts from the end."""
    from servelab.host.wire import b64

    p = Path(path).expanduser()
    try:
        size = p.stat().st_size
    except OSError as exc:
        return {"exists": False, "error": exc.strerror or str(exc), "data": "", "size": 0, "offset": 0}
    start = max(0, size + offset) if offset < 0 else offset
    data, end = _read(p, start, min(max_bytes, READ_MAX))
    return {"exists": True, "data": b64(data), "size": size, "offset": end}


OPS: dict[str, Op] = {
    "hello": op_hello,
    "ping": op_ping,
    "launch": op_launch,
    "poll": op_poll,
    "record_shm": op_record_shm,
    "port_owners": op_port_owners,
    "append_log": op_append_log,
    "teardown": op_teardown,
    "sweep": op_sweep,
    "shm_remove_orphaned": op_shm_remove_orphaned,
    "free_port": op_free_port,
    "port_is_free": op_port_is_free,
    "port_open": op_port_open,
    "gpu_memory": op_gpu_memory,
    "read": op_read,
}
