"""Reading a host's logs and facts for `logs`, `plan check` and `report`, on this machine or over SSH.

The reading functions take a `Host` (transport.LocalHost or SshHost) and call the agent operations below
through it, so a log on this machine and one on a GPU box go through the same code: the agent checks the
path (a directory, a missing or unreadable file: exit 2) and hands the file back in chunks, never more than
`LIMIT` bytes of it (a long-running server's log can be gigabytes).

    text = read_log(host, "/var/log/sglang.log", keep="tail")   # diagnose: the end matters
    text = read_unit(host, "servelab-glm5", lines=10000)         # journalctl -u NAME over there

The operations are registered with the agent when servelab.host.agent_ops imports this module.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from servelab.errors import ConfigError, HostError, NotFoundError
from servelab.host import registry
from servelab.host.transport import Host, b64, unb64

CHUNK = registry.READ_MAX  # bytes per agent answer (one JSON line)
LIMIT = 32 * 1024 * 1024  # bytes of one log a command reads at most
JOURNAL_LINES = 10000

_UNIT = re.compile(r"^[A-Za-z0-9_.@:\\-]+$")


@dataclass(frozen=True)
class LogText:
    """A log's text as read: `cut` when the file was longer than the limit (`keep` says which end stayed)."""

    text: str
    size: int
    cut: bool = False


# -- agent operations ------------------------------------------------------------------------------
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


registry.register("log_read", op_log_read)
registry.register("host_facts", op_host_facts)


# -- the reading side ------------------------------------------------------------------------------
def read_log(host: Host, path: str, keep: Literal["head", "tail"] = "head", limit: int = LIMIT) -> LogText:
    """The text of log file `path` on `host`, at most `limit` bytes of it: the start (`keep="head"`, where
    an engine prints its configuration) or the end (`"tail"`, where a failure shows). A cut keeps whole
    lines only."""
    first = host.call("log_read", path=path, offset=0, max_bytes=min(CHUNK, limit))
    size = int(first["size"])
    if size <= limit or keep == "head":
        parts, end = [unb64(first["data"])], int(first["offset"])
        stop = min(size, limit)
    else:
        parts, end = [], size - limit
        stop = size
    while end < stop:
        got = host.call("log_read", path=path, offset=end, max_bytes=min(CHUNK, stop - end))
        data = unb64(got["data"])
        if not data:  # the file shrank while we read it (rotated): what we have is the log
            break
        parts.append(data)
        end = int(got["offset"])
    raw = b"".join(parts)
    cut = size > limit
    if cut and keep == "head" and b"\n" in raw:
        raw = raw[: raw.rindex(b"\n") + 1]
    elif cut and keep == "tail" and b"\n" in raw:
        raw = raw[raw.index(b"\n") + 1 :]
    return LogText(raw.decode("utf-8", errors="replace"), size, cut)


def read_unit(host: Host, unit: str, lines: int = JOURNAL_LINES) -> LogText:
    """The last `lines` lines of systemd unit `unit`'s journal on `host` (`journalctl -u UNIT -o cat`)."""
    if not _UNIT.match(unit) or unit.startswith("-"):
        raise ConfigError(
            f"invalid unit name {unit!r}",
            hint="a systemd unit name such as servelab-glm5 or servelab-glm5.service",
        )
    if lines < 1:
        raise ConfigError(f"--lines must be at least 1, not {lines}", hint="e.g. --lines 10000")
    out = host.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"], timeout=60)
    where = "this machine" if host.is_local else host.name
    if out.rc == 127:
        raise ConfigError(
            f"journalctl is not installed on {where}, so the journal of {unit} cannot be read",
            hint="--unit reads systemd's journal; pass the server's log file instead",
        )
    if out.rc != 0:
        raise HostError(
            f"journalctl -u {unit} failed on {where} (exit {out.rc}): {out.stderr.strip()[-300:]}",
            hint="run `journalctl -u UNIT` there by hand; reading another user's journal needs the "
            "systemd-journal group",
        )
    text = "".join(ln for ln in out.stdout.splitlines(keepends=True) if ln.strip() != "-- No entries --")
    if not text.strip():
        raise NotFoundError(
            f"the journal on {where} has no lines for unit {unit}",
            hint="check the unit's name (`systemctl list-units 'servelab-*'`; `servelab status` lists the "
            "units servelab deployed), or pass the server's log file",
        )
    return LogText(text, len(text.encode()))
