"""Small SVG charts: line charts with markers, error bars, axes (linear, or logarithmic when the values span
decades), ticks and a legend, anomaly marks, a Pareto front, and stacked bars. Pure functions returning SVG text (no plotting dependency; the same SVG goes inline into the
HTML and into the Markdown as a file). Output is deterministic, so golden files stay stable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from servelab.report.text import h

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
ANOMALY = "#D00000"
FRONT = "#333333"
W, H = 640, 360
ML, MR, MT, MB = 64, 170, 34, 48  # margins: left, right (legend), top (title), bottom
LEGEND_CHARS = 18  # legend text wraps (never truncates) at this many characters a line
LOG_SPAN = 30.0  # a latency axis goes logarithmic when its largest value is more than this × its smallest


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    marks: list[tuple[float, float, str]] = field(default_factory=list)  # (x, y, why): anomalies
    dashed: bool = False
    errors: list[tuple[float, float, float]] = field(default_factory=list)  # (x, y, ± half-width in y)


def _num(v: float) -> str:
    """A coordinate with two decimals, without trailing zeros (stable text for golden files)."""
    return f"{v:.2f}".rstrip("0").rstrip(".")


def tick_label(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 10:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 × 10^k steps)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 10))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(v, 10))
    return ticks


def log_ticks(lo: float, hi: float, values: Sequence[float] = ()) -> list[float]:
    """The data's own x values when they are few (load levels), else powers of ten."""
    distinct = sorted({float(v) for v in values if v > 0})
    if 1 < len(distinct) <= 12:
        return distinct
    return [10.0**k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def spans_decades(values: Sequence[float], ratio: float = LOG_SPAN) -> bool:
    """The rule for a logarithmic value axis: every value positive and the largest more than `ratio` times
    the smallest (TTFT from 0.3 s at one request to 200 s at 64 would squash the low levels flat)."""
    vs = [v for v in values if math.isfinite(v)]
    return bool(vs) and min(vs) > 0 and max(vs) / min(vs) > ratio


def log_value_ticks(lo: float, hi: float) -> list[float]:
    """Ticks for a logarithmic value axis covering [lo, hi]: 1, 2, 5 × 10^k over up to three decades,
    powers of ten beyond; the first tick is at or below lo, the last at or above hi."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1.0, 2.0, 5.0) if k1 - k0 <= 3 else (1.0,)
    cands = sorted({round(m * 10.0**k, 12) for k in range(k0, k1 + 1) for m in steps})
    below = [t for t in cands if t <= lo * (1 + 1e-9)]
    above = [t for t in cands if t >= hi * (1 - 1e-9)]
    first, last = (below[-1] if below else cands[0]), (above[0] if above else cands[-1])
    return [t for t in cands if first <= t <= last]


class _Axis:
    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool) -> None:
        self.log = log and lo > 0
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, v: float) -> float:
        if self.log:
            lo, hi, v = math.log10(self.lo), math.log10(self.hi), math.log10(max(v, self.lo))
        else:
            lo, hi = self.lo, self.hi
        span = (hi - lo) or 1.0
        return self.a + (v - lo) / span * (self.b - self.a)


def _frame(
    title: str, x_label: str, y_label: str, legend: list[tuple[str, str, bool]], body: list[str], ident: str
) -> str:
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" id="{h(ident)}" viewBox="0 0 {W} {H}" '
        f'width="{W}" height="{H}" role="img" aria-label="{h(title)}" font-family="sans-serif" font-size="11">',
        f"<title>{h(title)}</title>",
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
        f'<text x="{W // 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{h(title)}</text>',
    ]
    out += body
    out.append(f'<text x="{_num((ML + W - MR) / 2)}" y="{H - 10}" text-anchor="middle">{h(x_label)}</text>')
    cy = _num((MT + H - MB) / 2)
    out.append(
        f'<text x="14" y="{cy}" text-anchor="middle" transform="rotate(-90 14 {cy})">{h(y_label)}</text>'
    )
    lx = W - MR + 12
    y = MT + 10
    for name, color, dashed in legend:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        lines = wrap(name)
        spans = "".join(
            f'<tspan x="{lx + 24}" dy="{0 if j == 0 else 13}">{h(line)}</tspan>'
            for j, line in enumerate(lines)
        )
        out.append(
            f'<g class="legend-item" data-name="{h(name)}"><title>{h(name)}</title><line x1="{lx}" y1="{y}" '
            f'x2="{lx + 18}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/><text x="{lx + 24}" '
            f'y="{y + 4}">{spans}</text></g>'
        )
        y += 18 + 13 * (len(lines) - 1)
    out.append("</svg>")
    return "\n".join(out)


def wrap(name: str, n: int = LEGEND_CHARS) -> list[str]:
    """`name` in lines of at most `n` characters, broken at spaces (a longer word is cut, never dropped):
    the whole name is always shown."""
    lines: list[str] = []
    cur = ""
    for word in name.split(" "):
        while len(word) > n:
            if cur:
                lines.append(cur)
                cur = ""
            lines.append(word[:n])
            word = word[n:]
        if not cur:
            cur = word
        elif len(cur) + 1 + len(word) <= n:
            cur = f"{cur} {word}"
        else:
            lines.append(cur)
            cur = word
    if cur or not lines:
        lines.append(cur)
    return lines


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    log_y: bool | None = False,
    hlines: Sequence[tuple[float, str]] = (),
    front: Sequence[tuple[float, float]] = (),
    vlines: Sequence[tuple[float, str]] = (),
    labels: Sequence[tuple[float, float, str]] = (),
    label_toward: tuple[bool, bool] = (True, True),
    ident: str = "plot",
) -> str:
    """One line per series with a marker per point; error bars where a series has them; anomalies ringed
    in red; horizontal and vertical limits (SLOs) dashed; `front` drawn as a thick grey line through its
    points in order (the Pareto front); `labels` name points on the chart (a front's members), each to the
    right (or left) of and above (or below) its point as `label_toward` says.

    `log_y=None` decides by the data (`spans_decades`); a logarithmic y axis says so in its label and in
    the SVG's `data-y-scale`."""
    pts = [p for s in series for p in s.points if math.isfinite(p[0]) and math.isfinite(p[1])]
    if not pts:
        return _frame(
            title,
            x_label,
            y_label,
            [],
            [f'<text x="{W // 2}" y="{H // 2}" text-anchor="middle" fill="#666">no measurements</text>'],
            ident,
        )
    xs = [p[0] for p in pts] + [p[0] for p in front] + [v for v, _ in vlines]
    ys = [p[1] for p in pts] + [p[1] for p in front] + [v for v, _ in hlines]
    bars = [(x, y, e) for s in series for x, y, e in s.errors if e and math.isfinite(e) and e > 0]
    if log_y is None:
        log_y = spans_decades(ys)
    log_y = log_y and min(ys) > 0
    ys += [y + e for _x, y, e in bars] + ([y - e for _x, y, e in bars if y - e > 0] if log_y else [])
    log_x = log_x and min(xs) > 0
    if log_x:
        xt = log_ticks(min(xs), max(xs), xs)
        x_lo, x_hi = min(min(xt), min(xs)), max(max(xt), max(xs))
        if x_lo == x_hi:
            x_lo, x_hi = x_lo / 2, x_hi * 2
    else:
        xt = nice_ticks(min(0.0, min(xs)), max(xs))
        x_lo, x_hi = xt[0], xt[-1]
    if log_y:
        yt = log_value_ticks(min(ys), max(ys))
        y_label = f"{y_label} (log scale)"
    else:
        yt = nice_ticks(min(0.0, min(ys)), max(ys) * 1.05 if max(ys) > 0 else 1.0)
    fx = _Axis(x_lo, x_hi, ML, W - MR, log_x)
    fy = _Axis(yt[0], yt[-1], H - MB, MT, log_y)
    body = [
        f'<rect x="{ML}" y="{MT}" width="{W - ML - MR}" height="{H - MT - MB}" fill="none" stroke="#999"/>'
    ]
    for t in xt:
        px = _num(fx(t))
        body.append(
            f'<line x1="{px}" y1="{MT}" x2="{px}" y2="{H - MB}" stroke="#eee"/>'
            f'<text x="{px}" y="{H - MB + 14}" text-anchor="middle">{tick_label(t)}</text>'
        )
    for t in yt:
        py = _num(fy(t))
        body.append(
            f'<line x1="{ML}" y1="{py}" x2="{W - MR}" y2="{py}" stroke="#eee"/>'
            f'<text x="{ML - 6}" y="{py}" text-anchor="end" dominant-baseline="middle">{tick_label(t)}</text>'
        )
    for v, label in hlines:
        py = _num(fy(v))
        body.append(
            f'<g class="limit"><line x1="{ML}" y1="{py}" x2="{W - MR}" y2="{py}" stroke="{ANOMALY}" '
            f'stroke-dasharray="6 4"/><text x="{W - MR - 4}" y="{_num(fy(v) - 4)}" text-anchor="end" '
            f'fill="{ANOMALY}">{h(label)}</text></g>'
        )
    for v, label in vlines:
        px = _num(fx(v))
        body.append(
            f'<g class="limit"><line x1="{px}" y1="{MT}" x2="{px}" y2="{H - MB}" stroke="{ANOMALY}" '
            f'stroke-dasharray="6 4"/><text x="{_num(fx(v) + 4)}" y="{MT + 12}" fill="{ANOMALY}">{h(label)}'
            "</text></g>"
        )
    if front:
        path = " ".join(f"{_num(fx(x))},{_num(fy(y))}" for x, y in front)
        body.append(
            f'<polyline class="front" points="{path}" fill="none" stroke="{FRONT}" stroke-width="7" '
            f'stroke-opacity="0.35" stroke-linejoin="round"/>'
        )
    legend: list[tuple[str, str, bool]] = []
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        legend.append((s.name, color, s.dashed))
        good = sorted(p for p in s.points if math.isfinite(p[0]) and math.isfinite(p[1]))
        if not good:
            continue
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        path = " ".join(f"{_num(fx(x))},{_num(fy(y))}" for x, y in good)
        body.append(
            f'<g class="series" data-name="{h(s.name)}"><polyline points="{path}" fill="none" '
            f'stroke="{color}" stroke-width="2"{dash}/>'
        )
        for x, y, e in s.errors:
            if not (e and math.isfinite(e) and e > 0 and math.isfinite(x) and math.isfinite(y)):
                continue
            px, top = _num(fx(x)), _num(fy(y + e))
            bottom = _num(fy(max(y - e, yt[0])))
            body.append(
                f'<g class="errorbar" data-x="{_num(x)}" data-y="{_num(y)}" data-half="{_num(e)}">'
                f'<line x1="{px}" y1="{top}" x2="{px}" y2="{bottom}" stroke="{color}" stroke-width="1.5"/>'
                f'<line x1="{_num(fx(x) - 4)}" y1="{top}" x2="{_num(fx(x) + 4)}" y2="{top}" stroke="{color}" '
                f'stroke-width="1.5"/><line x1="{_num(fx(x) - 4)}" y1="{bottom}" x2="{_num(fx(x) + 4)}" '
                f'y2="{bottom}" stroke="{color}" stroke-width="1.5"/>'
                f"<title>{h(s.name)}: {tick_label(y)} ± {tick_label(e)} (95 % CI)</title></g>"
            )
        for x, y in good:
            body.append(
                f'<circle cx="{_num(fx(x))}" cy="{_num(fy(y))}" r="3.5" fill="{color}">'
                f"<title>{h(s.name)}: {tick_label(x)}, {tick_label(y)}</title></circle>"
            )
        for x, y, why in s.marks:
            body.append(
                f'<circle class="anomaly" cx="{_num(fx(x))}" cy="{_num(fy(y))}" r="8" fill="none" '
                f'stroke="{ANOMALY}" stroke-width="2"><title>{h(s.name)}: {h(why)}</title></circle>'
            )
        body.append("</g>")
    right, up = label_toward
    for x, y, text in labels:
        # beside the point on the side `label_toward` names: a front's better side, where no point lies;
        # at the plot's edge turned to the other side, and vertically too (off the line from that corner)
        wide = 7 + 6 * len(text)
        turned = fx(x) + wide > W - MR if right else fx(x) - wide < ML
        anchor = "start" if right != turned else "end"
        dy = -8 if up != turned else 15
        dx = 7 if anchor == "start" else -7
        body.append(
            f'<g class="point-label" data-name="{h(text)}"><text x="{_num(fx(x) + dx)}" y="{_num(fy(y) + dy)}" '
            f'text-anchor="{anchor}" font-size="10" fill="{FRONT}">{h(text)}</text></g>'
        )
    if any(s.marks for s in series):
        legend.append(("anomaly", ANOMALY, False))
    if front:
        legend.append(("Pareto front", "#aaaaaa", False))
    svg = _frame(title, x_label, y_label, legend, body, ident)
    return svg.replace(' class="plot" ', f' class="plot" data-y-scale="{"log" if log_y else "linear"}" ', 1)


def stacked_bars(
    title: str, bars: Sequence[tuple[str, Sequence[tuple[str, float]]]], *, unit: str, ident: str = "bars"
) -> str:
    """Horizontal bars, each split into named parts (the decode step: predicted parts vs measured)."""
    names: list[str] = []
    for _, parts in bars:
        for n, _v in parts:
            if n not in names:
                names.append(n)
    colors = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    total = max((sum(max(v, 0.0) for _, v in parts) for _, parts in bars), default=0.0)
    xt = nice_ticks(0.0, total or 1.0)
    fx = _Axis(0.0, xt[-1], ML + 40, W - MR, False)
    body = []
    for t in xt:
        px = _num(fx(t))
        body.append(
            f'<line x1="{px}" y1="{MT}" x2="{px}" y2="{H - MB}" stroke="#eee"/>'
            f'<text x="{px}" y="{H - MB + 14}" text-anchor="middle">{tick_label(t)}</text>'
        )
    band = (H - MT - MB) / max(len(bars), 1)
    for i, (label, parts) in enumerate(bars):
        y0 = MT + i * band + band * 0.2
        bh = band * 0.6
        body.append(
            f'<text x="{ML + 34}" y="{_num(y0 + bh / 2)}" text-anchor="end" '
            f'dominant-baseline="middle">{h(label)}</text>'
        )
        x = 0.0
        for name, v in parts:
            v = max(v, 0.0)
            x0, x1 = fx(x), fx(x + v)
            body.append(
                f'<rect class="bar" x="{_num(x0)}" y="{_num(y0)}" width="{_num(max(x1 - x0, 0.0))}" '
                f'height="{_num(bh)}" fill="{colors[name]}"><title>{h(label)} · {h(name)}: '
                f"{v:.3g} {h(unit)}</title></rect>"
            )
            x += v
        body.append(
            f'<text x="{_num(fx(x) + 4)}" y="{_num(y0 + bh / 2)}" dominant-baseline="middle">'
            f"{x:.3g} {h(unit)}</text>"
        )
    legend = [(n, colors[n], False) for n in names]
    return _frame(title, unit, "", legend, body, ident)
