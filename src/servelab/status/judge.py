"""Pure judgement over an observation: whose each GPU and marked process is (by this store's markers), the
findings (what is wrong, its evidence, what to do next) and the one-line verdict.

The observation is open JSON (docs/cli/status.md; `plan check` reads it back from a file), so each value
is narrowed where it is read: `_obj`, `_objs`, `_num`."""

from __future__ import annotations

from collections.abc import Mapping

from servelab.jsontypes import JsonObject, JsonValue

KEY_SETTINGS = ("moe_runner_backend", "attention_backend", "quantization", "kv_cache_dtype")
FINISHED = ("measured", "not_applied", "failed", "interrupted")


def _owner_state(marker: object, markers: dict[str, str]) -> str:
    """Whose process: "not servelab's", "live servelab run", "killed servelab run" (its trial is open but
    the servelab driving it is gone), "stale servelab run" (its trial has ended: a leftover), or "other
    servelab run" (a marker this store does not know: another SERVELAB_HOME, an older study)."""
    if marker is None:
        return "not servelab's"
    if not isinstance(marker, str) or marker not in markers:
        return "other servelab run"
    if markers[marker] == "killed":
        return "killed servelab run"
    return "stale servelab run" if markers[marker] in FINISHED else "live servelab run"


def own_gpus(d: JsonObject, markers: dict[str, str]) -> JsonObject:
    """Whose each GPU process is, by the markers of this store's runs."""
    for g in _docs(d["gpus"]):
        for p in _docs(g["processes"]):
            p["belongs_to"] = _owner_state(p.get("marker"), markers)
    return d


def own_leftovers(lo: JsonObject, markers: dict[str, str]) -> JsonObject:
    for p in _docs(lo["marked_processes"]):
        p["belongs_to"] = _owner_state(p["marker"], markers)
    return lo


# -- reading the observation's JSON ------------------------------------------------------------------
def _docs(v: JsonValue) -> list[JsonObject]:
    """A JSON list's objects, to be written into (the same objects, not copies)."""
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _obj(v: object) -> Mapping[str, object]:
    """A JSON object ({} for null or a missing one)."""
    return v if isinstance(v, dict) else {}


def _objs(v: object) -> list[Mapping[str, object]]:
    """A JSON list's objects ([] for null or a missing one)."""
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _list(v: object) -> list[object]:
    return v if isinstance(v, list) else []


def _num(v: object) -> float:
    """A JSON number (0 for null or a missing one)."""
    return v if isinstance(v, int | float) else 0


# -- findings and verdict --------------------------------------------------------------------------
def _finding(what: str, evidence: str, next_: str) -> JsonObject:
    return {"what": what, "evidence": evidence, "next": next_}


