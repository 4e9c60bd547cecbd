"""Reading a host's logs for `logs`, `plan check` and `report`, on this machine or over SSH.

The reading functions take a `Host` (transport.LocalHost or SshHost) and call the agent operation `log_read`
(servelab.agent.ops_logs) through it, so a log on this machine and one on a GPU box go through the same
code: the agent checks the path (a directory, a missing or unreadable file: exit 2) and hands the file back
in chunks, never more than `LIMIT` bytes of it (a long-running server's log can be gigabytes).

    text = read_log(host, "/var/log/sglang.log", keep="tail")   # diagnose: the end matters
    text = read_unit(host, "servelab-glm5", lines=10000)         # journalctl -u NAME over there
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import TypeAdapter

from servelab.errors import ConfigError, HostError, NotFoundError
from servelab.host.agent_op import AgentOp, Answer, Request
from servelab.host.transport import Host, unb64
from servelab.host.wire import READ_MAX

CHUNK = READ_MAX  # bytes per agent answer (one JSON line)
LIMIT = 32 * 1024 * 1024  # bytes of one log a command reads at most
JOURNAL_LINES = 10000

_UNIT = re.compile(r"^[A-Za-z0-9_.@:\\-]+$")


class LogReadRequest(Request):
    path: str
    offset: int = 0  # negative: from the end
    max_bytes: int = CHUNK


class LogRead(Answer):
    """`data` (base64) read from `start`; `offset` is where it ended, `size` the file's size then."""

    size: int
    start: int
    offset: int
    data: str


LOG_READ = AgentOp("log_read", LogReadRequest, TypeAdapter(LogRead))  # servelab.agent.ops_logs serves it


@dataclass(frozen=True)
class LogText:
    """A log's text as read: `cut` when the file was longer than the limit (`keep` says which end stayed)."""

    text: str
    size: int
    cut: bool = False


def read_log(host: Host, path: str, keep: Literal["head", "tail"] = "head", limit: int = LIMIT) -> LogText:
    """The text of log file `path` on `host`, at most `limit` bytes of it: the start (`keep="head"`, where
    an engine prints its configuration) or the end (`"tail"`, where a failure shows). A cut keeps whole
    lines only."""
    first = LOG_READ.call(host, LogReadRequest(path=path, offset=0, max_bytes=min(CHUNK, limit)))
    size = first.size
    if size <= limit or keep == "head":
        parts, end = [unb64(first.data)], first.offset
        stop = min(size, limit)
    else:
        parts, end = [], size - limit
        stop = size
    while end < stop:
        got = LOG_READ.call(host, LogReadRequest(path=path, offset=end, max_bytes=min(CHUNK, stop - end)))
        data = unb64(got.data)
        if not data:  # the file shrank while we read it (rotated): what we have is the log
            break
        parts.append(data)
        end = got.offset
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
