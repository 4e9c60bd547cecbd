"""The agent operation `bench` of `[host] bench_from = "remote"`: the benchmark run next to the server, into
a throwaway store here, its run answered typed (servelab.bench.remote.RemoteBench; the control side that
imports it is servelab.bench.remote.bench_remote). The benchmark's rooms are imported by the operation itself:
the agent's start (its `hello`) stays light."""

from __future__ import annotations

import asyncio
import contextlib
import select
import uuid
from typing import TYPE_CHECKING, Any

from servelab.agent import registry
from servelab.errors import Interrupted, NotFoundError, ServelabError
from servelab.host.wire import error_payload
from servelab.jsontypes import JsonObject

if TYPE_CHECKING:
    from servelab.bench.config import BenchConfig
    from servelab.bench.remote import BenchRequest, RemoteBench
    from servelab.results import Run
    from servelab.store.db import Store

HANGUP_POLL_S = 0.5


def op_bench(state: registry.AgentState, **args: Any) -> Any:
    """The contract (servelab.bench.remote.BENCH) imported with the benchmark, at the first call."""
    from servelab.bench.remote import BENCH

    return BENCH.serve(bench)(state, **args)


def bench(state: registry.AgentState, req: BenchRequest) -> RemoteBench:
    from servelab.bench.probe import direct_path
    from servelab.bench.remote import RemoteBench
    from servelab.store.bench import BenchRepo
    from servelab.store.db import open_store

    cfg = req.config
    rtt = asyncio.run(direct_path(cfg.url)).rtt_ms
    path = cfg.context.path.model_copy(update={"via": cfg.context.path.via or "remote", "rtt_ms": rtt})
    cfg = cfg.model_copy(update={"context": cfg.context.model_copy(update={"path": path})})
    folder = registry.workdir(state) / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / f"bench-{uuid.uuid4().hex[:12]}.db"
    store = open_store(db)
    error: JsonObject | None = None
    try:
        try:
            asyncio.run(_bench_while_driven(cfg, store, state.stdin_fd))
        except ServelabError as exc:  # the run (if one was stored) still comes back, marked failed
            error = error_payload(exc)
        repo = BenchRepo(store)
        try:
            run: Run | None = repo.load("last")
        except NotFoundError:
            run = None
        requests = []
        if run is not None:
            ids = repo.level_ids(run.id)
            requests = [repo.requests(ids[lv.index]) for lv in run.levels]
        return RemoteBench(run=run, requests=requests, error=error)
    finally:
        store.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                db.with_name(db.name + suffix).unlink()


async def _bench_while_driven(cfg: BenchConfig, store: Store, fd: int | None) -> None:
    """`run_bench`, stopped (its run marked interrupted) when the driver's end of the request pipe closes:
    a dropped link must not leave the client loading the server for the rest of the level. Nothing else
    is read from the pipe meanwhile (the driver sends nothing while it waits for this answer)."""
    from servelab.bench.runner import run_bench

    task = asyncio.ensure_future(run_bench(cfg, store))
    if fd is None:
        await task
        return
    poller = select.poll()
    poller.register(fd, getattr(select, "POLLRDHUP", 0))  # POLLHUP/POLLERR are always reported

    async def watch() -> None:
        while not poller.poll(0):
            await asyncio.sleep(HANGUP_POLL_S)
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        await task
    except asyncio.CancelledError:  # stopped before a run was stored (its probe)
        raise Interrupted("the driver's connection closed during the benchmark") from None
    finally:
        watcher.cancel()


OPS: dict[str, registry.Op] = {"bench": op_bench}
