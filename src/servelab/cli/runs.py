"""`servelab runs`: list and show stored benchmark runs."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from servelab.cli.bench import render as render_bench
from servelab.cli.output import emit, stdout
from servelab.store import open_store
from servelab.store.bench import BenchRepo


@click.group()
def runs() -> None:
    """Stored benchmark runs."""


@runs.command("list")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def list_runs(limit: int, as_json: bool) -> None:
    """The most recent runs, newest first."""
    with open_store() as store:
        rows = BenchRepo(store).list_runs(limit)
    data = [{k: r[k] for k in ("uid", "created_at", "status", "url", "model", "api", "engine", "dataset_hash")}
            | {"levels": len((r["summary"] or {}).get("levels", []))} for r in rows]

    def render(items: list[dict[str, Any]]) -> None:
        if not items:
            stdout.print("no runs stored yet; `servelab bench --help` shows how to make one")
            return
        t = Table("run", "created", "status", "model", "url", "engine", "levels")
        for r in items:
            t.add_row(r["uid"], r["created_at"][:19], r["status"], r["model"], r["url"], r["engine"] or "-",
                      str(r["levels"]))
        stdout.print(t)

    emit(data, as_json, render)


@runs.command("show")
@click.argument("run", default="last")
@click.option("--json", "as_json", is_flag=True)
def show(run: str, as_json: bool) -> None:
    """One run (uid, id or `last`) with every level, as `servelab bench` printed it."""
    with open_store() as store:
        repo = BenchRepo(store)
        r = repo.resolve(run)
        levels = repo.levels(r["id"])
    data = {
        "run": r["uid"], "status": r["status"], "url": r["url"], "model": r["model"], "api": r["api"],
        "engine": r["engine"], "created_at": r["created_at"], "finished_at": r["finished_at"],
        "workload": r["config"].get("workload_info", {}), "capabilities": r["config"].get("capabilities", {}),
        "config": r["config"], "warnings": r["warnings"],
        "levels": [{"index": lv["idx"], "label": (lv["summary"] or {}).get("label", str(lv["value"])),
                    "status": lv["status"], "summary": lv["summary"], "server_metrics": lv["server_metrics"] or {},
                    "client": lv["client_stats"] or {}} for lv in levels if lv["summary"]],
    }
    emit(data, as_json, render_bench)
