"""The agent operations about the machine itself, as typed contracts (servelab.host.agent_op): who the agent
is, a file's bytes, ports, /dev/shm, GPU memory, and the host-side halves of `status` and `doctor`. The agent
serves them (servelab.agent.ops_core, ops_observe); the control side calls them through a Host."""

from __future__ import annotations

from pydantic import TypeAdapter

from servelab.host.agent_op import AgentOp, Answer, NoArgs, Request
from servelab.host.shm import ShmCleanup
from servelab.host.wire import READ_MAX
from servelab.jsontypes import JsonObject


class HelloRequest(Request):
    workdir: str | None = None  # where the agent keeps logs and throwaway stores (None: its default)


class Hello(Answer):
    version: str
    protocol: int
    hostname: str
    python: str
    pid: int
    uid: int
    workdir: str


class ReadRequest(Request):
    path: str
    offset: int = 0  # negative: from the end
    max_bytes: int = READ_MAX


class ReadAnswer(Answer):
    exists: bool
    data: str = ""  # base64
    size: int = 0
    offset: int = 0
    error: str | None = None  # why a missing file could not be read


class FreePortRequest(Request):
    host: str = "127.0.0.1"


class PortRequest(Request):
    host: str
    port: int


class PortOpenRequest(Request):
    host: str
    port: int
    timeout_s: float = 2.0


class ShmRequest(Request):
    min_age_s: float = 5.0


class ObserveRequest(Request):
    """servelab.host.observe.observe_host's arguments."""

    urls: list[str]
    units: list[str] | None = None
    log: str | None = None
    gpu_source: str | None = None
    telemetry_url: str | None = None
    telemetry: JsonObject | None = None  # a simulator's telemetry, fetched by the control side
    want_log_text: bool = False


class Observed(Answer):
    """The host-side half of `servelab status` (its sections as docs/cli/status.md documents them): JSON
    that status judges and shows as it came."""

    hostname: str
    gpus: JsonObject  # servelab.host.gpus.GpuReport.to_dict
    topology: JsonObject  # servelab.host.topology.read
    services: list[JsonObject]  # servelab.host.systemd.UnitState.to_dict
    services_note: str | None = None
    leftovers: JsonObject  # servelab.host.observe.leftovers
    log: JsonObject | None = None  # servelab.host.observe.read_log
    log_text: str = ""


class DoctorFactsRequest(Request):
    gpu_source: str | None = None
    gpus: JsonObject | None = None  # a GPU report the control side built already (a simulator's)


class DoctorFacts(Answer):
    hostname: str
    facts: JsonObject  # servelab.host.doctor.Facts.to_dict


HELLO = AgentOp("hello", HelloRequest, TypeAdapter(Hello))
PING: AgentOp[NoArgs, None] = AgentOp("ping", NoArgs, TypeAdapter(None))
READ = AgentOp("read", ReadRequest, TypeAdapter(ReadAnswer))
FREE_PORT = AgentOp("free_port", FreePortRequest, TypeAdapter(int))
PORT_IS_FREE = AgentOp("port_is_free", PortRequest, TypeAdapter(bool))
PORT_OPEN = AgentOp("port_open", PortOpenRequest, TypeAdapter(bool))
GPU_MEMORY: AgentOp[NoArgs, list[int] | None] = AgentOp("gpu_memory", NoArgs, TypeAdapter(list[int] | None))
SHM_REMOVE_ORPHANED = AgentOp("shm_remove_orphaned", ShmRequest, TypeAdapter(ShmCleanup))
OBSERVE_READY = AgentOp("observe_ready", NoArgs, TypeAdapter(str))  # the imports status needs; the hostname
OBSERVE_HOST = AgentOp("observe_host", ObserveRequest, TypeAdapter(Observed))
DOCTOR_FACTS = AgentOp("doctor_facts", DoctorFactsRequest, TypeAdapter(DoctorFacts))
