"""Why the client parses SSE the way it does: CPU per event for the choices we measured.

A vLLM-shaped completions stream (400 token events + usage + [DONE], chunked transfer encoding)
is fed to each parser in reads of N events, as a fast server's TCP reads deliver them. Compared:

- stdlib `json.loads` per event, string splitting (what `vllm bench serve` does);
- `orjson.loads` per event, bytes splitting;
- servelab's client (`bench/client.py`): chunked framing stripped for the whole read in C-level
  passes, then every complete event of the read validated and parsed by one `orjson.loads`.

Usage: .venv/bin/python benchmarks/sse_parsing.py
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import orjson

from servelab.bench.client import _Conn

EVENT = (
    '{"id":"cmpl-5f0c1a2b3c4d4e5f","object":"text_completion","created":1764400000,"model":"tiny-qwen3-moe",'
    '"choices":[{"index":0,"text":" word%d","logprobs":null,"finish_reason":%s,"stop_reason":null}],"usage":null}'
)


def stream(n: int = 400) -> list[bytes]:
    evs = [
        b"data: " + (EVENT % (i, '"length"' if i == n - 1 else "null")).encode() + b"\n\n" for i in range(n)
    ]
    evs.append(
        b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[],'
        b'"usage":{"prompt_tokens":64,"completion_tokens":%d}}\n\n' % n
    )
    evs.append(b"data: [DONE]\n\n")
    return evs


def chunked(evs: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in evs) + b"0\r\n\r\n"


def reads(raw: bytes, per_read_bytes: int) -> list[bytes]:
    return [raw[i : i + per_read_bytes] for i in range(0, len(raw), per_read_bytes)]


def stdlib_per_event(parts: list[bytes]) -> int:
    """The `vllm bench serve` way: decode, split strings on blank lines, json.loads each event."""
    buf, tokens = "", 0
    for part in parts:
        buf += part.decode()
        while "\n\n" in buf:
            msg, buf = buf.split("\n\n", 1)
            msg = msg.strip()
            # (chunk-size lines are left in the text by this naive reader; skip them)
            line = msg[msg.find("data: ") :] if "data: " in msg else ""
            if not line:
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                continue
            obj = json.loads(data)
            if obj.get("choices"):
                tokens += 1
    return tokens


def orjson_per_event(parts: list[bytes]) -> int:
    buf, tokens = b"", 0
    for part in parts:
        buf += part
        *events, buf = buf.split(b"\n\n")
        for ev in events:
            i = ev.find(b"data: ")
            if i < 0 or ev[i + 6 :] == b"[DONE]":
                continue
            obj = orjson.loads(ev[i + 6 :])
            if obj.get("choices"):
                tokens += 1
    return tokens


def servelab(parts: list[bytes]) -> int:
    class _T:
        def write(self, _: bytes) -> None: ...
        def close(self) -> None: ...

    async def go() -> int:
        conn = _Conn()
        conn.connection_made(_T())  # type: ignore[arg-type]
        fut = conn.start(b"", "stream", None, False)
        conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in parts:
            conn.data_received(part)
        await fut
        return conn.result.chunks

    return _LOOP.run_until_complete(go())


_LOOP = asyncio.new_event_loop()


def us_per_event(
    fn: Callable[[list[bytes]], int], parts: list[bytes], events: int, repeat: int = 30
) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(repeat):
            fn(parts)
        best = min(best, (time.process_time() - t0) / repeat / events * 1e6)
    return best


def main() -> None:
    evs = stream()
    raw = chunked(evs)
    print("µs of CPU per streamed event (best of 5), by events per TCP read")
    print(f"{'events/read':>12} {'stdlib json':>12} {'orjson/event':>13} {'servelab':>9}")
    for per_read in (1, 8, 64):
        size = max(1, len(raw) // (len(evs) // per_read))
        parts = reads(raw, size)
        row = [us_per_event(f, parts, len(evs)) for f in (stdlib_per_event, orjson_per_event, servelab)]
        print(f"{per_read:>12} {row[0]:>12.2f} {row[1]:>13.2f} {row[2]:>9.2f}")


if __name__ == "__main__":
    main()
