"""Drive the scheduler in virtual (model) time, without sockets: closed-loop clients, exact clocks.

Used by the unit tests and by `benchmarks/sim_capacity.py` to separate the scheduler's physics from
the HTTP path: the same scheduler, the same step prices, no wall clock.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass

from servelab.sim.scheduler import Scheduler, SimRequest


class _Sink:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def token(self, req: SimRequest) -> None:
        pass

    def finish(self, req: SimRequest, reason: str) -> None:
        self.done = True


@dataclass
class RequestTiming:
    rid: int
    ttft: float
    tpot: float
    e2e: float
    output_tokens: int
    reason: str


def closed_loop(
    sched: Scheduler,
    concurrency: int,
    requests_per_client: int,
    isl: int,
    osl: int,
    stagger: float = 0.0,
    max_steps: int = 5_000_000,
    client_delay: float = 0.0,
) -> list[RequestTiming]:
    """C clients, each sending `requests_per_client` requests back to back (fixed lengths).

    `stagger` spreads the first wave (client c sends at c × stagger); `client_delay` models one
    serial client process: it handles finished requests one at a time, `client_delay` seconds each,
    before resending (what a real benchmark client on a busy core does to a wave)."""
    sched.record = True
    now = 0.0
    rid = 0
    pending: list[tuple[float, int, int]] = []  # (send time, seq, client)
    for c in range(concurrency):
        heapq.heappush(pending, (c * stagger, c, c))
    left = [requests_per_client] * concurrency
    active: dict[int, tuple[SimRequest, int]] = {}
    out: list[RequestTiming] = []
    seq = concurrency
    for _ in range(max_steps):
        while pending and pending[0][0] <= now:
            t, _, client = heapq.heappop(pending)
            rid += 1
            req = SimRequest(rid, isl, osl, "length", _Sink())
            sched.add(req, t)
            active[rid] = (req, client)
            left[client] -= 1
        step = sched.plan(now)
        if step is None:
            times = [pending[0][0]] if pending else []
            if sched.waiting:
                times.append(sched.waiting[0].ready_at)
            if not times:
                break
            now = max(now, min(times))
            continue
        sched.complete(step)
        now = step.start + step.dt
        client_free = now
        for r_id in [k for k, (r, _) in active.items() if r.sink.done]:  # type: ignore[attr-defined]
            r, client = active.pop(r_id)
            times = r.token_times or []
            ttft = times[0] - r.arrival
            tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
            out.append(RequestTiming(r.rid, ttft, tpot, times[-1] - r.arrival, len(times), r.reason))
            if left[client] > 0:
                seq += 1
                client_free = max(client_free, times[-1] if times else now) + client_delay
                heapq.heappush(pending, (client_free, seq, client))
        if not active and not pending and not sched.waiting:
            break
    return out


def medians(results: list[RequestTiming], skip_first: int = 0) -> dict[str, float]:
    rs = sorted(results, key=lambda r: r.rid)[skip_first:]
    return {
        "ttft_ms": statistics.median(r.ttft for r in rs) * 1e3,
        "tpot_ms": statistics.median(r.tpot for r in rs) * 1e3,
        "n": len(rs),
    }
