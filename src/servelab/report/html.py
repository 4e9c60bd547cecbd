"""The findings document as one self-contained HTML file: inline CSS and SVG, no external URL, a
Content-Security-Policy that forbids fetching anything. Every stored string goes through `text.h`
(ANSI stripped, HTML escaped). The section builders are reused by the web UI (`servelab ui`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servelab.load import in_flight_text, kind_of
from servelab.report.figures import Figure, figures, run_figures
from servelab.report.markdown import LEVEL_HEAD, run_head_lines
from servelab.report.model import (
    CandidateReport,
    CandidateScore,
    Explained,
    HostReport,
    NoExplain,
    PlanView,
    StudyReport,
)
from servelab.report.runreport import RunReport
from servelab.report.startup import HEAD as STARTUP_HEAD
from servelab.report.startup import NOTE as STARTUP_NOTE
from servelab.report.startup import report_rows
from servelab.report.text import as_list, as_map, clock_sentence, fmt, fmt_level, h, level_digits

CSS = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
th{background:#f4f4f4}code,pre{font-family:ui-monospace,monospace;font-size:12px}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
.status-measured{color:#067d17}.status-anomalous{color:#b35c00}.status-not_applied,.status-failed{color:#c00}
.bad{color:#c00;font-weight:bold}.note{color:#555}.figs{display:flex;flex-wrap:wrap;gap:1em}
figure{margin:0;flex:1 1 520px;max-width:640px}figure svg{width:100%;height:auto}
figcaption{font-size:12px;color:#555}details summary{cursor:pointer;color:#555}
.evidence{max-width:420px;word-break:break-all}nav a{margin-right:1em}
.cols{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:1em}.cols>div{overflow-x:auto}
"""
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'unsafe-inline'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'"
)


def page(title: str, body: str, script: str = "", nav: str = "") -> str:
    """A complete document; nothing in it refers to anything outside it."""
    js = f"<script>{script}</script>" if script else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{h(title)}</title><style>{CSS}</style></head>\n<body>{nav}\n{body}\n{js}</body></html>\n"
    )


def table(
    head: list[str] | tuple[str, ...],
    rows: list[list[str]],
    cls: str = "",
    num_from: int = 99,
    attrs: str = "",
) -> str:
    """Cells are already-escaped HTML; columns from `num_from` on are right-aligned numbers."""
    th = "".join(
        f'<th class="num">{c}</th>' if i >= num_from else f"<th>{c}</th>" for i, c in enumerate(head)
    )
    out = [f'<table class="{cls}"{attrs}><thead><tr>{th}</tr></thead><tbody>']
    for r in rows:
        out.append("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>")
    return "".join(out) + "</tbody></table>"


def num(value: Any, digits: int = 1, key: str = "", half: Any = None) -> str:
    """A number cell that keeps the stored value in data-value (what tests and scripts compare)."""
    shown = fmt(value, digits) + (f" ± {fmt(half, digits)}" if half is not None else "")
    data = "" if value is None or isinstance(value, bool) else f' data-value="{value!r}"'
    k = f' data-key="{h(key)}"' if key else ""
    return f'<td class="num"{k}{data}>{h(shown)}</td>'


def level_rows(levels: Sequence[Mapping[str, object]]) -> list[list[str]]:
    rows = []
    for lv in levels:
        ci = as_map(lv.get("ci"))
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(as_map(lv.get("errors")).items())) or "-"
        rows.append(
            [
                num(lv.get("level"), level_digits(lv.get("level") or 0), "level"),
                num(lv.get("completed"), 0, "completed"),
                num(lv.get("failed"), 0, "failed"),
                num(lv.get("ttft_ms_p50"), 1, "ttft_ms_p50", ci.get("ttft_ms_p50")),
                num(lv.get("ttft_ms_p99"), 1, "ttft_ms_p99"),
                num(lv.get("tpot_ms_p50"), 2, "tpot_ms_p50", ci.get("tpot_ms_p50")),
                num(lv.get("tpot_ms_p99"), 2, "tpot_ms_p99"),
                num(lv.get("itl_ms_p50"), 2, "itl_ms_p50"),
                num(lv.get("itl_ms_p99"), 2, "itl_ms_p99"),
                num(lv.get("e2e_ms_p50"), 0, "e2e_ms_p50"),
                num(lv.get("e2e_ms_p99"), 0, "e2e_ms_p99"),
                num(lv.get("output_throughput"), 1, "output_throughput", ci.get("output_throughput")),
                num(lv.get("total_token_throughput"), 1, "total_token_throughput"),
                num(lv.get("goodput"), 1, "goodput"),
                num(lv.get("gpu_power_w"), 0, "gpu_power_w"),
                num(lv.get("j_per_output_token"), 3, "j_per_output_token"),
                num(lv.get("usd_per_m_output_tokens"), 3, "usd_per_m_output_tokens"),
                h(errors),
            ]
        )
    return rows


