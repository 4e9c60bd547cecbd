"""`servelab logs`: read a server log the way servelab does (see docs/cli/logs.md).

`parse` shows the effective configuration an engine's start-up log proves (each value with its line);
`diagnose` names the failure in a log from the signature knowledge base, with advice.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, Literal, NotRequired, TypedDict, cast

import click
from rich.markup import escape
from rich.table import Table

from servelab import arguments as A
from servelab.cli.args import option
from servelab.cli.output import emit, host_option, printable, stdout, warn
from servelab.cli.remote import open_cli_host, remote_python_option
from servelab.errors import ConfigError
from servelab.host.logs import JOURNAL_LINES
from servelab.host.transport import Host
from servelab.jsontypes import JsonObject, JsonValue
from servelab.redact import redact


class Parsed(TypedDict):
    """`logs parse --json` (`EffectiveConfig.to_dict()`): each key the log shows, and its line."""

    effective: JsonObject
    evidence: dict[str, str]


class SettingDoc(TypedDict):
    """`Setting.to_dict()`: what the renderer reads of the setting to change."""

    name: str
    value: JsonValue
    reason: str


# `class` is a keyword: the functional form keeps the document's own key (`Diagnosis.to_dict()`)
Diagnosed = TypedDict(
    "Diagnosed",
    {
        "class": str,
        "evidence": str,
        "advice": str,
        "fatal": bool,
        "tail": NotRequired[list[str]],
        "setting": NotRequired[SettingDoc],
    },
)


def _source(host: Host, file: str | None, unit: str | None, lines: int, keep: Literal["head", "tail"]) -> str:
    """The log's text: FILE on the host, or the journal of --unit there."""
    from servelab.host import logs as hostlogs

    if (file is None) == (unit is None):
        raise ConfigError(
            "pass either a log FILE or --unit NAME"
            if file is None
            else "pass a log FILE or --unit, not both",
            hint="`servelab logs diagnose server.log`, or `servelab logs diagnose --unit servelab-glm5`",
        )
    got = (
        hostlogs.read_unit(host, unit, lines)
        if unit is not None
        else hostlogs.read_log(host, str(file), keep)
    )
    if got.cut:
        end = "first" if keep == "head" else "last"
        warn(f"{file} holds {got.size} bytes; read its {end} {hostlogs.LIMIT // (1024 * 1024)} MiB")
    return got.text


def _server_info(host: Host, path: str | None) -> JsonObject | None:
    if path is None:
        return None
    from servelab.host import logs as hostlogs

    try:
        data = json.loads(hostlogs.read_log(host, path).text)
    except ValueError as exc:
        raise ConfigError(
            f"{path} is not JSON: {exc}", hint="save the output of GET /get_server_info"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} holds JSON but not an object", hint="save the output of GET /get_server_info"
        )
    return data


@contextlib.contextmanager
def _on_host(host: str | None, remote_python: str | None) -> Iterator[Host]:
    h = open_cli_host(host, remote_python)
    try:
        yield h
    finally:
        h.close()


def _short(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _render_parse(data: Parsed) -> None:
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


def _render_diagnosis(data: Diagnosed) -> None:
    fatal = " (fatal)" if data.get("fatal") else ""
    stdout.print(f"[bold]class:[/bold] {data['class']}{fatal}")
    if data["evidence"]:
        stdout.print(f"[bold]evidence:[/bold] {escape(printable(data['evidence']))}")
    stdout.print(f"[bold]advice:[/bold] {escape(printable(data['advice']))}")
    if data.get("setting"):
        s = data["setting"]
        stdout.print(f"[bold]try:[/bold] {s['name']} = {s['value']} ({escape(printable(s['reason']))})")
    if data.get("tail"):
        stdout.print("[bold]tail:[/bold]")
        for line in data["tail"]:
            stdout.print(f"  {escape(printable(line))}")


def _source_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FILE or --unit, and the host both are on."""
    for deco in reversed(
        (
            option(A.LogFile, required=False),
            option(A.LogUnit, default=None, metavar="NAME"),
            option(A.LogLines, default=JOURNAL_LINES, show_default=True),
            host_option,
            remote_python_option,
        )
    ):
        fn = deco(fn)
    return fn


@click.group()
def logs() -> None:
    """Read server logs: effective configuration (`parse`) and failure diagnosis (`diagnose`)."""


@logs.command("parse")
@option(A.ParseEngine, "engine_name", required=True)
@option(A.ServerInfo, "info_path", default=None)
@click.option(
    "--json", "as_json", is_flag=True, help='{"effective": {...}, "evidence": {key: line}} as JSON.'
)
@_source_options
def parse(
    engine_name: str,
    info_path: str | None,
    as_json: bool,
    file: str | None,
    unit: str | None,
    lines: int,
    host: str | None,
    remote_python: str | None,
) -> None:
    """The effective configuration FILE (a server's log) shows, each key with the line that proves it."""
    from servelab.engines import registry

    engine = registry.get(engine_name)
    with _on_host(host, remote_python) as h:
        text = _source(h, file, unit, lines, "head")
        info = _server_info(h, info_path)
    data: Parsed = redact(engine.effective_config(text, info).to_dict())
    emit(data, as_json, _render_parse)


@logs.command("diagnose")
@option(A.LogEngine, "engine_name", default=None)
@click.option(
    "--json", "as_json", is_flag=True, help='{"class", "evidence", "advice", "fatal"[, "tail"]} as JSON.'
)
@_source_options
def diagnose(
    engine_name: str | None,
    as_json: bool,
    file: str | None,
    unit: str | None,
    lines: int,
    host: str | None,
    remote_python: str | None,
) -> None:
    """Why the server that wrote FILE failed: a failure class, the line that shows it, and what to do."""
    from servelab.engines import registry, signatures

    if engine_name is not None:
        registry.get(engine_name)  # an unknown name fails here, listing the known ones
    with _on_host(host, remote_python) as h:
        text = _source(h, file, unit, lines, "tail")
    diag = signatures.diagnose(text, engine_name)
    if diag.klass == "unknown":
        diag = signatures.healthy(text) or diag
    emit(cast(Diagnosed, diag.to_dict()), as_json, _render_diagnosis)
