"""Parsing helpers for engine start-up logs: Python reprs, `key=value` config dumps, log prefixes.

Engines print their configuration as Python reprs: vLLM's `non-default args: {...}` dict, its
`with config: model='...', tensor_parallel_size=8, compilation_config={...}, kernel_config=KernelConfig(...)`
line, SGLang's `server_args=ServerArgs(...)` (old) and `server_args={...}` (new). Values may contain enum
reprs (`<CUDAGraphMode.NONE: 0>`), bare names (`torch.bfloat16`, `auto`) and nested calls, so values are
evaluated with `ast.literal_eval` only (never `eval`), after turning enum reprs into strings; whatever is not
a literal stays a string.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from servelab.engines.base import EffectiveConfig
from servelab.jsontypes import JsonValue
from servelab.redact import MASK, redact_text

_ENUM_REPR = re.compile(r"<([A-Za-z_][\w.]*): [^<>]*>")
_CALL = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)$", re.DOTALL)
_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}


def literal(text: str) -> object:
    """A Python literal from its repr; enum reprs become their names; non-literals stay as stripped text.
    Any Python literal may come back (a tuple, a set), so readers narrow what they take."""
    text = text.strip()
    cleaned = _ENUM_REPR.sub(lambda m: repr(m.group(1)), text)
    try:
        return ast.literal_eval(cleaned)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        call = _CALL.match(text)
        if call and _matching(text, call.end(1)) == len(text) - 1:  # Namespace(...) / KernelConfig(...)
            return {"__call__": call.group(1), **parse_kv(call.group(2))}
        return text


def _outside_quotes(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, char, bracket depth after it) for each character outside quotes; an enum repr at the top
    level (`<X.Y: 2>`) is skipped whole, since it holds no separator."""
    depth: list[str] = []
    quote: str | None = None
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in ("'", '"'):
            quote = c
        else:
            if c in _OPEN:
                depth.append(_OPEN[c])
            elif c in _CLOSE and depth and depth[-1] == c:
                depth.pop()
            elif c == "<" and not depth:
                end = text.find(">", i)
                if end != -1 and ":" in text[i:end]:
                    i = end + 1
                    continue
            yield i, c, len(depth)
        i += 1


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside brackets and quotes (reprs nest (), [], {} and quote with ' or ")."""
    parts: list[str] = []
    start = 0
    for i, c, depth in _outside_quotes(text):
        if c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    tail = text[start:]
    if tail.strip():
        parts.append(tail)
    return parts


def parse_kv(text: str) -> dict[str, object]:
    """`a=1, b='x', c=Foo(d=2)` -> {'a': 1, 'b': 'x', 'c': {'__call__': 'Foo', 'd': 2}}; pieces without `=` are skipped."""
    out: dict[str, object] = {}
    for part in split_top(text):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*", key):
            continue
        out[key] = literal(value)
    return out


def dict_after(line: str, marker: str) -> dict[str, object] | None:
    """The dict literal that follows `marker` in `line` (`non-default args: {...}`), or None."""
    idx = line.find(marker)
    if idx == -1:
        return None
    body = line[idx + len(marker) :].strip()
    end = _matching(body, 0)
    if not body.startswith("{") or end is None:
        return None
    value = literal(body[: end + 1])
    return value if isinstance(value, dict) else None


def call_after(line: str, marker: str) -> dict[str, object] | None:
    """The key=value list inside `Name(...)` that follows `marker` (`server_args=ServerArgs(...)`), or None."""
    idx = line.find(marker)
    if idx == -1:
        return None
    body = line[idx + len(marker) :]
    paren = body.find("(")
    if paren == -1:
        return None
    end = _matching(body, paren)
    inner = body[paren + 1 : end] if end is not None else body[paren + 1 :]
    return parse_kv(inner)


def _matching(text: str, start: int) -> int | None:
    """Index of the bracket closing the one at `start` (quotes respected), or None when the line is cut."""
    if start >= len(text) or text[start] not in _OPEN:
        return None
    for i, c, depth in _outside_quotes(text, start):
        if depth == 0 and c in _CLOSE:
            return i
    return None


def to_int(text: str) -> int | None:
    """'2,097,152' -> 2097152."""
    try:
        return int(text.replace(",", "").replace("_", ""))
    except ValueError:
        return None


def dtype_name(value: object) -> object:
    """'torch.bfloat16' -> 'bfloat16' (engines print torch dtypes; users write the short name)."""
    if isinstance(value, str) and value.startswith("torch."):
        return value[len("torch.") :]
    return value


def none_if_auto(value: object) -> object:
    return None if value in (None, "auto", "") else value


def json_value(value: object) -> JsonValue:
    """A parsed log value as JSON, the form an effective configuration is stored and printed in: scalars
    as they are, tuples and lists as lists, a set sorted (as `--json` printed it), dicts with their keys
    as text, anything else (bytes, a complex number) as its text."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, set | frozenset):
        return [json_value(v) for v in sorted(value)]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    return str(value)


_EVIDENCE_MAX = 400


def excerpt(line: str, *needles: str, width: int = 160, head: int = 120) -> str:
    """The log line as evidence; a long one (a whole config dump) keeps its head (timestamp, marker) and a
    window around the first needle found, so the evidence still shows the value it proves."""
    line = line.strip()
    if len(line) <= _EVIDENCE_MAX:
        return line
    for needle in needles:
        at = line.find(needle)
        if at != -1:
            end = min(len(line), at + len(needle) + width)
            start = max(0, at - width // 4)
            if start <= head:
                return line[:end] + ("…" if end < len(line) else "")
            return line[:head] + " … " + line[start:end] + ("…" if end < len(line) else "")
    return line[:_EVIDENCE_MAX] + "…"


# Dict reprs quote the key (`'api_key': 'abc'`), which the generic redaction does not expect.
_QUOTED_SECRET = re.compile(
    r"""((['"])(?:api[_-]?key|admin_api_key|token|hf_token|secret|password)\2\s*:\s*(['"]))(?!\[REDACTED\]|\*\*\*)[^'"]+"""
)


def redact_line(line: str) -> str:
    """A log line safe to show or store: secrets in flags, `key=value` and dict reprs masked."""
    line = redact_text(line)
    return _QUOTED_SECRET.sub(lambda m: m.group(1) + MASK, line)


def finish(cfg: EffectiveConfig) -> EffectiveConfig:
    """Redact every evidence line (config dumps can carry API keys) before anything prints or stores it."""
    cfg.evidence = {k: redact_line(v) for k, v in cfg.evidence.items()}
    return cfg
