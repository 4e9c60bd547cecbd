"""A study's start-up phases, end to end on the simulator (issue 31): the vLLM personality prints its
start-up log and keeps a compile cache where VLLM_CACHE_ROOT says, so a study's first trial starts cold
and its second warm; the phases are stored per trial and shown by `runs study` (human and --json) and the
report. A `[slo] max_startup_s` no launch can meet fails every candidate with a finding; the study ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.test_tune_sim import by_label, servelab, write_study

pytestmark = pytest.mark.integration


def test_phases_stored_cold_then_warm_and_shown(tmp_path: Path) -> None:
    cache = tmp_path / "vllm-cache"
    study = write_study(
        tmp_path / "startup.toml",
        "startup",
        [{"name": "tp1", "tp": 1}],
        levels=[1],
        extra_engine={"env": {"VLLM_CACHE_ROOT": str(cache)}},
        top="repeats = 2",
    )
    home = tmp_path / "home"
    out = json.loads(servelab("tune", str(study), "--json", home=home).stdout)
    assert by_label(out)["tp1"]["status"] == "measured"
    detail = json.loads(servelab("runs", "study", out["study"], "--json", home=home).stdout)
    trials = detail["candidates"][0]["trials"]
    assert [t["startup"]["cache"] for t in trials] == ["cold", "warm"]
    cold, warm = (t["startup"] for t in trials)
    for s in (cold, warm):
        assert [p["name"] for p in s["phases"]] == ["weights", "compile", "kv_cache", "graphs", "listening"]
        assert s["total_s"] > 0
        seen = [p["at_s"] for p in s["phases"]]
        assert all(x is not None for x in seen) and seen == sorted(seen) and seen[-1] <= s["total_s"]
    took = {
        n: [next(p["took_s"] for p in s["phases"] if p["name"] == n) for s in (cold, warm)]
        for n in ("weights", "compile")
    }
    # the simulator's own figures (model seconds, data/sim/personalities.toml): the same weights, a compile
    # loaded back from the cache in a tenth of the time
    assert took["weights"][0] == took["weights"][1] > 0
    assert took["compile"][0] == 25.0 and took["compile"][1] == 2.5
    assert "empty at launch" in cold["cache_evidence"][0] and "held entries" in warm["cache_evidence"][0]
    assert any("Compiling a graph" in e for e in cold["cache_evidence"])
    assert any("Directly load the compiled graph" in e for e in warm["cache_evidence"])
    # the trial's own log holds the lines the phases were read from
    log = Path(trials[0]["log_path"]).read_text()
    assert all(p["line"] in log for p in cold["phases"])

    human = servelab("runs", "study", out["study"], home=home).stdout
    assert "start-up" in human and "cold" in human and "warm" in human
    text = servelab("report", out["study"], home=home).stdout
    assert "### Start-up" in text and "| tp1 | 1 | cold |" in text and "| tp1 | 2 | warm |" in text
    page = tmp_path / "report.html"
    servelab("report", out["study"], "--html", str(page), home=home)
    html = page.read_text()
    assert '<h3 id="startup">Start-up</h3>' in html and "<td>warm</td>" in html


def test_a_start_up_bound_no_launch_meets_is_a_finding(tmp_path: Path) -> None:
    study = write_study(
        tmp_path / "bound.toml",
        "bound",
        [{"name": "tp1", "tp": 1}, {"name": "tp1-seqs8", "tp": 1, "max_concurrency": 8}],
        levels=[1],
        top="[slo]\nmax_startup_s = 0.001",
    )
    home = tmp_path / "home"
    out = json.loads(servelab("tune", str(study), "--json", home=home).stdout)
    for c in out["candidates"]:
        assert c["status"] == "failed"
        assert c["diagnosis"]["class"] == "startup_over_bound"
        assert "max_startup_s = 0.001" in c["diagnosis"]["evidence"]
    detail = json.loads(servelab("runs", "study", out["study"], "--json", home=home).stdout)
    assert detail["status"] == "completed"
    trial = detail["candidates"][0]["trials"][0]
    assert trial["status"] == "failed" and trial["startup"]["total_s"] > 0.001
    assert trial["diagnosis"]["class"] == "startup_over_bound"
    human = servelab("runs", "study", out["study"], home=home).stdout
    assert "startup_over_bound" in human


def test_a_bound_that_is_not_positive_is_refused_with_its_field(tmp_path: Path) -> None:
    study = write_study(tmp_path / "bad.toml", "bad", [{"name": "tp1"}], top="[slo]\nmax_startup_s = 0")
    res = servelab("tune", str(study), "--json", home=tmp_path / "home", check=False)
    assert res.returncode == 2
    assert "slo.max_startup_s" in res.stdout + res.stderr
