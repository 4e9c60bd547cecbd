"""Garbage heuristics: the signatures broken kernels and wrong weights print, and no false alarms."""

from __future__ import annotations

import pytest

from servelab.verify.garbage import inspect, longest_run


def kinds(text: str, ids: list[int] | None = None, finish: str | None = "length") -> dict[str, str]:
    return {f.kind: f.severity for f in inspect(text, ids, finish)}


@pytest.mark.parametrize(
    "text",
    [
        " Paris. It is also the largest city in France.",
        " 6, 7, 8, 9, 10, 11, 12",
        "    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
        " gama lodece calebe hibu dikipu pige dikipu pige",
        "Wow!!! That is great.",
        " ==== Section ==== and then some more words follow here to dilute it",
    ],
)
def test_plausible_answers_are_clean(text: str) -> None:
    assert inspect(text, None, "length") == []


def test_fp4_bang_run_is_an_error_with_kernel_advice() -> None:
    found = inspect(" !!!!!!!! !!!!!!!! !!!!!!!!", None, "length")
    by = {f.kind: f for f in found}
    assert by["char_run"].severity == "error"
    assert "'!' repeated 24 times" in by["char_run"].message
    assert "token id 0" in by["char_run"].advice
    assert "same_token" not in by  # three words: too few to call it one token forever
    eight = {f.kind for f in inspect(" !!!!!!!!" * 8, None, "length")}
    assert eight == {"char_run", "same_token"}


def test_bang_run_needs_most_of_the_answer() -> None:
    assert "char_run" not in kinds("The answer is 4 !!!!!!!! and that is the end of the sentence here")


def test_same_token_ids() -> None:
    assert kinds("a a a a a a a a", [17] * 8)["same_token"] == "error"
    assert "same_token" not in kinds("a b a a a a a a", [17, 18] + [17] * 6)
    assert "same_token" not in kinds("a a a", [17] * 3)  # too short to judge


def test_same_word_without_ids() -> None:
    assert kinds(" the the the the the the the the the")["same_token"] == "error"


def test_replacement_characters() -> None:
    assert kinds("Paris \ufffd is the capital of France and a big city")["replacement_char"] == "warning"
    assert kinds("\ufffd\ufffd\ufffd abc")["replacement_char"] == "error"


def test_empty_answer_depends_on_why_it_ended() -> None:
    assert kinds("", finish="length") == {"empty": "error"}
    assert kinds("  ", finish="stop") == {"empty": "warning"}


def test_longest_run_skips_spaces() -> None:
    assert longest_run(" !! !! !") == ("!", 5)
    assert longest_run("") == ("", 0)
