"""The servers, probed over HTTP from this process (through `host`'s port forwards when it is remote), each
call on an event loop of its own: health, models, metrics, the engine's self-description, a simulator's
GPU telemetry; and the effective configuration through the engine's adapter."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from servelab.bench.client import Client
from servelab.bench.scrape import detect_engine, parse_prometheus, pick
from servelab.errors import ConfigError, ServelabError
from servelab.host import gpus as gpumod
from servelab.host.observe import SIM_TELEMETRY, read_gpus, sim_report
from servelab.host.transport import Host
from servelab.jsontypes import JsonObject
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
GPU_SOURCES = (None, "auto", "local", "nvml", "nvidia-smi")


# -- servers ---------------------------------------------------------------------------------------
def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def _probe(url: str) -> JsonObject:
    """One server as `servers[]` shows it (open JSON, docs/cli/status.md), with `_info` and `_telemetry`
    kept for `finish_servers` and the GPU section."""
    c = Client(url, timeout_s=5.0, connect_timeout_s=3.0)
    try:
        health = await c.get("/health", 3.0)
        out: JsonObject = {
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
        info: JsonObject = {}
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


def _effective(server: JsonObject, log_text: str) -> None:
    """Fill `effective`/`evidence`/`version` through the engine's adapter (log wins where it says more)."""
    from servelab.engines import registry

    raw_info = _table(server.pop("_info", {}))
    info = {k: v for k, v in raw_info.items() if not k.startswith("_")}
    name = server.get("engine") or server.get("personality")
    if not isinstance(name, str):
        return
    try:
        eff = registry.get(name).effective_config(log_text, info or None)
    except ServelabError:
        return
    # The simulator also states its configuration outright; it fills what the log did not show.
    sim_eff = _table(_table(raw_info.get("_sim_state")).get("effective"))
    for ours, theirs in SIM_STATE_KEYS.items():
        if ours not in eff.effective and sim_eff.get(theirs) is not None:
            eff.set(ours, sim_eff[theirs], f"GET /servelab/state: {theirs}={sim_eff[theirs]!r}")
    server["effective"] = redact(eff.effective)
    server["evidence"] = redact(eff.evidence)
    server["version"] = eff.effective.get("version") or info.get("version")


def _table(value: object) -> JsonObject:
    """A JSON object ({} for null or a missing one)."""
    return value if isinstance(value, dict) else {}


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


def probe_servers(urls: list[str], host: Host) -> list[JsonObject]:
    """Each server's health, models, metrics and self-description (`_info`, `_telemetry` kept for
    `finish_servers` and the GPU section), probed from here through `host`'s forwards."""

    async def all_(reach: dict[str, str]) -> list[JsonObject]:
        return [{**await _probe(reach[u]), "url": u} for u in urls]

    with _reach(host, urls) as reach:
        return asyncio.run(all_(reach))


def finish_servers(found: list[JsonObject], log_for: dict[str, str]) -> None:
    """The effective configuration of each server that is up, from its self-description and its log."""
    for s in found:
        if s["up"]:
            _effective(s, log_for.get(str(s["url"]), ""))
        else:
            s.pop("_info", None)


def servers(urls: list[str], log_for: dict[str, str], host: Host) -> list[JsonObject]:
    found = probe_servers(urls, host)
    finish_servers(found, log_for)
    return found


# -- GPUs ------------------------------------------------------------------------------------------
def sim_gpus(
    gpu_source: str | None, probed: list[JsonObject], host: Host
) -> tuple[str, JsonObject | None] | None:
    """(url, telemetry) when the GPUs to show are a simulator's (`sim:URL`, or auto with a simulator among
    the probed servers; telemetry None: it did not answer), None when the host's own are to be read.
    An unknown source is the user's to fix (ConfigError)."""
    if gpu_source and gpu_source.startswith("sim:"):
        url = gpu_source[4:]
        tele = next(
            (t for s in probed if s["url"] == url and isinstance(t := s.get("_telemetry"), dict) and t), None
        )
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
            found = s.get("_telemetry")
            if isinstance(found, dict) and found:
                return str(s["url"]), found
    return None


def _gpu_report(gpu_source: str | None, probed: list[JsonObject], host: Host) -> gpumod.GpuReport:
    sim = sim_gpus(gpu_source, probed, host)
    return sim_report(*sim) if sim is not None else read_gpus(gpu_source)


async def _fetch_telemetry(url: str) -> JsonObject | None:
    c = Client(url, timeout_s=5.0, connect_timeout_s=3.0)
    try:
        res = await c.get(SIM_TELEMETRY, 5.0)
        obj = _json(res.body) if res.status == 200 else None
        return obj if isinstance(obj, dict) else None
    finally:
        c.close()
