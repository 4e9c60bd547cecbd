"""The half of `servelab status` read on the observed machine itself: GPUs, topology, systemd units,
leftovers (shared memory, compile caches, listeners, marked processes) and a server log. On a remote host
the agent runs it (op `observe_host`, servelab.agent.ops_observe); locally LocalHost.call runs the same.
Light on imports (no HTTP client, no asyncio): the remote agent imports it on every `status --host`.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from servelab.host import gpus as gpumod
from servelab.host import ports, processes, shm, systemd, topology
from servelab.jsontypes import JsonObject, JsonValue
from servelab.redact import redact

SIM_TELEMETRY = "/servelab/gpus"
STALE_CACHE_DAYS = 14.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")
# Compile caches engines keep between runs; a stale or half-written one breaks the next start-up.
CACHE_DIRS: tuple[str, ...] = (
    "~/.cache/vllm/torch_compile_cache",
    "~/.cache/flashinfer",
    "~/.triton/cache",
    "~/.cache/sglang",
    "/tmp/torchinductor_{user}",
)
# The engines' periodic throughput lines (vLLM's "Avg ... throughput", SGLang's "Decode batch").
THROUGHPUT_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "vllm",
        re.compile(
            r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: "
            r"(?P<gen>[\d.]+) tokens/s, Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs"
        ),
    ),
    (
        "sglang",
        re.compile(
            r"#running-req: (?P<running>\d+).*gen throughput \(token/s\): (?P<gen>[\d.]+), "
            r"#queue-req: (?P<waiting>\d+)"
        ),
    ),
)
CLEAN_SHUTDOWN = ("Application shutdown complete", "Shutting down")
LOG_TEXT_MAX = 16 * 1024 * 1024  # the log text the host side sends back for the effective configuration


# -- GPUs ------------------------------------------------------------------------------------------
def sim_report(url: str, telemetry: Mapping[str, object] | None) -> gpumod.GpuReport:
    if telemetry is None:
        return gpumod.GpuReport(
            source=f"sim:{url}",
            available=False,
            note=f"no GPU telemetry at {url}{SIM_TELEMETRY} (is the simulator running?)",
        )
    return gpumod.from_sim(telemetry, url)


def read_gpus(gpu_source: str | None) -> gpumod.GpuReport:
    """This host's own GPUs from the named source (None/auto/local: NVML, else nvidia-smi)."""
    if gpu_source == "nvml":
        return gpumod.read_nvml() or gpumod.GpuReport(
            "nvml", False, note="NVML unavailable (pip install 'servelab[gpu]')"
        )
    if gpu_source == "nvidia-smi":
        return gpumod.read_nvidia_smi() or gpumod.GpuReport(
            "nvidia-smi", False, note="nvidia-smi unavailable"
        )
    return gpumod.read_local()


# -- leftovers -------------------------------------------------------------------------------------
def _dir_size(path: Path, limit: int = 20000) -> tuple[int, float, bool]:
    """Bytes, newest mtime, and whether the walk stopped at `limit` files."""
    total, newest, n = 0, path.stat().st_mtime, 0
    for root, _, files in os.walk(path):
        for f in files:
            n += 1
            if n > limit:
                return total, newest, True
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, f))
                total += st.st_size
                newest = max(newest, st.st_mtime)
    return total, newest, False


def compile_caches(now: float | None = None, dirs: tuple[str, ...] = CACHE_DIRS) -> list[JsonObject]:
    now = now or time.time()
    user = os.environ.get("USER") or str(os.getuid())
    out: list[JsonObject] = []
    for d in dirs:
        path = Path(os.path.expanduser(d.format(user=user)))
        if not path.is_dir():
            continue
        size, newest, partial = _dir_size(path)
        age = (now - newest) / 86400
        out.append(
            {
                "path": str(path),
                "bytes": size,
                "partial": partial,
                "age_days": round(age, 1),
                "stale": age > STALE_CACHE_DAYS,
            }
        )
    return out


