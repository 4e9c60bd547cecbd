"""`servelab status`: what is true right now, each finding with its evidence and a next step.

`observe()` gathers GPUs, topology, servers, services, leftovers and the last log into one dict; every
part degrades to "not available, because ..." rather than failing, so the command answers on a laptop, in
CI and on a GPU box alike. `servelab plan check` consumes the dict: its top-level keys and the keys of
`servers[]`, `services[]` and `findings[]` are a stable contract (docs/cli/status.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from servelab import naming
from servelab.bench.client import Client
from servelab.bench.scrape import detect_engine, parse_prometheus, pick
from servelab.errors import ConfigError, ServelabError
from servelab.host import gpus as gpumod
from servelab.host import processes
from servelab.host.observe import (  # noqa: F401  (the host-side half, re-exported)
    CACHE_DIRS,
    CLEAN_SHUTDOWN,
    LOCAL_HOSTS,
    SIM_TELEMETRY,
    STALE_CACHE_DAYS,
    THROUGHPUT_PATTERNS,
    compile_caches,
    observe_host,
    read_gpus,
    read_log,
    sim_report,
)
from servelab.host.observe import leftovers as host_leftovers
from servelab.host.transport import Host
from servelab.redact import redact

INFO_PATHS = ("/version", "/get_server_info", "/servelab/state")
# normalized key -> the simulator's /servelab/state "effective" key
SIM_STATE_KEYS: dict[str, str] = {
    "tp_size": "tp",
    "pp_size": "pp",
    "dp_size": "dp",
    "ep_size": "ep",
    "moe_runner_backend": "moe_runner_backend",
    "attention_backend": "attention_backend",
    "max_running_requests": "max_running",
    "max_num_batched_tokens": "max_batched_tokens",
    "mem_fraction": "mem_fraction",
    "max_model_len": "max_model_len",
}
KEY_SETTINGS = ("moe_runner_backend", "attention_backend", "quantization", "kv_cache_dtype")
GPU_SOURCES = (None, "auto", "local", "nvml", "nvidia-smi")


# -- the last run, from the store ------------------------------------------------------------------
def last_run() -> dict[str, Any] | None:
    """The latest study trial (url, pid, marker, log_path, effective, not_applied, diagnosis), else the
    latest benchmark run's URL; None when the store is empty or absent (observing never creates one)."""
    from servelab.store.db import store_exists

    if not store_exists():
        return None
    from servelab.store import leases
    from servelab.store.bench import BenchRepo
    from servelab.store.db import open_store
    from servelab.store.studies import StudyRepo

    try:
        store = open_store()
    except ServelabError:
        return None
    try:
        repo = StudyRepo(store)
        trial: dict[str, Any] | None = None
        markers: dict[str, str] = {}  # marker -> its trial's status, for the last study's trials
        with contextlib.suppress(ServelabError):
            study = repo.resolve("last")
            owner = leases.holder(store, study["id"])
            driven = owner is not None and owner.alive()
            for cand in repo.candidates(study["id"]):
                for t in repo.trials(cand["id"]):
                    if t.get("marker"):
                        # an open trial whose driver is gone was killed: its processes are leftovers
                        open_ = t["status"] not in FINISHED
                        markers[t["marker"]] = "killed" if open_ and not driven else t["status"]
                    if trial is None or t["id"] > trial["id"]:
                        trial = {**t, "study": study["uid"], "candidate": cand["label"]}
        if trial is not None:
            trial["markers"] = markers
            return trial
        runs = BenchRepo(store).list_runs(1)
        if runs:
            return {"url": runs[0].url, "bench_run": runs[0].uid, "markers": {}}
        return None
    finally:
        store.close()


