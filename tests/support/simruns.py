"""Real `servelab sim` processes and real `servelab bench` runs against them, for the readers' tests.

A reader is tested on what its writer produced: every stored run a reader's test reads was written by
`servelab bench` against a live simulator (never a row built by hand)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from servelab.results import RequestRecord
from servelab.store.bench import BenchRepo
from servelab.store.db import open_store

# The seed story's box (GLM-5 NVFP4, TP8 on eight PCIe RTX PRO 6000, SGLang): its prefill per token is
# heavy enough that the client's and the simulator's own wall time per request, which the clock's ×20
# adds to every simulated latency, stays inside the simulator's 5 %.
MODEL = "GLM-5-NVFP4"
SIM_ARGS = [
    "--model",
    MODEL,
    "--gpu",
    "rtx-pro-6000",
    "--num-gpus",
    "8",
    "--tp",
    "8",
    "--personality",
    "sglang",
    "--disable-radix-cache",
]
PREDICT_ARGS = ["-m", MODEL, "--gpu", "rtx-pro-6000", "-n", "8", "--tp", "8", "--engine", "sglang"]
ISL, OSL = 2048, 64
SPEED = 20.0


@dataclass
class SimProcess:
    proc: subprocess.Popen[bytes]
    err: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start_sim(
    log_dir: Path, *args: str, speed: float = SPEED, timeout: float = 60.0, env: dict[str, str] | None = None
) -> SimProcess:
    """`servelab sim --port 0` on loopback (`env` added to its environment); waits for its SIM-PORT line
    and /health."""
    log_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(log_dir.glob("sim*.err")))
    out, err = log_dir / f"sim{n}.out", log_dir / f"sim{n}.err"
    cmd = [
        sys.executable,
        "-m",
        "servelab",
        "sim",
        "--port",
        "0",
        "--speed",
        str(speed),
        "--fast-start",
        *args,
    ]
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(
            cmd, stdout=o, stderr=e, start_new_session=True, env={**os.environ, **(env or {})}
        )
    sim = SimProcess(proc, err, 0)
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end and not sim.port:
            if proc.poll() is not None:
                raise AssertionError("servelab sim exited:\n" + err.read_text()[-3000:])
            for line in err.read_text().splitlines():
                if line.startswith("SIM-PORT "):
                    sim.port = int(line.split()[1])
            time.sleep(0.05)
        while time.monotonic() < end:
            with contextlib.suppress(OSError), urllib.request.urlopen(sim.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return sim
            time.sleep(0.05)
        raise AssertionError("servelab sim never became healthy:\n" + err.read_text()[-3000:])
    except BaseException:
        sim.stop()
        raise


def servelab(
    home: Path, *args: str, timeout: float = 300, cpus: set[int] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, on the store under `home` (pinned to `cpus` when given)."""
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    cmd = [sys.executable, "-m", "servelab", *args]
    if cpus:
        cmd = ["taskset", "--cpu-list", ",".join(map(str, sorted(cpus))), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def bench(home: Path, url: str, model: str, *args: str) -> dict:
    """`servelab bench --json` on the cores the simulator is not pinned to."""
    cores = sorted(os.sched_getaffinity(0))
    res = servelab(
        home, "bench", "--url", url, "--model", model, "--json", *args, cpus=set(cores[1:]) or None
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def level_records(home: Path, uid: str) -> list[RequestRecord]:
    """Every request record of run `uid`'s one level (a trace or a sessions run is one), as the store under
    `home` holds what `bench` wrote."""
    with open_store(home / "servelab.db") as store:
        repo = BenchRepo(store)
        ids = repo.level_ids(repo.load(uid).id)
        assert list(ids) == [0], ids
        return repo.requests(ids[0])


def copy_store(src_home: Path, dst_home: Path) -> None:
    """A private copy of a store another fixture wrote (its WAL checkpointed by closing)."""
    dst_home.mkdir(parents=True, exist_ok=True)
    for f in src_home.glob("servelab.db*"):
        shutil.copy2(f, dst_home / f.name)


@dataclass(frozen=True)
class SimClock:
    """What the simulator's own step clock says one level did (model time, from its TTFT, inter-token and
    end-to-end histograms as `bench` recorded them in the level's `server_metrics`): figures a loaded box
    cannot move, since a late timer never shifts the model timeline (docs/sim.md, "--speed")."""

    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    output_throughput: float  # a closed loop's tokens/s at this pace: concurrency × tokens / E2E

    @classmethod
    def of(cls, level: dict) -> SimClock:
        """From one level of `runs show --json` or `bench --json`."""
        server = level["server_metrics"]["server_mean_ms"]
        s = level["summary"]
        assert s["mode"] == "concurrency", s["mode"]
        tokens = s["total_output_tokens"] / s["completed"]
        e2e = server["e2e"]
        return cls(server["ttft"], server["itl"], e2e, s["value"] * tokens / (e2e / 1000))


def assert_gpu_time(shown: dict, clock: SimClock, pred: dict) -> None:
    """A simulated level's shown figures (`summary`, in GPU time) against the prediction for its
    configuration, read off the simulator's clock.

    The simulator is timed by the model: its own clock holds `predict` within the simulator's 5 %. The
    client's numbers are the server's plus the client's own wall time (× the speed): never below the
    server's, and far from ×speed or ÷speed off (a figure left in wall time, or rescaled twice), however
    busy the box; how much above is the client's fidelity, measured elsewhere against a reference."""
    assert clock.tpot_ms == pytest.approx(pred["tpot_ms"], rel=0.05), (clock, pred)
    assert clock.ttft_ms == pytest.approx(pred["ttft_ms"], rel=0.05), (clock, pred)
    assert clock.output_throughput == pytest.approx(pred["output_throughput"], rel=0.05), (clock, pred)
    speed_off = SPEED / 2  # a time-base error is ×20 or ÷20; a busy client's overhead is far less
    assert clock.tpot_ms * 0.97 <= shown["tpot_ms"]["p50"] <= clock.tpot_ms * speed_off, (shown, clock)
    assert clock.ttft_ms * 0.97 <= shown["ttft_ms"]["p50"] <= clock.ttft_ms * speed_off, (shown, clock)
    assert clock.output_throughput / speed_off <= shown["output_throughput"] <= clock.output_throughput * 1.03
