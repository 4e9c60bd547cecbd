"""Fail the test run when a process it started is still alive at the end (and then stop it).

Which processes are this run's: every process a test starts inherits ``SERVELAB_TEST_SESSION=<token>``
(set here, at import, in this pytest process's environment; servelab's launcher and tests/support/engines.py
pass ``os.environ`` on), and /proc/PID/environ shows it for as long as the process lives, whoever its parent
is now; plus whatever is still a descendant of this pytest process. Processes of other jobs on the same box,
servelab-marked or not, never carry this run's token and are left alone. Those that carry a servelab run
marker (``SERVELAB_RUN=``, see servelab.host.processes) are named with it.

Under pytest-xdist the controller's token is every worker's (a worker inherits it and keeps it), and only
the controller checks, after every worker has ended: a worker cannot tell its own leftovers from a live
server the other worker is still using, and a worker's exit status does not reach the run's.

Used by tests/conftest.py (its ``pytest_sessionfinish``); ``-p tests.support.leftovers`` loads it alone.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from servelab.host import processes
from servelab.host.processes import ProcInfo

SESSION_ENV = "SERVELAB_TEST_SESSION"
TOKEN = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
os.environ[SESSION_ENV] = TOKEN  # before any test starts anything: every child inherits it
_WORKER_KEY = "servelab_session_token"  # what the controller hands each xdist worker (`workerinput`)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The xdist controller hands its token to each worker it starts."""
    node.workerinput[_WORKER_KEY] = TOKEN


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker takes the controller's token (before any test runs); a pytest a test starts
    inside one is no worker (no `workerinput`) and keeps a token of its own."""
    global TOKEN
    given = getattr(config, "workerinput", {}).get(_WORKER_KEY)
    if given:
        TOKEN = os.environ[SESSION_ENV] = given


GRACE_S = 10.0  # processes a teardown has just signalled get this long to finish exiting
_PROC = Path("/proc")


def _has_token(pid: int) -> bool:
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{SESSION_ENV}={TOKEN}".encode() in raw.split(b"\0")


# Helpers multiprocessing starts for this very process (a test that used shared_memory or a "spawn"
# context in-process); they exit when it does, so they are not a test's leftovers.
_OWN_HELPERS = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.forkserver import main",
)


def _protected() -> set[int]:
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids |= {p.pid for p in me.parents()}
    with contextlib.suppress(psutil.Error):
        for child in me.children():
            with contextlib.suppress(psutil.Error):
                if any(h in " ".join(child.cmdline()) for h in _OWN_HELPERS):
                    pids.add(child.pid)
    return pids


def leftovers() -> list[ProcInfo]:
    """This run's processes that are alive now (zombies are not: they hold nothing, and init reaps them)."""
    skip = _protected()
    pids: set[int] = set()
    with contextlib.suppress(psutil.Error):
        pids |= {p.pid for p in psutil.Process().children(recursive=True)}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and _has_token(int(entry.name)):
            pids.add(int(entry.name))
    found = [processes.info(pid) for pid in sorted(pids - skip)]
    return [p for p in found if p is not None and p.alive()]


def _describe(p: ProcInfo) -> str:
    marker = f" SERVELAB_RUN={p.marker}" if p.marker else ""
    return f"pid {p.pid} (ppid {p.ppid}, session {p.sid}){marker}: {p.cmdline[:200]}"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # the controller checks once every worker has ended (see the module's docstring)
    left = leftovers()
    deadline = time.monotonic() + GRACE_S
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if p.alive()]
    if not left:
        return
    killed = processes.kill_processes(left, grace_s=5.0)
    lines = [_describe(p) for p in left]
    lines += [
        f"stopped pid {k.pid} with {k.signal}" + ("" if k.stopped else " (still alive!)") for k in killed
    ]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    title = f"{len(left)} process(es) started by this test run were still running at its end"
    if reporter is not None:
        reporter.write_sep("=", title, red=True, bold=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print(title, *lines, sep="\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
