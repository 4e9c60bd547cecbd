"""`servelab verify-output`: does the server give right answers? (see docs/cli/verify.md)"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, TypedDict

import click
from rich.markup import escape
from rich.table import Table

from servelab.cli.output import emit, stdout
from servelab.redact import redact


class CheckDoc(TypedDict):
    """One check of `verify-output --json`: the keys the view reads."""

    name: str
    ok: bool
    severity: str
    detail: str


class Verified(TypedDict):
    """`verify-output --json` (`VerifyResult.to_dict()`, docs/cli/verify.md): the keys the view reads."""

    model: str
    url: str
    api: str
    checks: list[CheckDoc]
    notes: list[str]
    reference: str
    known_answers: str
    ok: bool
    warnings: list[str]
    failed: list[str]


_MARK = {"info": "[green]ok[/green]", "warning": "[yellow]warn[/yellow]", "error": "[red]FAIL[/red]"}


@click.command("verify-output")
@click.option("--url", required=True, help="Server base URL, e.g. http://127.0.0.1:8000.")
@click.option("--model", required=True, help="The model name requests carry (as /v1/models lists it).")
@click.option(
    "--api",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
    help="completions sends the raw prompt (the tokenizer adds BOS); chat applies the chat template.",
)
@click.option(
    "--reference",
    default="auto",
    show_default=True,
    help="Compare with: auto (sim when the server is servelab's simulator, else none), none, sim (the "
    "simulator's text), or hf:PATH (transformers on those weights).",
)
@click.option(
    "--reference-python",
    default=None,
    help="Python with torch + transformers for hf:PATH (default: this one, if it has them).",
)
@click.option(
    "--reference-dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="dtype for the transformers reference (auto: the checkpoint's).",
)
@click.option(
    "--known-answers",
    default="auto",
    show_default=True,
    help="auto (the default set when --reference is none), default, none, or a TOML file.",
)
@click.option("--max-tokens", type=int, default=16, show_default=True, help="Greedy tokens per probe.")
@click.option(
    "--repeats", type=int, default=3, show_default=True, help="Lone repeats of the first probe (≥ 2)."
)
@click.option(
    "--concurrency", type=int, default=8, show_default=True, help="Probes sent at once for batch variance."
)
@click.option(
    "--tolerance",
    type=float,
    default=None,
    help="Largest log-prob gap (nats) an engine token may lie below the reference's top (default 0.2).",
)
@click.option(
    "--prompt", "prompts", multiple=True, help="Probe prompt (repeatable; default: built-in probes)."
)
@click.option(
    "--timeout", "timeout_s", type=float, default=120.0, show_default=True, help="Per-request timeout (s)."
)
@click.option(
    "--api-key", envvar="SERVELAB_API_KEY", help="Bearer token (or $SERVELAB_API_KEY); never stored."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the result as JSON (keys in docs/cli/verify.md)."
)
def verify_output_cmd(as_json: bool, **opts: Any) -> None:
    """Greedy probes with a determinism check, garbage heuristics, known answers and a reference.

    Exits 1 when a check fails (warnings do not fail), 2 for bad options."""
    from servelab.verify import verify_output
    from servelab.verify.compare import DEFAULT_TOLERANCE

    result = asyncio.run(
        verify_output(
            opts["url"],
            opts["model"],
            api=opts["api"],
            reference=opts["reference"],
            known_answers=opts["known_answers"],
            api_key=opts["api_key"] or os.environ.get("OPENAI_API_KEY"),
            reference_python=opts["reference_python"],
            reference_dtype=opts["reference_dtype"],
            max_tokens=opts["max_tokens"],
            repeats=opts["repeats"],
            concurrency=opts["concurrency"],
            tolerance=DEFAULT_TOLERANCE if opts["tolerance"] is None else opts["tolerance"],
            prompts=list(opts["prompts"]) or None,
            timeout_s=opts["timeout_s"],
        )
    )
    doc: Verified = redact(result.to_dict())
    emit(doc, as_json, render)
    if not result.ok:
        sys.exit(1)


def render(data: Verified) -> None:
    t = Table(
        "check", "verdict", "detail", title=f"verify-output {data['model']} at {data['url']} ({data['api']})"
    )
    for c in data["checks"]:
        verdict = _MARK["info"] if c["ok"] and c["severity"] != "warning" else _MARK[c["severity"]]
        t.add_row(c["name"], verdict, escape(c["detail"]))
    stdout.print(t)
    for note in data["notes"]:
        stdout.print(f"note: {escape(note)}")
    stdout.print(f"reference: {escape(data['reference'])}; known answers: {escape(data['known_answers'])}")
    if data["ok"]:
        stdout.print(
            "[green]output verified[/green]"
            + (f" with warnings: {', '.join(data['warnings'])}" if data["warnings"] else "")
        )
    else:
        stdout.print(
            f"[red]output check failed:[/red] {', '.join(data['failed'])} (--json shows every answer)"
        )
