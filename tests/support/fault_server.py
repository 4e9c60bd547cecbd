"""A fast, fault-injecting, OpenAI-compatible streaming server (stdlib + optional uvloop/orjson).

Why it exists:

* The benchmark client must be tested against failure modes that real engines
  produce only by accident (5xx, 429, hung requests, connections cut
  mid-stream, malformed SSE, dying processes, servers that reject vLLM-only
  params or omit usage). Each is selectable here and applied to a seeded
  fraction of requests, so tests are reproducible.
* It is also the "fast local streaming server" of the client-overhead
  benchmark: tokens are emitted on an exact, drift-free schedule (absolute
  deadlines), chunks are pre-templated bytes, and the HTTP/1.1 server is a
  hand-written asyncio Protocol (no framework), so the server costs a few
  microseconds per token and sustains >= 1,024 concurrent streams on one core
  (``--cpu N`` pins it).

Run::

    python tests/support/fault_server.py --port 8123 --token-interval-ms 20 \
        [--ttft-ms 50] [--fault http_500 --fault-rate 0.2] [--seed 0] [--cpu 0]

It prints ``READY http://HOST:PORT`` on stdout once listening (``--port 0``
picks a free port). From tests use :func:`fault_server` (subprocess by default,
or ``in_process=True`` for a thread in the test process).

Semantics (mirroring vLLM): prompt tokens = whitespace-split words (chat: the
words of all message contents; token-id prompts: their length). Output length
is ``max_tokens`` (``max_completion_tokens`` for chat; default
``--default-max-tokens``) unless ``--natural-len N`` simulates an EOS after N
tokens, which ``ignore_eos`` disables and ``min_tokens`` postpones. Token i is
sent at ``admit + ttft + i * interval``. With ``stream_options.include_usage``
a final chunk carries ``usage`` and empty ``choices``, then ``data: [DONE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.sim.http import HttpError, Request, raise_fd_limit
from servelab.sim.http import HttpProtocol as SimHttpProtocol
from servelab.sim.text import WORDS
from servelab.sim.wire import DONE_EVENT, MALFORMED_EVENT, SseTemplates, completion_body

try:  # orjson is ~5x faster for the (rare) request parsing; stdlib json is enough.
    import orjson

    def _loads(data: bytes) -> Any:
        return orjson.loads(data)

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - exercised only without orjson

    def _loads(data: bytes) -> Any:
        return json.loads(data)

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


FAULT_KINDS = (
    "http_500",
    "http_429",
    "timeout",
    "drop_mid_stream",
    "malformed_sse",
    "die",
    "reject_extra_params",
    "no_usage",
    "short_output",
)
EXTRA_PARAMS = ("ignore_eos", "min_tokens", "stream_options")  # what transformers serve rejects


@dataclass
class Options:
    """Server behaviour; field names match the CLI flags (dashes -> underscores)."""

    host: str = "127.0.0.1"
    port: int = 0
    model: str = "fault-model"
    token_interval_ms: float = 20.0
    ttft_ms: float = 0.0
    default_max_tokens: int = 16
    natural_len: int | None = None
    faults: list[str] = field(default_factory=list)
    fault_rate: float = 1.0
    seed: int = 0
    die_after: int = 5
    drop_after_chunks: int = 3
    malformed_after_chunks: int = 2
    short_output_tokens: int = 2
    max_num_seqs: int = 0  # 0 = unlimited; beyond it requests wait (vllm:num_requests_waiting)
    kv_capacity_tokens: int = 1_000_000  # denominator of vllm:kv_cache_usage_perc
    close_delimited: bool = False  # SSE without chunked encoding, ended by closing the connection
    cpu: int | None = None

    def validate(self) -> None:
        bad = [f for f in self.faults if f not in FAULT_KINDS]
        if bad:
            raise ValueError(f"unknown fault kind(s) {bad}; choose from {', '.join(FAULT_KINDS)}")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")
        if self.token_interval_ms < 0 or self.ttft_ms < 0:
            raise ValueError("token_interval_ms and ttft_ms must be >= 0")


class Metrics:
    """Real counters behind /metrics, named like vLLM's so scrapers can be tested against it."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_tokens = 0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.preemptions = 0  # never preempts; kept so the series exists like in vLLM
        self.requests_total = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}

    def render(self, model: str, kv_capacity: int) -> bytes:
        lbl = f'{{engine="0",model_name="{model}"}}'
        kv = min(1.0, self.kv_tokens / kv_capacity) if kv_capacity else 0.0
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{lbl} {float(self.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{lbl} {float(self.waiting)}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{lbl} {kv}",
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{lbl} {float(self.preemptions)}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{lbl} {float(self.prompt_tokens)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{lbl} {float(self.generation_tokens)}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
        ]
        for reason, n in self.success.items():
            lines.append(
                f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="{model}"}} {float(n)}'
            )
        return ("\n".join(lines) + "\n").encode()


