"""Agent operations that observe a host for `servelab status` and `servelab doctor`: what those commands
read on the machine itself, run there in one call and sent back as JSON (the control side adds its store
and probes the servers through port forwards). LocalHost.call runs the same functions in-process."""

from __future__ import annotations

from typing import Any

from servelab.agent import registry


def op_observe_host(state: registry.AgentState, **kwargs: Any) -> dict[str, Any]:
    """status's host-side half: servelab.host.observe.observe_host (GPUs, topology, units, leftovers, the log)."""
    from servelab.host.observe import observe_host

    return observe_host(**kwargs)


def op_doctor_facts(
    state: registry.AgentState,
    gpu_source: str | None = None,
    gpus: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """doctor's facts about this host (servelab.host.doctor.gather); `gpus`: a report the control side
    built already (a simulator's), else this host's own GPUs from `gpu_source`."""
    import socket

    from servelab.host import doctor, topology
    from servelab.host import gpus as gpumod
    from servelab.host.observe import read_gpus

    rep = gpumod.GpuReport.from_dict(gpus) if gpus is not None else read_gpus(gpu_source)
    topo = topology.read() if not rep.source.startswith("sim:") else {}
    return {"hostname": socket.gethostname(), "facts": doctor.gather(rep, topo).to_dict()}


def op_observe_ready(state: registry.AgentState) -> str:
    """Nothing but the imports status needs here, ahead of the call (the control side is busy meanwhile):
    this host's name."""
    import socket

    import servelab.host.observe  # noqa: F401

    return socket.gethostname()


OPS: dict[str, registry.Op] = {
    "observe_ready": op_observe_ready,
    "observe_host": op_observe_host,
    "doctor_facts": op_doctor_facts,
}
