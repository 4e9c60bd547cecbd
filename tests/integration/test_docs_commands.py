"""Every `servelab …` command in README.md, docs/*.md and docs/cli/*.md, run as written, with the exit code
the docs promise; and the exit-code rule (docs/cli/exit-codes.md), one real command per class.

The extraction convention is tests/support/doccommands.py's docstring. What the test makes for the
placeholders and literal file names, in one working directory per command and a private copy of one store:

- URL and MODEL: a live `servelab sim` (GLM-5 NVFP4, TP8 on eight simulated RTX PRO 6000, SGLang, --speed 100)
  and its served model; RUN: a stored bench run against it; STUDY: `glm5-pcie`; STUDY.toml and
  examples/glm5-pcie.toml: a reduced copy of examples/glm5-pcie.toml (candidates tp8-cutlass and
  tp8-trtllm, concurrency 1 and 4, one request per stream, one repeat), tuned once into the store;
  examples/glm5-ray.toml: the shipped file as it is (the docs only dry-run it);
  examples/glm5-energy.toml, examples/glm5-cost.toml: the shipped files as they are (seconds each);
  examples/glm5-search.toml: the shipped search reduced as tests/integration/test_tune_search.py does, to
  a budget of 6 trials;
  S: 30 (seconds); PORT: a free port;
- server.log: that study's tp8-cutlass server log; info.json: the simulator's /get_server_info;
  sharegpt.json: a small ShareGPT file; mooncake.jsonl, burstgpt.csv, azure.csv: the sample traces
  (tests/fixtures/traces); serving_measurements.csv: every 25th row of the published
  measurements (the bare name resolves to a file in the working directory first).

Reduced forms: --num-requests is capped at 20 and --duration at 3 s; `servelab sim` gets --fast-start
(no simulated weight loading) and `--port 0`; `servelab ui` gets `--port 0`. Servers (`sim`, `ui`) run
until they answer, then get SIGINT: Ctrl-C is how they stop. `tune … --resume` first runs the study and
interrupts it with SIGINT (exit 130), then resumes it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest
from tests.integration.test_tune_search import reduced as reduced_search
from tests.support import doccommands, simruns, trace_samples
from tests.support.sshd import SshdHandle

from servelab import naming
from servelab.cli.main import cli
from servelab.host.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
EXTRACTED = doccommands.extract(ROOT)
RUN = [c for c in EXTRACTED.commands if c.kind == "run"]
NOT_RUN = [c for c in EXTRACTED.commands if c.kind == "not-run"]
NAMED = [c for c in EXTRACTED.commands if c.kind in ("synopsis", "inline", "not-run")]
SERVERS = {"sim": "SIM-PORT ", "ui": "servelab ui on http"}
CAPS = {"--num-requests": 20, "--duration": 3}
SPEED = 100.0


def reduced_study(text: str) -> str:
    head, rest = text.split("[[candidates]]", 1)
    cands, tail = ("[[candidates]]" + rest).split("[workload]", 1)
    keep = [
        "[[candidates]]" + b
        for b in cands.split("[[candidates]]")[1:]
        if 'name = "tp8-cutlass"' in b or 'name = "tp8-trtllm"' in b
    ]
    out = head + "".join(keep) + "[workload]" + tail
    for old, new in (
        ("repeats = 2", "repeats = 1"),
        ("concurrency = [1, 4, 16, 64, 256, 1024]\nmain = 64", "concurrency = [1, 4]\nmain = 4"),
        ("requests_per_stream = 2", "requests_per_stream = 1"),
    ):
        assert old in out, f"examples/glm5-pcie.toml changed: {old!r} is gone; update reduced_study"
        out = out.replace(old, new)
    return out


def cli_run(home: Path, cwd: Path, argv: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVELAB_HOME": str(home), "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "servelab", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


@dataclass(frozen=True)
class World:
    home: Path
    work: Path
    url: str
    model: str
    run: str

    def placeholders(self) -> dict[str, str]:
        return {
            "URL": self.url,
            "MODEL": self.model,
            "RUN": self.run,
            "STUDY": "glm5-pcie",
            "STUDY.toml": "examples/glm5-pcie.toml",
            "S": "30",
            "PORT": str(free_port()),
            "DB": "",  # the test's own store and database: filled in by `prepare`
            "PG_URL": "",
        }


@pytest.fixture(scope="module", autouse=True)
def ssh_host(sshd: SshdHandle) -> Iterator[None]:
    """The docs' `--host gpubox` is the test sshd: its client config names that alias (a user's would
    be ~/.ssh/config), and `python3` in its sessions has servelab."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in sshd.env().items():
            mp.setenv(k, v)
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("docs")
    work, home = root / "work", root / "home"
    (work / "examples").mkdir(parents=True)
    (work / "examples/glm5-pcie.toml").write_text(
        reduced_study((ROOT / "examples/glm5-pcie.toml").read_text())
    )
    shutil.copy(ROOT / "examples/glm5-ray.toml", work / "examples/glm5-ray.toml")  # dry runs only
    for name in ("glm5-energy.toml", "glm5-cost.toml"):  # small enough to run as shipped
        shutil.copy(ROOT / "examples" / name, work / "examples" / name)
    (work / "examples/glm5-search.toml").write_text(reduced_search(budget=6))
    sim = simruns.start_sim(root / "logs", *simruns.SIM_ARGS, speed=SPEED)
    try:
        tuned = cli_run(home, work, ["tune", "examples/glm5-pcie.toml", "--json"])
        assert tuned.returncode == 0, tuned.stderr[-3000:]
        run = simruns.bench(home, sim.url, simruns.MODEL, "--concurrency", "1", "--num-requests", "4")["run"]
        shutil.copy(
            next((home / "logs").glob(f"*/{naming.token('tp8-cutlass')}-r0-t*.log")), work / "server.log"
        )
        with urllib.request.urlopen(sim.url + "/get_server_info", timeout=10) as r:
            (work / "info.json").write_bytes(r.read())
        convo = [
            {"from": "human", "value": "Tell me about the sea. " * 20},
            {"from": "gpt", "value": "Waves. " * 30},
        ]
        (work / "sharegpt.json").write_text(
            json.dumps([{"id": str(i), "conversations": convo} for i in range(40)])
        )
        for trace in trace_samples.SAMPLES:
            shutil.copy(trace_samples.DIR / trace, work / trace)
        rows = (
            resources.files("servelab").joinpath("data", "serving_measurements.csv").read_text().splitlines()
        )
        (work / "serving_measurements.csv").write_text("\n".join(rows[:1] + rows[1::25]) + "\n")
        yield World(home, work, sim.url, simruns.MODEL, run)
    finally:
        sim.stop()


