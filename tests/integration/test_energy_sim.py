"""Energy and cost end to end on the simulator (issue 31): a real `servelab bench` whose stored power
samples integrate to the joules it stored, read back through `runs show`; and real studies ranked by
energy and by cost, where the winner by throughput (on the simulator's own clock) is not the winner by
energy, and every $ figure follows the price given (the study's, then the flag's)."""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from tests.support import simruns
from tests.support.simruns import SimClock

from servelab.energy import integrate

pytestmark = pytest.mark.integration

# the simulated RTX PRO 6000's power (watts per GPU) the simulator draws from
POWER = tomllib.loads(resources.files("servelab").joinpath("data", "sim", "gpu_power.toml").read_text())


def _show(home: Path, uid: str, *extra: str) -> Any:
    res = simruns.servelab(home, "runs", "show", uid, *extra)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout) if "--json" in extra else res.stdout


def test_a_bench_run_stores_the_joules_its_samples_integrate_to(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sim = simruns.start_sim(tmp_path / "logs", *simruns.SIM_ARGS)
    try:
        priced = simruns.bench(
            home,
            sim.url,
            simruns.MODEL,
            *("--concurrency", "2,8", "--num-requests", "16", "--scrape-interval", "0.05"),
            *("--gpu-hour-usd", "2", "--kwh-usd", "0.1"),
        )
        unsampled = simruns.bench(
            home,
            sim.url,
            simruns.MODEL,
            "--concurrency",
            "2",
            "--num-requests",
            "4",
            "--scrape-interval",
            "0",
        )
    finally:
        sim.stop()

    shown = _show(home, priced["run"], "--json")
    assert [lv["summary"]["energy"] for lv in shown["levels"]] == [
        lv["summary"]["energy"] for lv in priced["levels"]
    ]
    pw = POWER["rtx-pro-6000"]
    for lv in shown["levels"]:
        s, e, c = lv["summary"], lv["summary"]["energy"], lv["summary"]["cost"]
        pts = [p for p in lv["series"]["points"] if p["gpu_power_w"] is not None]
        assert len(pts) >= 2 and all(p["gpus"] == 8 for p in pts)
        # the reader's samples (in the simulated GPU's time, as the summary) integrate to the stored joules
        trace = [(p["t_s"], p["gpu_power_w"] * p["gpus"]) for p in pts]
        assert e["window_s"] == pytest.approx(s["wall_s"])
        assert e["energy_j"] == pytest.approx(integrate(trace, 0.0, e["window_s"]), rel=1e-9)
        assert e["samples"] == sum(1 for t, _ in trace if 0 <= t <= e["window_s"])
        assert e["j_per_output_token"] == pytest.approx(e["energy_j"] / s["total_output_tokens"])
        assert e["j_per_request"] == pytest.approx(e["energy_j"] / s["completed"])
        assert e["output_tokens_per_j"] == pytest.approx(s["total_output_tokens"] / e["energy_j"])
        # the idle baseline: the eight GPUs before the first level, between idle and busy
        assert 8 * pw["idle"] <= e["idle_w"] < e["mean_power_w"] <= 8 * pw["active"]
        above = (e["energy_j"] - e["idle_w"] * e["window_s"]) / s["total_output_tokens"]
        assert e["j_per_output_token_above_idle"] == pytest.approx(above)
        # $ per M output tokens from the flag's price, for the layout's eight GPUs
        assert (c["price_source"], c["gpu_hour_usd"], c["gpus"]) == ("flag", 2.0, 8)
        assert c["usd_per_m_output_tokens"] == pytest.approx(2.0 * 8 / 3600 / s["output_throughput"] * 1e6)
        assert c["energy_usd_per_m_output_tokens"] == pytest.approx(e["j_per_output_token"] / 3.6 * 0.1)
    # in the simulated GPU's time: the client's clock ran 20× faster, the joules it saw are 20× fewer
    wall = shown["levels"][0]["wall_clock_summary"]["energy"]
    assert wall["energy_j"] * simruns.SPEED == pytest.approx(
        shown["levels"][0]["summary"]["energy"]["energy_j"]
    )
    human = _show(home, priced["run"])
    assert "J/out tok" in human and "$/M out tok" in human and "(flag)" in human

    # no samples (--scrape-interval 0): no energy; no price given: the catalog's, marked as a default
    [lv] = _show(home, unsampled["run"], "--json")["levels"]
    assert lv["summary"]["energy"] is None
    assert lv["summary"]["cost"]["price_source"].startswith("catalog default (")
    human = _show(home, unsampled["run"])
    assert "catalog default (" in human and "a default: give --gpu-hour-usd" in human


def test_a_server_without_metrics_still_has_its_energy_measured(tmp_path: Path) -> None:
    """The GPU check (docs/gpu.md): `transformers serve` on an H200 has no /metrics, and bench took GPU
    power only beside a /metrics sample, so no level had energy. A simulator that serves no /metrics
    (`--fault no_metrics`, as transformers serve) still has its GPUs sampled and its joules stored."""
    home = tmp_path / "home"
    sim = simruns.start_sim(tmp_path / "logs", *simruns.SIM_ARGS, "--fault", "no_metrics")
    try:
        run = simruns.bench(
            home,
            sim.url,
            simruns.MODEL,
            *("--concurrency", "2", "--num-requests", "16", "--scrape-interval", "0.05"),
        )
    finally:
        sim.stop()
    [lv] = _show(home, run["run"], "--json")["levels"]
    assert lv["server_metrics"] == {"available": False}  # the server really had no /metrics
    pts = [p for p in lv["series"]["points"] if p["gpu_power_w"] is not None]
    assert len(pts) >= 2 and all(p["requests_running"] is None for p in pts)
    s, e = lv["summary"], lv["summary"]["energy"]
    trace = [(p["t_s"], p["gpu_power_w"] * p["gpus"]) for p in pts]
    assert e["energy_j"] == pytest.approx(integrate(trace, 0.0, e["window_s"]), rel=1e-9)
    assert e["j_per_output_token"] == pytest.approx(e["energy_j"] / s["total_output_tokens"])


STUDY = """\
objective = "{objective}"

[study]
name = "{name}"

[model]
path = "Qwen3-30B-A3B"

[host]
gpu = "h100-sxm"
num_gpus = 4

[engine]
name = "sim"
startup_timeout_s = 60
[engine.options]
personality = "vllm"
speed = 20
fast_start = true
cpus = [0]

[[candidates]]
name = "tp1"
tp = 1
baseline = true

[[candidates]]
name = "tp4"
tp = 4

[workload]
input_len = 256
output_len = 128
requests_per_stream = 2
timeout_s = 30

[load]
concurrency = [8, 64]
"""


def _tune(tmp_path: Path, home: Path, objective: str, extra_toml: str = "", *flags: str) -> dict[str, Any]:
    path = tmp_path / f"{objective}.toml"
    path.write_text(STUDY.format(objective=objective, name=f"qwen-{objective}") + extra_toml)
    res = simruns.servelab(home, "tune", str(path), "--json", *flags, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout)
    assert out["status"] == "completed"
    return out


def _levels(home: Path, study: str) -> dict[str, list[dict[str, Any]]]:
    """Each candidate's trial levels (their digests, with the bench run each was measured in)."""
    res = simruns.servelab(home, "runs", "study", study, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    return {c["label"]: c["trials"][0]["levels"] for c in json.loads(res.stdout)["candidates"]}


def test_energy_and_throughput_pick_different_winners_and_cost_follows_the_price(tmp_path: Path) -> None:
    home = tmp_path / "home"
    gpus = {"tp1": 1, "tp4": 4}

    energy = _tune(tmp_path, home, "energy", "[cost]\ngpu_hour_usd = 1.0\n")
    ranked = {r["label"]: r for r in energy["ranking"]["ranked"]}
    assert energy["ranking"]["winner"] == "tp1"  # a quarter of the GPUs: fewer joules per token
    assert ranked["tp1"]["value"] < ranked["tp4"]["value"]
    levels = _levels(home, energy["study"])
    # by throughput TP4 wins: read off the simulator's own clock at the top level (a loaded box moves
    # the client's figures, never the model's timeline)
    top = {
        label: SimClock.of(_show(home, lvs[-1]["bench_run"], "--json")["levels"][0]).output_throughput
        for label, lvs in levels.items()
    }
    assert top["tp4"] > top["tp1"], top
    for label, lvs in levels.items():
        for d in lvs:
            assert d["energy"] > 0 and d["energy"] == pytest.approx(d["energy_j"] / (d["completed"] * 128))
            assert d["cost"] == pytest.approx(1.0 * gpus[label] / 3600 / d["output_throughput"] * 1e6)
        run = _show(home, lvs[0]["bench_run"], "--json")
        assert run["levels"][0]["summary"]["cost"]["price_source"] == "study"

    # the report's J/token against throughput chart: its front is the stored levels no other beats on both
    md = tmp_path / "energy.md"
    res = simruns.servelab(home, "report", energy["study"], "--md", str(md))
    assert res.returncode == 0, res.stderr[-3000:]
    model = json.loads(simruns.servelab(home, "report", energy["study"], "--json").stdout)
    stored = {
        (label, float(d["level"])): (d["output_throughput"], d["energy"])
        for label, lvs in levels.items()
        for d in lvs
    }
    members = {(m["candidate"], m["level"]) for m in model["energy_front"]}
    assert members and members <= set(stored)

    def beaten(t: float, j: float) -> bool:
        return any(t2 >= t and j2 <= j and (t2 > t or j2 < j) for t2, j2 in stored.values())

    assert all(not beaten(*stored[k]) for k in members)
    assert all(beaten(*tj) for k, tj in stored.items() if k not in members)
    caption = next(
        line for line in md.read_text().splitlines() if line.startswith("*GPU energy per output token")
    )
    assert all(f"{c} @ {lv:g}" in caption for c, lv in members), caption
    assert (tmp_path / "energy_files" / "energy.svg").exists()

    cost = _tune(tmp_path, home, "cost", "[cost]\ngpu_hour_usd = 1.0\n", "--gpu-hour-usd", "3")
    assert cost["ranking"]["winner"] == "tp1"  # a quarter of the GPUs for less than four times the tokens
    for label, lvs in _levels(home, cost["study"]).items():
        for d in lvs:  # the flag's price over the study's: three times the dollars at the same throughput
            assert d["cost"] == pytest.approx(3.0 * gpus[label] / 3600 / d["output_throughput"] * 1e6)
        run = _show(home, lvs[0]["bench_run"], "--json")
        assert run["levels"][0]["summary"]["cost"]["price_source"] == "flag"
    ranked_cost = {r["label"]: r["value"] for r in cost["ranking"]["ranked"]}
    best = {
        label: min(d["cost"] for d in c["levels"])
        for label, c in ((c["label"], c) for c in cost["candidates"])
    }
    assert ranked_cost == pytest.approx(best)


def test_a_cost_study_with_no_price_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """Ranked by cost on a GPU kind the catalog has no price for (B300), with no price given: the dry run and
    the real run refuse it up front, naming the field; a price from the flag makes the same file runnable."""
    home = tmp_path / "home"
    path = tmp_path / "cost.toml"
    path.write_text(
        STUDY.format(objective="cost", name="qwen-cost").replace('gpu = "h100-sxm"', 'gpu = "b300"')
    )
    for flags in (("--dry-run",), ()):
        res = simruns.servelab(home, "tune", str(path), *flags)
        assert res.returncode == 2, res.stderr[-3000:]
        assert "cost.gpu_hour_usd" in res.stderr and "'b300'" in res.stderr and "Traceback" not in res.stderr
    runs = simruns.servelab(home, "runs", "--json")
    assert runs.returncode == 0 and json.loads(runs.stdout)["studies"] == [], runs.stdout  # nothing stored
    priced = simruns.servelab(home, "tune", str(path), "--dry-run", "--gpu-hour-usd", "9")
    assert priced.returncode == 0, priced.stderr[-3000:]
