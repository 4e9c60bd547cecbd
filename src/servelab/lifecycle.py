"""Launch a server process tree, wait until it is really ready, and tear it down leaving nothing behind.

    server = launch(spec, log_path, run_marker="study-7/cand-3/try-1")
    try:
        ready = await wait_ready(server, engine.readiness, engine.startup_timeout_s, engine.name)
        ...
    finally:
        report = teardown(server)          # report.clean: no process, port, segment or GPU memory left

Why each step is more than `Popen` + `/health`:
- The server runs in its own session (process group) with `SERVELAB_RUN=<marker>` in its environment,
  so teardown reaches workers that left the group or outlived their parent, and `sweep_orphans` finds
  those of a servelab that was itself killed.
- Readiness is the engine's declared rule (`engines.base.Readiness`): health statuses that mean
  "loading", ports that open only when ready, a real warm-up completion, the expected model listed.
  A process that exits, or logs a fatal signature while it keeps running, stops the wait at once with
  the diagnosis instead of letting it run into the timeout.
- vLLM and llama.cpp set SO_REUSEPORT: a second server started on a busy port binds it anyway and the
  kernel splits connections between the two, so benchmarks silently measure a mix. After ready, the
  port must be held by our process tree alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson

from servelab import crashpoint
from servelab.engines.base import Diagnosis, LaunchSpec, Readiness
from servelab.errors import ConfigError, EngineError, HostLost, LaunchFailed, NotReady
from servelab.host import processes
from servelab.host.gpu_memory import GpuMemoryReport, GpuReader, nvidia_smi_reader, wait_for_baseline
from servelab.host.ports import WILDCARDS, Listener, listeners, port_is_free
from servelab.host.processes import MARKER_ENV, KilledProcess, ProcInfo
from servelab.host.shm import ShmCleanup, ShmLedger
from servelab.host.wire import unb64
from servelab.redact import redact_argv

if TYPE_CHECKING:  # annotations only (the agent, above, runs this module over there)
    from servelab.host.transport import AgentHost, Host

LOG_SCAN_OVERLAP = 8192  # bytes of already-scanned log kept for signatures that span a read boundary
LOG_DIAGNOSE_BYTES = 512 * 1024  # how much of the log's end a diagnosis reads
WARMUP_PROMPT = "hello"


# -- launch ------------------------------------------------------------------------------------------


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

    def exit_code(self) -> int | None:
        """The leader's exit code (negative: killed by that signal), None while it runs."""
        return self.proc.poll()

    def log_text(self, max_bytes: int = LOG_DIAGNOSE_BYTES) -> str:
        """The end of the server's log."""
        return _log_tail(self.log_path, max_bytes)

    def to_dict(self) -> dict[str, Any]:
        return _describe(self, {})