def findings(obs: Mapping[str, object], run: Mapping[str, object] | None) -> list[JsonObject]:
    """What needs attention: each `what`, its `evidence` and what to do `next` (strings)."""
    out: list[JsonObject] = []
    g = _obj(obs["gpus"])
    if not g["available"]:
        out.append(
            _finding(
                "no GPUs on this host",
                str(g["note"]),
                "nothing to do on a CPU host; point --gpu-source sim:URL at a simulator to see its GPUs",
            )
        )
    for gpu in _objs(g["gpus"]):
        procs = _objs(gpu["processes"])
        if gpu["orphaned_memory"]:
            out.append(
                _finding(
                    f"GPU{gpu['index']} holds {gpu['memory_used_mib']} MiB with no live process",
                    f"processes: {[p['pid'] for p in procs] or 'none listed'}",
                    "wait a few seconds for the driver to free it; if it stays, look for a process in "
                    "another container, then `sudo nvidia-smi --gpu-reset -i "
                    f"{gpu['index']}`",
                )
            )
        for p in procs:
            if p.get("belongs_to") == "stale servelab run" and p.get("alive"):
                out.append(
                    _finding(
                        f"GPU{gpu['index']} is held by pid {p['pid']} of a finished servelab run",
                        f"{p.get('command') or p['name']} (SERVELAB_RUN={p['marker']})",
                        f"kill {p['pid']}  (SIGKILL if it ignores SIGTERM)",
                    )
                )
    summ = _obj(_obj(obs["topology"]).get("summary"))
    if summ.get("vm_all_phb"):
        out.append(
            _finding(
                "every GPU pair shows PHB: a virtual machine hiding the PCIe tree",
                f"links {summ.get('link_counts')}",
                "check P2P with `nvidia-smi topo -p2p r`; "
                "expect slower all-reduce than bare metal, prefer fewer GPUs per replica",
            )
        )
    unavailable = _objs(summ.get("p2p_unavailable"))
    for bad in unavailable[:1]:
        pair = _list(bad["pair"])
        out.append(
            _finding(
                f"P2P unavailable between {len(unavailable)} GPU pair(s)",
                f"{pair[0]}-{pair[1]}: {bad['status']} ({bad['meaning']})",
                "NCCL copies through host memory; `servelab doctor` lists fixes",
            )
        )
    log = _obj(obs["log"])
    for s in _objs(obs["servers"]):
        if not s["up"]:
            diag = _obj(log.get("diagnosis"))
            advice = diag.get("advice") if diag.get("class") not in (None, "unknown") else None
            nxt = (
                str(advice)
                if advice
                else (
                    f"start it again, or read its log: servelab logs diagnose {log['path']}"
                    if obs.get("log")
                    else "start it again; pass --log FILE to see why it stopped"
                )
            )
            out.append(_finding(f"server {s['url']} is down", str(s.get("error", "")), nxt))
        elif s.get("waiting"):
            out.append(
                _finding(
                    f"server {s['url']} has {s['waiting']} requests waiting",
                    f"running {s['running']}, waiting {s['waiting']} (/metrics)",
                    "the batch is full: raise max concurrency or add replicas",
                )
            )
    for u in _objs(obs["services"]):
        restarts = u.get("restarts") or 0
        if u["active_state"] == "failed" or _num(restarts) > 0:
            out.append(
                _finding(
                    f"service {u['unit']} is {u['active_state']} after {restarts} restart(s)",
                    f"{u['active_state']}/{u['sub_state']} since {u.get('since')}",
                    f"journalctl -u {u['unit']} -n 200",
                )
            )
    lo = _obj(obs["leftovers"])
    orphans = [s for s in _objs(lo["shm"]) if not s["owners_alive"]]
    if orphans:
        mib = sum(_num(s["bytes"]) for s in orphans) / 2**20
        out.append(
            _finding(
                f"{len(orphans)} shared-memory segment(s) whose owners are gone ({mib:.0f} MiB)",
                ", ".join(str(s["name"]) for s in orphans[:5]),
                "rm " + " ".join(f"/dev/shm/{s['name']}" for s in orphans[:5] if s["ours"]),
            )
        )
    for c in _objs(lo["compile_caches"]):
        if c["stale"]:
            out.append(
                _finding(
                    f"compile cache {c['path']} untouched for {_num(c['age_days']):.0f} days",
                    f"{_num(c['bytes']) / 2**20:.0f} MiB",
                    f"rm -rf {c['path']}  (rebuilt on next start)",
                )
            )
    unfinished = _objs(obs.get("studies"))
    for st in unfinished:
        if st["state"] == "killed":
            owner = _obj(st["owner"])
            was = f"pid {owner['pid']} on {owner['host']}" if st["owner"] else "its driver"
            procs = _objs(st["processes"])
            left = len(procs)
            out.append(
                _finding(
                    f"study {st['uid']} ({st['name']}) was killed: {was} is gone"
                    + (f", {left} of its processes still run" if left else ""),
                    ", ".join(f"{p['pid']} {str(p['command'])[:60]}" for p in procs[:3])
                    or "no process of it is left",
                    f"servelab tune {st['source'] or 'STUDY.toml'} --resume  (ends them first, then continues)",
                )
            )
    for p in _objs(lo["marked_processes"]):
        if p["belongs_to"] in ("stale servelab run", "killed servelab run") and not _swept_by_resume(
            p, unfinished
        ):
            out.append(
                _finding(
                    f"pid {p['pid']} of a finished servelab run is still alive",
                    f"SERVELAB_RUN={p['marker']}: {str(p['command'])[:120]}",
                    f"kill {p['pid']}",
                )
            )
    if log and log.get("available"):
        d = _obj(log["diagnosis"])
        if d["class"] != "unknown":
            out.append(_finding(f"the log shows {d['class']}", str(d["evidence"]), str(d["advice"])))
    for m in _objs((run or {}).get("not_applied")):
        out.append(
            _finding(
                f"requested {m['key']}={m['requested']!r} never took effect",
                str(m.get("evidence", "")),
                f"the engine ran {m['key']}={m['effective']!r}; check why it "
                "rejected the request (version, GPU, quantization)",
            )
        )
    return out


