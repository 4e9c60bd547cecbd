"""Read a mangled server log like a clean one: what `normalise` undoes is listed in data/log_formats.toml.

Logs reach `servelab logs diagnose` copied out of terminals, containers and issue trackers: ANSI colours
(or their leftovers once ESC is lost), docker-compose / journald / container timestamps before every line,
the engines' own nested process prefixes (`(APIServer pid=1) (EngineCore_DP0 pid=9) ERROR ...`), lines
hard-wrapped at the terminal's width, and whole tracebacks pasted as one line. `normalise` is a pure
function of the text; the failure signatures are matched against its result.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import pairwise


@dataclass(frozen=True)
class LogFormats:
    ansi: tuple[re.Pattern[str], ...]
    strip: tuple[re.Pattern[str], ...]
    trailing: tuple[re.Pattern[str], ...]
    record_start: re.Pattern[str]
    wrap_width: int
    continuation_starts: re.Pattern[str]
    complete: tuple[re.Pattern[str], ...]
    not_continuation: tuple[re.Pattern[str], ...]


def _all(patterns: list[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


@cache
def formats() -> LogFormats:
    """The packaged table (servelab/data/log_formats.toml), compiled once."""
    data = tomllib.loads(resources.files("servelab.data").joinpath("log_formats.toml").read_text())
    return LogFormats(
        ansi=_all(data["ansi"]["patterns"]),
        strip=_all(data["strip"]["patterns"]),
        trailing=_all(data["trailing"]["patterns"]),
        record_start=re.compile(data["record_start"]["pattern"]),
        wrap_width=int(data["continuation"]["wrap_width"]),
        continuation_starts=re.compile(data["continuation"]["starts"]),
        complete=_all(data["continuation"]["complete"]),
        not_continuation=_all(data["continuation"]["not_continuation"]),
    )


def _split_records(line: str, start: re.Pattern[str]) -> list[str]:
    """A line that lost its newlines, cut before every record that begins inside it."""
    cuts = [
        m.start()
        for m in start.finditer(line)
        if m.start() > 0 and line[m.start() - 1] == " " and line[: m.start()].strip()
    ]
    if not cuts:
        return [line]
    bounds = [0, *cuts, len(line)]
    return [line[a:b] for a, b in pairwise(bounds)]


def _strip_ansi(line: str, fmt: LogFormats) -> str:
    for pattern in fmt.ansi:
        line = pattern.sub("", line)
    return line


def _clean(line: str, fmt: LogFormats) -> str:
    changed = True
    while changed:
        changed = False
        for pattern in fmt.strip:
            stripped = pattern.sub("", line, count=1)
            if stripped != line:
                line, changed = stripped, True
    for pattern in fmt.trailing:
        line = pattern.sub("", line)
    return line


def _continues(previous: str, line: str, fmt: LogFormats) -> bool:
    return (
        len(previous) >= fmt.wrap_width
        and not any(p.search(previous) for p in fmt.complete)
        and bool(fmt.continuation_starts.match(line))
        and not any(p.search(line) for p in fmt.not_continuation)
    )


def normalise(text: str) -> str:
    """`text` with ANSI codes and line prefixes removed, lost newlines restored and wrapped lines rejoined."""
    fmt = formats()
    out: list[str] = []
    previous = ""  # the previous physical line as the terminal showed it (prefixes and padding included)
    for raw in text.splitlines():
        physical = _strip_ansi(raw, fmt)
        for i, piece in enumerate(_split_records(_clean(physical, fmt), fmt.record_start)):
            line = _clean(piece, fmt)
            if i == 0 and out and _continues(previous, line, fmt):
                out[-1] += line
            else:
                out.append(line)
        previous = physical
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
