"""Saturation of an open-loop level (`--rate`, or a `--trace` replayed at its timestamps): did the server
(or the client) keep up with the arrival rate?

A server that cannot keep up does not have a steady state: its queue grows for as long as the level
lasts, and the latencies measured are those of that queue at the moment the level ended (a longer
level would have reported worse ones). Pure functions over the records the client wrote and the
`/metrics` samples taken during the level; `detect` gives the stored verdict, `early_stop` the live
one that stops a probe which is clearly over-saturated.

Signals (each stated with its numbers in `Saturation.reasons`):
- completions fall behind arrivals: over the second half of the send window the server completed
  fewer than 80 % of the requests sent, by more than three Poisson standard deviations;
- TTFT rises linearly with the scheduled send time: the least-squares slope is significant (t > 5)
  and the rise over the window is more than the level's early TTFT (it at least doubled);
- the queue (`requests_waiting` in the /metrics samples) grows: significant positive slope, and its
  last value is above 4 and twice its first half's mean;
- the client could not keep up: send lateness p99 above max(10 ms, a quarter of the mean gap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from servelab.results import RequestRecord, Saturation

COMPLETION_RATIO = 0.8
SLOPE_T = 5.0
QUEUE_MIN = 4.0


def slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares slope of ys on xs and its t statistic (None: fewer than 8 points or no spread)."""
    if len(xs) < 8:
        return None
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    dx = x - x.mean()
    sxx = float((dx * dx).sum())
    if sxx <= 0:
        return None
    b = float((dx * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - b * dx
    dof = len(x) - 2
    se = math.sqrt(float((resid * resid).sum()) / dof / sxx)
    t = b / se if se > 0 else (math.inf if b > 0 else -math.inf if b < 0 else 0.0)
    return b, t


def _ttft_rise(records: Sequence[RequestRecord]) -> tuple[float | None, float | None, str | None]:
    pts = sorted((r.start_s, r.ttft_s) for r in records if r.ok and r.ttft_s is not None)
    fit = slope([p[0] for p in pts], [p[1] for p in pts])
    if fit is None:
        return None, None, None
    b, t = fit
    span = pts[-1][0] - pts[0][0]
    early = float(np.median([p[1] for p in pts[: max(1, len(pts) // 4)]]))
    rise = b * span
    if t > SLOPE_T and rise > max(early, 1e-3):
        return (
            b,
            t,
            f"TTFT rose linearly with the send time: +{rise * 1000:,.0f} ms over {span:.1f} s "
            f"({b * 1000:,.1f} ms/s, t={t:.1f}) from {early * 1000:,.0f} ms at the start",
        )
    return b, t, None


def _completions(
    records: Sequence[RequestRecord], window_end: float | None = None
) -> tuple[float | None, float | None, str | None]:
    """Sent and completed per second over the second half of the send window."""
    sends = sorted(r.start_s for r in records)
    if len(sends) < 20:
        return None, None, None
    end = window_end if window_end is not None else sends[-1]
    half = end / 2
    if half <= 0:
        return None, None, None
    sent = sum(1 for s in sends if half <= s <= end)
    done = sum(1 for r in records if r.end_s is not None and half <= r.end_s <= end)
    arrival, completion = sent / half, done / half
    if sent >= 10 and done < COMPLETION_RATIO * sent and sent - done > 3 * math.sqrt(sent):
        return (
            arrival,
            completion,
            f"completions fell behind arrivals: {completion:.2f}/s completed against {arrival:.2f}/s "
            f"sent over the second half of the send window",
        )
    return arrival, completion, None


def _queue(
    samples: Sequence[dict[str, float]], interval_s: float
) -> tuple[float | None, float | None, str | None]:
    waiting = [s["requests_waiting"] for s in samples if "requests_waiting" in s]
    if not waiting:
        return None, None, None
    last = waiting[-1]
    fit = slope([i * interval_s for i in range(len(waiting))], waiting)
    if fit is None:
        return None, last, None
    b, t = fit
    first = float(np.mean(waiting[: len(waiting) // 2]))
    if t > SLOPE_T and b > 0 and last > max(QUEUE_MIN, 2 * first):
        return (
            b,
            last,
            f"the server's queue grew without bound: {last:.0f} waiting at the end, "
            f"+{b:.1f}/s (t={t:.1f}) in the /metrics samples",
        )
    return b, last, None


def asked_rate(mode: str, value: float, records: Sequence[RequestRecord]) -> float:
    """The requests/s an open-loop level asked for: a `rate` level's own; a trace's mean over the sends
    it scheduled (its timestamps ÷ the time scale, cut by --duration), from first to last."""
    if mode == "rate":
        return value
    sends = sorted(r.scheduled_s if r.scheduled_s is not None else r.start_s for r in records)
    span = sends[-1] - sends[0] if sends else 0.0
    return (len(sends) - 1) / span if span > 0 else 0.0


def detect(
    records: Sequence[RequestRecord],
    rate: float,
    samples: Sequence[dict[str, float]] = (),
    interval_s: float = 1.0,
    lateness_s: Sequence[float] = (),
    stopped_early: str | None = None,
    descheduled_s: Sequence[float] = (),
) -> Saturation:
    """The stored verdict of one open-loop level at `rate` requests/s (client clock; a trace's mean rate,
    `asked_rate`): `rate` sets only the client's lateness limit, a quarter of the mean gap.

    `descheduled_s`, beside `lateness_s` send by send: the part of each send's lateness the kernel
    explains (its thread waited on a run queue: `ClientMonitor.descheduled`). The client could not keep
    up when its own part is over the limit; sends held back by the box's other jobs are not the
    client's verdict (the client block's warnings still say the sends were late)."""
    b, t, ttft_why = _ttft_rise(records)
    arrival, completion, done_why = _completions(records)
    qb, qlast, queue_why = _queue(samples, interval_s)
    server = [w for w in (done_why, ttft_why, queue_why) if w]
    late = np.asarray(lateness_s, dtype=float) * 1000
    late_p99 = float(np.percentile(late, 99)) if len(late) else None
    own_p99 = late_p99
    if len(late) and len(descheduled_s) == len(late):
        own_p99 = float(np.percentile(late - np.asarray(descheduled_s, dtype=float) * 1000, 99))
    limit = max(10.0, 250.0 / rate) if rate > 0 else 10.0
    client = []
    if own_p99 is not None and late_p99 is not None and own_p99 > limit:
        client.append(
            f"the client sent late (p99 {own_p99:.1f} ms behind schedule of its own, {late_p99:.1f} ms "
            f"in all; limit {limit:.1f} ms): it could not keep the requested rate"
        )
    if stopped_early:
        server.insert(0, f"stopped early: {stopped_early}")
    return Saturation(
        server_saturated=bool(server),
        client_saturated=bool(client),
        reasons=server + client,
        arrival_rate=arrival,
        completion_rate=completion,
        ttft_slope=b,
        ttft_slope_t=t if t is None or math.isfinite(t) else 1e9,
        queue_slope=qb,
        queue_last=qlast,
        send_lateness_p99_ms=late_p99,
        send_lateness_own_p99_ms=own_p99,
        stopped_early=stopped_early,
    )


def early_stop(records: Sequence[RequestRecord], sent: int, elapsed_s: float, window_s: float) -> str | None:
    """Why a running open-loop level is clearly over-saturated (None: let it run). Only after 30 % of
    its send window `window_s` and 20 completions, and only when both the TTFT rise and the backlog
    say so: the requests still outstanding are more than twice those completed in the last half."""
    if elapsed_s < 0.3 * window_s or len(records) < 20:
        return None
    _, _, ttft_why = _ttft_rise(records)
    if ttft_why is None:
        return None
    recent = sum(1 for r in records if r.end_s is not None and r.end_s >= elapsed_s / 2)
    outstanding = sent - len(records)
    if outstanding > 2 * max(recent, 1):
        return f"{outstanding} requests outstanding after {elapsed_s:.1f} s, {recent} completed in its second half; {ttft_why}"
    return None
