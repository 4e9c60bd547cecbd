"""The `servelab` command group and the one place where errors become messages and exit codes.

The rule (docs/cli/exit-codes.md): 0 done; 1 what was checked failed, or a server, engine, host or the
store could not be used; 2 the input must change (click's usage errors, every UserError); 3 a bug in
servelab; 130 interrupted. Each ServelabError class carries its code (servelab.errors)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

import click
from rich.markup import escape

from servelab import __version__
from servelab.cli.output import dumps_json, printable, stderr, write_out
from servelab.errors import INTERNAL_ERROR, INTERRUPTED, ServelabError
from servelab.redact import redact_text

# Every command: its name, and where it lives (module path, attribute). Adding a command is one line. The
# module is imported only when the command runs (or `--help` lists them all): a command pays for its own
# imports only, which is most of a short command's time (`status --host` must answer in under 2 s).
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("servelab.cli.bench", "bench"),
    "runs": ("servelab.cli.runs", "runs"),
    "predict": ("servelab.cli.predict", "predict"),
    "explain": ("servelab.cli.predict", "explain"),
    "calibrate": ("servelab.cli.calibrate", "calibrate"),
    "sim": ("servelab.cli.sim", "sim"),
    "logs": ("servelab.cli.logs", "logs"),
    "verify-output": ("servelab.cli.verify", "verify_output_cmd"),
    "tune": ("servelab.cli.tune", "tune_cmd"),
    "deploy": ("servelab.cli.deploy", "deploy_cmd"),
    "preflight": ("servelab.cli.deploy", "preflight_cmd"),
    "wait-ready": ("servelab.cli.deploy", "wait_ready_cmd"),
    "plan": ("servelab.cli.plan", "plan"),
    "status": ("servelab.cli.status", "status_cmd"),
    "doctor": ("servelab.cli.status", "doctor_cmd"),
    "report": ("servelab.cli.report", "report"),
    "ui": ("servelab.cli.ui", "ui"),
    "db": ("servelab.cli.db", "db"),
    "mcp": ("servelab.cli.mcp", "mcp_cmd"),
}


def _wants_json(args: list[str]) -> bool:
    return "--json" in args


class ServelabGroup(click.Group):
    """Maps every ServelabError to a message plus hint (no traceback unless --debug); loads each command's
    module when the command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        cmd = getattr(importlib.import_module(where[0]), where[1])
        assert isinstance(cmd, click.Command) and cmd.name == cmd_name, (cmd_name, cmd)
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ServelabError as exc:
            debug = bool(ctx.obj and ctx.obj.get("debug"))
            _report(exc, debug, _wants_json(sys.argv[1:]))
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            stderr.print("interrupted; everything finished so far is in the store.")
            ctx.exit(INTERRUPTED)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            # Not a ServelabError: servelab itself failed. Exit 3 keeps it apart from 1 ("what you checked failed").
            stderr.print(
                f"[red]internal error:[/red] {escape(printable(redact_text(f'{type(exc).__name__}: {exc}')))}"
            )
            stderr.print("[cyan]hint:[/cyan] this is a bug in servelab; rerun with --debug for the traceback")
            ctx.exit(INTERNAL_ERROR)


def _report(exc: ServelabError, debug: bool, as_json: bool) -> None:
    if debug:
        stderr.print(escape("".join(traceback.format_exception(exc))))
    if as_json:
        write_out(dumps_json(exc.document if exc.document is not None else exc.to_dict()) + "\n")
    stderr.print(f"[red]error:[/red] {escape(printable(redact_text(exc.message)))}")
    if exc.hint:
        stderr.print(f"[cyan]hint:[/cyan] {escape(printable(exc.hint))}")


@click.group(cls=ServelabGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="servelab")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option(
    "--db",
    "db",
    metavar="URL",
    help="The store: a path, sqlite:///PATH or postgresql://USER@HOST/DB (default: $SERVELAB_DB, else"
    " servelab.db in $SERVELAB_HOME). No password here: PGPASSWORD, PGPASSFILE or ~/.pgpass.",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool, db: str | None) -> None:
    """servelab: observe, plan, launch, verify, benchmark, predict, tune, report and deploy LLM servers."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if db is not None:
        from servelab.store.dialect import ENV, command_line_location

        command_line_location(db, "--db")
        os.environ[ENV] = db  # what open_store resolves, in this process and the servelab ones it starts


def main() -> None:
    cli(prog_name="servelab")
