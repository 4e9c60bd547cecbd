"""The server's telemetry on the client's timeline, the per-request export and the report of a plain bench
run, all on the one real run `tests/support/sim_bench.py` makes against the simulator: the reader of each
is tested on what `servelab bench` wrote."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import orjson
import pytest
from tests.support.sim_bench import INTERVAL_S, SimBench
from tests.support.sim_bench import sim_bench as sim_bench  # the session's shared run (a fixture)
from tests.support.simruns import SPEED, servelab

from servelab.bench.export import COLUMNS
from servelab.bench.metrics import tpot_s
from servelab.store import open_store
from servelab.store.bench import BenchRepo

pytestmark = pytest.mark.integration


def _cli(home: Path, *args: str) -> tuple[int, str, str]:
    res = servelab(home, *args)
    return res.returncode, res.stdout, res.stderr


def stored(home: Path, uid: str) -> dict[int, list[dict[str, object]]]:
    """Every stored request of run `uid`, per level index, as the export's columns."""
    with open_store(home / "servelab.db") as store:
        repo = BenchRepo(store)
        run = repo.load(uid)
        ids = repo.level_ids(run.id)
        return {
            lv.index: [
                {
                    "idx": r.idx,
                    "prompt_idx": r.prompt_idx,
                    "scheduled_s": r.scheduled_s,
                    "start_s": r.start_s,
                    "ok": r.ok,
                    "error_kind": r.error_kind,
                    "ttft_s": r.ttft_s,
                    "tpot_s": tpot_s(r),
                    "e2e_s": r.e2e_s,
                    "itl_count": len(r.itl_s),
                    "input_tokens": r.input_tokens,
                    "output_tokens": r.output_tokens,
                    "requested_output_tokens": r.requested_output_tokens,
                    "token_source": r.token_source,
                    "error_message": r.error_message,
                }
                for r in repo.requests(ids[lv.index])
            ]
            for lv in run.levels
        }


