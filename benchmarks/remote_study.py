"""A simulator study over SSH against the same study run locally (issue 16: at most 1.1x).

The study is examples/glm5-pcie.toml reduced to one repeat and levels 1, 16 and 256 (the GLM-5 story:
a setting that is not applied, a collapse, a winner). "Remote" is a real Debian sshd on 127.0.0.1 started
here (tests/support/sshd.py), so the difference is what servelab's SSH path costs (agent, ControlMaster,
port forward, log mirroring), not a network. Local and remote runs alternate, `--rounds` times each, in
fresh stores; the median of each is compared.

Usage: .venv/bin/python benchmarks/remote_study.py [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.sshd import sshd_server  # noqa: E402


def study_text(remote: str | None, workdir: Path) -> str:
    text = (ROOT / "examples" / "glm5-pcie.toml").read_text()
    for old, new in (
        ("repeats = 2", "repeats = 1"),
        ("concurrency = [1, 4, 16, 64, 256, 1024]\nmain = 64", "concurrency = [1, 16, 256]\nmain = 16"),
    ):
        assert old in text, f"examples/glm5-pcie.toml changed: {old!r}"
        text = text.replace(old, new)
    if remote:
        host = f'[host]\nssh = "{remote}"\npython = "{sys.executable}"\nworkdir = "{workdir}"\n'
        text = text.replace("[host]\n", host, 1)
    return text


def run_once(remote: str | None, env: dict[str, str], base: Path, i: int) -> float:
    d = base / f"{'remote' if remote else 'local'}-{i}"
    d.mkdir()
    study = d / "study.toml"
    study.write_text(study_text(remote, d / "remote"))
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "servelab", "tune", str(study), "--json", "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "SERVELAB_HOME": str(d / "home")},
        cwd=ROOT,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"tune failed ({'remote' if remote else 'local'}): {res.stderr[-2000:]}")
    statuses = sorted(c["status"] for c in json.loads(res.stdout)["candidates"])
    print(f"  {'remote' if remote else 'local '} round {i}: {took:6.1f} s  {statuses}", flush=True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sl-remote-bench-") as tmp:
        base = Path(tmp)
        with sshd_server(base / "sshd") as sshd:
            env = sshd.env()
            local: list[float] = []
            remote: list[float] = []
            for i in range(args.rounds):
                local.append(run_once(None, env, base, i))
                remote.append(run_once(sshd.alias, env, base, i))
    out = {
        "rounds": args.rounds,
        "local_s": [round(x, 2) for x in local],
        "remote_s": [round(x, 2) for x in remote],
        "local_median_s": round(statistics.median(local), 2),
        "remote_median_s": round(statistics.median(remote), 2),
        "ratio": round(statistics.median(remote) / statistics.median(local), 3),
        "cpus": len(os.sched_getaffinity(0)),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
