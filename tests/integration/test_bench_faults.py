"""`servelab bench` against our own fault-injecting server: every fault is counted, never fatal."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.fault_server import fault_server


def bench(url: str, *args: str, model: str = "fault-model", check: bool = True) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-m", "servelab", "bench", "--url", url, "--model", model, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert p.returncode == 0, p.stderr
    return json.loads(p.stdout) if p.stdout.strip() else {"stderr": p.stderr, "rc": p.returncode}


COMMON = [
    "--concurrency",
    "4",
    "--num-requests",
    "40",
    "--output-len",
    "12",
    "--timeout",
    "3",
    "--warmup",
    "0",
]


@pytest.mark.parametrize(
    "fault,kind",
    [
        ("http_500", "http_500"),
        ("http_429", "http_429"),
        ("timeout", "timeout"),
        ("drop_mid_stream", "disconnected"),
        ("malformed_sse", "malformed_sse"),
    ],
)
def test_each_fault_is_counted_by_kind_with_an_example(fault: str, kind: str) -> None:
    with fault_server(token_interval_ms=1, fault=fault, fault_rate=0.25, seed=3) as fs:
        data = bench(fs.url, *COMMON)
    s = data["levels"][0]["summary"]
    assert data["status"] == "completed"
    assert s["num_requests"] == 40
    assert s["failed"] > 0 and s["completed"] > 0
    assert s["errors"] == {kind: s["failed"]}
    assert s["error_examples"][kind]
    assert s["failure_rate"] == pytest.approx(s["failed"] / 40)
    # the successful requests are still measured normally
    assert s["mean_output_tokens"] == 12 and s["tpot_ms"]["p50"] > 0


def test_server_that_dies_mid_level() -> None:
    with fault_server(token_interval_ms=1, fault="die", die_after=12) as fs:
        data = bench(fs.url, *COMMON)
    s = data["levels"][0]["summary"]
    assert s["num_requests"] == 40
    assert 0 < s["completed"] < 40
    assert set(s["errors"]) <= {"connect_error", "disconnected"} and s["failed"] == 40 - s["completed"]


def test_rejected_extra_params_fall_back_and_warn() -> None:
    """Like `transformers serve`: 422 on ignore_eos/min_tokens/stream_options."""
    with fault_server(token_interval_ms=1, fault="reject_extra_params", natural_len=5) as fs:
        data = bench(fs.url, *COMMON)
    caps = data["capabilities"]
    assert caps["exact_length"] is False and caps["stream_usage"] is False
    assert any("ignore_eos" in w for w in data["warnings"])
    assert any("include_usage" in w for w in data["warnings"])
    s = data["levels"][0]["summary"]
    assert s["failed"] == 0
    # the server stopped at 5 tokens though 12 were asked: counted from chunks and reported
    assert s["token_sources"] == {"chunks": 40}
    assert s["mean_output_tokens"] == 5 and s["length_mismatches"] == 40


def test_server_ignoring_include_usage_counts_chunks() -> None:
    with fault_server(token_interval_ms=1, fault="no_usage") as fs:
        data = bench(fs.url, *COMMON)
    assert any("ignores stream_options.include_usage" in w for w in data["warnings"])
    s = data["levels"][0]["summary"]
    assert s["token_sources"] == {"chunks": 40} and s["mean_output_tokens"] == 12


def test_short_outputs_are_reported_not_hidden() -> None:
    with fault_server(token_interval_ms=1, fault="short_output", fault_rate=0.5, seed=1) as fs:
        data = bench(fs.url, *COMMON)
    s = data["levels"][0]["summary"]
    assert s["failed"] == 0 and 0 < s["length_mismatches"] < 40
    assert all(ex["got"] < ex["requested"] for ex in s["length_mismatch_examples"])


def test_wrong_model_name_lists_served_models() -> None:
    with fault_server(token_interval_ms=1) as fs:
        p = subprocess.run(
            [sys.executable, "-m", "servelab", "bench", "--url", fs.url, "--model", "nope", *COMMON],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert p.returncode == 1 and "fault-model" in p.stderr and "Traceback" not in p.stderr


def test_sweep_metrics_scrape_and_goodput() -> None:
    with fault_server(token_interval_ms=5, ttft_ms=20) as fs:
        data = bench(
            fs.url,
            "--concurrency",
            "1,4",
            "--num-requests",
            "16",
            "--output-len",
            "10",
            "--slo",
            "ttft_ms<=10,tpot_ms<=4",
        )
    assert [lv["label"] for lv in data["levels"]] == ["c=1", "c=4"]
    for lv in data["levels"]:
        s = lv["summary"]
        assert s["completed"] == 16
        assert 20 <= s["ttft_ms"]["p50"] < 60
        assert s["tpot_ms"]["p50"] == pytest.approx(5, rel=0.25)
        # the server holds every first token 20 ms: no client can see a TTFT under it, so nothing meets
        # the SLO however busy the box (a TPOT bound alone is not that: a first token read late and the
        # rest read in a burst make a request's measured TPOT shorter than the server's pace)
        assert s["good_requests"] == 0 and s["goodput"] == 0
        sm = lv["server_metrics"]
        assert sm["available"] and sm["deltas"]["generation_tokens"] == s["total_output_tokens"]
        assert lv["summary"]["vllm_compatible"]["median_tpot_ms"] == s["tpot_ms"]["p50"]
    assert (
        data["levels"][1]["summary"]["output_throughput"]
        > 2.5 * data["levels"][0]["summary"]["output_throughput"]
    )


def test_open_loop_measures_from_schedule_so_queueing_shows() -> None:
    """One slot on the server, arrivals faster than it serves: latency must grow with the queue."""
    with fault_server(token_interval_ms=2, max_num_seqs=1) as fs:
        data = bench(
            fs.url, "--rate", "200", "--arrival", "constant", "--num-requests", "30", "--output-len", "10"
        )
    s = data["levels"][0]["summary"]
    assert s["completed"] == 30
    # each request takes ~20 ms and they arrive every 5 ms: the last waits ~30*15 ms
    assert s["ttft_ms"]["max"] > 300 and s["ttft_ms"]["p50"] > 100
    # The growth is the server's queue, not a client that fell behind its schedule: the queueing delay
    # (how much later than the first the last request got its first token) dominates how late the client
    # sent, both measured in this run (not an absolute bound, which a loaded box breaks: 51.7 ms once).
    late = data["levels"][0]["client"]["send_lateness_ms"]
    queueing = s["ttft_ms"]["max"] - s["ttft_ms"]["min"]
    assert queueing > 3 * late["p99"], (queueing, late)


def test_duration_bound_and_rate_cap() -> None:
    with fault_server(token_interval_ms=2) as fs:
        t0 = time.monotonic()
        data = bench(fs.url, "--rate", "50", "--max-concurrency", "2", "--duration", "2", "--output-len", "5")
        took = time.monotonic() - t0
    s = data["levels"][0]["summary"]
    assert 60 <= s["num_requests"] <= 140 and took < 30
    assert data["levels"][0]["label"] == "rate=50/s, cap 2"


def test_sharegpt_and_shared_prefix_workloads(tmp_path: Path) -> None:
    sg = tmp_path / "sg.json"
    sg.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": f"question {i} " * 5},
                        {"from": "gpt", "value": "answer " * (3 + i)},
                    ]
                }
                for i in range(8)
            ]
        )
    )
    with fault_server(token_interval_ms=1) as fs:
        a = bench(fs.url, "--concurrency", "2", "--num-requests", "8", "--dataset", str(sg))
        b = bench(
            fs.url,
            "--concurrency",
            "2",
            "--num-requests",
            "8",
            "--workload",
            "shared-prefix",
            "--num-prefixes",
            "2",
            "--prefix-len",
            "50",
            "--input-len",
            "10",
            "--output-len",
            "4",
        )
    assert a["workload"]["name"] == "sharegpt:sg.json" and a["levels"][0]["summary"]["completed"] == 8
    assert sorted({lv for lv in [a["levels"][0]["summary"]["mean_output_tokens"]]})[0] > 3
    assert b["workload"]["name"] == "shared-prefix"
    # the fault server counts words: prefix 50 + question ~10 (+ tags)
    assert 55 <= b["levels"][0]["summary"]["mean_input_tokens"] <= 70


def test_same_prompts_at_every_level_and_recorded_hash() -> None:
    with fault_server(token_interval_ms=1) as fs:
        a = bench(fs.url, "--concurrency", "1,2", "--num-requests", "5", "--seed", "9")
        b = bench(fs.url, "--concurrency", "3", "--num-requests", "5", "--seed", "9")
    assert a["workload"]["dataset_hash"] == b["workload"]["dataset_hash"]


def _db() -> sqlite3.Connection:
    return sqlite3.connect(Path(os.environ["SERVELAB_HOME"]) / "servelab.db")


def _start_slow_bench(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servelab",
            "bench",
            "--url",
            url,
            "--model",
            "fault-model",
            "--concurrency",
            "2",
            "--num-requests",
            "200",
            "--output-len",
            "20",
            "--warmup",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_rows(n: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = _db().execute("SELECT count(*) FROM bench_requests").fetchone()[0]
            if got >= n:
                return got
        except sqlite3.OperationalError:
            pass
        time.sleep(0.1)
    raise AssertionError("requests never reached the store")


def test_killed_benchmark_keeps_every_finished_request() -> None:
    with fault_server(token_interval_ms=5) as fs:
        proc = _start_slow_bench(fs.url)
        _wait_for_rows(6)
        proc.kill()
        proc.wait(10)
    rows = _db().execute("SELECT ok, output_tokens, ttft_s, e2e_s FROM bench_requests").fetchall()
    assert len(rows) >= 6
    assert all(ok == 1 and out == 20 and 0 < ttft < e2e for ok, out, ttft, e2e in rows)


def test_sigterm_marks_the_run_interrupted_with_its_requests() -> None:
    with fault_server(token_interval_ms=5) as fs:
        proc = _start_slow_bench(fs.url)
        _wait_for_rows(4)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    db = _db()
    (status,) = db.execute("SELECT status FROM bench_runs").fetchone()
    level_status, summary = db.execute("SELECT status, summary_json FROM bench_levels").fetchone()
    stored = db.execute("SELECT count(*) FROM bench_requests").fetchone()[0]
    assert status == "interrupted" and level_status == "interrupted"
    assert json.loads(summary)["completed"] == stored >= 4
