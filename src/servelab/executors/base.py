"""The executor seam: `tune` asks an executor for a place to run each trial and runs the same trial pipeline
there. `local`: this machine, or the one SSH host of `[host] ssh`, one trial at a time. A cluster executor
(`executors/ray.py`) places trials on nodes by the GPUs their layout needs and runs several at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from servelab.errors import HostLost
from servelab.host import transport
from servelab.host.agent_op import NoArgs
from servelab.host.ops import PING, SHM_REMOVE_ORPHANED, ShmRequest
from servelab.host.processes import KilledProcess
from servelab.lifecycle.serving import sweep_orphans
from servelab.results import Node

__all__ = ["Capacity", "Executor", "LocalExecutor", "Placement"]


@dataclass
class Placement:
    """Where one trial runs. `host` None: this machine. `node`: the cluster node (None off a cluster);
    `bind`: the address its servers must listen on so the driver reaches them (None: the study's)."""

    host: transport.AgentHost | None
    node: Node | None = None
    bind: str | None = None

    def lost_node(self, exc: HostLost) -> bool:
        """Whether `exc` means this trial's node died (a finding about the node, re-run elsewhere) rather
        than the driver's own link going (the study is interrupted)."""
        return self.node is not None


class Executor(Protocol):
    kind: str
    parallel: bool  # several trials at once (a cluster), or one after another

    async def start(self) -> None: ...
    def capacity(self) -> int: ...
    def fits(self, gpus: int) -> str | None: ...
    def place(
        self, gpus: int, avoid: frozenset[str] = frozenset()
    ) -> contextlib.AbstractAsyncContextManager[Placement]: ...
    def sweep(self, marker_prefix: str) -> list[KilledProcess]: ...
    def close(self) -> None: ...


class LocalExecutor:
    """One box: this machine (`host` None) or an SSH host; trials run one after another."""

    kind = "local"
    parallel = False

    def __init__(self, host: transport.SshHost | None) -> None:
        self.host = host

    async def start(self) -> None:
        if self.host is not None:  # an unusable host fails before anything is stored
            await asyncio.to_thread(PING.call, self.host, NoArgs())

    def capacity(self) -> int:
        return 1

    def fits(self, gpus: int) -> str | None:
        return None  # the study's own check (host.num_gpus) already ran

    @contextlib.asynccontextmanager
    async def place(self, gpus: int, avoid: frozenset[str] = frozenset()) -> AsyncIterator[Placement]:
        yield Placement(self.host)

    def sweep(self, marker_prefix: str) -> list[KilledProcess]:
        swept = sweep_orphans(marker_prefix, host=self.host)
        if swept:  # what the killed servers left in /dev/shm, once nothing holds it
            if self.host is None:
                from servelab.host import shm

                shm.remove_orphaned(min_age_s=5)
            else:
                SHM_REMOVE_ORPHANED.call(self.host, ShmRequest(min_age_s=5))
        return swept

    def close(self) -> None:
        if self.host is not None:
            self.host.close()


class Capacity:
    """The cluster's GPUs as the driver hands them out: strictly first come, first served, so trials start
    in the study's predicted order (Ray then picks the node)."""

    def __init__(self, total: int) -> None:
        self.total = max(total, 1)
        self.free = self.total
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @contextlib.asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        n = max(1, min(n, self.total))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        self._grant()
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.free += n  # granted just as we were cancelled
            with contextlib.suppress(ValueError):
                self._waiters.remove((n, fut))
            self._grant()
            raise
        try:
            yield
        finally:
            self.free += n
            self._grant()

    def _grant(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.free:
            n, fut = self._waiters.popleft()
            if fut.cancelled():
                continue
            self.free -= n
            fut.set_result(None)
