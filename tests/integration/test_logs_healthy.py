"""`servelab logs diagnose` on a healthy log the real simulator wrote says no failure was found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support import simruns

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("personality", ["vllm", "sglang"])
def test_a_healthy_log_has_no_failure(personality: str, tmp_path: Path, servelab_home: Path) -> None:
    args = [*simruns.SIM_ARGS[: simruns.SIM_ARGS.index("--personality")], "--personality", personality]
    if personality == "sglang":
        args.append("--disable-radix-cache")
    sim = simruns.start_sim(tmp_path / "logs", *args)
    try:
        simruns.bench(servelab_home, sim.url, simruns.MODEL, "--concurrency", "1", "--num-requests", "2")
    finally:
        sim.stop()
    log = tmp_path / "server.log"  # what a unit's journal or a launcher's log file holds: both streams
    log.write_text(sim.err.with_suffix(".out").read_text() + sim.err.read_text())
    res = simruns.servelab(servelab_home, "logs", "diagnose", str(log), "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["class"] == "no_failure" and d["fatal"] is False
    assert "startup complete" in d["evidence"] or "ready to roll" in d["evidence"]
    # the same log with a crash appended is not healthy
    log.write_text(
        log.read_text()
        + "Traceback (most recent call last):\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    d = json.loads(simruns.servelab(servelab_home, "logs", "diagnose", str(log), "--json").stdout)
    assert d["class"] != "no_failure"


def test_status_shows_the_attention_backend_the_log_names(tmp_path: Path, servelab_home: Path) -> None:
    """SGLang's /get_server_info leaves attention_backend None when the engine chose it; the log names it."""
    sim = simruns.start_sim(tmp_path / "logs", *simruns.SIM_ARGS)  # the SGLang personality
    try:
        log = tmp_path / "server.log"
        log.write_text(sim.err.with_suffix(".out").read_text() + sim.err.read_text())
        assert "attention_backend='nsa'" in log.read_text()
        res = simruns.servelab(servelab_home, "status", "--url", sim.url, "--log", str(log), "--json")
        human = simruns.servelab(servelab_home, "status", "--url", sim.url, "--log", str(log))
    finally:
        sim.stop()
    (server,) = json.loads(res.stdout)["servers"]
    assert server["effective"]["attention_backend"] == "nsa"
    assert "attention_backend='nsa'" in server["evidence"]["attention_backend"]
    assert "attention_backend=nsa" in human.stdout
