"""`servelab wait-ready` against the simulator in each start-up fault, and a generated unit's commands run for
real: preflight, the server exactly as ExecStart says, wait-ready (with the unit's own $MAINPID rule)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from servelab.engines import registry
from servelab.engines.base import LaunchSpec
from servelab.errors import LaunchFailed, NotReady
from servelab.host import processes
from servelab.host.ports import free_port
from servelab.lifecycle.ready import Endpoint, ReadyReport, wait_url_ready
from servelab.lifecycle.serving import sweep_orphans

# Run apart from the other deploy module, on one worker: both install units on this machine (test_deploy
# through a fake systemctl, test_deploy_remote through a real sshd on 127.0.0.1), and a unit's preflight
# refuses to start while any process of another live unit holds its port: side by side, one found the
# other's server in its way (twice, in clean-clone runs).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("deploy")]

MODEL = "Qwen3-30B-A3B"
ROOT = Path(__file__).resolve().parents[2]


class Sims(list[subprocess.Popen[bytes]]):
    """The simulators a test started, all marked with `marker` (SERVELAB_RUN, inherited by their children)."""

    def __init__(self) -> None:
        super().__init__()
        self.marker = f"test-deploy-{uuid.uuid4().hex[:10]}/"


@pytest.fixture
def sims() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = Sims()
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        p.wait(10)
    # What left their process groups: the `orphan` fault's child runs in a session of its own.
    sweep_orphans(procs.marker, grace_s=2.0)
    assert processes.with_marker(prefix=procs.marker) == []


def start_sim(
    procs: list[subprocess.Popen[bytes]], port: int, *args: str, fast: bool = True, personality: str = "vllm"
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "servelab",
        "sim",
        "--model",
        MODEL,
        "--gpu",
        "h100-sxm",
        "--num-gpus",
        "1",
        "--port",
        str(port),
        "--speed",
        "50",
        "--cpu",
        "0",
        "--personality",
        personality,
        *args,
    ]
    if fast:
        argv.append("--fast-start")
    marker = getattr(procs, "marker", "test-deploy-unmanaged/")
    env = {**os.environ, "SERVELAB_RUN": f"{marker}{len(procs)}", "SPT_NOENV": "1"}
    p = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )
    procs.append(p)
    return p


def wait(port: int, timeout_s: float, pid: int | None = None) -> ReadyReport:
    ep = Endpoint(LaunchSpec([], {}, "127.0.0.1", port, MODEL), time.monotonic(), pid=pid)
    return asyncio.run(
        wait_url_ready(ep, registry.get("sim").readiness, timeout_s, "sim", request_timeout_s=2.0)
    )


def test_healthy_server_is_ready_after_a_real_completion(sims: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    p = start_sim(sims, port)
    report = wait(port, 60, pid=p.pid)
    assert report.models == [MODEL]
    assert list(report.phases) == [
        "port",
        "health",
        "models",
        "warmup",
    ]  # the engine's rule, then a completion


@pytest.mark.parametrize("fault", ["cuda_init", "oom_init", "worker_init", "port_in_use", "nccl_shm"])
def test_crash_at_start(fault: str, sims: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    p = start_sim(sims, port, "--fault", fault)
    # With the server's pid (systemd's $MAINPID): the exit ends the wait at once.
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed, match="exited before it was ready") as info:
        wait(port, 60, pid=p.pid)
    assert info.value.diagnosis.klass == "process_exited" and time.monotonic() - t0 < 30
    # By URL alone: nothing ever answers, so it times out and says what it last saw.
    with pytest.raises(NotReady, match="port not open yet") as info2:
        wait(port, 1.5)
    assert info2.value.diagnosis.klass == "startup_timeout"


def test_slow_start_needs_its_time(sims: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    p = start_sim(sims, port, "--fault", "slow_start:250", fast=False)
    with pytest.raises(NotReady, match="port not open yet"):
        wait(port, 2.0, pid=p.pid)
    assert wait(port, 90, pid=p.pid).models == [MODEL]


def test_sglang_slow_start_reports_loading(sims: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    p = start_sim(sims, port, "--fault", "slow_start:250", fast=False, personality="sglang")
    ep = Endpoint(LaunchSpec([], {}, "127.0.0.1", port, MODEL), time.monotonic(), pid=p.pid)
    rule = registry.get("sglang").readiness  # SGLang's /health answers 503 while it loads
    # Once it listens (on a loaded machine that can take longer than the short wait below), it loads.
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
            break
        except OSError:
            time.sleep(0.1)
        else:
            raise AssertionError("a 250 s slow start answered /health with 200")
    with pytest.raises(NotReady, match=r"loading \(/health answers HTTP 503\)"):
        asyncio.run(wait_url_ready(ep, rule, 2.5, "sglang"))
    assert asyncio.run(wait_url_ready(ep, rule, 90, "sglang")).models == [MODEL]


def test_hang_is_not_ready(sims: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    p = start_sim(sims, port, "--fault", "hang")
    with pytest.raises(NotReady) as info:
        wait(port, 8, pid=p.pid)
    assert "did not answer" in info.value.message or "warm-up" in info.value.message
    assert p.poll() is None


def test_orphan_fault_server_still_becomes_ready(sims: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    p = start_sim(sims, port, "--fault", "orphan")
    assert wait(port, 60, pid=p.pid).models == [MODEL]
    # The fault's child left the sim's session; the run marker still finds it (and the fixture stops it).
    marked = processes.with_marker(prefix=getattr(sims, "marker", ""))
    orphans = [m for m in marked if m.pid != p.pid and m.sid != p.pid]
    assert orphans and all("EngineCore" in m.cmdline for m in orphans), marked


def test_wait_ready_cli(sims: list[subprocess.Popen[bytes]]) -> None:
    """The command the unit's ExecStartPost runs, with $MAINPID as systemd sets it."""
    port = free_port()
    p = start_sim(sims, port)
    cmd = [
        sys.executable,
        "-m",
        "servelab",
        "wait-ready",
        f"http://127.0.0.1:{port}",
        "--engine",
        "sim",
        "--model",
        MODEL,
        "--timeout",
        "60",
        "--json",
    ]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "MAINPID": str(p.pid)}
    )
    assert res.returncode == 0, res.stderr
    assert '"warmup"' in res.stdout
    dead = start_sim(sims, free_port(), "--fault", "cuda_init")
    res = subprocess.run(
        [*cmd[:4], f"http://127.0.0.1:{free_port()}", *cmd[5:]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "MAINPID": str(dead.pid)},
    )
    assert res.returncode == 1 and "exited before it was ready" in res.stderr


