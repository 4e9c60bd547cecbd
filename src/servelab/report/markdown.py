"""The findings document as Markdown, with the plots as SVG files beside it.

Every string that came from a log or a user goes through `text.md` (one line, Markdown and HTML neutral)
or `text.md_code` (a fenced block), so a hostile log line stays text in any Markdown viewer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from servelab.load import in_flight_text
from servelab.report.figures import Figure, figures, run_figures
from servelab.report.model import CandidateReport, CandidateScore, HostReport, NoExplain, StudyReport
from servelab.report.runreport import RunReport
from servelab.report.startup import HEAD as STARTUP_HEAD
from servelab.report.startup import NOTE as STARTUP_NOTE
from servelab.report.startup import report_rows
from servelab.report.text import (
    as_list,
    as_map,
    clock_sentence,
    fmt,
    fmt_level,
    level_digits,
    md,
    md_code,
    md_inline_code,
)

LEVEL_HEAD = (
    "level",
    "ok",
    "failed",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "ITL p50",
    "ITL p99",
    "E2E p50",
    "E2E p99",
    "output tok/s",
    "total tok/s",
    "goodput tok/s",
    "GPU W",
    "J/out tok",
    "$/M out tok",
    "errors",
)


def _table(head: tuple[str, ...] | list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def _value(v: Any) -> str:
    return "-" if v is None else md_inline_code(v) if not isinstance(v, bool) else str(v).lower()


def _pm(value: Any, half: Any, digits: int = 1) -> str:
    return fmt(value, digits) + (f" ± {fmt(half, digits)}" if half is not None else "")


def level_row(lv: Mapping[str, object]) -> list[str]:
    ci = as_map(lv.get("ci"))
    errors = ", ".join(f"{md(k)}: {v}" for k, v in sorted(as_map(lv.get("errors")).items())) or "-"
    return [
        fmt(lv.get("level"), 0) if level_digits(lv.get("level") or 0) == 0 else fmt(lv.get("level"), 2),
        fmt(lv.get("completed"), 0),
        fmt(lv.get("failed"), 0),
        _pm(lv.get("ttft_ms_p50"), ci.get("ttft_ms_p50")),
        fmt(lv.get("ttft_ms_p99")),
        _pm(lv.get("tpot_ms_p50"), ci.get("tpot_ms_p50"), 2),
        fmt(lv.get("tpot_ms_p99"), 2),
        fmt(lv.get("itl_ms_p50"), 2),
        fmt(lv.get("itl_ms_p99"), 2),
        fmt(lv.get("e2e_ms_p50"), 0),
        fmt(lv.get("e2e_ms_p99"), 0),
        _pm(lv.get("output_throughput"), ci.get("output_throughput")),
        fmt(lv.get("total_token_throughput")),
        fmt(lv.get("goodput")),
        fmt(lv.get("gpu_power_w"), 0),
        fmt(lv.get("j_per_output_token"), 3),
        fmt(lv.get("usd_per_m_output_tokens"), 3),
        errors,
    ]


def render(model: StudyReport, assets: str = "report_files", figs: list[Figure] | None = None) -> str:
    """The Markdown text; figures are referenced as `assets/NAME.svg` (see `write`)."""
    figs = figures(model) if figs is None else figs
    st = model.study
    L: list[str] = [f"# Findings: {md(st.name)}", ""]
    if st.description:
        L += [md(st.description), ""]
    L += [
        f"- study `{st.uid}`, {md(st.status)}; started {md(st.created_at)}, finished {md(st.finished_at or '-')}",
        f"- {st.repeats} repeat(s) per candidate, baseline {md(st.baseline or '-')}",
        f"- model {md(st.model)}; engine {md(st.engine.name)}"
        + (f" ({md(st.engine.personality)})" if st.engine.personality else ""),
        f"- load: {md(st.load.mode)} {', '.join(fmt_level(v) for v in st.load.levels)}; workload "
        f"{fmt(st.workload.get('input_len'), 0)} in / {fmt(st.workload.get('output_len'), 0)} out tokens",
        "- SLOs: "
        + ("; ".join(f"{md(s.metric)} {md(s.stat)} ≤ {s.limit:g}" for s in model.slo) or "none")
        + (f"; start-up ≤ {model.max_startup_s:g} s" if model.max_startup_s else ""),
        "",
    ]
    if st.command:
        L += ["Run it again:", "", md_code(st.command), ""]

    L += ["## The winner", ""]
    for t in model.top:
        best = f"**{md(t.best)}**" if t.best else ""
        L.append(f"- **{md(t.head)}**: {best}{md(t.rest)}")
    L.append("")

    if model.search:
        from servelab.report.search import search_lines

        L += ["## The search", ""]
        L += [("- " + md(line.strip())) for line in search_lines(model.search)]
        L += [""]
    L += _host(model.host)
    L += _tried([c for c in model.candidates if c.status != "pruned"])
    L += _performance(model, figs, assets)
    L += _plan(model)
    return "\n".join(L).rstrip("\n") + "\n"


def _host(hst: HostReport) -> list[str]:
    L = ["## Host", ""]
    gpus = f"{fmt(hst.num_gpus)} × {md(hst.gpu or '-')}" + (f" ({md(hst.gpu_name)})" if hst.gpu_name else "")
    rows = [
        ["GPUs", gpus],
        ["interconnect", md(hst.interconnect or "not known")],
        ["engine versions", md(", ".join(hst.engine_versions) or "not reported")],
    ]
    if hst.simulated:
        rows.append(["clock", clock_sentence(hst.clock_speeds)])
    L += _table(("", f"as recorded by {md(hst.source or 'the study')}"), rows)
    if rec := hst.recorded:
        L += ["What each trial's bench run recorded about its server:", ""]
        L += _table(
            ("candidate", "repeat", "run", "engine", "GPUs", "layout", "time base"),
            [
                [
                    md(r.candidate),
                    str(r.repeat + 1),
                    md(r.run),
                    md(r.engine or "-") + (f" ({md(r.personality)})" if r.personality else ""),
                    f"{fmt(r.num_gpus)} × {md(r.gpu or '-')}",
                    md(r.layout or "-"),
                    md(r.time_base),
                ]
                for r in rec
            ],
        )
    here = hst.this_machine
    if here:
        L += (
            [
                f"### The study's host {md(here['host'])} ({md(here.get('hostname') or '?')}), over SSH "
                "when the report was written",
                "",
                f"`servelab doctor` there: {md(here.get('summary') or '')}",
                "",
            ]
            if here.get("host")
            else [
                "### This machine (where the report was written, not the study's host)",
                "",
                f"`servelab doctor` here: {md(here.get('summary') or '')}",
                "",
            ]
        )
        if here.get("checks"):
            L += _table(
                ("check", "status", "finding", "fix"),
                [
                    [
                        md(c.get("name")),
                        md(c.get("status")),
                        md(c.get("detail") or c.get("evidence") or ""),
                        md(c.get("fix") or ""),
                    ]
                    for c in map(as_map, as_list(here["checks"]))
                ],
            )
        if here.get("note"):
            L += [md(here["note"]), ""]
    return L


def _tried(cands: list[CandidateReport]) -> list[str]:
    L = ["## What was tried", ""]
    rows = []
    for c in cands:
        s = c.score or CandidateScore()
        settings = ", ".join(f"{k}={v}" for k, v in c.settings.shown())
        args = " ".join(c.settings.args or [])
        mark = " (winner)" if c.winner else " (baseline)" if c.baseline else ""
        rows.append(
            [
                md(c.label) + mark,
                md(settings) + (" " + md_inline_code(args) if args else ""),
                md(c.outcome),
                fmt(s.value),
                fmt_level(s.level),
                fmt((c.predicted or {}).get("output_throughput"), 0),
            ]
        )
    L += _table(("candidate", "settings", "outcome", "objective", "at level", "predicted tok/s"), rows)
    if starts := report_rows(cands):
        L += ["### Start-up", "", md(STARTUP_NOTE), ""]
        L += _table(STARTUP_HEAD, [[md(r.label), str(r.repeat), *r.cells()] for r in starts])
    for c in cands:
        L += [f"### {md(c.label)}", "", f"Outcome: **{md(c.outcome)}**.", ""]
        s = c.score or CandidateScore()
        if s.why:
            L += [f"Score: {md(s.why)}", ""]
        if c.config:
            L += ["Requested against what the engine runs:", ""]
            L += _table(
                ("setting", "requested", "effective", "applied", "evidence"),
                [
                    [
                        md(r.key),
                        _value(r.requested),
                        _value(r.effective) if r.confirmed else "not shown",
                        "yes" if r.applied else "**NO**",
                        md_inline_code(r.evidence) if r.evidence else "-",
                    ]
                    for r in c.config
                ],
            )
        for m in c.not_applied:
            L += [
                f"- **not applied**: {md(m.key)} requested {_value(m.requested)}, the engine runs "
                f"{_value(m.effective)}"
            ]
        if c.not_applied:
            L.append("")
        d = c.diagnosis
        if d:
            L += [
                f"Diagnosis: **{md(d.get('class'))}**"
                + (f": {md(d.get('message'))}" if d.get("message") else ""),
                "",
            ]
            if d.get("advice"):
                L += [f"Advice: {md(d['advice'])}", ""]
            if d.get("evidence"):
                L += ["Evidence:", "", md_code(d["evidence"]), ""]
        if c.anomalies:
            L += [
                f"- anomaly at level {fmt_level(a.level)}: {md(a.kind)}: {md(a.detail)}" for a in c.anomalies
            ] + [""]
        if c.command:
            L += ["Command:", "", md_code(c.command), ""]
        if c.trials:
            L += _table(
                ("repeat", "status", "engine", "ready s", "bench runs", "teardown", "error"),
                [
                    [
                        str(t.repeat + 1),
                        md(t.status),
                        md(t.engine_version or "-"),
                        fmt(t.ready_s, 1),
                        md(", ".join(t.bench_runs) or "-"),
                        md(t.teardown or "-"),
                        md(t.error or "-"),
                    ]
                    for t in c.trials
                ],
            )
    return L


def _performance(model: StudyReport, figs: list[Figure], assets: str) -> list[str]:
    L = [
        "## Performance",
        "",
        "Latencies in ms, throughputs in tokens per second (± the 95 % confidence "
        "half-width where the study repeated a candidate).",
        "",
    ]
    for f in figs:
        L += [f"![{md(f.title)}]({assets}/{f.name}.svg)", "", f"*{md(f.caption)}*", ""]
    if model.study.price_note:
        L += [md(model.study.price_note), ""]
    for c in model.candidates:
        if not c.levels:
            continue
        L += [f"### {md(c.label)}: every level", ""]
        L += _table(LEVEL_HEAD, [level_row(lv) for lv in c.levels])
    ex = model.explain
    L += ["### Decode step: measured against predicted", ""]
    if isinstance(ex, NoExplain):
        L += [f"Not available: {md(ex.note)}", ""]
        return L
    if ex.caveat:
        L += [f"**Note:** {md(ex.caveat)}", ""]
    L += [f"{md(ex.label)}, level by level (`servelab explain`):", ""]
    L += _table(
        (
            "concurrency",
            "TPOT meas",
            "TPOT pred",
            "TTFT meas",
            "TTFT pred",
            "tok/s meas",
            "tok/s pred",
            "largest gap",
        ),
        [
            [
                in_flight_text(lv.mode, lv.level, lv.concurrency),
                fmt(lv.measured["tpot_ms"], 2),
                fmt(lv.predicted["tpot_ms"], 2),
                fmt(lv.measured["ttft_ms"], 0),
                fmt(lv.predicted["ttft_ms"], 0),
                fmt(lv.measured["output_throughput"], 0),
                fmt(lv.predicted["output_throughput"], 0),
                md(lv.gap),
            ]
            for lv in ex.levels
        ],
    )
    dec = ex.decode
    L += [
        f"Predicted decode step at concurrency {dec.concurrency}: {fmt(dec.predicted_step_ms, 2)} ms "
        f"(TPOT {fmt(dec.predicted_tpot_ms, 2)} ms predicted, {fmt(dec.measured_tpot_ms, 2)} ms measured); "
        f"bottleneck {md(dec.bottleneck)}, allreduce share {fmt((dec.allreduce_share or 0) * 100, 0)} %.",
        "",
    ]
    total = dec.predicted_step_ms or 0.0
    L += _table(
        ("component", "ms", "share"),
        [
            [md(k), fmt(v, 3), f"{v / total:.0%}" if total else "-"]
            for k, v in dec.predicted_breakdown_ms.items()
        ],
    )
    if ex.largest_gap:
        L += [f"Largest gap: {md(ex.largest_gap)}", ""]
    return L


def _plan(model: StudyReport) -> list[str]:
    ps = model.plan_state
    L = ["## The plan", ""]
    for key, title in (
        ("done", "done"),
        ("not_applied", "not applied"),
        ("failed", "failed"),
        ("not_yet_done", "not yet done"),
    ):
        L.append(f"- {title}: " + (", ".join(md(x) for x in ps[key]) or "none"))
    L.append("")
    plan = model.plan
    if plan.available:
        L += [f"Stored plan `{md(plan.name)}`:", ""]
        L += _table(
            ("id", "status", "priority", "item", "evidence"),
            [
                [
                    md(i["id"]),
                    md(i["status"]),
                    md(i["priority"]),
                    md(i["content"]),
                    md(
                        ", ".join(
                            f"{e.get('run') or '-'} ({e.get('status') or '-'})"
                            for e in map(as_map, as_list(i.get("evidence")))
                        )
                        or "-"
                    ),
                ]
                for i in plan.items
            ],
        )
    else:
        L += [f"Stored plan: not available ({md(plan.note)}).", ""]
    return L


def _write_with_figures(path: Path, figs: list[Figure], text: Callable[[str], str]) -> list[Path]:
    """Write the figures into `<stem>_files/` beside `path`, then `text(assets_dir_name)` to `path`;
    returns every file written."""
    assets = path.parent / f"{path.stem}_files"
    assets.mkdir(parents=True, exist_ok=True)
    written = []
    for f in figs:
        p = assets / f"{f.name}.svg"
        p.write_text(f.svg + "\n", encoding="utf-8")
        written.append(p)
    path.write_text(text(assets.name), encoding="utf-8")
    return [path, *written]


def write(model: StudyReport, path: Path) -> list[Path]:
    """Write `path` and its figures into `<stem>_files/` beside it; returns every file written."""
    figs = figures(model)
    return _write_with_figures(path, figs, lambda assets: render(model, assets, figs))


# -- the report of one bench run (`servelab report RUN`) ----------------------------------------------


def run_head_lines(model: RunReport) -> list[tuple[str, str]]:
    """The run's facts as (name, plain text) pairs, one wording for Markdown and HTML."""
    r = model.run
    engine = (r.engine or "-") + (f" ({r.personality})" if r.personality else "")
    gpus = f"{r.num_gpus or '?'} × {r.gpu}" if r.gpu else "not known"
    work = ", ".join(f"{k}={v}" for k, v in r.workload.items()) or "-"
    clock = (
        f"simulated GPU time: the simulator's clock ran {r.clock_speed:g}× faster; every figure and time is "
        "the simulated GPU's"
        if r.clock_speed != 1
        else "wall clock"
    )
    return [
        ("run", f"{r.uid}, {r.status}; started {r.created_at}, finished {r.finished_at or '-'}"),
        ("model", f"{r.model} at {r.url} ({r.api} API)"),
        ("engine", engine),
        ("GPUs", gpus + (f" ({r.layout})" if r.layout else "")),
        ("workload", work),
        ("time base", clock),
    ]


