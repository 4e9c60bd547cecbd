"""`plan check`: hold every open item against an observation (`servelab status`) and flag stale assumptions.

What an item is about comes from its binding first, then from what its text names (plan_recognizers.toml).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources

from servelab.applied import compare
from servelab.engines.base import NORMALIZED_KEYS
from servelab.jsontypes import JsonObject, JsonValue
from servelab.plan.items import Item


@dataclass(frozen=True)
class Finding:
    """A stale assumption `check` found: an open item that no longer matches what is observed."""

    item: str
    kind: str  # server_down | server_healthy | server_unobserved | config_mismatch | config_unconfirmed | service_healthy
    #            | service_down | service_unobserved | dependency_cancelled
    severity: str  # warning | info
    message: str
    evidence: JsonObject = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        d: JsonObject = asdict(self)
        return d


@dataclass(frozen=True)
class Targets:
    """What an item is about: the server (url), the systemd unit, the configuration it assumes (and whether
    that came from its binding or its text), and whether it is about repairing something."""

    url: str | None
    unit: str | None
    requested: JsonObject
    requested_from: str | None  # binding | text | None
    repair: bool


@dataclass(frozen=True)
class Recognizers:
    """plan_recognizers.toml, read once: each configuration key with its pattern, and the patterns that
    name a server, a unit, or a repair."""

    config: tuple[tuple[str, str], ...]  # (normalized key, pattern)
    url: str
    unit: str
    repair: str


@cache
def recognizers() -> Recognizers:
    text = resources.files("servelab.data").joinpath("plan_recognizers.toml").read_text()
    data = tomllib.loads(text)
    return Recognizers(
        config=tuple((str(r["key"]), str(r["pattern"])) for r in data.get("config", [])),
        url=str(data["url"]["pattern"]),
        unit=str(data["unit"]["pattern"]),
        repair=str(data["repair"]["pattern"]),
    )


_KV = re.compile(r"\b(" + "|".join(NORMALIZED_KEYS) + r")\s*=\s*([A-Za-z0-9_.:/-]+)")


def targets(item: Item, unit_names: list[str] | None = None) -> Targets:
    """What an item refers to: its binding first, then what its text names (see plan_recognizers.toml)."""
    rec = recognizers()
    b = item.binding or {}
    text = item.content
    requested: JsonObject = {}
    for key, pattern in rec.config:
        m = re.search(pattern, text, re.IGNORECASE)
        if m:
            requested[key] = m.group(1)
    for m in _KV.finditer(text):
        requested[m.group(1)] = m.group(2)
    source = "text" if requested else None
    bound = b.get("requested")
    if bound:
        requested, source = {**requested, **bound}, "binding"
    url = b.get("url")
    if not url:
        m = re.search(rec.url, text)
        url = m.group(1).rstrip(".,;") if m else None
    unit = b.get("unit")
    if not unit:
        m = re.search(rec.unit, text)
        unit = m.group(1) if m else None
    if not unit:
        for name in unit_names or []:
            short = name.removesuffix(".service")
            if re.search(rf"(?<![\w.-]){re.escape(short)}(?![\w-])", text):
                unit = name
                break
    repair = bool(re.search(rec.repair, text, re.IGNORECASE))
    return Targets(url, unit, requested, source, repair)


def referenced(items: list[Item] | tuple[Item, ...]) -> tuple[list[str], list[str]]:
    """(urls, units) the open items name, so `plan check` observes what the plan is about."""
    urls: list[str] = []
    units: list[str] = []
    for it in items:
        if it.is_open:
            t = targets(it)
            if t.url and t.url not in urls:
                urls.append(t.url)
            if t.unit and t.unit not in units:
                units.append(t.unit)
    return urls, units


def _norm_url(url: str) -> str:
    return url.strip().rstrip("/").lower().removesuffix("/v1")


def _objects(value: object) -> list[JsonObject]:
    """The objects of an observed list (`servers`, `services`); anything else in it is skipped."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list | tuple) else []


def _object(value: JsonValue | None) -> JsonObject:
    return value if isinstance(value, dict) else {}


def check(items: list[Item] | tuple[Item, ...], observation: Mapping[str, object]) -> list[Finding]:
    """Hold every open item against an observation (the JSON object `servelab status` produces)."""
    servers = _objects(observation.get("servers"))
    services = _objects(observation.get("services"))
    units = [str(s.get("unit")) for s in services if s.get("unit")]
    by_id = {i.id: i for i in items}
    out: list[Finding] = []
    for it in items:
        if not it.is_open:
            continue
        gone = [d for d in it.depends_on if d in by_id and by_id[d].status == "cancelled"]
        if gone:
            out.append(
                Finding(
                    it.id,
                    "dependency_cancelled",
                    "warning",
                    f"item {it.id} waits for cancelled item(s) {', '.join(gone)}; it can never start",
                    {"dependencies": list(gone)},
                )
            )
        t = targets(it, units)
        healthy = _repaired_server(it, t, servers)
        if healthy is not None:
            out.append(healthy)
        elif it.status == "in_progress":
            out.extend(_check_server(it, t, servers))
        out.extend(_check_service(it, t, services))
    return out


