"""`servelab tune STUDY.toml`: run a study end to end; `--resume` continues an interrupted one."""

from __future__ import annotations

import importlib.util
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from servelab import arguments as A
from servelab.cli import aio
from servelab.cli.args import option
from servelab.cli.costs import price_options
from servelab.cli.output import emit, fit_labels, host_option, printable, progress_enabled, stderr, stdout
from servelab.config.loading import load_study
from servelab.engines import registry
from servelab.errors import ConfigError
from servelab.events import (
    CandidateEvent,
    CandidateSkipped,
    Event,
    ExecutorStarted,
    LevelDone,
    LevelFinished,
    LevelsKept,
    LevelStarted,
    NotApplied,
    PlanWarning,
    RequestDone,
    RunFinished,
    SearchPromoted,
    SearchProposed,
    SearchPruned,
    ServerDied,
    StoppedEarly,
    StudyFinished,
    StudyResumed,
    StudyStarted,
    TrialBench,
    TrialFinished,
    TrialLost,
    TrialPlaced,
    TrialReady,
    TrialStarted,
)
from servelab.host import transport
from servelab.store import open_store
from servelab.tune import StudyOutcome, TuneOptions, order_candidates, preflight, tune


def _fmt(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _clock(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class LiveLevel:
    """What the running load level has done so far, from `run_bench`'s events: requests done of the
    total, output tok/s and TTFT p50 so far (in the GPU's time on the simulator, as every figure is shown),
    elapsed since the level's first request was due and the time left at this pace (wall clock: what you
    wait)."""

    def __init__(
        self, candidate: str, level: str, total: int | None, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.candidate, self.level, self.total = candidate, level, total
        self.now = now
        self.t0 = now()
        self.done = 0
        self.failed = 0
        self.tokens = 0
        self.speed = 1.0
        self.ttfts: list[float] = []

    def request_done(self, d: RequestDone) -> None:
        if self.done == 0 and d.end_s is not None:
            # the level's clock starts when its first request was due, not before its warm-up
            self.t0 = self.now() - d.end_s
        self.done = d.done or self.done + 1
        self.speed = d.speed or self.speed
        if not d.ok:
            self.failed += 1
            return
        self.tokens += d.output_tokens or 0
        if d.ttft_s is not None:
            self.ttfts.append(d.ttft_s)

    def text(self) -> str:
        elapsed = self.now() - self.t0
        of = f"/{self.total}" if self.total else ""
        tok_s = self.tokens / (elapsed * self.speed) if elapsed > 0 else None
        ttft = statistics.median(self.ttfts) * 1000 * self.speed if self.ttfts else None
        parts = [
            f"{self.candidate} level {self.level}: {self.done}{of} requests"
            + (f" ({self.failed} failed)" if self.failed else ""),
            f"{_fmt(tok_s, 0)} tok/s",
            f"TTFT p50 {_fmt(ttft)} ms",
            f"{_clock(elapsed)} elapsed",
        ]
        if self.total and 0 < self.done < self.total:
            parts.append(f"ETA {_clock(elapsed * (self.total - self.done) / self.done)}")
        elif self.total and self.done >= self.total:
            parts.append("ETA 0:00")
        return " · ".join(parts)


class _Progress:
    """One line per step on stderr (launches, readiness, what was not applied, levels, teardown), and on
    a terminal a live line while a level runs (`LiveLevel`); `--json` keeps all of it on stderr."""

    def __init__(
        self, quiet: bool, console: Console | None = None, live: bool | None = None, parallel: bool = False
    ) -> None:
        self.quiet = quiet
        self.console = console or stderr
        if live is None:
            live = progress_enabled() if console is None else self.console.is_terminal
        # Trials at once on a cluster: no live line (whose?), and each step's line names its candidate.
        self.live_enabled = live and not quiet and not parallel
        self.parallel = parallel
        self.candidate = ""
        self.level: LiveLevel | None = None
        self.live: Live | None = None
        self.shown: list[str] = []  # every live line drawn (the last of each level stays readable here)

    def _live(self, event: Event) -> None:
        match event:
            case TrialBench(event=LevelStarted() as started):
                self._stop()
                self.level = LiveLevel(self.candidate, started.label, started.num_requests)
                self.live = Live(
                    Text(self.level.text()), console=self.console, transient=True, refresh_per_second=4
                )
                self.live.start()
            case TrialBench(event=RequestDone() as done) if self.level is not None and self.live is not None:
                self.level.request_done(done)
                line = self.level.text()
                last = self.level.total is not None and self.level.done >= self.level.total
                self.live.update(Text(line), refresh=self.level.done == 1 or last)
                if self.level.done == 1 or last or not self.shown or self.shown[-1] != line:
                    self.shown.append(line)
            case TrialBench(event=LevelFinished() | RunFinished()) | TrialFinished() | StudyFinished():
                self._stop()

    def _stop(self) -> None:
        if self.live is not None:
            self.live.stop()
        self.live, self.level = None, None

    def __call__(self, event: Event) -> None:
        if self.quiet:
            return
        if isinstance(event, TrialStarted):
            self.candidate = event.label
        if self.live_enabled:
            self._live(event)
        line = _line(event)
        if line is not None:
            if self.parallel and line.startswith("  ") and isinstance(event, CandidateEvent) and event.label:
                line = f"{escape(event.label)}:{line[1:]}"
            self.console.print(line)


def _line(event: Event) -> str | None:
    """The step's line (rich markup), or None for an event shown only by the live line."""
    match event:
        case StudyStarted(uid=uid, candidates=n, search=search):
            return f"study {uid}: {n} candidates" + (f" listed, then a {search} search" if search else "")
        case SearchProposed(label=label, origin=origin, predicted=predicted):
            return (
                f"search: next {escape(label)} ({origin}"
                + (f", model {_fmt(predicted, 0)}" if predicted is not None else "")
                + ")"
            )
        case SearchPruned(label=label, region=region):
            where = region or {}
            return f"search: [yellow]pruned[/yellow] {escape(label)}: " + _safe(
                str(where.get("kind")) + " where " + str(where.get("where"))
            )
        case SearchPromoted(label=label, rung=rung):
            return f"search: {escape(label)} goes on to rung {rung} (the full levels)"
        case StudyResumed(uid=uid, orphans=orphans):
            return f"resuming study {uid}" + (f"; ended {len(orphans)} leftover processes" if orphans else "")
        case TrialStarted(label=label, repeat=repeat):
            return f"[bold]{escape(label)}[/bold] (repeat {repeat + 1}): launching"
        case LevelsKept(levels=levels):
            return (
                "  keeps level(s) "
                + ", ".join(f"{v:g}" for v in levels)
                + " measured before the interruption"
            )
        case TrialReady(url=url, ready_s=ready_s):
            return f"  ready after {ready_s:.1f} s at {url}"
        case NotApplied(mismatches=mismatches):
            return "  [red]NOT APPLIED[/red]: " + _safe("; ".join(mismatches))
        case LevelDone(digest=d):
            return (
                f"  level {d['level']:g}: {_fmt(d.get('output_throughput'))} "
                f"tok/s, TPOT p50 {_fmt(d.get('tpot_ms_p50'), 2)} ms, TTFT p50 "
                f"{_fmt(d.get('ttft_ms_p50'), 1)} ms, {d.get('failed', 0)} failed"
                + (" [red](server died)[/red]" if d.get("died") else "")
            )
        case PlanWarning(message=message):
            return f"  [yellow]plan:[/yellow] {_safe(message)}"
        case StoppedEarly(reason=reason):
            return f"  [yellow]stopped early[/yellow]: {_safe(reason)}"
        case ServerDied(diagnosis=diagnosis):
            return f"  [red]server died[/red]: {_safe(str(diagnosis.get('class')))}"
        case CandidateSkipped(label=label, status=status):
            return f"{escape(label)}: already {status}, skipped"
        case ExecutorStarted(executor=kind, gpus=gpus, s=s):
            return f"joined the {kind} cluster: {gpus} GPUs, in {s:.1f} s"
        case TrialPlaced(node=node, gpus=gpus):
            return f"  on Ray node {node} (GPUs {','.join(gpus) or '-'})"
        case TrialLost(node=node, error=error, rerun=rerun):
            return f"  [red]node {node} lost[/red]: {_safe(error)}" + (
                "; running it again on another node" if rerun else ""
            )
        case TrialFinished(status=status, diagnosis=diag):
            return f"  {status}" + (
                f": {_safe(str(diag.get('class')))} — {_safe(str(diag.get('evidence', ''))[:200])}"
                if diag
                else ""
            )
    return None


def _safe(text: str) -> str:
    """Evidence and advice quote server logs: no control character reaches the terminal, no markup."""
    return escape(printable(text))


def _notes(c: dict[str, Any]) -> str:
    s = c.get("score") or {}
    notes = []
    for m in c.get("not_applied") or []:
        notes.append(f"not applied: {m['key']} requested {m['requested']} → runs {m['effective']}")
    diag = c.get("diagnosis")
    if diag:
        notes.append(f"{diag.get('class')}: {str(diag.get('advice') or '')[:80]}")
    for a in c.get("anomalies") or []:
        notes.append(f"{a['kind']} at {a['level']:g}")
    if c.get("node_note"):
        notes.append(c["node_note"])
    if not notes and s.get("why"):
        notes.append(s["why"][:100])
    return "; ".join(notes)


def render(data: dict[str, Any], console: Console | None = None) -> None:
    """The ranking table, fitting an 80-column terminal: candidate names whole (or `#N` with a legend
    when one is too long for any column), each candidate's notes in lines below the table."""
    out = console or stdout
    labels = [c["label"] for c in data["candidates"]]
    # the figures need ~52 columns; the names get what is left, at least 24
    shown, legend = fit_labels(labels, max(24, out.width - 52))
    t = Table(title=f"study {data['study']} ({data['ranking']['objective']})")
    t.add_column("candidate", no_wrap=True, min_width=min(max(map(len, shown.values()), default=9), 40))
    t.add_column("status", no_wrap=True)
    t.add_column("predicted tok/s", justify="right", max_width=9)
    t.add_column("level", justify="right")
    t.add_column("objective", justify="right")
    # a capacity's uncertainty is its search's step (it lies in [capacity, capacity + step))
    t.add_column(
        "+ step" if data["ranking"]["objective"] == "capacity" else "± 95 %", justify="right", no_wrap=True
    )
    notes: list[str] = []
    for c in data["candidates"]:
        s = c.get("score") or {}
        pred = (c.get("predicted") or {}).get("output_throughput")
        t.add_row(
            escape(shown[c["label"]]),
            escape(c["status"]),
            _fmt(pred, 0),
            _fmt(s.get("level"), 0),
            _fmt(s.get("value")),
            _fmt(s.get("half_width")),
        )
        if note := _notes(c):
            notes.append(f"{shown[c['label']]}: {note}")
    out.print(t)
    for line in legend:
        out.print(_safe(line))
    for line in notes:
        out.print(_safe(line))
    out.print(_safe(data["ranking"]["verdict"]))
    _render_startup(data["candidates"], shown, out)
    if data.get("search"):
        from servelab.report.search import search_lines

        for line in search_lines(data["search"]):
            out.print(_safe(line))


def _render_startup(cands: Sequence[Mapping[str, object]], shown: dict[str, str], out: Console) -> None:
    """Each trial's start-up, phase by phase (`runs study`: its candidates carry their trials)."""
    from servelab.report.startup import startup_rows

    rows = startup_rows(cands)
    if not rows:
        return
    out.print("start-up, seconds from launch (the engine's own figure for the phase in brackets):")
    for r in rows:
        out.print(_safe("  " + r.sentence(shown.get(r.label, r.label))))


def _show_search_plan(data: dict[str, Any]) -> None:
    s = data["search"]
    size = f"{s['space_size']:,} points" if s.get("space_size") else "a continuous space"
    stdout.print(
        f"study {escape(data['study'])}: {s['strategy']} search over {size}"
        + (f" ({s['feasible']:,} within the constraints)" if s.get("feasible") is not None else "")
        + f", budget {s['budget']}"
    )
    for c in data["candidates"]:
        stdout.print(f"  listed first: {escape(c['label'])}")
    t = Table("#", "candidate", "model's objective", title="the model's best points (tried first)")
    for i, it in enumerate(s["first"], 1):
        t.add_row(str(i), escape(it["label"]), _fmt(it["predicted"], 1))
    stdout.print(t)
    for note in data.get("flags", ()):
        stdout.print(escape(note))


def _check_ray(target: str | None, address: str | None) -> None:
    """What the real run would refuse before it starts, refused by the dry run too."""
    if target is not None:
        raise ConfigError(
            "the ray executor places trials on the cluster's nodes; --host / [host] ssh names one box",
            hint="drop one of the two",
        )
    if (
        address is not None
        and address != "auto"
        and not re.fullmatch(r"(ray://)?[A-Za-z0-9_.\[\]:-]+:\d+", address)
    ):
        raise ConfigError(
            f"invalid Ray address {address!r}",
            hint="give the head as HOST:PORT, e.g. 10.0.0.1:6379, or 'auto'",
        )
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "the ray executor needs Ray, which is not installed here",
            hint="pip install 'servelab[ray]' (the same Ray version as the cluster's)",
        )


def _dry_preflight(study: Any, target: str | None, kind: str) -> list[str]:
    """The real run's preflight, engine flags read where the servers would run (an SSH host is only
    reached when its engine's flags must be read there)."""
    host = (
        transport.SshHost(
            transport.SshTarget.parse(target), python=study.host.python, workdir=study.host.workdir
        )
        if target is not None
        else None
    )
    try:
        return preflight(study, registry.get(study.engine.name), host, reachable=kind != "ray")
    finally:
        if host is not None:
            host.close()


async def _main(study: Any, source: str, opts: TuneOptions) -> StudyOutcome:
    with open_store() as store:
        return await tune(study, store, source, opts)


@click.command("tune")
@option(A.TuneStudyFile, type=click.Path(dir_okay=False))
@click.option("--resume", is_flag=True, help="Continue the last unfinished run of this study.")
@option(A.RetryFailed)
@click.option(
    "--startup-timeout", type=float, default=None, help="Seconds a server may take to become ready."
)
@click.option(
    "--dry-run", is_flag=True, help="Validate the study and print the candidates in the order they would run."
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@host_option
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where trials run: this machine or --host (local), or a Ray cluster's nodes (ray). "
    "Default: the study's [executor] kind.",
)
@click.option(
    "--ray-address",
    default=None,
    metavar="HOST:PORT",
    help="The Ray cluster's head (default: [executor] address, $RAY_ADDRESS, else 'auto').",
)
@price_options
@click.option("--json", "as_json", is_flag=True)
def tune_cmd(
    study_file: str,
    resume: bool,
    retry_failed: bool,
    startup_timeout: float | None,
    dry_run: bool,
    quiet: bool,
    host: str | None,
    executor: str | None,
    ray_address: str | None,
    gpu_hour_usd: float | None,
    kwh_usd: float | None,
    as_json: bool,
) -> None:
    """Launch, verify, benchmark and rank every candidate of STUDY_FILE (see docs/study.md)."""
    study = load_study(study_file).priced(gpu_hour_usd, kwh_usd)
    target = transport.target_of(host, study.host.ssh)
    if target is not None:
        transport.SshTarget.parse(target)  # a bad --host fails the dry run as it would the real one
    kind = executor or study.executor.kind
    if kind == "ray":
        _check_ray(target, ray_address or study.executor.address)
    if dry_run:
        flag_notes = _dry_preflight(study, target, kind)
        plan = [
            {"label": c.label(), "predicted": p, "settings": c.model_dump(mode="json")}
            for c, p in (order_candidates(study) if study.candidates else [])
        ]
        if study.adaptive:
            from servelab.search.driver import dry_run_view

            search = dry_run_view(study)
            emit(
                {"study": study.study.name, "candidates": plan, "search": search, "flags": flag_notes},
                as_json,
                _show_search_plan,
            )
            return

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
            for note in data["flags"]:
                stdout.print(escape(note))

        emit({"study": study.study.name, "candidates": plan, "flags": flag_notes}, as_json, show)
        return
    opts = TuneOptions(
        resume=resume,
        retry_failed=retry_failed,
        observe=_Progress(quiet, parallel=kind == "ray"),
        startup_timeout_s=startup_timeout,
        host=host,
        executor=executor,
        ray_address=ray_address,
    )
    outcome = aio.run(_main(study, study_file, opts))
    emit(outcome.to_dict(), as_json, render)
