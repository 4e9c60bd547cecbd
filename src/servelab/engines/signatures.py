"""Match a server log against the failure knowledge base (`signatures.toml`) and say what went wrong.

The table is data so that a new failure is one entry, not a code change. Matching rules:
- the log is first read like a clean one (`lognorm.normalise`: ANSI codes, docker/journald/process prefixes,
  lost newlines and hard-wrapped lines undone);
- each signature is a regex searched line by line; a signature may be limited to some engines and to the
  start-up or serving phase (serving: after the engine's first "ready" line, or near a line only a serving
  engine prints, `[serving_markers]`);
- fatal matches beat non-fatal ones (a slow-MoE warning never hides a crash); then the class with the higher
  priority wins (a root cause such as `nccl_shm` beats the generic "Engine core initialization failed");
  then the earliest line (the first error is usually the cause);
- nothing matched: class `unknown` with the tail that matters (the last traceback's last frames and
  exception, ERROR lines).
"""

from __future__ import annotations

import bisect
import math
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TypedDict, cast

from servelab.engines.base import Diagnosis, Setting, SettingValue
from servelab.engines.lognorm import normalise
from servelab.engines.logparse import redact_line
from servelab.errors import ConfigError

_MAX_EVIDENCE = 600  # characters of the matched line kept as evidence
_TAIL_LINES = 12
# Engines whose log looks like another's: the simulator speaks vLLM or SGLang.
_ALIASES: dict[str, tuple[str, ...]] = {"sim": ("vllm", "sglang")}

TIMEOUT_MARKER = "[servelab] start-up timed out"


def timeout_marker(after_s: float, last_state: str = "") -> str:
    """The line the lifecycle appends to a server's log when start-up times out (class `startup_timeout`)."""
    tail = f" ({last_state})" if last_state else ""
    return f"{TIMEOUT_MARKER} after {after_s:.0f} s{tail}"


@dataclass(frozen=True)
class Signature:
    klass: str
    pattern: re.Pattern[str]
    fatal: bool
    priority: int
    advice: str
    engines: tuple[str, ...] = ()
    phase: str = "any"  # any | startup | serving
    unless: re.Pattern[str] | None = None
    source: str = ""


_UNITS = {"KiB": 1 / 1024**2, "MiB": 1 / 1024, "GiB": 1.0, "GB": 1.0}


def _floor(x: float, step: float) -> float | int:
    """`x` rounded down to a multiple of `step` (an int for integer steps)."""
    n = math.floor(x / step + 1e-9)
    return int(n * step) if float(step).is_integer() else round(n * step, 6)