def levels_table(label: str, levels: Sequence[Mapping[str, object]]) -> str:
    return table(LEVEL_HEAD, level_rows(levels), "levels", 1, f' data-candidate="{h(label)}"')


def _v(value: Any) -> str:
    return "-" if value is None else f"<code>{h(value)}</code>"


def summary_section(model: StudyReport) -> str:
    st = model.study
    slo = "; ".join(f"{h(s.metric)} {h(s.stat)} ≤ {s.limit:g}" for s in model.slo) or "none"
    if model.max_startup_s:
        slo += f"; start-up ≤ {model.max_startup_s:g} s"
    out = [
        f"<h1>Findings: {h(st.name)}</h1>",
        f'<p class="note">{h(st.description)}</p>' if st.description else "",
        "<ul>",
        f"<li>study <code>{h(st.uid)}</code>, {h(st.status)}; started {h(st.created_at)}, finished "
        f"{h(st.finished_at or '-')}</li>",
        f"<li>{h(st.repeats)} repeat(s) per candidate, baseline {h(st.baseline or '-')}</li>",
        f"<li>model {h(st.model)}; engine {h(st.engine.name)} {h(st.engine.personality or '')}</li>",
        f"<li>load: {h(st.load.mode)} {h(', '.join(fmt_level(v) for v in st.load.levels))}; workload "
        f"{fmt(st.workload.get('input_len'), 0)} in / {fmt(st.workload.get('output_len'), 0)} out tokens"
        "</li>",
        f"<li>SLOs: {slo}</li></ul>",
    ]
    if st.command:
        out.append(f"<p>Run it again:</p><pre>{h(st.command)}</pre>")
    out.append('<h2 id="winner">The winner</h2>')
    out.append('<ul class="top">')
    for t in model.top:
        cls = ' class="winner"' if t.winner else ""
        best = f"<strong{cls}>{h(t.best)}</strong>" if t.best else ""
        out.append(f"<li><strong>{h(t.head)}</strong>: {best}{h(t.rest)}</li>")
    out.append("</ul>")
    return "\n".join(out)


def host_section(hst: HostReport) -> str:
    rows = [
        ["GPUs", f"{fmt(hst.num_gpus)} × {h(hst.gpu or '-')} {h(hst.gpu_name or '')}"],
        ["interconnect", h(hst.interconnect or "not known")],
        ["engine versions", h(", ".join(hst.engine_versions) or "not reported")],
    ]
    if hst.simulated:
        rows.append(["clock", h(clock_sentence(hst.clock_speeds))])
    out = [
        '<h2 id="host">Host</h2>',
        table(["", f"as recorded by {h(hst.source or 'the study')}"], rows, "host"),
    ]
    rec = hst.recorded
    if rec:
        out.append("<p>What each trial's bench run recorded about its server:</p>")
        out.append(
            table(
                ["candidate", "repeat", "run", "engine", "GPUs", "layout", "time base"],
                [
                    [
                        h(r.candidate),
                        str(r.repeat + 1),
                        h(r.run),
                        h(r.engine or "-") + (f" ({h(r.personality)})" if r.personality else ""),
                        f"{fmt(r.num_gpus)} × {h(r.gpu or '-')}",
                        h(r.layout or "-"),
                        h(r.time_base),
                    ]
                    for r in rec
                ],
                "host-runs",
            )
        )
    here = hst.this_machine
    if not here:
        return "\n".join(out)
    if here.get("host"):
        out.append(
            f'<h3 id="this-machine">The study\'s host {h(here["host"])} ({h(here.get("hostname") or "?")}), '
            "over SSH when the report was written</h3>"
            f"<p><code>servelab doctor</code> there: {h(here.get('summary') or '')}</p>"
        )
    else:
        out.append(
            '<h3 id="this-machine">This machine (where the report was written, not the study\'s host)</h3>'
            f"<p><code>servelab doctor</code> here: {h(here.get('summary') or '')}</p>"
        )
    if here.get("checks"):
        out.append(
            table(
                ["check", "status", "finding", "fix"],
                [
                    [
                        h(c.get("name")),
                        h(c.get("status")),
                        h(c.get("detail") or c.get("evidence") or ""),
                        h(c.get("fix") or ""),
                    ]
                    for c in map(as_map, as_list(here["checks"]))
                ],
                "doctor",
            )
        )
    if here.get("note"):
        out.append(f'<p class="note">{h(here["note"])}</p>')
    return "\n".join(out)


