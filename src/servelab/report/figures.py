"""The study's figures, built from the report model: the same SVG text goes inline into the HTML and into
files beside the Markdown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelab.report.plots import Series, line_chart, stacked_bars

PLOTTED = ("measured", "anomalous", "failed", "running")


@dataclass
class Figure:
    name: str  # file stem and element id
    title: str
    caption: str
    svg: str


def _series(c: dict[str, Any], y_key: str, x_key: str = "level") -> Series:
    levels = c["levels"]
    pts = [
        (float(lv[x_key]), float(lv[y_key]))
        for lv in levels
        if lv.get(x_key) is not None and lv.get(y_key) is not None
    ]
    by_level = {float(lv["level"]): lv for lv in levels}
    marks = []
    for a in c.get("anomalies") or []:
        lv = by_level.get(float(a["level"]))
        if lv is not None and lv.get(y_key) is not None and lv.get(x_key) is not None:
            marks.append((float(lv[x_key]), float(lv[y_key]), f"{a['kind']}: {a['detail']}"))
    errors = [
        (float(lv[x_key]), float(lv[y_key]), float((lv.get("ci") or {})[y_key]))
        for lv in levels
        if lv.get(x_key) is not None
        and lv.get(y_key) is not None
        and isinstance((lv.get("ci") or {}).get(y_key), int | float)
    ]
    name = c["label"] + (" (winner)" if c.get("winner") else "")
    return Series(
        name, pts, marks, dashed=c["status"] != "measured" and c["status"] != "running", errors=errors
    )


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


def _limit(model: dict[str, Any], metric: str) -> list[tuple[float, str]]:
    return [
        (s["limit"], f"SLO {metric.split('_')[0].upper()} {s['stat']} {s['limit']:g} ms")
        for s in model.get("slo") or []
        if s["metric"] == metric
    ]


def figures(model: dict[str, Any]) -> list[Figure]:
    cands = [c for c in model["candidates"] if c["status"] in PLOTTED and c["levels"]]
    mode = model["study"]["load"]["mode"]
    x_label = "concurrency (requests in flight)" if mode == "concurrency" else "request rate (req/s)"
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
        front=[(p["output_throughput"], p["tpot_ms_p50"]) for p in model["pareto"]["front"]],
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
        Figure(
            "ttft",
            "TTFT p99 against load",
            "99th-percentile time to first token at every load level."
            + _bars_note(ttft, "ttft_ms_p99")
            + _log_note(ttft_svg),
            ttft_svg,
        ),
    ]
    ex = model.get("explain") or {}
    dec = ex.get("decode") if ex.get("available") else None
    if dec and dec.get("predicted_breakdown_ms"):
        parts = dec["predicted_breakdown_ms"]
        pred = [(k, float(v)) for k, v in parts.items() if v]
        stall = (dec.get("predicted_tpot_ms") or 0.0) - sum(v for _, v in pred)
        if stall > 0:
            pred.append(("prefill stalls", stall))
        physics = sum(float(parts.get(k, 0.0)) for k in ("weights", "kv_cache", "compute"))
        bars = [("predicted", pred)]
        if dec.get("measured_tpot_ms") is not None:
            bars.append(
                (
                    "measured",
                    [
                        ("weights + KV + compute (model)", physics),
                        ("the rest, measured", float(dec["measured_tpot_ms"]) - physics),
                    ],
                )
            )
        out.append(
            Figure(
                "decode",
                "Where a decode step goes",
                f"{ex['label']} at concurrency {dec['concurrency']}: the model's split of the time per "
                "output token, beside the measured TPOT (the model's weights + KV + compute time taken "
                "as given, the rest measured).",
                stacked_bars(
                    f"Time per output token, {ex['label']} at {dec['concurrency']}",
                    bars,
                    unit="ms",
                    ident="fig-decode",
                ),
            )
        )
    return out
