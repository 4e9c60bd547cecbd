"""Preflight against real leftovers: processes holding the port (and, through an injected GPU process list,
GPUs), and real /dev/shm files."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servelab.deploy.preflight import GpuProcess, classify, preflight
from servelab.host.ports import free_port, port_is_free

LISTEN = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); print("up", flush=True); time.sleep(600)
"""
HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); print('up', flush=True); time.sleep(600)"

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(code: str, *args: str, marker: str | None = None) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k != "SERVELAB_RUN"}
        if marker:
            env["SERVELAB_RUN"] = marker
        p = subprocess.Popen(
            [sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, start_new_session=True
        )
        assert p.stdout is not None and p.stdout.readline().strip() == b"up"
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


NO_GPU = lambda: None  # noqa: E731


def test_free_host_passes() -> None:
    port = free_port()
    r = preflight(
        "127.0.0.1",
        port,
        gpus="none",
        marker="servelab-deploy:a",
        gpu_reader=NO_GPU,
        shm_patterns=("psm_nothing_here_*",),
    )
    assert r.ok and not r.holders and not r.killed


def test_own_leftover_on_the_port_is_refused_then_killed(spawn: Spawn) -> None:
    port = free_port()
    p = spawn(LISTEN, str(port), marker="servelab-deploy:llm")
    r = preflight(
        "127.0.0.1",
        port,
        gpus="none",
        marker="servelab-deploy:llm",
        gpu_reader=NO_GPU,
        shm_patterns=("psm_nothing_here_*",),
    )
    assert not r.ok and p.poll() is None
    (reason,) = r.refusals
    assert f"port {port} held by pid {p.pid}" in reason and "stale" in reason and "--kill-stale" in reason
    r = preflight(
        "127.0.0.1",
        port,
        gpus="none",
        marker="servelab-deploy:llm",
        kill_stale=True,
        gpu_reader=NO_GPU,
        shm_patterns=("psm_nothing_here_*",),
        grace_s=5,
    )
    assert r.ok, r.refusals
    assert [k.pid for k in r.killed] == [p.pid] and r.killed[0].killed == "SIGTERM"
    assert p.wait(5) is not None and port_is_free("127.0.0.1", port)


def test_another_live_unit_is_never_killed(spawn: Spawn) -> None:
    port = free_port()
    p = spawn(LISTEN, str(port), marker="servelab-deploy:other")
    for state in (None, "active"):  # no systemd to ask: assumed alive; systemd says active
        r = preflight(
            "127.0.0.1",
            port,
            gpus="none",
            marker="servelab-deploy:llm",
            kill_stale=True,
            gpu_reader=NO_GPU,
            shm_patterns=("psm_nothing_here_*",),
            unit_state_of=lambda _u, s=state: s,
        )
        assert not r.ok and not r.killed and p.poll() is None
        assert "live unit other" in r.refusals[0]
    r = preflight(
        "127.0.0.1",
        port,
        gpus="none",
        marker="servelab-deploy:llm",
        kill_stale=True,
        gpu_reader=NO_GPU,
        shm_patterns=("psm_nothing_here_*",),
        unit_state_of=lambda _u: "failed",
        grace_s=5,
    )
    assert r.ok and [k.pid for k in r.killed] == [p.pid]  # that unit is dead: its leftover is stale


def test_gpu_holder_is_reported_and_killed(spawn: Spawn) -> None:
    port = free_port()
    stale = spawn(LISTEN, str(free_port()), marker="servelab-study:s-1:tp2:0")
    bystander = spawn(LISTEN, str(free_port()))
    procs = [GpuProcess(stale.pid, "1", 70_000), GpuProcess(bystander.pid, "3", 500)]

    def reader() -> list[GpuProcess]:
        return [g for g in procs if Path(f"/proc/{g.pid}").exists() and not _zombie(g.pid)]

    r = preflight(
        "127.0.0.1",
        port,
        gpus="0,1",
        marker="servelab-deploy:llm",
        gpu_reader=reader,
        shm_patterns=("psm_nothing_here_*",),
    )
    (reason,) = r.refusals  # GPU 3 is not the unit's
    assert f"GPU 1 (70000 MiB) held by pid {stale.pid}" in reason and "servelab-study:s-1:tp2:0" in reason
    r = preflight(
        "127.0.0.1",
        port,
        gpus="0,1",
        marker="servelab-deploy:llm",
        kill_stale=True,
        gpu_reader=reader,
        shm_patterns=("psm_nothing_here_*",),
        grace_s=5,
    )
    assert r.ok and [k.pid for k in r.killed] == [stale.pid] and bystander.poll() is None
    procs[1] = GpuProcess(bystander.pid, "3", 500, "GPU-3333")
    r = preflight(
        "127.0.0.1",
        port,
        gpus="GPU-3333",
        marker="servelab-deploy:llm",
        gpu_reader=reader,
        shm_patterns=("psm_nothing_here_*",),
    )
    assert not r.ok and f"GPU 3 (500 MiB) held by pid {bystander.pid}" in r.refusals[0]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


def test_no_gpu_list_is_a_note_not_a_refusal() -> None:
    r = preflight(
        "127.0.0.1", free_port(), gpus="all", gpu_reader=NO_GPU, shm_patterns=("psm_nothing_here_*",)
    )
    assert r.ok and any("GPUs not checked" in n for n in r.notes)


def test_stale_shm_removed_held_shm_kept(spawn: Spawn) -> None:
    tag = f"psm_servelabtest_{uuid.uuid4().hex[:8]}"
    orphan, held = Path(f"/dev/shm/{tag}_orphan"), Path(f"/dev/shm/{tag}_held")
    try:
        orphan.write_bytes(b"x" * 4096)
        held.write_bytes(b"y" * 4096)
        holder = spawn(HOLD, str(held))
        r = preflight(
            "127.0.0.1",
            free_port(),
            gpus="none",
            gpu_reader=NO_GPU,
            shm_patterns=(f"{tag}_*",),
            kill_stale=True,
        )
        assert r.shm_removed == [orphan.name] and not orphan.exists()
        assert held.exists() and r.shm_held == [f"{held.name} (held by pid {holder.pid})"]
        assert r.ok
    finally:
        for f in (orphan, held):
            f.unlink(missing_ok=True)


def test_compile_cache_reset(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    (cache / "sub" / "k.bin").write_bytes(b"1")
    (cache / "f").write_bytes(b"1")
    r = preflight(
        "127.0.0.1",
        free_port(),
        gpus="none",
        gpu_reader=NO_GPU,
        shm_patterns=("psm_nothing_here_*",),
        reset_compile_cache=True,
        compile_caches=[str(cache)],
    )
    assert r.caches_reset == [str(cache)] and cache.is_dir() and not list(cache.iterdir())


def test_classify() -> None:
    alive: Callable[[str], str | None] = lambda _u: "active"  # noqa: E731
    starting: Callable[[str], str | None] = lambda _u: "activating"  # noqa: E731
    assert classify(None, "servelab-deploy:a", alive) == "stale"
    assert classify("servelab-study:x", "servelab-deploy:a", alive) == "stale"
    assert classify("servelab-deploy:a", "servelab-deploy:a", starting) == "stale"  # our own ExecStartPre
    assert classify("servelab-deploy:a", "servelab-deploy:a", alive) == "live unit a"  # a manual run
    assert classify("servelab-deploy:b", "servelab-deploy:a", starting).startswith("live unit b")
