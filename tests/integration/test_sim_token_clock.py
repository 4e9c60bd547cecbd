"""`bench --token-clock server` against `servelab sim`: tokens timed by the simulator's step clock (the
`servelab_t` on each event), so a stall of either process never enters a simulated latency ×speed."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from tests.support import simruns
from tests.support.fault_server import fault_server
from tests.support.simruns import ISL, MODEL, OSL, SIM_ARGS, SPEED

ONE_STREAM = ["--input-len", str(ISL), "--output-len", str(OSL), "--concurrency", "1", "--num-requests", "6"]


def test_a_stopped_simulator_moves_no_token_time_on_its_own_clock(tmp_path: Path) -> None:
    """The simulator is stopped 60 ms of every 150 ms while one stream at a time runs, twice: on the
    client's clock a stopped gap is ×20 in GPU time (1.2 s against a 20 ms step); on the simulator's,
    every inter-token gap is its own step, and the level's TPOT its histogram's."""
    sim = simruns.start_sim(tmp_path / "sim", *SIM_ARGS)
    stop = threading.Event()

    def stall() -> None:
        while not stop.wait(0.09):
            os.kill(sim.proc.pid, signal.SIGSTOP)
            time.sleep(0.06)
            os.kill(sim.proc.pid, signal.SIGCONT)

    staller = threading.Thread(target=stall)
    try:
        staller.start()
        runs = {
            clock: simruns.bench(tmp_path, sim.url, MODEL, *ONE_STREAM, "--token-clock", clock)
            for clock in ("server", "client")
        }
    finally:
        stop.set()
        staller.join()
        sim.stop()
    gaps_ms, levels = {}, {}
    for clock, out in runs.items():
        (levels[clock],) = out["levels"]
        records = simruns.level_records(tmp_path, out["run"])
        assert len(records) == 6 and all(r.ok for r in records)
        gaps_ms[clock] = [g * SPEED * 1000 for r in records for g in r.itl_s]
        assert len(gaps_ms[clock]) == 6 * (OSL - 1)
        assert not [w for w in out["warnings"] if "--token-clock" in w], out["warnings"]
    step = simruns.SimClock.of(levels["server"]).tpot_ms
    # the stops reached the streams: the client's own clock saw them, ×20
    assert max(gaps_ms["client"]) > 5 * step, (max(gaps_ms["client"]), step)
    # c = 1: every step is the same one-stream decode step; on the simulator's clock none moved
    server = gaps_ms["server"]
    assert max(server) <= step * 1.01 and min(server) >= step * 0.99, (min(server), max(server), step)
    tpot = levels["server"]["summary"]["tpot_ms"]
    assert tpot["max"] <= step * 1.01, (tpot, step)


def test_a_server_without_stamps_is_timed_by_the_client_and_the_run_says_so(tmp_path: Path) -> None:
    """A real engine sends no token times of its own (the fault server streams vLLM's bytes): asked for
    the server's clock, the client times the tokens itself, and the run's warnings say so."""
    with fault_server(token_interval_ms=5) as fs:
        res = simruns.servelab(
            tmp_path, "bench", "--url", fs.url, "--model", "fault-model", "--json", "--concurrency", "1",
            "--num-requests", "3", "--output-len", "8", "--token-clock", "server",
        )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert [w for w in out["warnings"] if w.startswith("--token-clock server: the server stamped no")]
    records = simruns.level_records(tmp_path, out["run"])
    assert len(records) == 3 and all(r.ok and len(r.itl_s) == 7 for r in records)
    assert all(g > 0.003 for r in records for g in r.itl_s)  # the server's 5 ms, on the client's clock