@dataclass(frozen=True)
class SettingRule:
    """Where a class's evidence line gives the setting to change (`[[setting]]`), by `kind`:

    - `fits`: groups asked and fits (or need and have GiB): the value that fits, rounded down to `multiple`;
    - `free`: groups asked, free and total GiB (a start-up check of free memory): the free share of the
      GPU, rounded down to `multiple`, less one `multiple`;
    - `headroom`: groups want (want_unit), free (free_unit) and total: an allocation that did not fit; the
      setting (read from the log by `tried`, else the engine's `default`) lowered by the shortfall's share
      of the GPU and one `multiple`;
    - `constant`: `value` (with `tried`), when the line alone names the setting (a CUDA-graph capture
      crash: run without graphs)."""

    klass: str
    name: str
    pattern: re.Pattern[str]
    kind: str = "fits"
    multiple: float = 1
    engines: tuple[str, ...] = ()
    unless: re.Pattern[str] | None = None  # headroom: not when the log shows this (weights still loading)
    tried: re.Pattern[str] | None = None  # headroom: the setting's value in the log (group value)
    default: tuple[tuple[str, float], ...] = ()  # headroom: the engine's default when the log is silent
    value: SettingValue | None = None  # constant
    tried_value: SettingValue | None = None  # constant
    reason: str = ""  # constant
    flags: tuple[tuple[str, SettingValue], ...] = ()

    def read(self, line: str, text: str = "", engines: tuple[str, ...] | None = None) -> Setting | None:
        if self.engines and engines is not None and not any(e in self.engines for e in engines):
            return None
        m = self.pattern.search(line)
        if m is None:
            return None
        g = m.groupdict()
        if self.kind == "constant":
            assert self.value is not None
            return Setting(self.name, self.value, self.reason, self.tried_value, self.flags)
        if self.kind == "free":
            asked, free, total = float(g["asked"]), float(g["free"]), float(g["total"])
            value = _floor(free / total, self.multiple) - self.multiple
            if value <= 0:
                return None
            reason = (
                f"{self.name} is {asked:g}; {free:g} of {total:g} GiB are free at start ({free / total:.2f})"
            )
            return Setting(self.name, round(value, 6), reason, asked, self.flags)
        if self.kind == "headroom":
            return self._headroom(g, text, engines)
        asked = int(g["asked"])
        if g.get("fits") is not None:
            fits = int(g["fits"])
            reason = f"{self.name} is {asked}; the log says {fits} fit in the KV cache"
        else:
            need, have = float(g["need"]), float(g["have"])
            fits = int(asked * have / need)
            reason = f"{self.name} is {asked}; its KV cache needs {need:g} GiB, {have:g} GiB are free"
        value = max(int(self.multiple), int(_floor(fits, self.multiple)))
        return Setting(self.name, value, reason, asked, self.flags)

    def _headroom(self, g: dict[str, str], text: str, engines: tuple[str, ...] | None) -> Setting | None:
        if self.unless is not None and self.unless.search(text):
            return None
        want = float(g["want"]) * _UNITS.get(g.get("want_unit") or "GiB", 1.0)
        free = float(g["free"]) * _UNITS.get(g.get("free_unit") or "GiB", 1.0)
        total = float(g["total"])
        found = list(self.tried.finditer(text)) if self.tried is not None else []
        defaults = dict(self.default)
        if found:
            tried, said = float(found[-1].group("value")), ""
        else:
            known = [defaults[e] for e in engines or () if e in defaults]
            if not known:
                return None
            tried, said = known[0], " (the engine's default)"
        short = max(want - free, 0.0)
        value = _floor(tried - short / total - self.multiple, self.multiple)
        if value < 0.1:
            return None
        reason = (
            f"{self.name} is {tried:g}{said}; {want:.2f} GiB did not fit in the {free:.2f} GiB free of "
            f"{total:g} GiB: leave {short:.2f} GiB more outside it"
        )
        return Setting(self.name, round(value, 6), reason, tried, self.flags)


# `class` is a keyword: the tables that hold it are declared in TypedDict's call form.
_ClassKey = TypedDict("_ClassKey", {"class": str}, total=False)


class SettingRow(_ClassKey, total=False):
    """One `[[setting]]` table as the TOML holds it (its `class` is passed to `_setting_rule` apart)."""

    name: str
    kind: str
    pattern: str
    multiple: float
    engines: list[str]
    unless: str
    tried: str | SettingValue
    default: dict[str, float]
    value: SettingValue
    reason: str
    flags: dict[str, SettingValue]
    source: str


def _setting_rule(i: int, klass: str, row: SettingRow) -> SettingRule:
    """One `[[setting]]` table, checked."""
    kind = row.get("kind", "fits")
    pattern = _compile(row["pattern"], f"setting #{i}")
    groups = set(pattern.groupindex)
    needs: dict[str, tuple[tuple[set[str], ...], str]] = {
        "fits": (({"asked", "fits"}, {"asked", "need", "have"}), "asked and fits (or need and have)"),
        "free": (({"asked", "free", "total"},), "asked, free and total"),
        "headroom": (({"want", "free", "total"},), "want, free and total"),
        "constant": ((set(),), ""),
    }
    if kind not in needs:
        raise ConfigError(f"setting #{i}: kind {kind!r} is not fits/free/headroom/constant")
    if not any(need <= groups for need in needs[kind][0]):
        raise ConfigError(f"setting #{i}: the pattern needs the groups {needs[kind][1]}")
    if kind == "constant" and ("value" not in row or not row.get("reason")):
        raise ConfigError(f"setting #{i}: a constant setting needs value and reason")
    tried_text = row.get("tried")
    tried = (
        _compile(tried_text, f"setting #{i} tried")
        if kind == "headroom" and isinstance(tried_text, str) and tried_text
        else None
    )
    return SettingRule(
        klass=klass,
        name=row["name"],
        pattern=pattern,
        kind=kind,
        multiple=float(row.get("multiple", 1)),
        engines=tuple(row.get("engines", ())),
        unless=_compile(row["unless"], f"setting #{i} unless") if row.get("unless") else None,
        tried=tried,
        default=tuple((str(k), float(v)) for k, v in row.get("default", {}).items()),
        value=row.get("value"),
        tried_value=row.get("tried") if kind == "constant" else None,
        reason=str(row.get("reason", "")),
        flags=tuple((str(k), v) for k, v in row.get("flags", {}).items()),
    )


