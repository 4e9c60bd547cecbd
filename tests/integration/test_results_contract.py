"""The results contract end to end: runs written by the real `servelab bench` against a live simulator,
read back by every reader — `runs show`, `explain`, `calibrate fit --run`, the UI — in one time base."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from tests.conftest import SimBenchRuns
from tests.support import simruns

from servelab.store.bench import BenchRepo
from servelab.store.db import open_store
from servelab.ui.server import make_server, serve_in_thread, url_of

pytestmark = pytest.mark.integration


@pytest.fixture
def home(sim_bench_home: SimBenchRuns, servelab_home: Path) -> Path:
    simruns.copy_store(sim_bench_home.home, servelab_home)
    return servelab_home


def _json(home: Path, *args: str) -> dict:
    res = simruns.servelab(home, *args, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _predict(home: Path, concurrency: int) -> dict:
    return _json(
        home,
        "predict",
        *simruns.PREDICT_ARGS,
        "--isl",
        str(simruns.ISL),
        "--osl",
        str(simruns.OSL),
        "--concurrency",
        str(concurrency),
    )


def test_bench_records_host_layout_and_clock_from_the_simulator(
    home: Path, sim_bench_home: SimBenchRuns
) -> None:
    run = _json(home, "runs", "show", sim_bench_home.runs[0])
    ctx = run["context"]
    assert ctx["host"] == {
        "gpu": "rtx-pro-6000",
        "num_gpus": 8,
        "interconnect": ctx["host"]["interconnect"],
        "source": "server",
    }
    assert ctx["layout"]["tp"] == 8 and ctx["clock"]["speed"] == simruns.SPEED
    assert run["time_base"] == "simulated GPU time"
    for lv in run["levels"]:
        shown, wall = lv["summary"], lv["wall_clock_summary"]
        # one time base shown, the client's own clock beside it, labelled: × speed and ÷ speed exactly
        assert shown["tpot_ms"]["p50"] == pytest.approx(wall["tpot_ms"]["p50"] * simruns.SPEED)
        assert shown["output_throughput"] == pytest.approx(wall["output_throughput"] / simruns.SPEED)
        assert shown["vllm_compatible"]["median_tpot_ms"] == shown["tpot_ms"]["p50"]


def test_runs_show_ui_and_predict_agree_in_gpu_time(home: Path, sim_bench_home: SimBenchRuns) -> None:
    uid = sim_bench_home.runs[0]
    run = _json(home, "runs", "show", uid)
    server = make_server("127.0.0.1", 0, home / "servelab.db")
    serve_in_thread(server)
    try:
        with urllib.request.urlopen(url_of(server) + f"/api/run/{uid}", timeout=10) as r:
            ui = json.loads(r.read())
    finally:
        server.shutdown()
        server.server_close()
    ui_levels = {float(lv["level"]): lv for lv in ui["levels"]}
    for lv in run["levels"]:
        s = lv["summary"]
        u = ui_levels[float(s["value"])]
        assert u["tpot_ms_p50"] == pytest.approx(s["tpot_ms"]["p50"])
        assert u["output_throughput"] == pytest.approx(s["output_throughput"])
        # the simulator is timed by the same model: its own clock matches the prediction (the sim's 5 %),
        # and the shown numbers are that clock's, in GPU time (simruns.assert_gpu_time)
        simruns.assert_gpu_time(s, simruns.SimClock.of(lv), _predict(home, int(s["value"])))


def test_explain_needs_no_flags_for_a_run_that_recorded_its_host(
    home: Path, sim_bench_home: SimBenchRuns
) -> None:
    d = _json(home, "explain", "last")
    assert d["run"] == sim_bench_home.runs[-1] and d["gpu"] and d["layout"]["tp"] == 8
    assert d["time_base"] == "simulated GPU time"
    d = _json(home, "explain", sim_bench_home.runs[0])
    assert [lv["concurrency"] for lv in d["levels"]] == [1, 4, 16]
    for lv in d["levels"]:
        assert lv["measured"]["tpot_ms"] is not None and lv["predicted"]["tpot_ms"] is not None
        # measured in the simulated GPU's time, so within the simulator's fidelity of the model
        assert abs(lv["error_pct"]["tpot_ms"]) < 5, lv


def test_calibrate_fit_learns_from_bench_runs_without_flags(home: Path, sim_bench_home: SimBenchRuns) -> None:
    d = _json(
        home, "calibrate", "fit", "--name", "mine", *[a for r in sim_bench_home.runs for a in ("--run", r)]
    )
    assert d["name"] == "mine" and d["factors"]
    assert d["report"]["observations"] >= 5 if "observations" in d["report"] else True
    with open_store(home / "servelab.db") as store:
        run = BenchRepo(store).load(sim_bench_home.runs[0])
    assert run.context.host.gpu == "rtx-pro-6000"


def test_bench_flags_override_what_the_server_reports(servelab_home: Path, tmp_path: Path) -> None:
    sim = simruns.start_sim(tmp_path / "logs", *simruns.SIM_ARGS)
    try:
        run = simruns.bench(
            servelab_home,
            sim.url,
            simruns.MODEL,
            "--concurrency",
            "1",
            "--num-requests",
            "4",
            "--gpu",
            "h200-sxm",
            "--tp",
            "4",
        )
    finally:
        sim.stop()
    host, layout = run["context"]["host"], run["context"]["layout"]
    assert host["source"] == "flags" and host["gpu"] == "h200-sxm" and layout["tp"] == 4
    assert host["num_gpus"] == 8  # not given: what the server said stays
    assert run["context"]["clock"]["speed"] == simruns.SPEED


def test_explain_flags_override_what_the_run_recorded(home: Path, sim_bench_home: SimBenchRuns) -> None:
    uid = sim_bench_home.runs[0]
    shown = _json(home, "runs", "show", uid)
    d = _json(home, "explain", uid, "--tp", "4", "--pp", "2")
    assert d["layout"]["tp"] == 4 and d["layout"]["pp"] == 2 and d["num_gpus"] == 8
    assert len(d["levels"]) == 3
    assert d["levels"][1]["measured"]["tpot_ms"] == pytest.approx(
        shown["levels"][1]["summary"]["tpot_ms"]["p50"]
    )
    assert d["largest_gap"]
    assert "measured_comm_overhead_ms" in d["levels"][0]["attribution"]


def test_explain_of_a_run_that_does_not_know_its_gpu_asks_for_it(
    fault_server_factory, servelab_home: Path
) -> None:
    srv = fault_server_factory(token_interval_ms=1, ttft_ms=5)
    simruns.bench(servelab_home, srv.url, "fault-model", "--concurrency", "1", "--num-requests", "4")
    res = simruns.servelab(servelab_home, "explain", "last")
    assert res.returncode == 2 and "--gpu" in res.stderr + res.stdout
    res = simruns.servelab(servelab_home, "calibrate", "fit", "--name", "x", "--run", "last")
    assert res.returncode == 2 and "no GPU recorded" in res.stderr + res.stdout


def test_calibration_from_runs_applies_to_predict(home: Path, sim_bench_home: SimBenchRuns) -> None:
    _json(home, "calibrate", "fit", "--name", "mine", "--run", sim_bench_home.runs[0])
    with open_store(home / "servelab.db") as store:
        from servelab.store.calibrations import get

        cal = get(store, "mine")
    assert cal.kind == "fit" and "bw_eff" in cal.factors
    d = _json(
        home,
        "predict",
        *simruns.PREDICT_ARGS,
        "--calibration",
        "mine",
    )
    assert d["tpot_ms"] > 0
    res = simruns.servelab(
        home,
        "predict",
        *simruns.PREDICT_ARGS,
        "--calibration",
        "nope",
    )
    assert res.returncode == 2 and "no calibration" in res.stderr + res.stdout


STUDY = """\
repeats = 1
verify_output = false

