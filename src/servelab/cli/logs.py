"""`servelab logs`: read a server log the way servelab does (see docs/cli/logs.md).

`parse` shows the effective configuration an engine's start-up log proves (each value with its line);
`diagnose` names the failure in a log from the signature knowledge base, with advice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from servelab.cli.output import emit, printable, stdout
from servelab.errors import ConfigError, NotFoundError
from servelab.redact import redact


def _read(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(
            f"{path} is a directory, not a log file",
            hint="pass one log file from it (a study keeps one per candidate: `ls` the directory)",
        )
    if not p.is_file():
        raise NotFoundError(f"log file {path} does not exist", hint="pass the path of a server's log file")
    try:
        return p.read_text(errors="replace")
    except OSError as exc:
        raise NotFoundError(
            f"cannot read {path}: {exc.strerror}", hint="check the file's permissions"
        ) from exc


def _server_info(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(_read(path))
    except ValueError as exc:
        raise ConfigError(
            f"{path} is not JSON: {exc}", hint="save the output of GET /get_server_info"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} holds JSON but not an object", hint="save the output of GET /get_server_info"
        )
    return data


def _short(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _render_parse(data: dict[str, Any]) -> None:
    if not data["effective"]:
        stdout.print("no configuration found in this log (is --engine right?)")
        return
    t = Table("key", "value", "evidence")
    for key, value in data["effective"].items():
        t.add_row(
            escape(printable(key)),
            escape(printable(repr(value))),
            escape(printable(_short(data["evidence"].get(key, "")))),
        )
    stdout.print(t)


def _render_diagnosis(data: dict[str, Any]) -> None:
    fatal = " (fatal)" if data.get("fatal") else ""
    stdout.print(f"[bold]class:[/bold] {data['class']}{fatal}")
    if data["evidence"]:
        stdout.print(f"[bold]evidence:[/bold] {escape(printable(data['evidence']))}")
    stdout.print(f"[bold]advice:[/bold] {escape(printable(data['advice']))}")
    if data.get("tail"):
        stdout.print("[bold]tail:[/bold]")
        for line in data["tail"]:
            stdout.print(f"  {escape(printable(line))}")


@click.group()
def logs() -> None:
    """Read server logs: effective configuration (`parse`) and failure diagnosis (`diagnose`)."""


@logs.command("parse")
@click.option("--engine", "engine_name", required=True, help="Engine that wrote the log: vllm, sglang, ...")
@click.option(
    "--server-info",
    "info_path",
    default=None,
    help="JSON saved from the engine's info endpoint (SGLang /get_server_info, vLLM /version); it wins over the log.",
)
@click.option(
    "--json", "as_json", is_flag=True, help='{"effective": {...}, "evidence": {key: line}} as JSON.'
)
@click.argument("file")
def parse(engine_name: str, info_path: str | None, as_json: bool, file: str) -> None:
    """The effective configuration FILE (a server's log) shows, each key with the line that proves it."""
    from servelab.engines import registry

    engine = registry.get(engine_name)
    text = _read(file)
    data = redact(engine.effective_config(text, _server_info(info_path)).to_dict())
    emit(data, as_json, _render_parse)


@logs.command("diagnose")
@click.option(
    "--engine", "engine_name", default=None, help="Engine that wrote the log (default: guessed from it)."
)
@click.option(
    "--json", "as_json", is_flag=True, help='{"class", "evidence", "advice", "fatal"[, "tail"]} as JSON.'
)
@click.argument("file")
def diagnose(engine_name: str | None, as_json: bool, file: str) -> None:
    """Why the server that wrote FILE failed: a failure class, the line that shows it, and what to do."""
    from servelab.engines import registry, signatures

    if engine_name is not None:
        registry.get(engine_name)  # an unknown name fails here, listing the known ones
    text = _read(file)
    diag = signatures.diagnose(text, engine_name)
    if diag.klass == "unknown":
        diag = signatures.healthy(text) or diag
    emit(diag.to_dict(), as_json, _render_diagnosis)
