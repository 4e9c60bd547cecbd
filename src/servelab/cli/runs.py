"""`servelab runs`: list and show stored benchmark runs."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servelab import arguments as A
from servelab.bench import export as request_export
from servelab.cli.args import option
from servelab.cli.bench import export_requests
from servelab.cli.bench import render as render_bench
from servelab.cli.output import emit, fit_labels, stdout
from servelab.store import open_store
from servelab.store.bench import BenchRepo
from servelab.store.studies import StoredStudy, StudyRepo

# SQLite's LIMIT is a 64-bit integer; anything near it means "all" and past it is an OverflowError.
LIMIT_MAX = 1 << 62


def _study_rows(repo: StudyRepo, studies: list[StoredStudy]) -> list[dict[str, Any]]:
    out = []
    for st in studies:
        cands = repo.candidates(st.id)
        ranking = r if isinstance(r := (st.result or {}).get("ranking"), dict) else {}
        out.append(
            {
                "uid": st.uid,
                "name": st.name,
                "created_at": st.created_at,
                "status": st.status,
                "source": st.source,
                "winner": ranking.get("winner"),
                "verdict": ranking.get("verdict"),
                "candidates": [
                    {
                        "label": c.label,
                        "status": c.status,
                        "score": sc.get("value")
                        if isinstance(sc := (c.outcome or {}).get("score"), dict)
                        else None,
                        "level": sc.get("level")
                        if isinstance(sc := (c.outcome or {}).get("score"), dict)
                        else None,
                        "trials": len(repo.trials(c.id)),
                    }
                    for c in cands
                ],
            }
        )
    return out


def _render_studies(items: list[dict[str, Any]], console: Console | None = None) -> None:
    """Studies and their candidates: fits an 80-column terminal, candidate names whole (`#N` with a
    legend when a name is too long); the study's uid, name, status and start share its first cell."""
    out = console or stdout
    if not items:
        out.print("no studies stored yet; `servelab tune STUDY.toml` runs one (examples/ has studies)")
        return
    labels = [c["label"] for st in items for c in st["candidates"]]
    shown, legend = fit_labels(labels, max(24, out.width - 56))
    t = Table()
    t.add_column("study", overflow="fold", min_width=12)
    t.add_column("candidate", no_wrap=True, min_width=min(max(map(len, shown.values()), default=9), 40))
    t.add_column("outcome", min_width=8)
    t.add_column("objective", justify="right")
    t.add_column("level", justify="right")
    for st in items:
        cands = st["candidates"] or [{"label": "-", "status": "-", "score": None, "level": None}]
        head = [st["uid"], st["name"], st["status"], st["created_at"][:16].replace("T", " ")]
        for i, c in enumerate(cands):
            mark = " (winner)" if c["label"] == st["winner"] else ""
            t.add_row(
                escape("\n".join(head) if i == 0 else ""),
                escape(shown.get(c["label"], c["label"])),
                escape(c["status"] + mark),
                "-" if c["score"] is None else f"{c['score']:,.1f}",
                "-" if c["level"] is None else f"{c['level']:g}",
                end_section=i == len(cands) - 1,
            )
    out.print(t)
    for line in legend:
        out.print(escape(line))


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Studies with their candidates and outcomes, as JSON.")
@click.option("--limit", type=click.IntRange(min=1, max=LIMIT_MAX), default=20, show_default=True)
@click.pass_context
def runs(ctx: click.Context, as_json: bool, limit: int) -> None:
    """Stored studies (with candidates and outcomes) and benchmark runs.

    Without a subcommand: the studies, newest first, each candidate with its outcome."""
    if ctx.invoked_subcommand is not None:
        return
    with open_store() as store:
        repo = StudyRepo(store)
        data = _study_rows(repo, repo.list_studies(limit))
    emit({"studies": data}, as_json, lambda d: _render_studies(d["studies"]))


@runs.command("study")
@click.argument("ref", default="last")
@click.option("--json", "as_json", is_flag=True)
def study(ref: str, as_json: bool) -> None:
    """One study (uid, name or `last`): every candidate, its trials, requested vs effective, outcome."""
    from servelab.cli.tune import render as render_study

    with open_store() as store:
        repo = StudyRepo(store)
        st = repo.resolve(ref)
        cands = []
        for c in repo.candidates(st.id):
            trials = repo.trials(c.id)
            cands.append(
                {
                    "label": c.label,
                    "status": c.status,
                    "predicted": c.predicted,
                    "spec": c.spec,
                    **(c.outcome or {}),
                    "trials": [t.model_dump(mode="json") for t in trials],
                }
            )
    result = st.result or {}
    data = {
        "study": st.uid,
        "name": st.name,
        "status": st.status,
        "source": st.source,
        "created_at": st.created_at,
        "finished_at": st.finished_at,
        "candidates": cands,
        "ranking": result.get("ranking")
        or {"objective": st.spec.get("objective"), "verdict": f"study {st.status}; no ranking yet"},
        "baseline": result.get("baseline"),
    }
    emit(data, as_json, render_study)


@runs.command("list")
@click.option("--limit", type=click.IntRange(min=1, max=LIMIT_MAX), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def list_runs(limit: int, as_json: bool) -> None:
    """The most recent runs, newest first."""
    with open_store() as store:
        rows = BenchRepo(store).list_runs(limit)
    data = [
        {
            "uid": r.uid,
            "created_at": r.created_at,
            "status": r.status,
            "url": r.url,
            "model": r.model,
            "api": r.api,
            "engine": r.engine,
            "dataset_hash": r.workload.dataset_hash,
            "levels": len(r.levels),
            "time_base": r.clock.time_base,
        }
        for r in rows
    ]

    def render(items: list[dict[str, Any]]) -> None:
        if not items:
            stdout.print("no runs stored yet; `servelab bench --help` shows how to make one")
            return
        t = Table("run", "created", "status", "model", "url", "engine", "levels")
        for r in items:
            t.add_row(
                r["uid"],
                r["created_at"][:19],
                r["status"],
                r["model"],
                r["url"],
                r["engine"] or "-",
                str(r["levels"]),
            )
        stdout.print(t)

    emit(data, as_json, render)


@runs.command("show")
@option(A.BenchRun, default="last")
@click.option(
    "--export-requests",
    "export_requests_to",
    type=click.Path(dir_okay=False),
    help="Also write the run's requests, one row each, to FILE.jsonl or FILE.csv (format by extension).",
)
@click.option("--json", "as_json", is_flag=True)
def show(run: str, export_requests_to: str | None, as_json: bool) -> None:
    """One run (uid, id or `last`) with every level, as `servelab bench` printed it."""
    out = request_export.check_path(export_requests_to) if export_requests_to else None
    with open_store() as store:
        data = BenchRepo(store).load(run).to_json()
    if out is not None:
        export_requests(str(data["run"]), *out)
    emit(data, as_json, render_bench)
