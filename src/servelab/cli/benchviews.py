"""`servelab bench`'s human views of a capacity search and of a sessions level (the run's JSON as it is
stored: `CapacityResult`, `SessionStats`)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from servelab.cli.output import printable, stdout
from servelab.results import CapacityResult, SessionsSummary


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def render_capacity(cap: CapacityResult) -> None:
    """The search's answer, its uncertainty and the curve it walked."""
    unit = "streams" if cap.by == "concurrency" else "requests/s"
    ok, bad = cap.bracket
    table = Table(title=f"capacity search by {cap.by} under {cap.slo}", title_justify="left")
    for c in ("probe", "load", "verdict", *cap.probes[0].values.keys(), "why") if cap.probes else ():
        table.add_column(c, justify="left" if c in ("verdict", "why") else "right")
    for i, p in enumerate(cap.probes):
        vals = [_fmt(v) for v in p.values.values()]
        verdict = "pass" if p.passed else ("fail (stopped early)" if p.stopped_early else "fail")
        table.add_row(str(i + 1), f"{p.load:g}", verdict, *vals, printable("; ".join(p.reasons)[:120]))
    if cap.probes:
        stdout.print(table)
    if cap.capacity is None:
        stdout.print(f"[red]capacity: none: {escape(cap.stop_reason)}[/red]")
    else:
        upper = f"{bad:g}" if bad is not None else "not found"
        step = f", step {cap.step:g}" if cap.step is not None else ""
        stdout.print(
            f"[bold]capacity: {cap.capacity:g} {unit}[/bold] (passed {ok:g}, failed {upper}{step}; "
            f"resolution {cap.resolution:.0%}) after {len(cap.probes)} probes; stopped: "
            f"{escape(cap.stop_reason)}"
        )
    if cap.by == "rate" and cap.speed != 1:
        stdout.print(f"rates are the client's; the simulated GPU's are ÷{cap.speed:g}")
    if cap.non_monotonic:
        stdout.print(
            "[yellow]non-monotonic: "
            + ", ".join(f"{v:g}" for v in cap.non_monotonic)
            + " passed above a failed load (noise); the capacity is the highest pass below every failure[/yellow]"
        )
    stdout.print(f"each probe's verdict leaves out its first {cap.warmup_fraction:.0%} of requests (warm-up)")


def render_sessions(label: str, ss: SessionsSummary) -> None:
    """A sessions level by turn index: how the prompt grew and what it did to TTFT."""
    table = Table(title=f"{label} sessions by turn", title_justify="left")
    for c in ("turn", "ok/fail", "mean input tok", "mean output tok", "TTFT p50", "TTFT p99"):
        table.add_column(c, justify="right")
    for t in ss.per_turn:
        table.add_row(
            str(t.turn),
            f"{t.completed}/{t.failed}",
            _fmt(t.mean_input_tokens, 0),
            _fmt(t.mean_output_tokens, 0),
            _fmt(t.ttft_ms.p50),
            _fmt(t.ttft_ms.p99),
        )
    stdout.print(table)
    dur = ss.session_duration_s
    rate = ss.cache_hit_rate
    stdout.print(
        f"{label}: {ss.sessions_completed}/{ss.sessions} sessions completed, turns "
        f"{ss.turns_completed} ok / {ss.turns_failed} failed / {ss.turns_not_sent} not sent; "
        f"session duration p50 {_fmt(dur.p50, 2)} s, p99 {_fmt(dur.p99, 2)} s; "
        + ("server prefix-cache hit rate " + (f"{rate:.1%}" if rate is not None else "not reported")),
        markup=False,
    )