def _count_words(text: Any) -> int:
    if isinstance(text, str):
        return len(text.split())
    if isinstance(text, list):  # chat content parts
        return sum(len(p.get("text", "").split()) for p in text if isinstance(p, dict))
    return 0


class FaultServer:
    """The server state shared by all connections: options, seeded fault RNG, metrics."""

    def __init__(self, opts: Options, *, on_die: Callable[[], None] | None = None) -> None:
        opts.validate()
        self.opts = opts
        self.metrics = Metrics()
        self.rng = random.Random(opts.seed)
        self.request_counter = 0
        self.on_die = on_die or (lambda: os._exit(1))
        self.connections: set[HttpProtocol] = set()
        self.server: asyncio.AbstractServer | None = None
        self._slots: asyncio.Semaphore | None = None
        self.created = int(time.time())
        self.model_json = _dumps(opts.model)  # quoted + escaped, spliced into chunk templates

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        if self.opts.max_num_seqs > 0:
            self._slots = asyncio.Semaphore(self.opts.max_num_seqs)
        self.server = await loop.create_server(
            lambda: HttpProtocol(self), self.opts.host, self.opts.port, backlog=4096, reuse_address=True
        )
        return self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.abort()

    def pick_fault(self) -> str | None:
        """One seeded draw per generation request, in arrival order."""
        faults = [f for f in self.opts.faults if f != "die"]
        if not faults:
            return None
        if self.rng.random() >= self.opts.fault_rate:
            return None
        return faults[0] if len(faults) == 1 else self.rng.choice(faults)

    @contextlib.asynccontextmanager
    async def slot(self) -> Any:
        """Admission control: requests beyond --max-num-seqs wait (counted as waiting)."""
        if self._slots is None:
            yield
            return
        self.metrics.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.metrics.waiting -= 1
        try:
            yield
        finally:
            self._slots.release()


