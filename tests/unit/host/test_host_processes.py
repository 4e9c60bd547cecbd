"""servelab.host.processes against real processes: trees, run markers, orphans, killing."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest

from servelab.host.processes import (
    MARKER_ENV,
    in_session,
    info,
    kill_processes,
    marker_of,
    process_tree,
    with_marker,
)

# A parent that starts a grandchild in a new session (as engines' workers may) and prints its pid.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(child.pid, flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(120)
"""
IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"


def _marker() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def spawned() -> Iterator[list[int]]:
    """Pids to SIGKILL at the end, whatever the test did."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def _spawn(code: str, marker: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env={**os.environ, MARKER_ENV: marker},
        stdout=subprocess.PIPE,
        text=True,
    )


def test_marker_is_read_from_environ(spawned: list[int]) -> None:
    m = _marker()
    p = _spawn("import time; print('up', flush=True); time.sleep(120)", m)
    spawned.append(p.pid)
    assert p.stdout is not None and p.stdout.readline()
    assert marker_of(p.pid) == m
    assert marker_of(os.getpid()) != m
    assert [x.pid for x in with_marker(m)] == [p.pid]
    assert [x.pid for x in with_marker(prefix=m[:-3])] == [p.pid]
    assert with_marker(m + "-other") == []
    p.kill()
    p.wait()
    assert with_marker(m) == []


def test_tree_lists_descendants_and_the_marker_finds_a_reparented_orphan(spawned: list[int]) -> None:
    m = _marker()
    parent = _spawn(PARENT, m, "stay")
    spawned.append(parent.pid)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    spawned.append(child)
    tree = process_tree(parent.pid)
    assert [p.pid for p in tree] == [parent.pid, child]
    assert tree[1].ppid == parent.pid
    assert tree[1].pgid == child  # it left the parent's process group
    # Each carries the marker in its environment. A read of /proc/PID/environ a moment after the exec once
    # came back without it on a loaded box: read again for a few seconds before deciding.
    deadline = time.monotonic() + 5.0
    while not all(p.marker == m for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
        tree = process_tree(parent.pid)
    assert [p.marker for p in tree] == [m, m]

    parent.kill()
    parent.wait()
    # The parent is gone: the tree no longer reaches the child, the marker still does.
    assert process_tree(parent.pid) == []
    assert [p.pid for p in with_marker(m)] == [child]
    assert psutil.Process(child).ppid() != parent.pid


def test_kill_processes_reports_sigterm_and_sigkill(spawned: list[int]) -> None:
    m = _marker()
    polite = _spawn("import time; print('up', flush=True); time.sleep(120)", m)
    stubborn = _spawn(IGNORES_TERM, m)
    spawned += [polite.pid, stubborn.pid]
    for p in (polite, stubborn):
        assert p.stdout is not None and p.stdout.readline()
    procs = with_marker(m)
    assert {p.pid for p in procs} == {polite.pid, stubborn.pid}
    report = {k.pid: k for k in kill_processes(procs, grace_s=1.0)}
    polite.wait(10)
    stubborn.wait(10)  # reap them: zombies of ours would still count as processes
    assert report[polite.pid].signal == "SIGTERM"
    assert report[stubborn.pid].signal == "SIGKILL"
    assert all(k.stopped and k.marker == m for k in report.values())
    assert with_marker(m) == []


def test_a_dead_process_is_reported_gone_and_a_reused_pid_is_not_alive(spawned: list[int]) -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", "print('up', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdin is not None and p.stdout.readline()
    snapshot = info(p.pid)
    assert snapshot is not None
    p.stdin.close()  # it exits now
    p.wait()
    assert not snapshot.alive()
    assert [k.signal for k in kill_processes([snapshot])] == ["gone"]
    # Same pid, another start time: not the process we saw.
    fake = type(snapshot)(**{**snapshot.to_dict(), "pid": os.getpid(), "create_time": time.time() + 1e6})
    assert not fake.alive()


def test_we_never_kill_ourselves() -> None:
    me = info(os.getpid())
    assert me is not None
    assert kill_processes([me]) == []


def test_session_members_are_found_without_the_marker(spawned: list[int]) -> None:
    """A server started in its own session; its worker stays in the session and needs no marker."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.replace("start_new_session=True", "env={}"), "stay"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    spawned.append(parent.pid)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    spawned.append(child)
    assert marker_of(child) is None
    members = in_session(parent.pid)
    assert [p.pid for p in members] == [parent.pid, child]
    assert all(p.sid == parent.pid for p in members)
    assert in_session(os.getsid(0)) == []  # never our own session
    parent.kill()
    parent.wait()
    assert [p.pid for p in in_session(parent.pid)] == [child]  # the session outlives its leader
