"""Load generation: closed loop at a fixed concurrency, open loop at a request rate.

Schedules are pure (`arrival_offsets`); the drivers are the only place that awaits. The client
measures itself while it drives (CPU time, event-loop lag, lateness of sends against the schedule)
so a report can say when the client, not the server, was the bottleneck.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from servelab import tasks
from servelab.bench.client import Client, StreamResult
from servelab.jsontypes import JsonObject, JsonValue
from servelab.load import kind_of
from servelab.results import RequestRecord

ARRIVALS = ("poisson", "gamma", "constant")


@dataclass(frozen=True, slots=True)
class LevelSpec:
    """One load level: `concurrency` (closed loop), `rate` requests/s (open loop), or a `trace` replayed
    at its own `offsets` (seconds from level start, the trace's clock already ÷ `value`, its time scale)."""

    mode: str
    value: float
    num_requests: int | None = None
    duration_s: float | None = None
    max_concurrency: int | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    offsets: tuple[float, ...] = ()
    trace: str = ""  # the trace's format, for the label

    @property
    def label(self) -> str:
        if self.mode == "concurrency":
            return f"c={int(self.value)}"
        if self.mode == "trace":
            cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
            return f"trace {self.trace} ×{self.value:g}{cap}"
        cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
        return f"rate={self.value:g}/s{cap}"


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request serialized ahead of time so that sending it costs one socket write."""

    prompt_idx: int
    payload: bytes
    requested_output_tokens: int | None
    target_input_tokens: int | None
    prompt_text: str


def arrival_offsets(rate: float, n: int, arrival: str, burstiness: float, seed: int) -> list[float]:
    """Send times (seconds from level start) of `n` requests at `rate`/s.

    poisson: exponential gaps; gamma: gaps with shape `burstiness` (<1 burstier, >1 smoother) and
    the same mean; constant: evenly spaced. The first request goes at 0.
    """
    if rate <= 0:
        raise ValueError("rate must be positive")
    if n <= 0:
        return []
    mean_gap = 1.0 / rate
    if arrival == "constant":
        gaps = np.full(n - 1, mean_gap)
    else:
        shape = 1.0 if arrival == "poisson" else burstiness
        if shape <= 0:
            raise ValueError("burstiness must be positive")
        gen = np.random.default_rng(seed)
        gaps = gen.gamma(shape, mean_gap / shape, size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


@dataclass
class ClientMonitor:
    """Watches the client itself: CPU seconds, event-loop lag, lateness of scheduled sends.

    The lag ticker fires every 20 ms: a 10 ms one cost 1.7 % of a core (measured at 64k-token
    prompts, where levels wait long), and any stall longer than the period still delays a tick."""

    tick_s: float = 0.02
    lags: list[float] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)
    # Per send, the part of its lateness the kernel explains: time the loop's thread spent runnable but
    # off a CPU (Linux schedstat) since the last reading taken at or before the send's due time. On a
    # box whose other jobs take the cores, that is most of a late send; what remains is the client's
    # own loop (a slow send path, callbacks ahead of the send), the figure a client can be held to on a
    # busy machine.
    descheduled: list[float] = field(default_factory=list)
    _schedstat: int | None = None  # fd of /proc/thread-self/schedstat, None where the kernel has none
    # (perf_counter, run-queue ns) readings, oldest first. A send can fall due while the thread waits
    # in the run queue for an earlier one and go out overdue without waiting again itself: the wait
    # that delayed it was read before its own wait began, so each send looks back to its due time.
    _marks: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    _task: asyncio.Task[None] | None = None
    _cpu0: float = 0.0
    _wall0: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    stopped_early: str | None = None  # why an open loop stopped sending before its end

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.tick_s
            await asyncio.sleep(self.tick_s)
            self.lags.append(max(0.0, loop.time() - due))

    def start(self) -> None:
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter()
        with contextlib.suppress(OSError):  # opened on the loop's thread: its own counters
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        self._task = asyncio.get_running_loop().create_task(self._tick())

    def _run_queue_wait_ns(self) -> int:
        """Nanoseconds this thread has waited on a run queue (the second field), 0 without schedstat."""
        if self._schedstat is None:
            return 0
        return int(os.pread(self._schedstat, 64, 0).split()[1])

    def waiting_to_send(self) -> None:
        """The sender is about to wait for its next send's time: a reading run-queue wait counts from."""
        if self._schedstat is not None:
            self._marks.append((time.perf_counter(), self._run_queue_wait_ns()))

    def sent(self, due: float) -> None:
        """A send left at its time `due` (perf_counter): record how late, and how much of it the kernel
        explains: the run-queue wait since the newest reading at or before `due` (the oldest kept where
        none is that old), at most the whole lateness. Sends fall due in order, so older readings go."""
        now = time.perf_counter()
        late = max(0.0, now - due)
        self.lateness.append(late)
        if self._schedstat is None:
            return
        waited = self._run_queue_wait_ns()
        marks = self._marks
        while len(marks) > 1 and marks[1][0] <= due:
            marks.popleft()
        since = marks[0][1] if marks else waited
        self.descheduled.append(min(late, (waited - since) / 1e9))
        marks.append((now, waited))

    async def stop(self) -> None:
        self.cpu_s = time.process_time() - self._cpu0
        self.wall_s = time.perf_counter() - self._wall0
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None
        if self._task is not None:
            await tasks.stop(self._task)

    def summary(self, output_tokens: int, median_itl_ms: float | None) -> JsonObject:
        lags = np.asarray(self.lags or [0.0]) * 1000
        late = np.asarray(self.lateness or [0.0]) * 1000
        util = self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0
        lag_p99, late_p99 = float(np.percentile(lags, 99)), float(np.percentile(late, 99))
        out: JsonObject = {
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "cpu_utilization": util,
            "cpu_us_per_output_token": (self.cpu_s / output_tokens * 1e6) if output_tokens else None,
            "loop_lag_ms": {
                "p50": float(np.percentile(lags, 50)),
                "p99": lag_p99,
                "max": float(lags.max()),
            },
            "send_lateness_ms": _percentiles(late) if self.lateness else None,
            "send_lateness_own_ms": (
                _percentiles(late - np.asarray(self.descheduled) * 1000)
                if self.lateness and len(self.descheduled) == len(self.lateness)
                else None
            ),
        }
        warnings: list[JsonValue] = []
        if util > 0.85:
            warnings.append(
                f"the benchmark client used {util:.0%} of a CPU core: it may be the bottleneck, "
                "not the server; run it on a less loaded machine or lower the load"
            )
        lag_limit = max(5.0, 0.25 * median_itl_ms) if median_itl_ms else 5.0
        if lag_p99 > lag_limit:
            warnings.append(
                f"client event-loop lag p99 {lag_p99:.1f} ms exceeds "
                f"{lag_limit:.1f} ms: measured latencies include client delay"
            )
        if self.lateness and late_p99 > 10.0:
            warnings.append(
                f"requests were sent late (p99 {late_p99:.1f} ms behind schedule): "
                "the client could not keep the requested rate; latencies are still measured from "
                "the scheduled time"
            )
        out["client_bound"] = bool(warnings)
        out["warnings"] = warnings
        return out


def _percentiles(ms: np.ndarray) -> JsonObject:
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """While a level runs, the cyclic garbage collector skips every object made before it (imports,
    the prompt pool). A full collection of the ~44k objects a bench process holds takes ~32 ms here:
    one mid-level was a 40 ms late send at 50 requests/s. Objects still die by reference count."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def raise_fd_limit(need: int) -> None:
    """Each in-flight stream holds a socket: lift the soft open-file limit towards the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, need + 256)) if hard != resource.RLIM_INFINITY else max(soft, need + 256)
    if want > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