# -- servers ---------------------------------------------------------------------------------------
def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def _probe(url: str) -> dict[str, Any]:
    c = Client(url, timeout_s=5.0, connect_timeout_s=3.0)
    try:
        health = await c.get("/health", 3.0)
        out: dict[str, Any] = {
            "url": url,
            "up": False,
            "health": health.status,
            "models": [],
            "effective": {},
            "evidence": {},
            "engine": None,
            "version": None,
            "running": None,
            "waiting": None,
        }
        if health.status == 0:
            out["error"] = health.error_message or health.error_kind or "unreachable"
            return out
        models = await c.get("/v1/models", 5.0)
        data = _json(models.body) if models.status == 200 else None
        owned = None
        if isinstance(data, dict):
            items = [m for m in data.get("data", []) if isinstance(m, dict)]
            out["models"] = [m.get("id") for m in items]
            owned = items[0].get("owned_by") if items else None
        out["up"] = health.status == 200 or (health.status == 404 and models.status == 200)
        if not out["up"]:
            out["error"] = f"/health answered {health.status}"
        metrics = await c.get("/metrics", 5.0)
        raw = parse_prometheus(metrics.body.decode("utf-8", "replace")) if metrics.status == 200 else {}
        picked = pick(raw)
        out["running"] = int(picked["requests_running"]) if "requests_running" in picked else None
        out["waiting"] = int(picked["requests_waiting"]) if "requests_waiting" in picked else None
        info: dict[str, Any] = {}
        for path in INFO_PATHS:
            res = await c.get(path, 5.0)
            obj = _json(res.body) if res.status == 200 else None
            if isinstance(obj, dict) and path == "/servelab/state":
                info["_sim_state"] = obj
            elif isinstance(obj, dict):
                info.update(obj)
        tele = await c.get(SIM_TELEMETRY, 5.0)
        gpu_payload = _json(tele.body) if tele.status == 200 else None
        out["_telemetry"] = gpu_payload if isinstance(gpu_payload, dict) else None
        out["_info"] = info
        personality = detect_engine(raw) or (owned if owned in ("vllm", "sglang") else None)
        out["personality"] = personality
        out["engine"] = (
            "sim"
            if out["_telemetry"] is not None or "_sim_state" in info
            else (personality or ("llamacpp" if owned == "llamacpp" else None))
        )
        return out
    finally:
        c.close()


def _effective(server: dict[str, Any], log_text: str) -> None:
    """Fill `effective`/`evidence`/`version` through the engine's adapter (log wins where it says more)."""
    from servelab.engines import registry

    raw_info = server.pop("_info", {})
    info = {k: v for k, v in raw_info.items() if not k.startswith("_")}
    name = server.get("engine") or server.get("personality")
    if name is None:
        return
    try:
        eff = registry.get(name).effective_config(log_text, info or None)
    except ServelabError:
        return
    # The simulator also states its configuration outright; it fills what the log did not show.
    sim_eff = (raw_info.get("_sim_state") or {}).get("effective") or {}
    for ours, theirs in SIM_STATE_KEYS.items():
        if ours not in eff.effective and sim_eff.get(theirs) is not None:
            eff.set(ours, sim_eff[theirs], f"GET /servelab/state: {theirs}={sim_eff[theirs]!r}")
    server["effective"] = redact(eff.effective)
    server["evidence"] = redact(eff.evidence)
    server["version"] = eff.effective.get("version") or info.get("version")


@contextlib.contextmanager
def _reach(host: Host, urls: list[str]) -> Any:
    """{url: the URL this process can open}: each URL as the observed host sees it (its loopback is its
    own), reached through a port forward of `host` when it is remote; the URL itself when it is local."""
    with contextlib.ExitStack() as stack:
        out: dict[str, str] = {}
        for u in urls:
            parts = urlsplit(u)
            try:
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError:
                port = None
            if host.is_local or not parts.hostname or port is None:
                out[u] = u
                continue
            h, p = stack.enter_context(host.forward(parts.hostname, port))
            out[u] = urlunsplit((parts.scheme, f"{h}:{p}", parts.path, parts.query, parts.fragment))
        yield out


def probe_servers(urls: list[str], host: Host) -> list[dict[str, Any]]:
    """Each server's health, models, metrics and self-description (`_info`, `_telemetry` kept for
    `finish_servers` and the GPU section), probed from here through `host`'s forwards."""

    async def all_(reach: dict[str, str]) -> list[dict[str, Any]]:
        return [{**await _probe(reach[u]), "url": u} for u in urls]

    with _reach(host, urls) as reach:
        return asyncio.run(all_(reach))


def finish_servers(found: list[dict[str, Any]], log_for: dict[str, str]) -> None:
    """The effective configuration of each server that is up, from its self-description and its log."""
    for s in found:
        if s["up"]:
            _effective(s, log_for.get(s["url"], ""))
        else:
            s.pop("_info", None)


def servers(urls: list[str], log_for: dict[str, str], host: Host) -> list[dict[str, Any]]:
    found = probe_servers(urls, host)
    finish_servers(found, log_for)
    return found


