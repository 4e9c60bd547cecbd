"""A server process tree on this machine: launch it in its own session, find every process of its run, stop
them all, and prove nothing is left (no process, port, /dev/shm segment or GPU memory).

The server leads its own session with `SERVELAB_RUN=<marker>` in its environment, so teardown reaches workers
that left the group or outlived their parent, and `kill_marked` finds those of a servelab that was itself
killed. The agent of a remote host runs this very module over there (`remote.RemoteServer` is the near end).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from servelab import crashpoint
from servelab.engines.base import Diagnosis, LaunchSpec
from servelab.errors import ConfigError, LaunchFailed
from servelab.host import processes
from servelab.host.gpu_memory import GpuReader, nvidia_smi_reader, wait_for_baseline
from servelab.host.ports import Listener, listeners, port_is_free
from servelab.host.processes import MARKER_ENV, KilledProcess, ProcInfo
from servelab.host.shm import ShmLedger
from servelab.jsontypes import JsonObject
from servelab.lifecycle.handle import (
    LOG_DIAGNOSE_BYTES,
    TeardownReport,
    check_marker,
    connects,
    describe,
    dial_host,
    log_tail,
)


@dataclass
class Server:
    """A launched server: its process (the leader of its own process group) and what teardown needs."""

    spec: LaunchSpec
    proc: subprocess.Popen[bytes]
    log_path: Path
    run_marker: str
    started_at: float  # wall clock, for the store
    started_mono: float  # monotonic, for durations
    shm_before: frozenset[tuple[str, int]] = frozenset()
    shm: ShmLedger = field(default_factory=ShmLedger)  # the segments this run's processes created
    gpu_baseline_mib: list[int] | None = None
    gpu_reader: GpuReader = nvidia_smi_reader
    teardown_report: TeardownReport | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the leader's pid is its group's id

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def remote_url(self) -> str | None:
        return None  # it runs here

    @property
    def forwarded(self) -> bool:
        return False

    def exit_code(self) -> int | None:
        """The leader's exit code (negative: killed by that signal), None while it runs."""
        return self.proc.poll()

    def log_text(self, max_bytes: int = LOG_DIAGNOSE_BYTES) -> str:
        """The end of the server's log."""
        return log_tail(self.log_path, max_bytes)

    def to_dict(self) -> JsonObject:
        return describe(self, self.exit_code(), {})

    def record_shm(self) -> None:
        record_shm(self)

    def port_owners(self) -> tuple[list[Listener], list[Listener]]:
        return check_port_owner(self)

    async def port_open(self, timeout_s: float) -> bool:
        return await connects(dial_host(self.spec), self.spec.port, timeout_s)

    def teardown(
        self, grace_s: float = 15.0, *, orphan_grace_s: float = 5.0, gpu_timeout_s: float = 60.0
    ) -> TeardownReport:
        """Stop the whole process tree and prove that nothing of it survives.

        1. SIGTERM the process group, wait `grace_s`, SIGKILL it.
        2. Find what escaped (descendants seen before the signal, processes carrying the run marker),
           SIGTERM/SIGKILL them and report them as orphans; anything still alive is a survivor.
        3. Remove the /dev/shm segments this run's processes created (`shm`: new since launch and seen held
           by them while they lived) once nothing holds them; never another job's.
        4. Wait until GPU memory is back at its launch baseline ("no GPUs" where there are none).
        Idempotent: calling it again on a stopped server only re-checks."""
        t0 = time.monotonic()
        tree = processes.process_tree(self.pid)  # before the signal: once the parent dies, the tree is gone
        record_shm(self, run_processes(self, tree))
        stopped_by = stop_process_group(self.proc, grace_s)
        crashpoint.reached("teardown")
        stop_s = time.monotonic() - t0
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)  # reap the leader: a zombie would keep its pid (and pgid) taken

        escaped = run_processes(self, tree)
        orphans = [k for k in processes.kill_processes(escaped, orphan_grace_s) if k.signal != "gone"]
        survivors = run_processes(self, tree)

        cleanup = self.shm.cleanup()

        gpu = wait_for_baseline(self.gpu_baseline_mib, self.gpu_reader, timeout_s=gpu_timeout_s)
        report = TeardownReport(
            pid=self.pid,
            run_marker=self.run_marker,
            exit_code=self.exit_code(),
            stopped_by=stopped_by,
            stop_s=stop_s,
            orphans=orphans,
            survivors=survivors,
            shm=cleanup,
            gpu=gpu,
            port_free=port_is_free(self.spec.host, self.spec.port),
            duration_s=time.monotonic() - t0,
        )
        self.teardown_report = report
        return report


