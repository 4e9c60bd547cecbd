"""Hostile input and dying servers (issue 15, items 5, 10, 13, 14): a clear error and the right exit
code, a stall cut by the idle timeout, an all-failed level a failure, nothing left `running`."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.fault_server import fault_server
from tests.support.simruns import MODEL, start_sim

SIM = ["--model", MODEL, "--gpu", "rtx-pro-6000", "--num-gpus", "8", "--tp", "8"]


def _servelab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab", *args], capture_output=True, text=True, timeout=timeout
    )


def _against_sim(tmp_path: Path, sim_args: tuple[str, ...], *args: str) -> subprocess.CompletedProcess[str]:
    """`servelab ARGS --url SIM --model MODEL` against a simulator started with `sim_args`, then stopped."""
    sim = start_sim(tmp_path, *SIM, *sim_args, speed=1.0)
    try:
        return _servelab(args[0], "--url", sim.url, "--model", MODEL, *args[1:])
    finally:
        sim.stop()


def _runs() -> list[str]:
    db = Path(os.environ["SERVELAB_HOME"]) / "servelab.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        try:
            return [s for (s,) in con.execute("SELECT status FROM bench_runs")]
        except sqlite3.OperationalError as exc:  # the file exists; its migrations are still running
            if "no such table" not in str(exc):
                raise
            return []


BASE = ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--num-requests", "1"]


@pytest.mark.parametrize(
    "args,option",
    [
        (["--rate", "nan"], "--rate"),
        (["--rate", "inf"], "--rate"),
        (["--concurrency", "1", "--temperature", "-5"], "--temperature"),
        (["--concurrency", "1", "--warmup", "-1"], "--warmup"),
        (["--concurrency", "1", "--input-len", str(10**20)], "--input-len"),
        (["--concurrency", "1", "--input-len", "10000000"], "--input-len"),
        (["--concurrency", "1", "--idle-timeout", "0"], "--idle-timeout"),
        (["--concurrency", "1", "--export-vllm", "/proc/x"], "--export-vllm"),
    ],
)
def test_bad_bench_options_exit_2_naming_the_option(args: list[str], option: str) -> None:
    # Nothing listens on port 9: on main these either ran (exit 1 on the connection) or crashed.
    p = _servelab(*BASE, *args)
    assert p.returncode == 2, p.stderr
    assert option in p.stderr and "Traceback" not in p.stderr
    assert _runs() == []


def test_wait_ready_rejects_a_port_out_of_range_and_a_negative_timeout() -> None:
    p = _servelab("wait-ready", "http://127.0.0.1:70000", "--model", "m", "--timeout", "1")
    assert p.returncode == 2 and "65535" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = _servelab("wait-ready", "http://127.0.0.1:9", "--model", "m", "--timeout", "-1")
    assert p.returncode == 2 and "--timeout" in p.stderr, p.stderr


def test_runs_list_rejects_a_huge_limit() -> None:
    p = _servelab("runs", "list", "--limit", str(10**20))
    assert p.returncode == 2 and "--limit" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_stalled_stream_is_cut_by_the_idle_timeout_and_an_all_failed_level_fails(tmp_path: Path) -> None:
    """Every stream stalls after 6 tokens (the probes ask for at most 4): the idle timeout (1 s) frees each slot long before the
    whole-request timeout (600 s), the level measured nothing, so bench exits 1 and says why."""
    t0 = time.monotonic()
    p = _against_sim(
        tmp_path, ("--fault", "stall_stream:6"), "bench", "--concurrency", "2", "--num-requests", "4",
        "--warmup", "0", "--output-len", "16", "--idle-timeout", "1", "--json",
    )  # fmt: skip
    took = time.monotonic() - t0  # the simulator's start and stop included: well under the 60 s asked
    assert p.returncode == 1, p.stderr
    assert took < 60, took  # 4 stalls at c=2 under a 600 s timeout would take 20 minutes
    assert "stalled" in p.stderr and "every request" in p.stderr, p.stderr
    assert json.loads(p.stdout)["error"] == "ServerError"
    assert _runs() == ["failed"]


def test_a_server_that_dies_after_ready_fails_the_bench(tmp_path: Path) -> None:
    # The probe and the two calibration requests come first; the engine dies at the first measured one.
    p = _against_sim(
        tmp_path, ("--fault", "die_after_ready:3"), "bench", "--concurrency", "1,2", "--num-requests", "3",
        "--warmup", "0", "--output-len", "4",
    )  # fmt: skip
    assert p.returncode == 1, p.stderr + p.stdout
    assert "every request of level c=1 failed" in p.stderr and "later levels were not run" in p.stderr
    assert _runs() == ["failed"]


def test_ten_million_requests_start_at_once_and_stop_on_sigterm() -> None:
    """The prompt pool is bounded: the level starts in seconds (on main every prompt was built up front,
    deaf to signals); SIGTERM then stops it with 130 and, with --json, the documented document."""
    with fault_server(token_interval_ms=5) as fs:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "servelab", "bench", "--url", fs.url, "--model", "fault-model",
                "--concurrency", "2", "--num-requests", "10000000", "--output-len", "8", "--warmup", "0",
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while "running" not in _runs() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _runs() == ["running"]
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert doc["status"] == "interrupted" and doc["levels"][0]["status"] == "interrupted"
    assert doc["workload"]["num_prompts"] <= 65536
    assert _runs() == ["interrupted"]


def test_sigterm_while_the_prompts_are_built_stops_at_once() -> None:
    """A pool of long prompts takes a while to build; a signal during the build is answered within
    seconds, not after it. Each prompt built is held 1 s without yielding (`SERVELAB_TEST_STALL_AT`),
    so the build of 16 prompts lasts 16 s on any machine (a fast one built them in under the 4 s this
    test used to wait) and a builder that did not yield between prompts would answer after all 16."""
    with fault_server(token_interval_ms=5) as fs:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "servelab", "bench", "--url", fs.url, "--model", "fault-model",
                "--concurrency", "1", "--num-requests", "100000", "--input-len", "999000",
                "--output-len", "8", "--warmup", "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "SERVELAB_TEST_STALL_AT": "prompt-built:1"},
        )  # fmt: skip
        try:
            time.sleep(6)
            assert proc.poll() is None and _runs() == []  # still building
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, err
    assert took < 5, took
    assert "Traceback" not in err


def test_verify_words_a_stall_as_a_stall_not_as_unreachable(tmp_path: Path) -> None:
    p = _against_sim(tmp_path, ("--fault", "stall_stream:2"), "verify-output", "--timeout", "2")
    assert p.returncode == 1, p.stderr
    assert "cannot reach" not in p.stderr and "--url" not in p.stderr, p.stderr
    assert "took the request" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("dry", [True, False])
def test_a_study_whose_workload_bench_refuses_stops_before_anything_launches(
    tmp_path: Path, dry: bool
) -> None:
    """`input_len = 10^20`: the dry run passed it and the real run crashed (TypeError) with a server up."""
    from tests.integration.test_tune_sim import write_study

    path = write_study(tmp_path / "study.toml", "huge-input", [{"name": "tp1", "tp": 1}])
    path.write_text(path.read_text().replace("input_len = 256\n", f"input_len = {10**20}\n", 1))
    assert str(10**20) in path.read_text()
    p = _servelab("tune", str(path), *(["--dry-run"] if dry else []))
    assert p.returncode == 2, p.stderr
    assert "workload.input_len" in p.stderr and "Traceback" not in p.stderr
    assert "launching" not in p.stdout


def test_lengths_beyond_the_servers_context_are_refused_before_measuring(tmp_path: Path) -> None:
    p = _against_sim(
        tmp_path, ("--max-model-len", "4096"), "bench", "--concurrency", "1", "--num-requests", "2",
        "--input-len", "4000", "--output-len", "200",
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "max_model_len 4096" in p.stderr and "--input-len" in p.stderr and "Traceback" not in p.stderr
    assert _runs() == []
