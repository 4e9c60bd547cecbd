"""The simulator as reference: its own text passes, anything else fails at the right token."""

from __future__ import annotations

from servelab.sim.text import GARBAGE_WORD, greedy_text
from servelab.verify.calls import Completion
from servelab.verify.simref import judge

MODEL = "Qwen3-8B"


def test_the_sims_own_text_passes_even_when_eos_cut_it_short() -> None:
    answers = [
        Completion("The capital of France is", text=greedy_text(MODEL, "The capital of France is", 16)),
        Completion("Once", text=greedy_text(MODEL, "Once", 5), finish_reason="stop"),
        Completion(
            [{"role": "user", "content": "hi"}],
            text=greedy_text(MODEL, [{"role": "user", "content": "hi"}], 8),
        ),
    ]
    check = judge(MODEL, answers)
    assert check.ok, check.detail


def test_garbage_fails_at_token_zero() -> None:
    check = judge(MODEL, [Completion("The capital of France is", text=GARBAGE_WORD * 16)])
    assert check.failed
    p = check.evidence["prompts"][0]
    assert p["first_divergence"] == 0 and p["at_divergence"]["engine"] == "!!!!!!!!"


def test_another_models_text_fails() -> None:
    text = greedy_text("Llama-3.1-8B", "hello", 16)
    check = judge(MODEL, [Completion("hello", text=text)])
    assert check.failed and check.evidence["prompts"][0]["first_divergence"] is not None
