"""Rendering: a rich view for people on stdout, stable JSON for scripts, progress on stderr."""

from __future__ import annotations

import contextlib
import os
import re
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
        _blocking_stdout()
        sys.stdout.write(dumps_json(data) + "\n")
        sys.stdout.flush()
    else:
        render(data)


def _blocking_stdout() -> None:
    """stdout back to blocking before a document is written: an event loop or a child left the shared
    fd non-blocking, and a pipe whose reader lags then took only its first 64 KiB (a `tune --json` of
    a large search arrived cut at 65,535 bytes with exit 0)."""
    # not a real fd (a test runner's buffer: io.UnsupportedOperation): nothing to restore
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.set_blocking(sys.stdout.fileno(), True)


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
