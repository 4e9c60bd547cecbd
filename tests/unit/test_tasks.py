"""`tasks.stop` keeps a Ctrl-C that lands while a helper task is being stopped (the pattern it replaces
lost it: a study interrupted in that window ran on to the end and exited 0)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from servelab import tasks


async def _slow_to_stop(stopping: asyncio.Event) -> None:
    """A helper that takes a few loop turns to end once cancelled (an HTTP read being torn down)."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        stopping.set()
        await asyncio.sleep(0.05)
        raise


async def _caller(stopper: str, stopping: asyncio.Event, after: list[str]) -> None:
    helper = asyncio.ensure_future(_slow_to_stop(stopping))
    await asyncio.sleep(0)
    if stopper == "tasks.stop":
        await tasks.stop(helper)
    else:  # the pattern tasks.stop replaced
        helper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await helper
    after.append("went on")  # what a swallowed Ctrl-C lets happen: the rest of the study
    await asyncio.sleep(0)


async def _cancel_while_stopping(stopper: str) -> tuple[bool, list[str]]:
    stopping, after = asyncio.Event(), list[str]()
    caller = asyncio.ensure_future(_caller(stopper, stopping, after))
    await stopping.wait()  # the caller is inside the stop, waiting for the helper
    caller.cancel()  # Ctrl-C (cli/aio.py: the signal handler cancels the command's task)
    try:
        await caller
    except asyncio.CancelledError:
        return True, after
    return False, after


def test_the_pattern_it_replaced_swallowed_it() -> None:
    """The reference: the same moment with `cancel(); suppress(CancelledError): await` loses the Ctrl-C,
    so the test below can fail."""
    cancelled, after = asyncio.run(_cancel_while_stopping("suppress"))
    assert not cancelled and after == ["went on"]


def test_the_helpers_own_cancellation_is_dropped() -> None:
    async def main() -> bool:
        helper = asyncio.ensure_future(_slow_to_stop(asyncio.Event()))
        await asyncio.sleep(0)
        await tasks.stop(helper)
        return helper.cancelled()

    assert asyncio.run(main())


def test_a_helper_that_already_ended_is_fine() -> None:
    async def main() -> None:
        helper = asyncio.ensure_future(asyncio.sleep(0))
        await helper
        await tasks.stop(helper)

    asyncio.run(main())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_cancellation_of_the_caller_during_stop_is_raised(loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        cancelled, after = uvloop.run(_cancel_while_stopping("tasks.stop"))
    else:
        cancelled, after = asyncio.run(_cancel_while_stopping("tasks.stop"))
    assert cancelled and after == []


def test_a_caller_that_already_caught_a_cancellation_still_stops_its_helper() -> None:
    """A level cancelled by Ctrl-C catches it, then stops its sampler and stores its records as
    interrupted before raising again: that stop must not raise the old cancellation (it did once, and
    the level stayed `running` in the store)."""

    async def level() -> str:
        helper = asyncio.ensure_future(_slow_to_stop(asyncio.Event()))
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            status = "interrupted"
        finally:
            await tasks.stop(helper)
        return status

    async def main() -> str:
        task = asyncio.ensure_future(level())
        await asyncio.sleep(0.01)
        task.cancel()
        return await task

    assert asyncio.run(main()) == "interrupted"