class ClassRow(TypedDict, total=False):
    """One `[class.NAME]` table: a failure class's defaults for its signatures."""

    priority: int
    fatal: bool
    advice: str


class SignatureRow(_ClassKey, total=False):
    """One `[[signature]]` table."""

    pattern: str
    fatal: bool
    advice: str
    engines: list[str]
    phase: str
    unless: str
    source: str


# The whole table as the TOML holds it (`[serving_markers]` mixes the engines' patterns with `window`).
SignatureTable = TypedDict(
    "SignatureTable",
    {
        "class": dict[str, ClassRow],
        "signature": list[SignatureRow],
        "setting": list[SettingRow],
        "ready_markers": dict[str, list[str]],
        "serving_markers": dict[str, list[str] | list[int]],
    },
    total=False,
)


@dataclass(frozen=True)
class KnowledgeBase:
    signatures: tuple[Signature, ...]
    classes: dict[str, ClassRow]
    ready_markers: dict[str, tuple[re.Pattern[str], ...]]
    serving_markers: dict[str, tuple[re.Pattern[str], ...]]
    serving_window: tuple[int, int]  # lines before, lines after a match in which a serving marker counts
    settings: tuple[SettingRule, ...] = ()

    def setting(
        self, klass: str, line: str, text: str = "", engines: tuple[str, ...] | None = None
    ) -> Setting | None:
        """The setting to change that `line` (a `klass` evidence line of the log `text`, written by one of
        `engines`) gives figures for, if any."""
        for rule in self.settings:
            if rule.klass == klass and (found := rule.read(line, text, engines)) is not None:
                return found
        return None


def _compile(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.MULTILINE)
    except re.error as exc:
        raise ConfigError(
            f"bad regex in {where}: {exc}", hint="fix servelab/engines/signatures.toml"
        ) from exc


def parse_table(data: SignatureTable) -> KnowledgeBase:
    """Validate and compile a signature table (the packaged TOML, or a test's own)."""
    classes = data.get("class", {})
    if "unknown" not in classes:
        raise ConfigError(
            "signature table lacks [class.unknown]", hint="every table needs the fallback class"
        )
    sigs: list[Signature] = []
    for i, row in enumerate(data.get("signature", [])):
        klass = row.get("class")
        if klass is None or klass not in classes:
            raise ConfigError(
                f"signature #{i} names unknown class {klass!r}", hint="add a [class.NAME] table"
            )
        cls = classes[klass]
        phase = row.get("phase", "any")
        if phase not in ("any", "startup", "serving"):
            raise ConfigError(f"signature #{i}: phase {phase!r} is not any/startup/serving")
        sigs.append(
            Signature(
                klass=klass,
                pattern=_compile(row["pattern"], f"signature #{i} ({klass})"),
                fatal=bool(row.get("fatal", cls.get("fatal", True))),
                priority=int(cls.get("priority", 0)),
                advice=row.get("advice", cls.get("advice", "")),
                engines=tuple(row.get("engines", ())),
                phase=phase,
                unless=_compile(row["unless"], f"signature #{i} unless") if row.get("unless") else None,
                source=row.get("source", ""),
            )
        )
    markers = {
        engine: tuple(_compile(p, f"ready_markers.{engine}") for p in pats)
        for engine, pats in data.get("ready_markers", {}).items()
    }
    serving = data.get("serving_markers", {})
    window = serving.get("window", [0, 0])
    serving_markers = {
        engine: tuple(_compile(str(p), f"serving_markers.{engine}") for p in pats)
        for engine, pats in serving.items()
        if engine != "window"
    }
    settings = []
    for i, rule in enumerate(data.get("setting", [])):
        if rule.get("class") not in classes:
            raise ConfigError(f"setting #{i} names unknown class {rule.get('class')!r}")
        settings.append(_setting_rule(i, str(rule["class"]), rule))
    return KnowledgeBase(
        tuple(sigs), classes, markers, serving_markers, (int(window[0]), int(window[1])), tuple(settings)
    )