def render_run(model: RunReport, assets: str = "report_files", figs: list[Figure] | None = None) -> str:
    """The run report as Markdown; figures are referenced as `assets/NAME.svg` (see `write_run`)."""
    figs = run_figures(model) if figs is None else figs
    L = [f"# Bench run {md(model.run.uid)}", ""]
    L += [f"- {name}: {md(text)}" for name, text in run_head_lines(model)] + [""]
    if model.run.warnings:
        L += ["Warnings:", ""] + [f"- {md(w)}" for w in model.run.warnings] + [""]
    L += ["## Every level", "", "Latencies in ms, throughputs in tokens per second.", ""]
    L += _table(LEVEL_HEAD, [level_row(lv.model_dump()) for lv in model.levels])
    failures = [(lv, k, ex) for lv in model.levels for k, ex in lv.error_examples.items()]
    if failures:
        L += ["## Failures", "", "Each kind of failure, in the server's own words (one example each):", ""]
        L += [f"- {md(lv.label)}: {md(k)} ×{lv.errors.get(k, 0)}: {md(ex)}" for lv, k, ex in failures] + [""]
    L += ["## Plots", ""]
    for f in figs:
        L += [f"![{md(f.title)}]({assets}/{f.name}.svg)", "", f"*{md(f.caption)}*", ""]
    L += ["## The server over time", ""]
    L += _table(
        ("level", "samples", "interval", "peak waiting", "GPU telemetry"),
        [
            [
                md(t.label),
                str(t.samples),
                fmt(t.series.interval_s, 3),
                fmt(t.peak_waiting, 0),
                md(t.series.gpu_source or "none"),
            ]
            for t in model.timelines
        ],
    )
    return "\n".join(L).rstrip("\n") + "\n"


def write_run(model: RunReport, path: Path) -> list[Path]:
    """Write the run report to `path` and its figures into `<stem>_files/` beside it."""
    figs = run_figures(model)
    return _write_with_figures(path, figs, lambda assets: render_run(model, assets, figs))
