"""Cheap signals of garbage output that need no reference: '!!!!' runs, one token forever, U+FFFD, empty.

Pure functions over one answer; the thresholds and advice are data (data/verify/garbage.toml).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict

from servelab.verify.result import Severity


@dataclass(frozen=True)
class Finding:
    """One garbage signature found in one answer."""

    kind: str
    severity: Severity
    message: str
    advice: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "severity": self.severity, "message": self.message, "advice": self.advice}


class Signature(BaseModel):
    """One signature's table in garbage.toml: what to do when it is found (its thresholds below)."""

    model_config = ConfigDict(frozen=True)

    advice: str


class CharRun(Signature):
    min_run: int  # characters in the longest run
    min_fraction: float  # of the answer's non-space characters


class SameToken(Signature):
    min_tokens: int


class ReplacementChar(Signature):
    warn_fraction: float
    error_fraction: float


class Signatures(BaseModel):
    """garbage.toml, read once and checked: the thresholds and advice of every signature."""

    model_config = ConfigDict(frozen=True)

    empty: Signature
    char_run: CharRun
    same_token: SameToken
    replacement_char: ReplacementChar


@cache
def signatures() -> Signatures:
    text = resources.files("servelab.data").joinpath("verify/garbage.toml").read_text()
    return Signatures.model_validate(tomllib.loads(text))


def longest_run(text: str) -> tuple[str, int]:
    """The longest run of one repeated non-space character: (char, length)."""
    best_c, best_n, cur_c, cur_n = "", 0, "", 0
    for ch in text:
        if ch.isspace():
            continue  # ' !!!! !!!!' is still one run of '!'
        if ch == cur_c:
            cur_n += 1
        else:
            cur_c, cur_n = ch, 1
        if cur_n > best_n:
            best_c, best_n = cur_c, cur_n
    return best_c, best_n


def inspect(text: str, token_ids: list[int] | None = None, finish_reason: str | None = None) -> list[Finding]:
    """Every garbage signature in one answer (an empty list for a plausible answer)."""
    sig = signatures()
    found: list[Finding] = []
    if not text.strip():
        # A model may legitimately end at once; an empty answer cut by the length limit cannot be.
        sev: Severity = "warning" if finish_reason == "stop" else "error"
        found.append(Finding("empty", sev, f"empty answer (finish_reason={finish_reason})", sig.empty.advice))
        return found
    chars = [c for c in text if not c.isspace()]
    ch, n = longest_run(text)
    run = sig.char_run
    if not ch.isalnum() and n >= run.min_run and n / max(len(chars), 1) >= run.min_fraction:
        found.append(
            Finding(
                "char_run",
                "error",
                f"{ch!r} repeated {n} times ({n / len(chars):.0%} of the answer)",
                run.advice,
            )
        )
    same = sig.same_token
    units: list[Any] = token_ids if token_ids is not None else text.split()
    if len(units) >= same.min_tokens and len(set(units)) == 1:
        what = f"token id {units[0]}" if token_ids is not None else repr(units[0])
        found.append(Finding("same_token", "error", f"all {len(units)} tokens are {what}", same.advice))
    bad = text.count("\ufffd")
    rep = sig.replacement_char
    if bad and bad / len(text) > rep.warn_fraction:
        sev = "error" if bad / len(text) >= rep.error_fraction else "warning"
        found.append(Finding("replacement_char", sev, f"{bad} U+FFFD characters in {len(text)}", rep.advice))
    return found
