"""Against `servelab sim`, the bench client times tokens by the simulator's step clock (`servelab_t` on
each event), so a stall of either process never enters a simulated latency ×speed."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from tests.support import simruns
from tests.support.simruns import ISL, MODEL, OSL, SIM_ARGS, SPEED


def test_a_stopped_simulator_moves_no_token_time(tmp_path: Path) -> None:
    """The simulator is stopped 60 ms of every 150 ms while one stream at a time runs: on the client's
    read clock a stopped gap is ×20 in GPU time (1.2 s against a 20 ms step). Every inter-token gap the
    client recorded is the simulator's own step, and its mean the simulator's histogram's."""
    sim = simruns.start_sim(tmp_path / "sim", *SIM_ARGS)
    stop = threading.Event()
    stalls = 0

    def stall() -> None:
        nonlocal stalls
        while not stop.wait(0.09):
            os.kill(sim.proc.pid, signal.SIGSTOP)
            time.sleep(0.06)
            os.kill(sim.proc.pid, signal.SIGCONT)
            stalls += 1

    staller = threading.Thread(target=stall)
    try:
        staller.start()
        out = simruns.bench(
            tmp_path, sim.url, MODEL, "--input-len", str(ISL), "--output-len", str(OSL),
            "--concurrency", "1", "--num-requests", "6",
        )  # fmt: skip
    finally:
        stop.set()
        staller.join()
        sim.stop()
    (level,) = out["levels"]
    clock = simruns.SimClock.of(level)
    records = simruns.level_records(tmp_path, out["run"])
    assert len(records) == 6 and all(r.ok for r in records)
    gaps_ms = [g * SPEED * 1000 for r in records for g in r.itl_s]
    assert len(gaps_ms) == 6 * (OSL - 1) and stalls >= 3, stalls  # stopped again and again
    # c = 1: every step is the same one-stream decode step; the stopped process shifted none of them
    assert max(gaps_ms) <= clock.tpot_ms * 1.01 and min(gaps_ms) >= clock.tpot_ms * 0.99, (
        min(gaps_ms),
        max(gaps_ms),
        clock,
    )
    assert level["summary"]["tpot_ms"]["max"] <= clock.tpot_ms * 1.01, (level["summary"]["tpot_ms"], clock)
