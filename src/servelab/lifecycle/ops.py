"""The agent operations of a server's life on another host, as typed contracts (servelab.host.agent_op):
launch, poll, the /dev/shm record, port owners, a line in its log, teardown, and the orphan sweep. The agent
serves them by running `lifecycle.local` over there (servelab.agent.ops_core); `lifecycle.remote` and
`lifecycle.serving` call them."""

from __future__ import annotations

from pydantic import TypeAdapter

from servelab.engines.base import LaunchSpec
from servelab.host.agent_op import AgentOp, Answer, Request
from servelab.host.ports import Listener
from servelab.host.processes import KilledProcess
from servelab.lifecycle.handle import TeardownReport


class LaunchRequest(Request):
    spec: LaunchSpec  # the environment (API keys included) travels on the agent's stdin
    log_name: str  # a file name in the agent's log directory
    marker: str
    cpus: list[int] | None = None
    check_port: bool = True


class Launched(Answer):
    pid: int
    started_at: float
    log_path: str  # over there
    gpu_baseline_mib: list[int] | None = None


class MarkerRequest(Request):
    marker: str


class PollRequest(Request):
    marker: str
    offset: int = 0  # bytes of the log the caller has


class LogChunk(Answer):
    """The server's log written since the caller's offset (base64), and the offset after it."""

    log: str
    offset: int


class Polled(LogChunk):
    rc: int | None  # the leader's exit code (None: it runs)


class PortOwners(Answer):
    ours: list[Listener]
    foreign: list[Listener]


class AppendLogRequest(Request):
    marker: str
    text: str


class TeardownRequest(Request):
    marker: str
    grace_s: float = 15.0
    offset: int = 0


class TornDown(LogChunk):
    report: TeardownReport


class SweepRequest(Request):
    prefix: str
    grace_s: float = 5.0


LAUNCH = AgentOp("launch", LaunchRequest, TypeAdapter(Launched))
POLL = AgentOp("poll", PollRequest, TypeAdapter(Polled))
RECORD_SHM: AgentOp[MarkerRequest, None] = AgentOp("record_shm", MarkerRequest, TypeAdapter(None))
PORT_OWNERS = AgentOp("port_owners", MarkerRequest, TypeAdapter(PortOwners))
APPEND_LOG: AgentOp[AppendLogRequest, None] = AgentOp("append_log", AppendLogRequest, TypeAdapter(None))
TEARDOWN = AgentOp("teardown", TeardownRequest, TypeAdapter(TornDown))
SWEEP = AgentOp("sweep", SweepRequest, TypeAdapter(list[KilledProcess]))
