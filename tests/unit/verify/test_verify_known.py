"""Known-answer sets: the packaged one loads, answers match as whole words, the threshold decides."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.errors import ConfigError
from servelab.verify import known
from servelab.verify.calls import Completion
from servelab.verify.service import Reference, resolve_known


def test_default_set_has_items_for_both_apis() -> None:
    s = known.load("default")
    assert len(s.items) >= 6 and 0 < s.min_pass <= 1 and s.max_tokens >= 8
    assert {i.id for i in s.items} >= {"capital-france", "add", "count"}
    assert len(s.prompts("completions")) == len(s.items) == len(s.prompts("chat"))
    france = next(p for it, p in s.prompts("completions") if it.id == "capital-france")
    assert france == "The capital of France is"


@pytest.mark.parametrize(
    "answer,expect,hit",
    [
        (" Paris, which is also", ("Paris",), "Paris"),
        (" paris.", ("Paris",), "Paris"),
        (" 14", ("4", "four"), None),
        (" 4.", ("4", "four"), "4"),
        (" Four", ("4", "four"), "four"),
        (" Fabulous", ("F",), None),
        (" F, G, H", ("F",), "F"),
    ],
)
def test_whole_word_matching(answer: str, expect: tuple[str, ...], hit: str | None) -> None:
    assert known.matches(answer, expect) == hit


def test_judge_threshold() -> None:
    s = known.load("default")
    items = [it for it, _ in s.prompts("completions")]
    right = [(it, Completion(p, text=" " + it.expect_any[0])) for it, p in s.prompts("completions")]
    assert known.judge(s, right).ok and known.judge(s, right).severity == "info"
    one_wrong = [(items[0], Completion("p", text=" London")), *right[1:]]
    check = known.judge(s, one_wrong)
    assert check.ok and check.severity == "warning" and items[0].id in check.detail
    garbage = [(it, Completion("p", text=" !!!!!!!!")) for it in items]
    check = known.judge(s, garbage)
    assert check.failed and check.evidence["passed"] == 0 and "' !!!!!!!!'" in check.detail


def test_custom_file_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "mine.toml"
    f.write_text('min_pass = 1.0\n[[item]]\nid = "x"\nprompt = "2 + 3 ="\nexpect_any = ["5"]\n')
    s = known.load(str(f))
    assert s.min_pass == 1.0 and s.prompts("chat") == [] and len(s.prompts("completions")) == 1
    bad = tmp_path / "bad.toml"
    bad.write_text('[[item]]\nprompt = "no id"\n')
    with pytest.raises(ConfigError, match="malformed"):
        known.load(str(bad))
    with pytest.raises(ConfigError, match="neither"):
        known.load(str(tmp_path / "missing.toml"))


def test_auto_runs_the_default_set_only_without_a_reference(tmp_path: Path) -> None:
    assert resolve_known("auto", Reference("none")) is not None
    assert resolve_known("auto", Reference("sim")) is None
    assert resolve_known("none", Reference("none")) is None
    assert resolve_known("default", Reference("sim")) is not None
