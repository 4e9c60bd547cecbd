"""`servelab preflight`: before a deployed server starts, make sure nothing of an earlier one is in its way.

A unit restarted after a crash, or started on a box where a tuning run was killed, finds its port held by a
leftover server, its GPUs' memory held by a dead run's worker, and /dev/shm full of orphaned segments; the
engine then fails minutes later with an error that points elsewhere (OOM at init, NCCL shm errors, or, with
SO_REUSEPORT, it binds the port anyway and shares it). Preflight finds each of those in seconds and refuses
with the reason; `--kill-stale` ends the leftovers, but never a process of another live servelab unit.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from servelab.deploy.spec import defaults
from servelab.host import processes, shm
from servelab.host.agent_op import Answer, Request
from servelab.host.gpus import run_nvidia_smi
from servelab.host.ports import listeners, port_is_free
from servelab.host.processes import ProcInfo
from servelab.host.systemd import systemctl, systemctl_exe, systemd_running
from servelab.jsontypes import JsonObject
from servelab.naming import DEPLOY_MARKER_PREFIX


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    gpu: str  # the GPU's index
    used_mib: int | None
    uuid: str | None = None  # CUDA_VISIBLE_DEVICES may name GPUs by UUID


GpuProcReader = Callable[[], list[GpuProcess] | None]


def nvidia_smi_compute_apps() -> list[GpuProcess] | None:
    """Compute processes per GPU from nvidia-smi (None: no nvidia-smi or no GPU)."""
    gpus = run_nvidia_smi(["--query-gpu=index,uuid", "--format=csv,noheader"], timeout=20)
    apps = run_nvidia_smi(
        ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"], timeout=20
    )
    if gpus is None or apps is None:
        return None
    index = {}
    for line in gpus.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2:
            index[parts[1]] = parts[0]
    out = []
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            used = int(parts[2]) if parts[2].isdigit() else None
            out.append(GpuProcess(int(parts[0]), index.get(parts[1], parts[1]), used, parts[1]))
    return out


@dataclass
class Holder:
    """A process in the unit's way, and whether preflight may end it."""

    pid: int | None
    what: str  # "port 8000", "GPU 0 (1234 MiB)"
    cmdline: str
    marker: str | None
    verdict: str  # "stale" (may be ended), "live unit X" (never), "unreadable" (another user's)
    killed: str | None = None  # SIGTERM / SIGKILL / gone

    def to_dict(self) -> JsonObject:
        return {
            "pid": self.pid,
            "what": self.what,
            "cmdline": self.cmdline,
            "marker": self.marker,
            "verdict": self.verdict,
            "killed": self.killed,
        }

    def describe(self) -> str:
        who = (
            f"pid {self.pid} ({self.cmdline[:120] or '?'})"
            if self.pid is not None
            else "an unreadable process"
        )
        tag = f", marker {self.marker}" if self.marker else ""
        return f"{self.what} held by {who}{tag}: {self.verdict}"


@dataclass
class PreflightReport:
    port: int
    host: str
    gpus: str
    holders: list[Holder] = field(default_factory=list)
    killed: list[Holder] = field(default_factory=list)
    shm_removed: list[str] = field(default_factory=list)
    shm_held: list[str] = field(default_factory=list)
    caches_reset: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals

    def to_dict(self) -> JsonObject:
        return {
            "ok": self.ok,
            "host": self.host,
            "port": self.port,
            "gpus": self.gpus,
            "holders": [h.to_dict() for h in self.holders],
            "killed": [h.to_dict() for h in self.killed],
            "shm_removed": list(self.shm_removed),
            "shm_held": list(self.shm_held),
            "caches_reset": list(self.caches_reset),
            "refusals": list(self.refusals),
            "notes": list(self.notes),
        }


