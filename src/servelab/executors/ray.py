"""Trials on a Ray cluster: each trial gets a Ray actor that holds the GPUs its layout needs on the node Ray
places it on, and the trial pipeline runs there through that actor exactly as over SSH.

Why an actor per trial and not a task that runs the whole trial: the driver writes every step into the
store as it happens (a study killed at any point resumes), and the node-side work is the servelab agent
(`python -m servelab.agent`) that already runs SSH hosts' servers. The actor starts one agent,
detached from the actor's process tree (`--detach`: Ray SIGKILLs a dying worker's children, which would
strand the servers), joined to the actor by its pipes: when the actor dies — the driver killed, the trial
cancelled, the node gone — the pipe ends and the agent tears down every server it launched.

Servers listen on the node's Ray address (the driver and the benchmark client reach them there); the
benchmark client runs on the node, next to the server, its records coming back to the driver's store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from servelab import __version__
from servelab.errors import ConfigError, HostError, HostLost, HostUnusable
from servelab.executors.base import Capacity, Placement
from servelab.host import transport, wire
from servelab.host.ops import SHM_REMOVE_ORPHANED, ShmRequest
from servelab.host.processes import KilledProcess
from servelab.host.wire import rebuild_error
from servelab.jsontypes import JsonObject
from servelab.lifecycle.serving import sweep_orphans
from servelab.results import Node

__all__ = ["NodeAgent", "RayExecutor", "RayHost"]

ADDRESS_ENV = "RAY_ADDRESS"
PLACE_CHECK_S = 5.0  # how often a trial waiting for a node checks that some live node can still take it
CALL_SLACK_S = 30.0  # over an agent call's own deadline, before its node counts as lost


@dataclass(frozen=True)
class NodeFacts:
    """Where an actor runs and which servelab its agent is: the driver checks the version and reaches the
    node's servers by these."""

    id: str
    address: str
    hostname: str
    gpu_ids: tuple[str, ...]
    python: str
    version: str | None  # the agent's `hello`, as it answered
    protocol: int | None
    pid: int


class NodeAgent:
    """The node-side half (a Ray actor): one detached servelab agent, requests relayed as JSON answers."""

    def __init__(self, workdir: str | None) -> None:
        self.channel = transport.AgentChannel.start(
            [sys.executable, "-m", wire.AGENT_MODULE, "--detach"], detached=True
        )
        try:
            hello = self.channel.request("hello", {"workdir": workdir}, 60)
        except transport.ChannelClosed as exc:
            raise HostError(
                f"the servelab agent did not start on this node: {exc.why}: {self.channel.stderr_text()[-300:]}"
            ) from None
        ctx = ray.get_runtime_context()
        self._facts = NodeFacts(
            id=ctx.get_node_id(),
            address=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            hostname=socket.gethostname(),
            gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()),
            python=sys.executable,
            version=hello.get("version"),
            protocol=hello.get("protocol"),
            pid=os.getpid(),
        )

    def facts(self) -> NodeFacts:
        return self._facts

    def call(self, op: str, args: JsonObject, timeout: float) -> JsonObject:
        """The agent's answer line as it came (`lost`: the agent's pipe ended)."""
        try:
            return self.channel.answer(op, args, timeout)
        except transport.ChannelClosed as exc:
            return {"ok": False, "lost": exc.why}

    def run(self, argv: list[str], input: bytes | None, timeout: float) -> transport.Completed:
        return transport.run_local(argv, input, timeout)

    def alive(self) -> bool:
        return self.channel.alive()

    def close(self) -> None:
        self.channel.close()


_REMOTE: Any = None


def _actor_class() -> Any:
    global _REMOTE
    if _REMOTE is None:
        _REMOTE = ray.remote(NodeAgent)
    return _REMOTE


