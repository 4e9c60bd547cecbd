"""`bench --find-capacity` and saturation detection against the real simulator, whose capacity under an
SLO the performance model gives (`model.predict.capacity`): the search has a known answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support import simruns, trace_samples
from tests.support.simruns import ISL, MODEL, OSL, SIM_ARGS, SPEED

from servelab.model.predict import capacity, make_setup

pytestmark = pytest.mark.integration

LENGTHS = ["--input-len", str(ISL), "--output-len", str(OSL)]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[simruns.SimProcess]:
    proc = simruns.start_sim(tmp_path_factory.mktemp("capsim"), *SIM_ARGS)
    yield proc
    proc.stop()


def test_the_search_lands_on_the_models_capacity(sim: simruns.SimProcess, tmp_path: Path) -> None:
    """p99 TPOT ≤ 100 ms on the story's box: the model says 19 streams (TPOT 99.3 ms; 20 would be
    103.2); the search must land within 10 % of it in at most 8 probes."""
    known = capacity(
        make_setup(MODEL, "rtx-pro-6000", 8, tp=8, engine="sglang"), ISL, OSL, tpot_ms=100
    ).concurrency
    assert known == 19
    slo = "p99_tpot_ms<=100"
    d = simruns.bench(
        tmp_path, sim.url, MODEL, *LENGTHS, "--find-capacity", "--slo", slo, "--concurrency", "8",
        "--resolution", "10%", "--requests-per-stream", "4",
    )  # fmt: skip
    cap = d["capacity"]
    print(json.dumps({k: cap[k] for k in ("capacity", "bracket", "stop_reason")}), known)
    assert cap["by"] == "concurrency" and cap["slo"] == slo
    assert len(cap["probes"]) <= 8
    assert cap["capacity"] == pytest.approx(known, rel=0.10)
    assert cap["converged"] and cap["stop_reason"].startswith("converged")
    ok, bad = cap["bracket"]
    assert ok == cap["capacity"] and bad is not None and bad - ok == cap["step"]
    # every probe is a stored level of the run, in the order walked, its verdict from the p99 asked
    assert [lv["summary"]["value"] for lv in d["levels"]] == [p["load"] for p in cap["probes"]]
    assert [p["level"] for p in cap["probes"]] == list(range(len(cap["probes"])))
    for p in cap["probes"]:
        assert p["passed"] == (p["values"]["p99_tpot_ms"] <= 100)
    # the stored run says the same, in both views
    shown = simruns.servelab(tmp_path, "runs", "show", d["run"], "--json")
    assert json.loads(shown.stdout)["capacity"] == cap
    human = simruns.servelab(tmp_path, "runs", "show", d["run"])
    assert human.returncode == 0, human.stderr
    assert f"capacity: {cap['capacity']:g} streams" in human.stdout


def test_the_search_by_rate_lands_on_the_models_rate(sim: simruns.SimProcess, tmp_path: Path) -> None:
    """By rate, with the defaults (from 1 request/s, ×4, 10 %, at most 8 probes): the model's capacity
    under p99 TPOT ≤ 100 ms is 19 streams, which serve 2.33 requests/s of the GPU's time (19 ÷ the
    predicted end-to-end latency), 46.5/s on the client's clock at speed 20. Constant arrivals keep the
    streams in flight at that (Little's law); Poisson ones burst above it and their p99 TPOT lands
    some 15 % lower. 1.5 s probes: at least 60 requests each near the answer. Tokens are timed by the
    simulator's step clock (`--token-clock server`): on the client's, one ~50 ms stall of either process
    as a stream ends adds 20 × 50 / 63 ms to that request's TPOT and tips the probe 2.6 % under the
    model's rate (p99 84.6 ms), as it did once in a clean-clone run."""
    cap_ = capacity(make_setup(MODEL, "rtx-pro-6000", 8, tp=8, engine="sglang"), ISL, OSL, tpot_ms=100)
    assert cap_.rate is not None
    known = cap_.rate * SPEED
    slo = "p99_tpot_ms<=100"
    d = simruns.bench(
        tmp_path, sim.url, MODEL, *LENGTHS, "--find-capacity", "--by", "rate", "--slo", slo,
        "--arrival", "constant", "--duration", "1.5", "--token-clock", "server",
    )  # fmt: skip
    cap = d["capacity"]
    print(json.dumps({k: cap[k] for k in ("capacity", "bracket", "stop_reason")}), f"{known:.1f}")
    for p, lv in zip(cap["probes"], d["levels"], strict=False):  # shown when an assertion below fails
        c = lv["client"]
        print(p["load"], p["passed"], p["values"], c["send_lateness_ms"], c["send_lateness_own_ms"])
        print("   ", c["loop_lag_ms"], c["cpu_utilization"], lv["summary"].get("server"))
    assert cap["by"] == "rate" and cap["resolution"] == 0.10
    assert cap["probes"][0]["load"] == 1 and len(cap["probes"]) <= 8
    assert cap["converged"] and cap["stop_reason"].startswith("converged")
    assert cap["capacity"] == pytest.approx(known, rel=0.10)
    ok, bad = cap["bracket"]
    assert ok == cap["capacity"] and bad is not None and bad - ok <= 0.10 * ok + 1e-9
    assert [lv["summary"]["value"] for lv in d["levels"]] == [p["load"] for p in cap["probes"]]
    for p, lv in zip(cap["probes"], d["levels"], strict=True):
        assert lv["summary"]["mode"] == "rate" and lv["saturation"] is not None  # open loop: checked
        if not p["stopped_early"]:
            assert p["passed"] == (p["values"]["p99_tpot_ms"] <= 100), p


def test_saturation_flags_the_level_the_server_could_not_keep_up_with(
    sim: simruns.SimProcess, tmp_path: Path
) -> None:
    """10 requests/s (client clock) is well under the box's ~50/s at speed 20; 150/s is three times
    over it. Records as the real writer stored them."""
    calm_run = simruns.bench(tmp_path, sim.url, MODEL, *LENGTHS, "--rate", "10", "--num-requests", "30")
    d = simruns.bench(tmp_path, sim.url, MODEL, *LENGTHS, "--rate", "150", "--num-requests", "200")
    calm, over = calm_run["levels"][0]["saturation"], d["levels"][0]["saturation"]
    assert not calm["server_saturated"] and not calm["client_saturated"] and calm["reasons"] == []
    assert calm["completion_rate"] == pytest.approx(calm["arrival_rate"], rel=0.35)
    assert over["server_saturated"] and over["stopped_early"] is None
    assert any("completions fell behind" in r for r in over["reasons"])
    assert any("TTFT rose linearly" in r for r in over["reasons"]) and over["ttft_slope_t"] > 5
    assert over["completion_rate"] < 0.8 * over["arrival_rate"]
    assert [w for w in d["warnings"] if "could not keep up" in w] == [
        next(w for w in d["warnings"] if w.startswith("level rate=150/s"))
    ]
    assert not [w for w in calm_run["warnings"] if "could not keep up" in w]
    human = simruns.servelab(tmp_path, "runs", "show", d["run"])
    assert "rate=150/s (saturated)" in human.stdout and "could not keep up" in human.stdout


def test_a_trace_replayed_faster_than_the_server_serves_is_flagged(
    sim: simruns.SimProcess, tmp_path: Path
) -> None:
    """A trace is an open-loop level too: the Mooncake sample at ×20 (200 requests/s over 0.5 s, client
    clock) is over twice what this box completes at speed 20 (under 80/s of these lengths); at ×2 (20/s)
    it keeps up."""
    trace = str(trace_samples.DIR / "mooncake.jsonl")
    runs = [simruns.bench(tmp_path, sim.url, MODEL, "--trace", trace, "--time-scale", x) for x in ("2", "20")]
    calm, over = (r["levels"][0]["saturation"] for r in runs)
    print(json.dumps(over))
    assert calm is not None and not calm["server_saturated"], calm
    assert over["server_saturated"] and over["stopped_early"] is None, over
    assert any("completions fell behind" in r for r in over["reasons"]), over
    assert any("TTFT rose linearly" in r for r in over["reasons"]) and over["ttft_slope_t"] > 5, over
    assert over["completion_rate"] < 0.8 * over["arrival_rate"]
    label = runs[1]["levels"][0]["label"]
    assert label == "trace mooncake ×20"
    assert any(w.startswith(f"level {label}: the server could not keep up") for w in runs[1]["warnings"])
    assert not [w for w in runs[0]["warnings"] if "could not keep up" in w]


def test_a_clearly_over_saturated_probe_stops_early(sim: simruns.SimProcess, tmp_path: Path) -> None:
    """A rate probe at 6× the capacity stops sending within its window and fails the SLO."""
    d = simruns.bench(
        tmp_path, sim.url, MODEL, *LENGTHS, "--find-capacity", "--slo", "p99_ttft_ms<=4000", "--rate", "300",
        "--duration", "6", "--max-probes", "1",
    )  # fmt: skip
    (probe,) = d["capacity"]["probes"]
    assert probe["stopped_early"] and not probe["passed"]
    assert probe["reasons"][0].startswith("stopped early:")
    sat = d["levels"][0]["saturation"]
    assert sat["stopped_early"] and sat["server_saturated"]
    wall = d["levels"][0]["wall_clock_summary"]
    print(sat["stopped_early"], wall["wall_s"], wall["num_requests"])
    assert wall["wall_s"] < 6 and wall["num_requests"] < 300 * 6 * 0.8  # it stopped sending
    assert d["capacity"]["capacity"] is None and "max probes" in d["capacity"]["stop_reason"]
