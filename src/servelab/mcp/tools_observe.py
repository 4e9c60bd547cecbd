"""Observe: `status`, `doctor`, `logs_diagnose`, `logs_parse` (each its command run as a child), and the
signatures knowledge base `logs_diagnose` classifies with, as a resource."""

from __future__ import annotations

from importlib import resources

from servelab import arguments as A
from servelab.mcp import models as M
from servelab.mcp.base import Group, Options, Resource, call, flags
from servelab.mcp.studies import Studies


async def status(
    url: A.Urls = None,
    unit: A.Units = None,
    log: A.StatusLog = None,
    gpu_source: A.GpuSource = None,
    host: A.Host = None,
) -> M.StatusView:
    """What is true right now: GPUs, servers, services, leftovers, unfinished studies, a verdict."""
    return await call(
        M.StatusView, ["status", *flags(url=url, unit=unit, log=log, gpu_source=gpu_source, host=host)]
    )


async def doctor(gpu_source: A.GpuSource = None, host: A.Host = None) -> M.DoctorView:
    """Host checks with their fixes (nvidia_uvm, /dev/shm, P2P, PCIe link, power limits, ECC, …)."""
    return await call(M.DoctorView, ["doctor", *flags(gpu_source=gpu_source, host=host)])


async def logs_diagnose(
    file: A.LogFile = None,
    engine: A.LogEngine = None,
    unit: A.LogUnit = None,
    lines: A.LogLines = None,
    host: A.Host = None,
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
    engine: A.ParseEngine,
    file: A.LogFile = None,
    server_info: A.ServerInfo = None,
    unit: A.LogUnit = None,
    lines: A.LogLines = None,
    host: A.Host = None,
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
