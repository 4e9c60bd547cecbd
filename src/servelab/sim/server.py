"""`servelab sim`: an OpenAI-compatible server that behaves like vLLM or SGLang on simulated GPUs.

One asyncio task runs the scheduler's step clock (`scheduler.py`); HTTP is a hand-written protocol
(`http.py`); tokens are written straight into each stream's transport from pre-built byte templates.
This module keeps the clock and generation and imports none of its other parts: routes are in
`routes.py`, telemetry in `telemetry.py`, the start-up log and fault lines in `startup.py`; they see
the server through `state.SimState`, and `app.py` wires them onto it (`compose`, `run`). What the
engine looks like (defaults, log lines, routes, names) is its personality (`personalities.toml`,
parsed by `personalities.py`). Start-up phases take their (model) time divided by --speed, and
readiness follows the engine: vLLM opens its port only when ready; SGLang answers /health with 503
until "The server is fired up and ready to roll!".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from servelab.model.memory import plan_memory
from servelab.sim.engine_args import SimEffective
from servelab.sim.faults import Fault
from servelab.sim.http import (
    SSE_HEAD,
    Handler,
    HttpError,
    HttpProtocol,
    Request,
    chunk,
    error_body,
    response_bytes,
)
from servelab.sim.personalities import Personality
from servelab.sim.prefix import PrefixCache, block_hashes, output_tokens, prompt_tokens
from servelab.sim.render import Logger
from servelab.sim.scheduler import LengthSampler, Limits, Scheduler, SimRequest, Timing, Work
from servelab.sim.state import SimConfig as SimConfig  # re-exported: its home was here
from servelab.sim.text import GARBAGE_WORD, greedy_tokens, prompt_text
from servelab.sim.wire import DONE_EVENT, MALFORMED_EVENT, SseTemplates, completion_body

MIB = 1024 * 1024
GIB = 1024**3
EARLY = 0.0005  # event-loop timers fire up to ~1 ms late (millisecond resolution): aim half of that early
_GARBAGE = GARBAGE_WORD.encode()


def effective(cfg: SimConfig) -> SimEffective:
    """The engine's effective settings (defaults filled in the way each engine fills them:
    personalities.toml [defaults])."""
    s, a = cfg.setup, cfg.engine
    d = cfg.resolved_persona().defaults
    gpu_gb = s.host.gpu.memory_gb
    model_fraction = d.mem_fraction if d.mem_fraction is not None else s.mem_fraction
    return SimEffective(
        max_running=a.max_num_seqs or int(d.max_running.pick(gpu_gb)),
        max_batched_tokens=a.max_batched_tokens or int(d.max_batched_tokens.pick(gpu_gb)),
        mem_fraction=a.mem_fraction or model_fraction,
        max_model_len=a.max_model_len or cfg.resolved_persona().max_model_len(s.arch.context)[0],
        quantization=a.quantization,
        attention_backend="nsa" if s.arch.index_topk else "flashinfer",
    )


def allreduce_collapse(cfg: SimConfig) -> bool:
    """The "allreduce fusion" flag on PCIe Blackwell: the fused kernel falls back to a slow path."""
    s = cfg.setup
    return cfg.engine.allreduce_fusion and s.layout.tp > 1 and s.host.interconnect.is_pcie


_CLOSE = b"}\n\n"  # how every SSE template event ends: the chunk object's brace, the blank line


class StreamSink:
    """Writes SSE chunks for one streaming request straight into its transport.

    A token normally leaves when its step completes. Two leave off the step grid, at model time
    `t_end + req.lag`: the first (due at its TTFT law, between steps) and the last, which keeps the
    first one's lag so that (last − first) spans whole steps (TPOT unbiased, as on a real engine).
    Such a token waits in `pending`, with the end of the stream when it is the last.

    Each token event also carries `servelab_t`: its due time on the step clock less the request's
    arrival, in wall seconds (÷ speed). `bench --token-clock server` times tokens by it, so a stall
    of either process (a busy box, a collection) never enters a simulated latency ×speed; other
    clients ignore the unknown field."""

    __slots__ = (
        "closing",
        "done",
        "drop_at",
        "first",
        "garbage",
        "include_usage",
        "malformed_at",
        "pending",
        "post",
        "pre",
        "proto",
        "srv",
        "stall_at",
        "tpl",
        "words",
    )

    def __init__(
        self,
        srv: SimServer,
        proto: HttpProtocol,
        rid: int,
        chat: bool,
        include_usage: bool,
        fault: Fault | None,
        words: list[bytes],
    ) -> None:
        self.srv = srv
        self.proto = proto
        self.words = words  # the request's reference tokens (sim/text.py), computed once
        self.tpl = SseTemplates(rid, chat, srv.model_json)
        # the per-token hot path, inlined below: each event's closing brace goes after its stamp
        self.pre, self.post = self.tpl.pre, self.tpl.post[: -len(_CLOSE)]
        self.first = self.tpl.first[: -len(_CLOSE)] if self.tpl.first else b""
        self.done: asyncio.Future[None] = srv.loop.create_future()
        self.include_usage = include_usage
        self.pending: bytes | None = None
        self.closing = False  # the pending bytes end the stream
        name, n = (fault.name, fault.n) if fault is not None else ("", -1)
        self.stall_at = n if name == "stall_stream" else -1
        self.drop_at = n if name == "drop_stream" else -1
        self.malformed_at = n if name == "malformed_sse" else -1
        self.garbage = name == "garbage"

    def token(self, req: SimRequest) -> None:
        i = req.generated - 1
        if i == self.stall_at or (self.stall_at >= 0 and i > self.stall_at):
            return
        if i == self.drop_at:
            self.proto.abort()
            return
        srv = self.srv
        if i == 0:
            due = req.first_token_time if req.first_token_time is not None else srv.sched.t_end
        else:
            due = srv.sched.t_end + (req.lag if req.generated >= req.max_out else 0.0)
        stamp = b',"servelab_t":%.6f}\n\n' % ((due - req.arrival) / srv.cfg.speed)
        ev = self.pre + (_GARBAGE if self.garbage else self.words[i]) + self.post + stamp
        data = b"%x\r\n%s\r\n" % (len(ev), ev)  # = chunk(self.tpl.token(word)), without two calls
        if i == 0 and self.first:
            data = chunk(self.first + stamp) + data
        if i == self.malformed_at:
            data = chunk(MALFORMED_EVENT) + data
        if self.pending is not None:
            self.flush()
        if req.lag > 0 and (i == 0 or req.generated >= req.max_out):
            self.pending = data  # leaves at its due time, between steps
            srv.loop.call_at(srv.wall(srv.sched.t_end + req.lag) - EARLY, self.flush)
            return
        self.proto.write(data)

    def flush(self) -> None:
        if self.pending is not None:
            self.proto.write(self.pending)
            self.pending = None
        if self.closing:
            self.closing = False
            self._resolve()

    def finish(self, req: SimRequest, reason: str) -> None:
        if self.stall_at >= 0 and req.generated > self.stall_at:
            return  # stalled: never finishes; the client times out
        if reason == "abort":
            self.flush()
            self._resolve()
            return
        tail = chunk(self.tpl.finish(reason))
        if self.include_usage:
            tail += chunk(self.tpl.usage(req.prompt, req.generated))
        tail += chunk(DONE_EVENT) + b"0\r\n\r\n"
        if self.pending is not None:  # the last token waits for its time: the end goes with it
            self.pending += tail
            self.closing = True
            return
        self.proto.write(tail)
        self._resolve()

    def fail(self, message: str) -> None:
        """The engine died: an error event, [DONE], end of stream (vLLM's streaming error path)."""
        self.closing = False
        self.flush()
        err = orjson.dumps(
            {
                "error": {
                    "object": "error",
                    "message": message,
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }
        )
        self.proto.write(chunk(b"data: " + err + b"\n\n") + chunk(DONE_EVENT) + b"0\r\n\r\n")
        self._resolve()

    def _resolve(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class BufferSink:
    """A non-streaming request: count tokens, answer with one JSON body when the last token is due
    (its step's end plus the first token's lag, as for a stream)."""

    __slots__ = ("chat", "done", "fault", "keep_alive", "proto", "srv", "words")

    def __init__(
        self,
        srv: SimServer,
        proto: HttpProtocol,
        chat: bool,
        keep_alive: bool,
        fault: Fault | None,
        words: list[bytes],
    ) -> None:
        self.srv = srv
        self.words = words
        self.proto = proto
        self.chat = chat
        self.keep_alive = keep_alive
        self.fault = fault
        self.done: asyncio.Future[None] = srv.loop.create_future()

    def token(self, req: SimRequest) -> None:
        pass

    def finish(self, req: SimRequest, reason: str) -> None:
        name = self.fault.name if self.fault is not None else ""
        if reason == "abort":
            self._resolve()
        elif name == "stall_stream":
            return
        elif req.lag > 0:
            when = self.srv.wall(self.srv.sched.t_end + req.lag) - EARLY
            self.srv.loop.call_at(when, self._answer, req, reason, name)
        else:
            self._answer(req, reason, name)

    def _answer(self, req: SimRequest, reason: str, fault: str) -> None:
        if fault == "drop_stream":
            self.proto.abort()
        else:
            n = req.generated
            text = GARBAGE_WORD * n if fault == "garbage" else b"".join(self.words[:n]).decode()
            body = completion_body(req.rid, self.chat, self.srv.served, text, reason, req.prompt, n)
            self.proto.write(response_bytes(200, body, keep_alive=self.keep_alive))
        self._resolve()

    def fail(self, message: str) -> None:
        self.proto.write(
            response_bytes(500, error_body(500, message, "InternalServerError"), keep_alive=False)
        )
        self._resolve()

    def _resolve(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class SimServer:
    def __init__(self, cfg: SimConfig, log_stream: Any = None) -> None:
        self.cfg = cfg
        self.persona: Personality = cfg.resolved_persona()
        self.eff = effective(cfg)
        s = cfg.setup
        self.mem = plan_memory(s.arch, s.quant, s.host, s.layout, self.eff.mem_fraction)
        self.collapse = allreduce_collapse(cfg)
        self.timing = Timing(s, self.mem, slowdown=8.0 if self.collapse else 1.0)
        self.kv_tokens = max(self.mem.kv_cache_tokens, 0) * s.layout.dp
        self.limits = Limits(
            kv_tokens=self.kv_tokens,
            max_running=self.eff.max_running,
            prefill_budget=self.eff.max_batched_tokens,
            ttft_overhead_s=s.factors.ttft_overhead_ms * 1e-3,
        )
        self.sched = Scheduler(self.timing, self.limits)
        if cfg.engine.prefix_caching:  # --no-enable-prefix-caching / --disable-radix-cache turn it off
            self.sched.prefix = PrefixCache(self.sched.total_blocks, self.limits.block_size)
        self.request_log: Any = open(cfg.request_log, "a", buffering=1) if cfg.request_log else None  # noqa: SIM115
        self.sampler = LengthSampler(cfg.seed, cfg.eos_mean)
        self.fault_rng = random.Random(cfg.seed + 1)
        self.log = Logger(self.persona, s.layout.tp, log_stream)
        self.served = cfg.engine.served_model_name
        self.model_json = orjson.dumps(self.served)
        self.ready = False
        self.dead = False
        self.exit_code = 0
        self.request_count = 0
        self.connections: set[HttpProtocol] = set()
        self.inflight: set[Any] = set()
        self.server: asyncio.AbstractServer | None = None
        self.sock: socket.socket | None = None
        self.created = int(time.time())
        self.gpu_mem_mib = [0.0] * max(cfg.box_gpus, s.host.num_gpus)
        self.util_samples: deque[tuple[float, Work]] = deque(maxlen=64)
        self.orphan: subprocess.Popen[bytes] | None = None
        self.wake = asyncio.Event()
        self.stop_fut: asyncio.Future[None] | None = None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop_policy().get_event_loop()
        self.t0 = 0.0
        self.finished = 0
        self._last_log = 0.0
        self._last_gen = 0
        self.gen_throughput = 0.0
        # The parts, wired on by app.compose (this module imports none of them): the router's handler
        # (routes.py), the start-up (startup.py) and the engine-dead lines (startup.py).
        self.handler: Handler | None = None
        self.start_up: Callable[[], Awaitable[int]] | None = None
        self.dead_lines: Callable[[], list[str]] = list

    # -- clocks -------------------------------------------------------------------------------------
    def model_now(self) -> float:
        return (self.loop.time() - self.t0) * self.cfg.speed

    def wall(self, t_model: float) -> float:
        return self.t0 + t_model / self.cfg.speed

    def kick(self) -> None:
        self.wake.set()

    # -- start-up (sim/startup.py, wired on by sim/app.py) --------------------------------------------
    async def startup(self) -> int:
        """Print the engine's start-up, phase by phase; returns non-zero when start-up crashes."""
        if self.start_up is None:
            raise RuntimeError("the simulated server has no start-up: build it with sim.app.compose")
        return await self.start_up()

    def reuse_port(self) -> bool:
        """vLLM sets SO_REUSEPORT on its API socket (unconditionally through 0.11, the version this
        personality reports; later releases when --api-server-count > 1), so a second vLLM on a busy
        port binds without an error and the kernel splits connections between the two. SGLang serves
        through uvicorn, which sets SO_REUSEADDR only: a second server there fails to bind
        (personalities.toml `reuse_port`)."""
        return self.persona.reuse_port

    def reserve(self) -> None:
        """Bind the listening socket (not yet accepting), the way the engine does."""
        host = self.cfg.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port():
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, self.cfg.port))
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.sock = sock
        self.cfg.port = sock.getsockname()[1]
        print(f"SIM-PORT {self.cfg.port}", file=sys.stderr, flush=True)

    async def listen(self) -> None:
        """Start accepting connections on the reserved socket."""
        if self.sock is None:
            self.reserve()
        sock = self.sock
        if sock is None:  # reserve() binds it or raises
            raise OSError("the listening socket was not bound")
        handler = self.handler
        if handler is None:
            raise RuntimeError("the simulated server has no router: build it with sim.app.compose")
        self.server = await self.loop.create_server(
            lambda: HttpProtocol(handler, self.connections), sock=sock, backlog=4096
        )

    # -- the step clock -----------------------------------------------------------------------------
    async def clock(self) -> None:
        loop, sched, speed = self.loop, self.sched, self.cfg.speed
        now_m = self.model_now()
        while True:
            step = sched.plan(now_m)
            if step is None:
                nxt = sched.next_wakeup()
                self.wake.clear()
                timeout = None if nxt is None else max(0.0, (nxt - self.model_now()) / speed)
                woke = False
                with contextlib.suppress(TimeoutError):
                    woke = await asyncio.wait_for(
                        self.wake.wait(), None if timeout is None else timeout - EARLY
                    )
                # A timer that fires late must not shift the model timeline; nor does the time the
                # simulator spent parsing a request that woke it (it arrived when its bytes did).
                if woke or nxt is None:
                    first = sched.earliest_arrival()
                    now_m = max(now_m, self.model_now() if first is None else min(self.model_now(), first))
                else:
                    now_m = max(nxt, now_m)
                continue
            t_end = step.start + step.dt
            delay = self.t0 + t_end / speed - loop.time() - EARLY
            await asyncio.sleep(delay if delay > 0 else 0)
            sched.complete(step)
            now_m = t_end
            if now_m - self._last_log >= 5.0:
                self._periodic(now_m)

    def _periodic(self, now_m: float) -> None:
        c = self.sched.counters
        dt = now_m - self._last_log
        self.gen_throughput = (c.generation_tokens - self._last_gen) / dt if dt > 0 else 0.0
        self._last_log, self._last_gen = now_m, c.generation_tokens
        self.util_samples.append((now_m, c.work))
        who, _, text = self.persona.periodic
        sched = self.sched
        self.log.emit(
            who,
            text.format(
                gen_throughput=self.gen_throughput,
                running=sched.num_running,
                waiting=sched.num_waiting,
                kv_usage=sched.kv_usage,
                kv_usage_pct=sched.kv_usage * 100,
                kv_tokens_used=sched.kv_tokens_used,
            ),
        )

    # -- HTTP (routes in sim/routes.py) ---------------------------------------------------------------
    def metric_values(self) -> dict[str, float]:
        s, c = self.sched, self.sched.counters
        pc = s.prefix
        return {
            "prefix_cache_queries": pc.queries if pc else 0,
            "prefix_cache_hits": pc.hits if pc else 0,
            "cache_hit_rate": pc.hit_rate if pc else 0.0,
            "running": s.num_running,
            "waiting": s.num_waiting,
            "kv_usage": s.kv_usage,
            "kv_tokens_used": s.kv_tokens_used,
            "preemptions": c.preemptions,
            "prompt_tokens": c.prompt_tokens,
            "generation_tokens": c.generation_tokens,
            "gen_throughput": self.gen_throughput,
            "finished": c.success["stop"] + c.success["length"] + c.success["abort"],
            "success_stop": c.success["stop"],
            "success_length": c.success["length"],
            "success_abort": c.success["abort"],
            "ttft_sum": c.ttft_s,
            "ttft_count": c.timed,
            "itl_sum": c.itl_s,
            "itl_count": c.itl_n,
            "e2e_sum": c.e2e_s,
            "e2e_count": c.timed,
        }

    def _prompt_tokens(self, payload: Mapping[str, object], chat: bool) -> int:
        if chat:
            msgs = payload.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise HttpError(400, "messages must be a non-empty list")
            n = 0
            for m in msgs:
                if not isinstance(m, dict):
                    raise HttpError(400, "each message must be an object with a role and a content")
                content = m.get("content")
                if isinstance(content, str):
                    n += len(content.split())
                elif isinstance(content, list):
                    n += sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
            return n
        prompt = payload.get("prompt")
        if isinstance(prompt, str):
            return max(len(prompt.split()), 1)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return max(len(prompt[0].split()), 1)
        raise HttpError(400, "prompt must be a string, a list of token ids, or a 1-element list of strings")

    def _log_request(
        self, path: str, source: Any, prompt: int, max_tokens: int, n_out: int, hashes: list[bytes]
    ) -> None:
        """One line of --request-log: what arrived, as the simulator counts and hashes it."""
        text = prompt_text(source)
        line = {
            "time": time.time(),
            "model_time_s": self.model_now(),
            "endpoint": path,
            "prompt_tokens": prompt,
            "max_tokens": max_tokens,
            "output_tokens": n_out,
            "prompt_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "block_size": self.limits.block_size,
            "block_hashes": [h.hex() for h in hashes],
            "prompt": text,
        }
        self.request_log.write(orjson.dumps(line).decode() + "\n")

    def die(self) -> None:
        """The engine core dies (fault die_after_ready)."""
        if self.dead:
            return
        self.dead = True
        self.log.raw(self.dead_lines(), stream=sys.stderr)
        if not self.persona.dead_message:
            # The engine kills its own process tree (SGLang): nothing answers, every connection drops.
            self.exit_code = self.persona.engine_dead.exit_code or 1
            for req in list(self.sched.running.values()) + list(self.sched.waiting):
                self.sched.abort(req)
            self.close()
            self.stop()
            return
        for req in list(self.sched.running.values()) + list(self.sched.waiting):
            self.sched.abort(req)
            fail = getattr(req.sink, "fail", None)
            if fail is not None:
                fail(self.persona.dead_message)
        if self.persona.engine_dead.exit_code:
            self.exit_code = self.persona.engine_dead.exit_code
            self.loop.call_later(0.05, self.stop)

    async def generate(self, proto: HttpProtocol, req: Request, chat: bool) -> bool:
        if not self.ready:
            raise HttpError(503, "The server is not ready yet")
        self.request_count += 1
        die = self.cfg.faults.get("die_after_ready")
        if die is not None and self.request_count > die.n:
            self.die()
        if self.dead and not self.persona.dead_message:
            proto.abort()
            return False
        if self.dead:
            msg = self.persona.dead_message
            raise HttpError(500, msg, body=error_body(500, msg, "InternalServerError"))
        try:
            payload = orjson.loads(req.body) if req.body else {}
        except orjson.JSONDecodeError:
            raise HttpError(400, "request body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise HttpError(400, "request body must be a JSON object")
        prompt = self._prompt_tokens(payload, chat)
        max_model_len = self.eff.max_model_len
        max_tokens = payload.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = payload.get("max_tokens")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise HttpError(400, f"max_tokens must be at least 1, got {max_tokens!r}.")
        # the engine's own words for a request longer than its context (personalities.toml [refusals])
        refused = self.persona.refusals.refusal(max_model_len, prompt, max_tokens or 0)
        if refused is not None:
            raise HttpError(400, refused)
        if max_tokens is None:
            max_tokens = (max_model_len - prompt) if chat else 16
        min_tokens = payload.get("min_tokens") or 0
        ignore_eos = bool(payload.get("ignore_eos", False))
        n_out, reason = self.sampler.draw(max_tokens, int(min_tokens), ignore_eos)
        fault = None
        for name in ("stall_stream", "drop_stream", "malformed_sse", "garbage"):
            if name in self.cfg.faults and self.fault_rng.random() < self.cfg.fault_rate:
                fault = self.cfg.faults[name]
                break
        stream = bool(payload.get("stream", False))
        rid = self.request_count
        # Greedy decoding of fixed weights: the answer depends on the model and the prompt only.
        words = greedy_tokens(self.served, payload["messages"] if chat else payload["prompt"], n_out)
        sink: StreamSink | BufferSink
        if stream:
            include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            sink = StreamSink(self, proto, rid, chat, include_usage, fault, words)
            proto.write(SSE_HEAD)
        else:
            sink = BufferSink(self, proto, chat, req.keep_alive, fault, words)
        sreq = SimRequest(rid, prompt, n_out, reason, sink)
        source = payload["messages"] if chat else payload["prompt"]
        if self.sched.prefix is not None or self.request_log is not None:
            tokens = prompt_tokens(source, chat)
            full = block_hashes(tokens + output_tokens(words, chat), self.limits.block_size)
            sreq.hashes = full[: len(tokens) // self.limits.block_size]
            sreq.full_hashes = full
            if self.request_log is not None:
                self._log_request(req.path, source, prompt, max_tokens, n_out, sreq.hashes)
        # Arrived when its bytes did: the simulator's own work on a burst is no GPU time.
        now = self.model_now()
        self.sched.add(
            sreq, min(now, max((req.received - self.t0) * self.cfg.speed, 0.0)) if req.received else now
        )
        self.kick()
        await asyncio.wait((sink.done, proto.closed_fut), return_when=asyncio.FIRST_COMPLETED)
        if not sink.done.done():  # the client went away (or we cut it)
            self.sched.abort(sreq)
            return False
        return not self.dead

    # -- run ----------------------------------------------------------------------------------------
    async def main(self) -> int:
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.stop_fut = self.loop.create_future()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.stop)
        start = self.loop.create_task(self.startup())
        done, _ = await asyncio.wait((start, self.stop_fut), return_when=asyncio.FIRST_COMPLETED)
        if start not in done:
            start.cancel()
            self.close()
            return 0
        rc = start.result()
        if rc:
            self.close()
            return rc
        self.t0 = self.loop.time()  # model time 0 = ready
        self.util_samples.clear()
        self.util_samples.append((0.0, Work()))
        clock = self.loop.create_task(self.clock())
        await self.stop_fut
        clock.cancel()
        if not self.dead:
            for line in self.persona.shutdown:
                self.log.emit("raw", line)
        self.close()
        return self.exit_code

    def stop(self) -> None:
        """Stop serving (SIGTERM / SIGINT, or the engine exiting)."""
        if self.stop_fut is not None and not self.stop_fut.done():
            self.stop_fut.set_result(None)

    def close(self) -> None:
        if self.request_log is not None:
            self.request_log.close()
            self.request_log = None
        if self.server is not None:
            self.server.close()
        elif self.sock is not None:
            self.sock.close()
        for conn in list(self.connections):
            conn.abort()