class RayHost:
    """A Ray node, as the trial pipeline sees a machine: agent calls go through the trial's actor."""

    is_local = False

    def __init__(self, actor: Any, facts: NodeFacts) -> None:
        self.actor = actor
        self.node = Node(id=facts.id, address=facts.address, hostname=facts.hostname, gpu_ids=facts.gpu_ids)
        self.python = facts.python or "python3"
        self._lost: HostLost | None = None

    @property
    def name(self) -> str:
        return f"ray:{self.node.name}"

    def _get(self, ref: Any, timeout: float, doing: str) -> Any:
        if self._lost is not None:
            raise HostLost(self._lost.message, hint=self._lost.hint)
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise self._gone(f"no answer to {doing} within {timeout:g} s") from None
        except ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise self._gone(f"{type(exc).__name__}: {first[:300]}") from None

    def _gone(self, why: str) -> HostLost:
        self._lost = HostLost(
            f"Ray node {self.node.name} ({self.node.hostname}) was lost: {why}",
            hint="the trial runs again on another node; `ray status` shows the cluster",
        )
        return self._lost

    def call(self, op: str, **args: Any) -> Any:
        timeout = float(args.pop("_timeout", transport.CALL_TIMEOUT_S))
        answer = self._get(self.actor.call.remote(op, args, timeout), timeout + CALL_SLACK_S, op)
        if "lost" in answer:
            raise self._gone(f"its agent ended ({answer['lost']})")
        if answer.get("ok"):
            return answer.get("result")
        raise rebuild_error(answer.get("error") or {})

    def run(
        self, argv: list[str], *, input: bytes | None = None, timeout: float = 60.0
    ) -> transport.Completed:
        got: transport.Completed = self._get(
            self.actor.run.remote(argv, input, timeout), timeout + CALL_SLACK_S, argv[0]
        )
        return got

    def open_forward(self, host: str, port: int) -> tuple[str, int]:
        """Servers on a node listen on its Ray address: reached directly, no tunnel."""
        return (self.node.address if host in ("0.0.0.0", "", "::") else host, port)

    def close_forward(self, host: str, port: int) -> None:
        """Nothing to close: `open_forward` opened nothing."""

    @contextlib.contextmanager
    def forward(self, host: str, port: int) -> Iterator[tuple[str, int]]:
        yield self.open_forward(host, port)

    def usable(self) -> bool:
        """Not known to be lost (no call has failed)."""
        return self._lost is None

    def check(self) -> None:
        """HostLost when the node (or the agent on it) is gone."""
        if not self._get(self.actor.alive.remote(), 30, "a liveness check"):
            raise self._gone("its agent ended")

    def close(self) -> None:
        """End the agent (it tears down what it launched), then the actor; the GPUs go back to Ray."""
        if self._lost is None:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(self.actor.close.remote(), timeout=60)
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(self.actor, no_restart=True)


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


