"""`servelab report --html` on a study run against the simulator, opened in headless Chromium (Debian's
`chromium`, driven by Playwright; scripts/test.sh installs it): the page loads with no console errors and
fetches nothing, the plots render with a size (the Pareto chart's front with its members labelled), and the
tables hold the numbers the store holds.
A full-page screenshot goes to artifacts/ (gitignored) for a person to look at."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_tune_sim import ROOT, servelab, write_study
from tests.support.sim_bench import SimBench
from tests.support.sim_bench import sim_bench as sim_bench  # the session's shared bench run (a fixture)
from tests.support.sim_study import SimStudy
from tests.support.sim_study import sim_study as sim_study  # the session's shared study (a fixture)

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "artifacts"

GLM5 = [
    {
        "name": "tp8-cutlass",
        "tp": 8,
        "args": ["--moe-runner-backend", "flashinfer_cutlass"],
        "baseline": True,
    },
    {"name": "tp8-trtllm", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_trtllm"]},
    {"name": "tp4-pp2", "tp": 4, "pp": 2, "args": ["--moe-runner-backend", "flashinfer_cutlass"]},
    {
        "name": "arfusion",
        "tp": 8,
        "args": ["--moe-runner-backend", "flashinfer_cutlass", "--enable-flashinfer-allreduce-fusion"],
    },
]


def glm5_study(
    path: Path, candidates: list[dict[str, Any]] | None = None, levels: list[int] | None = None
) -> Path:
    """The GLM-5 story on the simulator, small: the not-applied backend, the collapse, TP8 against TP4+PP2."""
    return write_study(
        path,
        "glm5-browser",
        candidates or GLM5,
        model="GLM-5-NVFP4",
        gpu="rtx-pro-6000",
        num_gpus=8,
        personality="sglang",
        levels=levels or [1, 4, 16],
        speed=20,
        extra_engine={"args": ["--disable-radix-cache"]},
        top='objective = "output_throughput"\n[slo]\ntpot_ms = { p50 = 150 }',
    )


@contextmanager
def browser_page(console: list[str]) -> Iterator[Any]:
    """A page in headless Chromium that records console errors and uncaught exceptions into `console`."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists() or shutil.which("chromium"), (
        "Chromium is missing: scripts/test.sh installs it (apt-get install -y --no-install-recommends chromium)"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on(
                "console",
                lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            yield page
        finally:
            browser.close()


def check_plots(page: Any, names: tuple[str, ...], at_least: int = 3) -> None:
    for name in names:
        svg = page.locator(f"svg#fig-{name}")
        assert svg.is_visible(), name
        box = svg.bounding_box()
        assert box and box["width"] > 200 and box["height"] > 100, (name, box)
        drawn = page.locator(f"svg#fig-{name} circle, svg#fig-{name} rect.bar").count()
        assert drawn >= at_least, (name, drawn)


def level_cells(page: Any, label: str) -> dict[str, list[tuple[str, float]]]:
    """key -> [(shown text, stored value)] for every number cell of one candidate's level table."""
    cells = page.eval_on_selector_all(
        f'table.levels[data-candidate="{label}"] td[data-key]',
        "els => els.map(e => [e.dataset.key, e.textContent, e.dataset.value || null])",
    )
    out: dict[str, list[tuple[str, float]]] = {}
    for key, text, value in cells:
        if value is not None:
            out.setdefault(key, []).append((text, float(value)))
    return out


def check_pareto(page: Any, members: list[str]) -> None:
    """The Pareto chart is drawn with a size, its front joined by one line, and each member of the front the
    report's JSON names is labelled on it, visibly, inside the chart."""
    check_plots(page, ("pareto",), at_least=len(members))
    assert members
    assert page.locator("svg#fig-pareto polyline.front").count() == 1
    labels = page.locator("svg#fig-pareto g.point-label")
    assert sorted(labels.evaluate_all("els => els.map(e => e.textContent)")) == sorted(members)
    svg_box = page.locator("svg#fig-pareto").bounding_box()
    assert svg_box
    for i in range(labels.count()):
        box = labels.nth(i).bounding_box()
        assert labels.nth(i).is_visible() and box and box["width"] > 10, (members[i], box)
        assert svg_box["x"] <= box["x"] and box["x"] + box["width"] <= svg_box["x"] + svg_box["width"] + 0.5


def save_screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    return path


def test_html_report_in_chromium(tmp_path: Path) -> None:
    home = tmp_path / "home"
    study = glm5_study(tmp_path / "glm5.toml")
    out = json.loads(servelab("tune", str(study), "--json", home=home).stdout)
    stored = json.loads(servelab("runs", "study", out["study"], "--json", home=home).stdout)
    report = tmp_path / "findings.html"
    servelab(
        "report", out["study"], "--html", str(report), "--md", str(tmp_path / "md" / "findings.md"), home=home
    )
    assert (tmp_path / "md" / "findings_files" / "throughput.svg").exists()

    console: list[str] = []
    requests: list[str] = []
    with browser_page(console) as page:
        page.on("request", lambda r: requests.append(r.url))
        page.goto(report.as_uri())
        page.wait_for_load_state("load")
        assert console == []
        assert all(u.startswith(("file:", "data:")) for u in requests), requests  # opens without a network
        check_plots(page, ("throughput", "latency", "pareto", "ttft", "decode"))
        # the anomalous candidate is ringed on the throughput curve
        assert page.locator("svg#fig-throughput circle.anomaly").count() >= 1
        assert page.locator("svg#fig-latency polyline.front").count() == 1

        by = {c["label"]: c for c in stored["candidates"]}
        for label in ("tp8-cutlass", "tp4-pp2", "arfusion"):
            cells = level_cells(page, label)
            levels = by[label]["levels"]
            assert levels, label
            for key, digits in (
                ("output_throughput", 1),
                ("tpot_ms_p50", 2),
                ("ttft_ms_p99", 1),
                ("goodput", 1),
            ):
                assert [v for _t, v in cells[key]] == [lv[key] for lv in levels], (label, key)
                assert [t for t, _v in cells[key]] == [f"{lv[key]:,.{digits}f}" for lv in levels], (
                    label,
                    key,
                )
        assert page.locator("table.levels[data-candidate='tp8-trtllm']").count() == 0  # never benchmarked
        winner = stored["ranking"]["winner"]
        assert page.locator("strong.winner").inner_text() == winner
        assert "not applied" in page.locator("#cand-tp8-trtllm ~ p").first.inner_text()
        shot = save_screenshot(page, "report.png")
    assert console == [], console
    assert shot.exists()


def check_run_report(page: Any, bench: SimBench, tmp_path: Path) -> None:
    """`servelab report RUN --html` of the shared bench run: it opens offline with no console error, every
    plot (against load, the CDFs, the server over time) is drawn with a size, and the level table holds the
    stored numbers."""
    report = tmp_path / "run.html"
    servelab("report", bench.uid, "--html", str(report), home=bench.home)
    model = json.loads(servelab("report", bench.uid, "--json", home=bench.home).stdout)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri())
    page.wait_for_load_state("load")
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    check_plots(page, ("throughput",), at_least=2)  # a point per level
    check_plots(page, ("ttft", "tpot"), at_least=4)  # p50 and p99 per level
    check_plots(page, ("cdf-ttft", "cdf-tpot"), at_least=20)  # a point per request, or per quantile
    for i in range(len(bench.result["levels"])):
        check_plots(
            page, tuple(f"timeline-{i}-{k}" for k in ("throughput", "latency", "queue", "usage", "power"))
        )
    check_pareto(page, [f"level {p['level']:g}" for p in model["pareto_front"]])
    queue = page.locator("svg#fig-timeline-1-queue g.series[data-name='waiting'] circle")
    assert queue.count() >= 10
    cells = level_cells(page, bench.uid)
    levels = [lv["summary"] for lv in bench.result["levels"]]
    assert [v for _t, v in cells["output_throughput"]] == [s["output_throughput"] for s in levels]
    assert [v for _t, v in cells["ttft_ms_p99"]] == [s["ttft_ms"]["p99"] for s in levels]
    assert [t for t, _v in cells["tpot_ms_p50"]] == [f"{s['tpot_ms']['p50']:,.2f}" for s in levels]
    save_screenshot(page, "report-run.png")


