"""A study's lease: one driver at a time.

Two `servelab tune` processes driving one study measure the same candidates and tear down each other's
servers, so the driver holds a lease in the store: its pid, host and the process's start time (read from
/proc, so a later process that reuses the pid is not taken for the owner). Taking it is one statement
(INSERT .. ON CONFLICT DO NOTHING), and replacing a stale owner is one UPDATE that names the owner it
replaces, so of two racing drivers exactly one wins. The lease is released when the driver exits; after a
`kill -9` it stays, and is stale once its process is gone from this host (`Owner.alive`). A lease held on
another host cannot be checked from here and counts as live.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime

import psutil

from servelab.errors import StudyBusy
from servelab.host import processes
from servelab.jsontypes import JsonObject
from servelab.store.db import Store, utcnow


@dataclass(frozen=True)
class Owner:
    """The process that drives a study."""

    pid: int
    host: str
    started: float  # the process's start time, epoch seconds

    @classmethod
    def me(cls) -> Owner:
        return cls(os.getpid(), socket.gethostname(), psutil.Process().create_time())

    def alive(self) -> bool:
        """Still running: on this host, the same pid with the same start time, not a zombie. On another
        host it cannot be checked and counts as alive."""
        if self.host != socket.gethostname():
            return True
        return processes.alive(self.pid, self.started)

    def since(self) -> str:
        return datetime.fromtimestamp(self.started, UTC).isoformat(timespec="seconds")

    def to_dict(self) -> JsonObject:
        return {"pid": self.pid, "host": self.host, "since": self.since(), "alive": self.alive()}


def holder(store: Store, study_id: int) -> Owner | None:
    """Who holds the study's lease (alive or not); None when nobody does."""
    row = store.execute(
        "SELECT pid, host, proc_started FROM study_leases WHERE study_id = ?", (study_id,)
    ).fetchone()
    return Owner(int(row[0]), str(row[1]), float(row[2])) if row else None


def acquire(store: Store, study_id: int, study_uid: str, me: Owner | None = None) -> Owner:
    """Take the study's lease for `me` (this process), replacing an owner that is gone; raises StudyBusy
    naming the owner while it lives."""
    me = me or Owner.me()
    db = store
    for _ in range(3):  # a stale owner replaced by another driver between our read and our update
        cur = db.execute(
            "INSERT INTO study_leases (study_id, pid, host, proc_started, acquired_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (study_id) DO NOTHING",
            (study_id, me.pid, me.host, me.started, utcnow()),
        )
        if cur.rowcount == 1:
            return me
        owner = holder(store, study_id)
        if owner is None:
            continue  # released meanwhile
        if owner == me:
            return me
        if owner.alive():
            raise StudyBusy(
                f"study {study_uid} is being driven by pid {owner.pid} on {owner.host} since {owner.since()}"
            )
        cur = db.execute(
            "UPDATE study_leases SET pid = ?, host = ?, proc_started = ?, acquired_at = ?"
            " WHERE study_id = ? AND pid = ? AND host = ? AND proc_started = ?",
            (me.pid, me.host, me.started, utcnow(), study_id, owner.pid, owner.host, owner.started),
        )
        if cur.rowcount == 1:
            return me
    owner = holder(store, study_id)
    who = f"pid {owner.pid} on {owner.host} since {owner.since()}" if owner else "another process"
    raise StudyBusy(f"study {study_uid} is being driven by {who}")


def release(store: Store, study_id: int, me: Owner) -> None:
    """Give the lease back (only ours: never another driver's)."""
    store.execute(
        "DELETE FROM study_leases WHERE study_id = ? AND pid = ? AND host = ? AND proc_started = ?",
        (study_id, me.pid, me.host, me.started),
    )