RecordFactory = Callable[[int, PreparedRequest, float, float | None, StreamResult], RequestRecord]
OnRecord = Callable[[RequestRecord], None]
# An open loop's live check: (requests sent, seconds since the level started, its send window) → why to
# stop sending now (over-saturated), or None.
Watch = Callable[[int, float, float], str | None]
WATCH_EVERY_S = 0.25


async def _one(
    client: Client,
    idx: int,
    req: PreparedRequest,
    due: float,
    t0: float,
    scheduled: float | None,
    make: RecordFactory,
    on_record: OnRecord,
    records: list[RequestRecord],
) -> None:
    res = await client.send(req.payload)
    rec = make(idx, req, due - t0, scheduled, res)
    if res.first_token_t is not None:
        rec.ttft_s = res.first_token_t - due
    if res.end_t is not None:
        rec.e2e_s = res.end_t - due
    records.append(rec)
    on_record(rec)


async def run_closed(
    client: Client,
    requests: list[PreparedRequest],
    spec: LevelSpec,
    make: RecordFactory,
    on_record: OnRecord,
    monitor: ClientMonitor,
) -> tuple[list[RequestRecord], float]:
    """`spec.value` workers, each sending its next request as soon as the previous one finishes."""
    records: list[RequestRecord] = []
    total = spec.num_requests
    counter = iter(range(10**12))
    t0 = time.perf_counter()
    deadline = t0 + spec.duration_s if spec.duration_s else None

    async def worker() -> None:
        while True:
            i = next(counter)
            if total is not None and i >= total:
                return
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                return
            await _one(client, i, requests[i % len(requests)], now, t0, None, make, on_record, records)

    workers = int(spec.value) if total is None else min(int(spec.value), total)
    await asyncio.gather(*(worker() for _ in range(max(1, workers))))
    return records, time.perf_counter() - t0


