"""Rendering: a rich view for people on stdout, stable JSON for scripts, progress on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import orjson
from rich.console import Console

# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns; give them room instead.
stdout = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


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


def emit(data: Any, as_json: bool, render: Callable[[Any], None] | None = None) -> None:
    """Print `data` as JSON (nothing else on stdout) or through the human renderer."""
    if as_json or render is None:
        sys.stdout.write(dumps_json(data) + "\n")
        sys.stdout.flush()
    else:
        render(data)


def warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/yellow] {message}", markup=True)


def progress_enabled() -> bool:
    return sys.stderr.isatty()
