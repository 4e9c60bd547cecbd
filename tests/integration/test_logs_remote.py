"""`logs parse|diagnose --host`, `plan check --host` and `report --host` read the remote host through the
real sshd of tests/support/sshd.py (the "remote" is this machine, its servelab the venv's python): the
same answers as locally, a missing remote file is the user's to fix (exit 2), and the host facts come from
the agent over there."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support import simruns
from tests.support.sshd import SshdHandle

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli(home: Path, sshd: SshdHandle, *args: str, path: str | None = None) -> Result:
    """The CLI in this process (a python start-up per call would cost a second each); ssh, the agent over
    there and the servers are real processes all the same."""
    from click.testing import CliRunner

    from servelab.cli.main import cli as main

    env = {**sshd.env(), "SERVELAB_HOME": str(home), "SERVELAB_REMOTE_PYTHON": sys.executable}
    env |= {"SERVELAB_HOST": None} if path is None else {"SERVELAB_HOST": None, "PATH": path}  # type: ignore[dict-item]
    res = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return Result(res.exit_code, res.stdout, res.stderr)


def tune(home: Path, sshd: SshdHandle, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **sshd.env(), "SERVELAB_HOME": str(home)}
    env.pop("SERVELAB_HOST", None)
    return subprocess.run(
        [sys.executable, "-m", "servelab", "tune", *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def ok(res: Result | subprocess.CompletedProcess[str]) -> dict:
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> simruns.SimProcess:
    """A live simulator (SGLang personality, TP8) whose own log is the remote log the tests read."""
    proc = simruns.start_sim(tmp_path_factory.mktemp("sim-logs"), *simruns.SIM_ARGS)
    yield proc
    proc.stop()


def test_a_remote_log_parses_and_diagnoses_as_it_does_here(
    sshd: SshdHandle, sim: simruns.SimProcess, tmp_path: Path, servelab_home: Path
) -> None:
    remote = tmp_path / "on-the-remote"
    remote.mkdir()
    log = remote / "server.log"  # what the simulator wrote: both streams, as a unit's journal holds them
    log.write_text(sim.err.with_suffix(".out").read_text() + sim.err.read_text())
    oom = remote / "oom.log"
    shutil.copy(FIXTURES / "fail_oom_sglang_4330.log", oom)  # a real SGLang log that failed
    for args in (
        ("logs", "parse", "--engine", "sglang", str(log), "--json"),
        ("logs", "diagnose", str(log), "--json"),
        ("logs", "diagnose", str(oom), "--json"),
        ("logs", "parse", "--engine", "sglang", str(oom), "--json"),
    ):
        here = ok(cli(servelab_home, sshd, *args))
        there = ok(cli(servelab_home, sshd, *args, "--host", sshd.alias))
        assert there == here, args
    assert (
        ok(
            cli(
                servelab_home,
                sshd,
                "logs",
                "parse",
                "--engine",
                "sglang",
                str(log),
                "--json",
                "--host",
                sshd.url,
            )
        )["effective"]["tp_size"]
        == 8
    )
    assert ok(cli(servelab_home, sshd, "logs", "diagnose", str(oom), "--json", "--host", sshd.alias))[
        "class"
    ] == ("oom_init")


def test_a_missing_remote_file_or_unit_is_the_users_to_fix(
    sshd: SshdHandle, tmp_path: Path, servelab_home: Path
) -> None:
    gone = tmp_path / "gone.log"
    res = cli(servelab_home, sshd, "logs", "diagnose", str(gone), "--host", sshd.alias)
    assert res.returncode == 2, res.stderr
    assert f"log file {gone} does not exist on {socket.gethostname()}" in res.stderr
    res = cli(servelab_home, sshd, "logs", "parse", "--engine", "sglang", str(tmp_path), "--host", sshd.alias)
    assert res.returncode == 2 and "is a directory" in res.stderr, res.stderr
    # This host keeps no journal: journalctl answers, with nothing for the unit.
    res = cli(servelab_home, sshd, "logs", "diagnose", "--unit", "servelab-nothing", "--host", sshd.alias)
    assert res.returncode == 2 and "has no lines for unit servelab-nothing" in res.stderr, res.stderr
    # A PATH without journalctl (the local side: ssh stays reachable through its absolute path here).
    bare = tmp_path / "bin"
    bare.mkdir()
    res = cli(servelab_home, sshd, "logs", "diagnose", "--unit", "servelab-x", path=str(bare))
    assert res.returncode == 2 and "journalctl is not installed on this machine" in res.stderr, res.stderr


def test_plan_check_observes_the_remote_server(
    sshd: SshdHandle, sim: simruns.SimProcess, servelab_home: Path
) -> None:
    ok(
        cli(
            servelab_home,
            sshd,
            "plan",
            "add",
            "try TP4 on the box",
            "--url",
            sim.url,
            "--requested",
            "tp_size=4",
            "--json",
        )
    )
    ok(cli(servelab_home, sshd, "plan", "start", "1", "--json"))
    here = ok(cli(servelab_home, sshd, "plan", "check", "--json"))
    there = ok(cli(servelab_home, sshd, "plan", "check", "--json", "--host", sshd.alias))
    assert (
        [f["kind"] for f in there["findings"]] == ["config_mismatch"] == [f["kind"] for f in here["findings"]]
    )
    assert "tp_size" in there["findings"][0]["message"]
    assert there["observed"] == {
        "servers": 1,
        "services": 0,
        "host": sshd.alias,
        "hostname": socket.gethostname(),
    }
    assert "host" not in here["observed"]
    human = cli(servelab_home, sshd, "plan", "check", "--host", sshd.alias)
    assert human.returncode == 0 and f"server(s) and 0 service(s) on {sshd.alias}" in human.stdout


def test_report_gathers_the_host_facts_on_the_study_host(
    sshd: SshdHandle, tmp_path: Path, servelab_home: Path
) -> None:
    from tests.integration.test_tune_sim import write_study

    study = write_study(
        tmp_path / "tiny.toml", "tiny-remote", [{"name": "tp1", "tp": 1}], levels=[1], speed=100
    )
    study.write_text(
        study.read_text().replace(
            "[host]\n", f'[host]\nssh = "{sshd.alias}"\npython = "{sys.executable}"\n', 1
        )
    )
    ok(tune(servelab_home, sshd, str(study), "--json", "--quiet"))
    model = ok(cli(servelab_home, sshd, "report", "last", "--host-checks", "--json"))
    there = model["host"]["this_machine"]
    assert there["host"] == sshd.alias and there["hostname"] == socket.gethostname()
    assert there["checks"] and {c["status"] for c in there["checks"]} <= {"ok", "warn", "fail", "skip"}
    md = cli(servelab_home, sshd, "report", "last", "--host", sshd.url)
    assert md.returncode == 0, md.stderr
    assert f"### The study's host {sshd.url} ({socket.gethostname()}), over SSH" in md.stdout
    local = ok(cli(servelab_home, sshd, "report", "last", "--host", "local", "--json"))["host"][
        "this_machine"
    ]
    assert "host" not in local and [c["name"] for c in local["checks"]] == [
        c["name"] for c in there["checks"]
    ]
    plain = ok(cli(servelab_home, sshd, "report", "last", "--json"))
    assert plain["host"]["this_machine"] is None  # no host checks unless asked (or --host given)
