"""Pure judgement over an observation: whose each GPU and marked process is (by this store's markers), the
findings (what is wrong, its evidence, what to do next) and the one-line verdict."""

from __future__ import annotations

from typing import Any

KEY_SETTINGS = ("moe_runner_backend", "attention_backend", "quantization", "kv_cache_dtype")
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


def own_gpus(d: dict[str, Any], markers: dict[str, str]) -> dict[str, Any]:
    """Whose each GPU process is, by the markers of this store's runs."""
    for g in d["gpus"]:
        for p in g["processes"]:
            p["belongs_to"] = _owner_state(p.get("marker"), markers)
    return d


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
