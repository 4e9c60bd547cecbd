"""The prompts a run sends, built before its first level: the bounded pool (`pool_size`), the workload
(synthetic, ShareGPT, shared-prefix, or a trace's own requests), and the requests prepared from it once,
so a level only sends bytes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

from servelab import crashpoint
from servelab.bench import sessions as SE
from servelab.bench import traces as T
from servelab.bench import workload as W
from servelab.bench.client import Client
from servelab.bench.config import BenchConfig
from servelab.bench.load import PreparedRequest
from servelab.bench.probe import Capabilities, request_body, request_path

POOL_TOKENS = 1 << 24
POOL_MAX = 65536


def pool_size(cfg: BenchConfig, count: int) -> int:
    """How many distinct prompts to build for `count` requests (at least one)."""
    per_prompt = cfg.input_len * (1 + cfg.range_ratio) + (
        cfg.prefix_len if cfg.workload == "shared-prefix" else 0
    )
    return max(1, min(count, POOL_MAX, int(POOL_TOKENS // max(1.0, per_prompt))))


async def _collect(prompts: Iterable[W.Prompt]) -> tuple[W.Prompt, ...]:
    """Build prompts one at a time, yielding to the loop between them so SIGINT/SIGTERM stop a long
    build at once (a synchronous loop would hold the signal handlers off until it ended)."""
    out = []
    for p in prompts:
        out.append(p)
        crashpoint.stall("prompt-built")
        await asyncio.sleep(0)
    return tuple(out)


async def build_workload(
    cfg: BenchConfig,
    counter: W.TokenCounter | None,
    fit: tuple[float, float] | None,
    count: int,
    seed: int,
    trace: T.Trace | None = None,
) -> W.Workload:
    overhead, per_word = fit if fit else (0.0, 1.0)
    if trace is not None:
        prompts = await _collect(T.trace_prompts(trace, seed, counter, per_word, round(overhead)))
        name = f"trace:{trace.format}:{Path(trace.path).name}"
        return W.Workload(name, prompts, W._counting(counter, fit is not None))
    in_len = W.LengthSpec(
        max(1, cfg.input_len - round(overhead) if not counter else cfg.input_len), cfg.range_ratio
    )
    out_len = W.LengthSpec(cfg.output_len, cfg.range_ratio)
    cal = fit is not None
    if cfg.workload == "sharegpt":
        assert cfg.dataset
        return W.sharegpt(cfg.dataset, count, seed, counter, per_word, calibrated=cal)
    if cfg.workload == "shared-prefix":
        prompts = await _collect(
            W.shared_prefix_prompts(
                count, cfg.num_prefixes, cfg.prefix_len, in_len, out_len, seed, counter, per_word
            )
        )
        return W.Workload("shared-prefix", prompts, W._counting(counter, cal))
    prompts = await _collect(W.synthetic_prompts(count, in_len, out_len, seed, counter, per_word))
    return W.Workload("synthetic", prompts, W._counting(counter, cal))


def read_trace(cfg: BenchConfig) -> T.Trace | None:
    """The trace of a `--trace` run, sliced to `--trace-limit` and `--duration` (the level's seconds:
    trace time × the time scale), read before the server is asked anything: a bad file is bad input."""
    if cfg.trace is None:
        return None
    until = cfg.duration_s * cfg.time_scale if cfg.duration_s is not None else None
    return T.read_trace(cfg.trace, cfg.trace_format).sliced(cfg.trace_limit, until)


async def prepare_requests(
    client: Client, cfg: BenchConfig, caps: Capabilities, wl: W.Workload
) -> list[PreparedRequest]:
    path, out = request_path(cfg), []
    for i, p in enumerate(wl.prompts):
        body = request_body(cfg, caps, p.text, p.output_len)
        out.append(PreparedRequest(i, client.build_request(path, body), p.output_len, p.input_len, p.text))
        if i % 64 == 63:
            await asyncio.sleep(0)
    return out


def session_builder(client: Client, cfg: BenchConfig, caps: Capabilities) -> SE.BuildRequest:
    """A session turn's request: the usual body (exact lengths, usage) with the history as its
    messages (chat) or prompt (completions)."""
    path = request_path(cfg)

    def build(history: str | list[dict[str, str]], max_tokens: int) -> bytes:
        body = request_body(cfg, caps, "", max_tokens)
        body["messages" if cfg.api == "chat" else "prompt"] = (
            history if isinstance(history, str) else [dict(m) for m in history]
        )
        return client.build_request(path, body)

    return build
