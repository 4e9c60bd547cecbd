"""Studies: `tune_start`, `tune_resume` start a child `servelab tune` (studies.py) and return at once,
`tune_progress` reads the store, `tune_stop` SIGINTs a child; `report` runs `servelab report`; a study's
report as a resource."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context
from pydantic import Field

from servelab import arguments as A
from servelab.errors import ServelabError
from servelab.mcp import models as M
from servelab.mcp.base import (
    Group,
    Options,
    Resource,
    as_tool_errors,
    call,
    flags,
    run_cli,
    tool_error,
    typed,
)
from servelab.mcp.progress import progress
from servelab.mcp.studies import Child, Studies
from servelab.paths import data_home


async def report(
    study: A.ReportStudy = "last",
    html: A.ReportHtml = None,
    md: A.ReportMd = None,
) -> M.ReportView:
    """Write a study's findings report (HTML and Markdown; default: under $SERVELAB_HOME/reports/)."""
    if html is None and md is None:
        from servelab.store import open_store
        from servelab.store.studies import StudyRepo

        with as_tool_errors(), open_store() as store:
            uid = str(StudyRepo(store).resolve(study).uid)
        where = data_home() / "reports" / uid
        html, md = str(where / "report.html"), str(where / "report.md")
    return await call(M.ReportView, ["report", study, *flags(html=html, md=md)])


async def report_resource(ref: str) -> str:
    """The latest report of a study (`last` for the newest), as Markdown."""
    return await anyio.to_thread.run_sync(lambda: _report_markdown(ref))


def _started(child: Child) -> M.TuneStarted:
    return typed(
        M.TuneStarted,
        {
            "study": child.study,
            "name": child.name,
            "pid": child.proc.pid,
            "log": str(child.log),
            "source": child.source,
        },
    )


def _report_markdown(ref: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        md = Path(tmp) / "report.md"
        try:
            run_cli(["report", ref, "--md", str(md)])
        except ServelabError as exc:
            raise tool_error(exc) from None
        return md.read_text()


def group(opts: Options, runs: Studies) -> Group:
    async def tune_start(
        study_file: A.TuneStudyFile,
    ) -> M.TuneStarted:
        """Start a study in the background (a `servelab tune` process holding its lease); returns its id
        at once. Poll `tune_progress`."""
        with as_tool_errors():
            child = await anyio.to_thread.run_sync(lambda: runs.start(study_file))
        return _started(child)

    async def tune_progress(study: A.StudyRef, ctx: Context) -> M.TuneProgress:
        """What runs now, trials and levels done, the ETA and what was found so far (read from the store)."""
        from servelab.store import open_store

        with as_tool_errors(), open_store() as store:
            got = progress(store, study)
        mine = runs.children.get(got.study)
        if mine is not None:
            got.exit_code = mine.exit_code()
        if got.levels_total:
            await ctx.report_progress(
                got.levels_done, got.levels_total, f"{got.status}: {got.trials_done} trial(s)"
            )
        return typed(M.TuneProgress, got)

    async def tune_stop(study: A.StudyRef) -> M.TuneStopped:
        """Stop a study this server started: SIGINT, its own clean teardown; what finished is stored and
        `tune_resume` continues it."""
        from servelab.store import open_store
        from servelab.store.studies import StudyRepo

        with as_tool_errors():
            with open_store() as store:
                uid = str(StudyRepo(store).resolve(study).uid)
            child = await anyio.to_thread.run_sync(lambda: runs.stop(uid))
            with open_store() as store:
                st = StudyRepo(store).resolve(uid)
        return typed(
            M.TuneStopped,
            {
                "study": uid,
                "pid": child.proc.pid,
                "exit_code": child.exit_code(),
                "status": st.status,
            },
        )

    async def tune_resume(
        study: A.StudyRef,
        study_file: Annotated[
            str | None, Field(description="Default: the file the study was run from.")
        ] = None,
        retry_failed: A.RetryFailed = False,
    ) -> M.TuneStarted:
        """Continue an interrupted study in the background (`servelab tune --resume`)."""
        from servelab.store import open_store
        from servelab.store.studies import StudyRepo

        with as_tool_errors():
            with open_store() as store:
                st = StudyRepo(store).resolve(study)
            source = str(Path(study_file).expanduser().resolve()) if study_file else str(st.source or "")
            child = await anyio.to_thread.run_sync(lambda: runs.resume(st.uid, source, st.name, retry_failed))
        return _started(child)

    return Group(
        [tune_start, tune_progress, tune_stop, tune_resume, report],
        [Resource("servelab://studies/{ref}/report", "text/markdown", report_resource)],
    )