# -- GPUs ------------------------------------------------------------------------------------------
def sim_gpus(
    gpu_source: str | None, probed: list[dict[str, Any]], host: Host
) -> tuple[str, dict[str, Any] | None] | None:
    """(url, telemetry) when the GPUs to show are a simulator's (`sim:URL`, or auto with a simulator among
    the probed servers; telemetry None: it did not answer), None when the host's own are to be read.
    An unknown source is the user's to fix (ConfigError)."""
    if gpu_source and gpu_source.startswith("sim:"):
        url = gpu_source[4:]
        tele = next((s.get("_telemetry") for s in probed if s["url"] == url and s.get("_telemetry")), None)
        if tele is None:
            with _reach(host, [url]) as reach:
                tele = asyncio.run(_fetch_telemetry(reach[url]))
        return url, tele
    if gpu_source not in GPU_SOURCES:
        raise ConfigError(
            f"unknown GPU source {gpu_source!r}",
            hint="use auto, nvml, nvidia-smi or sim:URL (a running `servelab sim`)",
        )
    if gpu_source in (None, "auto"):
        for s in probed:
            if s.get("_telemetry"):
                return s["url"], s["_telemetry"]
    return None


def _gpu_report(gpu_source: str | None, probed: list[dict[str, Any]], host: Host) -> gpumod.GpuReport:
    sim = sim_gpus(gpu_source, probed, host)
    return sim_report(*sim) if sim is not None else read_gpus(gpu_source)


async def _fetch_telemetry(url: str) -> dict[str, Any] | None:
    c = Client(url, timeout_s=5.0, connect_timeout_s=3.0)
    try:
        res = await c.get(SIM_TELEMETRY, 5.0)
        obj = _json(res.body) if res.status == 200 else None
        return obj if isinstance(obj, dict) else None
    finally:
        c.close()


FINISHED = ("measured", "not_applied", "failed", "interrupted")


def _owner_state(marker: str | None, markers: dict[str, str]) -> str:
    """Whose process: "not servelab's", "live servelab run", "killed servelab run" (its trial is open but
    the servelab driving it is gone), "stale servelab run" (its trial has ended: a leftover), or "other
    servelab run" (a marker this store does not know: another SERVELAB_HOME, an older study)."""
    if marker is None:
        return "not servelab's"
    if marker not in markers:
        return "other servelab run"
    if markers[marker] == "killed":
        return "killed servelab run"
    return "stale servelab run" if markers[marker] in FINISHED else "live servelab run"


