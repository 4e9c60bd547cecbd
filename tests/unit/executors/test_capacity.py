"""The driver's GPU gate (pure asyncio): trials start in the order they asked, never over the total, and a
cancelled waiter gives nothing away."""

from __future__ import annotations

import asyncio

import pytest

from servelab.executors.base import Capacity


def test_first_come_first_served_and_never_over_the_total() -> None:
    async def go() -> list[str]:
        cap = Capacity(16)
        started: list[str] = []
        release = {n: asyncio.Event() for n in "abcd"}
        peak = 0

        async def trial(name: str, gpus: int) -> None:
            nonlocal peak
            async with cap.hold(gpus):
                started.append(name)
                peak = max(peak, 16 - cap.free)
                await release[name].wait()

        tasks = [asyncio.ensure_future(trial(n, g)) for n, g in (("a", 8), ("b", 8), ("c", 4), ("d", 4))]
        await asyncio.sleep(0.01)
        assert started == ["a", "b"]  # c (4) waits though it would fit nowhere: 16 of 16 are held
        release["a"].set()
        await asyncio.sleep(0.01)
        assert started == ["a", "b", "c", "d"]  # the freed 8 take c and d, in order
        for e in release.values():
            e.set()
        await asyncio.gather(*tasks)
        assert cap.free == 16 and peak == 16
        return started

    assert asyncio.run(go()) == ["a", "b", "c", "d"]


def test_a_big_trial_at_the_head_is_not_overtaken() -> None:
    async def go() -> list[str]:
        cap = Capacity(8)
        order: list[str] = []
        hold_a = asyncio.Event()

        async def trial(name: str, gpus: int, gate: asyncio.Event | None = None) -> None:
            async with cap.hold(gpus):
                order.append(name)
                if gate is not None:
                    await gate.wait()

        a = asyncio.ensure_future(trial("a", 4, hold_a))
        await asyncio.sleep(0)
        b = asyncio.ensure_future(trial("b", 8))
        c = asyncio.ensure_future(trial("c", 4))
        await asyncio.sleep(0.01)
        assert order == ["a"]  # c would fit beside a, but b asked first
        hold_a.set()
        await asyncio.gather(a, b, c)
        return order

    assert asyncio.run(go()) == ["a", "b", "c"]


def test_a_cancelled_waiter_frees_its_place() -> None:
    async def go() -> int:
        cap = Capacity(8)
        gate = asyncio.Event()

        async def holder() -> None:
            async with cap.hold(8):
                await gate.wait()

        async def waiter() -> None:
            async with cap.hold(8):
                pass

        h = asyncio.ensure_future(holder())
        await asyncio.sleep(0)
        w = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.01)
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
        gate.set()
        await h
        async with cap.hold(8):  # all 8 back: the cancelled waiter took none
            return cap.free

    assert asyncio.run(go()) == 0


def test_a_request_larger_than_the_cluster_is_capped_not_stuck() -> None:
    async def go() -> int:
        cap = Capacity(8)
        async with cap.hold(16):  # the executor's fit check refuses these first; the gate never hangs
            return cap.free

    assert asyncio.run(go()) == 0
