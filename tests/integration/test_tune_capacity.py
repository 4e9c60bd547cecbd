"""`objective = "capacity"`: a study whose candidates are ranked by the capacity a search finds on each
candidate's server, against the simulator (GLM-5 on eight RTX PRO 6000, SGLang personality)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.test_tune_sim import servelab, write_study
from tests.support.sim_study import CANDIDATES

pytestmark = pytest.mark.integration


def test_candidates_ranked_by_capacity(tmp_path: Path) -> None:
    """TP8 holds ~20 streams under p99 TPOT ≤ 100 ms (the model's answer); the allreduce-fusion flag's
    collapse holds not even one. A coarse search (25 %, 3 probes) keeps the test short."""
    path = write_study(
        tmp_path / "study.toml",
        "capacity-study",
        CANDIDATES,
        model="GLM-5-NVFP4",
        gpu="rtx-pro-6000",
        num_gpus=8,
        personality="sglang",
        levels=[8],
        speed=60,
        extra_engine={"args": ["--disable-radix-cache"]},
        top='objective = "capacity"\n[slo]\ntpot_ms = { p99 = 100 }',
    )
    text = path.read_text().replace("input_len = 256\n", "input_len = 2048\noutput_len = 64\n", 1)
    text = text.replace("output_len = 32\n", "", 1) + "resolution = 0.25\nmax_probes = 3\n"
    path.write_text(text)
    shown = servelab("tune", str(path), home=tmp_path / "home", timeout=300).stdout
    assert "(capacity)" in shown and "+ step" in shown
    out = json.loads(servelab("runs", "study", "last", "--json", home=tmp_path / "home").stdout)
    ranking = out["ranking"]
    assert ranking["objective"] == "capacity"
    assert ranking["winner"] == "tp8", ranking
    best, other = ranking["ranked"]
    assert best["label"] == "tp8" and 12 <= best["value"] <= 32 and best["half_width"] > 0
    assert other["value"] is None and "capacity search" in other["why"]
    # each candidate's search is one stored bench run, its probes the run's levels
    trial = next(t for c in out["candidates"] for t in c["trials"] if c["label"] == "tp8")
    (level,) = trial["levels"]
    assert level["capacity"] == best["value"] and level["capacity_stop"]
    run = json.loads(servelab("runs", "show", level["bench_run"], "--json", home=tmp_path / "home").stdout)
    assert run["capacity"]["capacity"] == best["value"] and len(run["capacity"]["probes"]) <= 3
    assert [lv["summary"]["value"] for lv in run["levels"]] == [p["load"] for p in run["capacity"]["probes"]]
