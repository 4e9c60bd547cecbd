"""The sample traces in tests/fixtures/traces/, one per format `servelab bench --trace` reads: written by us
in each published format (data/traces.toml names the fields and sources), seeded, so they can be made again.

`python -m tests.support.trace_samples` rewrites them; tests/unit/bench/test_traces.py checks that the
committed files are what this writes.

- mooncake.jsonl: 100 requests over ~10 s; four shared "system prompts" of 1–2 blocks of 512 tokens each,
  then the request's own blocks (the last one partial), hash ids chained as Mooncake's are.
- burstgpt.csv: 100 requests over ~10 s, ChatGPT and GPT-4, conversation and API logs; three rows with
  0 response tokens (a failure in the original service: skipped by the reader).
- azure.csv: 100 requests over ~10 s, wall-clock timestamps with 100 ns ticks.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.bench.traces import Trace

DIR = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
N = 100
SPAN_S = 10.0
BLOCK = 512


def _arrivals(rng: random.Random, n: int = N, span_s: float = SPAN_S) -> list[float]:
    """Bursty arrivals: exponential gaps, rescaled so the last request arrives at `span_s`."""
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(1.0) * (0.2 if rng.random() < 0.3 else 1.0)
    return [x * span_s / out[-1] for x in out]


def mooncake() -> str:
    rng = random.Random(18)
    prefixes = [[g * 1000 + k for k in range(rng.randint(1, 2))] for g in range(4)]
    next_id = 10_000
    lines = []
    for t in _arrivals(rng):
        ids = list(prefixes[rng.randrange(4)]) if rng.random() < 0.8 else []
        own = rng.randint(1, 2)
        ids += list(range(next_id, next_id + own))
        next_id += own
        input_len = (len(ids) - 1) * BLOCK + rng.randint(16, BLOCK)
        row = {
            "timestamp": round(t * 1000),
            "input_length": input_len,
            "output_length": rng.randint(4, 32),
            "hash_ids": ids,
        }
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def burstgpt() -> str:
    rng = random.Random(19)
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    failed = {17, 52, 88}
    for i, t in enumerate(_arrivals(rng)):
        model = "GPT-4" if rng.random() < 0.25 else "ChatGPT"
        req = rng.randint(16, 1200)
        resp = 0 if i in failed else rng.randint(4, 48)
        log = "API log" if rng.random() < 0.4 else "Conversation log"
        rows.append(f"{t:.3f},{model},{req},{resp},{req + resp},{log}")
    return "\n".join(rows) + "\n"


def azure() -> str:
    rng = random.Random(20)
    start = dt.datetime(2023, 11, 16, 18, 15, 46, 680590)
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t in _arrivals(rng):
        ticks = round(t * 10**7)  # 100 ns
        stamp = start + dt.timedelta(microseconds=ticks // 10)
        rows.append(
            f"{stamp:%Y-%m-%d %H:%M:%S}.{stamp.microsecond:06d}{ticks % 10},"
            f"{rng.randint(16, 1500)},{rng.randint(4, 48)}"
        )
    return "\n".join(rows) + "\n"


def shared_block_tokens(trace: Trace) -> int:
    """Tokens of full blocks whose ids (and so whole prefix) an earlier request of the trace sent: what a
    prefix cache can hit at best."""
    seen: set[tuple[int, ...]] = set()
    total = 0
    size = trace.block_tokens or BLOCK
    for r in trace.requests:
        for k in range(1, r.input_len // size + 1):
            key = r.hash_ids[:k]
            if len(key) == k and key in seen:
                total += size
        seen.update(r.hash_ids[:k] for k in range(1, len(r.hash_ids) + 1))
    return total


SAMPLES = {"mooncake.jsonl": mooncake, "burstgpt.csv": burstgpt, "azure.csv": azure}


def write(to: Path = DIR) -> None:
    to.mkdir(parents=True, exist_ok=True)
    for name, make in SAMPLES.items():
        (to / name).write_text(make())


if __name__ == "__main__":
    write()