def studies(limit: int = 20, marked: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The unfinished studies (latest first), each `live` (its driver runs: pid, host, since), `killed`
    (stored as running but its driver is gone) or `interrupted` (stopped cleanly), with the processes
    it started that are still alive (`processes`: what `tune --resume` ends first), picked from `marked`
    (the observed host's marked processes, `leftovers()["marked_processes"]`; None: this host's)."""
    from servelab.store.db import store_exists

    if not store_exists():
        return []
    from servelab.store import leases
    from servelab.store.db import open_store
    from servelab.store.studies import StudyRepo

    out = []
    with open_store() as store:
        for st in StudyRepo(store).list_studies(limit):
            if st["status"] == "completed":
                continue
            owner = leases.holder(store, st["id"])
            alive = owner is not None and owner.alive()
            state = "live" if alive else ("killed" if st["status"] == "running" else st["status"])
            prefix = naming.study_markers(st["uid"])
            procs = (
                [
                    {"pid": p.pid, "marker": p.marker, "command": p.cmdline}
                    for p in processes.with_marker(prefix)
                ]
                if marked is None
                else [
                    {"pid": p["pid"], "marker": p["marker"], "command": p["command"]}
                    for p in marked
                    if str(p.get("marker") or "").startswith(prefix)
                ]
            )
            out.append(
                {
                    "uid": st["uid"],
                    "name": st["name"],
                    "source": st["source"],
                    "status": st["status"],
                    "state": state,
                    "owner": owner.to_dict() if owner else None,
                    "processes": procs,
                }
            )
    return out


def gpu_section(rep: gpumod.GpuReport, markers: dict[str, str]) -> dict[str, Any]:
    gpumod.enrich(rep, local=True)  # the simulator runs here too: its pid is local
    return own_gpus(rep.to_dict(), markers)


def own_gpus(d: dict[str, Any], markers: dict[str, str]) -> dict[str, Any]:
    """Whose each GPU process is, by the markers of this store's runs."""
    for g in d["gpus"]:
        for p in g["processes"]:
            p["belongs_to"] = _owner_state(p.get("marker"), markers)
    return d


# -- leftovers -------------------------------------------------------------------------------------
def leftovers(urls: list[str], markers: dict[str, str] | None = None) -> dict[str, Any]:
    """This host's leftovers (servelab.host.observe.leftovers), whose each marked process is when
    `markers` is given."""
    lo = host_leftovers(urls)
    return own_leftovers(lo, markers) if markers is not None else lo


def own_leftovers(lo: dict[str, Any], markers: dict[str, str]) -> dict[str, Any]:
    for p in lo["marked_processes"]:
        p["belongs_to"] = _owner_state(p["marker"], markers)
    return lo


# -- findings and verdict --------------------------------------------------------------------------
def _finding(what: str, evidence: str, next_: str) -> dict[str, str]:
    return {"what": what, "evidence": evidence, "next": next_}


def findings(obs: dict[str, Any], run: dict[str, Any] | None) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    g = obs["gpus"]
    if not g["available"]:
        out.append(
            _finding(
                "no GPUs on this host",
                g["note"],
                "nothing to do on a CPU host; point --gpu-source sim:URL at a simulator to see its GPUs",
            )
        )
    for gpu in g["gpus"]:
        if gpu["orphaned_memory"]:
            out.append(
                _finding(
                    f"GPU{gpu['index']} holds {gpu['memory_used_mib']} MiB with no live process",
                    f"processes: {[p['pid'] for p in gpu['processes']] or 'none listed'}",
                    "wait a few seconds for the driver to free it; if it stays, look for a process in "
                    "another container, then `sudo nvidia-smi --gpu-reset -i "
                    f"{gpu['index']}`",
                )
            )
        for p in gpu["processes"]:
            if p.get("belongs_to") == "stale servelab run" and p.get("alive"):
                out.append(
                    _finding(
                        f"GPU{gpu['index']} is held by pid {p['pid']} of a finished servelab run",
                        f"{p.get('command') or p['name']} (SERVELAB_RUN={p['marker']})",
                        f"kill {p['pid']}  (SIGKILL if it ignores SIGTERM)",
                    )
                )
    summ = obs["topology"].get("summary") or {}
    if summ.get("vm_all_phb"):
        out.append(
            _finding(
                "every GPU pair shows PHB: a virtual machine hiding the PCIe tree",
                f"links {summ.get('link_counts')}",
                "check P2P with `nvidia-smi topo -p2p r`; "
                "expect slower all-reduce than bare metal, prefer fewer GPUs per replica",
            )
        )
    for bad in summ.get("p2p_unavailable", [])[:1]:
        out.append(
            _finding(
                f"P2P unavailable between {len(summ['p2p_unavailable'])} GPU pair(s)",
                f"{bad['pair'][0]}-{bad['pair'][1]}: {bad['status']} ({bad['meaning']})",
                "NCCL copies through host memory; `servelab doctor` lists fixes",
            )
        )
    for s in obs["servers"]:
        if not s["up"]:
            diag = (obs["log"] or {}).get("diagnosis") or {}
            advice = diag.get("advice") if diag.get("class") not in (None, "unknown") else None
            nxt = (
                str(advice)
                if advice
                else (
                    f"start it again, or read its log: servelab logs diagnose {obs['log']['path']}"
                    if obs.get("log")
                    else "start it again; pass --log FILE to see why it stopped"
                )
            )
            out.append(_finding(f"server {s['url']} is down", s.get("error", ""), nxt))
        elif s.get("waiting"):
            out.append(
                _finding(
                    f"server {s['url']} has {s['waiting']} requests waiting",
                    f"running {s['running']}, waiting {s['waiting']} (/metrics)",
                    "the batch is full: raise max concurrency or add replicas",
                )
            )
    for u in obs["services"]:
        if u["active_state"] == "failed" or (u.get("restarts") or 0) > 0:
            out.append(
                _finding(
                    f"service {u['unit']} is {u['active_state']} after {u.get('restarts') or 0} restart(s)",
                    f"{u['active_state']}/{u['sub_state']} since {u.get('since')}",
                    f"journalctl -u {u['unit']} -n 200",
                )
            )
    lo = obs["leftovers"]
    orphans = [s for s in lo["shm"] if not s["owners_alive"]]
    if orphans:
        mib = sum(s["bytes"] for s in orphans) / 2**20
        out.append(
            _finding(
                f"{len(orphans)} shared-memory segment(s) whose owners are gone ({mib:.0f} MiB)",
                ", ".join(s["name"] for s in orphans[:5]),
                "rm " + " ".join(f"/dev/shm/{s['name']}" for s in orphans[:5] if s["ours"]),
            )
        )
    for c in lo["compile_caches"]:
        if c["stale"]:
            out.append(
                _finding(
                    f"compile cache {c['path']} untouched for {c['age_days']:.0f} days",
                    f"{c['bytes'] / 2**20:.0f} MiB",
                    f"rm -rf {c['path']}  (rebuilt on next start)",
                )
            )
    for st in obs.get("studies") or []:
        if st["state"] == "killed":
            was = f"pid {st['owner']['pid']} on {st['owner']['host']}" if st["owner"] else "its driver"
            left = len(st["processes"])
            out.append(
                _finding(
                    f"study {st['uid']} ({st['name']}) was killed: {was} is gone"
                    + (f", {left} of its processes still run" if left else ""),
                    ", ".join(f"{p['pid']} {p['command'][:60]}" for p in st["processes"][:3])
                    or "no process of it is left",
                    f"servelab tune {st['source'] or 'STUDY.toml'} --resume  (ends them first, then continues)",
                )
            )
    for p in lo["marked_processes"]:
        if p["belongs_to"] in ("stale servelab run", "killed servelab run") and not _swept_by_resume(
            p, obs.get("studies") or []
        ):
            out.append(
                _finding(
                    f"pid {p['pid']} of a finished servelab run is still alive",
                    f"SERVELAB_RUN={p['marker']}: {p['command'][:120]}",
                    f"kill {p['pid']}",
                )
            )
    log = obs["log"]
    if log and log.get("available"):
        d = log["diagnosis"]
        if d["class"] != "unknown":
            out.append(_finding(f"the log shows {d['class']}", d["evidence"], d["advice"]))
    for m in (run or {}).get("not_applied") or []:
        out.append(
            _finding(
                f"requested {m['key']}={m['requested']!r} never took effect",
                m.get("evidence", ""),
                f"the engine ran {m['key']}={m['effective']!r}; check why it "
                "rejected the request (version, GPU, quantization)",
            )
        )
    return out


def _swept_by_resume(p: dict[str, Any], unfinished: list[dict[str, Any]]) -> bool:
    """A process of a killed study, already named by that study's finding (its resume ends it)."""
    return any(
        st["state"] == "killed" and any(q["pid"] == p["pid"] for q in st["processes"]) for st in unfinished
    )


def verdict(obs: dict[str, Any], run: dict[str, Any] | None) -> str:
    parts: list[str] = []
    log = obs.get("log") or {}
    for s in obs["servers"]:
        if s["up"]:
            eng = s.get("engine") or "unknown engine"
            if s.get("engine") == "sim" and s.get("personality"):
                eng = f"sim ({s['personality']})"
            ver = f" {s['version']}" if s.get("version") else ""
            load = (
                f", {s['running']} running / {s['waiting']} waiting" if s.get("running") is not None else ""
            )
            parts.append(
                f"server {s['url']} up ({eng}{ver}, serving {', '.join(map(str, s['models'])) or 'no model'}{load})"
            )
        else:
            why = ""
            if log.get("available"):
                d = log["diagnosis"]
                why = (
                    f" after {d['class']}"
                    if d["fatal"]
                    else (" after a clean shutdown" if log["clean_shutdown"] else "")
                )
            parts.append(f"server {s['url']} down{why}")
    eff = (
        (log.get("effective") if log.get("available") else None)
        or ((run or {}).get("effective") or {}).get("effective")
        or {}
    )
    used = [f"{k}={eff[k]}" for k in KEY_SETTINGS if str(eff.get(k)).lower() not in ("none", "auto", "")]
    if used and not any(s["up"] for s in obs["servers"]):  # a live server's own configuration is in servers[]
        parts.append("the last run used " + ", ".join(used))
    for m in (run or {}).get("not_applied") or []:
        parts.append(f"the requested {m['key']}={m['requested']} never started")
    for st in obs.get("studies") or []:
        if st["state"] == "live":
            o = st["owner"]
            parts.append(f"study {st['uid']} is running (driven by pid {o['pid']} on {o['host']})")
        elif st["state"] == "killed":
            parts.append(f"study {st['uid']} was killed ({len(st['processes'])} process(es) left)")
    g = obs["gpus"]
    if not g["available"]:
        parts.append("no GPUs on this host")
    else:
        busy = sum(1 for x in g["gpus"] if not x["idle"])
        parts.append(f"{len(g['gpus'])} GPU(s), {busy} in use")
    if not obs["servers"]:
        parts.insert(0, "no server to check (none given, none in the store)")
    issues = len(obs["findings"])
    parts.append(f"{issues} finding(s)" if issues else "nothing needs attention")
    return "; ".join(parts)


# -- the service -----------------------------------------------------------------------------------
def observe(
    urls: list[str] | None = None,
    units: list[str] | None = None,
    log: str | None = None,
    gpu_source: str | None = None,
    *,
    host: Host,
) -> dict[str, Any]:
    """Everything `servelab status` reports (keys documented in docs/cli/status.md), about `host` (this
    machine: the front's `servelab.agent.serve.local_host()`). What lives on the machine comes from one `observe_host` call there; what lives in this
    store (the last run, studies, deployments) is read here, and the servers are probed from here (through
    port forwards when the host is remote)."""
    run = last_run()
    markers: dict[str, str] = (run or {}).get("markers", {})
    urls = (
        [u.rstrip("/") for u in urls]
        if urls
        else ([run["url"].rstrip("/")] if run and run.get("url") else [])
    )
    log_path = log or ((run or {}).get("log_path"))
    probed = probe_servers(urls, host)
    sim = sim_gpus(gpu_source, probed, host)
    deployed = deployments()
    if not units and deployed:  # the units `servelab deploy --install` made, whatever their names
        units = sorted({str(d["unit"].get("unit")) for d in deployed if d.get("unit")})
    part: dict[str, Any] = host.call(
        "observe_host",
        urls=urls,
        units=units,
        log=log_path,
        gpu_source=gpu_source,
        telemetry_url=sim[0] if sim else None,
        telemetry=sim[1] if sim else None,
        want_log_text=bool(log_path),
    )
    log_text = str(part.get("log_text") or "")
    # The log belongs to a server when it is the run's own, or when one server and one log were given.
    log_for: dict[str, str] = {}
    if log_text:
        owner = (run or {}).get("url") if not log else (urls[0] if len(urls) == 1 else None)
        if owner:
            log_for[owner.rstrip("/")] = log_text
    finish_servers(probed, log_for)
    for s in probed:
        s.pop("_telemetry", None)
    lo = own_leftovers(part["leftovers"], markers)
    obs: dict[str, Any] = {
        "time": time.time(),
        "host": {
            "target": host.name,
            "hostname": part["hostname"],
            "via": "local" if host.is_local else "ssh",
        },
        "servers": probed,
        "services": part["services"],
        "services_note": part["services_note"],
        "gpus": own_gpus(part["gpus"], markers),
        "topology": part["topology"],
        "leftovers": lo,
        "log": part["log"],
        "last_run": _run_summary(run),
        "deployments": deployed,
        "studies": studies(marked=lo["marked_processes"]),
    }
    obs["findings"] = findings(obs, run)
    obs["verdict"] = verdict(obs, run)
    return obs


def deployments() -> list[dict[str, Any]]:
    """Installed deployments with their latest check against the tuned result (empty without a store)."""
    from servelab.store.db import store_exists

    if not store_exists():
        return []
    from servelab.deploy.records import installed_units
    from servelab.store.db import open_store

    with open_store() as store:
        return installed_units(store)


def _run_summary(run: dict[str, Any] | None) -> dict[str, Any] | None:
    if run is None:
        return None
    keys = (
        "study",
        "candidate",
        "status",
        "url",
        "pid",
        "marker",
        "log_path",
        "started_at",
        "finished_at",
        "engine_version",
        "bench_run",
    )
    d = {k: run.get(k) for k in keys if k in run}
    d["not_applied"] = run.get("not_applied") or []
    d["diagnosis"] = run.get("diagnosis")
    return d


# -- doctor ----------------------------------------------------------------------------------------
def diagnose_host(host: Host, gpu_source: str | None = None) -> dict[str, Any]:
    """`servelab doctor` about `host`: the facts gathered there (agent op `doctor_facts`), checked here
    (servelab.host.doctor). A simulator's GPUs (`sim:URL`, the URL as the host sees it) are read through
    a forward."""
    from servelab.host import doctor
    from servelab.host.observe import sim_report

    sim = sim_gpus(gpu_source, [], host)
    gpus = sim_report(*sim).to_dict() if sim is not None else None
    got = host.call("doctor_facts", gpu_source=gpu_source, gpus=gpus)
    out = doctor.report(doctor.Facts.from_dict(got["facts"]))
    return {
        "host": {
            "target": host.name,
            "hostname": got["hostname"],
            "via": "local" if host.is_local else "ssh",
        },
        **out,
    }