def candidate_detail(c: CandidateReport, ui: bool = False) -> str:
    """One candidate; in the web UI (`ui`) bench-run ids link to their pages."""
    out = [
        f'<h3 id="cand-{h(c.label)}">{h(c.label)}</h3>',
        f'<p>Outcome: <strong class="status-{h(c.status)}">{h(c.outcome)}</strong></p>',
    ]
    s = c.score or CandidateScore()
    if s.why:
        out.append(f'<p class="note">Score: {h(s.why)}</p>')
    if c.config:
        out.append(
            table(
                ["setting", "requested", "effective", "applied", "evidence"],
                [
                    [
                        h(r.key),
                        _v(r.requested),
                        _v(r.effective) if r.confirmed else "not shown",
                        "yes" if r.applied else '<span class="bad">NO</span>',
                        f'<td class="evidence"><details><summary>log line</summary><code>{h(r.evidence)}</code></details></td>'
                        if r.evidence
                        else "-",
                    ]
                    for r in c.config
                ],
                "config",
            )
        )
    for m in c.not_applied:
        out.append(
            f'<p class="bad">not applied: {h(m.key)} requested {_v(m.requested)}, the engine '
            f"runs {_v(m.effective)}</p>"
        )
    d = c.diagnosis
    if d:
        out.append(
            f'<p>Diagnosis: <strong class="bad">{h(d.get("class"))}</strong>'
            + (f": {h(d.get('message'))}" if d.get("message") else "")
            + "</p>"
        )
        if d.get("advice"):
            out.append(f"<p>Advice: {h(d['advice'])}</p>")
        if d.get("evidence"):
            out.append(f'<pre class="evidence-log">{h(d["evidence"])}</pre>')
    if c.anomalies:
        out.append(
            "<ul>"
            + "".join(
                f'<li class="anomaly">anomaly at level {fmt_level(a.level)}: {h(a.kind)}: {h(a.detail)}</li>'
                for a in c.anomalies
            )
            + "</ul>"
        )
    if c.command:
        out.append(f"<p>Command:</p><pre>{h(c.command)}</pre>")
    if c.trials:
        out.append(
            table(
                ["repeat", "status", "engine", "ready s", "bench runs", "teardown", "error"],
                [
                    [
                        str(t.repeat + 1),
                        h(t.status),
                        h(t.engine_version or "-"),
                        h(fmt(t.ready_s, 1)),
                        " ".join(f'<a href="/run/{h(r)}">{h(r)}</a>' if ui else h(r) for r in t.bench_runs)
                        or "-",
                        h(t.teardown or "-"),
                        h(t.error or "-"),
                    ]
                    for t in c.trials
                ],
                "trials",
            )
        )
    return "\n".join(out)