def unit_state(name: str) -> str | None:
    """systemctl is-active of NAME.service (None: no systemd here to ask)."""
    if systemctl_exe() is None or not systemd_running():
        return None
    try:
        out = systemctl("is-active", f"{name}.service", timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def classify(marker: str | None, own_marker: str, state: Callable[[str], str | None] = unit_state) -> str:
    """'stale' or why the process must be left alone.

    Our own unit's processes are stale while it is only starting (preflight runs as its ExecStartPre);
    another unit's are alive unless systemd says that unit is not running (no systemd: assumed alive)."""
    if marker is None or not marker.startswith(DEPLOY_MARKER_PREFIX):
        return "stale"
    unit = marker.removeprefix(DEPLOY_MARKER_PREFIX)
    s = state(unit)
    if marker == own_marker:
        return f"live unit {unit}" if s == "active" else "stale"
    if s is None or s in ("active", "activating", "reloading", "deactivating"):
        return f"live unit {unit}" + ("" if s else " (no systemd to ask: assumed alive)")
    return "stale"


def _holder(pid: int | None, what: str, own_marker: str, state: Callable[[str], str | None]) -> Holder:
    if pid is None:
        return Holder(None, what, "", None, "unreadable")
    info = processes.info(pid)
    if info is None:
        return Holder(pid, what, "", None, "gone")
    return Holder(pid, what, info.cmdline, info.marker, classify(info.marker, own_marker, state))


def _gpu_holders(
    gpus: str,
    reader: GpuProcReader,
    own_marker: str,
    state: Callable[[str], str | None],
    report: PreflightReport,
) -> list[Holder]:
    if gpus == "none":
        return []
    found = reader()
    if found is None:
        report.notes.append("no GPU process list (nvidia-smi absent or found no GPU): GPUs not checked")
        return []
    wanted = None if gpus == "all" else {g.strip() for g in gpus.split(",") if g.strip()}
    out = []
    for g in found:
        if wanted is None or g.gpu in wanted or (g.uuid is not None and g.uuid in wanted):
            mem = f" ({g.used_mib} MiB)" if g.used_mib is not None else ""
            out.append(_holder(g.pid, f"GPU {g.gpu}{mem}", own_marker, state))
    return out


def _port_holders(
    host: str, port: int, own_marker: str, state: Callable[[str], str | None], report: PreflightReport
) -> list[Holder]:
    if port_is_free(host, port):
        return []
    found = listeners(port, host)
    if not found:
        return [Holder(None, f"port {port}", "", None, "unreadable")]
    seen: dict[int | None, Holder] = {}
    for x in found:
        seen.setdefault(x.pid, _holder(x.pid, f"port {port}", own_marker, state))
    return list(seen.values())


def _reset_caches(dirs: Iterable[str], report: PreflightReport) -> None:
    user = getpass.getuser()
    for d in dirs:
        path = Path(os.path.expanduser(d.replace("{user}", user)))
        if not path.is_dir():
            continue
        for child in path.iterdir():
            try:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            except OSError as exc:
                report.refusals.append(f"cannot reset the compile cache {path}: {exc}")
                break
        else:
            report.caches_reset.append(str(path))


def preflight(
    host: str,
    port: int,
    *,
    gpus: str = "all",
    marker: str = "",
    kill_stale: bool = False,
    engine: str | None = None,
    reset_compile_cache: bool = False,
    compile_caches: Iterable[str] = (),
    gpu_reader: GpuProcReader = nvidia_smi_compute_apps,
    shm_patterns: Iterable[str] = shm.PATTERNS,
    unit_state_of: Callable[[str], str | None] = unit_state,
    grace_s: float = 10.0,
) -> PreflightReport:
    """Check (and with `kill_stale`, clear) the port, the GPUs and /dev/shm; reset compile caches if asked.

    `gpus`: "all", "none" or GPU indices "0,1". `marker`: this unit's SERVELAB_RUN. Never raises for a busy
    host: the report's `refusals` say why the unit must not start."""
    report = PreflightReport(port=port, host=host, gpus=gpus)
    holders = _port_holders(host, port, marker, unit_state_of, report)
    holders += _gpu_holders(gpus, gpu_reader, marker, unit_state_of, report)
    report.holders = holders
    if kill_stale:
        stale: dict[int, Holder] = {h.pid: h for h in holders if h.pid is not None and h.verdict == "stale"}
        infos: list[ProcInfo] = [i for i in (processes.info(p) for p in stale) if i is not None]
        # a stale server's workers go with it: its session's members
        for i in list(infos):
            if i.sid is not None and i.sid == i.pid:
                infos += [m for m in processes.in_session(i.sid) if m.pid not in stale]
        for k in processes.kill_processes(infos, grace_s):
            h = stale.get(k.pid) or Holder(k.pid, "worker of a stale server", k.cmdline, k.marker, "stale")
            h.killed = k.signal
            report.killed.append(h)
            if not k.stopped:
                report.refusals.append(f"pid {k.pid} survived SIGKILL ({k.cmdline[:120]})")
        # what is still in the way after the kills
        holders = _port_holders(host, port, marker, unit_state_of, report)
        holders += _gpu_holders(gpus, gpu_reader, marker, unit_state_of, report)
    for h in holders:
        if h.verdict == "gone" or (
            h.pid is not None and any(k.pid == h.pid and k.killed for k in report.killed)
        ):
            continue
        hint = " (servelab preflight --kill-stale ends it)" if h.verdict == "stale" and not kill_stale else ""
        report.refusals.append(h.describe() + hint)
    # /dev/shm: remove what no process holds (after the kills, so their segments go too).
    cleanup = shm.remove_orphaned(patterns=tuple(shm_patterns), min_age_s=0.0 if kill_stale else 5.0)
    report.shm_removed = list(cleanup.removed)
    report.shm_held = [
        f"{s.name} (held by pid {', '.join(map(str, s.owners))})" for s in cleanup.kept if s.owners
    ]
    report.refusals += [f"cannot remove /dev/shm segment {e}" for e in cleanup.errors]
    if reset_compile_cache:
        dirs = list(compile_caches) or list(defaults().compile_cache.get(engine or "", []))
        with contextlib.suppress(KeyError):
            _reset_caches(dirs, report)
    return report


class PreflightRequest(Request):
    """What `servelab preflight` checks: one request for this machine and, as the agent operation
    `preflight`, for a remote one (the CLI builds it once; `run_preflight` answers it on either)."""

    address: str
    port: int
    gpus: str = "all"
    marker: str = ""
    kill_stale: bool = False
    engine: str | None = None
    reset_compile_cache: bool = False
    compile_caches: list[str] = Field(default_factory=list)


class PreflightAnswer(Answer):
    """`PreflightReport.to_dict`, typed: what the command prints and emits as JSON."""

    ok: bool
    host: str
    port: int
    gpus: str
    holders: list[Holder]
    killed: list[Holder]
    shm_removed: list[str]
    shm_held: list[str]
    caches_reset: list[str]
    refusals: list[str]
    notes: list[str]


def run_preflight(req: PreflightRequest) -> PreflightAnswer:
    """The one implementation behind `servelab preflight`, on this machine or (agent op) on a remote one."""
    report = preflight(
        req.address,
        req.port,
        gpus=req.gpus,
        marker=req.marker,
        kill_stale=req.kill_stale,
        engine=req.engine,
        reset_compile_cache=req.reset_compile_cache,
        compile_caches=req.compile_caches,
    )
    return PreflightAnswer.model_validate(report.to_dict())
