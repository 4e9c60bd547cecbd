"""Agent operations behind `logs`, `plan check` and `report`: a log file read in checked chunks (the reading
side is servelab.host.logs) and this host's doctor findings and topology for the report."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from servelab.agent import registry
from servelab.errors import ConfigError, NotFoundError
from servelab.host.logs import CHUNK
from servelab.host.wire import b64


def op_log_read(
    state: registry.AgentState, path: str, offset: int = 0, max_bytes: int = CHUNK
) -> dict[str, Any]:
    """`max_bytes` of the log file `path` from `offset` (negative: from the end), after the same checks a
    local read makes: a directory or a missing file is the user's to fix (exit 2)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(
            f"{path} is a directory, not a log file",
            hint="pass one log file from it (a study keeps one per candidate: `ls` the directory)",
        )
    try:
        with open(p, "rb") as f:
            size = f.seek(0, 2)
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            f.seek(start)
            data = f.read(max(0, min(max_bytes, CHUNK)))
    except FileNotFoundError:
        raise NotFoundError(
            f"log file {path} does not exist on {_where(state)}", hint="pass the path of a server's log file"
        ) from None
    except OSError as exc:
        raise NotFoundError(
            f"cannot read {path} on {_where(state)}: {exc.strerror or exc}",
            hint="check the file's permissions",
        ) from None
    return {"size": size, "start": start, "offset": start + len(data), "data": b64(data)}


def op_host_facts(state: registry.AgentState) -> dict[str, Any] | None:
    """`servelab doctor`'s findings and the GPU topology summary of this host, for the report."""
    from servelab.report.host import gather

    facts = gather()
    if facts is None:
        return None
    return {**facts, "hostname": socket.gethostname()}


def _where(state: registry.AgentState) -> str:
    return socket.gethostname()


OPS: dict[str, registry.Op] = {"log_read": op_log_read, "host_facts": op_host_facts}
