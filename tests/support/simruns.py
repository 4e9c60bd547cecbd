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
