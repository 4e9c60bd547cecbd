"""Measure: `bench` (a running server, level by level, within the server's caps) and `runs_show` (a stored
run), each its command run as a child."""

from __future__ import annotations

from servelab import arguments as A
from servelab.errors import ConfigError
from servelab.mcp import models as M
from servelab.mcp.base import Group, Options, as_tool_errors, call, flags
from servelab.mcp.studies import Studies


def check_bench(opts: Options, levels: list[int], num_requests: int | None, duration: float | None) -> None:
    """A bench call within the server's caps: so many levels, so many streams, a level's requests and
    seconds; an argument over its cap is an error naming it, the cap and the option that raises it."""
    over = [
        ("concurrency", f"{len(levels)} levels", len(levels) > opts.bench_max_levels,
         f"{opts.bench_max_levels} levels", "--bench-max-levels N"),
        ("concurrency", f"{max(levels)} streams", max(levels) > opts.bench_max_concurrency,
         f"{opts.bench_max_concurrency}", "--bench-max-concurrency N"),
        ("num_requests", f"{num_requests}", (num_requests or 0) > opts.bench_max_requests,
         f"{opts.bench_max_requests}", "--bench-max-requests N"),
        ("duration", f"{duration or 0:g} s", (duration or 0) > opts.bench_max_duration_s,
         f"{opts.bench_max_duration_s:g} s", "--bench-max-duration S"),
    ]  # fmt: skip
    for name, value, bad, cap, option in over:
        if bad:
            raise ConfigError(
                f"{name}: {value} is above this server's cap of {cap}",
                hint=f"ask for less, or start `servelab mcp {option}`",
            )


def group(opts: Options, runs: Studies) -> Group:
    async def bench(
        url: A.ServerUrl,
        model: A.ServedModel,
        concurrency: A.Concurrency = None,
        num_requests: A.NumRequests = None,
        duration: A.Duration = None,
        input_len: A.InputLen = None,
        output_len: A.OutputLen = None,
        api: A.Api = None,
        slo: A.Slo = None,
        seed: A.Seed = None,
    ) -> M.BenchView:
        """Benchmark a running server, level by level; the call is bounded by the server's caps (levels,
        concurrency, a level's requests and duration)."""
        levels = concurrency or [1]
        with as_tool_errors():
            check_bench(opts, levels, num_requests, duration)
        if num_requests is None and duration is None:
            num_requests = min(opts.bench_max_requests, 50)
        args = flags(
            url=url,
            model=model,
            num_requests=num_requests,
            duration=duration,
            input_len=input_len,
            output_len=output_len,
            api=api,
            slo=slo,
            seed=seed,
        )
        args += ["--concurrency", ",".join(str(c) for c in levels)]
        return await call(M.BenchView, ["bench", *args])

    async def runs_show(
        run: A.BenchRun = "last",
    ) -> M.RunView:
        """One stored bench run with every level, as `servelab runs show` prints it."""
        return await call(M.RunView, ["runs", "show", run])

    return Group([bench, runs_show])
