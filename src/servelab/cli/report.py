"""`servelab report STUDY` (the findings document of a study) or `servelab report RUN` (the report of one
bench run), as self-contained HTML and/or Markdown, or the report model as JSON."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from servelab import arguments as A
from servelab.cli.args import option
from servelab.cli.output import emit, host_option, stdout, write_out
from servelab.cli.remote import open_cli_host, remote_python_option
from servelab.errors import NotFoundError, UserError
from servelab.host import transport
from servelab.redact import redact
from servelab.store import open_store
from servelab.store.bench import BenchRepo
from servelab.store.db import Store
from servelab.store.studies import StudyRepo


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"cannot write {path}: {exc.strerror or exc}",
            hint="choose a file in a directory you can write to",
        ) from exc


def _remote_facts(target: str, remote_python: str | None, spec_host: dict[str, Any]) -> dict[str, Any] | None:
    """`servelab doctor`'s findings on the SSH host `target`, gathered there by its agent."""
    from servelab.host.agent_op import NoArgs
    from servelab.report.host import HOST_FACTS

    h = open_cli_host(
        target, remote_python, study_python=spec_host.get("python"), workdir=spec_host.get("workdir")
    )
    try:
        facts = HOST_FACTS.call(h, NoArgs())
    finally:
        h.close()
    return None if facts is None else {**facts.model_dump(exclude_unset=True), "host": target}


def is_run(store: Store, ref: str, run_flag: bool) -> bool:
    """Whether REF names a bench run rather than a study. `--run`: always. Else only a run's uid (`b-…`, or
    a unique prefix of one) that names no study too: `last` and numeric ids stay the study's, as before,
    and a study named like a run's uid is refused as ambiguous rather than guessed."""
    if run_flag:
        return True
    if ref == "last" or ref.isdigit() or not ref.startswith("b-"):
        return False
    try:
        BenchRepo(store).load(ref)
    except NotFoundError:
        try:
            StudyRepo(store).resolve(ref)
        except NotFoundError:
            raise NotFoundError(
                f"no bench run or study {ref!r} in the store",
                hint="`servelab runs list` lists the bench runs, `servelab runs` the studies.",
            ) from None
        return False
    try:
        StudyRepo(store).resolve(ref)
    except NotFoundError:
        return True
    raise UserError(
        f"{ref!r} names both a study and a bench run",
        hint=f"`servelab report --run {ref}` reports the run; the study's uid (`servelab runs`) reports the study",
    )


def _write_all(
    html_file: Path | None,
    md_file: Path | None,
    html_text: Callable[[], str],
    md_write: Callable[[Path], list[Path]],
) -> list[str]:
    """Each file asked for, written; a place that cannot be written is exit 2, naming it."""
    written: list[str] = []
    if html_file is not None:
        _write(html_file, html_text())
        written.append(str(html_file))
    if md_file is not None:
        try:
            written += [str(p) for p in md_write(md_file)]
        except OSError as exc:
            raise UserError(
                f"cannot write {md_file}: {exc.strerror or exc}",
                hint="choose a file in a directory you can write to",
            ) from exc
    return written


def _run_report(store: Store, ref: str, html_file: Path | None, md_file: Path | None, as_json: bool) -> None:
    from servelab.report import html as html_report
    from servelab.report import markdown as md_report
    from servelab.report.runreport import RunReport, load

    # what the files and JSON publish carries no secret (the stored URL and warnings are redacted too)
    model = RunReport.model_validate(redact(load(store, ref).to_json()))
    written = _write_all(
        html_file,
        md_file,
        lambda: html_report.render_run(model),
        lambda path: md_report.write_run(model, path),
    )
    if as_json:
        emit({**model.to_json(), "written": written}, True)
    elif not written:
        write_out(md_report.render_run(model))
    else:
        for p in written:
            stdout.print(f"wrote {escape(p)}")


@click.command("report")
@option(A.ReportStudy, default="last", metavar="[STUDY|RUN]")
@click.option(
    "--run",
    "run_flag",
    is_flag=True,
    help="The argument is a bench run (uid, id or `last`): report that run. A run's uid (b-…) is "
    "recognised without it.",
)
@option(A.ReportHtml, "html_file", type=click.Path(dir_okay=False, path_type=Path), default=None)
@option(A.ReportMd, "md_file", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--host-checks/--no-host-checks",
    default=None,
    help="Add `servelab doctor`'s findings on the study's host when it ran over SSH ([host] ssh, or "
    "--host), else on this machine  [default: on with --host, else off].",
)
@host_option
@remote_python_option
@click.option("--json", "as_json", is_flag=True, help="The report model as JSON (see docs/cli/report.md).")
def report(
    study: str,
    run_flag: bool,
    html_file: Path | None,
    md_file: Path | None,
    host_checks: bool | None,
    host: str | None,
    remote_python: str | None,
    as_json: bool,
) -> None:
    """The findings of STUDY (uid, name or `last`): host, every candidate tried, performance at every load level
    with plots, the decode step measured against predicted, the winner and why, and the plan's state.

    RUN (a bench run's uid `b-…`, or any run with --run): the report of that run: every level, throughput
    and latency against load, TTFT and TPOT CDFs, and the server's telemetry over time beside the
    client's throughput and latency.

    Without --html or --md the Markdown goes to stdout."""
    from servelab.report import data
    from servelab.report import html as html_report
    from servelab.report import markdown as md_report
    from servelab.report.host import gather

    with open_store() as store:
        if is_run(store, study, run_flag):
            _run_report(store, study, html_file, md_file, as_json)
            return
        found = StudyRepo(store).resolve(study).spec.get("host")
        spec_host = found if isinstance(found, dict) else {}
        target = transport.target_of(host, ssh if isinstance(ssh := spec_host.get("ssh"), str) else None)
        facts: dict[str, Any] | None = None
        if host_checks if host_checks is not None else host is not None:
            facts = gather() if target is None else _remote_facts(target, remote_python, spec_host)
        model = data.load(store, study, host=facts).redacted()  # what the files and JSON publish: no secret
    written = _write_all(
        html_file, md_file, lambda: html_report.render(model), lambda path: md_report.write(model, path)
    )
    if as_json:
        emit({**model.to_json(), "written": written}, True)
        return
    if not written:
        write_out(md_report.render(model))
        return

    def show(d: dict[str, Any]) -> None:
        for p in d["written"]:
            stdout.print(f"wrote {escape(p)}")
        stdout.print(escape(d["winner"]["why"] or ""))

    emit({**model.to_json(), "written": written}, False, show)
