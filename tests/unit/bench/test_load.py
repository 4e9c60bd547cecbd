from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest

from servelab.bench.load import ClientMonitor, arrival_offsets, frozen_heap
from servelab.bench.saturation import detect
from servelab.jsontypes import JsonObject


def test_constant_schedule_is_evenly_spaced() -> None:
    assert arrival_offsets(4.0, 5, "constant", 1.0, 0) == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("arrival,burst", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0)])
def test_random_schedules_keep_the_mean_rate(arrival: str, burst: float) -> None:
    off = arrival_offsets(10.0, 20001, arrival, burst, seed=1)
    gaps = np.diff(off)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert off[0] == 0.0 and all(g >= 0 for g in gaps)


def test_burstiness_changes_the_spread() -> None:
    bursty = np.diff(arrival_offsets(10.0, 5000, "gamma", 0.25, seed=2)).std()
    smooth = np.diff(arrival_offsets(10.0, 5000, "gamma", 8.0, seed=2)).std()
    poisson = np.diff(arrival_offsets(10.0, 5000, "poisson", 1.0, seed=2)).std()
    assert bursty > poisson > smooth
    assert poisson == pytest.approx(0.1, rel=0.1)  # exponential: std == mean


def test_schedule_is_seeded() -> None:
    assert arrival_offsets(5, 50, "poisson", 1, 7) == arrival_offsets(5, 50, "poisson", 1, 7)
    assert arrival_offsets(5, 50, "poisson", 1, 7) != arrival_offsets(5, 50, "poisson", 1, 8)


def test_bad_rate_rejected() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(0, 5, "poisson", 1, 0)


def test_frozen_heap_hides_older_objects_from_the_collector_only_while_a_level_runs() -> None:
    before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]  # made before the level: frozen with it
    with frozen_heap():
        assert gc.get_freeze_count() >= before + len(kept)
    assert gc.get_freeze_count() == 0
    assert len(kept) == 1000


async def _sends(hold_up: Callable[[], None], gaps_s: tuple[float, ...] = (0.002,)) -> JsonObject:
    return (await _monitored(hold_up, gaps_s)).summary(1, None)


async def _monitored(hold_up: Callable[[], None], gaps_s: tuple[float, ...] = (0.002,)) -> ClientMonitor:
    """Sends through a real ClientMonitor, each due `gap` after the one before (the first 2 ms from
    now), the sender's loop as in a level: `hold_up` runs on the loop's thread between the first wait's
    start and its send, as a late timer's cause would be."""
    monitor = ClientMonitor()
    monitor.start()
    try:
        due = time.perf_counter()
        for n, gap in enumerate(gaps_s):
            monitor.waiting_to_send()
            due += gap
            if n == 0:
                hold_up()
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            monitor.sent(due)
    finally:
        await monitor.stop()
    return monitor


def test_a_send_late_by_the_clients_own_loop_is_the_clients_lateness() -> None:
    """The loop's thread blocked 10 ms (a slow send path, a row written on the loop): not waiting on
    a run queue, so all of it is the client's own lateness, however busy the box."""
    client = asyncio.run(_sends(lambda: time.sleep(0.010)))
    late, own = client["send_lateness_ms"], client["send_lateness_own_ms"]
    assert isinstance(late, dict) and isinstance(own, dict)
    assert isinstance(late["max"], float) and isinstance(own["max"], float)
    assert late["max"] >= 8.0 and own["max"] >= 8.0, (late, own)


def _with_the_core_taken(gaps_s: tuple[float, ...]) -> JsonObject:
    return _core_taken(gaps_s).summary(1, None)


def _core_taken(gaps_s: tuple[float, ...]) -> ClientMonitor:
    """`_sends` while a real-time process on the loop thread's own core takes it for 30 ms from the first
    send's wait. The last core, not core 0 where the shared vLLM runs; the affinity is put back."""
    cores = os.sched_getaffinity(0)
    core = max(cores)
    go_r, go_w = os.pipe()

    def take_the_core() -> None:
        os.write(go_w, b"x")  # the hog is runnable at once and, real-time on this core, runs first

    try:
        os.sched_setaffinity(0, {core})
        hog = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import os, time\nos.read(0, 1)\nt = time.perf_counter()\n"
                "while time.perf_counter() - t < 0.03:\n    pass\n",
            ],
            stdin=go_r,
        )
        os.sched_setscheduler(hog.pid, os.SCHED_FIFO, os.sched_param(1))
        monitor = asyncio.run(_monitored(take_the_core, gaps_s))
        assert hog.wait(10) == 0
    finally:
        os.sched_setaffinity(0, cores)
        os.close(go_r)
        os.close(go_w)
    return monitor


def test_a_send_late_because_the_kernel_ran_another_process_is_not_the_clients() -> None:
    """The thread waits on the run queue all the time the hog holds its core, schedstat says so, and
    the client's own part is what is left."""
    client = _with_the_core_taken((0.002,))
    late, own = client["send_lateness_ms"], client["send_lateness_own_ms"]
    assert isinstance(late, dict) and isinstance(own, dict)
    assert isinstance(late["max"], float) and isinstance(own["max"], float)
    assert late["max"] >= 20.0, late  # the hog held the core past the due time
    assert own["max"] <= 0.25 * late["max"], (late, own)


def test_a_send_that_fell_due_during_an_earlier_sends_wait_is_not_the_clients_either() -> None:
    """The second send falls due 5 ms after the first, while the thread still waits for the hog: it goes
    out overdue without waiting again. The wait that delayed it began before its own turn, and is still
    the kernel's (counted only from each send's wait, it read ~25 ms as the client's own: the cause of
    a CI failure, own p99 5.3 ms beside a whole-lateness p99 of 18 ms)."""
    client = _with_the_core_taken((0.002, 0.005))
    late, own = client["send_lateness_ms"], client["send_lateness_own_ms"]
    assert isinstance(late, dict) and isinstance(own, dict)
    assert isinstance(late["p50"], float) and isinstance(own["max"], float)
    assert late["p50"] >= 12.0, late  # both sends late: the second one too (the p50 of two is their mean)
    assert own["max"] <= 0.25 * late["p50"], (late, own)


def test_the_client_verdict_of_saturation_judges_the_clients_own_lateness() -> None:
    """An open level's "the client could not keep up" (bench.saturation.detect, fed the monitor's lists
    as a level feeds them): a loop blocked 30 ms is the client's; the same lateness from a core taken
    30 ms by another process is not, and the stored figures say both."""
    limit_rate = 250.0  # the limit: max(10 ms, a quarter of the mean gap) = 10 ms
    blocked = asyncio.run(_monitored(lambda: time.sleep(0.030)))
    verdict = detect([], limit_rate, lateness_s=blocked.lateness, descheduled_s=blocked.descheduled)
    assert verdict.client_saturated and verdict.reasons[0].startswith("the client sent late"), verdict
    assert verdict.send_lateness_own_p99_ms is not None and verdict.send_lateness_own_p99_ms >= 25.0
    taken = _core_taken((0.002,))
    verdict = detect([], limit_rate, lateness_s=taken.lateness, descheduled_s=taken.descheduled)
    assert verdict.send_lateness_p99_ms is not None and verdict.send_lateness_p99_ms >= 20.0, verdict
    assert not verdict.client_saturated and verdict.reasons == [], verdict