@cache
def knowledge_base() -> KnowledgeBase:
    """The packaged table, parsed once."""
    text = resources.files("servelab.engines").joinpath("signatures.toml").read_text()
    # Our own table, described by SignatureTable; parse_table checks what it reads (classes, phases, regexes).
    return parse_table(cast(SignatureTable, tomllib.loads(text)))


def classes() -> list[str]:
    """Every failure class the knowledge base knows, `unknown` included."""
    return list(knowledge_base().classes)


def guess_engine(text: str) -> str | None:
    """Which engine wrote this log, from lines only that engine prints (None: cannot tell)."""
    if re.search(r"\(APIServer pid=\d+\)|vLLM API server version|Initializing a V1 LLM engine", text):
        return "vllm"
    if re.search(r"server_args=|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP\d+\]|sglang", text):
        return "sglang"
    if re.search(r"llama_model_loader|llama_context|llama-server|ggml_cuda_init|srv +load_model", text):
        return "llamacpp"
    if re.search(r"transformers serve|transformers\.cli", text):
        return "transformers"
    return None


def _engines_for(engine: str | None) -> tuple[str, ...] | None:
    if engine is None:
        return None
    return _ALIASES.get(engine, (engine,))


def _ready_pos(text: str, engines: tuple[str, ...] | None, kb: KnowledgeBase) -> int:
    """Offset of the first ready line of the engine(s) (len(text)+1: never became ready)."""
    names = engines if engines is not None else tuple(kb.ready_markers)
    best = len(text) + 1
    for name in names:
        for marker in kb.ready_markers.get(name, ()):
            m = marker.search(text)
            if m and m.start() < best:
                best = m.start()
    return best


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end != -1 else len(text)]


def _evidence(line: str) -> str:
    line = redact_line(line.strip())
    return line if len(line) <= _MAX_EVIDENCE else line[: _MAX_EVIDENCE - 1] + "…"


def _applies(sig: Signature, engines: tuple[str, ...] | None) -> bool:
    return not sig.engines or engines is None or any(e in sig.engines for e in engines)


class _Phases:
    """Where in the server's life each line of a log is: serving after the ready line, or near a serving marker."""

    def __init__(self, text: str, engines: tuple[str, ...] | None, kb: KnowledgeBase) -> None:
        self.ready = _ready_pos(text, engines, kb)
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        names = engines if engines is not None else tuple(kb.serving_markers)
        self.serving_lines = sorted(
            {
                self._line(m.start())
                for name in names
                for marker in kb.serving_markers.get(name, ())
                for m in marker.finditer(text)
            }
        )
        self.before, self.after = kb.serving_window

    def _line(self, pos: int) -> int:
        return bisect.bisect_right(self.starts, pos) - 1

    def serving(self, pos: int) -> bool:
        if pos >= self.ready:
            return True
        line = self._line(pos)
        i = bisect.bisect_left(self.serving_lines, line - self.before)
        return i < len(self.serving_lines) and self.serving_lines[i] <= line + self.after


def _first_match(sig: Signature, text: str, phases: _Phases) -> int | None:
    for m in sig.pattern.finditer(text):
        pos = m.start()
        if sig.phase != "any" and phases.serving(pos) != (sig.phase == "serving"):
            continue
        if sig.unless is not None and sig.unless.search(text, 0, pos):
            continue
        return pos
    return None


def _best(text: str, engine: str | None, *, fatal_only: bool) -> tuple[Signature, int] | None:
    """The best match in `text` (already normalised); `engine` None: guessed from the text."""
    kb = knowledge_base()
    engines = _engines_for(engine)
    if engines is None:
        guessed = guess_engine(text)
        engines = _engines_for(guessed) if guessed else None
    phases = _Phases(text, engines, kb)
    best: tuple[tuple[int, int, int], Signature, int] | None = None
    for sig in kb.signatures:
        if (fatal_only and not sig.fatal) or not _applies(sig, engines):
            continue
        pos = _first_match(sig, text, phases)
        if pos is None:
            continue
        key = (int(sig.fatal), sig.priority, -pos)
        if best is None or key > best[0]:
            best = (key, sig, pos)
    return (best[1], best[2]) if best else None


