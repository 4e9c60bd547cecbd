"""Observe: `status`, `doctor`, `logs_diagnose`, `logs_parse` (each its command run as a child), and the
signatures knowledge base `logs_diagnose` classifies with, as a resource."""

from __future__ import annotations

from importlib import resources
from typing import Annotated

from pydantic import Field

from servelab.mcp import models as M
from servelab.mcp.base import Group, Host, Options, Resource, call, flags
from servelab.mcp.studies import Studies


async def status(
    url: Annotated[list[str] | None, Field(description="Servers to probe (default: the last run's).")] = None,
    unit: Annotated[list[str] | None, Field(description="systemd units (default: servelab*).")] = None,
    log: Annotated[str | None, Field(description="A server log to read.")] = None,
    gpu_source: Annotated[str | None, Field(description="auto, nvml, nvidia-smi or sim:URL.")] = None,
    host: Host = None,
) -> M.StatusView:
    """What is true right now: GPUs, servers, services, leftovers, unfinished studies, a verdict."""
    return await call(
        M.StatusView, ["status", *flags(url=url, unit=unit, log=log, gpu_source=gpu_source, host=host)]
    )


async def doctor(gpu_source: str | None = None, host: Host = None) -> M.DoctorView:
    """Host checks with their fixes (nvidia_uvm, /dev/shm, P2P, PCIe link, power limits, ECC, …)."""
    return await call(M.DoctorView, ["doctor", *flags(gpu_source=gpu_source, host=host)])


async def logs_diagnose(
    file: Annotated[str | None, Field(description="The server log (or give unit).")] = None,
    engine: str | None = None,
    unit: str | None = None,
    lines: int | None = None,
    host: Host = None,
) -> M.DiagnosisView:
    """Classify a failed server's log with the signatures knowledge base: class, evidence, advice."""
    return await call(
        M.DiagnosisView,
        [
            "logs",
            "diagnose",
            *([file] if file else []),
            *flags(engine=engine, unit=unit, lines=lines, host=host),
        ],
    )


async def logs_parse(
    engine: Annotated[str, Field(description="The engine that wrote the log: vllm, sglang, …")],
    file: str | None = None,
    server_info: Annotated[
        str | None, Field(description="JSON saved from the engine's info endpoint.")
    ] = None,
    unit: str | None = None,
    lines: int | None = None,
    host: Host = None,
) -> M.LogsParseView:
    """The configuration a server log shows it runs (effective), with the log line for each key."""
    return await call(
        M.LogsParseView,
        [
            "logs",
            "parse",
            *([file] if file else []),
            *flags(engine=engine, server_info=server_info, unit=unit, lines=lines, host=host),
        ],
    )


def signatures_resource() -> str:
    """The failure signatures knowledge base `logs_diagnose` classifies logs with."""
    return resources.files("servelab.engines").joinpath("signatures.toml").read_text()


def group(opts: Options, runs: Studies) -> Group:
    return Group(
        [status, doctor, logs_diagnose, logs_parse],
        [Resource("servelab://signatures", "application/toml", signatures_resource)],
    )
