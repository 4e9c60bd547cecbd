"""A lean streaming HTTP/1.1 client for OpenAI-compatible servers.

Why not aiohttp or httpx: a benchmark client must cost far less CPU per streamed token than the
server it measures, or it measures itself. This client is an asyncio Protocol: one callback per TCP
read, chunked framing and SSE split with bytes.find, one orjson parse per event, and keep-alive
connections reused across requests. See benchmarks/client_overhead.py for the measurements.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, cast
from urllib.parse import urlsplit

import orjson

from servelab.jsontypes import JsonObject

_perf = time.perf_counter


def _delta_text(choice: dict[str, Any]) -> str:
    """Chat chunks carry their text in the delta (content, or reasoning for reasoning models)."""
    delta = choice.get("delta")
    if not delta:
        return ""
    return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""


MESSAGE_MAX = 1000  # a server's error text is kept whole up to this many characters


def server_message(body: bytes) -> str:
    """The server's own words in an error answer: the `message` of an OpenAI-style JSON error body
    (`{"error": {"message": ...}}` as vLLM writes it, `{"object": "error", "message": ...}` as SGLang does,
    FastAPI's `{"detail": ...}`), else the body as text."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        inner = obj.get("error")
        for holder in (inner, obj) if isinstance(inner, dict) else (obj,):
            for key in ("message", "detail"):
                text = holder.get(key)
                if isinstance(text, str) and text:
                    return text[:MESSAGE_MAX]
        if isinstance(inner, str) and inner:
            return inner[:MESSAGE_MAX]
    return body[:MESSAGE_MAX].decode("utf-8", "replace")


@dataclass(slots=True)
class StreamResult:
    """The client-side view of one request: timings (perf_counter seconds) and what came back."""

    ok: bool = False
    status: int = 0
    first_token_t: float | None = None
    end_t: float | None = None
    itl_s: list[float] = field(default_factory=list)
    # the token times are the server's (`servelab sim`'s `servelab_t`: each token's time on its step
    # clock since the request arrived), laid from the moment the request was written
    server_timed: bool = False
    chunks: int = 0
    text_parts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error_kind: str | None = None
    error_message: str | None = None
    body: bytes = b""

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


class HTTPError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status
        self.body = body


@dataclass(frozen=True, slots=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"URL {url!r} must look like http://HOST:PORT")
        try:
            explicit = parts.port
        except ValueError:  # urllib's own words ("Port out of range 0-65535") do not name the URL
            raise ValueError(f"URL {url!r}: the port must be a number from 1 to 65535") from None
        port = explicit or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        return f"{self.host}:{self.port}"


class _Conn(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time."""

    __slots__ = (
        "_body_left",
        "_body_parts",
        "_buf",
        "_chunk_left",
        "_chunked",
        "_done",
        "_done_event",
        "_events",
        "_fut",
        "_got_bytes",
        "_headers_done",
        "_idle_s",
        "_idle_timer",
        "_keep_alive",
        "_last_rx",
        "_last_t",
        "_mode",
        "_res",
        "_sent_t",
        "_server_times",
        "_stream",
        "_timer",
        "closed",
        "keep_text",
        "transport",
    )

    # Per-response parser state, reset by start() for each request on this connection.
    _buf: bytearray
    _events: bytes
    _chunk_left: int
    _headers_done: bool
    _chunked: bool
    _body_left: int | None
    _keep_alive: bool
    _done: bool
    _done_event: bool
    _got_bytes: bool
    _mode: str
    keep_text: bool
    _stream: bool
    _body_parts: list[bytes]
    _last_t: float
    _last_rx: float
    _sent_t: float  # when the request was written: where a server-timed stream's token times start
    _server_times: bool  # time tokens by the server's own stamps where it sends them
    _idle_s: float | None

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._fut: asyncio.Future[None] | None = None
        self._res: StreamResult | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection() hands a stream protocol a Transport (BaseTransport is its declared type)
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._fut is not None and not self._fut.done():
            res = self._res
            assert res is not None
            if not self._headers_done:
                self._finish(
                    "disconnected" if self._got_bytes else "connection_closed",
                    f"connection closed before a response{': ' + str(exc) if exc else ''}",
                )
            elif self._chunked is False and self._body_left is None:
                self._end_of_body()  # close-delimited body ends here
            else:
                self._finish("disconnected", f"connection dropped mid-stream after {res.chunks} chunks")

    def data_received(self, data: bytes) -> None:
        t = _perf()
        self._got_bytes = True
        self._last_rx = t
        if self._fut is None or self._fut.done():
            return
        if not self._headers_done:
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > 65536:
                    self._finish("bad_response", "response headers too large")
                return
            head, data = bytes(self._buf[:end]), bytes(self._buf[end + 4 :])
            self._buf = bytearray()
            if not self._parse_head(head):
                return
            if not data:
                return
        if self._chunked:
            self._feed_chunked(data, t)
        else:
            if self._body_left is not None:
                data = data[: self._body_left]
                self._body_left -= len(data)
            self._feed_body(data, t)
            if self._body_left == 0 and not self._done:
                self._end_of_body()

    # parsing --------------------------------------------------------------------------------------
    def _parse_head(self, head: bytes) -> bool:
        res = self._res
        assert res is not None
        lines = head.split(b"\r\n")
        try:
            res.status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            self._finish("bad_response", f"bad status line {lines[0][:100]!r}")
            return False
        self._headers_done = True
        self._chunked = False
        self._body_left = None
        self._keep_alive = lines[0].startswith(b"HTTP/1.1")
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = True
            elif name == b"content-length":
                self._body_left = int(value.strip())
            elif name == b"connection":
                self._keep_alive = value.strip().lower() == b"keep-alive" or (
                    self._keep_alive and value.strip().lower() != b"close"
                )
        if res.status != 200:
            self._stream = False  # collect the error body
        if self._body_left == 0 and not self._chunked:
            self._end_of_body()
            return False
        return True

    def _feed_chunked(self, data: bytes, t: float) -> None:
        """Strip chunked framing from what this read brought, then parse the payload once."""
        if self._buf:
            data = bytes(self._buf) + data
            self._buf = bytearray()
        if len(data) > 2048 and self._chunk_left == 0:
            self._buf += data
            if self._fast_dechunk(t):
                return
            self._buf = bytearray()
        pieces: list[bytes] = []
        pos, n, left, ended = 0, len(data), self._chunk_left, False
        while pos < n:
            if left > 0:
                end = pos + left
                if end <= n:
                    pieces.append(data[pos:end])
                    pos, left = end, -2  # then the CRLF that closes the chunk
                else:
                    pieces.append(data[pos:])
                    left -= n - pos
                    pos = n
            elif left == -2:
                if n - pos < 2:
                    break
                pos += 2
                left = 0
            else:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    break
                size_text = data[pos:eol].split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    self._finish("bad_response", f"bad chunk size {size_text[:40]!r}")
                    return
                pos = eol + 2
                if size == 0:
                    ended = True
                    break
                left = size
        self._chunk_left = left
        if pos < n and not ended:
            self._buf += data[pos:]
        if pieces:
            self._feed_body(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)
        if ended and not self._done:
            self._end_of_body()

    def _fast_dechunk(self, t: float) -> bool:
        """The common case, in C-level passes: whole `size CRLF payload CRLF` chunks, no CRLF inside.

        Returns False (touching nothing) when the buffer does not have that shape, and the general
        parser takes over.
        """
        segs = bytes(self._buf).split(b"\r\n")
        pairs = (len(segs) - 1) // 2  # the last segment is an incomplete chunk, or b""
        if pairs < 1:
            return False
        sizes = segs[0 : 2 * pairs : 2]
        payloads = segs[1 : 2 * pairs : 2]
        try:
            nums = list(map(int, sizes, repeat(16)))
        except ValueError:
            return False
        ended = 0 in nums
        if ended:
            k = nums.index(0)
            del sizes[k + 1 :], payloads[k:], nums[k:]
        if list(map(len, payloads)) != nums:
            return False
        consumed = sum(map(len, sizes)) + sum(nums) + 4 * len(nums) + (2 if ended else 0)
        del self._buf[:consumed]
        if payloads:
            self._feed_body(b"".join(payloads), t)
        if ended and not self._done:
            self._end_of_body()
        return True

    def _feed_body(self, data: bytes, t: float) -> None:
        if not self._stream:
            self._body_parts.append(data)
            return
        if b"\r" in data or self._events.endswith(b"\r"):
            # SSE allows CRLF line ends; normalise (a lone CR at the end waits for its LF)
            data = self._events + data
            self._events = b""
            keep_cr = data.endswith(b"\r")
            data = data[:-1] if keep_cr else data
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if keep_cr else b"")
        parts = (self._events + data).split(b"\n\n") if self._events else data.split(b"\n\n")
        self._events = parts.pop()
        event = self._event
        for raw in parts:
            event(raw, t)
            if self._done:
                return

    def _event(self, raw: bytes, t: float) -> None:
        """One SSE event. The hot path is a token chunk: one data line, choices[0] with text."""
        if raw[:6] == b"data: " and raw.find(b"\n") < 0:
            payload = raw[6:]
        else:
            payload = b"".join(line[5:].lstrip() for line in raw.split(b"\n") if line.startswith(b"data:"))
            if not payload:
                return  # comments, keep-alives, event names
        if payload == b"[DONE]":
            self._done_event = True
            return
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self._finish("malformed_sse", f"undecodable SSE data: {payload[:200]!r}")
            return
        try:
            c = obj["choices"][0]
            text = c["text"] if "text" in c else _delta_text(c)
        except (KeyError, IndexError, TypeError):
            self._other_event(obj, payload)
            return
        res = self._res
        assert res is not None
        if self._server_times:
            stamp = obj.get("servelab_t")
            if stamp is not None and type(stamp) in (float, int):
                # `servelab sim`: the token's time on the simulator's step clock since the request
                # arrived. A stall of this process or the simulator's delays only when bytes are read.
                t = self._sent_t + stamp
                res.server_timed = True
        # Like `vllm bench serve`, a chunk with a choice is a token event even when its text is empty
        # (a special token, or text the detokenizer holds back); only a closing chunk that carries
        # nothing but a finish_reason is not.
        if text or not c.get("finish_reason"):
            if res.first_token_t is None:
                res.first_token_t = t
                if self._idle_s:
                    self._idle_timer = asyncio.get_running_loop().call_later(self._idle_s, self._on_idle)
            else:
                res.itl_s.append(t - self._last_t)
            self._last_t = t
            res.chunks += 1
            if self.keep_text and text:
                res.text_parts.append(text)
        if c.get("finish_reason"):
            res.finish_reason = c["finish_reason"]
        if obj.get("usage"):
            self._usage(obj["usage"])

    def _other_event(self, obj: Any, payload: bytes) -> None:
        """Events without choices[0]: usage-only, errors, and data that is not an object."""
        if type(obj) is not dict:
            self._finish("malformed_sse", f"SSE data is not an object: {payload[:200]!r}")
        elif "error" in obj:
            self._finish("server_error_event", str(obj["error"])[:300])
        elif obj.get("usage"):
            self._usage(obj["usage"])

    def _usage(self, usage: dict[str, Any]) -> None:
        res = self._res
        assert res is not None
        res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
        res.completion_tokens = usage.get("completion_tokens", res.completion_tokens)

    def _end_of_body(self) -> None:
        res = self._res
        assert res is not None
        if self._body_parts:
            res.body = b"".join(self._body_parts)
        if res.status != 200:
            self._finish(f"http_{res.status}", server_message(res.body))
            return
        if self._mode == "raw":
            self._finish(None, None)
            return
        if self._mode == "json":
            self._parse_full_body()
            return
        if self._events.strip():
            self._event(bytes(self._events), _perf())
            if self._done:
                return
        if not (self._done_event or res.finish_reason):
            self._finish(
                "incomplete", f"stream ended without [DONE] or finish_reason after {res.chunks} chunks"
            )
            return
        self._finish(None, None)

    def _parse_full_body(self) -> None:
        res = self._res
        assert res is not None
        t = _perf()
        try:
            obj = orjson.loads(res.body)
        except orjson.JSONDecodeError:
            self._finish("bad_response", f"undecodable JSON body: {res.body[:200]!r}")
            return
        choices = obj.get("choices") or [{}]
        c = choices[0]
        text = c.get("text")
        if text is None:
            text = (c.get("message") or {}).get("content") or ""
        res.text_parts.append(text)
        res.first_token_t = t
        res.chunks = 1 if text else 0
        res.finish_reason = c.get("finish_reason")
        usage = obj.get("usage") or {}
        res.prompt_tokens = usage.get("prompt_tokens")
        res.completion_tokens = usage.get("completion_tokens")
        self._finish(None, None)

    def _finish(self, kind: str | None, message: str | None) -> None:
        if self._done:
            return
        self._done = True
        res = self._res
        assert res is not None
        # a server-timed stream ends with its last token (the simulator sends the end with it)
        res.end_t = self._last_t if res.server_timed and kind is None else _perf()
        res.ok = kind is None
        res.error_kind = kind
        res.error_message = message
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if kind is not None or not self._keep_alive:
            self.close()
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _on_timeout(self) -> None:
        res = self._res
        self._finish(
            "timeout", f"no complete response within the timeout ({res.chunks if res else 0} chunks received)"
        )

    def _on_idle(self) -> None:
        """The inter-token idle timeout. Re-armed for the time left rather than reset on every read:
        one attribute store per read keeps the hot path as cheap as it was."""
        self._idle_timer = None
        if self._done or self._idle_s is None:
            return
        quiet = _perf() - self._last_rx
        if quiet < self._idle_s:
            self._idle_timer = asyncio.get_running_loop().call_later(self._idle_s - quiet, self._on_idle)
            return
        res = self._res
        self._finish(
            "stalled",
            f"the stream stalled: no data for {self._idle_s:g} s after "
            f"{res.chunks if res else 0} tokens (the inter-token idle timeout)",
        )

    # driving --------------------------------------------------------------------------------------
    def start(
        self,
        request: bytes,
        mode: str,
        timeout_s: float | None,
        keep_text: bool = True,
        idle_timeout_s: float | None = None,
        server_times: bool = False,
    ) -> asyncio.Future[None]:
        """Send `request`; `mode` is "stream" (SSE), "json" (one JSON body) or "raw" (keep the bytes).

        `timeout_s` bounds the whole response; `idle_timeout_s` bounds the silence after the first
        token, so a stalled stream gives its slot back long before the whole-request timeout;
        `server_times`: token times from the server's stamps (`servelab_t`) where it sends them."""
        loop = asyncio.get_running_loop()
        self._fut = loop.create_future()
        self._res = StreamResult()
        self._buf = bytearray()
        self._events = b""
        self._chunk_left = 0
        self._headers_done = False
        self._chunked = False
        self._body_left = None
        self._keep_alive = True
        self._done = False
        self._done_event = False
        self._got_bytes = False
        self._mode = mode
        self.keep_text = keep_text
        self._server_times = server_times
        self._stream = mode == "stream"
        self._body_parts = []
        self._last_t = 0.0
        self._last_rx = self._sent_t = _perf()
        self._idle_s = idle_timeout_s
        if timeout_s:
            self._timer = loop.call_later(timeout_s, self._on_timeout)
        assert self.transport is not None
        try:
            if self.transport.is_closing():
                raise ConnectionResetError("the transport was closed")
            self._sent_t = _perf()
            self.transport.write(request)
        except (OSError, RuntimeError) as exc:
            # The peer (or an ssh forward) went away before connection_lost reached us: uvloop raises
            # RuntimeError ("the handler is closed") on a write to a closed handle, asyncio OSError.
            self._finish("connection_closed", f"connection closed before the request was sent: {exc}")
        return self._fut

    @property
    def result(self) -> StreamResult:
        assert self._res is not None
        return self._res

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Client:
    """Keep-alive connection pool plus request building for one server."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout_s: float | None = 600.0,
        connect_timeout_s: float = 30.0,
        keep_text: bool = True,
        idle_timeout_s: float | None = None,
        server_token_times: bool = False,
    ) -> None:
        self.keep_text = keep_text  # the streamed text is only needed to count tokens with a tokenizer
        # time tokens by the server's own stamps where it sends them (`servelab sim`'s step clock)
        self.server_token_times = server_token_times
        self.server_timed = 0  # responses whose token times were the server's
        self.endpoint = Endpoint.parse(url)
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Conn] = []
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if self.endpoint.scheme == "https" else None
        )

    def build_request(self, path: str, body: JsonObject | bytes | None, method: str = "POST") -> bytes:
        """Serialize an HTTP/1.1 request once, so sending it later costs only a write."""
        payload = body if isinstance(body, bytes) else (orjson.dumps(body) if body is not None else b"")
        head = [
            f"{method} {self.endpoint.base_path}{path} HTTP/1.1",
            f"Host: {self.endpoint.host_header}",
            "User-Agent: servelab",
            "Accept: */*",
        ]
        if method == "POST":
            head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + payload

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, proto = await asyncio.wait_for(
            loop.create_connection(_Conn, self.endpoint.host, self.endpoint.port, ssl=self._ssl),
            self.connect_timeout_s,
        )
        return proto

    async def send(
        self, request: bytes, mode: str = "stream", timeout_s: float | None = None
    ) -> StreamResult:
        """Send a prebuilt request and wait for the whole response; never raises for server faults."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        for attempt in range(2):
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else None
            if conn is None or conn.closed:
                try:
                    conn = await self._connect()
                except (OSError, TimeoutError) as exc:
                    res = StreamResult(
                        end_t=_perf(),
                        error_kind="connect_error",
                        error_message=f"{type(exc).__name__}: {exc}",
                    )
                    return res
                reused = False
            try:
                await conn.start(
                    request, mode, timeout, self.keep_text, self.idle_timeout_s, self.server_token_times
                )
            except asyncio.CancelledError:
                conn.close()  # a level stopped early: the half-read stream must not go back to the pool
                raise
            res = conn.result
            # A pooled connection the server had already closed: retry once on a fresh one.
            if res.error_kind == "connection_closed" and reused and attempt == 0:
                continue
            if res.error_kind == "connection_closed":
                res.error_kind = "disconnected"
            if not conn.closed:
                self._idle.append(conn)
            self.server_timed += res.server_timed
            return res
        raise AssertionError("unreachable")

    async def get(self, path: str, timeout_s: float = 10.0) -> StreamResult:
        """A plain GET (models, metrics, health): status and raw `.body`; status 0 when unreachable."""
        return await self.send(self.build_request(path, None, method="GET"), mode="raw", timeout_s=timeout_s)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
