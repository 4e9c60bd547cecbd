"""`servelab report` on a real study `servelab tune` ran against the simulator (two repeats, TTFT from 0.4 s
to 80 s): error bars from the repeats, a log latency axis, whole legends, prose without Python reprs or
escaped entities, the host the study recorded, and the simulator's measured-vs-predicted caveat."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Any

import pytest
from tests.integration.test_tune_sim import servelab
from tests.support.sim_study import SimStudy

NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def written(sim_study: SimStudy, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("report")
    servelab(
        "report", sim_study.uid, "--html", str(out / "r.html"), "--md", str(out / "r.md"), home=sim_study.home
    )
    model = json.loads(servelab("report", sim_study.uid, "--json", home=sim_study.home).stdout)
    svgs = {p.stem: ET.fromstring(p.read_text()) for p in (out / "r_files").glob("*.svg")}
    return {
        "md": (out / "r.md").read_text(),
        "html": (out / "r.html").read_text(),
        "svg": svgs,
        "model": model,
        "home": sim_study.home,
    }


def test_plots_have_error_bars_at_the_repeats_confidence_interval(written: dict[str, Any]) -> None:
    model = written["model"]
    tp8 = next(c for c in model["candidates"] if c["label"] == "tp8")
    assert all(lv["repeats"] == 2 for lv in tp8["levels"])
    for fig, key in (("throughput", "output_throughput"), ("latency", "tpot_ms_p50")):
        bars = [g for g in written["svg"][fig].iter(f"{NS}g") if g.get("class") == "errorbar"]
        halves = sorted(round(float(g.get("data-half") or 0), 2) for g in bars)
        stored = sorted(
            round(lv["ci"][key], 2) for c in model["candidates"] for lv in c["levels"] if lv["ci"].get(key)
        )
        assert halves and halves == stored, (fig, halves, stored)
        top, bottom = (float(x) for x in (bars[0][0].get("y1"), bars[0][0].get("y2")))
        assert bottom > top  # a bar with a length, drawn upwards from the lower end
    assert "Bars: the 95 % confidence half-width over the repeats." in written["md"]


def test_latency_spanning_decades_is_on_a_log_axis(written: dict[str, Any]) -> None:
    ttft = [lv["ttft_ms_p99"] for c in written["model"]["candidates"] for lv in c["levels"]]
    assert max(ttft) / min(ttft) > 30  # the study's own numbers span decades
    svg = written["svg"]["ttft"]
    assert svg.get("data-y-scale") == "log" and written["svg"]["throughput"].get("data-y-scale") == "linear"
    texts = ["".join(t.itertext()) for t in svg.iter(f"{NS}text")]
    assert "TTFT p99 (ms) (log scale)" in texts
    # y tick labels: one per line of the grid, each a 1-2-5 step up on a log scale, spaced by the log
    ticks = [
        (float(t.get("y") or 0), "".join(t.itertext()))
        for t in svg.iter(f"{NS}text")
        if t.get("text-anchor") == "end" and t.get("dominant-baseline") == "middle"
    ]
    values = [float(v.replace("k", "e3").replace(",", "")) for _y, v in ticks]
    assert values == sorted(values) and values[0] <= min(ttft) and values[-1] >= max(ttft)
    ys = {v: y for (y, _t), v in zip(ticks, values, strict=True)}
    decade = [v for v in values if v * 10 in ys]
    assert decade and all(
        abs((ys[v] - ys[v * 10]) - (ys[decade[0]] - ys[decade[0] * 10])) < 0.05 for v in decade
    )
    assert "The latency axis is logarithmic" in written["md"]


def test_legends_show_every_name_whole(written: dict[str, Any]) -> None:
    names = set()
    for svg in written["svg"].values():
        for item in svg.iter(f"{NS}g"):
            if item.get("class") == "legend-item":
                (text,) = item.iter(f"{NS}text")
                shown = "".join(text.itertext())
                full = item.get("data-name") or ""
                assert shown.replace(" ", "") == full.replace(" ", ""), (shown, full)
                names.add(full)
    assert "tp8-arfusion-with-a-long-label" in names and "weights + KV + compute (model)" in names
    assert not any("…" in "".join(t.itertext()) for s in written["svg"].values() for t in s.iter(f"{NS}text"))


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, d: str) -> None:
        self.parts.append(d)


def test_prose_has_no_python_reprs_or_escaped_entities(written: dict[str, Any]) -> None:
    md_text, page = written["md"], written["html"]
    prose = re.sub(r"(`{3,})text\n.*?\n\1", "", md_text, flags=re.S)  # log excerpts are quoted verbatim
    prose = re.sub(r"(`+)[^`].*?\1", "", prose)
    assert "{'" not in prose and "&gt;" not in prose and "&amp;" not in prose
    assert "&amp;gt;" not in page and "&amp;lt;" not in page
    p = _Text()
    p.feed(page)
    shown = "".join(p.parts)
    assert "{'" not in shown and "&gt;" not in shown
    # the anomalous candidate's miss is in words, as the limit and the value
    assert re.search(r"no level meets the SLOs: at level 1, tpot\\_ms p50 \d+\.\d > 150", md_text), md_text


def test_host_is_what_the_study_recorded(written: dict[str, Any]) -> None:
    from servelab.store.bench import BenchRepo
    from servelab.store.db import open_store

    host = written["model"]["host"]
    runs = [r["run"] for r in host["recorded"]]
    assert len(runs) == 4  # two candidates × two repeats, each trial's bench run
    with open_store(written["home"] / "servelab.db") as store:
        contexts = [BenchRepo(store).load(r).context for r in runs]
    assert {(c.host.gpu, c.host.num_gpus) for c in contexts} == {("rtx-pro-6000", 8)}
    assert (
        host["gpu"] == "rtx-pro-6000" and host["num_gpus"] == 8 and host["source"] == "the study's bench runs"
    )
    assert host["this_machine"] is None  # the machine writing the report is not asked unless --host-checks
    md_text = written["md"]
    section = md_text[md_text.index("## Host") : md_text.index("## What was tried")]
    assert "as recorded by the study's bench runs" in section and "8 × rtx-pro-6000" in section
    assert all(r in section for r in runs) and "simulated GPU time" in section
    assert "20× faster" in section and "This machine" not in section


def test_simulator_measured_vs_predicted_says_it_is_the_same_model(written: dict[str, Any]) -> None:
    ex = written["model"]["explain"]
    assert ex["available"] and ex["same_model"]
    md_text = written["md"]
    part = md_text[md_text.index("### Decode step: measured against predicted") :]
    assert part.index("times every request with this same performance model") < part.index("level by level")
    assert "times every request with this same performance model" in written["html"]