def _log_tail(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _describe(server: Server | RemoteServer, extra: dict[str, Any]) -> dict[str, Any]:
    """A launched server as the store and `--json` show it (env: names only, values may be secrets)."""
    return {
        "pid": server.pid,
        "pgid": server.pgid,
        "url": server.url,
        "host": server.spec.host,
        "port": server.spec.port,
        **extra,
        "served_model": server.spec.served_model,
        "command": shlex.join(redact_argv(server.spec.argv)),
        "env": sorted(server.spec.env),
        "log_path": str(server.log_path),
        "run_marker": server.run_marker,
        "started_at": server.started_at,
        "exit_code": server.rc if isinstance(server, RemoteServer) else server.exit_code(),
        "gpu_baseline_mib": server.gpu_baseline_mib,
    }


def check_marker(marker: str) -> None:
    """A marker travels in the environment (`SERVELAB_RUN=...`): no NUL, newline or `=`."""
    if not marker or "\0" in marker or "=" in marker or "\n" in marker:
        raise ConfigError(
            f"invalid run marker {marker!r}",
            hint="use a non-empty id without '=', NUL or newlines, e.g. 'study-7/cand-3/try-1'",
        )


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


# -- wait until ready --------------------------------------------------------------------------------


@dataclass
class RemoteServer:
    """A server the agent of a remote host launched and watches there (servelab.agent): its log is
    mirrored into `log_path` here on every poll, and `url` is a local port forwarded to where it listens
    (it may bind the remote's loopback only). What readiness, benchmarks and diagnosis need of a `Server`."""

    spec: LaunchSpec  # as launched over there: host and port are the remote's
    host: AgentHost
    log_path: Path  # the local mirror
    remote_log: str
    run_marker: str
    remote_pid: int
    started_at: float
    started_mono: float
    local_port: int
    gpu_baseline_mib: list[int] | None = None
    teardown_report: TeardownReport | None = None
    offset: int = 0  # bytes of the remote log mirrored so far
    rc: int | None = None
    local_host: str = "127.0.0.1"  # where `local_port` is reached from here

    @property
    def pid(self) -> int:
        return self.remote_pid

    @property
    def pgid(self) -> int:
        return self.remote_pid

    @property
    def url(self) -> str:
        return f"{self.spec.scheme}://{self.local_host}:{self.local_port}"

    def _mirror(self, data: str, offset: int) -> None:
        raw = unb64(data)
        if raw:
            with open(self.log_path, "ab") as f:
                f.write(raw)
        self.offset = offset

    def exit_code(self) -> int | None:
        """The leader's exit code over there (None while it runs); mirrors the log. Raises HostLost."""
        if self.rc is not None:
            return self.rc
        got = self.host.call("poll", marker=self.run_marker, offset=self.offset)
        self._mirror(got["log"], got["offset"])
        self.rc = got["rc"]
        return self.rc

    def log_text(self, max_bytes: int = LOG_DIAGNOSE_BYTES) -> str:
        """The end of the server's log (as mirrored by the last poll)."""
        return _log_tail(self.log_path, max_bytes)

    def to_dict(self) -> dict[str, Any]:
        return _describe(self, {"remote": self.host.name, "remote_log": self.remote_log})


AnyServer = Server | RemoteServer


def launch_on(
    host: Host,
    spec: LaunchSpec,
    log_path: Path,
    run_marker: str,
    *,
    cpus: set[int] | None = None,
    check_port: bool = True,
) -> AnyServer:
    """`launch` on `host`: here directly, on an SSH host through its agent (the spec, environment and keys
    included, travels on the agent's stdin, never on a command line). `sys.executable` in the argv (the
    simulator's default interpreter) becomes the remote host's python."""
    if host.is_local:
        return launch(spec, log_path, run_marker, cpus=cpus, check_port=check_port)
    host = cast("AgentHost", host)
    check_marker(run_marker)
    import dataclasses
    import sys

    if spec.argv and spec.argv[0] == sys.executable:
        spec = dataclasses.replace(spec, argv=[host.python, *spec.argv[1:]])
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    started_mono = time.monotonic()
    got = host.call(
        "launch",
        spec=dataclasses.asdict(spec),
        log_name=log_path.name,
        marker=run_marker,
        cpus=sorted(cpus) if cpus else None,
        check_port=check_port,
    )
    server = RemoteServer(
        spec,
        host,
        log_path,
        got["log_path"],
        run_marker,
        int(got["pid"]),
        float(got["started_at"]),
        started_mono,
        0,
        got.get("gpu_baseline_mib"),
    )
    try:
        server.local_host, server.local_port = host.open_forward(spec.host, spec.port)
    except BaseException:
        _remote_teardown(server, 10.0)
        raise
    return server


def _remote_teardown(server: RemoteServer, grace_s: float) -> TeardownReport:
    """The agent's teardown over there, its report brought back; a host that is gone gives a report that
    says so (not clean) instead of an error: its agent ends the server when the link drops."""
    from pydantic import TypeAdapter

    server.host.close_forward(server.spec.host, server.spec.port)
    try:
        got = server.host.call(
            "teardown",
            marker=server.run_marker,
            grace_s=grace_s,
            offset=server.offset,
            _timeout=grace_s + 180,
        )
    except HostLost as exc:
        report = TeardownReport(
            pid=server.pid,
            run_marker=server.run_marker,
            exit_code=server.rc,
            stopped_by="host lost",
            stop_s=0.0,
            shm=ShmCleanup(errors=[f"{exc.message}: not checked; `tune --resume` ends what is left there"]),
            port_free=False,
        )
    else:
        server._mirror(got["log"], got["offset"])
        report = TypeAdapter(TeardownReport).validate_python(got["report"])
        server.rc = report.exit_code
    server.teardown_report = report
    return report


@dataclass
class ReadyReport:
    """How the server became ready. Times are seconds since launch."""

    url: str
    served_model: str
    ready_s: float
    waited_s: float  # spent inside wait_ready
    polls: int
    phases: dict[str, float] = field(default_factory=dict)  # "port", "health", "warmup", "models"
    models: list[str] = field(default_factory=list)
    listeners: list[Listener] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "served_model": self.served_model,
            "ready_s": round(self.ready_s, 3),
            "waited_s": round(self.waited_s, 3),
            "polls": self.polls,
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "models": list(self.models),
            "listeners": [x.to_dict() for x in self.listeners],
            "notes": list(self.notes),
        }