async def run_open(
    client: Client,
    requests: list[PreparedRequest],
    spec: LevelSpec,
    make: RecordFactory,
    on_record: OnRecord,
    monitor: ClientMonitor,
    seed: int,
    watch: Watch | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send on the schedule (a trace's own, or drawn at the rate) regardless of completions (optionally
    capped at max_concurrency). `watch` may stop the level early: sending stops, requests in flight are
    abandoned (not recorded), and `monitor.stopped_early` says why."""
    n = spec.num_requests
    if n is None:
        assert spec.duration_s is not None
        n = int(spec.value * spec.duration_s * 1.5) + 10  # generous; cut at the duration below
    if spec.mode == "trace":
        offsets = list(spec.offsets)
    else:
        offsets = arrival_offsets(spec.value, n, spec.arrival, spec.burstiness, seed)
    if spec.duration_s is not None:
        offsets = [o for o in offsets if o < spec.duration_s] or [0.0]
    sem = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[None]] = []
    t0 = time.perf_counter()

    async def capped(i: int, due: float, req: PreparedRequest, offset: float) -> None:
        assert sem is not None
        async with sem:
            await _one(client, i, req, due, t0, offset, make, on_record, records)

    loop = asyncio.get_running_loop()
    window = offsets[-1] if offsets else 0.0
    next_watch = t0 + WATCH_EVERY_S
    for i, offset in enumerate(offsets):
        due = t0 + offset
        while watch is not None and due > next_watch:
            await asyncio.sleep(max(0.0, next_watch - time.perf_counter()))
            next_watch += WATCH_EVERY_S
            why = watch(i, time.perf_counter() - t0, window)
            if why is not None:
                monitor.stopped_early = why
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                return records, time.perf_counter() - t0
        monitor.waiting_to_send()
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        monitor.sent(due)
        req = requests[i % len(requests)]
        coro = (
            capped(i, due, req, offset)
            if sem
            else _one(client, i, req, due, t0, offset, make, on_record, records)
        )
        tasks.append(loop.create_task(coro))
    await asyncio.gather(*tasks)
    return records, time.perf_counter() - t0


async def run_level(
    client: Client,
    requests: list[PreparedRequest],
    spec: LevelSpec,
    make: RecordFactory,
    on_record: OnRecord,
    seed: int = 0,
    watch: Watch | None = None,
) -> tuple[list[RequestRecord], float, ClientMonitor]:
    closed = kind_of(spec.mode).closed_loop
    in_flight = int(spec.value) if closed else (spec.max_concurrency or 4096)
    raise_fd_limit(in_flight)
    monitor = ClientMonitor()
    monitor.start()
    try:
        if closed:
            records, wall = await run_closed(client, requests, spec, make, on_record, monitor)
        else:
            records, wall = await run_open(client, requests, spec, make, on_record, monitor, seed, watch)
    finally:
        await monitor.stop()
    return records, wall, monitor


async def warmup(client: Client, requests: list[PreparedRequest], count: int, concurrency: int) -> int:
    """Unrecorded requests that open connections and warm caches; returns how many succeeded."""
    if count <= 0:
        return 0
    sem = asyncio.Semaphore(max(1, concurrency))
    ok = 0

    async def one(i: int) -> None:
        nonlocal ok
        async with sem:
            res = await client.send(requests[i % len(requests)].payload)
            ok += res.ok

    await asyncio.gather(*(one(i) for i in range(count)))
    return ok
