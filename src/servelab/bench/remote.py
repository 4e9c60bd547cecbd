"""`[host] bench_from = "remote"`: a trial's benchmark runs on the remote host, next to the server, and
its numbers come back into the control machine's store.

The agent operation `bench` (servelab.agent.ops_bench) takes a `BenchConfig` (as JSON, on the agent's stdin: the API key with it,
never on a command line), with the URL the server has over there, and runs `run_bench` against a
throwaway SQLite store in the agent's workdir. It answers with the run read back by the store's own reader
(`BenchRepo.load` and `requests`), typed (`RemoteBench`, defined here: the answer both sides read), and deletes the throwaway store. The control side
(`bench_remote`) writes that run into its store through `BenchRepo`'s writers, with the same uid (a run
imported twice is found, not doubled), and hands the trial the `BenchResult` read back from there.

The path the run records: `via = "remote"`, `target` (the host), and `rtt_ms`, measured over there as the
benchmark client's own TCP connects to the server (`bench.probe.direct_path`): the client and the server
share the remote's loopback. Progress does not stream: the level's events come when it has finished.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter

from servelab.bench.config import BenchConfig
from servelab.bench.runner import BenchResult
from servelab.errors import NotFoundError
from servelab.events import BenchObserver, LevelFinished, RunFinished, RunStarted
from servelab.host.agent_op import AgentOp, Request
from servelab.host.transport import Host
from servelab.host.wire import rebuild_error
from servelab.results import NetPath, RequestRecord, Run
from servelab.store.bench import BenchRepo
from servelab.store.db import Store

# A level may take long; a dropped link is noticed by ssh's keep-alives (~10 s), not by this timeout.
BENCH_CALL_TIMEOUT_S = 24 * 3600.0


class RemoteBench(BaseModel):
    """What the `bench` operation answers: the stored run (None when it failed before storing one), each
    stored level's requests in the run's level order, and the error that stopped it (as `wire` sends one)."""

    model_config = ConfigDict(extra="forbid")

    run: Run | None = None
    requests: list[list[RequestRecord]] = []
    error: dict[str, Any] | None = None


class BenchRequest(Request):
    config: BenchConfig  # as JSON on the agent's stdin (the API key with it), its URL as seen over there


BENCH = AgentOp("bench", BenchRequest, TypeAdapter(RemoteBench))  # served by servelab.agent.ops_bench


def import_run(store: Store, run: Run, requests: list[list[RequestRecord]]) -> int:
    """`run` (read from another store) written into `store` with the same uid, its levels and requests;
    a run already there (imported before) is left as it is. The id of the run in `store`."""
    repo = BenchRepo(store)
    with contextlib.suppress(NotFoundError):
        there = repo.load(run.uid)
        if there.uid == run.uid:
            return there.id
    run_id, _ = repo.create_run(
        run.url,
        run.model,
        run.api,
        run.config,
        run.workload.dataset_hash,
        run.context,
        uid=run.uid,
        created_at=run.created_at,
    )
    repo.set_run_info(run_id, engine=run.context.engine, warnings=run.warnings)
    for level, records in zip(run.levels, requests, strict=True):
        level_id = repo.create_level(
            run_id,
            level.index,
            level.mode,
            level.value,
            mc if isinstance(mc := run.config.get("max_concurrency"), int) else None,
        )
        for rec in records:
            repo.add_request(level_id, rec)
        repo.finish_level(
            level_id, level.status, level.wall, level.server_metrics, level.client, series=level.wall_series
        )
    repo.finish_run(run_id, run.status, [lv.wall for lv in run.levels])
    return run_id


async def bench_remote(
    host: Host, cfg: BenchConfig, store: Store, observe: BenchObserver | None = None
) -> BenchResult:
    """`run_bench(cfg)` run on `host` (cfg.url as the server is reached there), stored in `store` here.
    Raises HostLost when the connection drops meanwhile, and the benchmark's own error when it failed
    (after storing what it had measured)."""
    notify: BenchObserver = observe or (lambda _e: None)
    if cfg.context.path.via is None:
        cfg = cfg.model_copy(
            update={
                "context": cfg.context.model_copy(update={"path": NetPath(via="remote", target=host.name)})
            }
        )
    got = await asyncio.to_thread(BENCH.call, host, BenchRequest(config=cfg), timeout=BENCH_CALL_TIMEOUT_S)
    if got.run is not None:
        import_run(store, got.run, got.requests)
    if got.error is not None:
        raise rebuild_error(got.error)
    if got.run is None:  # pragma: no cover - run_bench stores a run or raises
        raise NotFoundError(f"the benchmark on {host.name} stored no run")
    run = BenchRepo(store).load(got.run.uid)
    workload = run.workload.model_dump(mode="json")
    notify(RunStarted(run.uid, len(run.levels), workload, run.warnings, run.clock.time_base))
    for lv in run.levels:
        notify(LevelFinished(lv.index, lv.summary.label, lv.status, lv.client))
    notify(RunFinished(run.uid, run.status))
    return BenchResult(
        run.id,
        run.uid,
        run.status,
        list(run.levels),
        list(run.warnings),
        workload,
        run.capabilities,
        run.context,
    )
