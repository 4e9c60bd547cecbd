"""`servelab sim`: an OpenAI-compatible server that behaves like vLLM or SGLang on simulated GPUs.

One asyncio task runs the scheduler's step clock (`scheduler.py`); HTTP is a hand-written protocol
(`http.py`); tokens are written straight into each stream's transport from pre-built byte templates.
Start-up prints the engine's log (`personalities.py`), phases take their (model) time divided by
--speed, and readiness follows the engine: vLLM opens its port only when ready; SGLang answers
/health with 503 until "The server is fired up and ready to roll!".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from servelab.model.memory import GB, plan_memory
from servelab.model.predict import Setup
from servelab.sim.faults import Fault
from servelab.sim.http import (
    SSE_HEAD,
    HttpError,
    HttpProtocol,
    Request,
    chunk,
    error_body,
    raise_fd_limit,
    response_bytes,
)
from servelab.sim.personalities import (
    EngineArgs,
    Logger,
    fault_signatures,
    power_table,
    render_metrics,
    sglang_server_args,
    templates,
    vllm_engine_config,
)
from servelab.sim.scheduler import LengthSampler, Limits, Scheduler, SimRequest, Timing
from servelab.sim.text import GARBAGE_WORD, greedy_tokens
from servelab.sim.wire import DONE_EVENT, MALFORMED_EVENT, SseTemplates, completion_body

MIB = 1024 * 1024
GIB = 1024**3
EARLY = 0.0005  # event-loop timers fire up to ~1 ms late (millisecond resolution): aim half of that early
_GARBAGE = GARBAGE_WORD.encode()
ENGINE_DEAD_MSG = "EngineCore encountered an issue. See stack trace (above) for the root cause."


@dataclass
class SimConfig:
    setup: Setup
    engine: EngineArgs
    engine_warnings: list[str] = field(default_factory=list)
    model_name: str = ""  # as asked (catalog name or path), for the logs
    speed: float = 1.0
    seed: int = 0
    faults: dict[str, Fault] = field(default_factory=dict)
    fault_rate: float = 1.0
    fast_start: bool = False
    eos_mean: float = 256.0
    host: str = "127.0.0.1"
    port: int = 8000
    box_gpus: int = 0  # GPUs in the simulated box (default: the ones the layout uses)

    @property
    def personality(self) -> str:
        return self.engine.personality


def effective(cfg: SimConfig) -> dict[str, Any]:
    """The engine's effective settings (defaults filled in the way each engine fills them)."""
    s, a = cfg.setup, cfg.engine
    big = s.host.gpu.memory_gb >= 70
    if a.personality == "vllm":
        max_running = a.max_num_seqs or (1024 if big else 256)
        batched = a.max_batched_tokens or (8192 if big else 2048)
        mem_fraction = a.mem_fraction or 0.9
    else:
        max_running = a.max_num_seqs or 4096
        batched = a.max_batched_tokens or (16384 if s.host.gpu.memory_gb >= 120 else 8192)
        mem_fraction = a.mem_fraction or s.mem_fraction
    return {
        "max_running": max_running,
        "max_batched_tokens": batched,
        "mem_fraction": mem_fraction,
        "max_model_len": a.max_model_len or 32768,
        "quantization": a.quantization,
        "attention_backend": "nsa" if s.arch.index_topk else "flashinfer",
    }


def allreduce_collapse(cfg: SimConfig) -> bool:
    """The "allreduce fusion" flag on PCIe Blackwell: the fused kernel falls back to a slow path."""
    s = cfg.setup
    return cfg.engine.allreduce_fusion and s.layout.tp > 1 and s.host.interconnect.is_pcie


