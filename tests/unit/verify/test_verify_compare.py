"""Divergence positions and the teacher-forced verdict against a transformers reference."""

from __future__ import annotations

from typing import Any

from servelab.verify.compare import (
    first_divergence,
    judge_forced,
    judge_reference,
    strip_eos,
    word_divergence,
)


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], [5]) == 0
    assert first_divergence("abc", "abd") == 2


def test_strip_eos_cuts_at_the_first_eos() -> None:
    assert strip_eos([5, 6, 2, 7], {2}) == [5, 6]
    assert strip_eos([5, 6], {2}) == [5, 6]


def test_word_divergence_allows_an_early_stop() -> None:
    assert word_divergence(["a", "b"], ["a", "b", "c"]) is None  # the engine hit EOS
    assert word_divergence(["a", "b", "c", "d"], ["a", "b", "c"]) == 3  # longer than the reference
    assert word_divergence(["a", "x"], ["a", "b"]) == 1


def step(pos: int, engine: int, top: int, gap: float, rank: int = 0) -> dict[str, Any]:
    return {
        "pos": pos,
        "engine_id": engine,
        "ref_top_id": top,
        "gap": gap,
        "rank": rank,
        "engine_text": f"e{engine}",
        "ref_top_text": f"r{top}",
    }


def ref(ids: list[int], forced: list[dict[str, Any]], prompt_ids: list[int] | None = None) -> dict[str, Any]:
    return {
        "ids": ids,
        "forced": forced,
        "prompt_ids": prompt_ids or [0, 5],
        "tokens": [f"t{i}" for i in ids],
        "engine_tokens": [f"e{s['engine_id']}" for s in forced],
    }


def test_judge_forced_picks_the_first_step_past_tolerance() -> None:
    steps = [step(0, 1, 1, 0.0), step(1, 4, 3, 0.01), step(2, 9, 8, 0.9, 400), step(3, 7, 6, 2.0)]
    assert judge_forced(steps, 0.2)["pos"] == 2
    assert judge_forced(steps[:2], 0.2) is None


def test_exact_match() -> None:
    v = judge_reference(
        [1, 2, 3], ref([1, 2, 3], [step(i, t, t, 0.0) for i, t in enumerate([1, 2, 3])]), {99}
    )
    assert v["ok"] and v["first_divergence"] is None and v["exact_match_tokens"] == 3


def test_near_tie_flip_passes_but_reports_where_the_texts_part() -> None:
    engine = [1, 2, 7, 8]
    forced = [step(0, 1, 1, 0.0), step(1, 2, 2, 0.0), step(2, 7, 3, 0.004), step(3, 8, 8, 0.0)]
    v = judge_reference(engine, ref([1, 2, 3, 4], forced), {99})
    assert v["ok"]
    assert v["first_divergence"] == 2 and v["exact_match_tokens"] == 2
    assert v["at_divergence"] == {"engine": {"id": 7, "text": "e7"}, "reference": {"id": 3, "text": "t3"}}


def test_wrong_weights_fail_with_the_rejected_token() -> None:
    engine = [1, 50, 51]
    forced = [step(0, 1, 1, 0.0), step(1, 50, 2, 1.3, 812), step(2, 51, 9, 0.8, 300)]
    v = judge_reference(engine, ref([1, 2, 3], forced), {99})
    assert not v["ok"]
    assert v["first_divergence"] == 1
    assert v["first_rejected"] == {
        "pos": 1,
        "gap": 1.3,
        "rank": 812,
        "engine": {"id": 50, "text": "e50"},
        "reference": {"id": 2, "text": "r2"},
    }
    assert v["max_gap"] == 1.3


def test_eos_on_either_side_is_not_a_divergence() -> None:
    forced = [step(0, 1, 1, 0.0), step(1, 2, 2, 0.0), step(2, 99, 99, 0.0)]
    v = judge_reference([1, 2, 99], ref([1, 2, 99], forced), {99})
    assert v["ok"] and v["first_divergence"] is None and v["compared_tokens"] == 2


def test_prompt_tokenized_differently_fails() -> None:
    forced = [step(0, 1, 1, 0.0)]
    v = judge_reference([1], ref([1], forced, prompt_ids=[0, 5, 6]), {99}, engine_prompt_ids=[5, 6])
    assert not v["ok"]
    assert v["prompt_mismatch"]["first_difference"] == 0  # the BOS is missing on the server
