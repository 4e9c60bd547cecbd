"""The simulator's reference text: a pure function of (served model, prompt), prefix-stable."""

from __future__ import annotations

import re

import pytest

from servelab.sim.text import NWORDS, greedy_text, greedy_tokens, greedy_words, prompt_text


def test_same_prompt_same_tokens_and_prefix_stable():
    a = greedy_words("Qwen3-8B", "the quick brown fox", 100)
    assert a == greedy_words("Qwen3-8B", "the quick brown fox", 100)
    assert len(a) == 100 and all(re.fullmatch(r" [a-z]+", w) for w in a)
    assert greedy_words("Qwen3-8B", "the quick brown fox", 37) == a[:37]
    assert greedy_text("Qwen3-8B", "the quick brown fox", 100) == "".join(a)
    assert greedy_tokens("Qwen3-8B", "the quick brown fox", 5) == [w.encode() for w in a[:5]]
    assert greedy_words("m", "p", 0) == []


def test_depends_on_model_and_prompt():
    base = greedy_words("Qwen3-8B", "hello", 16)
    assert greedy_words("Qwen3-8B", "hello!", 16) != base
    assert greedy_words("GLM-5-NVFP4", "hello", 16) != base
    # The answer is not a constant: 64 tokens use many distinct words of the vocabulary.
    assert len(set(greedy_words("Qwen3-8B", "hello", 64))) > 40 and NWORDS == 512


def test_known_answer_pins_the_function():
    # Another tool (verify-output) and the simulator must agree forever: pin a known answer.
    assert greedy_text("m", "hello world", 5) == " vo kori dinuka kotehe keka"


def test_chat_messages_and_token_ids():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"text": "hi"}]}]
    assert prompt_text(msgs) == "system: be brief\nuser: hi"
    assert greedy_words("m", msgs, 8) == greedy_words("m", "system: be brief\nuser: hi", 8)
    assert prompt_text([1, 2, 3]) == "1 2 3"
    assert prompt_text(["only"]) == "only"
    with pytest.raises(TypeError):
        prompt_text([1.5])
