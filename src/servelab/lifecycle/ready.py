"""Wait until a server is really ready, or stop as soon as it cannot become ready.

Readiness is the engine's declared rule (`engines.base.Readiness`, carried out by `probe.Probe`). A process
that exits, or logs a fatal signature while it keeps running, stops the wait at once with the diagnosis
instead of letting it run into the timeout. vLLM and llama.cpp set SO_REUSEPORT: a second server started on
a busy port binds it anyway and the kernel splits connections between the two, so benchmarks silently
measure a mix. After ready, the port must be held by our process tree alone (`_guard_port`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field

from servelab.engines.base import Diagnosis, LaunchSpec, Readiness
from servelab.errors import LaunchFailed, NotReady
from servelab.host import processes
from servelab.host.ports import Listener
from servelab.jsontypes import JsonObject
from servelab.lifecycle.handle import ServerHandle, connects, dial_host
from servelab.lifecycle.probe import LogWatcher, Probe, diagnose_log, failed, tail_lines
from servelab.startup import StartupPhases


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
    startup: StartupPhases | None = None  # the phases read from the engine's log (None: no log read)

    def to_dict(self) -> JsonObject:
        extra: JsonObject = {} if self.startup is None else {"startup": self.startup.model_dump(mode="json")}
        out: JsonObject = {
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
        return out | extra


def _exited(server: ServerHandle, engine: str | None, rc: int) -> LaunchFailed:
    diag = diagnose_log(server.log_text(), engine)
    how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
    return failed(server, f"{engine or 'the server'} {how} before it was ready", diag)


def _guard_port(server: ServerHandle) -> tuple[list[Listener], list[str]]:
    """The SO_REUSEPORT guard: the port must be ours alone."""
    ours, foreign = server.port_owners()
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
            raise failed(server, f"port {port} is shared with a process outside this run", diag)
        diag = Diagnosis(
            klass="port_in_use",
            evidence=f"{port} is served by {who}, not by our server (pid {server.pid})",
            advice="Stop that server or use another port",
            fatal=True,
        )
        raise failed(server, f"another process answers on {port}", diag)
    notes = [] if ours else [f"no listening socket on {port} could be attributed (not checked for sharing)"]
    return ours, notes


async def wait_ready(
    server: ServerHandle,
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
    watcher = LogWatcher(server.log_path, engine, server.started_mono)
    probe = Probe(server, readiness, api_key, request_timeout_s, engine)
    try:
        while True:
            rc = server.exit_code()
            if rc is not None:
                raise _exited(server, engine, rc)
            diag = watcher.fatal()
            if diag is not None:
                raise failed(server, f"{engine or 'the server'} logged a fatal error while starting", diag)
            server.record_shm()  # while its processes live: what they hold is theirs to clean up later
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if await probe.step(remaining):
                server.record_shm()
                rc = server.exit_code()  # a server that answered and died at once is not ready
                if rc is not None:
                    raise _exited(server, engine, rc)
                ours, notes = _guard_port(server)
                now = time.monotonic()
                watcher.fatal()  # the lines logged since the last look: seen by now at the latest
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
                    startup=watcher.startup.result(now - server.started_mono),
                )
            await asyncio.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
    finally:
        probe.client.close()
    raise _timed_out(server, engine, timeout_s, probe.last)


@dataclass
class Endpoint:
    """A server known only by its URL (a systemd unit's, a container's): what `Probe` needs of a Server.

    `log_path` is only quoted in hints ("Full log: ..."), so it may name a command (`journalctl -u X`)."""

    spec: LaunchSpec
    started_mono: float
    log_path: str = "the server's log"
    pid: int | None = None  # when known (systemd's $MAINPID): its exit stops the wait at once

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def forwarded(self) -> bool:
        return False

    async def port_open(self, timeout_s: float) -> bool:
        return await connects(dial_host(self.spec), self.spec.port, timeout_s)


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
    """`wait_ready` for a server servelab did not launch: the same `Probe` rule against a URL, then (with
    `completion`) one real completion. No log to scan and no port-ownership guard (the process tree is
    not ours); an `endpoint.pid` that exits ends the wait with LaunchFailed. NotReady after `timeout_s`."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    probe = Probe(endpoint, readiness, api_key, request_timeout_s, engine)
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
                raise failed(endpoint, f"{engine or 'the server'} exited before it was ready", diag)
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


def _timed_out(server: ServerHandle, engine: str | None, timeout_s: float, last: str) -> NotReady:
    """NotReady, after appending the timeout marker to the log so that a later `diagnose` of the log
    (servelab logs, the store) tells a timeout from a crash."""
    before = server.log_text()
    line = _timeout_line(timeout_s, last)
    with contextlib.suppress(OSError), open(server.log_path, "a", encoding="utf-8") as f:
        f.write(("" if not before or before.endswith("\n") else "\n") + line + "\n")
    seen = diagnose_log(server.log_text(), engine)
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
        tail=tail_lines(before),
        fatal=True,
    )
    exc = NotReady(
        f"{engine or 'the server'} was not ready after {timeout_s:g} s ({last})",
        hint=f"raise the start-up timeout, or read the log for where it stopped: {server.log_path}",
    )
    exc.diagnosis = diag
    return exc


# -- teardown ----------------------------------------------------------------------------------------
