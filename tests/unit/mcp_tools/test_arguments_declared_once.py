"""Each option an MCP tool shares with the CLI command it runs is declared once (servelab.arguments): the
tool's parameter carries the declaration, and the command's click option has the same flag and help.
A tool parameter declared in place is one only the tool has, and is listed here with why."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import click
import pytest

from servelab.arguments import Opt, declared
from servelab.cli.main import cli
from servelab.mcp.base import Options
from servelab.mcp.server import GROUPS
from servelab.mcp.studies import Studies

# The command each tool runs (its path under `servelab`); None: the tool reads the store itself.
COMMAND: dict[str, tuple[str, ...] | None] = {
    "status": ("status",),
    "doctor": ("doctor",),
    "logs_diagnose": ("logs", "diagnose"),
    "logs_parse": ("logs", "parse"),
    "plan_get": None,
    "plan_update": None,
    "plan_check": ("plan", "check"),
    "predict": ("predict",),
    "predict_sweep": ("predict",),
    "compare_layouts": ("predict",),
    "explain": ("explain",),
    "bench": ("bench",),
    "runs_show": ("runs", "show"),
    "tune_start": ("tune",),
    "tune_progress": None,
    "tune_stop": None,
    "tune_resume": ("tune",),
    "report": ("report",),
    "deploy_preview": ("deploy",),
}

# Parameters only the tool has (no option of the command stands for them), and why.
TOOL_ONLY = {
    ("plan_update", "todos"): "todowrite's list itself (the CLI imports it from a file)",
    ("plan_update", "prune"): "plan_update merges in this process; `plan import --prune` reads a file",
    ("tune_progress", "ctx"): "the MCP context, not an argument",
    ("tune_resume", "study_file"): "defaults to the file the study was run from, which the tool looks up",
    (
        "deploy_preview",
        "install",
    ): "the tool's switch between --dry-run and --install (allowed by the server)",
}


def _tools() -> list[Any]:
    return [fn for make in GROUPS for fn in make(Options(), Studies()).tools]


def _command(path: tuple[str, ...]) -> click.Command:
    cmd: click.Command = cli
    for name in path:
        assert isinstance(cmd, click.Group), path
        sub = cmd.get_command(click.Context(cmd), name)
        assert sub is not None, path
        cmd = sub
    return cmd


def _param(cmd: click.Command, opt: Opt) -> click.Parameter:
    for p in cmd.params:
        if opt.argument and isinstance(p, click.Argument) and p.name == opt.name:
            return p
        if not opt.argument and isinstance(p, click.Option) and opt.flag in p.opts:
            return p
    raise AssertionError(f"{cmd.name} has no {opt.flag}")


def test_every_tool_has_a_known_command() -> None:
    assert sorted(fn.__name__ for fn in _tools()) == sorted(COMMAND)


@pytest.mark.parametrize("tool", sorted(COMMAND))
def test_each_tool_parameter_is_the_commands_option_declared_once(tool: str) -> None:
    fn = next(f for f in _tools() if f.__name__ == tool)
    hints = typing.get_type_hints(fn, include_extras=True)
    path = COMMAND[tool]
    for name in inspect.signature(fn).parameters:
        d = declared(hints[name])
        if (tool, name) in TOOL_ONLY:
            assert d is None, f"{tool}.{name} is declared in servelab.arguments: drop it from TOOL_ONLY"
            continue
        assert d is not None, f"{tool}.{name} is not declared in servelab.arguments"
        assert d.opt.name == name, f"{tool}.{name} carries the declaration of {d.opt.name!r}"
        if path is None or not d.opt.cli:
            continue
        param = _param(_command(path), d.opt)
        if isinstance(param, click.Option):
            assert param.help == d.help, f"{tool}.{name}: the CLI's --help and the tool's text differ"
            assert param.multiple == (d.opt.cli_list == "repeat"), f"{tool}.{name}"


def test_the_cli_refuses_what_is_not_a_declaration() -> None:
    from servelab.cli.args import option

    with pytest.raises(TypeError, match=r"not a servelab\.arguments declaration"):
        option(typing.Annotated[int, "x"])