def leftovers(urls: list[str]) -> JsonObject:
    """Shared-memory segments, compile caches, the listeners on the servers' ports (a URL on loopback is
    this host's) and the processes carrying a servelab marker, on this host."""
    segs: list[JsonValue] = []
    for s in shm.segments():
        segs.append(
            {
                "name": s.name,
                "bytes": s.size,
                "uid": s.uid,
                "owners": list(s.owners),
                "owners_alive": bool(s.owners),
                "ours": s.uid == os.getuid(),
            }
        )
    held: list[JsonValue] = []
    for u in urls:
        parsed = urlparse(u)
        port = parsed.port
        if port is None or parsed.hostname not in LOCAL_HOSTS:
            continue  # a remote server's port says nothing about this host
        for lst in ports.listeners(port):
            held.append(
                {
                    "port": port,
                    "address": lst.address,
                    "pid": lst.pid,
                    "command": lst.cmdline,
                    "marker": processes.marker_of(lst.pid) if lst.pid else None,
                }
            )
    marked: list[JsonValue] = [
        {"pid": p.pid, "marker": p.marker, "command": p.cmdline} for p in processes.with_marker()
    ]
    caches: list[JsonValue] = list(compile_caches())
    return {"shm": segs, "compile_caches": caches, "ports": held, "marked_processes": marked}


# -- the log ---------------------------------------------------------------------------------------
def read_log(path: str) -> JsonObject:
    """Tail with highlights: effective configuration, last throughput figures, error signature, diagnosis."""
    from servelab.engines import registry, signatures

    p = Path(path)
    if not p.is_file():
        return {"path": path, "available": False, "note": f"{path} does not exist"}
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        return {"path": path, "available": False, "note": f"cannot read {path}: {exc.strerror}"}
    engine = signatures.guess_engine(text)
    eff = registry.get(engine).effective_config(text, None) if engine else None
    throughput: JsonObject | None = None
    for line in reversed(text.splitlines()):
        for name, pat in THROUGHPUT_PATTERNS:
            m = pat.search(line)
            if m:
                throughput = {
                    "engine": name,
                    **{k: float(v) for k, v in m.groupdict().items()},
                    "line": line.strip()[-300:],
                }
                break
        if throughput:
            break
    diag = signatures.diagnose(text, engine).to_dict()
    return {
        "path": path,
        "available": True,
        "engine": engine,
        "effective": redact(eff.effective) if eff else {},
        "evidence": redact(eff.evidence) if eff else {},
        "throughput": throughput,
        "diagnosis": diag,
        # Uvicorn's shutdown lines, with no fatal signature anywhere: stopped on purpose (SIGTERM, Ctrl-C).
        "clean_shutdown": any(m in text for m in CLEAN_SHUTDOWN) and not diag["fatal"],
        "tail": list(signatures.important_tail(text)),
    }


# -- all of it, in one call -------------------------------------------------------------------------
def observe_host(
    urls: list[str],
    units: list[str] | None = None,
    log: str | None = None,
    gpu_source: str | None = None,
    telemetry_url: str | None = None,
    telemetry: Mapping[str, object] | None = None,
    want_log_text: bool = False,
) -> JsonObject:
    """The half of `servelab status` read on the observed machine itself (the agent op `observe_host` on a
    remote host, this process on a local one): GPUs (a simulator's telemetry when `telemetry_url` is set,
    fetched by the control side), topology, systemd units, leftovers, the log. JSON-able."""
    rep = sim_report(telemetry_url, telemetry) if telemetry_url is not None else read_gpus(gpu_source)
    gpumod.enrich(rep, local=True)  # GPU processes (the simulator's too) live on this host
    svc = systemd.states(units)
    log_info = read_log(log) if log else None
    log_text = ""
    if want_log_text and log and log_info and log_info.get("available"):
        with contextlib.suppress(OSError), open(log, encoding="utf-8", errors="replace") as f:
            log_text = f.read(LOG_TEXT_MAX)
    return {
        "hostname": socket.gethostname(),
        "gpus": rep.to_dict(),
        "topology": topology.read()
        if not rep.source.startswith("sim:")
        else {
            "available": False,
            "note": "simulated GPUs have no topology matrix",
            "numa": dict(topology.numa_nodes()),
            "virtual_machine": topology.is_virtual_machine(),
        },
        "services": [u.to_dict() for u in svc.units],
        "services_note": svc.note,
        "leftovers": leftovers(urls),
        "log": log_info,
        "log_text": log_text,
    }
