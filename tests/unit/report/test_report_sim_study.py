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


def test_the_pareto_front_is_named_and_no_stored_level_beats_it(written: dict[str, Any]) -> None:
    """The front of output tok/s per GPU against tok/s per user, checked against the levels the study stored
    (each candidate's throughput over the GPUs of its stored layout): every member is a stored level no
    other stored level beats on both, every other level is beaten by one, and the Markdown names each
    member at the top, in the chart's caption and on the chart."""
    from servelab.store.db import open_store
    from servelab.store.studies import StudyRepo

    uid = written["model"]["study"]["uid"]
    with open_store(written["home"] / "servelab.db") as store:
        repo = StudyRepo(store)
        cands = repo.candidates(repo.resolve(uid).id)
    points: dict[tuple[str, float], tuple[float, float]] = {}
    for c in cands:
        spec = c.spec or {}
        gpus = int(spec.get("tp") or 1) * int(spec.get("pp") or 1) * int(spec.get("dp") or 1)
        assert gpus == 8  # both candidates are TP8
        for lv in (c.outcome or {})["levels"]:
            points[(c.label, float(lv["level"]))] = (lv["output_throughput"] / gpus, 1000 / lv["tpot_ms_p50"])
    # TP8 at levels 1, 16 and 256; the collapsing flag stopped after the levels that showed its collapse
    assert sum(label == "tp8" for label, _lv in points) == 3 and len(points) > 3

    def beaten(g: float, u: float) -> bool:
        return any(g2 >= g and u2 >= u and (g2 > g or u2 > u) for g2, u2 in points.values())

    front = written["model"]["pareto_front"]
    members = {(m["candidate"], m["level"]) for m in front}
    assert len(front) >= 2 and len(members) == len(front)
    for m in front:
        g, u = points[(m["candidate"], m["level"])]
        assert m["output_tps_per_gpu"] == pytest.approx(g) and m["tps_per_user"] == pytest.approx(u)
        assert m["gpus"] == 8 and not beaten(g, u)
    assert all(beaten(*gu) for key, gu in points.items() if key not in members)
    assert [m["tps_per_user"] for m in front] == sorted(m["tps_per_user"] for m in front)

    md_text = written["md"]
    top = md_text[md_text.index("## The winner") : md_text.index("## Host")]
    caption = next(
        line for line in md_text.splitlines() if line.startswith("*Output tokens per second per GPU")
    )
    chart = {
        g.get("data-name") for g in written["svg"]["pareto"].iter(f"{NS}g") if g.get("class") == "point-label"
    }
    for m in front:
        name = f"{m['candidate']} @ {m['level']:g}"
        assert name in top and name in caption and name in chart, name
    assert len(chart) == len(front)


def test_the_top_says_each_thing_once(written: dict[str, Any]) -> None:
    """One line per declared objective and one for the Pareto front; the winner's figures said once."""
    md_text = written["md"]
    top = md_text[md_text.index("## The winner") + len("## The winner") : md_text.index("## Host")]
    lines = [line for line in top.splitlines() if line.strip()]
    win = written["model"]["winner"]
    assert written["model"]["study"]["objectives"] == ["output_throughput"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"- **output\\_throughput (higher is better)**: **{win['label']}**, ")
    assert lines[1].startswith("- **Pareto front (output tok/s per GPU against tok/s per user)**: ")
    assert "Margin over" not in md_text and "Why:" not in top
    assert top.count(win["label"]) == 1 + sum(
        m["candidate"] == win["label"] for m in written["model"]["pareto_front"]
    )
