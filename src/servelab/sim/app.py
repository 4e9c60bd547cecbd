"""`servelab sim` composed: the server (`server.py`) with its router (`routes.py`), start-up
(`startup.py`) and, through the router, telemetry (`telemetry.py`). The parts know the server only as
`state.SimState`; this is the one module that knows them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from servelab.sim.http import raise_fd_limit
from servelab.sim.routes import Router
from servelab.sim.server import SimServer
from servelab.sim.startup import engine_dead_lines, run_startup
from servelab.sim.state import SimConfig


def compose(cfg: SimConfig, log_stream: Any = None) -> SimServer:
    """A simulated server with its parts wired on: the router answers its HTTP, the start-up runs
    when it starts, the engine-dead lines are printed when its engine dies."""
    srv = SimServer(cfg, log_stream)
    srv.handler = Router(srv).handle
    srv.start_up = lambda: run_startup(srv)
    srv.dead_lines = lambda: engine_dead_lines(srv)
    return srv


def run(cfg: SimConfig, cpu: int | None = None) -> int:
    """Blocking entry point of `servelab sim`: serve until SIGTERM/SIGINT; returns the exit code."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    raise_fd_limit()
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        srv = compose(cfg)
        return loop.run_until_complete(srv.main())
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.sleep(0))
        loop.close()