def diagnose(text: str, engine: str | None = None) -> Diagnosis:
    """The most specific known failure in `text`; class `unknown` with the tail that matters otherwise.

    `engine` limits engine-specific signatures (None: guessed from the log, else all apply)."""
    engine = engine or guess_engine(text)
    text = normalise(text)
    found = _best(text, engine, fatal_only=False)
    if found is None:
        kb = knowledge_base()
        tail = important_tail(text)
        return Diagnosis(
            klass="unknown",
            evidence=tail[-1] if tail else "",
            advice=str(kb.classes["unknown"].get("advice", "")),
            tail=tail,
            fatal=False,
        )
    sig, pos = found
    line = _line_at(text, pos)
    return Diagnosis(
        klass=sig.klass,
        evidence=_evidence(line),
        advice=sig.advice,
        fatal=sig.fatal,
        setting=knowledge_base().setting(sig.klass, line, text, _engines_for(engine)),
    )


def healthy(text: str) -> Diagnosis | None:
    """A log that shows no failure: no signature, no traceback or error-ish line, and a line that says the
    server came up (`[healthy]` in the knowledge base). None otherwise. Kept apart from `diagnose`, whose
    `unknown` callers read as "failed for a reason we do not know" (a start that timed out, a server that
    stopped answering)."""
    engine = guess_engine(text)
    text = normalise(text)
    if _best(text, engine, fatal_only=False) is not None:
        return None
    if "Traceback (most recent call last)" in text or any(_ERRORISH.search(ln) for ln in text.splitlines()):
        return None
    data = tomllib.loads(resources.files("servelab.engines").joinpath("signatures.toml").read_text())
    up = [
        ln
        for ln in text.splitlines()
        if any(re.search(p, ln) for p in data.get("healthy", {}).get("patterns", []))
    ]
    if not up:
        return None
    advice = str(knowledge_base().classes["no_failure"].get("advice", ""))
    return Diagnosis(klass="no_failure", evidence=_evidence(_strip(up[-1])), advice=advice, fatal=False)


def fatal_in(text: str, engine: str | None = None) -> Diagnosis | None:
    """The most specific fatal failure in `text`, or None: lets the lifecycle stop waiting for readiness early."""
    engine = engine or guess_engine(text)
    text = normalise(text)
    found = _best(text, engine, fatal_only=True)
    if found is None:
        return None
    sig, pos = found
    line = _line_at(text, pos)
    setting = knowledge_base().setting(sig.klass, line, text, _engines_for(engine))
    return Diagnosis(
        klass=sig.klass, evidence=_evidence(line), advice=sig.advice, fatal=True, setting=setting
    )


# -- the tail that matters ---------------------------------------------------------------------------------

_PREFIX = re.compile(r"^(?:\([\w\s=-]+pid=\d+\)\s*)+|^\[[\d\- :]+(?: TP\d+)?\]\s*")
_LEVEL_PREFIX = re.compile(r"^(?:ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]+\]\s?")
_EXC = re.compile(
    r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Interrupt|Exit|Warning)\b(?::|$)|^[A-Za-z_][\w.]*Error: "
)
_ERRORISH = re.compile(
    r"\b(?:ERROR|CRITICAL|FATAL|Fatal|fatal error|error:)\b|\bAborted\b|Segmentation fault|Killed$"
)


def _strip(line: str) -> str:
    line = _PREFIX.sub("", line.rstrip())
    return _LEVEL_PREFIX.sub("", line)


def important_tail(text: str, limit: int = _TAIL_LINES) -> tuple[str, ...]:
    """The last traceback's last two frames and its exception, then the last ERROR-ish lines (in log order).

    With neither, the last non-empty lines. `text` is read like a clean log (`lognorm.normalise`)."""
    lines = normalise(text).splitlines()
    picked: list[int] = []
    tb_starts = [i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln]
    if tb_starts:
        start = tb_starts[-1]
        frames = [i for i in range(start, len(lines)) if _strip(lines[i]).lstrip().startswith('File "')]
        for f in frames[-2:]:
            picked += [f, f + 1] if f + 1 < len(lines) else [f]
        exc = [i for i in range(start, len(lines)) if _EXC.search(_strip(lines[i]).strip())]
        picked += exc[:3]
    errors = [i for i, ln in enumerate(lines) if _ERRORISH.search(ln) and 'File "' not in ln]
    picked += errors[-limit:]
    if not picked:
        picked = [i for i, ln in enumerate(lines) if ln.strip()][-limit:]
    seen: set[str] = set()
    out: list[str] = []
    for i in sorted(set(picked)):
        s = _evidence(_strip(lines[i]))
        if s and s not in seen:
            seen.add(s)
            out.append(s)
    return tuple(out[-limit:])
