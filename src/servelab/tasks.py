"""Stopping a helper task without losing a cancellation of the task that stops it.

`task.cancel(); with suppress(CancelledError): await task` swallows Ctrl-C: while the caller waits for
the helper to end, a `cancel()` of the caller is handed to the helper it waits on, and the helper's
CancelledError then reaches the caller's `suppress`. A study whose Ctrl-C landed in that window ran on to
the end and exited 0 (tests/integration/test_tune_remote.py, under load). `stop` tells the two apart by
the caller's cancellation count (`Task.cancelling()`) before and after: a caller that already caught
one (a level stopped by Ctrl-C, finishing its records) still stops its helpers."""

from __future__ import annotations

import asyncio
from typing import Any


async def stop(task: asyncio.Task[Any] | asyncio.Future[Any]) -> None:
    """Cancel `task` and wait for it to end. Its own CancelledError is expected and dropped; one meant
    for the caller (cancelled meanwhile) is raised."""
    me = asyncio.current_task()
    before = (
        me.cancelling() if me is not None else 0
    )  # a cancellation the caller already caught stays counted
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if me is not None and me.cancelling() > before:
            raise