def test_unit_commands_run_for_real(sims: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """ExecStartPre, ExecStart and ExecStartPost of a generated unit, read back by systemd's rules and run
    with the unit's Environment=: preflight passes, the server starts, wait-ready passes; then the server left
    running is what the next start's preflight refuses, and `--kill-stale` ends it."""
    from tests.unit.deploy.systemd_reader import unquote_words

    from servelab.deploy import spec, systemd
    from servelab.deploy.source import LaunchRecord
    from servelab.engines.base import Settings

    port = free_port()
    launch = registry.get("sim").command(
        Settings(
            model=MODEL,
            port=port,
            options={"gpu": "h100-sxm", "speed": 50, "fast_start": True, "python": sys.executable},
        )
    )
    rec = LaunchRecord(
        "s-x",
        "it",
        "tp1",
        1,
        "sim",
        launch.argv,
        {"ODD": 'a "b" 5% $HOME'},
        launch.url,
        MODEL,
        MODEL,
        "0.1",
        3.0,
        [],
        1.0,
    )
    text = systemd.render_unit(spec.build(rec, "it-unit"))
    (tmp_path / "it-unit.service").write_text(text)
    assert systemd.verify_unit(tmp_path / "it-unit.service") == []

    def line(key: str) -> list[str]:
        (v,) = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith(key + "=")]
        return unquote_words(v, dollar=key.startswith("Exec"))

    env = {**os.environ}
    for ln in text.splitlines():
        if ln.startswith("Environment="):
            k, _, v = unquote_words(ln.removeprefix("Environment="), dollar=False)[0].partition("=")
            env[k] = v
    assert env["ODD"] == 'a "b" 5% $HOME'
    assert (
        subprocess.run(line("ExecStartPre"), env=env, capture_output=True, timeout=60, cwd=ROOT).returncode
        == 0
    )
    server = subprocess.Popen(
        [*line("ExecStart"), "--cpu", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    sims.append(server)
    post = subprocess.run(
        line("ExecStartPost"),
        env={**env, "MAINPID": str(server.pid)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert post.returncode == 0, post.stderr
    assert b"SERVELAB_RUN=servelab-deploy:it-unit" in Path(f"/proc/{server.pid}/environ").read_bytes()

    again = subprocess.run(
        line("ExecStartPre"), env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert (
        again.returncode == 1
        and f"held by pid {server.pid}" in again.stdout
        and "--kill-stale" in again.stdout
    )
    kill = subprocess.run(
        [*line("ExecStartPre"), "--kill-stale"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert kill.returncode == 0, kill.stdout + kill.stderr
    assert f"ended pid {server.pid}" in kill.stdout and server.wait(10) is not None


class FakeSystemd:
    """Stands in for systemctl only (this host runs no systemd): `start` does what systemd does with the
    written unit (tests/support/fake_systemctl.py, the same code the remote tests run as an executable), so
    everything after it (wait-ready, verify-output, the benchmark, the check) is real."""

    def __init__(self, unit_dir: Path) -> None:
        self.unit_dir = unit_dir
        self.calls: list[tuple[str, ...]] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        from tests.support.fake_systemctl import start_unit

        self.calls.append(args)
        if args[0] != "start":
            return subprocess.CompletedProcess(list(args), 0, "ActiveState=active\nSubState=running\n", "")
        res, server = start_unit(self.unit_dir / args[1], timeout)
        if server is not None:
            self.procs.append(server)
        return res

    @classmethod
    def installed(cls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeSystemd, Path]:
        """One in place of `systemctl` for `deploy.install`, with its unit directory."""
        from servelab.deploy import install

        unit_dir, runtime = tmp_path / "units", tmp_path / "run-systemd"
        unit_dir.mkdir()
        runtime.mkdir()
        fake = cls(unit_dir)
        monkeypatch.setattr(install, "UNIT_DIR", unit_dir)
        monkeypatch.setattr(install, "SYSTEMD_RUNTIME", runtime)
        monkeypatch.setattr(install, "_systemctl", fake)
        return fake, unit_dir


@pytest.mark.parametrize("tuned_tps,ok", [(1.0, True), (1e9, False)])
def test_install_checks_the_deployment_against_the_tuned_result(
    tuned_tps: float, ok: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from click.testing import CliRunner
    from tests.unit.deploy.stored import DIGEST, store_study

    from servelab.cli.deploy import deploy_cmd
    from servelab.deploy.records import DeploymentRepo
    from servelab.store import open_store

    fake, unit_dir = FakeSystemd.installed(tmp_path, monkeypatch)
    digest = {**DIGEST, "output_throughput": tuned_tps, "tpot_ms_p50": None, "ttft_ms_p50": None}
    with open_store() as store:
        ids = store_study(store, "sim", port=free_port(), digest=digest)
    try:
        res = CliRunner().invoke(
            deploy_cmd,
            [f"{ids['uid']}:tp1", "--name", "llm", "--install", "--json", "--out", str(tmp_path / "out")],
        )
    finally:
        for p in fake.procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait(10)
    assert [c[0] for c in fake.calls[:3]] == ["daemon-reload", "enable", "start"]
    assert res.exit_code == (0 if ok else 1), (res.output, res.exception)
    d = json.loads(res.output)
    check = d["install"]["check"]
    assert check["ok"] is ok and check["level"] == 4.0
    assert check["verdict"].startswith("as tuned" if ok else "NOT as tuned (±10 %): output_throughput")
    assert (unit_dir / "llm.service").is_file()
    with open_store() as store:
        (rec,) = DeploymentRepo(store).list(installed_only=True)
    assert rec["status"] == ("ready" if ok else "degraded") and rec["check"]["ok"] is ok
    assert rec["check"]["measured"]["completed"] > 0 and rec["check"]["verify"]["ok"] is True
    from servelab.deploy.records import installed_units

    with open_store() as store:
        (unit,) = installed_units(store)
    assert unit["name"] == "llm" and unit["check"]["ok"] is ok and unit["unit"]["unit"] == "llm.service"
    # `servelab status` shows the unit and its check from then on (no systemd here: the record still shows).
    from servelab.status.stored import deployments

    (shown,) = deployments()
    assert shown["name"] == "llm" and shown["check"]["ok"] is ok


def test_install_checks_with_the_trial_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy --install's check is the trial pipeline's verify + bench, attached to the unit systemd started:
    its stored digest is `trial.level_digest` of its own bench run, and that bench run was configured exactly
    as `Trial.bench` configures one against the same server."""
    import json

    from click.testing import CliRunner
    from tests.unit.deploy.stored import DIGEST, store_study, study_data

    from servelab.cli.deploy import deploy_cmd
    from servelab.config.loading import parse_study
    from servelab.deploy.records import DeploymentRepo
    from servelab.store import open_store
    from servelab.store.bench import BenchRepo
    from servelab.trial.outcome import Target
    from servelab.trial.pipeline import Trial
    from servelab.trial.prepare import level_digest, sim_speed

    fake, _units = FakeSystemd.installed(tmp_path, monkeypatch)
    with open_store() as store:
        # a tuned result any run of the simulator is within: the check passes, what it ran is what we look at
        tuned = {**DIGEST, "output_throughput": 1.0, "tpot_ms_p50": None, "ttft_ms_p50": None}
        ids = store_study(store, "sim", port=free_port(), digest=tuned)
    try:
        res = CliRunner().invoke(
            deploy_cmd,
            [f"{ids['uid']}:tp1", "--name", "llm", "--install", "--json", "--out", str(tmp_path / "out")],
        )
        d = json.loads(res.output)
        with open_store() as store:
            (rec,) = DeploymentRepo(store).list(installed_only=True)
            check = rec["check"]
            study = parse_study(study_data("sim"))  # the study store_study stored
            bench = BenchRepo(store)
            deployed = bench.load(str(check["bench_run_id"]))
            assert deployed.uid == d["install"]["bench_run"]
            (level,) = deployed.levels
            assert check["measured"] == level_digest(level, deployed.clock)
            assert deployed.context.host.source == "study" and deployed.clock.speed == sim_speed(study)
            # the same pipeline step, run here against the unit's server: the same bench configuration
            url, model = deployed.url, deployed.model
            ours = asyncio.run(Trial(study, registry.get("sim"), store).bench(Target(url, model), [4.0]))
            (lv,) = ours.levels
            again = bench.load(lv.bench_uid)
            assert again.config == deployed.config and again.config["levels"] == [4.0]
            assert set(lv.digest) == set(check["measured"])
    finally:
        for p in fake.procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait(10)
    assert res.exit_code == 0, (res.output, res.exception)
    assert check["ok"] is True and check["verify"]["ok"] is True