def tried_section(cands: list[CandidateReport], ui: bool = False) -> str:
    rows = []
    for c in cands:
        s = c.score or CandidateScore()
        settings = ", ".join(f"{k}={v}" for k, v in c.settings.shown())
        args = " ".join(c.settings.args or [])
        mark = " (winner)" if c.winner else " (baseline)" if c.baseline else ""
        rows.append(
            [
                f'<a href="#cand-{h(c.label)}">{h(c.label)}</a>{mark}',
                h(settings) + (f" <code>{h(args)}</code>" if args else ""),
                f'<span class="status-{h(c.status)}">{h(c.outcome)}</span>',
                num(s.value, 1, "score"),
                num(s.level, level_digits(s.level), "score_level"),
                num((c.predicted or {}).get("output_throughput"), 0, "predicted"),
            ]
        )
    out = [
        '<h2 id="tried">What was tried</h2>',
        table(
            ["candidate", "settings", "outcome", "objective", "at level", "predicted tok/s"],
            rows,
            "candidates",
            3,
        ),
    ]
    if starts := report_rows(cands):
        out += [
            '<h3 id="startup">Start-up</h3>',
            f'<p class="note">{h(STARTUP_NOTE)}</p>',
            table(
                list(STARTUP_HEAD),
                [[h(r.label), str(r.repeat), *(h(x) for x in r.cells())] for r in starts],
                "startup",
                3,
            ),
        ]
    out += [candidate_detail(c, ui) for c in cands]
    return "\n".join(out)


def figures_html(figs: list[Figure]) -> str:
    return (
        '<div class="figs">'
        + "".join(
            f'<figure id="figure-{h(f.name)}">{f.svg}<figcaption>{h(f.caption)}</figcaption></figure>'
            for f in figs
        )
        + "</div>"
    )


def performance_section(model: StudyReport) -> str:
    out = [
        '<h2 id="performance">Performance</h2>',
        '<p class="note">Latencies in ms, throughputs in tokens per second (± the 95 % confidence half-width '
        "where the study repeated a candidate).</p>",
    ]
    if model.study.price_note:
        out.append(f'<p class="note" data-key="price">{h(model.study.price_note)}</p>')
    for c in model.candidates:
        if c.levels:
            out += [f"<h3>{h(c.label)}: every level</h3>", levels_table(c.label, c.levels)]
    out.append(explain_section(model.explain))
    return "\n".join(out)


def explain_section(ex: Explained | NoExplain) -> str:
    out = ["<h3>Decode step: measured against predicted</h3>"]
    if isinstance(ex, NoExplain):
        return out[0] + f'<p class="note">Not available: {h(ex.note)}</p>'
    if ex.caveat:
        out.append(f'<p class="caveat"><strong>Note:</strong> {h(ex.caveat)}</p>')
    out.append(f"<p>{h(ex.label)}, level by level (<code>servelab explain</code>):</p>")
    out.append(
        table(
            [
                "concurrency",
                "TPOT meas",
                "TPOT pred",
                "TTFT meas",
                "TTFT pred",
                "tok/s meas",
                "tok/s pred",
                "largest gap",
            ],
            [
                [
                    num(lv.concurrency, 0)
                    if kind_of(lv.mode or "concurrency").closed_loop
                    else f'<td class="num">{h(in_flight_text(lv.mode, lv.level, lv.concurrency))}</td>',
                    num(lv.measured["tpot_ms"], 2, "tpot_meas"),
                    num(lv.predicted["tpot_ms"], 2, "tpot_pred"),
                    num(lv.measured["ttft_ms"], 0, "ttft_meas"),
                    num(lv.predicted["ttft_ms"], 0, "ttft_pred"),
                    num(lv.measured["output_throughput"], 0, "thr_meas"),
                    num(lv.predicted["output_throughput"], 0, "thr_pred"),
                    h(lv.gap),
                ]
                for lv in ex.levels
            ],
            "explain",
            0,
        )
    )
    dec = ex.decode
    total = dec.predicted_step_ms or 0.0
    out.append(
        f"<p>Predicted decode step at concurrency {dec.concurrency}: {fmt(dec.predicted_step_ms, 2)} ms "
        f"(TPOT {fmt(dec.predicted_tpot_ms, 2)} ms predicted, {fmt(dec.measured_tpot_ms, 2)} ms "
        f"measured); bottleneck {h(dec.bottleneck)}.</p>"
    )
    out.append(
        table(
            ["component", "ms", "share"],
            [
                [h(k), num(v, 3), h(f"{v / total:.0%}" if total else "-")]
                for k, v in dec.predicted_breakdown_ms.items()
            ],
            "breakdown",
            1,
        )
    )
    if ex.largest_gap:
        out.append(f"<p>Largest gap: {h(ex.largest_gap)}</p>")
    return "\n".join(out)


