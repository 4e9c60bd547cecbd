"""Rendering: a rich view for people on stdout, stable JSON for scripts, progress on stderr."""

from __future__ import annotations

import os
import re
import select
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from rich.console import Console

from servelab.redact import redact

# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns; give them room instead.
stdout = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


# C0 controls but tab and newline, DEL, and the C1 controls (0x9b is a one-byte CSI on some terminals).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` from a server (a log line, an error body) made safe for a terminal: every control
    character shown as `\\xNN`, so a line cannot retitle the window, clear the screen or hide itself."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps_json(data: Any) -> str:
    return orjson.dumps(
        data,
        default=_default,
        option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
    ).decode()


D = TypeVar("D")


def emit(data: D, as_json: bool, render: Callable[[D], None] | None = None) -> None:
    """Print `data` as JSON (nothing else on stdout) or through the human renderer; secrets masked either
    way (`redact`: whatever a command prints may end up in a terminal log or a CI artifact). The renderer
    reads the document it is given (typed alike, so a key it reads is one the document declares)."""
    if isinstance(data, dict | list):
        data = redact(data)
    if as_json or render is None:
        write_out(dumps_json(data) + "\n")
    else:
        render(data)


def write_out(text: str) -> None:
    """Write a whole document to stdout, every byte of it, even when the fd is non-blocking.

    The write end of a pipe is one open file shared by every process holding it: an event loop or a child
    can leave it non-blocking at any moment, and a pipe whose reader lags then took only its first 64 KiB
    (a `tune --json`, later a `bench --find-capacity --json`, arrived cut at 65,536 bytes with exit 0).
    Setting it back to blocking once was not enough (another holder can flip it again mid-write), so the
    bytes go out with `os.write`, waiting for the pipe to drain (`select`) whenever it is full."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # not a real fd (a test runner's buffer)
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    view = memoryview(text.encode(sys.stdout.encoding or "utf-8", errors="replace"))
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        view = view[n:]


def warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/yellow] {printable(message)}", markup=True)


def progress_enabled() -> bool:
    return sys.stderr.isatty()


def fit_labels(labels: list[str], budget: int) -> tuple[dict[str, str], list[str]]:
    """Names for a table column at most `budget` characters wide that never cut a name (two candidates
    named `tp8-cutlass` and `tp8-cutlass-arfusion` must not both show as `tp8-cutl…`): every name as it is
    when the longest fits, else each too long name replaced by `#N` with a legend line `#N  full name`."""
    budget = max(budget, 4)
    if all(len(x) <= budget for x in labels):
        return {x: x for x in labels}, []
    shown: dict[str, str] = {}
    legend: list[str] = []
    for x in labels:
        if x in shown:
            continue
        if len(x) <= budget:
            shown[x] = x
        else:
            key = f"#{len(legend) + 1}"
            shown[x] = key
            legend.append(f"{key}  {x}")
    return shown, legend


def host_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--host TARGET`, the same on every command that observes or acts on a machine."""
    from servelab.arguments import Host
    from servelab.cli.args import option

    return option(Host, "host", default=None, metavar="TARGET")(fn)
