"""A study's load kind survives every reader (issue 30): a rate study and a trace study on the simulator run
through `tune`, then `report --json`, `explain --json` of their runs and `predict --study --json`. Each shows
the study's main level in its own unit and mode: a rate level stays a rate in req/s, a trace level its time
scale; neither is silently turned into a concurrency (`int(1.5)` requests in flight)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.support import simruns, trace_samples

pytestmark = pytest.mark.integration

HEAD = """\
repeats = 1
verify_output = false

[study]
name = "{name}"

[model]
path = "GLM-5-NVFP4"

[host]
gpu = "rtx-pro-6000"
num_gpus = 8

[engine]
name = "sim"
args = ["--disable-radix-cache"]
startup_timeout_s = 60
[engine.options]
personality = "sglang"
speed = 20
fast_start = true

[[candidates]]
name = "tp8"
tp = 8
baseline = true
"""

RATE = (
    HEAD.format(name="rate-kind")
    + """
[workload]
input_len = 256
output_len = 16
num_requests = 6

[load]
rate = [1.5, 2.5]
"""
)

TRACE = (
    HEAD.format(name="trace-kind")
    + """
[workload]
num_requests = 8

[load]
trace = "{trace}"
time_scale = [5.0, 10.0]
"""
)


def _json(home: Path, *args: str) -> Any:
    res = simruns.servelab(home, *args, "--json", timeout=600)
    assert res.returncode == 0, f"{args}: {res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return json.loads(res.stdout)


def _check(home: Path, study: Path, mode: str, levels: list[float], unit: str, label: str) -> None:
    main = max(levels)
    tuned = _json(home, "tune", str(study))
    assert tuned["status"] == "completed"
    assert tuned["load"] == {"mode": mode, "levels": levels, "main": main, "unit": unit}
    (cand,) = tuned["candidates"]
    assert [lv["level"] for lv in cand["levels"]] == levels
    assert all(lv["mode"] == mode for lv in cand["levels"])
    # the model's view names the level it was asked about, in the study's unit, beside the concurrency
    # the model stood it for
    assert cand["predicted"]["load"] == {"mode": mode, "level": main, "unit": unit}

    report = _json(home, "report", "last", "--no-host-checks")
    assert report["study"]["load"] == {"mode": mode, "levels": levels, "main": main, "unit": unit}
    rep_levels = report["candidates"][0]["levels"]
    assert [lv["level"] for lv in rep_levels] == levels and all(lv["mode"] == mode for lv in rep_levels)
    ex = report["explain"]
    assert ex["available"], ex
    assert [(lv["mode"], lv["level"]) for lv in ex["levels"]] == [(mode, v) for v in levels]
    assert ex["decode"]["mode"] == mode and ex["decode"]["level"] == main
    assert mode in ex["largest_gap"] or unit in ex["largest_gap"] or "×" in ex["largest_gap"]

    md = simruns.servelab(home, "report", "last", "--no-host-checks", timeout=600).stdout
    assert f"- load: {mode} {', '.join(f'{v:g}' for v in levels)};" in md  # a rate of 1.5 is not "2"
    assert f"({label})" in md  # the explain table names the level beside the requests in flight

    trial = _json(home, "runs", "study", "last")["candidates"][0]["trials"][0]
    for digest, level in zip(trial["levels"], levels, strict=True):
        assert digest["level"] == level and digest["mode"] == mode
        explained = _json(home, "explain", digest["bench_run"])
        (lv,) = explained["levels"]
        assert lv["mode"] == mode and lv["level"] == level
        # the requests in flight at that load, as measured (Little's law), not int(level)
        assert lv["concurrency"] >= 1

    pred = _json(home, "predict", "--study", str(study))
    assert pred["concurrency_source"] == "study"
    assert pred["load"] == {"mode": mode, "level": main, "unit": unit}


def test_a_rate_study_keeps_its_rate_everywhere(servelab_home: Path, tmp_path: Path) -> None:
    study = tmp_path / "rate.toml"
    study.write_text(RATE)
    _check(servelab_home, study, "rate", [1.5, 2.5], "req/s", "rate 1.5 req/s")


def test_a_trace_study_keeps_its_time_scale_everywhere(servelab_home: Path, tmp_path: Path) -> None:
    study = tmp_path / "trace.toml"
    study.write_text(TRACE.format(trace=trace_samples.DIR / "mooncake.jsonl"))
    _check(servelab_home, study, "trace", [5.0, 10.0], "× trace time", "trace ×5")