def test_every_level_stores_its_series_on_the_clients_timeline(sim_bench: SimBench) -> None:
    code, out, err = _cli(sim_bench.home, "runs", "show", sim_bench.uid, "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert [lv["series"] for lv in shown["levels"]] == [lv["series"] for lv in sim_bench.result["levels"]]
    light, heavy = shown["levels"]
    for lv in (light, heavy):
        series, wall = lv["series"], lv["wall_clock_summary"]["wall_s"]
        # shown in the simulated GPU's time, as every other figure of the run
        assert series["interval_s"] == pytest.approx(INTERVAL_S * SPEED)
        assert series["gpu_source"] == "http:/servelab/gpus"
        pts = series["points"]
        expected = wall / INTERVAL_S
        assert abs(len(pts) - expected) <= max(2.0, 0.2 * expected), (len(pts), expected)
        ts = [p["t_s"] / SPEED for p in pts]  # back on the client's clock
        assert ts == sorted(ts) and 0 < ts[0] <= 2 * INTERVAL_S and ts[-1] <= wall + 2 * INTERVAL_S
        assert all(p["gpu_power_w"] > 0 and 0 <= p["gpu_util"] <= 1 and p["gpus"] == 8 for p in pts)
        assert max(p["gpu_util"] for p in pts) > 0.3  # busy while the load ran (idle: 0)
        assert all(p["requests_running"] is not None and p["kv_cache_usage"] is not None for p in pts)
        # generation_tokens is the counter's change per sample: it sums to what the server generated
        gen = sum(p["generation_tokens"] or 0 for p in pts)
        assert 0 < gen <= lv["server_metrics"]["deltas"]["generation_tokens"]
        assert lv["server_metrics"]["num_samples"] == len(pts)
    # 150 requests/s is more than the server keeps up with: its queue is seen growing
    assert max(p["requests_waiting"] for p in heavy["series"]["points"]) > 0
    assert max(p["requests_waiting"] for p in light["series"]["points"]) <= max(
        p["requests_waiting"] for p in heavy["series"]["points"]
    )


def test_the_export_holds_every_stored_request(sim_bench: SimBench, tmp_path: Path) -> None:
    want = stored(sim_bench.home, sim_bench.uid)
    lines = sim_bench.export.read_bytes().splitlines()
    rows = [orjson.loads(line) for line in lines]
    assert [list(r) for r in rows[:1]] == [list(COLUMNS)]
    assert len(rows) == sum(len(v) for v in want.values()) > 100
    for level, reqs in want.items():
        got = [
            {k: v for k, v in r.items() if k not in ("level", "label")} for r in rows if r["level"] == level
        ]
        assert got == reqs, level

    csv_file = tmp_path / "requests.csv"
    code, _out, err = _cli(
        sim_bench.home, "runs", "show", sim_bench.uid, "--export-requests", str(csv_file), "--json"
    )
    assert code == 0, err
    with open(csv_file, newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    for got, row in zip(table, rows, strict=True):
        for key in COLUMNS:
            v = row[key]
            if v is None:
                assert got[key] == "", key
            elif isinstance(v, bool):
                assert got[key] == str(v).lower(), key
            elif isinstance(v, float):
                assert float(got[key]) == v, key  # exactly: the CSV keeps every digit
            else:
                assert got[key] == str(v), key
    assert not list(tmp_path.glob(".*part"))  # written through a temporary file, renamed into place


def test_a_bad_export_path_is_refused_before_measuring(sim_bench: SimBench, tmp_path: Path) -> None:
    """Exit 2 before the server is even asked: the URL here answers nothing (it would be exit 1)."""
    out = tmp_path / "requests.txt"
    code, _out, err = _cli(
        tmp_path / "home",
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--concurrency",
        "1",
        "--num-requests",
        "1",
        "--export-requests",
        str(out),
    )
    assert code == 2, err
    assert "--export-requests" in err and "unknown format '.txt'" in err and "Traceback" not in err
    assert not out.exists()
    missing = tmp_path / "no-such-dir" / "requests.csv"
    code, _out, err = _cli(sim_bench.home, "runs", "show", "--export-requests", str(missing))
    assert code == 2 and "cannot write in" in err and not missing.parent.exists()


def test_report_of_the_run(sim_bench: SimBench, tmp_path: Path) -> None:
    uid = sim_bench.uid
    code, md, err = _cli(sim_bench.home, "report", uid)
    assert code == 0, err
    assert md.startswith(f"# Bench run {uid}\n")
    for heading in ("## Every level", "## Plots", "## The server over time"):
        assert heading in md
    code, out, err = _cli(
        sim_bench.home, "report", "--run", uid[:6], "--json", "--md", str(tmp_path / "r" / "run.md")
    )
    assert code == 0, err
    model = json.loads(out)
    assert model["format"] == "servelab-run-report/1" and model["run"]["uid"] == uid
    levels = sim_bench.result["levels"]
    assert [lv["output_throughput"] for lv in model["levels"]] == [
        lv["summary"]["output_throughput"] for lv in levels
    ]
    assert [lv["ttft_ms_p99"] for lv in model["levels"]] == [lv["summary"]["ttft_ms"]["p99"] for lv in levels]
    assert [t["series"] for t in model["timelines"]] == [lv["series"] for lv in levels]
    for c, lv in zip(model["cdfs"], levels, strict=True):
        assert c["ttft"]["count"] == lv["summary"]["completed"]
        fractions = [f for _x, f in c["ttft"]["points"]]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0
    # the client's tokens over time add up to the tokens it received
    for t, lv in zip(model["timelines"], levels, strict=True):
        streamed = sum(b["output_throughput"] * t["bin_s"] for b in t["client"])
        assert streamed == pytest.approx(lv["summary"]["total_output_tokens"], rel=1e-6)
    # output tok/s per GPU against tok/s per user: every level, over the GPUs of the layout the run stored
    with open_store(sim_bench.home / "servelab.db") as store:
        layout = BenchRepo(store).load(uid).context.layout
    assert layout.gpus and model["run"]["gpus"] == layout.gpus and "layout" in model["run"]["gpus_from"]
    pts = model["pareto_points"]
    assert [(p["output_tps_per_gpu"], p["tps_per_user"]) for p in pts] == [
        pytest.approx(
            (lv["summary"]["output_throughput"] / layout.gpus, 1000 / lv["summary"]["tpot_ms"]["p50"])
        )
        for lv in levels
    ]
    front = model["pareto_front"]
    assert front and all(p in pts for p in front)
    assert not any(  # no level at least as good on both axes and better on one
        q["output_tps_per_gpu"] >= p["output_tps_per_gpu"]
        and q["tps_per_user"] >= p["tps_per_user"]
        and (q["output_tps_per_gpu"] > p["output_tps_per_gpu"] or q["tps_per_user"] > p["tps_per_user"])
        for p in front
        for q in pts
    )
    files = {p.name for p in (tmp_path / "r" / "run_files").iterdir()}
    assert {"throughput.svg", "pareto.svg", "ttft.svg", "tpot.svg", "cdf-ttft.svg", "cdf-tpot.svg"} <= files
    assert {"timeline-1-queue.svg", "timeline-1-throughput.svg", "timeline-1-power.svg"} <= files
    assert "run_files/timeline-1-queue.svg" in (tmp_path / "r" / "run.md").read_text()
    # `last` stays the study's: this store has none
    code, _out, err = _cli(sim_bench.home, "report", "last")
    assert code == 2 and "no study" in err