def launch(
    spec: LaunchSpec,
    log_path: Path,
    run_marker: str,
    *,
    cpus: set[int] | None = None,
    gpu_reader: GpuReader = nvidia_smi_reader,
    check_port: bool = True,
) -> Server:
    """Start `spec.argv` in its own session, stdout+stderr to `log_path`, marked with `run_marker`.

    Refuses a busy port (LaunchFailed naming who holds it); `check_port=False` skips that check (tests
    use it to reproduce a server that grabs the port between the check and the bind, which
    `wait_ready`'s port guard must then catch). `cpus` pins the server (its workers inherit the
    affinity). Records the /dev/shm segments and the GPU memory in use before the start, so teardown
    can tell what this run left behind."""
    check_marker(run_marker)
    if not spec.argv:
        raise ConfigError("empty command line", hint="the engine adapter produced no argv")
    if spec.port <= 0:
        raise LaunchFailed(
            f"no port chosen for {spec.argv[0]} (port={spec.port})",
            hint="pick one with servelab.host.ports.free_port() before building the command",
        )
    if check_port and not port_is_free(spec.host, spec.port):
        held = [x.describe() for x in listeners(spec.port, spec.host)]
        who = "; ".join(held) if held else "a socket we cannot attribute"
        exc = LaunchFailed(
            f"port {spec.host}:{spec.port} is already in use by {who}",
            hint="stop that server, or leave the port at 0 so that servelab picks a free one",
        )
        exc.diagnosis = Diagnosis(klass="port_in_use", evidence=who, advice=exc.hint, fatal=True)
        raise exc
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    shm_ledger = ShmLedger.start()
    baseline = gpu_reader()
    # SPT_NOENV: setproctitle (vLLM, SGLang workers) would otherwise wipe the marker from /proc/PID/environ.
    env = {**os.environ, "SPT_NOENV": "1", **spec.env, MARKER_ENV: run_marker}
    try:
        # O_APPEND: lines servelab adds later (the timeout marker) are never overwritten by the server.
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    except OSError as exc:
        raise LaunchFailed(
            f"cannot write the server log {log_path}: {exc.strerror or exc}",
            hint="check that the run directory is writable (or point $SERVELAB_HOME elsewhere)",
        ) from exc
    started_at, started_mono = time.time(), time.monotonic()
    try:
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(
                spec.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=spec.cwd,
                start_new_session=True,  # own group: teardown signals the whole tree at once
            )
    except OSError as exc:
        raise LaunchFailed(
            f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}",
            hint="check that the engine is installed and the executable path is right",
        ) from exc
    if cpus:
        with contextlib.suppress(OSError):  # it may already have died; wait_ready reports that
            os.sched_setaffinity(proc.pid, cpus)
    return Server(
        spec,
        proc,
        log_path,
        run_marker,
        started_at,
        started_mono,
        shm_before=shm_ledger.before,
        shm=shm_ledger,
        gpu_baseline_mib=baseline,
        gpu_reader=gpu_reader,
    )


def _dedupe(procs: list[ProcInfo]) -> list[ProcInfo]:
    seen: dict[int, ProcInfo] = {}
    for p in procs:
        seen.setdefault(p.pid, p)
    return list(seen.values())


def run_processes(server: Server, seen: list[ProcInfo] | None = None) -> list[ProcInfo]:
    """Every live process of this run: `seen` (an earlier tree snapshot) and the current tree, the
    server's session (started after it), and the processes carrying its marker."""
    tree = processes.process_tree(server.pid)
    session = [p for p in processes.in_session(server.pid) if p.create_time >= server.started_at - 1.0]
    found = [p for p in (seen or []) if p.alive()] + tree + session + processes.with_marker(server.run_marker)
    return _dedupe(found)


def record_shm(server: Server, procs: list[ProcInfo] | None = None) -> None:
    """Add the /dev/shm segments this run's live processes hold to `server.shm`, the only ones its teardown
    may remove. Called on every readiness poll and right before teardown signals the tree; a caller that
    watches a server for long (a benchmark) may call it too."""
    pids = [p.pid for p in (procs if procs is not None else run_processes(server)) if p.alive()]
    server.shm.record(pids)


def check_port_owner(server: Server) -> tuple[list[Listener], list[Listener]]:
    """(ours, foreign): the sockets listening on the server's port, split by whether a process of this
    run (`run_processes`) holds them. A socket nobody of ours holds is foreign."""
    ours_pids = {p.pid for p in run_processes(server)}
    found = listeners(server.spec.port, server.spec.host)
    our_inodes = {x.inode for x in found if x.pid in ours_pids}
    ours = [x for x in found if x.inode in our_inodes]
    foreign = [x for x in found if x.inode not in our_inodes]
    return ours, foreign


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float) -> str:
    """SIGTERM the group `proc` leads, wait for the leader and every member, SIGKILL what is left.

    Returns what stopped it: "already exited" (leader and group gone before we signalled), "SIGTERM"
    or "SIGKILL" (also when only workers of a dead leader were left in the group)."""
    pgid = proc.pid  # start_new_session=True: the leader's pid is its group's id
    if proc.poll() is not None and not _group_alive(pgid):
        return "already exited"
    _killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(pgid):
            return "SIGTERM"
        time.sleep(0.05)
    _killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    end = time.monotonic() + 10  # grandchildren reparented to init: wait until the group is gone
    while _group_alive(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    return "SIGKILL"


def kill_marked(marker_prefix: str, grace_s: float) -> list[KilledProcess]:
    """Kill every live process here whose SERVELAB_RUN starts with `marker_prefix`, and the other members
    of their sessions; returns what was killed (`serving.sweep_orphans` checks the prefix first)."""
    marked = processes.with_marker(prefix=marker_prefix)
    # Their sessions too: a worker whose marker is hidden still shares its server's session.
    sessions = {p.sid for p in marked if p.sid is not None}
    found = _dedupe(marked + [m for sid in sorted(sessions) for m in processes.in_session(sid)])
    return [k for k in processes.kill_processes(found, grace_s) if k.signal != "gone"]