def _tail_lines(text: str, n: int = 20) -> tuple[str, ...]:
    return tuple(ln for ln in text.splitlines() if ln.strip())[-n:]


def _diagnose(text: str, engine: str | None) -> Diagnosis:
    """The knowledge base's diagnosis of a log; before that module exists, the log's tail."""
    try:
        from servelab.engines.signatures import diagnose
    except ImportError:
        return Diagnosis(klass="unknown", evidence="", advice="Read the log", tail=_tail_lines(text))
    return diagnose(text, engine=engine)


def _fatal_in(text: str, engine: str | None) -> Diagnosis | None:
    try:
        from servelab.engines.signatures import fatal_in
    except ImportError:
        return None
    return fatal_in(text, engine=engine)


class _LogWatcher:
    """Reads the log as it grows and scans only the new part (plus an overlap) for fatal signatures."""

    def __init__(self, path: Path, engine: str | None) -> None:
        self.path, self.engine = path, engine
        self.offset = 0
        self.carry = ""

    def fatal(self) -> Diagnosis | None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                new = f.read()
        except OSError:
            return None
        if not new:
            return None
        # Scan complete lines only: a signature must not be judged on a half-written line.
        cut = new.rfind(b"\n") + 1
        if cut == 0:
            return None
        self.offset += cut
        text = self.carry + new[:cut].decode("utf-8", "replace")
        self.carry = text[-LOG_SCAN_OVERLAP:]
        return _fatal_in(text, self.engine)


def _failed(server: AnyServer | Endpoint, what: str, diag: Diagnosis) -> LaunchFailed:
    evidence = f": {diag.evidence}" if diag.evidence else ""
    tail = ""
    if diag.klass == "unknown" and diag.tail:
        tail = "\nlast log lines:\n  " + "\n  ".join(diag.tail[-10:])
    exc = LaunchFailed(
        f"{what} ({diag.klass}{evidence}){tail}",
        hint=f"{diag.advice.rstrip('.')}. Full log: {server.log_path}",
    )
    exc.diagnosis = diag
    return exc


def _exited(server: AnyServer, engine: str | None, rc: int) -> LaunchFailed:
    diag = _diagnose(server.log_text(), engine)
    how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
    return _failed(server, f"{engine or 'the server'} {how} before it was ready", diag)


