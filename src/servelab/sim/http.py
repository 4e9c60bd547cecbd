"""A minimal, fast HTTP/1.1 server on a raw asyncio Protocol (keep-alive, Content-Length bodies).

The simulator must never be the bottleneck of a benchmark, so there is no framework: requests are
parsed by hand, responses are pre-built bytes, and streamed chunks are written straight into the
transport by the scheduler (see `server.py`). One request at a time per connection (no pipelining
of generation requests, like the OpenAI clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
)


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    version: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    received: float = 0.0  # loop time its first bytes arrived (before any of our processing)


class HttpError(Exception):
    """An error answer: status, message (in the JSON error body unless `body` is given), headers."""

    def __init__(
        self, status: int, message: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body
        self.headers = headers


def error_body(status: int, message: str, kind: str | None = None) -> bytes:
    kind = kind or ("BadRequestError" if status < 500 else "InternalServerError")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})


def response_bytes(
    status: int,
    body: bytes,
    *,
    content_type: bytes = b"application/json",
    keep_alive: bool = True,
    extra_headers: dict[str, str] | None = None,
) -> bytes:
    head = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}".encode(),
        b"content-type: " + content_type,
        b"content-length: " + str(len(body)).encode(),
        b"connection: " + (b"keep-alive" if keep_alive else b"close"),
    ]
    for k, v in (extra_headers or {}).items():
        head.append(f"{k}: {v}".encode())
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def parse_request(buf: bytearray) -> Request | None:
    """One complete request from the front of `buf` (consumed), or None until more bytes arrive.

    Shared by the simulator and the tests' fault server: minimal HTTP/1.1 with Content-Length bodies.
    """
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEADER_BYTES:
            raise HttpError(431, "request headers too large")
        return None
    head = bytes(buf[:end]).decode("latin-1")
    lines = head.split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise HttpError(400, f"bad request line {lines[0]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpError(501, "chunked request bodies are not supported; send Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise HttpError(400, "bad Content-Length") from None
    if length > MAX_BODY_BYTES:
        raise HttpError(413, "request body too large")
    total = end + 4 + length
    if len(buf) < total:
        return None
    body = bytes(buf[end + 4 : total])
    del buf[:total]
    conn = headers.get("connection", "").lower()
    keep_alive = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    path, _, query = target.partition("?")
    return Request(method, path, query, version, headers, body, keep_alive)


# A handler returns True to keep the connection open afterwards.
Handler = Callable[["HttpProtocol", Request], Awaitable[bool]]


class HttpProtocol(asyncio.Protocol):
    """One client connection. `handler` answers each parsed request (a coroutine)."""

    __slots__ = (
        "_drain",
        "buf",
        "busy",
        "closed",
        "closed_fut",
        "connections",
        "handler",
        "loop",
        "received",
        "transport",
    )

    def __init__(self, handler: Handler, connections: set[HttpProtocol]) -> None:
        self.handler = handler
        self.connections = connections
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.received = 0.0
        self.busy = False
        self.closed = False
        self.closed_fut: asyncio.Future[None] = self.loop.create_future()
        self._drain: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.connections.discard(self)
        if not self.closed_fut.done():
            self.closed_fut.set_result(None)
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            # The loop's time is read once per iteration, before its callbacks: a burst of requests
            # is stamped when it arrived, not after the server worked through the ones before it.
            self.received = self.loop.time()
        self.buf += data
        if not self.busy:
            self._next_request()

    def eof_received(self) -> bool | None:
        return None

    # -- helpers -----------------------------------------------------------------------------
    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._drain is not None and not self._drain.done():
            await self._drain

    def send(self, status: int, body: bytes, *, keep_alive: bool = True, **kw: object) -> None:
        self.write(response_bytes(status, body, keep_alive=keep_alive, **kw))  # type: ignore[arg-type]
        if not keep_alive:
            self.close()

    def _parse(self) -> Request | None:
        return parse_request(self.buf)

    def _next_request(self) -> None:
        try:
            req = self._parse()
        except HttpError as e:
            self.send(e.status, error_body(e.status, e.message), keep_alive=False)
            return
        if req is None:
            return
        req.received = self.received
        if self.buf:  # the next request's bytes are already here (pipelining): they arrived now
            self.received = self.loop.time()
        self.busy = True
        self.loop.create_task(self._serve(req))

    async def _serve(self, req: Request) -> None:
        keep_alive = req.keep_alive
        try:
            keep_alive = await self.handler(self, req) and keep_alive
        except HttpError as e:
            self.send(
                e.status,
                e.body if e.body is not None else error_body(e.status, e.message),
                keep_alive=keep_alive,
                extra_headers=e.headers,
            )
        except Exception as e:  # a bug must not kill the server; report it as a 500
            self.send(500, error_body(500, f"server bug: {e!r}"), keep_alive=False)
            keep_alive = False
        finally:
            self.busy = False
        if not keep_alive:
            self.close()
            return
        if self.buf and not self.closed:
            self._next_request()


def raise_fd_limit() -> None:
    """1,024 streams need more than 1,024 file descriptors: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def chunk(event: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(event), event)