def test_every_doc_command_is_classified() -> None:
    assert not EXTRACTED.errors, "\n".join(EXTRACTED.errors)
    # The docs show commands; if extraction found almost none, the convention broke, not the docs.
    assert len(RUN) >= 30, [c.id for c in RUN]


@pytest.mark.parametrize("cmd", NAMED, ids=lambda c: f"{c.kind}:{c.id}")
def test_named_commands_and_options_exist(cmd: doccommands.DocCommand) -> None:
    assert not doccommands.check_names(cli, cmd)


@pytest.mark.parametrize("cmd", NOT_RUN, ids=lambda c: c.id)
def test_not_run_commands_say_why(cmd: doccommands.DocCommand) -> None:
    assert len(cmd.reason) > 10, f"{cmd.id}: a not-run block needs its reason"


def prepare(
    cmd: doccommands.DocCommand, world: World, tmp: Path, pg_url: str = ""
) -> tuple[list[str], Path, Path]:
    argv = cmd.argv[1:]
    table = world.placeholders() | {"DB": str(tmp / "home" / "servelab.db"), "PG_URL": pg_url}
    assert set(table) == doccommands.PLACEHOLDERS
    unknown = [a for a in argv if doccommands.PLACEHOLDER.match(a) and a not in table]
    assert not unknown, f"{cmd.id}: unknown placeholder(s) {unknown}; known: {sorted(table)}"
    argv = [table.get(a, a) for a in argv]
    for opt, cap in CAPS.items():
        if opt in argv:
            i = argv.index(opt) + 1
            argv[i] = str(min(float(argv[i]), cap)).removesuffix(".0")
    if argv[0] in SERVERS:
        if "--port" in argv:
            argv[argv.index("--port") + 1] = "0"
        else:
            argv += ["--port", "0"]
        if argv[0] == "sim":
            argv += ["--fast-start", "--speed", str(SPEED)]
    home, work = tmp / "home", tmp / "work"
    simruns.copy_store(world.home, home)
    shutil.copytree(world.work, work)
    return argv, home, work


