"""Requests the server will refuse, named before they are sent: every request of the workload (a
trace's rows, a dataset's prompts, the synthetic pool, each session turn's growing history) against the
server's context (`max_model_len`, as its /v1/models states it).

A request needs its prompt plus the output it asks for (`max_tokens`) inside the context; the engines
refuse more with HTTP 400 (vLLM: prompt + max_tokens > max_model_len; SGLang already at equal). What
the run does with such rows is `--over-context`: `send` them (they fail, with the server's words, and
the warning said so before the level), `skip` them, or `clip` them (the prompt cut, as the engines' own
truncation options cut it, so that prompt + output fit one token under the context; an output over half
the context is cut to half). The check and what was done are stored with the run (`config.context_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servelab.bench import sessions as SE
from servelab.bench import traces as T
from servelab.bench import workload as W
from servelab.errors import ConfigError

ACTIONS = ("send", "skip", "clip")


@dataclass(frozen=True)
class ContextFit:
    """What the check found and did (stored in the run's config as `context_fit`)."""

    max_model_len: int
    what: str  # "trace rows" | "prompts" | "session turns"
    checked: int
    over: int  # requests whose prompt + max_tokens exceed the context
    longest: int  # the longest prompt + max_tokens of the workload (tokens)
    action: str  # send | skip | clip
    counting: str  # how lengths were counted (tokenizer | usage-calibrated | words)

    def warning(self) -> str | None:
        if not self.over:
            return None
        head = (
            f"{self.over} of {self.checked} {self.what} ask for more than the server's context: prompt + "
            f"max_tokens up to {self.longest:,} tokens, over max_model_len {self.max_model_len:,}"
        )
        if self.action == "skip":
            return head + "; --over-context skip: they are not sent"
        if self.action == "clip":
            return head + "; --over-context clip: their prompts are cut to fit"
        if self.what == "session turns":
            return head + (
                "; the server will refuse them (HTTP 400) and end their sessions: ask for fewer --turns or "
                "shorter messages, or start the server with a longer context"
            )
        return head + (
            "; the server will refuse them (HTTP 400): --over-context skip leaves them out, --over-context "
            "clip cuts their prompts, or start the server with a longer context"
        )


def _limit(max_model_len: int, counting: str) -> int:
    """The total a clipped request is cut to: one under the context (SGLang refuses equal), less a margin
    where prompt lengths are estimated rather than counted by the tokenizer."""
    margin = 0 if counting == "tokenizer" else max(8, max_model_len // 100)
    return max(2, max_model_len - 1 - margin)


def _clipped(input_len: int, output_len: int, limit: int) -> tuple[int, int]:
    out = min(output_len, max(1, limit // 2)) if input_len + output_len > limit else output_len
    return max(1, min(input_len, limit - out)), out


def _over(need: list[int], max_model_len: int) -> list[bool]:
    return [n > max_model_len for n in need]


def _refuse_all(fit: ContextFit) -> None:
    if fit.action == "skip" and fit.over == fit.checked:
        raise ConfigError(
            f"every one of the {fit.checked} {fit.what} exceeds the server's max_model_len "
            f"{fit.max_model_len:,}: --over-context skip leaves nothing to send",
            hint="use --over-context clip, or start the server with a longer context",
        )


def fit_trace(
    trace: T.Trace, max_model_len: int, overhead: int, action: str, counting: str
) -> tuple[T.Trace, ContextFit]:
    """A trace's rows checked (prompt + the trace's output length + the chat template's `overhead`), and
    skipped or clipped as `action` says; the rows keep their arrival times."""
    need = [r.input_len + overhead + r.output_len for r in trace.requests]
    over = _over(need, max_model_len)
    fit = ContextFit(
        max_model_len, "trace rows", len(need), sum(over), max(need, default=0), action, counting
    )
    _refuse_all(fit)
    if not fit.over or action == "send":
        return trace, fit
    if action == "skip":
        return replace(
            trace, requests=tuple(r for r, o in zip(trace.requests, over, strict=True) if not o)
        ), fit
    limit = _limit(max_model_len, counting) - overhead
    reqs = []
    for r, o in zip(trace.requests, over, strict=True):
        if o:
            n_in, n_out = _clipped(r.input_len, r.output_len, limit)
            r = replace(r, input_len=n_in, output_len=n_out)
        reqs.append(r)
    return replace(trace, requests=tuple(reqs)), fit


def fit_workload(
    wl: W.Workload,
    max_model_len: int,
    overhead: int,
    action: str,
    counter: W.TokenCounter | None,
    per_word: float,
) -> tuple[W.Workload, ContextFit]:
    """A prompt pool (dataset, synthetic, shared prefix) checked, and skipped or clipped as `action` says."""
    need = [(p.input_len or 0) + overhead + p.output_len for p in wl.prompts]
    over = _over(need, max_model_len)
    fit = ContextFit(
        max_model_len, "prompts", len(need), sum(over), max(need, default=0), action, wl.token_counting
    )
    _refuse_all(fit)
    if not fit.over or action == "send":
        return wl, fit
    if action == "skip":
        return replace(wl, prompts=tuple(p for p, o in zip(wl.prompts, over, strict=True) if not o)), fit
    limit = _limit(max_model_len, wl.token_counting) - overhead
    prompts = []
    for p, o in zip(wl.prompts, over, strict=True):
        if o:
            n_in, n_out = _clipped(p.input_len or 0, p.output_len, limit)
            if counter is not None:
                text = counter.cut(p.text, n_in)
            else:
                text = " ".join(p.text.split(" ")[: max(1, round(n_in / max(per_word, 1e-6)))])
            p = W.Prompt(text, n_out, n_in)
        prompts.append(p)
    return replace(wl, prompts=tuple(prompts)), fit


def fit_sessions(plans: list[SE.SessionPlan], max_model_len: int, overhead: int, counting: str) -> ContextFit:
    """Each planned turn's history (the system prompt, every message and full-length reply before it, its
    own message) plus the reply it asks for, against the context. Sessions are only counted: a turn
    cannot be skipped or cut without changing every turn after it."""
    need: list[int] = []
    for plan in plans:
        for s in plan.sessions:
            history = plan.system_tokens + overhead
            for t in s.turns:
                history += t.tokens or 0
                need.append(history + t.output_len)
                history += t.output_len
    over = _over(need, max_model_len)
    return ContextFit(
        max_model_len, "session turns", len(need), sum(over), max(need, default=0), "send", counting
    )
