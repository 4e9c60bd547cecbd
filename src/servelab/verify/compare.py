"""Pure comparisons of one greedy answer against another (a repeat) or against a reference."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from servelab.jsontypes import JsonObject

if TYPE_CHECKING:
    from servelab.verify.reference import ForcedStep, RefResult

DEFAULT_TOLERANCE = 0.2  # nats; see judge_forced


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first position where a and b differ (the shorter length when one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def strip_eos(ids: Sequence[int], eos: set[int]) -> list[int]:
    """Ids up to (excluding) the first EOS: servers differ on whether the EOS id is reported."""
    out: list[int] = []
    for i in ids:
        if i in eos:
            break
        out.append(i)
    return out


def word_divergence(engine_words: Sequence[str], ref_words: Sequence[str]) -> int | None:
    """Like first_divergence, but an engine answer that stopped early (EOS) is a prefix, not a divergence."""
    d = first_divergence(engine_words, ref_words)
    if d is not None and d == len(engine_words) and len(engine_words) < len(ref_words):
        return None
    return d


def judge_forced(steps: Sequence[ForcedStep], tolerance: float = DEFAULT_TOLERANCE) -> ForcedStep | None:
    """The first engine token the reference rejects under teacher forcing, or None when all are plausible.

    Why a tolerance and not exact equality: greedy decoding in bf16 flips between near-tied tokens when
    two implementations round differently, and after one flip the texts part for good. Scoring the
    engine's own tokens with the reference (teacher forcing) asks instead "was each token the reference's
    top choice, up to numerical noise?". Wrong weights pick tokens far below the top (a gap of ~1 nat even
    for a random-weight model, several nats for a real one); a flip between near-ties costs a few
    hundredths.
    """
    for s in steps:
        if s["gap"] > tolerance:
            return s
    return None


@dataclass(frozen=True)
class Token:
    """A token: its id, and its text when known."""

    id: int
    text: str | None = None

    def to_json(self) -> JsonObject:
        return {"id": self.id} if self.text is None else {"id": self.id, "text": self.text}


@dataclass(frozen=True)
class Rejected:
    """The first engine token outside the tolerance: where, by how much, and both tokens."""

    pos: int
    gap: float
    rank: int
    engine: Token
    reference: Token

    def to_json(self) -> JsonObject:
        return {
            "pos": self.pos,
            "gap": self.gap,
            "rank": self.rank,
            "engine": self.engine.to_json(),
            "reference": self.reference.to_json(),
        }


@dataclass(frozen=True)
class PromptMismatch:
    """The server tokenized the prompt differently from the reference (the first 32 ids of each)."""

    first_difference: int | None
    engine: list[int]
    reference: list[int]


@dataclass(frozen=True)
class Verdict:
    """One prompt's verdict against a transformers reference; `to_json` is what the evidence records."""

    ok: bool
    exact_match_tokens: int
    first_divergence: int | None  # exact, vs the reference's own greedy ids
    compared_tokens: int
    max_gap: float
    first_rejected: Rejected | None
    at_divergence: tuple[Token, Token] | None  # (engine, reference) at first_divergence
    prompt_mismatch: PromptMismatch | None

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "ok": self.ok,
            "exact_match_tokens": self.exact_match_tokens,
            "first_divergence": self.first_divergence,
            "compared_tokens": self.compared_tokens,
            "max_gap": self.max_gap,
            "first_rejected": None if self.first_rejected is None else self.first_rejected.to_json(),
        }
        if self.at_divergence is not None:
            engine, reference = self.at_divergence
            out["at_divergence"] = {"engine": engine.to_json(), "reference": reference.to_json()}
        if self.prompt_mismatch is not None:
            m = self.prompt_mismatch
            out["prompt_mismatch"] = {
                "first_difference": m.first_difference,
                "engine": list(m.engine),
                "reference": list(m.reference),
            }
        return out


def judge_reference(
    engine_ids: list[int],
    ref: RefResult,
    eos: set[int],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    engine_prompt_ids: list[int] | None = None,
) -> JsonObject:
    """One prompt's verdict against a transformers reference (one `results` item of reference.py), as
    recorded: `ok`, `exact_match_tokens`, `first_divergence`, `compared_tokens`, `max_gap`,
    `first_rejected`, then `at_divergence` and `prompt_mismatch` when they apply (see `verdict`)."""
    return verdict(engine_ids, ref, eos, tolerance=tolerance, engine_prompt_ids=engine_prompt_ids).to_json()


def verdict(
    engine_ids: list[int],
    ref: RefResult,
    eos: set[int],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    engine_prompt_ids: list[int] | None = None,
) -> Verdict:
    """One prompt's verdict, typed: `first_divergence` is exact (vs the reference's own greedy ids),
    `first_rejected` the first engine token outside `tolerance` under teacher forcing, and
    `prompt_mismatch` set when the server tokenized the prompt differently (which fails the prompt)."""
    ref_ids = strip_eos(ref["ids"], eos)
    eng = strip_eos(engine_ids, eos)
    div = first_divergence(eng, ref_ids)
    steps = ref.get("forced") or []
    bad = judge_forced(steps, tolerance)
    tokens = ref.get("tokens") or []
    etoks = ref.get("engine_tokens") or []
    at = None
    if div is not None and div < len(ref_ids) and div < len(eng):
        at = (_tok(eng[div], etoks, div), _tok(ref_ids[div], tokens, div))
    rejected = None
    if bad is not None:
        rejected = Rejected(
            bad["pos"],
            round(bad["gap"], 4),
            bad["rank"],
            Token(bad["engine_id"], bad.get("engine_text", "")),
            Token(bad["ref_top_id"], bad.get("ref_top_text", "")),
        )
    mismatch = None
    if engine_prompt_ids is not None and engine_prompt_ids != ref["prompt_ids"]:
        mismatch = PromptMismatch(
            first_divergence(engine_prompt_ids, ref["prompt_ids"]),
            engine_prompt_ids[:32],
            ref["prompt_ids"][:32],
        )
    return Verdict(
        ok=bad is None and mismatch is None,
        exact_match_tokens=len(eng) if div is None else div,
        first_divergence=div,
        compared_tokens=len(eng),
        max_gap=round(max((s["gap"] for s in steps), default=0.0), 4),
        first_rejected=rejected,
        at_divergence=at,
        prompt_mismatch=mismatch,
    )


def _tok(tid: int, texts: Sequence[str], pos: int) -> Token:
    return Token(tid, texts[pos]) if pos < len(texts) else Token(tid)