class HttpProtocol(SimHttpProtocol):
    """The fault server's routes on the simulator's HTTP/1.1 protocol (keep-alive, Content-Length
    bodies, one request at a time per connection)."""

    def __init__(self, srv: FaultServer) -> None:
        super().__init__(HttpProtocol.srv_dispatch, srv.connections)  # type: ignore[arg-type]
        self.srv = srv

    # -- routing ----------------------------------------------------------------------
    async def srv_dispatch(self, req: Request) -> bool:
        """Handle one request; returns False when the connection must be closed afterwards."""
        srv = self.srv
        path = req.path
        if path in ("/v1/completions", "/v1/chat/completions"):
            if req.method != "POST":
                raise HttpError(405, "use POST")
            return await self.generate(req, chat=path == "/v1/chat/completions")
        if req.method != "GET":
            raise HttpError(405 if path in ("/health", "/v1/models", "/metrics") else 404, "not found")
        if path == "/health":
            self.send(200, b"", keep_alive=req.keep_alive)
        elif path == "/v1/models":
            body = _dumps(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": srv.opts.model,
                            "object": "model",
                            "created": srv.created,
                            "owned_by": "servelab-fault-server",
                            "root": srv.opts.model,
                            "parent": None,
                            "max_model_len": 1_000_000,
                        }
                    ],
                }
            )
            self.send(200, body, keep_alive=req.keep_alive)
        elif path == "/metrics":
            body = srv.metrics.render(srv.opts.model, srv.opts.kv_capacity_tokens)
            self.send(
                200, body, content_type=b"text/plain; version=0.0.4; charset=utf-8", keep_alive=req.keep_alive
            )
        else:
            raise HttpError(404, f"no route {path}")
        return True

    async def generate(self, req: Request, *, chat: bool) -> bool:
        srv, opts, m = self.srv, self.srv.opts, self.srv.metrics
        srv.request_counter += 1
        n_req = srv.request_counter
        m.requests_total += 1
        if "die" in opts.faults and n_req > opts.die_after:
            srv.on_die()
            return False
        try:
            payload = _loads(req.body) if req.body else {}
        except ValueError:
            raise HttpError(400, "request body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise HttpError(400, "request body must be a JSON object")
        fault = srv.pick_fault()

        if fault == "reject_extra_params":
            present = sorted(k for k in EXTRA_PARAMS if k in payload)
            if present:
                detail = "Unexpected fields in the request: {" + ", ".join(repr(k) for k in present) + "}"
                raise HttpError(422, detail, body=_dumps({"detail": detail}))
        if fault == "http_500":
            raise HttpError(500, "injected fault: http_500")
        if fault == "http_429":
            raise HttpError(429, "injected fault: http_429 (rate limited)", headers={"retry-after": "1"})
        if fault == "timeout":
            await self.closed_fut  # accepted, never answered; ends when the client gives up
            return False

        if chat:
            messages = payload.get("messages")
            if not isinstance(messages, list) or not messages:
                raise HttpError(400, "messages must be a non-empty list")
            prompt_tokens = sum(_count_words(msg.get("content")) for msg in messages if isinstance(msg, dict))
            max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
        else:
            prompt = payload.get("prompt")
            if isinstance(prompt, str):
                prompt_tokens = len(prompt.split())
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_tokens = len(prompt)
            elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt_tokens = len(prompt[0].split())
            else:
                raise HttpError(400, "prompt must be a string, a list of token ids, or a 1-element list")
            max_tokens = payload.get("max_tokens")
        if max_tokens is None:
            max_tokens = opts.default_max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise HttpError(400, "max_tokens must be a positive integer")
        min_tokens = payload.get("min_tokens") or 0
        ignore_eos = bool(payload.get("ignore_eos", False))
        n_out, finish = max_tokens, "length"
        if opts.natural_len is not None and not ignore_eos:
            natural = max(opts.natural_len, min(min_tokens, max_tokens))
            if natural < max_tokens:
                n_out, finish = natural, "stop"
        if fault == "short_output":
            n_out, finish = max(1, min(opts.short_output_tokens, max_tokens)), "stop"
        stream = bool(payload.get("stream", False))
        stream_opts = payload.get("stream_options") or {}
        include_usage = bool(stream_opts.get("include_usage")) and fault != "no_usage"

        async with srv.slot():
            m.running += 1
            m.prompt_tokens += prompt_tokens
            m.kv_tokens += prompt_tokens
            emitted = 0
            try:
                if stream:
                    emitted = await self.stream(
                        n_req, chat, prompt_tokens, n_out, finish, include_usage, fault, req.version
                    )
                    return not opts.close_delimited and req.version == "HTTP/1.1" and not self.closed
                emitted = await self.wait_tokens(n_out)
                if fault == "drop_mid_stream":
                    self.abort()
                    return False
                body = self.full_body(n_req, chat, prompt_tokens, n_out, finish, fault != "no_usage")
                m.success[finish] += 1
                self.send(200, body, keep_alive=req.keep_alive)
                return True
            finally:
                m.running -= 1
                m.kv_tokens -= prompt_tokens + emitted

    async def wait_tokens(self, n_out: int) -> int:
        """Non-streaming: same schedule as streaming, answer after the last token."""
        opts, m = self.srv.opts, self.srv.metrics
        deadline = self.loop.time() + (opts.ttft_ms + (n_out - 1) * opts.token_interval_ms) / 1000
        delay = deadline - self.loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        m.generation_tokens += n_out
        m.kv_tokens += n_out
        return n_out

    def full_body(
        self, n_req: int, chat: bool, prompt_tokens: int, n_out: int, finish: str, with_usage: bool
    ) -> bytes:
        text = b"".join(WORDS[(n_req + i) % len(WORDS)] for i in range(n_out)).decode()
        return completion_body(
            n_req, chat, self.srv.opts.model, text, finish, prompt_tokens, n_out, with_usage=with_usage
        )

    async def stream(
        self,
        n_req: int,
        chat: bool,
        prompt_tokens: int,
        n_out: int,
        finish: str,
        include_usage: bool,
        fault: str | None,
        version: str,
    ) -> int:
        """Send SSE chunks on an absolute schedule; returns the number of tokens emitted."""
        opts, m = self.srv.opts, self.srv.metrics
        loop = self.loop
        chunked = not opts.close_delimited and version == "HTTP/1.1"
        self.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
            + (
                b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
                if chunked
                else b"connection: close\r\n\r\n"
            )
        )

        def frame(event: bytes) -> bytes:
            return b"%x\r\n%s\r\n" % (len(event), event) if chunked else event

        tpl = SseTemplates(n_req, chat, self.srv.model_json)

        interval = opts.token_interval_ms / 1000
        start = loop.time() + opts.ttft_ms / 1000
        drop_at = opts.drop_after_chunks if fault == "drop_mid_stream" else -1
        bad_at = opts.malformed_after_chunks if fault == "malformed_sse" else -1
        nwords = len(WORDS)
        emitted = 0
        for i in range(n_out):
            delay = start + i * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif interval == 0 and i:
                await asyncio.sleep(0)  # as fast as possible, but let other streams run
            if self.closed:
                m.success["abort"] += 1
                return emitted
            if i == drop_at:
                self.abort()  # no terminating chunk: the client sees a truncated body
                return emitted
            out = frame(tpl.token(WORDS[(n_req + i) % nwords]))
            if i == 0 and tpl.first:
                out = frame(tpl.first) + out
            if i == bad_at:
                out = frame(MALFORMED_EVENT) + out
            self.write(out)
            emitted += 1
            m.generation_tokens += 1
            m.kv_tokens += 1
            if self._drain is not None:
                await self.drain()
        tail = frame(tpl.finish(finish))
        if include_usage:
            tail += frame(tpl.usage(prompt_tokens, emitted))
        tail += frame(DONE_EVENT)
        if chunked:
            tail += b"0\r\n\r\n"
        self.write(tail)
        m.success[finish] += 1
        if not chunked and self.transport is not None:
            self.transport.close()
        return emitted


