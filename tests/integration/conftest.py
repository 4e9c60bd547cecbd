"""Shared real servers for integration tests.

Each real engine starts once per session: vLLM takes ~70 s (more when the box
is busy) to start on 2 cores and CI has 90 minutes for everything. A variant only
one module needs is that module's own fixture, stopped when the module ends (vLLM
with prefix caching on: test_bench_prefix_cache_vllm.py), so it is not left idle
beside `vllm_server` on its core while later modules measure that one. The fault
server starts in ~0.2 s and keeps per-run state (fault RNG, counters, the
``die`` countdown), so every test gets fresh instances from a factory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import engines, fake_systemctl, leftovers
from tests.support.fault_server import FaultServerHandle, fault_server
from tests.support.raycluster import RayCluster, ray_cluster
from tests.support.sshd import SshdHandle, sshd_server

VLLM_MODEL_NAME = "tiny-qwen3-moe"
_ALL_CPUS = sorted(os.sched_getaffinity(0))
SERVER_CPUS: set[int] | None = {_ALL_CPUS[0]} if len(_ALL_CPUS) >= 2 else None
CLIENT_CPUS: set[int] | None = set(_ALL_CPUS[1:]) if len(_ALL_CPUS) >= 2 else None


@pytest.fixture(scope="session")
def tiny_qwen3_moe() -> Path:
    """Tiny MoE for vLLM (head_dim 64: vLLM's CPU attention needs >= 64)."""
    return engines.build_tiny_model("qwen3_moe")


@pytest.fixture(scope="session")
def tiny_dense() -> Path:
    """Tiny dense Qwen3 for transformers serve."""
    return engines.build_tiny_model("qwen3")


def shared_vllm(model_dir: Path, env: dict[str, str]) -> Any:
    """The shared vLLM server's launch, as the fixture starts it and as test_startup_vllm_cpu starts it
    again warm (the same arguments: the compile cache is keyed by them)."""
    return engines.vllm_server(
        model_dir, served_model_name=VLLM_MODEL_NAME, cpus=SERVER_CPUS, env=env, no_enable_prefix_caching=True
    )


@pytest.fixture(scope="session")
def vllm_server(
    tiny_qwen3_moe: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[engines.ServerHandle]:
    # Server on core 0, benchmark clients on the other cores (see CLIENT_CPUS).
    # Prefix caching off: the benchmark tools repeat their seeded prompts, and cache hits would make
    # TTFT depend on which tool ran first. Its compile cache in a directory of this run, empty at launch:
    # the launch is cold whatever ~/.cache holds, and test_startup_vllm_cpu reads it as its cold launch
    # (`extra`: the environment and what the launch found), then launches the same server warm.
    from servelab.engines.startup import cache_at_launch

    env = {"VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache"))}
    found = cache_at_launch("vllm", env)
    with shared_vllm(tiny_qwen3_moe, env) as handle:
        handle.extra.update(env=env, cache_at_launch=found)
        yield handle


@pytest.fixture(scope="session")
def transformers_server(tiny_dense: Path) -> Iterator[engines.ServerHandle]:
    with engines.transformers_server(tiny_dense) as handle:
        yield handle


@pytest.fixture
def fault_server_factory() -> Iterator[Callable[..., FaultServerHandle]]:
    """``start(**Options fields, in_process=False)`` -> handle; all stopped at test end."""
    with contextlib.ExitStack() as stack:

        def start(**opts: Any) -> FaultServerHandle:
            return stack.enter_context(fault_server(**opts))

        yield start


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdHandle]:
    """One real sshd on 127.0.0.1 per session (~0.5 s to start); tests that stop it start it again before they
    end. Closed at session end (sshd, its sessions, ssh masters), before the leftover-process check runs."""
    root = tmp_path_factory.mktemp("sshd")
    units = root / "units"  # the "remote" unit directory of deploy --install --host
    units.mkdir()
    set_env = {
        # a stand-in systemctl on the "remote" (no systemd here): a monkeypatch does not cross SSH
        "SERVELAB_SYSTEMCTL": str(fake_systemctl.write_executable(root / "systemctl")),
        "SERVELAB_UNIT_DIR": str(units),
        # what servers that leave their sessions carry, so the run's leftover check finds them
        leftovers.SESSION_ENV: leftovers.TOKEN,
        # the "remote" servelab's home (agent logs, throwaway stores): the session's, not root's ~/.servelab
        "SERVELAB_HOME": str(root / "remote-home"),
    }
    with sshd_server(root / "server", set_env=set_env) as handle:
        yield handle


@pytest.fixture(scope="session")
def ray_nodes() -> Iterator[RayCluster]:
    """One real Ray cluster per session (~40 s to start on 2 cores): a head and two worker nodes, 8 GPUs and
    one CPU each (declared), in a network namespace of its own on 127.0.0.1. A test that kills a node adds
    one back before it ends."""
    with ray_cluster(workers=2, gpus=8) as cluster:
        yield cluster
