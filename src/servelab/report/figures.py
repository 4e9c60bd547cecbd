"""The study's figures, built from the report model: the same SVG text goes inline into the HTML and into
files beside the Markdown."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from servelab.analyze import level_of, number
from servelab.load import kind_of
from servelab.report.model import CandidateReport, Explained, StudyReport
from servelab.report.pareto import ENERGY_AXES, EnergyPoint, ParetoPoint, front, members_text
from servelab.report.plots import Series, line_chart, spans_decades, stacked_bars
from servelab.report.runreport import RunReport, Timeline
from servelab.report.text import as_map

P = TypeVar("P")

PLOTTED = ("measured", "anomalous", "failed", "running")


@dataclass
class Figure:
    name: str  # file stem and element id
    title: str
    caption: str
    svg: str


def _series(c: CandidateReport, y_key: str, x_key: str = "level") -> Series:
    levels = c.levels
    pts = [
        (float(x), float(y))
        for lv in levels
        if (x := number(lv, x_key)) is not None and (y := number(lv, y_key)) is not None
    ]
    by_level = {level_of(lv): lv for lv in levels}
    marks = []
    for a in c.anomalies:
        lv = by_level.get(float(a.level))
        if lv is not None and (y := number(lv, y_key)) is not None and (x := number(lv, x_key)) is not None:
            marks.append((float(x), float(y), f"{a.kind}: {a.detail}"))
    errors = [
        (float(x), float(y), float(e))
        for lv in levels
        if (x := number(lv, x_key)) is not None
        and (y := number(lv, y_key)) is not None
        and (e := number(as_map(lv.get("ci")), y_key)) is not None
    ]
    name = c.label + (" (winner)" if c.winner else "")
    return Series(name, pts, marks, dashed=c.status != "measured" and c.status != "running", errors=errors)


def _bars_note(series: list[Series], y_key: str) -> str:
    """What the caption says about error bars: there are some, or why there are none."""
    if any(s.errors for s in series):
        return " Bars: the 95 % confidence half-width over the repeats."
    if any(s.points for s in series):
        return (
            f" No error bars: the study stores no confidence interval for {y_key} (one repeat, or a "
            "statistic it does not rank by)."
        )
    return ""


def _log_note(svg: str) -> str:
    return " The latency axis is logarithmic: its values span decades." if 'data-y-scale="log"' in svg else ""


def _limit(model: StudyReport, metric: str) -> list[tuple[float, str]]:
    return [
        (s.limit, f"SLO {metric.split('_')[0].upper()} {s.stat} {s.limit:g} ms")
        for s in model.slo
        if s.metric == metric
    ]


def pareto_chart(
    points: Sequence[P],
    *,
    x: Callable[[P], float],
    y: Callable[[P], float],
    group: Callable[[P], str],
    label: Callable[[P], str],
    title: str,
    x_label: str,
    y_label: str,
    ident: str,
    maximise: tuple[bool, bool] = (True, True),
    vlines: Sequence[tuple[float, str]] = (),
) -> tuple[str, list[P]]:
    """Any two figures of the same points against each other: one line per `group` (a candidate's levels),
    the Pareto front (`maximise`: per axis, whether higher is better) joined by a thick grey line, and each
    of its members named on the chart by `label`. Returns the SVG and the front's members (in x order)."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for p in points:
        groups.setdefault(group(p), []).append((x(p), y(p)))
    members = front(points, x, y, maximise=maximise)
    svg = line_chart(
        title,
        [Series(name, pts) for name, pts in groups.items()],
        x_label=x_label,
        y_label=y_label,
        front=[(x(p), y(p)) for p in members],
        vlines=vlines,
        labels=[(x(p), y(p), label(p)) for p in members],
        label_toward=maximise,
        ident=ident,
    )
    return svg, members


def _per_gpu_figure(
    points: list[ParetoPoint],
    names: dict[str, str],
    label: Callable[[ParetoPoint], str],
    vlines: Sequence[tuple[float, str]] = (),
    note: str = "",
) -> Figure:
    """Output tok/s per GPU against tok/s per user, the front named (a study's candidates, or a run's levels)."""
    svg, members = pareto_chart(
        points,
        x=lambda p: p.tps_per_user,
        y=lambda p: p.output_tps_per_gpu,
        group=lambda p: names.get(p.candidate, p.candidate),
        label=label,
        title="Throughput per GPU against speed per user",
        x_label="tok/s per user (1000 / TPOT p50)",
        y_label="output tok/s per GPU",
        ident="fig-pareto",
        vlines=vlines,
    )
    return Figure(
        "pareto",
        "Output tok/s per GPU against tok/s per user, with the Pareto front",
        "Output tokens per second per GPU (the throughput over the GPUs the server held) against tokens per "
        "second per user (1000 / the median TPOT) at every measured level; the grey line joins the Pareto "
        "front, the levels no other beats on both, each named on the chart: "
        + members_text(members, label)
        + "."
        + note,
        svg,
    )


def _energy_figure(points: list[EnergyPoint]) -> list[Figure]:
    """J per output token against output tok/s, the front named; none when no level has energy."""
    if not points:
        return []
    svg, members = pareto_chart(
        points,
        x=lambda p: p.output_throughput,
        y=lambda p: p.j_per_output_token,
        group=lambda p: p.candidate,
        label=lambda p: p.name,
        title="Energy per token against throughput",
        x_label="output tok/s",
        y_label="J per output token",
        ident="fig-energy",
        maximise=ENERGY_AXES,
    )
    return [
        Figure(
            "energy",
            "J per output token against output throughput, with the Pareto front",
            "GPU energy per output token (the power of the server's GPUs integrated over each level) against "
            "output tokens per second at every measured level; the grey line joins the levels no other beats on "
            "both (more throughput for fewer joules), each named on the chart: "
            + (
                "; ".join(
                    f"{p.name} ({p.output_throughput:,.0f} tok/s, {p.j_per_output_token:.3g} J/token)"
                    for p in members
                )
            )
            + ".",
            svg,
        )
    ]


def figures(model: StudyReport) -> list[Figure]:
    cands = [c for c in model.candidates if c.status in PLOTTED and c.levels]
    mode = model.study.load.mode
    x_label = kind_of(mode).axis_label
    thr = [_series(c, "output_throughput") for c in cands]
    thr_svg = line_chart(
        "Output throughput against load",
        thr,
        x_label=x_label,
        y_label="output tok/s",
        log_x=True,
        ident="fig-throughput",
    )
    tpot = [_series(c, "tpot_ms_p50", "output_throughput") for c in cands]
    tpot_svg = line_chart(
        "TPOT p50 against throughput",
        tpot,
        x_label="output tok/s",
        y_label="TPOT p50 (ms)",
        log_y=None,
        hlines=_limit(model, "tpot_ms"),
        front=[(p.output_throughput, p.tpot_ms_p50) for p in model.pareto.front],
        ident="fig-latency",
    )
    ttft = [_series(c, "ttft_ms_p99") for c in cands]
    ttft_svg = line_chart(
        "TTFT p99 against load",
        ttft,
        x_label=x_label,
        y_label="TTFT p99 (ms)",
        log_x=True,
        log_y=None,
        hlines=_limit(model, "ttft_ms"),
        ident="fig-ttft",
    )
    out = [
        Figure(
            "throughput",
            "Output throughput against load",
            "Output tokens per second at every load level; "
            "red rings mark anomalies (collapse, power drop, errors)." + _bars_note(thr, "output_throughput"),
            thr_svg,
        ),
        Figure(
            "latency",
            "TPOT against throughput, with the Pareto front",
            "Median time per output token against output throughput; the grey band joins the levels that meet "
            "every SLO and that no other such level beats on both axes (the Pareto front)."
            + _bars_note(tpot, "tpot_ms_p50")
            + _log_note(tpot_svg),
            tpot_svg,
        ),
        _per_gpu_figure(
            model.pareto.per_gpu,
            {c.label: c.label + (" (winner)" if c.winner else "") for c in model.candidates},
            lambda p: p.name,
            [
                (1000.0 / s.limit, f"SLO TPOT p50 {s.limit:g} ms")
                for s in model.slo
                if s.metric == "tpot_ms" and s.stat == "p50" and s.limit > 0
            ],
        ),
        *_energy_figure(model.energy_points),
        Figure(
            "ttft",
            "TTFT p99 against load",
            "99th-percentile time to first token at every load level."
            + _bars_note(ttft, "ttft_ms_p99")
            + _log_note(ttft_svg),
            ttft_svg,
        ),
    ]
    ex = model.explain
    dec = ex.decode if isinstance(ex, Explained) else None
    if isinstance(ex, Explained) and dec and dec.predicted_breakdown_ms:
        parts = dec.predicted_breakdown_ms
        pred = [(k, float(v)) for k, v in parts.items() if v]
        stall = (dec.predicted_tpot_ms or 0.0) - sum(v for _, v in pred)
        if stall > 0:
            pred.append(("prefill stalls", stall))
        physics = sum(float(parts.get(k, 0.0)) for k in ("weights", "kv_cache", "compute"))
        bars = [("predicted", pred)]
        if dec.measured_tpot_ms is not None:
            bars.append(
                (
                    "measured",
                    [
                        ("weights + KV + compute (model)", physics),
                        ("the rest, measured", float(dec.measured_tpot_ms) - physics),
                    ],
                )
            )
        out.append(
            Figure(
                "decode",
                "Where a decode step goes",
                f"{ex.label} at concurrency {dec.concurrency}: the model's split of the time per "
                "output token, beside the measured TPOT (the model's weights + KV + compute time taken "
                "as given, the rest measured).",
                stacked_bars(
                    f"Time per output token, {ex.label} at {dec.concurrency}",
                    bars,
                    unit="ms",
                    ident="fig-decode",
                ),
            )
        )
    return out


# -- the report of one bench run (`servelab report RUN`) ----------------------------------------------


def _load_label(mode: str) -> str:
    return kind_of(mode).axis_label


def _pts(xs: list[float], ys: list[float | None]) -> list[tuple[float, float]]:
    return [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]


def run_figures(model: RunReport) -> list[Figure]:
    """Throughput and latency against load, the TTFT and TPOT CDFs of every level, and per level the
    server's telemetry beside the client's throughput and latency over time."""
    unit = "GPU s" if model.run.clock_speed != 1 else "s"
    x_label = _load_label(model.run.mode)
    xs = [lv.level for lv in model.levels]
    out: list[Figure] = []
    thr = [Series("output tok/s", _pts(xs, [lv.output_throughput for lv in model.levels]))]
    if any(lv.goodput is not None for lv in model.levels):
        thr.append(Series("goodput tok/s", _pts(xs, [lv.goodput for lv in model.levels]), dashed=True))
    out.append(
        Figure(
            "throughput",
            "Output throughput against load",
            "Output tokens per second at every load level (goodput, dashed: the tokens of requests that met "
            "every --slo limit).",
            line_chart(
                "Output throughput against load",
                thr,
                x_label=x_label,
                y_label="output tok/s",
                log_x=True,
                ident="fig-throughput",
            ),
        )
    )
    out.append(
        _per_gpu_figure(
            model.pareto_points,
            {model.run.uid: "this run's levels"},
            lambda p: f"level {p.level:g}",
            note=f" GPUs counted: {model.run.gpus}, from {model.run.gpus_from}.",
        )
    )
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT")):
        series = [
            Series(
                f"{name} {stat}",
                _pts(xs, [getattr(lv, f"{key}_ms_{stat}") for lv in model.levels]),
                dashed=stat == "p99",
            )
            for stat in ("p50", "p99")
        ]
        svg = line_chart(
            f"{name} against load",
            series,
            x_label=x_label,
            y_label=f"{name} (ms)",
            log_x=True,
            log_y=None,
            ident=f"fig-{key}",
        )
        out.append(
            Figure(
                key,
                f"{name} p50 and p99 against load",
                f"Median and 99th-percentile {name} at every load level." + _log_note(svg),
                svg,
            )
        )
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT")):
        series = [Series(c.label, list(getattr(c, key).points)) for c in model.cdfs]
        values = [x for s in series for x, _ in s.points]
        svg = line_chart(
            f"{name} CDF per level",
            series,
            x_label=f"{name} (ms)" + (", log scale" if spans_decades(values) else ""),
            y_label="fraction of requests ≤ x",
            log_x=spans_decades(values),
            ident=f"fig-cdf-{key}",
        )
        out.append(
            Figure(
                f"cdf-{key}",
                f"{name} distribution per level",
                f"The fraction of a level's successful requests whose {name} was at most x, one line per level.",
                svg,
            )
        )
    for tl in model.timelines:
        out += _timeline_figures(tl, unit)
    return out


def _timeline_figures(tl: Timeline, unit: str) -> list[Figure]:
    pts = tl.series.points
    ct = [b.t_s for b in tl.client]
    st = [p.t_s for p in pts]
    ident = f"timeline-{tl.index}"
    x_label = f"time since the level's start ({unit})"
    # the server's generated tokens per second: each sample's count over the time since the one before
    gen: list[float | None] = []
    prev = 0.0
    for p in pts:
        dt = p.t_s - prev
        gen.append(p.generation_tokens / dt if p.generation_tokens is not None and dt > 0 else None)
        prev = p.t_s
    figs = [
        Figure(
            f"{ident}-throughput",
            f"{tl.label}: throughput over time",
            "Output tokens per second as the client received them (bins of "
            f"{tl.bin_s:.3g} {unit}), beside the tokens the server says it generated between two /metrics "
            "samples.",
            line_chart(
                f"{tl.label}: throughput over time",
                [
                    Series("client output tok/s", _pts(ct, [b.output_throughput for b in tl.client])),
                    Series("server generated tok/s", _pts(st, gen), dashed=True),
                ],
                x_label=x_label,
                y_label="tok/s",
                ident=f"fig-{ident}-throughput",
            ),
        ),
        Figure(
            f"{ident}-latency",
            f"{tl.label}: latency over time",
            "Median TTFT and TPOT of the requests sent in each bin.",
            line_chart(
                f"{tl.label}: latency over time",
                [
                    Series("TTFT p50", _pts(ct, [b.ttft_ms_p50 for b in tl.client])),
                    Series("TPOT p50", _pts(ct, [b.tpot_ms_p50 for b in tl.client])),
                ],
                x_label=x_label,
                y_label="ms",
                log_y=None,
                ident=f"fig-{ident}-latency",
            ),
        ),
        Figure(
            f"{ident}-queue",
            f"{tl.label}: the server's requests over time",
            f"Requests waiting (the queue) and running, and preemptions since the sample before, from the "
            f"server's /metrics ({tl.samples} samples).",
            line_chart(
                f"{tl.label}: server requests over time",
                [
                    Series("waiting", _pts(st, [p.requests_waiting for p in pts])),
                    Series("running", _pts(st, [p.requests_running for p in pts])),
                    Series("preemptions", _pts(st, [p.preemptions for p in pts]), dashed=True),
                ],
                x_label=x_label,
                y_label="requests",
                ident=f"fig-{ident}-queue",
            ),
        ),
        Figure(
            f"{ident}-usage",
            f"{tl.label}: KV cache and GPU over time",
            "KV-cache usage from the server's /metrics and GPU utilization"
            + (f" ({tl.series.gpu_source})" if tl.series.gpu_source else " (no GPU telemetry for this run)")
            + ", in percent.",
            line_chart(
                f"{tl.label}: KV cache and GPU utilization",
                [
                    Series("KV cache %", _pts(st, [_pct(p.kv_cache_usage) for p in pts])),
                    Series("GPU util %", _pts(st, [_pct(p.gpu_util) for p in pts])),
                ],
                x_label=x_label,
                y_label="%",
                ident=f"fig-{ident}-usage",
            ),
        ),
    ]
    if any(p.gpu_power_w is not None for p in pts):
        figs.append(
            Figure(
                f"{ident}-power",
                f"{tl.label}: GPU power over time",
                f"Mean power of the GPUs the server holds ({tl.series.gpu_source}).",
                line_chart(
                    f"{tl.label}: GPU power",
                    [Series("GPU W", _pts(st, [p.gpu_power_w for p in pts]))],
                    x_label=x_label,
                    y_label="W",
                    ident=f"fig-{ident}-power",
                ),
            )
        )
    return figs


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100
