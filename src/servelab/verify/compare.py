"""Pure comparisons of one greedy answer against another (a repeat) or against a reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def judge_forced(steps: list[dict[str, Any]], tolerance: float = DEFAULT_TOLERANCE) -> dict[str, Any] | None:
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


def judge_reference(
    engine_ids: list[int],
    ref: dict[str, Any],
    eos: set[int],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    engine_prompt_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One prompt's verdict against a transformers reference (one `results` item of reference.py).

    Returns `ok`, `exact_match_tokens`, `first_divergence` (exact, vs the reference's own greedy ids),
    `first_rejected` (the first engine token outside `tolerance` under teacher forcing, with both tokens
    and the gap), `max_gap`, and `prompt_mismatch` when the server tokenized the prompt differently.
    """
    ref_ids = strip_eos(ref["ids"], eos)
    eng = strip_eos(engine_ids, eos)
    div = first_divergence(eng, ref_ids)
    steps = ref.get("forced") or []
    bad = judge_forced(steps, tolerance)
    out: dict[str, Any] = {
        "ok": bad is None,
        "exact_match_tokens": len(eng) if div is None else div,
        "first_divergence": div,
        "compared_tokens": len(eng),
        "max_gap": round(max((s["gap"] for s in steps), default=0.0), 4),
        "first_rejected": None,
    }
    tokens = ref.get("tokens") or []
    etoks = ref.get("engine_tokens") or []
    if div is not None and div < len(ref_ids) and div < len(eng):
        out["at_divergence"] = {
            "engine": _tok(eng[div], etoks, div),
            "reference": _tok(ref_ids[div], tokens, div),
        }
    if bad is not None:
        pos = bad["pos"]
        out["first_rejected"] = {
            "pos": pos,
            "gap": round(bad["gap"], 4),
            "rank": bad["rank"],
            "engine": {"id": bad["engine_id"], "text": bad.get("engine_text", "")},
            "reference": {"id": bad["ref_top_id"], "text": bad.get("ref_top_text", "")},
        }
    if engine_prompt_ids is not None and engine_prompt_ids != ref["prompt_ids"]:
        out["ok"] = False
        out["prompt_mismatch"] = {
            "first_difference": first_divergence(engine_prompt_ids, ref["prompt_ids"]),
            "engine": engine_prompt_ids[:32],
            "reference": ref["prompt_ids"][:32],
        }
    return out


def _tok(tid: int, texts: Sequence[str], pos: int) -> dict[str, Any]:
    return {"id": tid, "text": texts[pos]} if pos < len(texts) else {"id": tid}
