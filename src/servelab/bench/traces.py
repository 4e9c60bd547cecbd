"""Request traces (Mooncake, BurstGPT, Azure) read into one typed shape, and the prompts that replay them.

What each format's fields are, their units and where the format is published is data
(`data/traces.toml`), not code: one reader serves every format that file names. A trace's prompts are
built from its `hash_ids` blocks, so two requests that share an id share that exact text at that
position: the prefix reuse a server sees is the one the trace recorded, no more, no less.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from servelab.bench.workload import Prompt, TokenCounter, _fit_words, _words
from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject

# As bench.config.MAX_TOKENS (which imports this room's neighbours, not this module): a length over it
# is a corrupt row, not a prompt any model could take.
_MAX_TOKENS = 1 << 21
_DOCS = "docs/cli/bench.md, 'Trace replay', names each format's fields"


@dataclass(frozen=True, slots=True)
class TraceFormat:
    """One format as `data/traces.toml` describes it."""

    name: str
    title: str
    source: str
    layout: str  # "jsonl" | "csv"
    timestamp: str
    unit: str  # "ms" | "s" | "datetime"
    input: str
    output: str
    hash_ids: str | None
    block_tokens: int | None
    columns: tuple[str, ...]
    notes: str

    def hint(self) -> str:
        fields = f"{self.timestamp} ({self.unit}), {self.input}, {self.output}"
        if self.hash_ids:
            fields += f", {self.hash_ids}"
        kind = "JSON lines" if self.layout == "jsonl" else "CSV with a header row"
        return f"a {self.name} trace is {kind} with {fields} ({self.source}); {_DOCS}"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrived (seconds after the trace's first request) and its lengths.

    `hash_ids` are the prompt's blocks in order (`block_tokens` each), empty where the format has none."""

    offset_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace file, read: its requests in arrival order, and how many rows were skipped (a zero
    length: nothing to send or nothing to measure; BurstGPT writes 0 response tokens for a failure)."""

    format: str
    path: str
    requests: tuple[TraceRequest, ...]
    source: str
    block_tokens: int | None = None
    skipped: int = 0
    total: int = field(default=0)  # requests in the file (rows skipped aside), before any slice

    @property
    def span_s(self) -> float:
        return self.requests[-1].offset_s if self.requests else 0.0

    def sliced(self, limit: int | None = None, until_s: float | None = None) -> Trace:
        """The first `limit` requests, and of those the ones that arrive before `until_s` (trace time)."""
        reqs = self.requests[:limit] if limit is not None else self.requests
        if until_s is not None:
            reqs = tuple(r for r in reqs if r.offset_s < until_s) or reqs[:1]
        return replace(self, requests=reqs)


def describe(trace: Trace) -> JsonObject:
    """What a run stores of its trace: the file, its source, how much of it was replayed."""
    return {
        "format": trace.format,
        "path": trace.path,
        "source": trace.source,
        "requests": len(trace.requests),
        "requests_in_file": trace.total,
        "skipped": trace.skipped,
        "span_s": trace.span_s,
        "shared_blocks": sum(len(r.hash_ids) for r in trace.requests)
        - len({h for r in trace.requests for h in r.hash_ids}),
    }


@cache
def formats() -> dict[str, TraceFormat]:
    """Every format `data/traces.toml` names, by name."""
    data = tomllib.loads(resources.files("servelab.data").joinpath("traces.toml").read_text())
    out = {}
    for name, f in data["formats"].items():
        out[name] = TraceFormat(
            name=name,
            title=f["title"],
            source=f["source"],
            layout=f["layout"],
            timestamp=f["timestamp"],
            unit=f["unit"],
            input=f["input"],
            output=f["output"],
            hash_ids=f.get("hash_ids"),
            block_tokens=f.get("block_tokens"),
            columns=tuple(f["columns"]),
            notes=f["notes"],
        )
    return out


def detect_format(path: str | Path) -> str:
    """The format of a trace file from its first line: a JSON object is Mooncake's, a CSV header names
    its format by the timestamp column (`Timestamp`: BurstGPT, `TIMESTAMP`: Azure)."""
    first = _first_line(Path(path))
    for f in formats().values():
        if f.layout == "jsonl" and first.lstrip().startswith("{"):
            return f.name
        if f.layout == "csv" and f.timestamp in next(csv.reader([first]), []):
            return f.name
    raise ConfigError(
        f"--trace {path}: cannot tell its format from its first line {first[:80]!r}",
        hint=f"give --trace-format ({'|'.join(formats())}); {_DOCS}",
    )


def read_trace(path: str | Path, fmt: str | None = None) -> Trace:
    """Read a trace file; `fmt` None detects it. Errors name the file, the line and the field."""
    p = Path(path)
    name = fmt or detect_format(p)
    spec = formats().get(name)
    if spec is None:
        raise ConfigError(f"unknown trace format {name!r}", hint=f"one of {', '.join(formats())}")
    rows = _jsonl_rows(p, spec) if spec.layout == "jsonl" else _csv_rows(p, spec)
    parsed: list[tuple[float, TraceRequest]] = []
    skipped = 0
    for line, row in rows:
        bad = _Bad(p, line, spec)
        t = _timestamp(row, spec, bad)
        n_in = _count(row, spec.input, bad)
        n_out = _count(row, spec.output, bad)
        ids = _hash_ids(row, spec, bad) if spec.hash_ids else ()
        if n_in == 0 or n_out == 0:
            skipped += 1
            continue
        parsed.append((t, TraceRequest(0.0, n_in, n_out, ids)))
    if not parsed:
        raise ConfigError(
            f"trace {p} holds no request to replay"
            + (f" (all {skipped} rows have a zero length)" if skipped else ""),
            hint=spec.hint(),
        )
    parsed.sort(key=lambda x: x[0])  # stable: rows of one instant keep the file's order
    t0 = parsed[0][0]
    reqs = tuple(replace(r, offset_s=t - t0) for t, r in parsed)
    return Trace(name, str(p), reqs, spec.source, spec.block_tokens, skipped, len(reqs))


class _Bad:
    """Builds the error of one line: file, line, field, the format's hint."""

    def __init__(self, path: Path, line: int, spec: TraceFormat) -> None:
        self.path, self.line, self.spec = path, line, spec

    def __call__(self, name: str, what: str) -> ConfigError:
        return ConfigError(f"trace {self.path} line {self.line}: {name!r} {what}", hint=self.spec.hint())