def _repaired_server(it: Item, t: Targets, servers: list[JsonObject]) -> Finding | None:
    """An item about repairing the server it names ("restart the crashed server at URL") while that server
    answers healthy: the assumption that it is down no longer holds."""
    if not (t.repair and t.url):
        return None
    srv = next((s for s in servers if _norm_url(str(s.get("url", ""))) == _norm_url(t.url)), None)
    if srv is None or not srv.get("up"):
        return None
    return Finding(
        it.id,
        "server_healthy",
        "warning",
        f"item {it.id} is about repairing {t.url}, which answers healthy "
        f"({srv.get('engine') or 'a server'}, {srv.get('running', 0)} running, {srv.get('waiting', 0)} waiting)",
        {"url": t.url, "server": srv},
    )


def _check_server(it: Item, t: Targets, servers: list[JsonObject]) -> list[Finding]:
    out: list[Finding] = []
    pool = servers
    if t.url:
        srv = next((s for s in servers if _norm_url(str(s.get("url", ""))) == _norm_url(t.url)), None)
        if srv is None:
            return [
                Finding(
                    it.id,
                    "server_unobserved",
                    "info",
                    f"item {it.id} is about {t.url}, which the observation does not include",
                    {"url": t.url, "hint": f"servelab plan check --url {t.url}"},
                )
            ]
        if not srv.get("up"):
            return [
                Finding(
                    it.id,
                    "server_down",
                    "warning",
                    f"item {it.id} is in progress but its server {t.url} is down",
                    {"url": t.url, "server": srv},
                )
            ]
        pool = [srv]
    elif t.requested:
        if not servers:
            return [
                Finding(
                    it.id,
                    "server_unobserved",
                    "info",
                    f"item {it.id} is an experiment in progress but no server was observed",
                    {"hint": "pass --url URL to say which server runs it"},
                )
            ]
        if not any(s.get("up") for s in servers):
            return [
                Finding(
                    it.id,
                    "server_down",
                    "warning",
                    f"item {it.id} is an experiment in progress but no observed server is up",
                    {"servers": [s.get("url") for s in servers]},
                )
            ]
    if not t.requested:
        return out
    up = [s for s in pool if s.get("up")]
    results = []
    for s in up:
        lines = _object(s.get("evidence"))
        mism, unconfirmed = compare(
            t.requested, _object(s.get("effective")), {k: v for k, v in lines.items() if isinstance(v, str)}
        )
        results.append((s, mism, unconfirmed))
    if any(not m and not u for _s, m, u in results) or not results:
        return out
    wrong = [(s, m) for s, m, _u in results if m]
    if wrong and len(wrong) == len(results):
        sentences = [f"{s.get('url')}: {m.sentence()}" for s, ms in wrong for m in ms]
        out.append(
            Finding(
                it.id,
                "config_mismatch",
                "warning",
                f"item {it.id} assumes {_kv(t.requested)}, but " + "; ".join(sentences),
                {
                    "requested": t.requested,
                    "requested_from": t.requested_from,
                    "mismatches": [{"url": s.get("url"), **m.to_dict()} for s, ms in wrong for m in ms],
                },
            )
        )
    elif not wrong:
        out.append(
            Finding(
                it.id,
                "config_unconfirmed",
                "info",
                f"item {it.id} assumes {_kv(t.requested)}; no observed server shows "
                f"{', '.join(sorted({k for _s, _m, u in results for k in u}))}",
                {"requested": t.requested, "requested_from": t.requested_from},
            )
        )
    return out


def _check_service(it: Item, t: Targets, services: list[JsonObject]) -> list[Finding]:
    unit, how = t.unit, "named"
    if not unit and t.repair and re.search(r"\bservice\b", it.content, re.IGNORECASE) and len(services) == 1:
        unit, how = str(services[0].get("unit")), "the only observed service"
    if not unit:
        return []
    svc = next(
        (
            s
            for s in services
            if str(s.get("unit", "")).removesuffix(".service") == unit.removesuffix(".service")
        ),
        None,
    )
    if svc is None:
        return [
            Finding(
                it.id,
                "service_unobserved",
                "info",
                f"item {it.id} is about {unit}, which the observation does not include",
                {"unit": unit},
            )
        ]
    active, sub = svc.get("active_state"), svc.get("sub_state")
    ev = {
        "unit": svc.get("unit"),
        "active_state": active,
        "sub_state": sub,
        "restarts": svc.get("restarts"),
        "since": svc.get("since"),
        "recognized_from": how,
    }
    if t.repair and active == "active" and sub in ("running", None):
        restarts = svc.get("restarts") or 0
        tail = f"; it restarted {restarts} time(s), check it is not flapping" if restarts else ""
        return [
            Finding(
                it.id,
                "service_healthy",
                "warning",
                f"item {it.id} is about repairing {svc.get('unit')}, which is active ({sub or 'running'})"
                f"{' since ' + str(svc['since']) if svc.get('since') else ''}{tail}",
                ev,
            )
        ]
    if it.status == "in_progress" and not t.repair and active in ("failed", "inactive"):
        return [
            Finding(
                it.id,
                "service_down",
                "warning",
                f"item {it.id} is in progress but {svc.get('unit')} is {active} ({sub})",
                ev,
            )
        ]
    return []


def _kv(d: JsonObject) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())