def _swept_by_resume(p: Mapping[str, object], unfinished: list[Mapping[str, object]]) -> bool:
    """A process of a killed study, already named by that study's finding (its resume ends it)."""
    return any(
        st["state"] == "killed" and any(q["pid"] == p["pid"] for q in _objs(st["processes"]))
        for st in unfinished
    )


def verdict(obs: Mapping[str, object], run: Mapping[str, object] | None) -> str:
    parts: list[str] = []
    log = _obj(obs.get("log"))
    servers = _objs(obs["servers"])
    for s in servers:
        if s["up"]:
            eng = s.get("engine") or "unknown engine"
            if s.get("engine") == "sim" and s.get("personality"):
                eng = f"sim ({s['personality']})"
            ver = f" {s['version']}" if s.get("version") else ""
            load = (
                f", {s['running']} running / {s['waiting']} waiting" if s.get("running") is not None else ""
            )
            parts.append(
                f"server {s['url']} up ({eng}{ver}, serving {', '.join(map(str, _list(s['models']))) or 'no model'}{load})"
            )
        else:
            why = ""
            if log.get("available"):
                d = _obj(log["diagnosis"])
                why = (
                    f" after {d['class']}"
                    if d["fatal"]
                    else (" after a clean shutdown" if log["clean_shutdown"] else "")
                )
            parts.append(f"server {s['url']} down{why}")
    eff = _obj(
        (log.get("effective") if log.get("available") else None)
        or _obj((run or {}).get("effective")).get("effective")
    )
    used = [f"{k}={eff[k]}" for k in KEY_SETTINGS if str(eff.get(k)).lower() not in ("none", "auto", "")]
    if used and not any(s["up"] for s in servers):  # a live server's own configuration is in servers[]
        parts.append("the last run used " + ", ".join(used))
    for m in _objs((run or {}).get("not_applied")):
        parts.append(f"the requested {m['key']}={m['requested']} never started")
    for st in _objs(obs.get("studies")):
        if st["state"] == "live":
            o = _obj(st["owner"])
            parts.append(f"study {st['uid']} is running (driven by pid {o['pid']} on {o['host']})")
        elif st["state"] == "killed":
            parts.append(f"study {st['uid']} was killed ({len(_list(st['processes']))} process(es) left)")
    g = _obj(obs["gpus"])
    if not g["available"]:
        parts.append("no GPUs on this host")
    else:
        gpus = _objs(g["gpus"])
        busy = sum(1 for x in gpus if not x["idle"])
        parts.append(f"{len(gpus)} GPU(s), {busy} in use")
    if not servers:
        parts.insert(0, "no server to check (none given, none in the store)")
    issues = len(_list(obs["findings"]))
    parts.append(f"{issues} finding(s)" if issues else "nothing needs attention")
    return "; ".join(parts)
