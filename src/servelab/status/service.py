"""The service: `observe`, everything `servelab status` reports about one Host, and `diagnose_host`,
`servelab doctor` about one; each composes the probes, the store's reads and the judgement."""

from __future__ import annotations

import time

from servelab.host import gpus as gpumod
from servelab.host.observe import leftovers as host_leftovers
from servelab.host.ops import DOCTOR_FACTS, OBSERVE_HOST, DoctorFactsRequest, ObserveRequest
from servelab.host.transport import Host
from servelab.jsontypes import JsonObject, JsonValue
from servelab.status.judge import findings, own_gpus, own_leftovers, verdict
from servelab.status.probes import finish_servers, probe_servers, sim_gpus
from servelab.status.stored import deployments, last_run, run_summary, studies


def observe(
    urls: list[str] | None = None,
    units: list[str] | None = None,
    log: str | None = None,
    gpu_source: str | None = None,
    *,
    host: Host,
) -> JsonObject:
    """Everything `servelab status` reports (keys documented in docs/cli/status.md), about `host` (this
    machine: the front's `servelab.agent.serve.local_host()`). What lives on the machine comes from one `observe_host` call there; what lives in this
    store (the last run, studies, deployments) is read here, and the servers are probed from here (through
    port forwards when the host is remote)."""
    run = last_run()
    stored = run or {}
    markers = {k: str(v) for k, v in _table(stored.get("markers", {})).items()}
    run_url, run_log = stored.get("url"), stored.get("log_path")
    urls = (
        [u.rstrip("/") for u in urls]
        if urls
        else ([run_url.rstrip("/")] if isinstance(run_url, str) and run_url else [])
    )
    log_path = log or (run_log if isinstance(run_log, str) else None)
    probed = probe_servers(urls, host)
    sim = sim_gpus(gpu_source, probed, host)
    deployed = deployments()
    if not units and deployed:  # the units `servelab deploy --install` made, whatever their names
        units = sorted({str(_table(d["unit"]).get("unit")) for d in deployed if d.get("unit")})
    req = ObserveRequest(
        urls=urls,
        units=units,
        log=log_path,
        gpu_source=gpu_source,
        telemetry_url=sim[0] if sim else None,
        telemetry=sim[1] if sim else None,
        want_log_text=bool(log_path),
    )
    part = OBSERVE_HOST.call(host, req)
    log_text = part.log_text
    # The log belongs to a server when it is the run's own, or when one server and one log were given.
    log_for: dict[str, str] = {}
    if log_text:
        owner = run_url if not log else (urls[0] if len(urls) == 1 else None)
        if isinstance(owner, str) and owner:
            log_for[owner.rstrip("/")] = log_text
    finish_servers(probed, log_for)
    for s in probed:
        s.pop("_telemetry", None)
    lo = own_leftovers(part.leftovers, markers)
    obs: JsonObject = {
        "time": time.time(),
        "host": {
            "target": host.name,
            "hostname": part.hostname,
            "via": "local" if host.is_local else "ssh",
        },
        "servers": list(probed),
        "services": list(part.services),
        "services_note": part.services_note,
        "gpus": own_gpus(part.gpus, markers),
        "topology": part.topology,
        "leftovers": lo,
        "log": part.log,
        "last_run": run_summary(run),
        "deployments": list(deployed),
        "studies": list(studies(marked=_objects(lo["marked_processes"]))),
    }
    obs["findings"] = list(findings(obs, run))
    obs["verdict"] = verdict(obs, run)
    return obs


def diagnose_host(host: Host, gpu_source: str | None = None) -> JsonObject:
    """`servelab doctor` about `host`: the facts gathered there (agent op `doctor_facts`), checked here
    (servelab.host.doctor). A simulator's GPUs (`sim:URL`, the URL as the host sees it) are read through
    a forward."""
    from servelab.host import doctor
    from servelab.host.observe import sim_report

    sim = sim_gpus(gpu_source, [], host)
    gpus = sim_report(*sim).to_dict() if sim is not None else None
    got = DOCTOR_FACTS.call(host, DoctorFactsRequest(gpu_source=gpu_source, gpus=gpus))
    out = doctor.report(doctor.Facts.from_dict(got.facts))
    return {
        "host": {
            "target": host.name,
            "hostname": got.hostname,
            "via": "local" if host.is_local else "ssh",
        },
        **out.to_dict(),
    }


# -- this machine's sections, read here (observe reads them on the host, through its agent) ---------
def gpu_section(rep: gpumod.GpuReport, markers: dict[str, str]) -> JsonObject:
    gpumod.enrich(rep, local=True)  # the simulator runs here too: its pid is local
    return own_gpus(rep.to_dict(), markers)


def leftovers(urls: list[str], markers: dict[str, str] | None = None) -> JsonObject:
    """This host's leftovers (servelab.host.observe.leftovers), whose each marked process is when
    `markers` is given."""
    lo = host_leftovers(urls)
    return own_leftovers(lo, markers) if markers is not None else lo


def _table(value: JsonValue) -> JsonObject:
    """A JSON object ({} for null or a missing one)."""
    return value if isinstance(value, dict) else {}


def _objects(value: JsonValue) -> list[JsonObject]:
    """A JSON list's objects ([] for null or a missing one)."""
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []
