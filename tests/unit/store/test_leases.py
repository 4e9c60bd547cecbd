"""The study lease on its own: a live owner refuses a second driver by name, a gone one is replaced, a
reused pid is not the owner, another host's owner cannot be checked and counts as live."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from servelab.errors import StudyBusy
from servelab.store import leases
from servelab.store.db import open_store
from servelab.store.studies import StudyRepo


def test_a_live_owner_refuses_by_name_and_a_gone_one_is_replaced(where: Path | str) -> None:
    with open_store(where) as store:
        sid, uid = StudyRepo(store).create_study("x", None, {}, "h")
        other = subprocess.Popen(["sleep", "60"])
        try:
            them = leases.Owner(other.pid, socket.gethostname(), psutil.Process(other.pid).create_time())
            assert leases.acquire(store, sid, uid, them) == them
            with pytest.raises(StudyBusy) as exc:
                leases.acquire(store, sid, uid)
            assert exc.value.message == (
                f"study {uid} is being driven by pid {other.pid} on {socket.gethostname()} since {them.since()}"
            )
            assert exc.value.exit_code == 1
        finally:
            other.kill()
            other.wait()
        assert not them.alive()
        me = leases.acquire(store, sid, uid)  # the owner is gone: stale, taken over
        assert leases.holder(store, sid) == me
        leases.release(store, sid, them)  # not its lease any more: nothing released
        assert leases.holder(store, sid) == me
        leases.release(store, sid, me)
        assert leases.holder(store, sid) is None


def test_a_reused_pid_is_not_the_owner_and_another_host_counts_as_live() -> None:
    me = leases.Owner.me()
    assert me.alive()
    assert not leases.Owner(me.pid, me.host, me.started - 100).alive()  # same pid, a later process
    assert leases.Owner(1, me.host + "-elsewhere", 0.0).alive()