def _first_line(p: Path) -> str:
    try:
        with p.open(encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                if line.strip():
                    return line.rstrip("\r\n")
    except FileNotFoundError:
        raise ConfigError(f"--trace {p} does not exist", hint="Give the path of a trace file.") from None
    except OSError as exc:
        raise ConfigError(f"--trace {p} cannot be read: {exc.strerror or exc}") from None
    raise ConfigError(f"trace {p} is empty", hint="Give a trace with at least one request.")


def _open(p: Path) -> Any:
    try:
        return p.open(encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise ConfigError(f"--trace {p} does not exist", hint="Give the path of a trace file.") from None
    except OSError as exc:
        raise ConfigError(f"--trace {p} cannot be read: {exc.strerror or exc}") from None


def _jsonl_rows(p: Path, spec: TraceFormat) -> Iterator[tuple[int, Mapping[str, object]]]:
    with _open(p) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ConfigError(f"trace {p} line {n}: not JSON ({exc})", hint=spec.hint()) from None
            if not isinstance(row, dict):
                raise ConfigError(
                    f"trace {p} line {n}: a JSON object is expected, got {type(row).__name__}",
                    hint=spec.hint(),
                )
            yield n, row


def _csv_rows(p: Path, spec: TraceFormat) -> Iterator[tuple[int, Mapping[str, object]]]:
    with _open(p) as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in (spec.timestamp, spec.input, spec.output) if c not in header]
        if missing:
            raise ConfigError(
                f"trace {p} line 1: the header lacks column(s) {', '.join(map(repr, missing))} "
                f"(it has {', '.join(map(repr, header)) or 'nothing'})",
                hint=spec.hint(),
            )
        try:
            for row in reader:
                if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                    continue
                yield reader.line_num, row
        except csv.Error as exc:
            raise ConfigError(f"trace {p} line {reader.line_num}: {exc}", hint=spec.hint()) from None


def _number(row: Mapping[str, object], name: str, bad: _Bad) -> float:
    if name not in row or row[name] is None or row[name] == "":
        raise bad(name, "is missing")
    v = row[name]
    if isinstance(v, bool):
        raise bad(name, f"must be a number, got {v!r}")
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise bad(name, f"must be a number, got {v!r}") from None
    if not isinstance(v, int | float) or not math.isfinite(v):
        raise bad(name, f"must be a finite number, got {v!r}")
    return float(v)


def _count(row: Mapping[str, object], name: str, bad: _Bad) -> int:
    v = _number(row, name, bad)
    if v < 0 or v != int(v):
        raise bad(name, f"must be a whole number of tokens ≥ 0, got {row[name]!r}")
    if v > _MAX_TOKENS:
        raise bad(name, f"is {int(v):,} tokens, longer than any model's context")
    return int(v)


def _timestamp(row: Mapping[str, object], spec: TraceFormat, bad: _Bad) -> float:
    name = spec.timestamp
    if spec.unit != "datetime":
        return _number(row, name, bad) / (1000.0 if spec.unit == "ms" else 1.0)
    text = row.get(name)
    if not isinstance(text, str) or not text.strip():
        raise bad(name, "is missing")
    return _datetime_s(text.strip(), lambda: bad(name, f"must be a date and time, got {text!r}"))


def _datetime_s(text: str, error: Any) -> float:
    """Seconds since the epoch of `YYYY-MM-DD HH:MM:SS[.fraction]`, every fraction digit kept (Azure's
    traces write 100 ns ticks: seven digits, one more than `datetime` holds)."""
    whole, _, frac = text.partition(".")
    try:
        base = dt.datetime.fromisoformat(whole)
    except ValueError:
        raise error() from None
    if frac and not frac.isdigit():
        raise error()
    if base.tzinfo is None:
        base = base.replace(tzinfo=dt.UTC)
    return base.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _hash_ids(row: Mapping[str, object], spec: TraceFormat, bad: _Bad) -> tuple[int, ...]:
    assert spec.hash_ids is not None
    ids = row.get(spec.hash_ids, [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise bad(spec.hash_ids, f"must be a list of whole numbers, got {str(ids)[:80]}")
    return tuple(ids)


class _Blocks:
    """The text of each hash id's block, a pure function of (seed, id): the same in every request."""

    def __init__(self, seed: int, block_tokens: int, counter: TokenCounter | None, per_word: float) -> None:
        self.seed, self.size, self.counter, self.per_word = seed, block_tokens, counter, per_word
        self._full: dict[int, list[str]] = {}

    def _words(self, hid: int) -> list[str]:
        if hid not in self._full:
            rng = random.Random(f"servelab-trace-block:{self.seed}:{hid}")
            n = max(1, round(self.size / self.per_word))
            if self.counter is not None:
                n = int(self.size * 1.5 / max(self.per_word, 0.5)) + 8  # overshoot, then cut in tokens
            self._full[hid] = _words(rng, n).split(" ")
        return self._full[hid]

    def text(self, hid: int, tokens: int) -> str:
        """The block's first `tokens` tokens (all of it at `block_tokens`)."""
        words = self._words(hid)
        if self.counter is None:
            return " ".join(words[: max(1, round(tokens / self.per_word))])
        return self.counter.cut(" ".join(words), tokens)


def trace_prompts(
    trace: Trace,
    seed: int,
    counter: TokenCounter | None = None,
    tokens_per_word: float = 1.0,
    overhead: int = 0,
) -> Iterator[Prompt]:
    """One prompt per request, `input_len` tokens (less the server's template `overhead` when counted
    in words): its hash id blocks first, then words of its own (a unique tag first) for any tokens past
    them. Without hash ids a prompt is all its own, like a synthetic one."""
    blocks = _Blocks(seed, trace.block_tokens or 512, counter, tokens_per_word)
    size = trace.block_tokens or 512
    for i, r in enumerate(trace.requests):
        target = r.input_len if counter else max(1, r.input_len - overhead)
        parts: list[str] = []
        used = 0
        for hid in r.hash_ids:
            if used >= target:
                break  # ids past the prompt's length are not part of it
            take = min(size, target - used)
            parts.append(blocks.text(hid, take))
            used += take
        rest = target - used
        if rest > 0:
            rng = random.Random(f"servelab-trace-tail:{seed}:{i}")
            tag = f"{seed}-{i}: "
            if counter is not None:  # the tag is inside the cut; count what the blocks took
                rest = max(1, target - counter.count(" ".join(parts) + " ")) if parts else rest
            else:  # the tag is one word more than asked: take it out of the words
                rest = max(1, rest - round(tokens_per_word))
            tail, _ = _fit_words(rng, rest, counter, tokens_per_word, prefix=tag)
            parts.append(tail)
        text = " ".join(parts)
        yield Prompt(text, r.output_len, counter.count(text) if counter else target)
