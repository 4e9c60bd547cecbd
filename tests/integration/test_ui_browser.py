"""`servelab ui` in headless Chromium while a study runs against the simulator: the study page shows live
progress and reloads itself as the study advances, then the plots, the stored numbers, a run page, two runs
side by side and the plan; no console errors; writes are refused. Screenshots go to artifacts/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from tests.integration.test_report_browser import (
    browser_page,
    check_plots,
    glm5_study,
    level_cells,
    save_screenshot,
)
from tests.integration.test_tune_sim import ROOT, servelab

pytestmark = pytest.mark.integration

CANDS = [
    {
        "name": "tp8-cutlass",
        "tp": 8,
        "args": ["--moe-runner-backend", "flashinfer_cutlass"],
        "baseline": True,
    },
    {"name": "tp4-pp2", "tp": 4, "pp": 2, "args": ["--moe-runner-backend", "flashinfer_cutlass"]},
]


def _json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_ui_live_progress_pages_and_comparison(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    study = glm5_study(tmp_path / "s.toml", CANDS, levels=[1, 4, 16])
    study.write_text(study.read_text().replace("speed = 20", "speed = 8"))
    ui = subprocess.Popen(
        [sys.executable, "-m", "servelab", "ui", "--port", "0", "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tune = None
    try:
        assert ui.stdout is not None
        url = json.loads(ui.stdout.readline())["url"]
        assert url.startswith("http://127.0.0.1:")
        tune = subprocess.Popen(
            [sys.executable, "-m", "servelab", "tune", str(study), "--quiet"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not (studies := _json(url + "api/studies")["studies"]):
            assert time.monotonic() < deadline and tune.poll() is None, "the study never appeared"
            time.sleep(0.2)
        uid = studies[0]["uid"]

        console: list[str] = []
        with browser_page(console) as page:
            page.goto(f"{url}study/{uid}")
            progress = page.locator("#progress")
            assert progress.is_visible() and "running" in progress.inner_text()
            save_screenshot(page, "ui-study-running.png")
            # the page polls /api/study/UID/progress and reloads as levels finish, until the study has a winner
            page.wait_for_selector("strong.winner", timeout=180_000)
            assert tune.wait(timeout=120) == 0
            page.reload()
            assert page.locator("#progress").count() == 0
            check_plots(page, ("throughput", "latency", "ttft", "decode"))
            stored = json.loads(servelab("runs", "study", uid, "--json", home=home).stdout)
            assert page.locator("strong.winner").inner_text() == stored["ranking"]["winner"]
            for c in stored["candidates"]:
                cells = level_cells(page, c["label"])
                assert [v for _t, v in cells["output_throughput"]] == [
                    lv["output_throughput"] for lv in c["levels"]
                ]
            save_screenshot(page, "ui-study.png")

            # a run's page, through the link in the trials table
            page.locator("table.trials a[href^='/run/']").first.click()
            page.wait_for_load_state("load")
            assert page.locator("h1").inner_text().startswith("Run b-")
            assert page.locator("table.levels td[data-key='output_throughput']").count() == 1
            assert "clock 8× faster" in page.locator("body").inner_text()  # raw sim-clock numbers, said so

            # two runs side by side: the main level of each candidate
            a, b = (c["trials"][0]["levels"][-1]["bench_run"] for c in stored["candidates"])
            page.goto(f"{url}compare?a={a}&b={b}")
            assert page.locator("table.diff").is_visible()
            assert (
                page.locator(".run-a table.levels").is_visible()
                and page.locator(".run-b table.levels").is_visible()
            )
            box_a = page.locator(".run-a").bounding_box()
            box_b = page.locator(".run-b").bounding_box()
            assert box_a and box_b and box_b["x"] > box_a["x"] + 100  # side by side
            save_screenshot(page, "ui-compare.png")

            # the picker form leads to the same comparison
            page.goto(f"{url}compare")
            page.select_option("select[name=a]", a)
            page.select_option("select[name=b]", b)
            page.click("button[type=submit]")
            page.wait_for_load_state("load")
            assert page.locator("table.diff").is_visible()

            page.goto(f"{url}plan/{uid}")
            assert page.locator("h1").inner_text() == f"Plan {uid}"
            page.goto(url)
            assert page.locator(f"a[href='/study/{uid}']").is_visible()

            refused = page.request.post(f"{url}study/{uid}", data="x")
            assert refused.status == 405 and refused.headers["allow"] == "GET, HEAD"
        assert console == [], console
    finally:
        for proc in (tune, ui):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