class _Probe:
    """The readiness rule as a small state machine; each `step` is one round of checks."""

    def __init__(
        self,
        server: AnyServer | Endpoint,
        readiness: Readiness,
        api_key: str | None,
        request_timeout_s: float,
        engine: str | None,
    ) -> None:
        from servelab.bench.client import Client

        self.server, self.r, self.engine = server, readiness, engine
        self.client = Client(
            server.url, api_key=api_key, timeout_s=request_timeout_s, connect_timeout_s=request_timeout_s
        )
        self.request_timeout_s = request_timeout_s
        self.phases: dict[str, float] = {}
        self.models: list[str] = []
        self.last = "not polled yet"
        self.polls = 0

    def _passed(self, phase: str) -> None:
        self.phases.setdefault(phase, time.monotonic() - self.server.started_mono)

    async def _port_open(self) -> bool:
        spec = self.server.spec
        host = "127.0.0.1" if spec.host in WILDCARDS else spec.host
        if isinstance(self.server, RemoteServer):
            # The forwarded local port always accepts (ssh listens): ask over there.
            remote = self.server.host
            if not await asyncio.to_thread(remote.call, "port_open", host=host, port=spec.port):
                self.last = "port not open yet"
                return False
            return True
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, spec.port), self.request_timeout_s
            )
        except (OSError, TimeoutError):
            self.last = "port not open yet"
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def _health(self) -> bool:
        path = self.r.health_path
        assert path is not None
        res = await self.client.get(path, timeout_s=self.request_timeout_s)
        if res.error_kind == "connect_error":
            self.last = "port not open yet" if self.r.port_opens_when_ready else "connection refused"
            return False
        self._passed("port")
        if res.error_kind == "timeout" or (res.status == 0 and res.error_kind):
            self.last = f"{path} accepted the connection but did not answer ({res.error_kind})"
            return False
        if res.status in self.r.ready_status:
            return True
        if res.status in self.r.loading_status:
            self.last = f"loading ({path} answers HTTP {res.status})"
        else:
            self.last = f"{path} answers HTTP {res.status}"
        return False

    async def _warmup(self, remaining: float) -> bool:
        model = self.server.spec.served_model
        if self.r.warmup_api == "chat":
            path = "/v1/chat/completions"
            body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": WARMUP_PROMPT}]}
        else:
            path, body = "/v1/completions", {"model": model, "prompt": WARMUP_PROMPT}
        body.update(max_tokens=1, stream=False)
        timeout = max(1.0, min(remaining, max(60.0, self.request_timeout_s)))
        res = await self.client.send(self.client.build_request(path, body), mode="json", timeout_s=timeout)
        if res.ok:
            return True
        self._auth_check(res.status, path)
        self.last = f"warm-up {path} failed ({res.error_kind}: {(res.error_message or '')[:200]})"
        return False

    def _auth_check(self, status: int, path: str) -> None:
        if status in (401, 403):
            diag = Diagnosis(
                klass="auth_required",
                evidence=f"{path} answered HTTP {status}",
                advice="The server requires an API key: pass the one it was started with (--api-key)",
                fatal=True,
            )
            raise _failed(self.server, "the server rejects our requests", diag)

    async def _models(self) -> bool:
        res = await self.client.get("/v1/models", timeout_s=self.request_timeout_s)
        self._auth_check(res.status, "/v1/models")
        if res.status != 200:
            self.last = f"/v1/models answers {res.status or res.error_kind}"
            return False
        try:
            data = orjson.loads(res.body).get("data") or []
            self.models = [str(m.get("id")) for m in data if isinstance(m, dict)]
        except (orjson.JSONDecodeError, AttributeError):
            self.last = f"/v1/models answered undecodable JSON: {res.body[:120]!r}"
            return False
        want = self.server.spec.served_model
        if want in self.models:
            return True
        if not self.models:
            self.last = "/v1/models lists no model yet"
            return False
        diag = Diagnosis(
            klass="wrong_model",
            evidence=f"/v1/models lists {', '.join(self.models)}, not {want!r}",
            advice="Another server may answer on this port, or the served model name differs: check "
            "--served-model-name and the port",
            fatal=True,
        )
        raise _failed(self.server, "the server serves another model", diag)

    async def step(self, remaining: float) -> bool:
        """One round; True once every phase of the rule has passed."""
        self.polls += 1
        if "health" not in self.phases:
            if isinstance(self.server, RemoteServer) and "port" not in self.phases:
                if not await self._port_open():  # before HTTP: through a forward, "refused" reads otherwise
                    return False
                self._passed("port")
            if self.r.health_path is None:
                if not await self._port_open():
                    return False
                self._passed("port")
            elif not await self._health():
                return False
            self._passed("health")
        if self.r.warmup_request and "warmup" not in self.phases:
            if not await self._warmup(remaining):
                return False
            self._passed("warmup")
        if self.r.check_models and "models" not in self.phases:
            if not await self._models():
                return False
            self._passed("models")
        return True


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