def run_server(argv: list[str], home: Path, work: Path, ready: str) -> tuple[int, str]:
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    err = work / "server.err"
    with open(err, "wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "servelab", *argv], stdout=subprocess.DEVNULL, stderr=e, cwd=work, env=env
        )
    try:
        end = time.monotonic() + 60
        url = ""
        while time.monotonic() < end and not url:
            assert proc.poll() is None, err.read_text()[-3000:]
            for line in err.read_text().splitlines():
                if line.startswith("SIM-PORT "):
                    url = f"http://127.0.0.1:{line.split()[1]}/health"
                elif line.startswith("servelab ui on "):
                    url = line.split()[3]
            time.sleep(0.05)
        assert url, err.read_text()[-3000:]
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < end, err.read_text()[-3000:]
                time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        return proc.wait(30), err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def interrupt_tune(home: Path, work: Path) -> None:
    """Start the study and stop it with SIGINT once its first server is up: what `--resume` continues."""
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    before = set((home / "logs").glob("*/*.log"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "servelab", "tune", "examples/glm5-pcie.toml"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=work,
        env=env,
    )
    end = time.monotonic() + 60
    while time.monotonic() < end:
        new = [p for p in (home / "logs").glob("*/*.log") if p not in before]
        if new and "Decode batch" in new[0].read_text():
            break
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-3000:]


@pytest.mark.parametrize("cmd", RUN, ids=lambda c: c.id)
def test_doc_command_runs_as_written(
    cmd: doccommands.DocCommand, world: World, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # PG_URL: a fresh database of the session's cluster (its password in PGPASSWORD); a command that reads
    # what another wrote there (`runs list` after `db copy`) finds the world's store copied in first
    pg_url = str(request.getfixturevalue("pg_url")) if "PG_URL" in cmd.argv else ""
    argv, home, work = prepare(cmd, world, tmp_path, pg_url)
    if pg_url and argv[:2] != ["db", "copy"] and "migrate" not in argv:
        copied = cli_run(home, work, ["db", "copy", "--from", str(home / "servelab.db"), "--to", pg_url])
        assert copied.returncode == 0, copied.stderr
    if argv[0] in SERVERS:
        code, err = run_server(argv, home, work, SERVERS[argv[0]])
        assert code == cmd.expect, (
            f"{cmd.id}: {shlex.join(argv)} exited {code}, the docs promise {cmd.expect}\n{err[-3000:]}"
        )
        return
    if argv[0] == "tune" and "--resume" in argv:
        interrupt_tune(home, work)
    res = cli_run(home, work, argv)
    assert res.returncode == cmd.expect, (
        f"{cmd.id}: servelab {shlex.join(argv)} exited {res.returncode}, the docs promise {cmd.expect}\n"
        f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    )
    if "--json" in argv:
        json.loads(res.stdout)


def test_an_unusable_store_exits_1(tmp_path: Path) -> None:
    """The store class of the rule (the doc examples cover 2, 1 for servers and checks, and 130 above)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "servelab.db").write_text("not a database\n")
    res = cli_run(home, tmp_path, ["runs", "--json"])
    assert res.returncode == 1, res.stderr
    assert json.loads(res.stdout)["error"] == "StoreError"
    assert "cannot open the store" in res.stderr


def test_calibrate_fit_bare_name_is_the_packaged_csv(tmp_path: Path) -> None:
    """`--csv serving_measurements.csv` where no such file is: the published measurements servelab ships."""
    home = tmp_path / "home"
    assert not (tmp_path / "serving_measurements.csv").exists()
    fit = cli_run(
        home,
        tmp_path,
        [
            "calibrate",
            "fit",
            "--csv",
            "serving_measurements.csv",
            "--name",
            "p",
            "--engine",
            "trtllm",
            "--json",
        ],
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert json.loads(fit.stdout)["report"]["rows"] > 20
    show = cli_run(home, tmp_path, ["calibrate", "show", "p", "--json"])
    assert show.returncode == 0, show.stderr
    assert "servelab/data/serving_measurements.csv" in show.stdout