# -- running it ---------------------------------------------------------------------------


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def serve_forever(opts: Options) -> None:
    """CLI entry: listen, print READY, run until SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if opts.cpu is not None:
        os.sched_setaffinity(0, {opts.cpu})
    raise_fd_limit()
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    srv = FaultServer(opts)
    port = loop.run_until_complete(srv.start())
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    print(f"READY http://{opts.host}:{port}", flush=True)
    try:
        loop.run_until_complete(stop)
    finally:
        srv.close()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


@dataclass
class FaultServerHandle:
    url: str
    port: int
    opts: Options
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    server: FaultServer | None = None  # in-process only: direct access to metrics etc.


def _cli_args(opts: Options) -> list[str]:
    args: list[str] = []
    for name, value in vars(opts).items():
        flag = "--" + name.replace("_", "-")
        if name == "faults":
            for f in value:
                args += ["--fault", f]
        elif isinstance(value, bool):
            if value:
                args.append(flag)
        elif value is not None:
            args += [flag, str(value)]
    return args


@contextlib.contextmanager
def fault_server(
    *, in_process: bool = False, log_dir: Path | None = None, python: str | None = None, **kwargs: Any
) -> Iterator[FaultServerHandle]:
    """Start a fault server for a test; ``kwargs`` are :class:`Options` fields.

    Subprocess by default (isolated timing, a real ``die``, ``--cpu`` pinning);
    ``in_process=True`` runs it on a thread (fast start, direct metrics access;
    ``die`` then closes the listener and all connections instead of exiting).
    """
    if "fault" in kwargs:  # convenience: fault="http_500"
        f = kwargs.pop("fault")
        kwargs["faults"] = [f] if isinstance(f, str) else list(f)
    opts = Options(**kwargs)
    opts.validate()
    if in_process:
        yield from _in_process(opts)
    else:
        yield from _subprocess(opts, log_dir, python or sys.executable)


def _in_process(opts: Options) -> Iterator[FaultServerHandle]:
    loop = _new_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def die() -> None:
        srv.close()

    srv = FaultServer(opts, on_die=die)

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            holder["port"] = loop.run_until_complete(srv.start())
        except BaseException as e:
            holder["error"] = e
            ready.set()
            return
        ready.set()
        loop.run_forever()
        srv.close()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()

    thread = threading.Thread(target=run, name="fault-server", daemon=True)
    thread.start()
    ready.wait(10)
    if "error" in holder:
        raise holder["error"]
    port = holder["port"]
    try:
        yield FaultServerHandle(url=f"http://{opts.host}:{port}", port=port, opts=opts, server=srv)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _subprocess(
    opts: Options, log_dir: Path | None, python: str, startup_timeout: float = 30.0
) -> Iterator[FaultServerHandle]:
    log_dir = log_dir or Path(
        os.environ.get("SERVELAB_TEST_LOGS", Path(__file__).resolve().parents[2] / ".cache" / "logs")
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"fault-server-{os.getpid()}-{time.monotonic_ns()}.log"
    cmd = [python, str(Path(__file__).resolve()), *_cli_args(opts)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = ""
        if select.select([proc.stdout], [], [], startup_timeout)[0]:
            line = proc.stdout.readline().decode().strip()  # READY line, or EOF if it crashed
        if not line.startswith("READY "):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
            raise RuntimeError(
                f"fault server failed to start (rc={proc.returncode}): {log_path.read_text()[-2000:]}"
            )
        url = line.split(" ", 1)[1]
        yield FaultServerHandle(
            url=url, port=int(url.rsplit(":", 1)[1]), opts=opts, proc=proc, log_path=log_path
        )
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description="Fast fault-injecting OpenAI-compatible streaming server.")
    d = Options()
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port, help="0 = pick a free port (printed in READY line)")
    p.add_argument("--model", default=d.model, help="served model name")
    p.add_argument(
        "--token-interval-ms", type=float, default=d.token_interval_ms, help="0 = as fast as possible"
    )
    p.add_argument("--ttft-ms", type=float, default=d.ttft_ms, help="delay before the first token")
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    p.add_argument(
        "--natural-len", type=int, default=None, help="simulate EOS after N tokens (unless ignore_eos)"
    )
    p.add_argument("--fault", dest="faults", action="append", default=[], choices=FAULT_KINDS)
    p.add_argument("--fault-rate", type=float, default=d.fault_rate, help="fraction of requests faulted")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--die-after", type=int, default=d.die_after, help="die: exit when request N+1 arrives")
    p.add_argument("--drop-after-chunks", type=int, default=d.drop_after_chunks)
    p.add_argument("--malformed-after-chunks", type=int, default=d.malformed_after_chunks)
    p.add_argument("--short-output-tokens", type=int, default=d.short_output_tokens)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="0 = unlimited")
    p.add_argument("--kv-capacity-tokens", type=int, default=d.kv_capacity_tokens)
    p.add_argument(
        "--close-delimited", action="store_true", help="SSE ended by connection close, not chunked"
    )
    p.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU core")
    ns = p.parse_args(argv)
    opts = Options(**vars(ns))
    opts.validate()
    return opts


if __name__ == "__main__":
    serve_forever(parse_args())