def record_shm_of(server: AnyServer) -> None:
    """`record_shm`, on whichever host the server runs."""
    if isinstance(server, RemoteServer):
        server.host.call("record_shm", marker=server.run_marker)
    else:
        record_shm(server)


def check_port_owner(server: Server) -> tuple[list[Listener], list[Listener]]:
    """(ours, foreign): the sockets listening on the server's port, split by whether a process of this
    run (`run_processes`) holds them. A socket nobody of ours holds is foreign."""
    ours_pids = {p.pid for p in run_processes(server)}
    found = listeners(server.spec.port, server.spec.host)
    our_inodes = {x.inode for x in found if x.pid in ours_pids}
    ours = [x for x in found if x.inode in our_inodes]
    foreign = [x for x in found if x.inode not in our_inodes]
    return ours, foreign


def _port_owners(server: AnyServer) -> tuple[list[Listener], list[Listener]]:
    if not isinstance(server, RemoteServer):
        return check_port_owner(server)
    from pydantic import TypeAdapter

    got = server.host.call("port_owners", marker=server.run_marker)
    read = TypeAdapter(list[Listener]).validate_python
    return read(got["ours"]), read(got["foreign"])


def _guard_port(server: AnyServer) -> tuple[list[Listener], list[str]]:
    """The SO_REUSEPORT guard: the port must be ours alone."""
    ours, foreign = _port_owners(server)
    port = f"{server.spec.host}:{server.spec.port}"
    if foreign:
        who = "; ".join(x.describe() for x in foreign)
        if ours:
            diag = Diagnosis(
                klass="port_shared",
                evidence=f"also listening on {port}: {who}",
                advice="Stop that process or use another port: with SO_REUSEPORT (vLLM, llama.cpp) a second "
                "server binds a busy port without error and the kernel splits connections between the two, "
                "so every measurement would mix both servers",
                fatal=True,
            )
            raise _failed(server, f"port {port} is shared with a process outside this run", diag)
        diag = Diagnosis(
            klass="port_in_use",
            evidence=f"{port} is served by {who}, not by our server (pid {server.pid})",
            advice="Stop that server or use another port",
            fatal=True,
        )
        raise _failed(server, f"another process answers on {port}", diag)
    notes = [] if ours else [f"no listening socket on {port} could be attributed (not checked for sharing)"]
    return ours, notes


