"""`--workload sessions`: the seeded plan, the conversation a turn sends, and the per-turn metrics."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from servelab.bench import sessions as S
from servelab.bench.config import BenchConfig
from servelab.bench.scrape import LevelScrape, parse_prometheus, pick
from servelab.bench.workload import LengthSpec
from servelab.results import LevelSummary, RequestRecord


def plan(seed: int = 1, **kw: object) -> S.SessionPlan:
    args: dict[str, object] = {
        "num_sessions": 4,
        "turns": 10,
        "system_len": 200,
        "user_len": LengthSpec(30),
        "tool_len": LengthSpec(80),
        "output_len": LengthSpec(16),
        "tool_fraction": 0.5,
        "think_mean_s": 2.0,
        "think_dist": "exponential",
        "seed": seed,
    } | kw
    return S.build_plan(**args)  # type: ignore[arg-type]


def test_the_plan_is_seeded() -> None:
    assert S.plan_hash(plan(1)) == S.plan_hash(plan(1))
    assert S.plan_hash(plan(1)) != S.plan_hash(plan(2))
    p = plan(1)
    assert p.turns_planned == 40 and len({s.turns[0].text for s in p.sessions}) == 4  # no shared turn
    # the system prompt is shared, and a level's own seed keeps it when `system_seed` is the run's
    assert plan(5, system_seed=1).system_prompt == p.system_prompt
    assert p.system_prompt is not None and len(p.system_prompt.split()) == 200


def test_turn_kinds_lengths_and_think_times() -> None:
    p = plan(3)
    turns = [t for s in p.sessions for t in s.turns]
    assert all(s.turns[0].kind == "user" and s.turns[0].think_s == 0 for s in p.sessions)
    tools = [t for t in turns if t.kind == "tool"]
    assert 8 <= len(tools) <= 28  # about half of the 36 later turns
    assert all(t.text.startswith(S.TOOL_PREFIX) and t.tokens == 80 for t in tools)
    assert all(t.tokens == 30 for t in turns if t.kind == "user")
    thinks = [t.think_s for t in turns if t.index > 0]
    assert 1.0 < sum(thinks) / len(thinks) < 3.5 and len(set(thinks)) == len(thinks)  # exponential
    const = plan(3, think_dist="constant")
    assert {t.think_s for s in const.sessions for t in s.turns if t.index} == {2.0}
    assert plan(3, system_len=0).system_prompt is None


def test_the_conversation_resends_everything() -> None:
    chat = S.Conversation("chat", "sys")
    assert chat.ask("q1") == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"}]
    chat.answer(" a1")
    assert chat.ask("q2")[-2:] == [{"role": "assistant", "content": " a1"}, {"role": "user", "content": "q2"}]
    comp = S.Conversation("completions", None)
    assert comp.ask("q1") == "q1"
    comp.answer(" a1")
    assert comp.ask("q2") == "q1 a1\nq2"


def test_sessions_options_are_checked() -> None:
    base = {"url": "http://127.0.0.1:1", "model": "m", "levels": [2], "workload": "sessions"}
    cfg = BenchConfig.model_validate(base)
    assert cfg.level_requests(2) == 16  # 2 sessions × 8 turns
    with pytest.raises(ValidationError, match="--duration"):
        BenchConfig.model_validate(base | {"num_requests": 4})
    with pytest.raises(ValidationError, match="conversations at once"):
        BenchConfig.model_validate(base | {"mode": "rate"})
    with pytest.raises(ValidationError):
        BenchConfig.model_validate(base | {"tool_turns": 1.5})


def rec(
    sid: int, turn: int, start: float, ttft: float, e2e: float, inp: int, ok: bool = True
) -> RequestRecord:
    return RequestRecord(
        idx=sid * 10 + turn,
        prompt_idx=sid * 10 + turn,
        start_s=start,
        ok=ok,
        ttft_s=ttft if ok else None,
        e2e_s=e2e,
        input_tokens=inp,
        output_tokens=8 if ok else None,
        session_id=sid,
        turn=turn,
    )


def test_per_turn_and_per_session_metrics() -> None:
    p = plan(1, num_sessions=2, turns=3, think_dist="constant")
    records = [
        rec(0, 0, 0.0, 0.20, 0.5, 230),
        rec(0, 1, 2.5, 0.05, 0.3, 300),
        rec(0, 2, 4.8, 0.06, 0.4, 370),
        rec(1, 0, 0.0, 0.30, 0.6, 230),
        rec(1, 1, 2.6, 0.0, 0.1, 0, ok=False),  # ends session 1: its turn 2 is never sent
    ]
    # the server's counters around the level, as the scraper keeps them
    scrape = LevelScrape(
        before=pick(
            parse_prometheus("vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 10\n")
        ),
        after=pick(
            parse_prometheus("vllm:prefix_cache_queries_total 1100\nvllm:prefix_cache_hits_total 710\n")
        ),
    )
    ss = S.summarize_sessions(records, p, scrape.summary())
    assert [t.turn for t in ss.per_turn] == [0, 1, 2]
    assert ss.per_turn[0].mean_input_tokens == 230 and ss.per_turn[0].ttft_ms.p50 == pytest.approx(250)
    assert (ss.per_turn[1].completed, ss.per_turn[1].failed) == (1, 1)
    assert (ss.turns_completed, ss.turns_failed, ss.turns_not_sent, ss.sessions_completed) == (4, 1, 1, 1)
    assert ss.per_session[0].duration_s == pytest.approx(5.2)
    assert ss.cache_hit_rate == pytest.approx(0.7) and ss.cache_source == "prefix_cache_hits/queries"
    assert ss.think_time_s == 2.0
    # SGLang reports a rate, not counters; a server that reports neither has none
    sg = LevelScrape(before={}, after=pick(parse_prometheus('sglang:cache_hit_rate{model_name="m"} 0.4\n')))
    assert S.cache_hit_rate(sg.summary()) == (0.4, "cache_hit_rate")
    assert S.cache_hit_rate({"available": False}) == (None, None)
    # shown in the simulated GPU's time like every other latency
    lv = LevelSummary(sessions=ss).in_gpu_time(10.0)
    assert lv.sessions is not None and lv.sessions.per_turn[0].ttft_ms.p50 == pytest.approx(2500)
    assert lv.sessions.per_session[0].duration_s == pytest.approx(52)