def plan_section(model: StudyReport) -> str:
    ps = model.plan_state
    out = ['<h2 id="plan">The plan</h2>', "<ul>"]
    for key, title in (
        ("done", "done"),
        ("not_applied", "not applied"),
        ("failed", "failed"),
        ("not_yet_done", "not yet done"),
    ):
        out.append(f"<li>{title}: {h(', '.join(ps[key]) or 'none')}</li>")
    out.append("</ul>")
    out.append(plan_items(model.plan))
    return "\n".join(out)


def plan_items(plan: PlanView) -> str:
    if not plan.available:
        return f'<p class="note">Stored plan: not available ({h(plan.note)}).</p>'
    return f"<p>Stored plan <code>{h(plan.name)}</code>:</p>" + table(
        ["id", "status", "priority", "item", "evidence"],
        [
            [
                h(i["id"]),
                h(i["status"]),
                h(i["priority"]),
                h(i["content"]),
                h(
                    ", ".join(
                        f"{e.get('run') or '-'} ({e.get('status') or '-'})"
                        for e in map(as_map, as_list(i.get("evidence")))
                    )
                    or "-"
                ),
            ]
            for i in plan.items
        ],
        "plan",
    )


def study_body(model: StudyReport, figs: list[Figure] | None = None, ui: bool = False) -> str:
    figs = figures(model) if figs is None else figs
    return "\n".join(
        [
            summary_section(model),
            figures_html(figs),
            host_section(model.host),
            tried_section(model.candidates, ui),
            performance_section(model),
            plan_section(model),
        ]
    )


def render(model: StudyReport) -> str:
    """The whole report as one HTML document."""
    return page(f"servelab findings: {model.study.name}", study_body(model))


def failures_html(model: RunReport) -> list[str]:
    """Each kind of failure of each level, in the server's own words (nothing when none failed)."""
    items = [
        f"<li>{h(lv.label)}: {h(k)} ×{lv.errors.get(k, 0)}: <q>{h(ex)}</q></li>"
        for lv in model.levels
        for k, ex in lv.error_examples.items()
    ]
    if not items:
        return []
    head = '<h2 id="failures">Failures</h2><p class="note">Each kind, in the server\'s own words:</p>'
    return [head, "<ul>", *items, "</ul>"]


def render_run(model: RunReport) -> str:
    """The report of one bench run as one self-contained HTML document."""
    figs = run_figures(model)
    r = model.run
    out = [f"<h1>Bench run {h(r.uid)}</h1>", "<ul>"]
    out += [f"<li>{h(name)}: {h(text)}</li>" for name, text in run_head_lines(model)]
    out.append("</ul>")
    out += [f'<p class="bad">warning: {h(w)}</p>' for w in r.warnings]
    out += [
        '<h2 id="levels">Every level</h2>',
        '<p class="note">Latencies in ms, throughputs in tokens per second.</p>',
        levels_table(r.uid, [lv.model_dump() for lv in model.levels]),
        *failures_html(model),
        '<h2 id="plots">Plots</h2>',
        figures_html(figs),
        '<h2 id="over-time">The server over time</h2>',
        table(
            ["level", "samples", "interval", "peak waiting", "GPU telemetry"],
            [
                [
                    h(t.label),
                    num(t.samples, 0, "samples"),
                    num(t.series.interval_s, 3, "interval_s"),
                    num(t.peak_waiting, 0, "peak_waiting"),
                    h(t.series.gpu_source or "none"),
                ]
                for t in model.timelines
            ],
            "timelines",
            1,
        ),
    ]
    return page(f"servelab bench run {r.uid}", "\n".join(out))