class StreamSink:
    """Writes SSE chunks for one streaming request straight into its transport.

    A token normally leaves when its step completes. Two leave off the step grid, at model time
    `t_end + req.lag`: the first (due at its TTFT law, between steps) and the last, which keeps the
    first one's lag so that (last − first) spans whole steps (TPOT unbiased, as on a real engine).
    Such a token waits in `pending`, with the end of the stream when it is the last."""

    __slots__ = (
        "closing",
        "done",
        "drop_at",
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
        self.pre, self.post = self.tpl.pre, self.tpl.post  # the per-token hot path, inlined below
        self.done: asyncio.Future[None] = srv.loop.create_future()
        self.include_usage = include_usage
        self.pending: bytes | None = None
        self.closing = False  # the pending bytes end the stream
        name = fault.name if fault else ""
        self.stall_at = fault.n if name == "stall_stream" else -1
        self.drop_at = fault.n if name == "drop_stream" else -1
        self.malformed_at = fault.n if name == "malformed_sse" else -1
        self.garbage = name == "garbage"

    def token(self, req: SimRequest) -> None:
        i = req.generated - 1
        if i == self.stall_at or (self.stall_at >= 0 and i > self.stall_at):
            return
        if i == self.drop_at:
            self.proto.abort()
            return
        ev = self.pre + (_GARBAGE if self.garbage else self.words[i]) + self.post
        data = b"%x\r\n%s\r\n" % (len(ev), ev)  # = chunk(self.tpl.token(word)), without two calls
        if i == 0 and self.tpl.first:
            data = chunk(self.tpl.first) + data
        if i == self.malformed_at:
            data = chunk(MALFORMED_EVENT) + data
        if self.pending is not None:
            self.flush()
        if req.lag > 0 and (i == 0 or req.generated >= req.max_out):
            self.pending = data  # leaves at its due time, between steps
            srv = self.srv
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
        self.eff = effective(cfg)
        s = cfg.setup
        self.mem = plan_memory(s.arch, s.quant, s.host, s.layout, self.eff["mem_fraction"])
        self.collapse = allreduce_collapse(cfg)
        self.timing = Timing(s, self.mem, slowdown=8.0 if self.collapse else 1.0)
        self.kv_tokens = max(self.mem.kv_cache_tokens, 0) * s.layout.dp
        self.limits = Limits(
            kv_tokens=self.kv_tokens,
            max_running=self.eff["max_running"],
            prefill_budget=self.eff["max_batched_tokens"],
            ttft_overhead_s=s.factors.ttft_overhead_ms * 1e-3,
        )
        self.sched = Scheduler(self.timing, self.limits)
        self.sampler = LengthSampler(cfg.seed, cfg.eos_mean)
        self.fault_rng = random.Random(cfg.seed + 1)
        self.log = Logger(cfg.personality, s.layout.tp, log_stream)
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
        self.util_samples: deque[tuple[float, float]] = deque(maxlen=64)
        self.orphan: subprocess.Popen[bytes] | None = None
        self.wake = asyncio.Event()
        self.stop_fut: asyncio.Future[None] | None = None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop_policy().get_event_loop()
        self.t0 = 0.0
        self.finished = 0
        self._last_log = 0.0
        self._last_gen = 0
        self.gen_throughput = 0.0

    # -- clocks -------------------------------------------------------------------------------------
    def model_now(self) -> float:
        return (self.loop.time() - self.t0) * self.cfg.speed

    def wall(self, t_model: float) -> float:
        return self.t0 + t_model / self.cfg.speed

    def kick(self) -> None:
        self.wake.set()

    # -- start-up -----------------------------------------------------------------------------------
    def _ctx(self) -> dict[str, Any]:
        cfg, s, a, eff, mem = self.cfg, self.cfg.setup, self.cfg.engine, self.eff, self.mem
        weights_gb = mem.weights / GB
        kv_gb = max(mem.kv_cache, 0) / GB
        total_gb = s.host.gpu.memory_gb
        maxc = self.kv_tokens / eff["max_model_len"] if eff["max_model_len"] else 0
        if s.arch.kv_elems_per_token and s.arch.num_kv_heads and s.arch.attention_kind != "mla":
            kv_sizes = f"K size: {kv_gb / 2:.2f} GB, V size: {kv_gb / 2:.2f} GB"
        else:
            kv_sizes = f"KV size: {kv_gb:.2f} GB"
        d = self.delays()
        non_default = dict(a.non_default)
        return {
            "version": templates()[cfg.personality]["version"],
            "non_default": repr(non_default),
            "architecture": _arch_class(s.arch.model_type),
            "max_model_len": eff["max_model_len"],
            "max_model_len_fmt": f"{eff['max_model_len']:,}",
            "max_batched_tokens": eff["max_batched_tokens"],
            "max_running": eff["max_running"],
            "engine_config": vllm_engine_config(a, eff),
            "server_args": sglang_server_args(a, eff),
            "world": s.layout.tp * s.layout.pp * s.layout.dp,
            "model": a.model,
            "load_s": d["load"],
            "load_s2": d["load"] + 0.4,
            "weights_gib": mem.weights / GIB,
            "weights_gb": weights_gb,
            "compile_s": d["compile"],
            "kv_gib": max(mem.kv_cache, 0) / GIB,
            "kv_tokens": self.kv_tokens,
            "kv_tokens_fmt": f"{self.kv_tokens:,}",
            "max_conc": maxc,
            "graph_s": d["graph"],
            "graph_gib": 0.53,
            "graph_gb": 0.57,
            "init_s": d["compile"] + d["kv"] + d["graph"] + 3.0,
            "host": cfg.host,
            "port": cfg.port,
            "pid": os.getpid(),
            "avail_gb": total_gb * 0.985,
            "avail_after_gb": total_gb * 0.985 - weights_gb,
            "avail_pool_gb": total_gb * 0.985 - weights_gb - kv_gb,
            "avail_final_gb": total_gb * 0.985 - weights_gb - kv_gb - 0.57,
            "kv_sizes": kv_sizes,
        }

    def delays(self) -> dict[str, float]:
        s, a = self.cfg.setup, self.cfg.engine
        load = 4.0 + self.mem.weights / GB / 2.5  # per-GPU shard from local NVMe, ~2.5 GB/s
        graph = 12.0 if a.cuda_graph else 0.0
        if "slow_start" in self.cfg.faults:
            graph += float(self.cfg.faults["slow_start"].arg or 0)
        return {
            "0": 0.0,
            "engine": 2.0 + 0.5 * (s.layout.tp * s.layout.pp - 1),
            "load": load,
            "compile": 25.0 if (a.personality == "vllm" and a.cuda_graph) else 0.0,
            "kv": 2.0,
            "graph": graph,
            "warmup": 1.5,
        }

    async def _sleep_model(self, seconds: float) -> None:
        if seconds > 0 and not self.cfg.fast_start:
            await asyncio.sleep(seconds / self.cfg.speed)

    def _crash(self, name: str) -> int:
        sig = fault_signatures()[name]
        lines = sig.get(f"{self.cfg.personality}_lines") or sig["lines"]
        gpu = self.cfg.setup.host.gpu
        values = {
            "pid": os.getpid(),
            "port": self.cfg.port,
            "host": self.cfg.host,
            "rank": 0,
            "tp": self.cfg.setup.layout.tp,
            "gpu": gpu.name,
            "gib": max(self.mem.weights / GIB, 1.0),
            "total_gib": gpu.memory_gb * GB / GIB,
            "free_gib": 0.31,
            "date": f"{Logger.vdate()}",
            "sdate": Logger.sdate(),
        }
        self.log.raw([ln.format(**values) for ln in lines])
        return int(sig.get("exit", 1))

    async def startup(self) -> int:
        """Print the engine's start-up, phase by phase; returns non-zero when start-up crashes."""
        cfg, faults = self.cfg, self.cfg.faults
        if "cuda_init" in faults:
            return self._crash("cuda_init")
        ctx = self._ctx()
        delays = self.delays()
        lines = templates()[cfg.personality]["lines"]
        has_listen = any(text == "@listen" for _, _, text in lines)
        extra = float(faults["slow_start"].arg or 0) if "slow_start" in faults else 0.0
        for who, key, text in lines:
            await self._sleep_model(delays.get(key, 0.0))
            if key == "graph" and extra > 0 and cfg.fast_start:
                await asyncio.sleep(extra / cfg.speed)  # an injected fault outlives --fast-start
            if key == "kv":
                self._set_memory(self.mem.weights + self.mem.activations + max(self.mem.kv_cache, 0))
            elif key == "graph":
                self._set_memory(
                    self.mem.weights + self.mem.activations + max(self.mem.kv_cache, 0) + 0.57 * GB
                )
            if text == "@bind":
                if "port_in_use" in faults:
                    return self._crash("port_in_use")
                try:
                    self.reserve()
                    if not has_listen:
                        await self.listen()
                except OSError:
                    return self._crash("port_in_use")
                ctx["port"] = self.cfg.port
                continue
            if text == "@listen":
                await self.listen()
                continue
            if text == "@engine":
                for name in ("worker_init", "nccl_shm"):
                    if name in faults:
                        return self._crash(name)
                if "orphan" in faults:
                    self.spawn_orphan()
                continue
            if text == "@weights":
                self._set_memory(self.mem.weights + 0.5 * GB)
                if "oom_init" in faults or self.mem.kv_cache <= 0 or self.mem.kv_cache_tokens <= 0:
                    return self._crash("oom_init")
                if (
                    cfg.personality == "sglang"
                    and cfg.setup.arch.index_topk
                    and cfg.engine.prefix_caching
                    and cfg.setup.host.gpu.sm == 120
                ):
                    return self._crash("nsa_radix")
                continue
            if text == "@ready":
                self.ready = True
                continue
            if cfg.personality == "sglang" and text.startswith("server_args="):
                for w in cfg.engine_warnings:
                    self.log.emit("main", w, level="WARNING")
            self.log.emit(who, text.format(**ctx))
        return 0

    def _set_memory(self, per_gpu_bytes: float) -> None:
        used = self.cfg.setup.layout.tp * self.cfg.setup.layout.pp * self.cfg.setup.layout.dp
        cap = self.cfg.setup.host.gpu.memory_gb * GB
        for i in range(len(self.gpu_mem_mib)):
            self.gpu_mem_mib[i] = min(per_gpu_bytes, cap) / MIB if i < used else 0.0

    def spawn_orphan(self) -> None:
        name = "VLLM::EngineCore" if self.cfg.personality == "vllm" else "sglang::scheduler_TP0"
        code = "import time\nwhile True:\n    time.sleep(3600)\n"
        self.orphan = subprocess.Popen(
            [sys.executable, "-c", code, name],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.log.emit(
            "engine" if self.cfg.personality == "vllm" else "main",
            f"Started engine core process {name} pid={self.orphan.pid}",
        )

    def reuse_port(self) -> bool:
        """vLLM sets SO_REUSEPORT on its API socket (unconditionally through 0.11, the version this
        personality reports; later releases when --api-server-count > 1), so a second vLLM on a busy
        port binds without an error and the kernel splits connections between the two. SGLang serves
        through uvicorn, which sets SO_REUSEADDR only: a second server there fails to bind."""
        return self.cfg.personality == "vllm"

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
        self.server = await self.loop.create_server(
            lambda: HttpProtocol(self.handle, self.connections), sock=self.sock, backlog=4096
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
                # A timer that fires late must not shift the model timeline.
                now_m = max(self.model_now(), now_m) if woke or nxt is None else max(nxt, now_m)
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
        self.util_samples.append((now_m, c.busy_s))
        if self.cfg.personality == "vllm":
            self.log.emit(
                "api",
                f"Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
                f"{self.gen_throughput:.1f} tokens/s, Running: {self.sched.num_running} reqs, Waiting: "
                f"{self.sched.num_waiting} reqs, GPU KV cache usage: {self.sched.kv_usage * 100:.1f}%, "
                f"Prefix cache hit rate: 0.0%",
                src="loggers.py:123",
            )
        else:
            self.log.emit(
                "rank0",
                f"Decode batch. #running-req: {self.sched.num_running}, #token: {self.sched.kv_tokens_used}, "
                f"token usage: {self.sched.kv_usage:.2f}, cuda graph: True, gen throughput (token/s): "
                f"{self.gen_throughput:.2f}, #queue-req: {self.sched.num_waiting}, ",
            )

    # -- HTTP ---------------------------------------------------------------------------------------
    async def handle(self, proto: HttpProtocol, req: Request) -> bool:
        if "hang" in self.cfg.faults:
            await proto.closed_fut
            return False
        path, personality = req.path, self.cfg.personality
        if path in ("/v1/completions", "/v1/chat/completions"):
            if req.method != "POST":
                raise HttpError(405, "Method Not Allowed")
            return await self.generate(proto, req, chat=path == "/v1/chat/completions")
        if path == "/health":
            ok = self.ready and not self.dead
            proto.send(
                200 if ok else 503, b"" if ok else b'{"detail":"not ready"}', keep_alive=req.keep_alive
            )
            return True
        if path == "/servelab/gpus":
            proto.send(200, orjson.dumps(self.gpus()), keep_alive=req.keep_alive)
            return True
        if path == "/servelab/state":
            proto.send(200, orjson.dumps(self.state()), keep_alive=req.keep_alive)
            return True
        if path == "/metrics":
            body = render_metrics(personality, self.served, self.metric_values())
            proto.send(
                200, body, keep_alive=req.keep_alive, content_type=b"text/plain; version=0.0.4; charset=utf-8"
            )
            return True
        if path == "/v1/models":
            proto.send(
                200,
                orjson.dumps(
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": self.served,
                                "object": "model",
                                "created": self.created,
                                "owned_by": "vllm" if personality == "vllm" else "sglang",
                                "root": self.cfg.engine.model,
                                "parent": None,
                                "max_model_len": self.eff["max_model_len"],
                            }
                        ],
                    }
                ),
                keep_alive=req.keep_alive,
            )
            return True
        if path == "/version" and personality == "vllm":
            proto.send(
                200, orjson.dumps({"version": templates()["vllm"]["version"]}), keep_alive=req.keep_alive
            )
            return True
        if path in ("/get_server_info", "/server_info") and personality == "sglang":
            proto.send(200, orjson.dumps(self.server_info()), keep_alive=req.keep_alive)
            return True
        if path == "/get_model_info" and personality == "sglang":
            proto.send(
                200,
                orjson.dumps(
                    {
                        "model_path": self.cfg.engine.model,
                        "tokenizer_path": self.cfg.engine.model,
                        "is_generation": True,
                    }
                ),
                keep_alive=req.keep_alive,
            )
            return True
        raise HttpError(404, "Not Found")

    def server_info(self) -> dict[str, Any]:
        a = self.cfg.engine
        info = {k: v for k, v in a.raw.items()}
        info.update(
            {
                "model_path": a.model,
                "served_model_name": a.served_model_name,
                "host": self.cfg.host,
                "port": self.cfg.port,
                "tp_size": a.tp,
                "pp_size": a.pp,
                "dp_size": a.dp,
                "ep_size": a.ep,
                "moe_runner_backend": a.moe_runner_backend,
                "disable_radix_cache": not a.prefix_caching,
                "mem_fraction_static": self.eff["mem_fraction"],
                "chunked_prefill_size": self.eff["max_batched_tokens"],
                "max_running_requests": self.eff["max_running"],
                "enable_flashinfer_allreduce_fusion": a.allreduce_fusion,
                "max_total_num_tokens": self.kv_tokens,
                "version": templates()["sglang"]["version"],
                "internal_states": [
                    {"last_gen_throughput": self.gen_throughput, "avg_spec_accept_length": None}
                ],
            }
        )
        return info

    def metric_values(self) -> dict[str, float]:
        s, c = self.sched, self.sched.counters
        return {
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
        }

    def state(self) -> dict[str, Any]:
        c = self.sched.counters
        return {
            "ready": self.ready,
            "dead": self.dead,
            "personality": self.cfg.personality,
            "model_time_s": self.model_now(),
            "speed": self.cfg.speed,
            "steps": c.steps,
            "busy_s": c.busy_s,
            "preemptions": c.preemptions,
            "requests": c.requests,
            "running": self.sched.num_running,
            "waiting": self.sched.num_waiting,
            "kv_cache_tokens": self.kv_tokens,
            "kv_usage": self.sched.kv_usage,
            "allreduce_collapse": self.collapse,
            "effective": {
                **self.eff,
                "tp": self.cfg.setup.layout.tp,
                "pp": self.cfg.setup.layout.pp,
                "dp": self.cfg.setup.layout.dp,
                "ep": self.cfg.setup.layout.ep,
                "moe_runner_backend": self.cfg.engine.moe_runner_backend,
            },
        }

    def utilization(self) -> float:
        now = self.model_now()
        busy = self.sched.counters.busy_s
        self.util_samples.append((now, busy))
        for t, b in self.util_samples:
            if now - t <= 10.0 and now - t >= 0.5:
                return max(0.0, min(1.0, (busy - b) / (now - t)))
        return 0.0

    def gpus(self) -> dict[str, Any]:
        """nvidia-smi-like telemetry of the simulated GPUs."""
        s = self.cfg.setup
        table = power_table()
        pw = {**table["default"], **table.get(s.host.gpu.name, {})}
        util = self.utilization() if self.ready else 0.0
        used = s.layout.tp * s.layout.pp * s.layout.dp
        active = pw["collapse"] if self.collapse else pw["active"]
        pid = os.getpid()
        out = []
        for i, mib in enumerate(self.gpu_mem_mib):
            busy = util if i < used else 0.0
            if self.cfg.personality == "vllm":
                proc_name = f"VLLM::Worker_TP{i}" if s.layout.tp > 1 else "VLLM::EngineCore"
            else:
                proc_name = f"sglang::scheduler_TP{i}"
            out.append(
                {
                    "index": i,
                    "name": s.host.gpu.description.split(",")[0],
                    "uuid": f"GPU-sim-{i:02d}",
                    "memory_used_mib": round(mib),
                    "memory_total_mib": round(s.host.gpu.memory_gb * GB / MIB),
                    "power_w": round(pw["idle"] + (active - pw["idle"]) * busy, 1),
                    "power_limit_w": pw["limit"],
                    "utilization_pct": round(busy * 100),
                    "temperature_c": round(35 + 40 * busy),
                    "processes": [{"pid": pid, "name": proc_name, "used_memory_mib": round(mib)}]
                    if mib > 0
                    else [],
                }
            )
        return {"simulated": True, "driver_version": "580.95.05", "cuda_version": "13.0", "gpus": out}

    def _prompt_tokens(self, payload: dict[str, Any], chat: bool) -> int:
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

    def die(self) -> None:
        """The engine core dies (fault die_after_ready)."""
        if self.dead:
            return
        self.dead = True
        sig = fault_signatures()["engine_dead"]
        if self.cfg.personality == "vllm":
            prefix = f"(EngineCore_DP0 pid={self.log.engine_pid}) "
            self.log.raw([prefix + ln.format(date=Logger.vdate()) for ln in sig["lines"]], stream=sys.stderr)
        else:
            self.log.raw([ln.format(sdate=Logger.sdate()) for ln in sig["sglang_lines"]])
        for req in list(self.sched.running.values()) + list(self.sched.waiting):
            self.sched.abort(req)
            fail = getattr(req.sink, "fail", None)
            if fail is not None:
                fail(ENGINE_DEAD_MSG)
        if self.cfg.personality == "sglang":
            self.exit_code = 1
            if self.stop_fut is not None and not self.stop_fut.done():
                self.loop.call_later(0.05, lambda: self.stop_fut.done() or self.stop_fut.set_result(None))  # type: ignore[union-attr]

    async def generate(self, proto: HttpProtocol, req: Request, chat: bool) -> bool:
        if not self.ready:
            raise HttpError(503, "The server is not ready yet")
        self.request_count += 1
        die = self.cfg.faults.get("die_after_ready")
        if die is not None and self.request_count > die.n:
            self.die()
        if self.dead:
            raise HttpError(
                500, ENGINE_DEAD_MSG, body=error_body(500, ENGINE_DEAD_MSG, "InternalServerError")
            )
        try:
            payload = orjson.loads(req.body) if req.body else {}
        except orjson.JSONDecodeError:
            raise HttpError(400, "request body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise HttpError(400, "request body must be a JSON object")
        prompt = self._prompt_tokens(payload, chat)
        max_model_len = self.eff["max_model_len"]
        max_tokens = payload.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = payload.get("max_tokens")
        if max_tokens is None:
            max_tokens = (max_model_len - prompt) if chat else 16
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise HttpError(400, f"max_tokens must be at least 1, got {max_tokens!r}.")
        if prompt + max_tokens > max_model_len:
            raise HttpError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} "
                f"in the completion). Please reduce the length of the messages or completion.",
            )
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
            self.loop.add_signal_handler(sig, lambda: self.stop_fut.done() or self.stop_fut.set_result(None))  # type: ignore[union-attr]
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
        self.util_samples.append((0.0, 0.0))
        clock = self.loop.create_task(self.clock())
        await self.stop_fut
        clock.cancel()
        if self.cfg.personality == "vllm" and not self.dead:
            self.log.emit("raw", "INFO:     Shutting down")
            self.log.emit("raw", "INFO:     Application shutdown complete.")
        self.close()
        return self.exit_code

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        elif self.sock is not None:
            self.sock.close()
        for conn in list(self.connections):
            conn.abort()


def _arch_class(model_type: str) -> str:
    known = {
        "qwen3": "Qwen3ForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
        "llama": "LlamaForCausalLM",
        "deepseek_v3": "DeepseekV3ForCausalLM",
        "glm_moe_dsa": "GlmMoeDsaForCausalLM",
        "mixtral": "MixtralForCausalLM",
        "kimi_k2": "DeepseekV3ForCausalLM",
        "gpt_oss": "GptOssForCausalLM",
        "minimax_m2": "MiniMaxM2ForCausalLM",
        "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    }
    return known.get(model_type, "".join(p.capitalize() for p in model_type.split("_")) + "ForCausalLM")


def run(cfg: SimConfig, cpu: int | None = None) -> int:
    """Blocking entry point of `servelab sim`: serve until SIGTERM/SIGINT; returns the exit code."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    raise_fd_limit()
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        srv = SimServer(cfg)
        return loop.run_until_complete(srv.main())
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.sleep(0))
        loop.close()
