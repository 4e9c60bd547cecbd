"""The HTTP/SSE parser must give the same answer however TCP splits the bytes."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from servelab.bench.client import Client, Endpoint, StreamResult, _Conn


class _Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _chunked(events: list[bytes]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + body
        + b"0\r\n\r\n"
    )


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _events(n: int, usage: bool = True, chat: bool = False) -> list[bytes]:
    evs = []
    if chat:
        evs.append(_sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
    for i in range(n):
        fr = "length" if i == n - 1 else None
        choice = {"index": 0, "delta": {"content": f"t{i}"}} if chat else {"index": 0, "text": f"t{i}"}
        evs.append(_sse({"choices": [choice | {"finish_reason": fr}]}))
    if usage:
        evs.append(_sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}}))
    evs.append(b"data: [DONE]\n\n")
    return evs


def feed(raw: bytes, pieces: list[int], mode: str = "stream") -> StreamResult:
    async def go() -> StreamResult:
        conn = _Conn()
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        fut = conn.start(b"GET / HTTP/1.1\r\n\r\n", mode, None)
        pos = 0
        for size in pieces:
            conn.data_received(raw[pos : pos + size])
            pos += size
        if pos < len(raw):
            conn.data_received(raw[pos:])
        if not fut.done():
            conn.connection_lost(None)
        await fut
        return conn.result

    return asyncio.run(go())


@pytest.mark.parametrize("split", [1, 2, 3, 7, 13, 64, 10_000])
def test_stream_parsed_identically_for_any_split(split: int) -> None:
    raw = _chunked(_events(5))
    res = feed(raw, [split] * (len(raw) // split + 1))
    assert res.ok, res.error_message
    assert res.text == "t0t1t2t3t4"
    assert res.chunks == 5 and len(res.itl_s) == 4
    assert (res.prompt_tokens, res.completion_tokens) == (7, 5)
    assert res.finish_reason == "length"


def test_events_packed_in_one_chunk_and_crlf_separators() -> None:
    body = b"".join(_events(3)).replace(b"\n\n", b"\r\n\r\n")
    raw = _chunked([body])
    res = feed(raw, [len(raw)])
    assert res.ok and res.chunks == 3 and res.completion_tokens == 3


def test_empty_chunks_count_like_vllm_bench_serve() -> None:
    """The role chunk (and any chunk with a choice) is a token event; a bare closing chunk is not."""
    res = feed(_chunked(_events(4, chat=True)), [10_000])
    assert res.ok and res.chunks == 5 and res.text == "t0t1t2t3"
    evs = [
        _sse({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}),
        _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        b"data: [DONE]\n\n",
    ]
    res = feed(_chunked(evs), [10_000])
    assert res.ok and res.chunks == 1 and res.finish_reason == "stop"


def test_close_delimited_body() -> None:
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + b"".join(
        _events(2)
    )
    res = feed(raw, [len(raw)])
    assert res.ok and res.chunks == 2


def test_malformed_sse_is_a_counted_error() -> None:
    evs = _events(3)
    evs.insert(2, b"data: {not json\n\n")
    res = feed(_chunked(evs), [10_000])
    assert not res.ok and res.error_kind == "malformed_sse"


def test_connection_dropped_mid_stream() -> None:
    raw = _chunked(_events(10))
    res = feed(raw[: len(raw) // 2], [len(raw) // 2])
    assert not res.ok and res.error_kind == "disconnected"


def test_stream_without_done_or_finish_reason_is_incomplete() -> None:
    evs = [_sse({"choices": [{"index": 0, "text": "a", "finish_reason": None}]})]
    res = feed(_chunked(evs), [10_000])
    assert not res.ok and res.error_kind == "incomplete"


def test_http_error_keeps_status_and_body() -> None:
    body = b'{"detail": "ignore_eos is not allowed"}'
    raw = b"HTTP/1.1 422 Unprocessable\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    res = feed(raw, [5, 5, 5])
    assert not res.ok and res.error_kind == "http_422" and "ignore_eos" in (res.error_message or "")


def test_error_event_in_stream() -> None:
    res = feed(_chunked([_sse({"error": {"message": "boom"}})]), [10_000])
    assert res.error_kind == "server_error_event"


def test_non_streaming_json_body() -> None:
    body = json.dumps(
        {
            "choices": [{"text": "hello", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        }
    ).encode()
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    res = feed(raw, [len(raw)], mode="json")
    assert res.ok and res.text == "hello" and res.completion_tokens == 2


def test_request_building_and_url_errors() -> None:
    c = Client("http://127.0.0.1:8000/base/", api_key="sk-secret")
    req = c.build_request("/v1/completions", {"a": 1})
    assert req.startswith(b"POST /base/v1/completions HTTP/1.1\r\n")
    assert b"Content-Length: 7\r\n" in req and b"Authorization: Bearer sk-secret" in req
    assert Endpoint.parse("https://x.example").port == 443
    with pytest.raises(ValueError, match="must look like"):
        Endpoint.parse("localhost:8000")


def test_connect_error_is_reported_not_raised() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def go() -> StreamResult:
        c = Client(f"http://127.0.0.1:{port}")
        return await c.send(c.build_request("/v1/completions", {}))

    res = asyncio.run(go())
    assert not res.ok and res.error_kind == "connect_error"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_write_on_a_transport_closed_under_the_client_is_a_result_not_a_raise(loop: str) -> None:
    """An ssh forward killed mid-run closes the socket before `connection_lost` reaches the pool: uvloop
    then raises RuntimeError on write. The pooled connection is retried once; a fresh one is answered."""
    import uvloop

    body = b'{"ok": true}'
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(reply)
        writer.close()

    async def go() -> tuple[StreamResult, StreamResult]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = Client(f"http://127.0.0.1:{port}")
        first = await c.send(c.build_request("/x", None, method="GET"), mode="raw")
        conn = c._idle[0]
        assert conn.transport is not None
        conn.transport.close()  # closed under the pool: `closed` is not set yet
        await asyncio.sleep(0)
        conn.closed = False  # as when the close raced ahead of connection_lost
        c._idle = [conn]
        second = await c.send(c.build_request("/x", None, method="GET"), mode="raw", timeout_s=10)
        c.close()
        server.close()
        return first, second

    runner = uvloop.run if loop == "uvloop" else asyncio.run
    first, second = runner(go())
    assert first.ok and second.ok, (second.error_kind, second.error_message)
    assert second.body == body


def test_any_split_gives_the_same_result() -> None:
    """Whole stream in one read, or one byte per read: the same result."""
    evs = _events(50)
    evs.insert(3, _sse({"choices": [{"index": 0, "text": "", "finish_reason": None}]}))  # held-back text
    evs.insert(5, _sse({"choices": [{"index": 0, "text": 'say "text":"x"', "finish_reason": None}]}))
    raw = _chunked(evs)
    whole = feed(raw, [len(raw)])
    bytewise = feed(raw, [1] * len(raw))
    for res in (whole, bytewise):
        assert res.ok and res.chunks == 52 and res.completion_tokens == 50 and res.finish_reason == "length"
    assert whole.text == bytewise.text
    assert len(whole.itl_s) == len(bytewise.itl_s) == 51


def test_comment_error_and_scalar_events() -> None:
    evs = [
        _sse({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}),
        b": keep-alive\n\n",
        _sse({"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]}),
        b"data: [DONE]\n\n",
    ]
    res = feed(_chunked(evs), [10_000])
    assert res.ok and res.text == "ab"
    bad = feed(_chunked([_sse({"choices": [{"index": 0, "text": "a"}]}), _sse({"error": "x"})]), [10_000])
    assert bad.error_kind == "server_error_event"
    scalar = feed(_chunked([b"data: 5\n\n"]), [10_000])
    assert scalar.error_kind == "malformed_sse"
