"""Lone repeats must match (error); concurrent answers that differ are a warning (batch variance)."""

from __future__ import annotations

from servelab.verify.calls import Completion
from servelab.verify.determinism import judge_concurrent, judge_repeats


def c(ids: list[int] | None, text: str = "x", prompt: str = "p") -> Completion:
    return Completion(prompt, text=text, token_ids=ids)


def test_identical_repeats_pass() -> None:
    check = judge_repeats([c([1, 2, 3]), c([1, 2, 3]), c([1, 2, 3])])
    assert check.ok and check.severity == "info"
    assert check.evidence["compared"] == "token ids"


def test_warm_repeats_that_differ_are_an_error() -> None:
    check = judge_repeats([c([1, 2, 3]), c([1, 2, 3]), c([1, 5, 3])])
    assert not check.ok and check.severity == "error" and check.failed
    assert check.evidence["first_divergence"] == 1
    assert "runs 2 and 3" in check.detail


def test_only_the_cold_answer_differing_is_a_warning() -> None:
    check = judge_repeats([c([1, 9, 3]), c([1, 2, 3]), c([1, 2, 3])])
    assert not check.ok and check.severity == "warning" and not check.failed
    assert check.evidence["first_divergence"] == 1


def test_repeats_compare_words_when_the_server_gives_no_ids() -> None:
    check = judge_repeats([c(None, " a b c"), c(None, " a b c"), c(None, " a b d")])
    assert check.failed and check.evidence["compared"] == "words" and check.evidence["first_divergence"] == 2


def test_concurrent_differences_are_warnings_with_positions() -> None:
    alone = c([1, 2, 3, 4], prompt="q")
    check = judge_concurrent([(alone, c([1, 2, 3, 4])), (alone, c([1, 2, 8, 9]))])
    assert not check.ok and check.severity == "warning" and not check.failed
    assert check.evidence["differing"] == 1
    assert check.evidence["differences"][0]["first_divergence"] == 2
    assert judge_concurrent([(alone, c([1, 2, 3, 4]))]).ok
