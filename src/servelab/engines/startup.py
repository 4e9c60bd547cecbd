"""Start-up phases read from an engine's own log lines (data/startup_phases.toml), and whether its compile
cache was empty at launch (cold) or not (warm).

`StartupReader` is fed the log as it grows (each chunk with the seconds since launch it was seen at) and
answers a `servelab.startup.StartupPhases` once the server is ready; `parse` reads a whole log at once
(no times then, only the engine's own figures). `cache_at_launch` looks at the engine's compile cache
directory right before the launch: the one thing the log cannot tell after the fact.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from servelab.startup import PHASES, Cache, StartupPhase, StartupPhases


@dataclass(frozen=True)
class CacheRule:
    """Where an engine keeps its compile cache, and the log lines that say it was used or filled."""

    env: str
    default: str
    subdir: str
    warm: tuple[re.Pattern[str], ...]
    cold: tuple[re.Pattern[str], ...]

    def directory(self, environ: Mapping[str, str]) -> Path | None:
        root = environ.get(self.env) if self.env else None
        root = root or self.default
        if not root:
            return None
        path = Path(root).expanduser()
        return path / self.subdir if self.subdir else path


@dataclass(frozen=True)
class Rules:
    """An engine's phase patterns, in phase order, and its compile cache."""

    phases: tuple[tuple[str, re.Pattern[str]], ...]
    cache: CacheRule


def _patterns(items: object) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(str(p)) for p in items) if isinstance(items, list) else ()


def _cache(table: object) -> CacheRule:
    t = table if isinstance(table, dict) else {}
    return CacheRule(
        str(t.get("env", "")),
        str(t.get("default", "")),
        str(t.get("subdir", "")),
        _patterns(t.get("warm")),
        _patterns(t.get("cold")),
    )


@functools.cache
def all_rules() -> dict[str, Rules]:
    """Every engine's rules, read once from data/startup_phases.toml."""
    data = tomllib.loads(resources.files("servelab.data").joinpath("startup_phases.toml").read_text())
    out: dict[str, Rules] = {}
    for engine, table in data.items():
        if "like" in table:
            continue
        phases = table.get("phases", {})
        unknown = set(phases) - set(PHASES)
        if unknown:
            raise ValueError(f"startup_phases.toml [{engine}.phases]: unknown phase {sorted(unknown)}")
        pats = tuple((name, p) for name in PHASES for p in _patterns(phases.get(name)))
        out[engine] = Rules(pats, _cache(table.get("cache")))
    for engine, table in data.items():
        if "like" in table:
            pats = tuple(pair for other in table["like"] for pair in out[other].phases)
            out[engine] = Rules(pats, _cache(table.get("cache")))
    return out


def rules_for(engine: str | None) -> Rules | None:
    """The engine's rules; None for an engine whose start-up servelab does not read (an external one)."""
    return all_rules().get(engine or "")


def _seconds(m: re.Match[str]) -> float | None:
    took = m.groupdict().get("took")
    return float(took.replace(",", "")) if took else None


def cache_at_launch(engine: str | None, environ: Mapping[str, str]) -> tuple[Cache, str]:
    """The engine's compile cache as a launch with environment `environ` finds it on this machine:
    ("cold", why) when its directory is missing or empty, ("warm", why) when it holds anything,
    ("unknown", "") when the engine keeps none servelab knows of."""
    rules = rules_for(engine)
    where = rules.cache.directory(environ) if rules else None
    if where is None:
        return "unknown", ""
    try:
        filled = where.is_dir() and any(os.scandir(where))
    except OSError:
        return "unknown", f"compile cache {where} unreadable at launch"
    if filled:
        return "warm", f"compile cache {where} held entries at launch"
    return "cold", f"compile cache {where} empty at launch"


class StartupReader:
    """Reads an engine's start-up log as it grows (`feed`) and answers its phases (`result`)."""

    def __init__(self, engine: str | None) -> None:
        self.rules = rules_for(engine)
        self.found: dict[str, StartupPhase] = {}
        self.warm: list[tuple[str, float | None]] = []
        self.cold: list[tuple[str, float | None]] = []

    def feed(self, text: str, at_s: float | None = None) -> None:
        """Complete log lines, seen `at_s` seconds after launch (None: not timed)."""
        if self.rules is None:
            return
        for line in text.splitlines():
            if not line.strip():
                continue
            for name, pattern in self.rules.phases:
                m = pattern.search(line)
                if m:
                    self.found[name] = StartupPhase(
                        name=name, line=line.strip()[-400:], at_s=at_s, took_s=_seconds(m)
                    )
                    break
            for seen, pats in ((self.warm, self.rules.cache.warm), (self.cold, self.rules.cache.cold)):
                m = next((x for x in (p.search(line) for p in pats) if x), None)
                if m:
                    seen.append((line.strip()[-400:], _seconds(m)))

    def result(
        self, total_s: float | None = None, launch: tuple[Cache, str] = ("unknown", "")
    ) -> StartupPhases:
        """The phases in log order; cold or warm as the launch saw the cache directory, else as the log
        says (a warm line and no compiling one: warm; a compiling one: cold)."""
        phases = tuple(sorted(self.found.values(), key=lambda p: PHASES.index(p.name)))
        evidence = [launch[1]] if launch[1] else []
        cache: Cache = launch[0]
        if self.warm or self.cold:
            said: Cache = "cold" if self.cold else "warm"
            evidence.append((self.cold or self.warm)[0][0])
            if cache == "unknown":
                cache = said
        took = [s for _, s in (*self.warm, *self.cold) if s is not None]
        return StartupPhases(
            phases=phases,
            total_s=None if total_s is None else round(total_s, 3),
            cache=cache,
            cache_evidence=tuple(evidence),
            compile_cache_s=round(sum(took), 3) if took else None,
        )


def parse(
    engine: str | None, text: str, total_s: float | None = None, launch: tuple[Cache, str] = ("unknown", "")
) -> StartupPhases:
    """A whole start-up log at once (the engine's own figures; no times seen)."""
    reader = StartupReader(engine)
    reader.feed(text)
    return reader.result(total_s, launch)


def with_launch(phases: StartupPhases, launch: tuple[Cache, str] | None) -> StartupPhases:
    """`phases` read from the log, told cold or warm by what the launch saw of the cache directory
    (which wins over the log: the log tells only an engine that says so)."""
    if launch is None or launch[0] == "unknown":
        return phases
    return phases.model_copy(
        update={"cache": launch[0], "cache_evidence": (launch[1], *phases.cache_evidence)}
    )
