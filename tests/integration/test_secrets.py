"""A secret planted in a study (an API key in the candidates' args, both spellings; a credentials variable
and a URL password in the engine's env) is found nowhere servelab writes or shows: not in the store's file,
the run directory, `tune`'s output, `runs study --json`, `report --json`, the HTML and Markdown reports, the
launched server's command line (read from /proc while it runs) or the deployment files. Real `servelab tune`
on the simulator, which demands the key on /v1/* (so the study is measured only if the key reached it
through its environment and servelab's own requests sent it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from tests.integration.test_tune_sim import ROOT, by_label, servelab, write_study
from tests.support.simruns import start_sim

from servelab.host.processes import MARKER_ENV

pytestmark = pytest.mark.integration

KEY_PAIR = "k3y-PAIR-0x51f7"  # --api-key KEY_PAIR
KEY_EQ = "k3y-EQUALS-0x9b2c"  # --api-key=KEY_EQ
CREDENTIALS = "cr3d-VALUE-0x77aa"  # MY_CREDENTIALS=...
URL_PASSWORD = "pa55-URL-0x3d4e"  # DB_URL=postgres://u:PASS@h/db
SECRETS = (KEY_PAIR, KEY_EQ, CREDENTIALS, URL_PASSWORD)


def _leaks(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [s for s in SECRETS if s.encode() in data]


def _files_leaking(root: Path) -> dict[str, list[str]]:
    return {str(p): found for p in root.rglob("*") if p.is_file() and (found := _leaks(p.read_bytes()))}


def _watch_servers(proc: subprocess.Popen[str], home: Path) -> dict[int, tuple[str, dict[str, str]]]:
    """(cmdline, environment) of every process a study on `home` launched (it carries a study marker),
    polled until `proc` exits."""
    seen: dict[int, tuple[str, dict[str, str]]] = {}
    while proc.poll() is None:
        for p in psutil.process_iter():
            if p.pid in seen:
                continue
            try:
                env = p.environ()
                if env.get("SERVELAB_HOME") != str(home) or not env.get(MARKER_ENV, "").startswith(
                    "servelab-study:"
                ):
                    continue
                cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (psutil.Error, OSError):
                continue
            seen[p.pid] = (cmdline, env)
        time.sleep(0.05)
    return seen


def test_a_planted_secret_is_published_nowhere(tmp_path: Path) -> None:
    home = tmp_path / "home"
    study = write_study(
        tmp_path / "study.toml",
        "secrets",
        [
            {"name": "pair", "args": ["--api-key", KEY_PAIR], "baseline": True},
            {"name": "equals", "args": [f"--api-key={KEY_EQ}"]},
        ],
        levels=[2],
        extra_engine={"env": {"MY_CREDENTIALS": CREDENTIALS, "DB_URL": f"postgres://u:{URL_PASSWORD}@h/db"}},
    )
    # Not a test of anomalies: two identical candidates' client-timed figures at the simulator's 50× clock
    # swing with the box's load ("equals: utilization_drop" once), so the flags are set out of reach
    study.write_text(study.read_text() + "\n[anomalies]\ncollapse_ratio = 0.01\npower_drop_ratio = 0.01\n")
    dry = servelab("tune", str(study), "--dry-run", "--json", home=home)
    assert not _leaks(dry.stdout + dry.stderr)

    env = {**os.environ, "SERVELAB_HOME": str(home)}
    tune = subprocess.Popen(
        [sys.executable, "-m", "servelab", "tune", str(study), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    seen = _watch_servers(tune, home)
    out, err = tune.communicate(timeout=60)
    assert tune.returncode == 0, err[-3000:]
    result = json.loads(out)
    # Measured: the simulator demanded the key, so it got it (from its environment) and so did our requests.
    assert {c["label"]: c["status"] for c in result["candidates"]} == {
        "pair": "measured",
        "equals": "measured",
    }
    assert not _leaks(out + err)

    # The launched servers: the key in their environment, never on their command line.
    servers = {cmd: e for cmd, e in seen.values() if " sim " in cmd}
    assert len(servers) == 2, seen
    assert sorted(e["SERVELAB_SIM_API_KEY"] for e in servers.values()) == sorted([KEY_PAIR, KEY_EQ])
    assert all(not _leaks(cmd) and "--api-key" not in cmd for cmd in servers)

    # The store's file (and its WAL), the servers' logs, everything under SERVELAB_HOME.
    assert not _files_leaking(home)

    uid = result["study"]
    runs = servelab("runs", "study", uid, "--json", home=home)
    stored = json.loads(runs.stdout)
    assert not _leaks(runs.stdout)
    assert "***" in runs.stdout  # what was there is shown as masked, not dropped
    report = servelab(
        "report",
        uid,
        "--json",
        "--html",
        str(tmp_path / "r.html"),
        "--md",
        str(tmp_path / "md" / "r.md"),
        home=home,
    )
    assert (
        not _leaks(report.stdout) and (tmp_path / "r.html").is_file() and (tmp_path / "md" / "r.md").is_file()
    )
    assert not _files_leaking(tmp_path / "md") and not _leaks((tmp_path / "r.html").read_bytes())
    assert by_label(result)["pair"] and stored

    # deploy: refused without an EnvironmentFile (exit 2, the way out in the hint) ...
    refused = servelab("deploy", uid, "--out", str(tmp_path / "unit"), home=home, check=False)
    assert (
        refused.returncode == 2
        and "--env-file" in refused.stderr
        and "SERVELAB_SIM_API_KEY" in refused.stderr
    )
    assert "Traceback" not in refused.stderr and not (tmp_path / "unit").exists()
    given = servelab(
        "deploy", uid, "--arg", f"--api-key={KEY_PAIR}", "--env-file", "/etc/llm.env", home=home, check=False
    )
    assert given.returncode == 2 and "would write a secret" in given.stderr and not _leaks(given.stderr)
    # ... and with one, the secret is in none of the files (the unit names the variables the file defines).
    for target in ("systemd", "compose", "kubernetes"):
        d = tmp_path / "deploy" / target
        res = servelab(
            "deploy",
            uid,
            "--target",
            target,
            "--env-file",
            "/etc/llm.env",
            "--out",
            str(d),
            "--json",
            *([] if target == "systemd" else ["--image", "servelab:test"]),
            home=home,
        )
        assert not _leaks(res.stdout + res.stderr) and not _files_leaking(d)
    unit = next((tmp_path / "deploy" / "systemd").glob("*.service")).read_text()
    assert "EnvironmentFile=/etc/llm.env" in unit and "--api-key-env SERVELAB_SIM_API_KEY" in unit
    assert "--api-key" not in unit.split("ExecStart=", 1)[1].split("\n", 1)[0]
    assert "MY_CREDENTIALS" not in unit and "DB_URL" not in unit
    assert not _files_leaking(home)


def test_the_simulator_takes_its_key_from_the_environment_and_demands_it(tmp_path: Path) -> None:
    key = "sim-env-key-0x1234"
    sim = start_sim(
        tmp_path, "--model", "Qwen3-30B-A3B", "--gpu", "h100-sxm", env={"SERVELAB_SIM_API_KEY": key}
    )
    try:
        assert key not in Path(f"/proc/{sim.proc.pid}/cmdline").read_bytes().decode()
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(sim.url + "/v1/models", timeout=5)
        assert no_key.value.code == 401
        req = urllib.request.Request(sim.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())["data"]
        with urllib.request.urlopen(sim.url + "/health", timeout=5) as r:  # as vLLM: only /v1 is guarded
            assert r.status == 200
    finally:
        sim.stop()
