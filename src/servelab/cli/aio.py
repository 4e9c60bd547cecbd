"""Running a command's coroutine: uvloop when present, SIGINT/SIGTERM cancel it (so `finally` blocks
tear servers down and the store records an interruption instead of the process dying mid-write)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def _cancellable(coro: Coroutine[Any, Any, T]) -> T:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
    return await coro


def run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(_cancellable(coro))
    return uvloop.run(_cancellable(coro))
