"""/dev/shm cleanup never touches another job's segments: a real vLLM on CPU starts while other servelab jobs
start, die and clean up after themselves in a loop, and must become ready and serve.

What this guards against (seen on a shared CI box): a job's teardown removed the `sem.mp-*` named semaphore
that a starting vLLM's API server had just created for its EngineCore, and the EngineCore then failed to open
it. The segment was new since that job's launch and looked unheld, because glibc's sem_open maps a semaphore
under a temporary name (`sem.XXXXXX (deleted)` in the creator's /proc/PID/maps).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.support import engines

from servelab.engines import registry
from servelab.engines.base import LaunchSpec, Settings
from servelab.host import processes
from servelab.host.ports import free_port
from servelab.host.shm import SHM_DIR, segments
from servelab.lifecycle.local import launch, record_shm, run_processes
from servelab.lifecycle.ready import wait_ready
from servelab.lifecycle.serving import teardown

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL_NAME = "tiny-qwen3-moe"
_CPUS = sorted(os.sched_getaffinity(0))
VLLM_CPUS = {_CPUS[0]}
JOB_CPUS = set(_CPUS[1:]) or VLLM_CPUS

# Another job's server: it creates a named semaphore (as multiprocessing does, without the resource tracker
# that would unlink it at exit) and a psm_ segment, says so, and is then killed without cleaning up.
OTHER_JOB = """
import _multiprocessing, mmap, os, sys, time
tag = sys.argv[1]
sem = _multiprocessing.SemLock(1, 1, 1, "/mp-slt-" + tag, False)
fd = os.open("/dev/shm/psm_slt_" + tag, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
keep = mmap.mmap(fd, 4096)
print("up", flush=True)
time.sleep(600)
"""


def _other_job(tmp: Path, i: int) -> set[str]:
    """Launch one short-lived job, wait until it holds its segments, tear it down; check its cleanup removed
    its own segments and nothing else. Returns what it removed (on this shared box another job's sweep may
    have removed one of them first: that is theirs to answer for, not a removal by this cleanup)."""
    tag = f"{uuid.uuid4().hex[:8]}-{i}"
    own = {f"sem.mp-slt-{tag}", f"psm_slt_{tag}"}
    port = free_port()
    spec = LaunchSpec([sys.executable, "-c", OTHER_JOB, tag], {}, "127.0.0.1", port, "none")
    server = launch(spec, tmp / f"job-{tag}.log", f"test-shm-other-{tag}", cpus=JOB_CPUS)
    try:
        deadline = time.monotonic() + 60
        while "up" not in server.log_text() and time.monotonic() < deadline:
            assert server.exit_code() is None, server.log_text()
            time.sleep(0.02)
        assert "up" in server.log_text(), "the other job never came up"
    finally:
        down = teardown(server, grace_s=5, gpu_timeout_s=1)
    removed = set(down.shm.removed)
    assert removed <= own, f"job {tag} removed {sorted(removed - own)}, which it did not create"
    assert not any((SHM_DIR / n).exists() for n in own)
    assert processes.with_marker(server.run_marker) == []
    return removed


@pytest.mark.xdist_group("vllm")  # a vLLM of its own: beside the shared one, not beside a second worker's
def test_vllm_starts_while_other_jobs_clean_up_in_a_loop(tmp_path: Path) -> None:
    model_dir = engines.build_tiny_model("qwen3_moe")
    python = str(engines.engines_python())
    port = free_port()
    adapter = registry.get("vllm")
    spec = adapter.command(
        Settings(
            model=str(model_dir),
            served_model_name=MODEL_NAME,
            port=port,
            max_model_len=4096,
            options={"cpu": True, "python": python, "cpu_bind": ",".join(map(str, sorted(VLLM_CPUS)))},
        )
    )
    env = {k: v for k, v in engines._engines_env(spec.env).items() if os.environ.get(k) != v}
    spec = LaunchSpec(spec.argv, env, spec.host, spec.port, spec.served_model)
    log = engines.log_dir() / f"shm-cleanup-vllm-{port}.log"
    server = launch(spec, log, f"test-shm-vllm-{uuid.uuid4().hex[:10]}", cpus=VLLM_CPUS)
    outcome: dict[str, Any] = {}

    def wait() -> None:
        try:
            outcome["ready"] = asyncio.run(
                wait_ready(server, adapter.readiness, engines.VLLM_STARTUP_TIMEOUT_S, "vllm")
            )
        except BaseException as exc:  # reported below, with the log
            outcome["error"] = exc

    waiter = threading.Thread(target=wait, daemon=True)
    jobs, removed = 0, 0
    try:
        waiter.start()
        while waiter.is_alive():
            removed += len(_other_job(tmp_path, jobs))
            jobs += 1
        waiter.join()
        assert "error" not in outcome, f"{outcome.get('error')!r}\n--- {log} ---\n{server.log_text()[-6000:]}"
        ready = outcome["ready"]
        print(f"vLLM ready in {ready.ready_s:.0f} s while {jobs} other jobs started and cleaned up")
        assert jobs >= 10  # the sweeps really ran throughout the start
        assert removed >= jobs  # and really removed segments (their own)
        body = {"model": MODEL_NAME, "prompt": "bada kilo rumi", "max_tokens": 4}
        status, raw = engines._http("127.0.0.1", port, "POST", "/v1/completions", body, timeout=60)
        assert status == 200, raw[:500]
        ours = {p.pid for p in run_processes(server)}
        held = {s.name for s in segments() if s.key not in server.shm_before and set(s.owners) & ours}
        record_shm(server)
        recorded = {name for name, _ in server.shm.seen}
        assert held <= recorded, (held, recorded)
    finally:
        down = teardown(server, grace_s=30)
        waiter.join(60)
    assert down.clean, down.to_dict()
    assert set(down.shm.removed) <= recorded
    assert not any((SHM_DIR / name).exists() for name in recorded)
