"""The entry points: launch on a host (this one, or one an agent runs), tear down, sweep an interrupted run's
leftovers, and `serving`, which does launch → ready → always teardown in one statement.

    async with serving(spec, log_path, marker, engine.readiness, engine.startup_timeout_s) as (server, ready):
        ...                                 # server.teardown_report once it has returned

Which kind of server a call gets is decided here, once, by the host; afterwards every caller speaks
`handle.ServerHandle`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from servelab.engines.base import LaunchSpec, Readiness
from servelab.errors import ConfigError, EngineError
from servelab.host.processes import KilledProcess
from servelab.lifecycle.handle import ServerHandle, TeardownReport
from servelab.lifecycle.local import kill_marked, launch
from servelab.lifecycle.ready import ReadyReport, wait_ready
from servelab.lifecycle.remote import launch_remote

if TYPE_CHECKING:  # annotations only (the agent, above, runs `local` over there)
    from servelab.host.transport import AgentHost, Host


def launch_on(
    host: Host,
    spec: LaunchSpec,
    log_path: Path,
    run_marker: str,
    *,
    cpus: set[int] | None = None,
    check_port: bool = True,
) -> ServerHandle:
    """`local.launch` on `host`: here directly, on an SSH host through its agent (`remote.launch_remote`)."""
    if host.is_local:
        return launch(spec, log_path, run_marker, cpus=cpus, check_port=check_port)
    return launch_remote(
        cast("AgentHost", host), spec, log_path, run_marker, cpus=cpus, check_port=check_port
    )


def teardown(
    server: ServerHandle,
    grace_s: float = 15.0,
    *,
    orphan_grace_s: float = 5.0,
    gpu_timeout_s: float = 60.0,
) -> TeardownReport:
    """Stop the server's whole process tree and prove that nothing of it survives (`local.Server.teardown`
    says how; a server on a remote host is torn down by that host's agent, the same steps over there).
    Idempotent: calling it again on a stopped server only re-checks."""
    return server.teardown(grace_s, orphan_grace_s=orphan_grace_s, gpu_timeout_s=gpu_timeout_s)


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
        from servelab.lifecycle.ops import SWEEP, SweepRequest

        return SWEEP.call(host, SweepRequest(prefix=marker_prefix, grace_s=grace_s))
    return kill_marked(marker_prefix, grace_s)


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
    on_launch: Callable[[ServerHandle], None] | None = None,
    on_not_ready: Callable[[ServerHandle, EngineError], None] | None = None,
    host: Host | None = None,
) -> AsyncIterator[tuple[ServerHandle, ReadyReport]]:
    """launch + wait_ready, then always teardown (in a thread: it sleeps); the report lands on
    `server.teardown_report`.

    `on_launch(server)` runs right after the process started (a study stores its pid); `on_not_ready(server,
    exc)` runs when it cannot become ready, before the teardown (while its log and processes are still
    there), and the error is raised after the teardown. A second cancellation during the teardown does not
    cut it short: the processes are always gone when this returns."""
    server: ServerHandle = (
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
