"""What every tool group shares: the server's options, a command run as a child (`servelab … --json`)
and its document validated into the tool's result, errors as MCP tool errors, the parameters several
groups take, and `Group`, what a tools module hands server.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import orjson
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ValidationError

from servelab.errors import ServelabError
from servelab.mcp.studies import error_of, servelab_argv
from servelab.redact import redact, redact_text

T = TypeVar("T", bound=BaseModel)
CLI_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Options:
    """What the person who started the server allows (nothing destructive unless named here)."""

    allow_install: bool = False
    bench_max_requests: int = 200
    bench_max_duration_s: float = 60.0
    bench_max_levels: int = 4
    bench_max_concurrency: int = 64


def tool_error(exc: ServelabError) -> ToolError:
    """The CLI's rendering of an error (message, then its hint), secrets masked."""
    text = f"error: {redact_text(exc.message)}"
    if exc.hint:
        text += f"\nhint: {redact_text(exc.hint)}"
    return ToolError(text)


@contextlib.contextmanager
def as_tool_errors() -> Iterator[None]:
    try:
        yield
    except ServelabError as exc:
        raise tool_error(exc) from None


def flags(**kw: Any) -> list[str]:
    """Tool arguments as the command's options: `num_gpus=8` → `--num-gpus 8`, True → the flag alone,
    a list → the option once per value; None and False are left out (the command's default)."""
    out: list[str] = []
    for name, value in kw.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


def run_cli(args: list[str], timeout: float = CLI_TIMEOUT_S) -> Any:
    """`servelab ARGS --json` in a child: its document (secrets masked), or its error raised. A command
    that exits 1 with its document (doctor's failed check) returns that document."""
    try:
        cp = subprocess.run(
            [*servelab_argv(), *args, "--json"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env={**os.environ, "COLUMNS": "160"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ServelabError(
            f"servelab {args[0]} took longer than {timeout:.0f} s", hint="ask for less (fewer levels)"
        ) from None
    doc: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        doc = orjson.loads(cp.stdout)
    is_error = isinstance(doc, dict) and {"error", "message"} <= doc.keys()
    if cp.returncode not in (0, 1) or doc is None or is_error:
        raise error_of(cp.stdout, cp.stderr, cp.returncode)
    return redact(doc)


async def call(model: type[T], args: list[str], timeout: float = CLI_TIMEOUT_S) -> T:
    try:
        doc = await anyio.to_thread.run_sync(lambda: run_cli(args, timeout))
    except ServelabError as exc:
        raise tool_error(exc) from None
    try:
        return model.model_validate(doc)
    except ValidationError as exc:  # the command's document and this tool's declared result disagree
        command = " ".join(a for a in args[:2] if not a.startswith("-"))
        raise tool_error(
            ServelabError(
                f"servelab {command} --json gave a document that does not match this tool's "
                f"result ({model.__name__}): {exc.error_count()} error(s), first: "
                f"{'.'.join(map(str, exc.errors()[0]['loc']))}: {exc.errors()[0]['msg']}",
                hint="the servelab command and its MCP server disagree (a version mismatch?): run the "
                "command with --json in a terminal, and report it",
            )
        ) from None


def typed(model: type[T], doc: Any) -> T:
    """A result built in this process, secrets masked like every command's output."""
    return model.model_validate(
        redact(doc.model_dump(mode="json", by_alias=True) if isinstance(doc, BaseModel) else doc)
    )


@dataclass(frozen=True)
class Resource:
    """A resource a group serves: its URI (a template when it holds `{…}`), its MIME type, its reader."""

    uri: str
    mime_type: str
    read: Callable[..., Any]


@dataclass(frozen=True)
class Group:
    """A tools module's tools (each named by its function) and resources, for server.py to register."""

    tools: list[Callable[..., Any]]
    resources: list[Resource] = field(default_factory=list)