async def wait_ready(
    server: AnyServer,
    readiness: Readiness,
    timeout_s: float,
    engine: str | None = None,
    api_key: str | None = None,
    *,
    poll_s: float = 0.5,
    request_timeout_s: float = 5.0,
) -> ReadyReport:
    """Carry out `readiness` until the server is ready; raise as soon as it cannot become ready.

    Raises LaunchFailed (with `.diagnosis`) when the process exits, logs a fatal signature, serves
    another model, rejects our key, or shares its port with a foreign process; NotReady (diagnosis
    class `startup_timeout`) after `timeout_s`. Never tears down: the caller's `finally` does."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    watcher = _LogWatcher(server.log_path, engine)
    probe = _Probe(server, readiness, api_key, request_timeout_s, engine)
    try:
        while True:
            rc = server.exit_code()
            if rc is not None:
                raise _exited(server, engine, rc)
            diag = watcher.fatal()
            if diag is not None:
                raise _failed(server, f"{engine or 'the server'} logged a fatal error while starting", diag)
            record_shm_of(server)  # while its processes live: what they hold is theirs to clean up later
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if await probe.step(remaining):
                record_shm_of(server)
                rc = server.exit_code()  # a server that answered and died at once is not ready
                if rc is not None:
                    raise _exited(server, engine, rc)
                ours, notes = _guard_port(server)
                now = time.monotonic()
                return ReadyReport(
                    url=server.url,
                    served_model=server.spec.served_model,
                    ready_s=now - server.started_mono,
                    waited_s=now - t0,
                    polls=probe.polls,
                    phases=probe.phases,
                    models=probe.models,
                    listeners=ours,
                    notes=notes,
                )
            await asyncio.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
    finally:
        probe.client.close()
    raise _timed_out(server, engine, timeout_s, probe.last)


@dataclass
class Endpoint:
    """A server known only by its URL (a systemd unit's, a container's): what `_Probe` needs of a Server.

    `log_path` is only quoted in hints ("Full log: ..."), so it may name a command (`journalctl -u X`)."""

    spec: LaunchSpec
    started_mono: float
    log_path: str = "the server's log"
    pid: int | None = None  # when known (systemd's $MAINPID): its exit stops the wait at once

    @property
    def url(self) -> str:
        return self.spec.url


async def wait_url_ready(
    endpoint: Endpoint,
    readiness: Readiness,
    timeout_s: float,
    engine: str | None = None,
    api_key: str | None = None,
    *,
    completion: bool = True,
    poll_s: float = 0.5,
    request_timeout_s: float = 5.0,
) -> ReadyReport:
    """`wait_ready` for a server servelab did not launch: the same `_Probe` rule against a URL, then (with
    `completion`) one real completion. No log to scan and no port-ownership guard (the process tree is
    not ours); an `endpoint.pid` that exits ends the wait with LaunchFailed. NotReady after `timeout_s`."""
    import dataclasses

    t0 = time.monotonic()
    deadline = t0 + timeout_s
    probe = _Probe(endpoint, readiness, api_key, request_timeout_s, engine)
    final = dataclasses.replace(readiness, warmup_request=True) if completion else readiness
    try:
        while True:
            if endpoint.pid is not None and not _pid_alive(endpoint.pid):
                diag = Diagnosis(
                    klass="process_exited",
                    evidence=f"pid {endpoint.pid} is gone",
                    advice="The server exited while starting; read its log",
                    fatal=True,
                )
                raise _failed(endpoint, f"{engine or 'the server'} exited before it was ready", diag)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if await probe.step(remaining):
                if probe.r is final:
                    now = time.monotonic()
                    return ReadyReport(
                        url=endpoint.url,
                        served_model=endpoint.spec.served_model,
                        ready_s=now - endpoint.started_mono,
                        waited_s=now - t0,
                        polls=probe.polls,
                        phases=probe.phases,
                        models=probe.models,
                    )
                probe.r = final  # the engine's rule passed: now the real completion
                continue
            await asyncio.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
    finally:
        probe.client.close()
    exc = NotReady(
        f"{engine or 'the server'} at {endpoint.url} was not ready after {timeout_s:g} s ({probe.last})",
        hint=f"raise --timeout, or read {endpoint.log_path} for where it stopped",
    )
    exc.diagnosis = Diagnosis(
        klass="startup_timeout",
        evidence=probe.last,
        advice="Give it more time or read the log for where it stopped",
        fatal=True,
    )
    raise exc


def _pid_alive(pid: int) -> bool:
    info = processes.info(pid)
    return info is not None and info.alive()


def _timeout_line(timeout_s: float, last: str) -> str:
    try:
        from servelab.engines.signatures import timeout_marker
    except ImportError:
        return f"[servelab] start-up timed out after {timeout_s:.0f} s ({last})"
    return timeout_marker(timeout_s, last)


def _timed_out(server: AnyServer, engine: str | None, timeout_s: float, last: str) -> NotReady:
    """NotReady, after appending the timeout marker to the log so that a later `diagnose` of the log
    (servelab logs, the store) tells a timeout from a crash."""
    before = server.log_text()
    line = _timeout_line(timeout_s, last)
    with contextlib.suppress(OSError), open(server.log_path, "a", encoding="utf-8") as f:
        f.write(("" if not before or before.endswith("\n") else "\n") + line + "\n")
    seen = _diagnose(server.log_text(), engine)
    advice = (
        seen.advice
        if seen.klass == "startup_timeout"
        else "Give it more time (large models load and compile for many minutes) or read the log for "
        "where it stopped"
    )
    diag = Diagnosis(
        klass="startup_timeout",
        evidence=seen.evidence if seen.klass == "startup_timeout" else line,
        advice=advice,
        tail=_tail_lines(before),
        fatal=True,
    )
    exc = NotReady(
        f"{engine or 'the server'} was not ready after {timeout_s:g} s ({last})",
        hint=f"raise the start-up timeout, or read the log for where it stopped: {server.log_path}",
    )
    exc.diagnosis = diag
    return exc


# -- teardown ----------------------------------------------------------------------------------------


@dataclass
class TeardownReport:
    """What stopping a server took, and the proof that nothing of it is left."""

    pid: int
    run_marker: str
    exit_code: int | None
    stopped_by: str  # "already exited", "SIGTERM", "SIGKILL"
    stop_s: float
    orphans: list[KilledProcess] = field(default_factory=list)  # survivors of the group kill we killed
    survivors: list[ProcInfo] = field(default_factory=list)  # still alive at the end: should be empty
    shm: ShmCleanup = field(default_factory=ShmCleanup)
    gpu: GpuMemoryReport = field(default_factory=lambda: GpuMemoryReport("no GPUs"))
    port_free: bool = True
    duration_s: float = 0.0

    @property
    def clean(self) -> bool:
        """No process, listening port, held segment or GPU memory of this run is left."""
        return not self.survivors and self.port_free and self.gpu.ok and not self.shm.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "run_marker": self.run_marker,
            "exit_code": self.exit_code,
            "stopped_by": self.stopped_by,
            "stop_s": round(self.stop_s, 3),
            "orphans": [o.to_dict() for o in self.orphans],
            "survivors": [s.to_dict() for s in self.survivors],
            "shm": self.shm.to_dict(),
            "gpu": self.gpu.to_dict(),
            "port_free": self.port_free,
            "duration_s": round(self.duration_s, 3),
            "clean": self.clean,
        }


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


def teardown(
    server: AnyServer,
    grace_s: float = 15.0,
    *,
    orphan_grace_s: float = 5.0,
    gpu_timeout_s: float = 60.0,
) -> TeardownReport:
    """Stop the server's whole process tree and prove that nothing of it survives.

    1. SIGTERM the process group, wait `grace_s`, SIGKILL it.
    2. Find what escaped (descendants seen before the signal, processes carrying the run marker),
       SIGTERM/SIGKILL them and report them as orphans; anything still alive is a survivor.
    3. Remove the /dev/shm segments this run's processes created (`server.shm`: new since launch and
       seen held by them while they lived) once nothing holds them; never another job's.
    4. Wait until GPU memory is back at its launch baseline ("no GPUs" where there are none).
    Idempotent: calling it again on a stopped server only re-checks. A server on a remote host is torn
    down by that host's agent, the same steps over there."""
    if isinstance(server, RemoteServer):
        return _remote_teardown(server, grace_s)
    t0 = time.monotonic()
    tree = processes.process_tree(server.pid)  # before the signal: once the parent dies, the tree is gone
    record_shm(server, run_processes(server, tree))
    stopped_by = stop_process_group(server.proc, grace_s)
    crashpoint.reached("teardown")
    stop_s = time.monotonic() - t0
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(5)  # reap the leader: a zombie would keep its pid (and pgid) taken

    escaped = run_processes(server, tree)
    orphans = [k for k in processes.kill_processes(escaped, orphan_grace_s) if k.signal != "gone"]
    survivors = run_processes(server, tree)

    cleanup = server.shm.cleanup()

    gpu = wait_for_baseline(server.gpu_baseline_mib, server.gpu_reader, timeout_s=gpu_timeout_s)
    report = TeardownReport(
        pid=server.pid,
        run_marker=server.run_marker,
        exit_code=server.exit_code(),
        stopped_by=stopped_by,
        stop_s=stop_s,
        orphans=orphans,
        survivors=survivors,
        shm=cleanup,
        gpu=gpu,
        port_free=port_is_free(server.spec.host, server.spec.port),
        duration_s=time.monotonic() - t0,
    )
    server.teardown_report = report
    return report


