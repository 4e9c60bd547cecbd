"""Agent operations that observe a host for `servelab status` and `servelab doctor`: what those commands
read on the machine itself, run there in one call and sent back as JSON (the control side adds its store
and probes the servers through port forwards). LocalHost.call runs the same functions in-process. Their
contracts are servelab.host.ops's."""

from __future__ import annotations

import socket

from servelab.agent import registry
from servelab.host import ops as h
from servelab.host.agent_op import NoArgs


def op_observe_host(state: registry.AgentState, req: h.ObserveRequest) -> h.Observed:
    """status's host-side half: servelab.host.observe.observe_host (GPUs, topology, units, leftovers, the log)."""
    from servelab.host.observe import observe_host

    return h.Observed.model_validate(observe_host(**req.model_dump()))


def op_doctor_facts(state: registry.AgentState, req: h.DoctorFactsRequest) -> h.DoctorFacts:
    """doctor's facts about this host (servelab.host.doctor.gather); `gpus`: a report the control side
    built already (a simulator's), else this host's own GPUs from `gpu_source`."""
    from servelab.host import doctor, topology
    from servelab.host import gpus as gpumod
    from servelab.host.observe import read_gpus

    rep = gpumod.GpuReport.from_dict(req.gpus) if req.gpus is not None else read_gpus(req.gpu_source)
    topo = topology.read() if not rep.source.startswith("sim:") else {}
    return h.DoctorFacts(hostname=socket.gethostname(), facts=doctor.gather(rep, topo).to_dict())


def op_observe_ready(state: registry.AgentState, req: NoArgs) -> str:
    """Nothing but the imports status needs here, ahead of the call (the control side is busy meanwhile):
    this host's name."""
    import servelab.host.observe  # noqa: F401

    return socket.gethostname()


OPS: dict[str, registry.Op] = dict(
    [
        h.OBSERVE_READY.entry(op_observe_ready),
        h.OBSERVE_HOST.entry(op_observe_host),
        h.DOCTOR_FACTS.entry(op_doctor_facts),
    ]
)
