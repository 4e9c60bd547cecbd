"""The servelab agent: the host-side half of a remote host, run as `python -m servelab.agent`.

The control machine starts it over SSH (servelab.host.transport.SshHost) and sends one JSON request per
line on its stdin, `{"id": N, "op": "...", "args": {...}}`; it answers one line each on its stdout,
`{"id": N, "ok": true, "result": ...}` or `{"id": N, "ok": false, "error": {...}}`. Every operation is
the function servelab runs on a local host (lifecycle, processes, shm, ports), so the remote side is the
same code path as the local one. Stray prints of imported libraries go to stderr: stdout is ours.

The operations come from one explicit list of modules (`GROUPS`), read at start; each module imports the
rooms it runs inside its operations, so the start stays light. On this machine `LocalHost` runs the same
table in-process through `DISPATCHER` (`local_host()`), handed to it by the fronts: the agent stands above
every room, and host/ never imports it.

When stdin ends (the connection dropped, the control-side servelab was killed) or on SIGTERM/SIGHUP, it
tears down every server it launched before it exits: a server of ours never outlives its driver's link.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

import orjson

from servelab.agent import ops_bench, ops_core, ops_deploy, ops_logs, ops_observe
from servelab.agent.registry import AgentState, table
from servelab.errors import ConfigError
from servelab.host.transport import LocalHost
from servelab.host.wire import error_payload
from servelab.jsontypes import JsonObject

__all__ = ["DISPATCHER", "GROUPS", "OPS", "AgentState", "dispatch", "local_host", "main", "shutdown"]

# The one list of the agent's operation groups: a new group is one line here.
GROUPS = (
    ("core", ops_core.OPS),  # hello, a server's life, ports, shm, GPU memory, files
    ("observe", ops_observe.OPS),  # status, doctor
    ("logs", ops_logs.OPS),  # log_read, host_facts (logs, plan check, report)
    ("deploy", ops_deploy.OPS),  # deploy --install --host, preflight --host
    ("bench", ops_bench.OPS),  # [host] bench_from = "remote"
)
OPS = table(GROUPS)


def dispatch(state: AgentState, op: str, args: JsonObject) -> Any:
    fn = OPS.get(op)
    if fn is None:
        raise ConfigError(
            f"unknown agent operation {op!r}", hint="servelab versions differ on the two machines"
        )
    return fn(state, **args)


def shutdown(state: AgentState) -> None:
    """Tear down every server still running: the driver that owned them is gone."""
    from servelab.lifecycle.serving import teardown

    for marker in list(state.servers):
        server = state.servers.pop(marker)
        try:
            teardown(server, 10.0, gpu_timeout_s=10.0)
        except Exception as exc:
            print(f"servelab agent: teardown of {marker} failed: {exc}", file=sys.stderr)


# -- the loop --------------------------------------------------------------------------------------
def serve(stdin: Any, out: Any) -> None:
    state = AgentState()
    with contextlib.suppress(AttributeError, OSError, ValueError):
        state.stdin_fd = stdin.fileno()

    def stop(_sig: int, _frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        for line in stdin:
            if not line.strip():
                continue
            rid = None
            try:
                req = orjson.loads(line)
                rid = req.get("id")
                result = dispatch(state, str(req.get("op")), dict(req.get("args") or {}))
                answer = {"id": rid, "ok": True, "result": result}
            except Exception as exc:
                answer = {"id": rid, "ok": False, "error": error_payload(exc)}
            try:
                out.write(orjson.dumps(answer, default=str) + b"\n")
                out.flush()
            except (BrokenPipeError, OSError):
                break
    finally:
        shutdown(state)


def main() -> None:
    if "--check" in sys.argv[1:]:
        print(orjson.dumps(dispatch(AgentState(), "hello", {})).decode())
        return
    if "--detach" in sys.argv[1:]:
        # Out of the starter's process tree (a Ray worker: Ray SIGKILLs a dying worker's children, which
        # would leave our servers running); the pipes stay ours, so their end still tears down.
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what anything else prints lands on stderr, never in the protocol
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, out)


class _Dispatcher:
    """The agent's table as `transport.LocalHost` runs it in this process (transport.Dispatcher)."""

    def new_state(self) -> AgentState:
        return AgentState()

    def dispatch(self, state: Any, op: str, args: JsonObject) -> Any:
        return dispatch(state, op, args)

    def shutdown(self, state: Any) -> None:
        shutdown(state)


DISPATCHER = _Dispatcher()


def local_host() -> LocalHost:
    """This machine, its agent operations run in this process."""
    return LocalHost(DISPATCHER)


if __name__ == "__main__":
    main()