[study]
name = "contract"

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

[workload]
input_len = 2048
output_len = 64
requests_per_stream = 6

[load]
concurrency = [1, 4]
"""


def test_a_study_run_is_shown_alike_everywhere_in_gpu_time(servelab_home: Path, tmp_path: Path) -> None:
    """tune (speed 20) → its bench runs: `runs show`, `runs study`, the report, the UI, `explain` with no
    flags and `predict` for the same configuration all show one set of numbers."""
    study = tmp_path / "study.toml"
    study.write_text(STUDY)
    res = simruns.servelab(servelab_home, "tune", str(study), "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    trial = _json(servelab_home, "runs", "study", "last")["candidates"][0]["trials"][0]
    report = _json(servelab_home, "report", "last", "--no-host-checks")
    rep_levels = {float(lv["level"]): lv for lv in report["candidates"][0]["levels"]}
    server = make_server("127.0.0.1", 0, servelab_home / "servelab.db")
    serve_in_thread(server)
    try:
        for digest in trial["levels"]:
            uid = digest["bench_run"]
            shown = _json(servelab_home, "runs", "show", uid)
            assert (
                shown["time_base"] == "simulated GPU time" and shown["context"]["host"]["source"] == "study"
            )
            s = shown["levels"][0]["summary"]
            with urllib.request.urlopen(url_of(server) + f"/api/run/{uid}", timeout=10) as r:
                ui = json.loads(r.read())["levels"][0]
            rep = rep_levels[float(s["value"])]
            for key, ours in (
                ("tpot_ms_p50", s["tpot_ms"]["p50"]),
                ("ttft_ms_p50", s["ttft_ms"]["p50"]),
                ("output_throughput", s["output_throughput"]),
            ):
                assert digest[key] == pytest.approx(ours) and ui[key] == pytest.approx(ours)
                assert rep[key] == pytest.approx(ours)
            pred = _json(
                servelab_home,
                "predict",
                *simruns.PREDICT_ARGS,
                "--isl",
                "2048",
                "--osl",
                "64",
                "--concurrency",
                str(int(s["value"])),
            )
            simruns.assert_gpu_time(s, simruns.SimClock.of(shown["levels"][0]), pred)
            fit = _json(servelab_home, "calibrate", "fit", "--name", f"from-{uid}", "--run", uid)
            assert fit["report"]["rows"] == 1  # the study's run recorded what it ran on: usable as is
            ex = _json(servelab_home, "explain", uid)  # the study recorded host and layout: no flags
            assert ex["gpu"] and ex["layout"]["tp"] == 8
            assert ex["levels"][0]["measured"]["tpot_ms"] == pytest.approx(s["tpot_ms"]["p50"])
    finally:
        server.shutdown()
        server.server_close()
