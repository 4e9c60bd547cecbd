"""The SVG charts: well-formed, deterministic, every point drawn, anomalies and the front marked."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from servelab.report.plots import Series, line_chart, log_ticks, nice_ticks, stacked_bars, tick_label

NS = "{http://www.w3.org/2000/svg}"


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0, 503.6) == [0, 200, 400, 600]
    assert nice_ticks(0, 95) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0, 0.9)[-1] >= 0.9
    assert nice_ticks(5, 5)[0] <= 5 <= nice_ticks(5, 5)[-1]


def test_log_ticks_use_the_load_levels_when_few() -> None:
    assert log_ticks(1, 1024, [1, 4, 16, 64, 256, 1024]) == [1, 4, 16, 64, 256, 1024]
    assert log_ticks(1, 1000, list(range(1, 40))) == [1, 10, 100, 1000]
    assert tick_label(20000) == "20k" and tick_label(1024) == "1,024" and tick_label(0.25) == "0.25"


def test_line_chart_draws_every_point_marks_anomalies_and_the_front() -> None:
    svg = line_chart(
        "thr <&>",
        [
            Series("a<b", [(1, 10), (4, 30), (16, 50)]),
            Series("b", [(1, 5), (4, 2)], marks=[(4, 2, "collapse")], dashed=True),
        ],
        x_label="conc",
        y_label="tok/s",
        log_x=True,
        hlines=[(40, "SLO")],
        front=[(10, 1), (50, 3)],
    )
    root = ET.fromstring(svg)
    circles = list(root.iter(f"{NS}circle"))
    assert len([c for c in circles if c.get("class") != "anomaly"]) == 5
    [ring] = [c for c in circles if c.get("class") == "anomaly"]
    assert "collapse" in "".join(ring.itertext())
    assert len(list(root.iter(f"{NS}polyline"))) == 3  # two series + the front
    assert "thr &lt;&amp;&gt;" in svg and "a&lt;b" in svg
    assert svg == line_chart(
        "thr <&>",
        [
            Series("a<b", [(1, 10), (4, 30), (16, 50)]),
            Series("b", [(1, 5), (4, 2)], marks=[(4, 2, "collapse")], dashed=True),
        ],
        x_label="conc",
        y_label="tok/s",
        log_x=True,
        hlines=[(40, "SLO")],
        front=[(10, 1), (50, 3)],
    )
    ys = [float(c.get("cy") or 0) for c in circles if c.get("class") != "anomaly"][:3]
    assert ys[0] > ys[1] > ys[2]  # larger values higher up


def test_empty_chart_says_so() -> None:
    assert "no measurements" in line_chart("t", [], x_label="x", y_label="y")


def test_stacked_bars_sum_their_parts() -> None:
    svg = stacked_bars(
        "step", [("predicted", [("weights", 20.0), ("comm", 30.0)]), ("measured", [("all", 52.0)])], unit="ms"
    )
    root = ET.fromstring(svg)
    bars = [r for r in root.iter(f"{NS}rect") if r.get("class") == "bar"]
    assert len(bars) == 3
    w = [float(b.get("width") or 0) for b in bars]
    assert abs((w[0] + w[1]) / w[2] - 50 / 52) < 0.01
    assert "50 ms" in svg and "52 ms" in svg
