"""Known-answer sets: greedy prompts with answers a real model must give (data/verify/known_answers.toml)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject, JsonValue
from servelab.verify.calls import Completion
from servelab.verify.result import Check

DEFAULT_SET = "default"
FILE_HINT = (
    "a TOML file with `min_pass = 0.75`, `max_tokens = 16` and [[item]] tables holding id, prompt "
    "and/or chat, and expect_any = [..]; see src/servelab/data/verify/known_answers.toml"
)


@dataclass(frozen=True)
class Item:
    id: str
    prompt: str | None
    chat: str | None
    expect_any: tuple[str, ...]


@dataclass(frozen=True)
class AnswerSet:
    name: str
    items: tuple[Item, ...]
    min_pass: float = 0.75
    max_tokens: int = 16

    def prompts(self, api: str) -> list[tuple[Item, str]]:
        """The items usable with this API and the text to send."""
        key = "chat" if api == "chat" else "prompt"
        return [(it, getattr(it, key)) for it in self.items if getattr(it, key)]


def _iterable(value: object) -> Iterable[object]:
    if not isinstance(value, Iterable):
        raise TypeError(f"{type(value).__name__!r} object is not iterable")
    return value


def _table(value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise TypeError(f"an item is a {type(value).__name__}, not a table")
    return value


def _text(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"a prompt is a {type(value).__name__}, not text")
    return value


def _number(value: object) -> str | int | float:
    if not isinstance(value, str | int | float):
        raise TypeError(f"a number is a {type(value).__name__}")
    return value


def parse(data: Mapping[str, object], name: str) -> AnswerSet:
    """A known-answer set from its TOML document; any malformed part is a ConfigError naming the set."""
    try:
        items = tuple(
            Item(
                str(it["id"]),
                _text(it.get("prompt")),
                _text(it.get("chat")),
                tuple(str(e) for e in _iterable(it["expect_any"])),
            )
            for it in map(_table, _iterable(data["item"]))
        )
        return AnswerSet(
            name, items, float(_number(data.get("min_pass", 0.75))), int(_number(data.get("max_tokens", 16)))
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"known-answer set {name} is malformed ({type(exc).__name__}: {exc})", hint=FILE_HINT
        ) from exc


def load(spec: str) -> AnswerSet:
    """`default` (the packaged set) or a path to a TOML file of the same shape."""
    if spec == DEFAULT_SET:
        text = resources.files("servelab.data").joinpath("verify/known_answers.toml").read_text()
        return parse(tomllib.loads(text), DEFAULT_SET)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"--known-answers {spec!r} is neither `default`, `auto`, `none` nor a file", hint=FILE_HINT
        )
    try:
        return parse(tomllib.loads(path.read_text()), str(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", hint=FILE_HINT) from exc


def matches(answer: str, expect_any: tuple[str, ...]) -> str | None:
    """The expected answer found in `answer` as a whole word (case-insensitive), or None."""
    for e in expect_any:
        if re.search(r"(?<![0-9A-Za-z])" + re.escape(e) + r"(?![0-9A-Za-z])", answer, re.IGNORECASE):
            return e
    return None


def judge(answer_set: AnswerSet, answers: list[tuple[Item, Completion]]) -> Check:
    per: list[JsonValue] = []
    right: list[tuple[str, bool, str]] = []  # (id, answered right, the answer as recorded)
    for item, c in answers:
        hit = matches(c.text, item.expect_any) if c.ok else None
        outcome: JsonObject = {
            "id": item.id,
            "prompt": c.prompt,
            "ok": hit is not None,
            "answer": c.text[:200],
            "expected_any": list(item.expect_any),
        }
        if c.error:
            outcome["error"] = c.error
        per.append(outcome)
        right.append((item.id, hit is not None, c.text[:200]))
    passed = sum(ok for _, ok, _ in right)
    need = answer_set.min_pass
    ev: JsonObject = {
        "set": answer_set.name,
        "passed": passed,
        "total": len(per),
        "min_pass": need,
        "items": per,
    }
    if not per:
        return Check(
            "known_answers", False, "warning", f"set {answer_set.name} has no items for this API", ev
        )
    missed = [key for key, ok, _ in right if not ok]
    if passed / len(per) < need:
        example = next(answer for key, _, answer in right if key == missed[0])
        return Check(
            "known_answers",
            False,
            "error",
            f"only {passed} of {len(per)} known answers are right (need {need:.0%}); missed: "
            f"{', '.join(missed)} (e.g. {example!r})",
            ev,
        )
    if missed:
        return Check(
            "known_answers",
            True,
            "warning",
            f"{passed} of {len(per)} known answers right; missed {', '.join(missed)}",
            ev,
        )
    return Check("known_answers", True, "info", f"all {len(per)} known answers right", ev)