def sweep_orphans(marker_prefix: str, grace_s: float = 5.0, host: Host | None = None) -> list[KilledProcess]:
    """Kill every live process whose SERVELAB_RUN starts with `marker_prefix`, and the other members of
    their sessions (an interrupted run's leftovers, before `tune --resume` starts again); returns what
    was killed. With an SSH `host`, over there (its agent runs this very function)."""
    if not marker_prefix:
        raise ConfigError(
            "an empty marker prefix would sweep every servelab-launched process on this host",
            hint="pass the study's marker prefix, e.g. 'study-7/'",
        )
    if host is not None and not host.is_local:
        from pydantic import TypeAdapter

        got = host.call("sweep", prefix=marker_prefix, grace_s=grace_s)
        return TypeAdapter(list[KilledProcess]).validate_python(got)
    marked = processes.with_marker(prefix=marker_prefix)
    # Their sessions too: a worker whose marker is hidden still shares its server's session.
    sessions = {p.sid for p in marked if p.sid is not None}
    found = _dedupe(marked + [m for sid in sorted(sessions) for m in processes.in_session(sid)])
    return [k for k in processes.kill_processes(found, grace_s) if k.signal != "gone"]


@contextlib.asynccontextmanager
async def serving(
    spec: LaunchSpec,
    log_path: Path,
    run_marker: str,
    readiness: Readiness,
    timeout_s: float,
    *,
    engine: str | None = None,
    api_key: str | None = None,
    cpus: set[int] | None = None,
    grace_s: float = 15.0,
    on_launch: Callable[[AnyServer], None] | None = None,
    on_not_ready: Callable[[AnyServer, EngineError], None] | None = None,
    host: Host | None = None,
) -> AsyncIterator[tuple[AnyServer, ReadyReport]]:
    """launch + wait_ready, then always teardown (in a thread: it sleeps); the report lands on
    `server.teardown_report`.

    `on_launch(server)` runs right after the process started (a study stores its pid); `on_not_ready(server,
    exc)` runs when it cannot become ready, before the teardown (while its log and processes are still
    there), and the error is raised after the teardown. A second cancellation during the teardown does not
    cut it short: the processes are always gone when this returns."""
    server = (
        launch(spec, log_path, run_marker, cpus=cpus)
        if host is None
        else launch_on(host, spec, log_path, run_marker, cpus=cpus)
    )
    try:
        if on_launch is not None:
            on_launch(server)
        try:
            ready = await wait_ready(server, readiness, timeout_s, engine, api_key)
        except EngineError as exc:
            if on_not_ready is not None:
                on_not_ready(server, exc)
            raise
        yield server, ready
    finally:
        await _finish_in_thread(teardown, server, grace_s)


async def _finish_in_thread(fn: Callable[..., Any], *args: Any) -> None:
    """Run `fn` in a thread and wait for it to end even when cancelled meanwhile (re-raising that after)."""
    job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    cancelled = False
    while not job.done():
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            cancelled = True
    job.result()
    if cancelled:
        raise asyncio.CancelledError
