"""Reading engine flags the way the engine's argparse would, to know what a candidate asks for.

Each adapter spells its engine's flags once (`Spellings`, by argparse dest: what it writes into a launch,
and what the simulator's personality of that engine parses), and declares a table over those spellings:
flag spelling -> (normalized key, kind). `scan` walks `extra_args` (both
`--flag value` and `--flag=value`), converts values, and lets the last occurrence win, as argparse does.
Unknown flags are skipped (the engine will judge them; `requested` only reports what servelab understands).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from servelab.engines.base import Settings
from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject, JsonValue

Kind = Literal["str", "int", "float", "true", "false", "json"]


@dataclass(frozen=True)
class Flag:
    key: str  # normalized key (or an adapter-internal one starting with "_")
    kind: Kind = "str"
    value: bool | None = None  # for "true"/"false" kinds: what the key becomes (default True / False)

    @property
    def takes_value(self) -> bool:
        return self.kind in ("str", "int", "float", "json")


@dataclass(frozen=True)
class Spelling:
    """One engine flag as the engine's argparse declares it: every name, in its order, and which of them
    servelab writes into a launch (SGLang declares `--tensor-parallel-size` first; we write `--tp-size`)."""

    names: tuple[str, ...]
    write: int = 0

    @property
    def written(self) -> str:
        return self.names[self.write]

    @property
    def off(self) -> str:
        """The switch's off form, as argparse's BooleanOptionalAction spells it (`--x` → `--no-x`)."""
        return "--no-" + self.names[0].removeprefix("--")


def spelled(*names: str, write: int = 0) -> Spelling:
    return Spelling(names, write)


class Spellings(dict[str, Spelling]):
    """An engine's flags spelled once, keyed by its argparse dest: its adapter writes and reads them, the
    simulator's personality of that engine parses them (issue 30)."""

    def written(self, dest: str) -> str:
        return self[dest].written


def table(rows: Iterable[tuple[tuple[str, ...], Flag]]) -> dict[str, Flag]:
    """Expand (aliases, flag) rows into one lookup by spelling."""
    out: dict[str, Flag] = {}
    for names, flag in rows:
        for name in names:
            out[name] = flag
    return out


def _convert(flag: Flag, name: str, raw: str) -> JsonValue:
    try:
        if flag.kind == "int":
            return int(raw)
        if flag.kind == "float":
            return float(raw)
        if flag.kind == "json":
            value: JsonValue = json.loads(raw)
            return value
    except ValueError as exc:
        raise ConfigError(
            f"engine flag {name} has an invalid value {raw!r}",
            hint=f"{name} expects {'JSON' if flag.kind == 'json' else 'an ' + flag.kind}",
        ) from exc
    return raw


def scan(args: Sequence[str], flags: Mapping[str, Flag]) -> JsonObject:
    """{normalized key: value} for the flags in `args` that the table knows; last one wins."""
    out: JsonObject = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        flag = flags.get(name) if name.startswith("-") else None
        if flag is None:
            i += 1
            continue
        if flag.takes_value:
            if eq:
                raw = inline
            elif i + 1 < len(args):
                raw = args[i + 1]
                i += 1
            else:
                raise ConfigError(f"engine flag {name} needs a value", hint=f"e.g. {name} VALUE")
            out[flag.key] = _convert(flag, name, raw)
        else:
            default = flag.kind == "true"
            out[flag.key] = flag.value if flag.value is not None else default
        i += 1
    return out


def python_for(options: Mapping[str, object], fallback: str = "python3") -> str:
    """The interpreter for python-launched engines: options["python"], $SERVELAB_ENGINES_PYTHON, else `fallback`."""
    explicit = options.get("python")
    if explicit:
        return str(explicit)
    return os.environ.get("SERVELAB_ENGINES_PYTHON") or fallback


def int_option(options: Mapping[str, object], key: str, default: int) -> int:
    """options[key] as `int()` reads it (the options model checked it is an integer), else `default`."""
    value = options.get(key, default)
    if isinstance(value, int | float | str):
        return int(value)
    raise ConfigError(f"engine option {key} must be an integer, not {value!r}")


def opt(flag: str, value: object) -> list[str]:
    """[flag, str(value)] when value is set, else []."""
    return [] if value is None else [flag, str(value)]


def typed_requested(s: Settings, served: str) -> JsonObject:
    """The normalized keys a candidate's typed settings ask for (engine flags come on top, per adapter)."""
    req: JsonObject = {"model": s.model, "served_model_name": served, "tp_size": s.tp, "pp_size": s.pp}
    if s.port:
        req["port"] = s.port
    for key, value in (
        ("dp_size", s.dp),
        ("ep_size", s.ep),
        ("quantization", s.quantization),
        ("kv_cache_dtype", s.kv_cache_dtype),
        ("max_running_requests", s.max_concurrency),
        ("mem_fraction", s.mem_fraction),
        ("max_model_len", s.max_model_len),
    ):
        if value is not None:
            req[key] = value
    return req
