"""Read an installed engine's flag schema where the candidate will run, and keep it per engine and version.

Python engines (vLLM, SGLang, transformers): the engine's own interpreter runs `servelab.engines.flagdump`
(its source, sent with `python -c`), which imports the engine's parser and prints it as JSON. llama.cpp:
`llama-server --help`. The simulator: its personality parsers, in this process. Commands go through the
host transport (`--host`: the engine installed on that box), first the cheap version probe, then, when no
schema of that engine and version is cached, the whole parser. The cache lives under
`paths.cache_home()/flag-schemas`, one JSON file per engine and version (and `flagdump.DUMP_FORMAT`);
another version reads afresh.

What cannot be read (the engine is not installed where this runs, a binary without `--help`) comes back as
`SchemaRead(schema=None, note=...)`: the launch would find out anyway, so the caller says the flags were
not checked, and why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from servelab.engines.base import Engine, Settings
from servelab.engines.flagdump import DUMP_FORMAT
from servelab.engines.flags import python_for
from servelab.engines.flagschema import FlagSchema, FlagSource, SchemaError, parse_dump, parse_help
from servelab.host import transport
from servelab.paths import cache_home

VERSION_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 300.0  # importing vLLM's parser takes ~15 s on an idle 2-core box; much more on a busy one
_SAFE = re.compile(r"[^A-Za-z0-9_.+-]+")
_LLAMA_VERSION = re.compile(r"version:?\s*(\d+)\s*\((\w+)\)")


@dataclass(frozen=True)
class SchemaRead:
    """An engine's flag schema as read for one candidate, or why there is none (`note`)."""

    engine: str
    schema: FlagSchema | None
    where: str  # "local", the SSH host, or "servelab" (the simulator)
    note: str = ""  # "cached" / "read" / why it could not be read
    sets: tuple[str, ...] = ()


def flag_source(engine: Engine) -> FlagSource | None:
    """The adapter's declared source of its flags (an outside adapter may declare none: not checked)."""
    src = getattr(engine, "flag_source", None)
    return src if isinstance(src, FlagSource) else None


def schema_dir() -> Path:
    return cache_home() / "flag-schemas"


def _cache_file(engine: str, version: str) -> Path:
    return schema_dir() / f"{_SAFE.sub('_', engine)}-{_SAFE.sub('_', version)}.v{DUMP_FORMAT}.json"


def _cached(engine: str, version: str) -> FlagSchema | None:
    path = _cache_file(engine, version)
    try:
        schema = parse_dump(path.read_text())
    except (OSError, SchemaError):
        return None
    return schema if schema.version == version and schema.engine == engine else None


def _store(schema: FlagSchema) -> None:
    path = _cache_file(schema.engine, schema.version)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(schema.to_json())
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the next read


def _run(host: transport.Host | None, argv: list[str], timeout: float) -> transport.Completed:
    if host is None:
        return transport.run_local(argv, None, timeout)
    return host.run(argv, timeout=timeout)


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def _dump_source() -> str:
    from servelab.engines import flagdump

    return Path(flagdump.__file__).read_text()


def _python_schema(
    engine: str, package: str, python: str, host: transport.Host | None
) -> tuple[FlagSchema | None, str]:
    source = _dump_source()
    probe = _run(host, [python, "-c", source, package, "--version"], VERSION_TIMEOUT_S)
    if probe.rc != 0:
        why = "not found" if probe.rc == 127 else _tail(probe.stderr) or f"exit {probe.rc}"
        return None, f"{package} is not installed for {python} ({why})"
    try:
        version = str(json.loads(probe.stdout)["version"])
    except (ValueError, KeyError, TypeError):
        return None, f"{python} did not print {package}'s version"
    if cached := _cached(engine, version):
        return cached, "cached"
    read = _run(host, [python, "-c", source, package], READ_TIMEOUT_S)
    if read.rc != 0:
        return None, f"{package} {version}'s parser could not be read ({_tail(read.stderr) or read.rc})"
    try:
        schema = parse_dump(read.stdout)
    except SchemaError as exc:
        return None, f"{package} {version}: {exc}"
    _store(schema)
    return schema, "read"


def _help_schema(engine: str, binary: str, host: transport.Host | None) -> tuple[FlagSchema | None, str]:
    probe = _run(host, [binary, "--version"], VERSION_TIMEOUT_S)
    m = _LLAMA_VERSION.search(probe.stdout + "\n" + probe.stderr)
    if probe.rc == 127 or m is None:
        return None, f"{binary} is not installed here ({_tail(probe.stderr) or 'no version printed'})"
    version = f"b{m.group(1)} ({m.group(2)})"
    if cached := _cached(engine, version):
        return cached, "cached"
    read = _run(host, [binary, "--help"], VERSION_TIMEOUT_S)
    try:
        schema = parse_help(read.stdout + "\n" + read.stderr, engine, version, f"{binary} --help")
    except SchemaError as exc:
        return None, str(exc)
    _store(schema)
    return schema, "read"


def read_schema(engine: Engine, s: Settings, host: transport.Host | None = None) -> SchemaRead:
    """The flag schema of `engine` as installed where these settings launch it (`host`: None is this
    machine). The simulator's comes from its personality, whatever the host."""
    src = flag_source(engine)
    where = "local" if host is None else host.name
    if src is None:
        return SchemaRead(engine.name, None, where, f"the {engine.name} adapter declares no flag source")
    if src.kind == "sim":
        from servelab.engines.sim import personality
        from servelab.sim.personalities import flag_schema

        return SchemaRead(engine.name, flag_schema(personality(s)), "servelab", "read", src.sets)
    if src.kind == "help":
        binary = str(s.options.get("binary") or "llama-server")
        schema, note = _help_schema(engine.name, binary, host)
    else:
        schema, note = _python_schema(engine.name, src.package, python_for(s.options), host)
    return SchemaRead(engine.name, schema, where, note, src.sets)


def read_key(engine: Engine, s: Settings) -> tuple[str, ...]:
    """What decides which schema `read_schema` returns: candidates with the same key share one read."""
    src = flag_source(engine)
    if src is None:
        return (engine.name,)
    if src.kind == "sim":
        return (engine.name, str(s.options.get("personality", "vllm")))
    if src.kind == "help":
        return (engine.name, str(s.options.get("binary") or "llama-server"))
    return (engine.name, python_for(s.options))