class RayExecutor:
    """A Ray cluster that this driver joins (`address`: `host:port` of its head, or "auto")."""

    kind = "ray"
    parallel = True

    def __init__(self, address: str | None, *, workdir: str | None = None) -> None:
        self.address = address or os.environ.get(ADDRESS_ENV) or "auto"
        self.workdir = workdir
        self._capacity: Capacity | None = None
        self._stdout: Any = None  # the real sys.stdout while Ray's threads run (see _connect)
        self._idle: list[RayHost] = []  # actors whose trial ended normally, kept for the next one
        self._creating = 0  # placements waiting for Ray to start their actor
        self._closing = False

    async def start(self) -> None:
        await asyncio.to_thread(self._connect)

    def _connect(self) -> None:
        if ray.is_initialized():
            return
        # Ray prints the cluster's error messages ("(raylet) The node ... has been marked dead") on
        # sys.stdout from a thread of its own; stdout is the command's (`--json`): they go to stderr.
        self._stdout = sys.stdout
        sys.stdout = sys.stderr
        try:
            ray.init(
                address=self.address,
                namespace="servelab",
                log_to_driver=False,
                logging_level=logging.ERROR,
                configure_logging=True,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise HostUnusable(
                f"cannot join the Ray cluster at {self.address}: {_short(exc)}",
                hint="start it (`ray start --head` on one node, `ray start --address HEAD:PORT` on the others) "
                "and pass its address: `--ray-address HOST:PORT` or [executor] address",
            ) from None
        if not self.nodes():
            raise HostUnusable(
                f"the Ray cluster at {self.address} has no live node with a GPU",
                hint="start nodes with `ray start ... --num-gpus N`; `ray status` shows what it has",
            )

    def nodes(self) -> list[tuple[str, int]]:
        """(node id, GPUs) of every live node that has GPUs."""
        out = []
        for n in ray.nodes():  # type: ignore[no-untyped-call]
            gpus = int(n.get("Resources", {}).get("GPU", 0))
            if n.get("Alive") and gpus > 0:
                out.append((str(n["NodeID"]), gpus))
        return out

    def capacity(self) -> int:
        return sum(g for _, g in self.nodes())

    def fits(self, gpus: int) -> str | None:
        """None when some live node has `gpus` GPUs; else why the trial cannot be placed."""
        nodes = self.nodes()
        if any(g >= gpus for _, g in nodes):
            return None
        most = max((g for _, g in nodes), default=0)
        return (
            f"the layout needs {gpus} GPUs on one node; the largest live node of the Ray cluster has {most}"
        )

    def gate(self) -> Capacity:
        if self._capacity is None:
            self._capacity = Capacity(self.capacity())
        return self._capacity

    @contextlib.asynccontextmanager
    async def place(self, gpus: int, avoid: frozenset[str] = frozenset()) -> AsyncIterator[Placement]:
        """An actor holding `gpus` GPUs on one node, preferring a node not in `avoid` (the nodes this
        candidate's earlier repeats ran on) when one that fits is alive. HostLost when the node dies before
        the actor is up (the caller places again).

        A trial that ended normally leaves its actor idle, GPUs and agent kept, for the next trial of the
        same size: starting a Ray worker and an agent costs seconds, a trial's placement then milliseconds.
        Idle actors are ended before any new one is asked for (they would hold the GPUs it waits for)."""
        gpus = max(gpus, 1)
        async with self.gate().hold(gpus):
            host = await self._reuse(gpus, avoid)
            if host is None:
                await self._drop_idle()
                self._creating += 1
                try:
                    host = await self._create(gpus, avoid)
                finally:
                    self._creating -= 1
            ended = False
            try:
                yield Placement(host, host.node, bind=host.node.address)
                ended = True
            finally:
                if ended and host.usable() and self._creating == 0 and not self._closing:
                    self._idle.append(host)
                else:
                    await asyncio.to_thread(host.close)

    async def _reuse(self, gpus: int, avoid: frozenset[str]) -> RayHost | None:
        """An idle actor of this size, on a node not in `avoid` when a live node outside it could take the
        trial (None: a new one is needed)."""
        elsewhere = bool(avoid) and any(g >= gpus and nid not in avoid for nid, g in self.nodes())
        for h in list(self._idle):
            if len(h.node.gpu_ids) != gpus or (elsewhere and h.node.id in avoid):
                continue
            self._idle.remove(h)
            try:
                await asyncio.to_thread(h.check)
            except HostLost:
                await asyncio.to_thread(h.close)
                continue
            return h
        return None

    async def _drop_idle(self) -> None:
        while self._idle:
            await asyncio.to_thread(self._idle.pop().close)

    async def _create(self, gpus: int, avoid: frozenset[str]) -> RayHost:
        opts: dict[str, object] = {"num_gpus": gpus, "num_cpus": 0, "max_restarts": 0}
        other = [nid for nid, g in self.nodes() if g >= gpus and nid not in avoid]
        if avoid and other:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(other[0], soft=False)
        actor = _actor_class().options(**opts).remote(self.workdir)
        try:
            facts = await self._placed(actor, gpus)
        except BaseException:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(actor, no_restart=True)
            raise
        if facts.version != __version__ or facts.protocol != wire.PROTOCOL:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(actor, no_restart=True)
            raise HostUnusable(
                f"Ray node {facts.address} runs servelab {facts.version}; this is {__version__}",
                hint="install the same servelab version on every node of the cluster",
            )
        return RayHost(actor, facts)

    async def _placed(self, actor: Any, gpus: int) -> NodeFacts:
        """The actor's node facts once Ray has placed and started it; ConfigError when no live node can
        take it any more (it would wait for ever), HostLost when its node died first."""
        ref = actor.facts.remote()
        t0 = time.monotonic()
        while True:
            try:
                facts: NodeFacts = await asyncio.wait_for(asyncio.shield(_awaitable(ref)), PLACE_CHECK_S)
                return facts
            except TimeoutError:
                why = self.fits(gpus)
                if why is not None:
                    raise ConfigError(
                        why, hint="add a node with enough GPUs, or drop the candidate"
                    ) from None
            except ray.exceptions.RayError as exc:
                raise HostLost(
                    f"the node Ray chose for the trial was lost before the trial started ({_short(exc)})",
                    hint="the trial is placed again",
                ) from None
            if time.monotonic() - t0 > 3600:
                raise HostError(
                    "no Ray node took the trial within an hour", hint="`ray status` shows the cluster"
                )

    def sweep(self, marker_prefix: str) -> list[KilledProcess]:
        """An interrupted run's leftovers on every live node (each node's agent runs the marker sweep)."""
        out: list[KilledProcess] = []
        for n in ray.nodes():  # type: ignore[no-untyped-call]
            if not n.get("Alive"):
                continue
            strategy = NodeAffinitySchedulingStrategy(str(n["NodeID"]), soft=False)
            actor = (
                _actor_class()
                .options(num_cpus=0, num_gpus=0, scheduling_strategy=strategy)
                .remote(self.workdir)
            )
            try:
                host = RayHost(actor, ray.get(actor.facts.remote(), timeout=120))
                swept = sweep_orphans(marker_prefix, host=host)
                if swept:
                    SHM_REMOVE_ORPHANED.call(host, ShmRequest(min_age_s=5))
                out += swept
            except ray.exceptions.RayError:
                continue  # a node that died meanwhile has nothing of ours left running
            finally:
                with contextlib.suppress(ray.exceptions.RayError, ValueError):
                    ray.get(actor.close.remote(), timeout=60)
                    ray.kill(actor, no_restart=True)
        return out

    def close(self) -> None:
        self._closing = True
        while self._idle:
            self._idle.pop().close()
        if ray.is_initialized():
            ray.shutdown()
        if self._stdout is not None:
            sys.stdout, self._stdout = self._stdout, None


async def _awaitable(ref: Any) -> Any:
    return await ref
