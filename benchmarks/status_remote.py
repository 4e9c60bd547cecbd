"""How long `servelab status --host` takes with a warm SSH connection, against `servelab status` locally.

Setup: the real sshd of the tests (tests/support/sshd.py) on 127.0.0.1, this venv's python as the remote
python, a simulator (`servelab sim`) on loopback given with --url (so the server is probed, through a port
forward on the remote side). One `status --host` first starts the ControlMaster (not timed); then each
command is a fresh `python -m servelab status --json` process, timed end to end (interpreter start and
imports included, as a user sees it), 5 runs each, interleaved; the medians are printed.

Usage: .venv/bin/python benchmarks/status_remote.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.simruns import start_sim  # noqa: E402
from tests.support.sshd import sshd_server  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="servelab-bench-") as tmp:
        work = Path(tmp)
        sim = start_sim(work / "sim", "--model", "Qwen3-30B-A3B", "--gpu", "h100-sxm", speed=50.0)
        try:
            with sshd_server(work / "sshd") as sshd:
                env = {**os.environ, **sshd.env(), "SERVELAB_HOME": str(work / "home")}
                env.pop("SERVELAB_HOST", None)
                base = [sys.executable, "-m", "servelab", "status", "--json", "--url", sim.url]
                remote = [*base, "--host", sshd.url, "--remote-python", sys.executable]
                timed(remote, env)  # the master connection starts here; it persists between commands
                local_s: list[float] = []
                remote_s: list[float] = []
                for _ in range(opts.runs):  # interleaved: a busy moment of the box hits both alike
                    local_s.append(timed(base, env))
                    remote_s.append(timed(remote, env))
        finally:
            sim.stop()
    lm, rm = statistics.median(local_s), statistics.median(remote_s)
    print(
        f"status (local):             median {lm:.2f} s of {opts.runs} ({', '.join(f'{x:.2f}' for x in local_s)})"
    )
    print(
        f"status --host (warm ssh):   median {rm:.2f} s of {opts.runs} ({', '.join(f'{x:.2f}' for x in remote_s)})"
    )
    print(f"the remote path adds {rm - lm:+.2f} s ({rm / lm:.2f}x)")


if __name__ == "__main__":
    main()
