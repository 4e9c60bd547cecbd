"""Agent operations behind `logs`, `plan check` and `report`: a log file read in checked chunks (the reading
side is servelab.host.logs) and this host's doctor findings and topology for the report."""

from __future__ import annotations

import socket
from pathlib import Path

from servelab.agent import registry
from servelab.errors import ConfigError, NotFoundError
from servelab.host.agent_op import NoArgs
from servelab.host.logs import CHUNK, LOG_READ, LogRead, LogReadRequest
from servelab.host.wire import b64
from servelab.report.host import HOST_FACTS, HostFacts


def op_log_read(state: registry.AgentState, req: LogReadRequest) -> LogRead:
    """`max_bytes` of the log file `path` from `offset` (negative: from the end), after the same checks a
    local read makes: a directory or a missing file is the user's to fix (exit 2)."""
    path, offset = req.path, req.offset
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
            data = f.read(max(0, min(req.max_bytes, CHUNK)))
    except FileNotFoundError:
        raise NotFoundError(
            f"log file {path} does not exist on {_where(state)}", hint="pass the path of a server's log file"
        ) from None
    except OSError as exc:
        raise NotFoundError(
            f"cannot read {path} on {_where(state)}: {exc.strerror or exc}",
            hint="check the file's permissions",
        ) from None
    return LogRead(size=size, start=start, offset=start + len(data), data=b64(data))


def op_host_facts(state: registry.AgentState, req: NoArgs) -> HostFacts | None:
    """`servelab doctor`'s findings and the GPU topology summary of this host, for the report."""
    from servelab.report.host import gather

    facts = gather()
    if facts is None:
        return None
    return HostFacts.model_validate({**facts, "hostname": socket.gethostname()})


def _where(state: registry.AgentState) -> str:
    return socket.gethostname()


OPS: dict[str, registry.Op] = dict([LOG_READ.entry(op_log_read), HOST_FACTS.entry(op_host_facts)])