def test_error_bars_log_axis_and_whole_legends_are_visible(
    sim_study: SimStudy, sim_bench: SimBench, tmp_path: Path
) -> None:
    """The shared two-repeat study: error bars drawn with a height, the TTFT axis logarithmic and labelled
    so, and every legend inside its plot (nothing cut at the right edge). Then, in the same browser, the
    report of the shared bench run (`check_run_report`)."""
    report = tmp_path / "findings.html"
    servelab("report", sim_study.uid, "--html", str(report), home=sim_study.home)
    model = json.loads(servelab("report", sim_study.uid, "--json", home=sim_study.home).stdout)
    console: list[str] = []
    with browser_page(console) as page:
        page.goto(report.as_uri())
        page.wait_for_load_state("load")
        for fig in ("throughput", "latency"):
            bars = page.locator(f"svg#fig-{fig} g.errorbar line:first-child")
            assert bars.count() >= 3, fig
            heights = [(bars.nth(i).bounding_box() or {}).get("height", 0) for i in range(bars.count())]
            assert max(heights) > 2, (fig, heights)  # visible, not a dot
            # the bar with its caps (a vertical line alone has no width, which Playwright calls hidden)
            tallest = page.locator(f"svg#fig-{fig} g.errorbar").nth(heights.index(max(heights)))
            assert tallest.is_visible()
            assert tallest.locator("line").first.evaluate("e => getComputedStyle(e).stroke") != "none"
        ttft = page.locator('svg#fig-ttft[data-y-scale="log"]')
        assert ttft.is_visible()
        label = page.locator("svg#fig-ttft text", has_text="(log scale)")
        assert label.count() == 1 and label.is_visible()
        for fig in ("throughput", "latency", "ttft", "decode"):
            svg_box = page.locator(f"svg#fig-{fig}").bounding_box()
            assert svg_box
            items = page.locator(f"svg#fig-{fig} g.legend-item text")
            assert items.count() >= 2, fig
            for i in range(items.count()):
                box = items.nth(i).bounding_box()
                assert box and box["x"] + box["width"] <= svg_box["x"] + svg_box["width"] + 0.5, (fig, i, box)
        # the Pareto chart, its front's members named on it and in the report's top
        check_pareto(page, [f"{p['candidate']} @ {p['level']:g}" for p in model["pareto_front"]])
        top = page.locator("ul.top").inner_text()
        assert all(f"{p['candidate']} @ {p['level']:g}" in top for p in model["pareto_front"]), top
        save_screenshot(page, "report-error-bars.png")
        check_run_report(page, sim_bench, tmp_path)
    assert console == [], console
