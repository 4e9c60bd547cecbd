"""`servelab tune STUDY.toml`: run a study end to end; `--resume` continues an interrupted one."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from servelab.cli import aio
from servelab.cli.output import emit, stderr, stdout
from servelab.config import load_study
from servelab.store import open_store
from servelab.tune import StudyOutcome, TuneOptions, order_candidates, tune


def _fmt(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


class _Progress:
    """One line per step on stderr: launches, readiness, what was not applied, levels, teardown."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(self, event: str, d: dict[str, Any]) -> None:
        if self.quiet:
            return
        msg = {
            "study_started": lambda: f"study {d['uid']}: {d['candidates']} candidates",
            "study_resumed": lambda: (
                f"resuming study {d['uid']}"
                + (f"; ended {len(d['orphans'])} leftover processes" if d["orphans"] else "")
            ),
            "trial_started": lambda: (
                f"[bold]{escape(d['label'])}[/bold] (repeat {d['repeat'] + 1}): launching"
            ),
            "trial_ready": lambda: f"  ready after {d['ready_s']:.1f} s at {d['url']}",
            "not_applied": lambda: "  [red]NOT APPLIED[/red]: " + escape("; ".join(d["mismatches"])),
            "level_done": lambda: (
                f"  level {d['digest']['level']:g}: {_fmt(d['digest'].get('output_throughput'))} "
                f"tok/s, TPOT p50 {_fmt(d['digest'].get('tpot_ms_p50'), 2)} ms, TTFT p50 "
                f"{_fmt(d['digest'].get('ttft_ms_p50'), 1)} ms, {d['digest'].get('failed', 0)} failed"
                + (" [red](server died)[/red]" if d["digest"].get("died") else "")
            ),
            "plan_warning": lambda: f"  [yellow]plan:[/yellow] {escape(d['message'])}",
            "stopped_early": lambda: f"  [yellow]stopped early[/yellow]: {escape(d['reason'])}",
            "server_died": lambda: f"  [red]server died[/red]: {escape(str(d['diagnosis'].get('class')))}",
            "candidate_skipped": lambda: f"{escape(d['label'])}: already {d['status']}, skipped",
            "trial_finished": lambda: (
                f"  {d['status']}"
                + (
                    f": {escape(str(d['diagnosis'].get('class')))} — {escape(str(d['diagnosis'].get('evidence', ''))[:200])}"
                    if d.get("diagnosis")
                    else ""
                )
            ),
        }.get(event)
        if msg is not None:
            stderr.print(msg())


def render(data: dict[str, Any]) -> None:
    t = Table(
        "candidate",
        "status",
        "predicted tok/s",
        "best level",
        "objective",
        "± 95 %",
        "notes",
        title=f"study {data['study']} ({data['ranking']['objective']})",
    )
    for c in data["candidates"]:
        s = c.get("score") or {}
        notes = []
        for m in c.get("not_applied") or []:
            notes.append(f"not applied: {m['key']} requested {m['requested']} → runs {m['effective']}")
        diag = c.get("diagnosis")
        if diag:
            notes.append(f"{diag.get('class')}: {str(diag.get('advice') or '')[:80]}")
        for a in c.get("anomalies") or []:
            notes.append(f"{a['kind']} at {a['level']:g}")
        if not notes and s.get("why"):
            notes.append(s["why"][:100])
        pred = (c.get("predicted") or {}).get("output_throughput")
        t.add_row(
            escape(c["label"]),
            c["status"],
            _fmt(pred, 0),
            _fmt(s.get("level"), 0),
            _fmt(s.get("value")),
            _fmt(s.get("half_width")),
            escape("; ".join(notes)),
        )
    stdout.print(t)
    stdout.print(escape(data["ranking"]["verdict"]))


async def _main(study: Any, source: str, opts: TuneOptions) -> StudyOutcome:
    with open_store() as store:
        return await tune(study, store, source, opts)


@click.command("tune")
@click.argument("study_file", type=click.Path(dir_okay=False))
@click.option("--resume", is_flag=True, help="Continue the last unfinished run of this study.")
@click.option("--retry-failed", is_flag=True, help="With --resume: try candidates that failed again.")
@click.option(
    "--startup-timeout", type=float, default=None, help="Seconds a server may take to become ready."
)
@click.option(
    "--dry-run", is_flag=True, help="Validate the study and print the candidates in the order they would run."
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@click.option("--json", "as_json", is_flag=True)
def tune_cmd(
    study_file: str,
    resume: bool,
    retry_failed: bool,
    startup_timeout: float | None,
    dry_run: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Launch, verify, benchmark and rank every candidate of STUDY_FILE (see docs/study.md)."""
    study = load_study(study_file)
    if dry_run:
        plan = [
            {"label": c.label(), "predicted": p, "settings": c.model_dump(mode="json")}
            for c, p in order_candidates(study)
        ]

        def show(data: dict[str, Any]) -> None:
            t = Table(
                "#",
                "candidate",
                "predicted tok/s",
                "TPOT ms",
                "note",
                title=f"study {study.study.name}: plan",
            )
            for i, it in enumerate(data["candidates"], 1):
                p = it["predicted"] or {}
                note = "" if p.get("feasible", True) else str(p.get("reason"))
                t.add_row(
                    str(i),
                    escape(it["label"]),
                    _fmt(p.get("output_throughput"), 0),
                    _fmt(p.get("tpot_ms"), 2),
                    escape(note),
                )
            stdout.print(t)

        emit({"study": study.study.name, "candidates": plan}, as_json, show)
        return
    opts = TuneOptions(
        resume=resume,
        retry_failed=retry_failed,
        observe=_Progress(quiet or as_json),
        startup_timeout_s=startup_timeout,
    )
    outcome = aio.run(_main(study, study_file, opts))
    emit(outcome.to_dict(), as_json, render)
