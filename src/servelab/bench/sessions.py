"""`--workload sessions`: agentic multi-turn conversations, the traffic of a coding agent.

Each of N sessions is a conversation of K turns. Turn t's prompt is the whole history so far — the
shared system prompt, every earlier user or tool message and the assistant's replies exactly as they
were streamed — plus a new message; between turns the session "thinks" for a seeded time. So the
prompt grows turn by turn and a server with prefix caching reuses all but the new message.

The plan (`build_plan`) is pure and seeded: the same options and seed give the same messages, lengths
and think times. The driver (`run_sessions`) owns its own timing, since each turn depends on the
reply to the one before: it cannot send prepared requests. `summarize_sessions` is the per-turn and
per-session metrics, pure over the records.

Tool results are sent as user messages ("Tool result: ..."), not role "tool": an OpenAI tool message
must answer a `tool_calls` entry of the assistant message before it, which a benchmark's free-text
reply does not have, and strict chat templates refuse it. With --api completions the history is
concatenated: each message starts a new line, each reply is appended as streamed.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from servelab.bench import workload as W
from servelab.bench.client import Client, StreamResult
from servelab.bench.config import BenchConfig
from servelab.bench.load import ClientMonitor, PreparedRequest, RecordFactory, raise_fd_limit
from servelab.bench.metrics import stats_ms
from servelab.results import RequestRecord, SessionsSummary, SessionStat, Stats, TurnStats

TOOL_PREFIX = "Tool result: "


@dataclass(frozen=True, slots=True)
class Turn:
    """One planned turn: the new message, the reply length to ask for, the think time before it."""

    index: int
    kind: Literal["user", "tool"]
    text: str
    tokens: int | None  # the message's length (exact with a tokenizer, else the target)
    output_len: int
    think_s: float  # before this turn (0 for the first), in the shown time base


@dataclass(frozen=True, slots=True)
class SessionSpec:
    sid: int
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """Every session of one level; `system_prompt` is shared by all of them (None: none)."""

    system_prompt: str | None
    system_tokens: int
    sessions: tuple[SessionSpec, ...]

    @property
    def turns_planned(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def prompts(self) -> tuple[W.Prompt, ...]:
        """The plan's texts as workload prompts (what the run's workload hash covers)."""
        out = [W.Prompt(self.system_prompt, 0, self.system_tokens)] if self.system_prompt else []
        out += [W.Prompt(t.text, t.output_len, t.tokens) for s in self.sessions for t in s.turns]
        return tuple(out)


def build_plan(
    num_sessions: int,
    turns: int,
    system_len: int,
    user_len: W.LengthSpec,
    tool_len: W.LengthSpec,
    output_len: W.LengthSpec,
    tool_fraction: float,
    think_mean_s: float,
    think_dist: str,
    seed: int,
    system_seed: int | None = None,
    counter: W.TokenCounter | None = None,
    tokens_per_word: float = 1.0,
) -> SessionPlan:
    """Seeded sessions: turn 0 is a user message; each later turn is a tool result with probability
    `tool_fraction`, else a user message; think times are exponential (mean `think_mean_s`) or constant.
    The system prompt is drawn from `system_seed` (default `seed`), so levels can share it."""
    sys_rng = random.Random(system_seed if system_seed is not None else seed)
    system, sys_tokens = None, 0
    if system_len > 0:
        system, measured = _message(sys_rng, system_len, counter, tokens_per_word, "System: ")
        sys_tokens = measured or system_len
    rng = random.Random(seed * 1_000_003 + 17)
    sessions = []
    for sid in range(num_sessions):
        planned = []
        for t in range(turns):
            tool = t > 0 and rng.random() < tool_fraction
            target = (tool_len if tool else user_len).sample(rng)
            tag = f"{TOOL_PREFIX}[{seed}-{sid}-{t}] " if tool else f"[session {seed}-{sid} turn {t}] "
            text, measured = _message(rng, target, counter, tokens_per_word, tag)
            if t == 0 or think_mean_s <= 0:
                think = 0.0
            elif think_dist == "constant":
                think = think_mean_s
            else:
                think = rng.expovariate(1.0 / think_mean_s)
            planned.append(
                Turn(t, "tool" if tool else "user", text, measured or target, output_len.sample(rng), think)
            )
        sessions.append(SessionSpec(sid, tuple(planned)))
    return SessionPlan(system, sys_tokens, tuple(sessions))


def _message(
    rng: random.Random, target: int, counter: W.TokenCounter | None, tokens_per_word: float, tag: str
) -> tuple[str, int | None]:
    """`target` tokens of random words behind `tag`, the tag counted in (a tokenizer cuts exactly;
    without one the tag's words are taken off the words drawn)."""
    if counter is None:
        target = max(1, target - round(len(tag.split()) * tokens_per_word))
    return W._fit_words(rng, target, counter, tokens_per_word, prefix=tag)


def plan_for_level(
    cfg: BenchConfig,
    num_sessions: int,
    level_index: int,
    counter: W.TokenCounter | None = None,
    fit: tuple[float, float] | None = None,
) -> SessionPlan:
    """The plan of level `level_index` of `cfg` (what `run_bench` sends; a test rebuilds it the same
    way). Each level has its own sessions; the system prompt is the same at every level."""
    per_word = fit[1] if fit else 1.0
    return build_plan(
        num_sessions,
        cfg.turns,
        cfg.system_prompt_len,
        W.LengthSpec(cfg.input_len, cfg.range_ratio),
        W.LengthSpec(cfg.tool_result_len, cfg.range_ratio),
        W.LengthSpec(cfg.output_len, cfg.range_ratio),
        cfg.tool_turns,
        cfg.think_time_s,
        cfg.think_dist,
        seed=cfg.seed + 7919 * level_index,
        system_seed=cfg.seed,
        counter=counter,
        tokens_per_word=per_word,
    )


def workload_of(plans: list[SessionPlan], counter: W.TokenCounter | None, calibrated: bool) -> W.Workload:
    """The run's workload record: every level's plan (its hash covers every message)."""
    prompts = tuple(p for plan in plans for p in plan.prompts())
    return W.Workload("sessions", prompts, W._counting(counter, calibrated))


# -- the conversation -------------------------------------------------------------------------------
class Conversation:
    """One session's history as the server is sent it: chat messages, or one concatenated prompt."""

    def __init__(self, api: str, system: str | None) -> None:
        self.chat = api == "chat"
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.text = system or ""

    def ask(self, message: str) -> str | list[dict[str, str]]:
        """The history plus `message`: what this turn sends."""
        if self.chat:
            self.messages.append({"role": "user", "content": message})
            return list(self.messages)
        self.text = f"{self.text}\n{message}" if self.text else message
        return self.text

    def answer(self, reply: str) -> None:
        """The assistant's reply, exactly as streamed, joins the history."""
        if self.chat:
            self.messages.append({"role": "assistant", "content": reply})
        else:
            self.text += reply


BuildRequest = Callable[[str | list[dict[str, str]], int], bytes]


async def run_sessions(
    client: Client,
    plan: SessionPlan,
    api: str,
    build: BuildRequest,
    make: RecordFactory,
    on_record: Callable[[RequestRecord], None],
    *,
    speed: float = 1.0,
    duration_s: float | None = None,
) -> tuple[list[RequestRecord], float, ClientMonitor]:
    """Drive every session of `plan` at once; each turn waits for the reply to the one before and its
    think time (÷ `speed`: against `servelab sim --speed X` the think time is in the simulated GPU's
    time, like every figure shown). A failed turn ends its session: the history would not be what a
    real conversation resends. Past `duration_s` no new turn starts. The client must keep the
    streamed text (`Client(keep_text=True)`)."""
    if not client.keep_text:
        raise ValueError("run_sessions needs a Client with keep_text=True: each turn resends the reply")
    raise_fd_limit(len(plan.sessions))
    records: list[RequestRecord] = []
    monitor = ClientMonitor()
    monitor.start()
    t0 = time.perf_counter()
    deadline = t0 + duration_s if duration_s else None
    turns_per = max((len(s.turns) for s in plan.sessions), default=0)

    async def session(spec: SessionSpec) -> None:
        conv = Conversation(api, plan.system_prompt)
        history_tokens = plan.system_tokens
        for turn in spec.turns:
            if turn.think_s > 0:
                await asyncio.sleep(turn.think_s / speed)
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                return
            payload = build(conv.ask(turn.text), turn.output_len)
            history_tokens += turn.tokens or 0
            idx = spec.sid * turns_per + turn.index
            req = PreparedRequest(idx, payload, turn.output_len, history_tokens, "")
            due = time.perf_counter()
            res: StreamResult = await client.send(payload)
            rec = make(idx, req, due - t0, None, res)
            if res.first_token_t is not None:
                rec.ttft_s = res.first_token_t - due
            if res.end_t is not None:
                rec.e2e_s = res.end_t - due
            rec.session_id, rec.turn = spec.sid, turn.index
            records.append(rec)
            on_record(rec)
            if not rec.ok:
                return
            conv.answer(res.text)
            history_tokens += rec.output_tokens or 0

    try:
        await asyncio.gather(*(session(s) for s in plan.sessions))
    finally:
        await monitor.stop()
    return records, time.perf_counter() - t0, monitor


# -- metrics ----------------------------------------------------------------------------------------
def cache_hit_rate(server: Mapping[str, object]) -> tuple[float | None, str | None]:
    """The level's prefix-cache hit rate from the server's metrics (`bench/scrape.py` names):
    vLLM's hits over queries (counters, this level's deltas); SGLang's `cache_hit_rate` gauge."""
    deltas = server.get("deltas") or {}
    queries = _number(deltas, "prefix_cache_queries")
    if queries:
        return (_number(deltas, "prefix_cache_hits") or 0.0) / queries, "prefix_cache_hits/queries"
    after = server.get("after") or {}
    rate = _number(after, "cache_hit_rate")
    if rate is not None:
        return rate, "cache_hit_rate"
    return None, None


def _number(table: object, key: str) -> float | None:
    """A figure of the scrape's summary (`LevelScrape.summary`: tables of numbers), None when absent."""
    v = table.get(key) if isinstance(table, Mapping) else None
    return float(v) if isinstance(v, int | float) else None


def summarize_sessions(
    records: list[RequestRecord], plan: SessionPlan, server: Mapping[str, object] | None = None
) -> SessionsSummary:
    """Per turn index (TTFT p50/p99 and the prompt's mean length: TTFT against context) and per
    session (turns answered and failed, first send to last answer). Pure."""
    by_turn: dict[int, list[RequestRecord]] = {}
    by_session: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.session_id is None or r.turn is None:
            continue
        by_turn.setdefault(r.turn, []).append(r)
        by_session.setdefault(r.session_id, []).append(r)
    per_turn = []
    for t in sorted(by_turn):
        rs = by_turn[t]
        ok = [r for r in rs if r.ok]
        ins = [r.input_tokens for r in ok if r.input_tokens is not None]
        outs = [r.output_tokens for r in ok if r.output_tokens is not None]
        per_turn.append(
            TurnStats(
                turn=t,
                sent=len(rs),
                completed=len(ok),
                failed=len(rs) - len(ok),
                mean_input_tokens=sum(ins) / len(ins) if ins else None,
                mean_output_tokens=sum(outs) / len(outs) if outs else None,
                ttft_ms=stats_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
            )
        )
    per_session, durations = [], []
    for spec in plan.sessions:
        rs = by_session.get(spec.sid, [])
        ends = [r.end_s for r in rs if r.end_s is not None]
        dur = (max(ends) - min(r.start_s for r in rs)) if rs and ends else None
        if dur is not None:
            durations.append(dur)
        per_session.append(
            SessionStat(
                session=spec.sid,
                turns_completed=sum(r.ok for r in rs),
                turns_failed=sum(not r.ok for r in rs),
                duration_s=dur,
            )
        )
    thinks = [t.think_s for s in plan.sessions for t in s.turns if t.index > 0]
    rate, source = cache_hit_rate(server or {})
    done = sum(p.turns_completed for p in per_session)
    failed = sum(p.turns_failed for p in per_session)
    dur_stats = stats_ms(durations)
    return SessionsSummary(
        sessions=len(plan.sessions),
        turns_planned=plan.turns_planned,
        sessions_completed=sum(
            p.turns_completed == len(s.turns) for p, s in zip(per_session, plan.sessions, strict=True)
        ),
        turns_completed=done,
        turns_failed=failed,
        turns_not_sent=plan.turns_planned - done - failed,
        think_time_s=sum(thinks) / len(thinks) if thinks else None,
        session_duration_s=dur_stats.scaled(1e-3) if durations else Stats(),
        per_turn=per_turn,
        per_session=per_session,
        cache_hit_rate=rate,
        cache_source=source,
    )


def plan_hash(plan: SessionPlan) -> str:
    """A short hash of one plan's texts and lengths (tests compare plans by it)."""
    h = hashlib.sha256()
    for p in plan.prompts():
        h.update(p.text.encode() + b"\0" + str(p.output_len).encode() + b"\1")
    return h.hexdigest()[:16]
