"""The simulator as reference: its answer is a pure function of (served model, prompt) (sim/text.py)."""

from __future__ import annotations

from servelab.jsontypes import JsonObject, JsonValue
from servelab.verify.calls import Completion
from servelab.verify.compare import word_divergence
from servelab.verify.result import Check


def judge(model: str, answers: list[Completion]) -> Check:
    """Each answer must be a prefix of `greedy_words(model, prompt, n)` (EOS may stop it early)."""
    from servelab.sim.text import greedy_words

    per: list[JsonValue] = []
    failed: list[tuple[Completion, int, str | None, str | None]] = []  # (answer, where, engine, reference)
    for a in answers:
        engine_words = a.text.split()
        n = max(len(engine_words), a.completion_tokens or 0)
        ref_words = [w.strip() for w in greedy_words(model, a.prompt, n)]
        div = word_divergence(engine_words, ref_words)
        item: JsonObject = {
            "prompt": a.prompt,
            "ok": div is None,
            "first_divergence": div,
            "engine_text": a.text[:300],
            "reference_text": " ".join(ref_words)[:300],
        }
        if div is not None:
            engine = engine_words[div] if div < len(engine_words) else None
            reference = ref_words[div] if div < len(ref_words) else None
            item["at_divergence"] = {"engine": engine, "reference": reference}
            failed.append((a, div, engine, reference))
        per.append(item)
    evidence: JsonObject = {"reference": "sim", "model": model, "prompts": per}
    if failed:
        f, where, engine, reference = failed[0]
        return Check(
            "reference",
            False,
            "error",
            f"{len(failed)} of {len(per)} prompts differ from the simulator's reference text: prompt "
            f"{f.prompt!r} diverges at token {where} (engine {engine!r}, "
            f"reference {reference!r})",
            evidence,
        )
    return Check(
        "reference", True, "info", f"all {len(per)} answers are the simulator's reference text", evidence
    )
