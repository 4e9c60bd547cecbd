"""bench/fit.py: every request of a workload against the server's context, on the workloads the real
builders make (synthetic prompts, session plans); the trace path runs end to end against the simulator
in tests/integration/test_bench_context.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from servelab.bench import fit as F
from servelab.bench import sessions as SE
from servelab.bench import workload as W
from servelab.bench.config import BenchConfig
from servelab.errors import ConfigError


def pool() -> W.Workload:
    # 40 prompts of 500 ± 50 % words (the simulator and this test count a word a token), 100 out
    return W.synthetic(40, W.LengthSpec(500, 0.5), W.LengthSpec(100), seed=3)


def test_prompts_over_the_context_are_counted() -> None:
    wl = pool()
    need = [(p.input_len or 0) + p.output_len for p in wl.prompts]
    over = sum(n > 600 for n in need)
    assert 0 < over < 40
    same, fit = F.fit_workload(wl, 600, 0, "send", None, 1.0)
    assert same is wl
    assert (fit.checked, fit.over, fit.longest, fit.what) == (40, over, max(need), "prompts")
    said = fit.warning()
    assert said is not None and said.startswith(
        f"{over} of 40 prompts ask for more than the server's context"
    )
    assert "--over-context skip" in said
    # a chat template's overhead counts too
    assert F.fit_workload(wl, 600, 50, "send", None, 1.0)[1].over > over


def test_skip_drops_them_and_clip_cuts_the_prompt() -> None:
    wl = pool()
    kept, fit = F.fit_workload(wl, 600, 0, "skip", None, 1.0)
    assert len(kept.prompts) == 40 - fit.over
    assert all((p.input_len or 0) + p.output_len <= 600 for p in kept.prompts)
    clipped, fit = F.fit_workload(wl, 600, 0, "clip", None, 1.0)
    assert len(clipped.prompts) == 40 and fit.action == "clip"
    for before, after in zip(wl.prompts, clipped.prompts, strict=True):
        assert after.output_len == before.output_len
        if (before.input_len or 0) + before.output_len > 600:
            # one under the context, less the 1 % margin of estimated lengths (at least 8 tokens)
            assert after.input_len == 600 - 1 - 8 - before.output_len
            assert len(after.text.split(" ")) == after.input_len
            assert before.text.startswith(after.text)
        else:
            assert after == before


def test_skipping_everything_is_refused() -> None:
    with pytest.raises(ConfigError, match="leaves nothing to send"):
        F.fit_workload(pool(), 100, 0, "skip", None, 1.0)


def test_session_turns_count_their_growing_history() -> None:
    plan = SE.build_plan(
        3, 5, 200, W.LengthSpec(100), W.LengthSpec(300), W.LengthSpec(50), 0.5, 0.0, "constant", 1
    )
    needs = []
    for s in plan.sessions:
        history = plan.system_tokens
        for t in s.turns:
            history += t.tokens or 0
            needs.append(history + t.output_len)
            history += t.output_len
    limit = sorted(needs)[len(needs) // 2]
    fit = F.fit_sessions([plan], limit, 0, "words")
    assert (fit.checked, fit.over, fit.what) == (15, sum(n > limit for n in needs), "session turns")
    assert fit.over > 0 and fit.longest == max(needs)
    said = fit.warning()
    assert said is not None and "end their sessions" in said and "--turns" in said


def test_sessions_cannot_skip_or_clip() -> None:
    base = {"url": "http://x", "model": "m", "levels": [1], "workload": "sessions", "duration_s": 1.0}
    with pytest.raises(ValidationError, match="cannot change a session's turns"):
        BenchConfig(**base, over_context="skip")
    assert BenchConfig(**base).over_context == "send"
