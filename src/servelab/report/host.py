"""What `servelab doctor` finds on this machine, for the report's Host section (when the host checks exist).

A study records the host it declared; the machine writing the report may be a different one, so the report
says "this machine when the report was written" beside these findings.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from servelab.host.agent_op import AgentOp, Answer, NoArgs
from servelab.jsontypes import JsonObject


class HostFacts(Answer):
    """`gather()` of a remote host and its name (the agent op `host_facts`); it keeps the keys it was given
    (no `topology` when the checks failed), so the report reads the same from either."""

    summary: str
    checks: list[Any]
    note: str
    topology: Any = None
    hostname: str


HOST_FACTS: AgentOp[NoArgs, HostFacts | None] = AgentOp(
    "host_facts", NoArgs, TypeAdapter(HostFacts | None), exclude_unset=True
)


def gather() -> JsonObject | None:
    """Doctor findings and the GPU topology summary of this machine; None when the checks are not installed."""
    try:
        from servelab.host import doctor, gpus, topology
    except ImportError:
        return None
    try:
        rep = gpus.read_local()
        topo = topology.read()
        result = doctor.report(doctor.gather(rep, topo))
    except Exception as exc:  # a check that breaks must not take the report down with it
        return {"summary": "the host checks failed", "checks": [], "note": f"{type(exc).__name__}: {exc}"}
    g = result.gpus
    summary = f"{g.count} GPU(s) via {g.source}; worst check: {result.worst}"
    note = g.note
    topo_summary = topo.get("summary") if isinstance(topo, dict) else None
    if not topo_summary and isinstance(topo, dict) and topo.get("note"):
        note = f"{note}; {topo['note']}" if note else str(topo["note"])
    return {
        "summary": summary,
        "checks": [c.to_dict() for c in result.checks],
        "note": note,
        "topology": topo_summary,
    }
