"""An installed engine's flags as a typed schema, and the check of a study's engine flags against it.

The schema is read where the candidate will run (`servelab.host.flagschema`: the engine's own parser
dumped by its interpreter, llama.cpp's `--help`, the simulator's personality parsers) and checked here,
before anything launches: unknown flags (with the closest known spelling), values outside a flag's
choices, values of the wrong type, flags the engine marks deprecated or removed, and the flags servelab
itself writes into every launch (model, served name, host, port).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from servelab.engines.flagdump import ActionDump, ParserDump

Kind = Literal["bool", "int", "float", "str", "json", "any"]
Status = Literal["ok", "deprecated", "removed"]
_KINDS: tuple[Kind, ...] = ("bool", "int", "float", "str", "json", "any")
_STATUSES: tuple[Status, ...] = ("ok", "deprecated", "removed")
_NUMBER = re.compile(r"^-\d|^-\.\d")


@dataclass(frozen=True)
class FlagSource:
    """How an adapter's installed engine tells its flags: `python` (the engine's parser, dumped by its
    interpreter: `package` is the distribution whose version keys the cache), `help` (a binary's
    `--help`, llama.cpp), `sim` (the simulator's personality parsers, in-process). `sets`: the flags
    servelab writes into every launch, refused in a study's args."""

    kind: Literal["python", "help", "sim"]
    package: str = ""
    sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class FlagSpec:
    """One flag of the installed engine."""

    names: tuple[str, ...]
    dest: str
    kind: Kind = "str"
    nargs: str = "1"  # "0" (a switch), "1", "?", "+", "*", or a count
    choices: tuple[str, ...] | None = None
    status: Status = "ok"
    help: str = ""

    @property
    def takes_value(self) -> bool:
        return self.nargs != "0"


@dataclass(frozen=True)
class FlagSchema:
    """Every flag of one engine at one version, as read from where it is installed."""

    engine: str
    version: str
    flags: tuple[FlagSpec, ...]
    source: str = ""  # how it was read: "argparse (FlexibleArgumentParser)", "llama-server --help", ...
    underscores: bool = False  # --max_model_len is --max-model-len (vLLM)
    allow_abbrev: bool = False  # argparse takes a unique prefix of a long flag
    dotted_json: bool = False  # --json-flag.key VALUE (vLLM)
    _by_name: dict[str, FlagSpec] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f in self.flags:
            for n in f.names:
                self._by_name.setdefault(n, f)

    @property
    def names(self) -> list[str]:
        return sorted(self._by_name)

    def lookup(self, name: str) -> FlagSpec | None:
        """The flag a command-line name stands for, as the engine's parser would resolve it."""
        if self.underscores and name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        return self._by_name.get(name)

    def expands(self, name: str) -> str | None:
        """The one long flag `name` abbreviates, when the parser takes abbreviations."""
        if not (self.allow_abbrev and name.startswith("--") and len(name) > 3):
            return None
        hits = sorted(n for n in self._by_name if n.startswith(name))
        return hits[0] if len({id(self._by_name[h]) for h in hits}) == 1 else None

    def to_json(self) -> str:
        dump = ParserDump(
            engine=self.engine,
            version=self.version,
            parser=self.source,
            underscores=self.underscores,
            allow_abbrev=self.allow_abbrev,
            dotted_json=self.dotted_json,
            actions=[
                ActionDump(
                    names=list(f.names),
                    dest=f.dest,
                    kind=f.kind,
                    nargs=f.nargs,
                    choices=list(f.choices) if f.choices is not None else None,
                    status=f.status,
                    help=f.help,
                )
                for f in self.flags
            ],
        )
        return json.dumps(dump, indent=1)


class SchemaError(ValueError):
    """A parser dump or help text that does not describe an engine's flags."""


def _kind(v: str) -> Kind:
    for k in _KINDS:
        if v == k:
            return k
    raise SchemaError(f"unknown flag kind {v!r}")


def _status(v: str) -> Status:
    for s in _STATUSES:
        if v == s:
            return s
    raise SchemaError(f"unknown flag status {v!r}")


def from_dump(dump: ParserDump) -> FlagSchema:
    """A schema from `flagdump`'s JSON (what the engine's interpreter printed, or the cache kept)."""
    flags = tuple(
        FlagSpec(
            names=tuple(a["names"]),
            dest=a["dest"],
            kind=_kind(a["kind"]),
            nargs=a["nargs"],
            choices=tuple(a["choices"]) if a["choices"] is not None else None,
            status=_status(a["status"]),
            help=a["help"],
        )
        for a in dump["actions"]
    )
    if not flags:
        raise SchemaError(f"{dump['engine']} {dump['version']}: the parser declares no flags")
    return FlagSchema(
        engine=dump["engine"],
        version=dump["version"],
        flags=flags,
        source=dump["parser"],
        underscores=dump["underscores"],
        allow_abbrev=dump["allow_abbrev"],
        dotted_json=dump["dotted_json"],
    )


def parse_dump(text: str) -> FlagSchema:
    """`from_dump` over JSON text; a document that is not a dump raises SchemaError."""
    try:
        raw = json.loads(text)
        dump = ParserDump(
            engine=str(raw["engine"]),
            version=str(raw["version"]),
            parser=str(raw["parser"]),
            underscores=bool(raw["underscores"]),
            allow_abbrev=bool(raw["allow_abbrev"]),
            dotted_json=bool(raw["dotted_json"]),
            actions=[
                ActionDump(
                    names=[str(n) for n in a["names"]],
                    dest=str(a["dest"]),
                    kind=str(a["kind"]),
                    nargs=str(a["nargs"]),
                    choices=None if a["choices"] is None else [str(c) for c in a["choices"]],
                    status=str(a["status"]),
                    help=str(a["help"]),
                )
                for a in raw["actions"]
            ],
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SchemaError(f"not a flag schema: {exc}") from None
    return from_dump(dump)


# -- the check -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlagProblem:
    """One flag of a study's args the installed engine would refuse (or servelab must own)."""

    flag: str
    message: str


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NUMBER.match(token)


def _bad_value(spec: FlagSpec, name: str, value: str) -> str | None:
    if spec.choices is not None and value not in spec.choices:
        close = difflib.get_close_matches(value, spec.choices, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{name} {value!r} is not one of its choices: {', '.join(spec.choices)}{hint}"
    try:
        if spec.kind == "int":
            int(value)
        elif spec.kind == "float":
            float(value)
        elif spec.kind == "json":
            json.loads(value)
    except ValueError:
        what = {"int": "an integer", "float": "a number", "json": "JSON"}[spec.kind]
        return f"{name} expects {what}, not {value!r}"
    return None


def _suggest(schema: FlagSchema, name: str) -> str:
    pool = [n for n in schema.names if n.startswith("--") == name.startswith("--")]
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_args(args: Sequence[str], schema: FlagSchema, sets: Sequence[str] = ()) -> list[FlagProblem]:
    """What the installed engine (or servelab) would refuse in `args`, flag by flag, in order."""
    owned = {id(f) for n in sets if (f := schema.lookup(n)) is not None}
    problems: list[FlagProblem] = []
    label = f"{schema.engine} {schema.version}"
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not _is_flag(token):
            continue  # a positional, or the value of a flag taking several
        name, eq, inline = token.partition("=")
        spec = schema.lookup(name)
        if spec is None and schema.dotted_json and "." in name:
            base = schema.lookup(name.split(".", 1)[0])
            if base is not None and base.kind in ("json", "any"):
                i += 0 if eq else 1  # --json-flag.key VALUE: one key of a JSON flag
                continue
        if spec is None and not name.startswith("--") and len(name) > 2:
            short = schema.lookup(name[:2])  # -O3: a short flag with its value attached
            if short is not None and short.takes_value:
                inline, eq, spec = name[2:], "=", short
        if spec is None and (full := schema.expands(name)):
            problems.append(
                FlagProblem(
                    name, f"{name} abbreviates {full}: spell it in full (servelab reads flags by name)"
                )
            )
            continue
        if spec is None:
            problems.append(FlagProblem(name, f"{name}: {label} has no such flag{_suggest(schema, name)}"))
            continue
        values: list[str] = []
        if eq:
            values.append(inline)
        elif spec.nargs not in ("0", "?", "*"):
            count = int(spec.nargs) if spec.nargs.isdigit() else 1
            values = list(args[i : i + count])
            if len(values) < count or any(_is_flag(v) for v in values):
                problems.append(FlagProblem(name, f"{name} needs a value"))
                continue
            i += count
        if id(spec) in owned:
            problems.append(
                FlagProblem(
                    name,
                    f"{name}: servelab sets it for every launch (the model, its served name, host and port "
                    "come from the study's [model] and [engine]); remove it from args",
                )
            )
            continue
        if spec.status != "ok":
            note = f": {spec.help}" if spec.help else ""
            problems.append(FlagProblem(name, f"{name}: {label} marks it {spec.status}{note}"))
            continue
        if eq and not spec.takes_value:
            problems.append(FlagProblem(name, f"{name} is a switch and takes no value (got {inline!r})"))
            continue
        for value in values:
            if bad := _bad_value(spec, name, value):
                problems.append(FlagProblem(name, bad))
    return problems


# -- llama.cpp: `llama-server --help` ------------------------------------------------------------------

_CHOICE_FORMS = (
    re.compile(r"^\{([\w.-]+(?:,[\w.-]+)+)\}$"),  # {none,linear,yarn}
    re.compile(r"^\[([\w.-]+(?:\|[\w.-]+)+)\]$"),  # [on|off|auto]
    re.compile(r"^<([\w.-]+(?:\|[\w.-]+)+)>$"),  # <0|1>
)
_ALLOWED = re.compile(r"allowed values:\s*([\w.-]+(?:,\s*[\w.-]+)+)", re.I)
_METAVAR = re.compile(r"^[A-Z][A-Z0-9_]*$")
_QUOTED_WORD = re.compile(r"'[a-z]+'")


def _help_choices(placeholder: str) -> tuple[str, ...] | None:
    for rx in _CHOICE_FORMS:
        if m := rx.match(placeholder):
            return tuple(re.split(r"[,|]", m.group(1)))
    return None


def _help_flag(head: str, help_text: str) -> FlagSpec:
    names: list[str] = []
    words = head.split(" ")
    while words and words[0].startswith("-"):
        names.append(words.pop(0).rstrip(","))
    placeholder = " ".join(words)
    choices = _help_choices(placeholder)
    kind: Kind = "any"
    nargs = "1" if placeholder else "0"
    if not placeholder:
        kind = "bool"
    elif choices is not None:
        kind = "str"
    elif placeholder == "N":
        # N is any number in llama.cpp's help (--temp N takes 0.8); a help quoting words ('auto') takes those too
        kind = "any" if _QUOTED_WORD.search(help_text) else "float"
    elif len(words) > 1 and all(_METAVAR.match(w) for w in words):
        nargs = str(len(words))  # --lora-scaled FNAME SCALE
    dest = max(names, key=len).lstrip("-").replace("-", "_")
    return FlagSpec(tuple(names), dest, kind, nargs, choices, "ok", help_text)


def _finish_help(flag: FlagSpec) -> FlagSpec:
    choices = flag.choices
    if choices is None and flag.takes_value and (m := _ALLOWED.search(flag.help)):
        choices = tuple(x.strip() for x in m.group(1).split(","))
    kind: Kind = "str" if choices is not None and flag.takes_value else flag.kind
    status: Status = "deprecated" if re.search(r"\bdeprecated\b", flag.help, re.I) else "ok"
    return FlagSpec(flag.names, flag.dest, kind, flag.nargs, choices, status, flag.help[:300])


def parse_help(text: str, engine: str, version: str, source: str) -> FlagSchema:
    """A schema from a `--help` text in llama.cpp's layout: an option line starts at column 0 with its
    names (comma separated), a value placeholder when it takes one (`N`, `FNAME`, `{a,b}`, `[on|off]`,
    `<0|1>`), then, after two spaces or on the indented lines below, its help; "allowed values: a, b"
    there gives the choices, "(DEPRECATED)" marks it deprecated. `----- x params -----` banners and
    anything before the first option line (backend loading) are skipped."""
    flags: list[FlagSpec] = []
    for raw in text.splitlines():
        if raw.startswith("-----"):
            continue
        if raw.startswith("-"):
            line = re.sub(r",\s+", ", ", raw.rstrip())
            parts = re.split(r"\s{2,}", line, maxsplit=1)
            head, rest = parts[0], parts[1] if len(parts) > 1 else ""
            flags.append(_help_flag(head.strip(), " ".join(rest.split())))
        elif flags and raw[:1].isspace() and raw.strip():
            last = flags[-1]
            flags[-1] = FlagSpec(
                last.names,
                last.dest,
                last.kind,
                last.nargs,
                last.choices,
                last.status,
                " ".join((last.help + " " + raw.strip()).split()),
            )
    if not flags:
        raise SchemaError(f"{source}: no option lines found")
    return FlagSchema(
        engine=engine, version=version, flags=tuple(_finish_help(f) for f in flags), source=source
    )


# -- an argparse usage message (what an argparse engine prints when it refuses an argument) ------------


def _usage_groups(text: str) -> list[str]:
    """The top-level items of an argparse usage: `[--x X]` groups (brackets stripped) and bare required
    `--y Y` pairs."""
    body = " ".join(text.split())
    body = re.sub(r"^usage:\s*\S+\s*", "", body)
    out: list[str] = []
    depth, start, i = 0, 0, 0
    bare: list[str] = []
    while i < len(body):
        ch = body[i]
        if ch == "[":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                out.append(body[start:i].strip())
        elif depth == 0 and not ch.isspace():
            j = body.find(" ", i)
            j = len(body) if j < 0 else j
            bare.append(body[i:j])
            i = j
            continue
        i += 1
    k = 0
    while k < len(bare):  # required options: `--model-path MODEL_PATH`
        if bare[k].startswith("-"):
            has_value = k + 1 < len(bare) and not bare[k + 1].startswith("-")
            out.append(" ".join(bare[k : k + 2]) if has_value else bare[k])
            k += 2 if has_value else 1
        else:
            k += 1
    return out


def parse_usage(text: str, engine: str, version: str, source: str) -> FlagSchema:
    """A schema from an argparse usage message (each flag under its first name, its metavar or `{a,b}`
    choices, `[X]` / `X [X ...]` / `[X ...]` for nargs ?, +, *). A usage names no types and no aliases:
    values are checked against choices only, and the schema is what the message shows."""
    flags: list[FlagSpec] = []
    for group in _usage_groups(text.split("\n" + text.split(":", 1)[0] + ": error:")[0]):
        words = group.split(" ", 1)
        name = words[0]
        if not name.startswith("-") or name in ("-h", "--help"):
            continue
        value = words[1].strip() if len(words) > 1 else ""
        nargs = "0" if not value else "1"
        if value.endswith("...]"):
            nargs = "*" if value.startswith("[") else "+"
        elif value.startswith("[") and value.endswith("]"):
            nargs = "?"
        core = value.strip("[]").split(" ")[0] if value else ""
        m = re.fullmatch(r"\{([^}]*)\}", core)
        choices = tuple(m.group(1).split(",")) if m else None
        kind: Kind = "bool" if nargs == "0" else ("str" if choices else "any")
        flags.append(FlagSpec((name,), name.lstrip("-").replace("-", "_"), kind, nargs, choices))
    if not flags:
        raise SchemaError(f"{source}: no usage found")
    return FlagSchema(engine=engine, version=version, flags=tuple(flags), source=source, allow_abbrev=True)
