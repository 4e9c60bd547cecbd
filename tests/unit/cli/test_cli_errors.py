"""User errors exit 2 with a message and a hint, never a traceback; --json keeps stdout pure JSON."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab", *args], capture_output=True, text=True, timeout=60
    )


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


BASE = ["bench", "--url", "http://127.0.0.1:9", "--model", "m"]


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--num-requests", "5"], "exactly one of --concurrency or --rate"),
        (
            ["--concurrency", "1", "--rate", "2", "--num-requests", "5"],
            "exactly one of --concurrency or --rate",
        ),
        (["--concurrency", "1,x", "--num-requests", "5"], "comma-separated list of numbers"),
        (["--concurrency", "1"], "exactly one of --num-requests, --duration"),
        (["--concurrency", "0", "--num-requests", "5"], "whole numbers"),
        (["--concurrency", "2", "--num-requests", "5", "--slo", "ttft<=3"], "unknown SLO metric"),
        (["--concurrency", "2", "--num-requests", "5", "--dataset", "/nonexistent.json"], "does not exist"),
        (["--concurrency", "2", "--num-requests", "5", "--max-concurrency", "4"], "caps an open-loop"),
        (["--concurrency", "2", "--num-requests", "5", "--workload", "sharegpt"], "needs --dataset"),
        (["--find-capacity"], "--find-capacity needs --slo"),
        (["--find-capacity", "--slo", "p99_ttft_ms<=9", "--rate", "1,2"], "takes one --rate value"),
        (["--by", "rate", "--rate", "1", "--num-requests", "5"], "--by is an option of --find-capacity"),
        (
            ["--find-capacity", "--slo", "p99_ttft_ms<=9", "--workload", "sessions", "--sessions", "2"],
            "does not search over --workload sessions",
        ),
    ],
)
def test_bad_bench_options(extra: list[str], msg: str) -> None:
    p = run(*BASE, *extra)
    assert p.returncode == 2, p.stderr
    assert msg in p.stderr
    assert "Traceback" not in p.stderr
    assert "hint:" in p.stderr or "Usage:" in p.stderr


def test_unreachable_server_is_reported_with_hint() -> None:
    p = run(
        "bench",
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--model",
        "m",
        "--concurrency",
        "1",
        "--num-requests",
        "1",
    )
    assert p.returncode == 1
    assert "cannot reach" in p.stderr and "hint:" in p.stderr and "Traceback" not in p.stderr


def test_json_mode_prints_only_json_even_for_errors() -> None:
    p = run("runs", "show", "b-missing", "--json")
    assert p.returncode == 2
    data = json.loads(p.stdout)
    assert data["error"] == "NotFoundError" and "runs list" in data["hint"]


def test_debug_shows_traceback() -> None:
    p = run("--debug", "runs", "show", "b-missing")
    assert p.returncode == 2 and "Traceback" in p.stderr


def test_runs_list_empty_json() -> None:
    p = run("runs", "list", "--json")
    assert p.returncode == 0 and json.loads(p.stdout) == []


def test_version_and_module_entry() -> None:
    p = run("--version")
    assert p.returncode == 0 and "servelab" in p.stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["verify-output", "--url", "notaurl", "--model", "m"], "must look like http://HOST:PORT"),
        (["ui", "--port", "99999"], "not in the range"),
        (["preflight", "--port", "0"], "not in the range"),
        (["sim", "--model", "GLM-5", "--gpu", "h100-sxm", "--port", "70000"], "not in the range"),
        (["tune", "/nonexistent-study.toml"], "does not exist"),
        (["logs", "parse", "--engine", "nope", "/etc/hostname"], "unknown engine 'nope'"),
    ],
)
def test_bad_input_on_the_study_commands(args: list[str], msg: str) -> None:
    p = run(*args)
    assert p.returncode == 2, p.stderr
    assert msg in p.stderr
    assert "Traceback" not in p.stderr


def test_tune_ray_dry_run_refuses_what_the_real_run_would(tmp_path) -> None:  # type: ignore[no-untyped-def]
    study = tmp_path / "s.toml"
    study.write_text(
        '[study]\nname = "s"\n[model]\npath = "Qwen3-8B"\n[host]\ngpu = "h100-sxm"\n[engine]\nname = "sim"\n'
        "[workload]\nnum_requests = 8\n[load]\nconcurrency = [1]\n[[candidates]]\ntp = 1\n"
    )
    ok = run(
        "tune", str(study), "--dry-run", "--executor", "ray", "--ray-address", "127.0.0.1:6379", "--json"
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["candidates"][0]["label"]
    both = run("tune", str(study), "--dry-run", "--executor", "ray", "--host", "ssh://gpubox")
    assert both.returncode == 2 and "--host" in both.stderr and "Traceback" not in both.stderr
    bad = run("tune", str(study), "--dry-run", "--executor", "ray", "--ray-address", "not an address")
    assert bad.returncode == 2 and "invalid Ray address" in bad.stderr and "HOST:PORT" in bad.stderr
    kind = run("tune", str(study), "--dry-run", "--executor", "slurm")
    assert kind.returncode == 2 and "Traceback" not in kind.stderr
