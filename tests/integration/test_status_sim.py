"""`servelab status` end to end against the simulator: its GPUs, its server and effective configuration,
then, once it is stopped, a server that is down after a clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PY = str(ROOT / ".venv" / "bin" / "python")

pytestmark = pytest.mark.integration


def _start_sim(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    out, err = tmp_path / "sim.log", tmp_path / "sim.err"
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "servelab",
            "sim",
            "--model",
            "Qwen3-30B-A3B",
            "--gpu",
            "h100-sxm",
            "--num-gpus",
            "2",
            "--tp",
            "2",
            "--port",
            "0",
            "--speed",
            "50",
            "--fast-start",
        ],
        stdout=out.open("wb"),
        stderr=err.open("wb"),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in err.read_text(errors="replace").splitlines():
            if line.startswith("SIM-PORT "):
                return proc, int(line.split()[1]), out
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(
        "the simulator printed no SIM-PORT line:\n" + err.read_text(errors="replace")[-2000:]
    )


def _status(*args: str) -> dict:
    res = subprocess.run(
        [PY, "-m", "servelab", "status", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _wait_ready(url: str, timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never became healthy")


def test_status_reads_the_simulator_then_sees_it_down(tmp_path: Path) -> None:
    proc, port, log = _start_sim(tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url)
        obs = _status("--url", url, "--log", str(log))
        (s,) = obs["servers"]
        assert s["up"] and s["engine"] == "sim" and s["models"] == ["Qwen3-30B-A3B"]
        assert s["running"] == 0 and s["waiting"] == 0
        assert s["effective"]["tp_size"] == 2 and s["effective"]["max_model_len"] > 0 and s["version"]
        assert (
            "non-default args" in s["evidence"]["tp_size"]
            or "tensor_parallel_size" in s["evidence"]["tp_size"]
        )
        g = obs["gpus"]
        assert g["available"] and g["source"] == f"sim:{url}" and len(g["gpus"]) == 2
        for gpu in g["gpus"]:
            assert gpu["memory_used_mib"] > 0 and gpu["power_limit_w"] > 0 and not gpu["idle"]
            (p,) = gpu["processes"]
            assert p["pid"] == proc.pid and p["alive"] is True and p["belongs_to"] == "not servelab's"
            assert p["since"] is not None and p["owner"]
        assert obs["topology"]["available"] is False
        assert obs["verdict"].startswith(f"server {url} up (sim (vllm)")
        # --gpu-source names the simulator explicitly (no --url needed)
        obs2 = _status("--gpu-source", f"sim:{url}")
        assert obs2["gpus"]["source"] == f"sim:{url}" and len(obs2["gpus"]["gpus"]) == 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    obs = _status("--url", url, "--log", str(log))
    (s,) = obs["servers"]
    assert s["up"] is False and "Connect" in s["error"]
    assert obs["log"]["clean_shutdown"] is True
    assert f"server {url} down after a clean shutdown" in obs["verdict"]
    assert any(f["what"] == f"server {url} is down" for f in obs["findings"])
    if sys.platform.startswith("linux") and not Path("/usr/bin/nvidia-smi").exists():
        assert obs["gpus"]["available"] is False and "no GPUs" in obs["verdict"]
