"""The simulator's continuous-batching scheduler: one shared step clock, pure logic, model time.

Every step the scheduler (1) makes room in the KV cache for the decode batch's next token, preempting
the newest request (recompute) when it runs out, (2) admits waiting requests while the KV cache and
the running-request limit allow, (3) picks prefill chunks up to the per-step token budget, and
(4) prices the step with the performance model (`servelab.model.step`): a decode step for the current
batch (its size and context lengths) plus each prefill chunk's marginal cost, so a busier server is
slower for everyone. When the step's time has passed, `complete()` emits one token to every decoding
request.

Times are model seconds; the async runner in `server.py` maps them to wall time (divided by --speed).
The TTFT a request sees follows the same law as `servelab predict` (docs/model.md): the front-end
overhead, its prefill, the queue behind the prefills of the requests running with it and one decode
step; the first token leaves at the step boundary nearest that time, never before its prefill ran.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from servelab.model.memory import MemoryPlan, plan_memory
from servelab.model.predict import Setup, Workload, latencies, make_terms
from servelab.model.step import DecodeBatch, StepBreakdown, build_perf, step_time
from servelab.sim.prefix import PrefixCache

WAITING, PREFILL, HOLD, DECODE, DONE = range(5)


class Sink(Protocol):
    """Where a request's tokens go (an SSE stream, a buffered response, a test list)."""

    def token(self, req: SimRequest) -> None: ...

    def finish(self, req: SimRequest, reason: str) -> None: ...


class ListSink:
    """A sink that records (time, event) pairs; for tests and tools."""

    def __init__(self) -> None:
        self.tokens = 0
        self.reason: str | None = None

    def token(self, req: SimRequest) -> None:
        self.tokens += 1

    def finish(self, req: SimRequest, reason: str) -> None:
        self.reason = reason


class SimRequest:
    __slots__ = (
        "arrival",
        "base",
        "blocks",
        "cached",
        "ctx",
        "done_prefill",
        "first_at",
        "first_token_time",
        "full_hashes",
        "generated",
        "hashes",
        "lag",
        "law_n",
        "max_out",
        "need",
        "prompt",
        "ready_at",
        "reason",
        "rid",
        "sink",
        "state",
        "token_times",
    )

    def __init__(self, rid: int, prompt: int, max_out: int, reason: str, sink: Sink) -> None:
        self.rid = rid
        self.prompt = prompt
        self.max_out = max_out  # tokens it will produce (EOS already drawn)
        self.reason = reason  # finish reason when it gets there: "length" or "stop"
        self.sink = sink
        self.state = WAITING
        self.arrival = 0.0
        self.ready_at = 0.0
        self.need = prompt  # tokens to prefill (prompt, or prompt + generated after a preemption)
        self.done_prefill = 0
        self.ctx = 0  # tokens in the KV cache
        self.generated = 0
        self.blocks = 0
        self.first_at: float | None = None  # target time of the first token
        self.base = 0.0  # when its TTFT law starts (ready, or admitted after being held back)
        self.law_n = 0  # the load its TTFT law was last evaluated for
        self.first_token_time: float | None = None
        self.lag = 0.0  # first token's offset after its step's end; the last token keeps it too
        self.token_times: list[float] | None = None  # filled only when recording (tests)
        self.cached = 0  # prompt tokens the prefix cache held on arrival (not prefilled)
        self.hashes: list[bytes] = []  # block hashes of the prompt (sim/prefix.py), when caching
        self.full_hashes: list[bytes] = []  # ... of prompt + reply, cached when it finishes


class Timing:
    """Step prices and per-request laws from the performance model, cached where arguments repeat.

    The decode step is priced from `step_time()` for the current batch every step. The two effects of
    prefills on a closed loop (the queue a new request waits in, and the stall the running requests
    suffer) follow `predict`'s own law (`latencies()`), evaluated for the engine's load (see
    `Scheduler.load`), so the simulator tracks the model as it is recalibrated."""

    def __init__(self, setup: Setup, mem: MemoryPlan | None = None, slowdown: float = 1.0) -> None:
        self.setup = setup
        self.f = setup.factors
        self.perf = build_perf(setup.arch, setup.quant, setup.host, setup.layout, setup.factors)
        self.mem = mem or plan_memory(setup.arch, setup.quant, setup.host, setup.layout, setup.mem_fraction)
        self.pp = setup.layout.pp
        self.dp = setup.layout.dp
        self.slowdown = slowdown  # e.g. the allreduce-fusion collapse
        self.overhead_s = self.f.ttft_overhead_ms * 1e-3
        self.prefill_alone = lru_cache(maxsize=4096)(self._prefill_alone)
        self.laws = lru_cache(maxsize=65536)(self._laws)

    def _prefill_alone(self, tokens: int, context: int = 0) -> tuple[float, Work]:
        """A step of one prefill chunk alone: its time, and that time by what bounds it (`Work`)."""
        b = step_time(self.perf, (), prefill_tokens=tokens, prefill_context=context)
        return b.total * self.slowdown, Work.of(b, self.slowdown)

    def _laws(self, isl: int, osl: int, running: int) -> tuple[float, float]:
        """(TTFT after the front-end overhead, decode stall per token) for a request of isl/osl tokens
        admitted with `running` requests (itself included) in the engine."""
        wl = Workload(max(isl, 1), max(osl, 1), max(running, 1))
        terms = make_terms(self.perf, self.mem, wl)
        dec, tpot, ttft = (float(x) for x in latencies(terms, self.f))
        return (max(ttft - self.overhead_s, 0.0) * self.slowdown, max(tpot - dec, 0.0) * self.slowdown)

    def decode(self, n: int, total_context: float) -> float:
        """One decode step (one token for each of n sequences); with PP, n is split into micro-batches."""
        return self.decode_step(n, total_context)[0]

    def decode_step(self, n: int, total_context: float) -> tuple[float, Work]:
        """`decode`'s time, and that time by what bounds it (`Work`)."""
        if n <= 0:
            return 0.0, Work()
        micro = min(self.pp, n)
        b = step_time(self.perf, DecodeBatch(n / micro, total_context / micro))  # type: ignore[arg-type]
        return b.total * self.slowdown, Work.of(b, self.slowdown)


@dataclass(frozen=True)
class Work:
    """Model seconds of GPU work, by what bounds it (the step's parts in `model.step.StepBreakdown`):
    reading weights and the KV cache (`memory_s`), FLOPs beyond those reads, and the stall the running
    batch's prefills cause (`compute_s`), all-reduce and MoE collectives (`comm_s`), and the fixed
    overheads of launches and scheduling (`other_s`); `busy_s` is their sum. The simulated GPUs' power
    follows it (sim/telemetry.py)."""

    memory_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    other_s: float = 0.0

    @property
    def busy_s(self) -> float:
        return self.memory_s + self.compute_s + self.comm_s + self.other_s

    @classmethod
    def of(cls, b: StepBreakdown, scale: float = 1.0, stall_s: float = 0.0) -> Work:
        """A step's breakdown (× `scale`, e.g. a collapse's slowdown), plus a prefill stall (compute)."""
        return cls(
            (b.weights + b.kv_cache) * scale, b.compute * scale + stall_s, b.comm * scale, b.other * scale
        )

    def plus(self, o: Work) -> Work:
        return Work(
            self.memory_s + o.memory_s,
            self.compute_s + o.compute_s,
            self.comm_s + o.comm_s,
            self.other_s + o.other_s,
        )

    def minus(self, o: Work) -> Work:
        return Work(
            self.memory_s - o.memory_s,
            self.compute_s - o.compute_s,
            self.comm_s - o.comm_s,
            self.other_s - o.other_s,
        )


@dataclass
class Limits:
    kv_tokens: int  # KV-cache capacity in tokens, all attention-DP groups together
    max_running: int = 1024
    prefill_budget: int = 8192  # prefill tokens per step (max-num-batched-tokens / chunked-prefill-size)
    block_size: int = 16
    ttft_overhead_s: float = 0.0  # front end: HTTP, tokenization, scheduling


@dataclass
class Step:
    start: float
    dt: float
    chunks: list[tuple[SimRequest, int]] = field(default_factory=list)
    decode_n: int = 0
    work: Work | None = None  # dt by what bounds it (None: all of it counted as memory-bound)


@dataclass
class Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_s: float = 0.0
    work: Work = field(default_factory=Work)  # busy_s by what bound it (the GPUs' power follows)
    requests: int = 0
    success: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    # What the step clock says each finished request took (model seconds, summed), as an engine's own
    # TTFT, inter-token and end-to-end histograms: a check of a simulated figure reads these, never the
    # wall clock a loaded box lets through.
    ttft_s: float = 0.0
    itl_s: float = 0.0
    itl_n: int = 0
    e2e_s: float = 0.0
    timed: int = 0


class Scheduler:
    """Continuous batching over model time; `plan(now)` → Step, `complete(step)` at step.start + dt."""

    def __init__(self, timing: Timing, limits: Limits, *, record: bool = False) -> None:
        self.timing = timing
        self.limits = limits
        self.bs = limits.block_size
        self.total_blocks = max(limits.kv_tokens // self.bs, 0)
        self.free_blocks = self.total_blocks
        self.waiting: deque[SimRequest] = deque()
        self.running: dict[int, SimRequest] = {}  # admission order: PREFILL, HOLD, DECODE
        self.dec: list[SimRequest] = []  # HOLD + DECODE: the decode batch
        self.dec_ctx = 0  # total context of the decode batch
        self.dec_prompt = 0  # prompt and output lengths summed over the decode batch
        self.dec_out = 0
        self.unreleased: dict[int, SimRequest] = {}  # admitted, first token not yet out
        self._retarget_load = 0  # the load `_retarget` last ran for
        self.last_dt = 0.0
        self.t_end = 0.0  # end of the step being completed (sinks read it during `complete`)
        self.counters = Counters()
        self.record = record
        self.on_step: Callable[[Step], None] | None = None
        self.prefix: PrefixCache | None = None  # automatic prefix caching (None: off)

    # -- bookkeeping ------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        if not self.total_blocks:
            return 0.0
        return 1.0 - self.free_blocks / self.total_blocks

    @property
    def kv_tokens_used(self) -> int:
        return (self.total_blocks - self.free_blocks) * self.bs

    def add(self, req: SimRequest, now: float) -> None:
        req.arrival = now
        req.ready_at = now + self.limits.ttft_overhead_s
        if self.record:
            req.token_times = []
        self.counters.requests += 1
        if self.prefix is not None:
            # looked up once, on arrival: a prompt whose prefix a finished turn left cached skips it
            req.cached = self.prefix.lookup(req.hashes, req.prompt)
            req.need = req.prompt - req.cached
        self.waiting.append(req)

    def earliest_arrival(self) -> float | None:
        """Model time the oldest waiting request arrived (None: nothing waits)."""
        return min((r.arrival for r in self.waiting), default=None)

    def abort(self, req: SimRequest) -> None:
        """The client went away: free everything the request holds."""
        if req.state == DONE:
            return
        if req.state == WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        else:
            self._release(req)
        self.unreleased.pop(req.rid, None)
        req.state = DONE
        self.counters.success["abort"] += 1

    def _release(self, req: SimRequest) -> None:
        self.running.pop(req.rid, None)
        if req.state in (HOLD, DECODE):
            try:
                self.dec.remove(req)
            except ValueError:
                pass
            else:
                self.dec_ctx -= req.ctx
                self.dec_prompt -= req.prompt
                self.dec_out -= req.max_out
        self.free_blocks += req.blocks
        req.blocks = 0

    @property
    def load(self) -> int:
        """The closed loop's concurrency as the laws see it: every request in the engine, admitted or
        not (a client's resend waits in the front end for `ttft_overhead` before it is admissible),
        up to the running-request limit (`laws` caps it by the KV cache, as `predict` does)."""
        return min(len(self.running) + len(self.waiting), self.limits.max_running)

    def next_wakeup(self) -> float | None:
        """Model time at which an idle scheduler has work again (None: nothing queued)."""
        if self.running:
            return 0.0
        if self.waiting:
            return self.waiting[0].ready_at
        return None

    def _preempt_one(self) -> bool:
        if not self.running:
            return False
        victim = self.running[next(reversed(self.running))]
        self._release(victim)
        victim.state = WAITING
        victim.need = victim.prompt + victim.generated
        victim.cached = 0  # recomputed in full (its cached blocks may have gone meanwhile)
        victim.done_prefill = 0
        victim.ctx = 0
        self.waiting.appendleft(victim)
        self.counters.preemptions += 1
        return True

    # -- the step -----------------------------------------------------------------------------
    def plan(self, now: float) -> Step | None:
        """Decide the next step starting at `now`; None when there is nothing to do yet."""
        bs = self.bs
        # 1. Room for one more token for every decoding request; preempt the newest until it fits.
        need = 0
        for r in self.dec:
            if r.state == DECODE and r.ctx >= r.blocks * bs:
                need += 1
        while need > self.free_blocks and self.running:
            victim = self.running[next(reversed(self.running))]
            if victim.state == DECODE and victim.ctx >= victim.blocks * bs:
                need -= 1
            self._preempt_one()
        # 2. Admission, first come first served.
        newly: list[SimRequest] = []
        waiting, running = self.waiting, self.running
        while waiting and waiting[0].ready_at <= now and len(running) < self.limits.max_running:
            r = waiting[0]
            blocks = -(-(r.need + r.cached + 1) // bs)
            if blocks > self.free_blocks - need:
                if not running and blocks > self.total_blocks:  # can never fit: fail it
                    waiting.popleft()
                    r.state = DONE
                    r.sink.finish(r, "abort")
                    self.counters.success["abort"] += 1
                    continue
                break
            waiting.popleft()
            self.free_blocks -= blocks
            r.blocks = blocks
            r.state = PREFILL
            r.done_prefill = 0
            running[r.rid] = r
            newly.append(r)
        load = self.load
        for r in newly:
            if r.first_at is None:
                # Admitted at the first step boundary after it was ready: the law starts then;
                # held back longer (KV cache, --max-num-seqs), the wait adds to its TTFT.
                r.base = r.ready_at if now - r.ready_at <= self.last_dt else now
                r.law_n = 0
                self.unreleased[r.rid] = r
        if newly or load > self._retarget_load:
            self._retarget(load)
        self._retarget_load = load
        # 3. Prefill chunks up to the token budget, in admission order.
        budget = self.limits.prefill_budget
        chunks: list[tuple[SimRequest, int]] = []
        if len(self.dec) < len(running):
            for r in running.values():
                if r.state != PREFILL:
                    continue
                take = min(r.need - r.done_prefill, budget)
                chunks.append((r, take))
                budget -= take
                if budget <= 0:
                    break
        n = len(self.dec)
        if not chunks and n == 0:
            return None
        # 4. Price the step.
        t = self.timing
        if n == 0:
            # Nobody decodes: the step is the longest chunk's prefill; the batch's other chunks share
            # its weight reads (their marginal cost is charged to the decode steps that follow).
            r0, c0 = max(chunks, key=lambda rc: rc[1])
            dt, work = t.prefill_alone(c0, r0.done_prefill)
        else:
            # The stall the running batch's prefills cause, per predict's law for this batch.
            _, stall = t.laws(self.dec_prompt // n, self.dec_out // n, load)
            dt, work = t.decode_step(n, self.dec_ctx)
            dt += stall
            if stall:  # prefill chunks riding the decode step: compute-bound
                work = Work(work.memory_s, work.compute_s + stall, work.comm_s, work.other_s)
        return Step(now, dt, chunks, n, work)

    def _retarget(self, load: int) -> None:
        """Due times of first tokens not yet out, per the TTFT law at the highest load seen since
        admission. `predict`'s law is a wave's: the C requests of a closed loop arrive together and
        queue behind each other's prefills. A real client resends a wave one request at a time, so
        the first of a wave is admitted before the rest have arrived; judged by the load at its
        admission alone, it would skip the queue the rest of its wave puts it in (TTFT ~10 % short
        of `predict` at C=64 with a 0.2 ms/request client). A due time only ever moves later."""
        laws = self.timing.laws
        for r in self.unreleased.values():
            if load > r.law_n and r.state != WAITING:
                r.law_n = load
                # a prefix-cache hit prefills only the uncached rest (`need`)
                r.first_at = r.base + laws(r.need, r.max_out, load)[0]

    def complete(self, step: Step) -> None:
        """The step's time has passed: finish its prefill chunks and emit one token per decoder."""
        t_end = step.start + step.dt
        c = self.counters
        c.steps += 1
        c.busy_s += step.dt
        c.work = c.work.plus(step.work or Work(memory_s=step.dt))
        self.last_dt = step.dt
        dec = self.dec
        for r, take in step.chunks:
            if r.state != PREFILL:
                continue  # aborted or preempted meanwhile
            r.done_prefill += take
            c.prompt_tokens += take
            if r.done_prefill >= r.need:
                c.prompt_tokens += r.cached  # the engines count a prompt whole, cached part included
                r.ctx = r.need + r.cached
                if self.prefix is not None:
                    self.prefix.insert(r.hashes)
                r.state = HOLD if r.generated == 0 else DECODE
                dec.append(r)
                self.dec_ctx += r.ctx
                self.dec_prompt += r.prompt
                self.dec_out += r.max_out
        self.t_end = t_end
        bs = self.bs
        finished: list[SimRequest] = []
        emitted = 0
        record = self.record
        for r in dec:
            if r.state == HOLD:
                # Released when its first token is due before the next step ends; the token leaves
                # at its due time (the front end streams it; `first_token_time`), not on the grid.
                if r.first_at is not None and r.first_at > t_end + step.dt:
                    continue
                r.state = DECODE
                self.unreleased.pop(r.rid, None)
                r.first_token_time = max(r.first_at or t_end, t_end)
                r.lag = r.first_token_time - t_end
            r.generated += 1
            r.ctx += 1
            emitted += 1
            if r.ctx > r.blocks * bs:
                r.blocks += 1
                self.free_blocks -= 1
            if record:
                # The last token keeps the first one's lag (the sinks send it late by as much), so
                # TPOT = (last − first) / (n − 1) is a whole number of steps, as on a real engine.
                last = r.generated >= r.max_out
                r.token_times.append(  # type: ignore[union-attr]
                    r.first_token_time if r.generated == 1 else t_end + (r.lag if last else 0.0)  # type: ignore[arg-type]
                )
            r.sink.token(r)
            if r.generated >= r.max_out:
                finished.append(r)
        self.dec_ctx += emitted
        c.generation_tokens += emitted
        for r in finished:
            if self.prefix is not None:
                self.prefix.insert(r.full_hashes)
            self._release(r)
            r.state = DONE
            c.success[r.reason] += 1
            first_s = r.first_token_time if r.first_token_time is not None else t_end
            last_s = t_end + r.lag if r.generated > 1 else first_s
            c.ttft_s += first_s - r.arrival
            c.itl_s += last_s - first_s
            c.itl_n += r.generated - 1
            c.e2e_s += last_s - r.arrival
            c.timed += 1
            r.sink.finish(r, r.reason)
        if self.on_step is not None:
            self.on_step(step)


def kv_blocks_needed(tokens: int, block_size: int = 16) -> int:
    return math.ceil(tokens / block_size)


class LengthSampler:
    """Output lengths when EOS is allowed: a seeded draw per request, in arrival order.

    The natural length is geometric-like (exponential, mean `mean` tokens, at least 1), the same law
    for every run with the same seed; `min_tokens` postpones EOS, `max_tokens` caps it."""

    def __init__(self, seed: int, mean: float = 256.0) -> None:
        self.rng = random.Random(seed)
        self.mean = mean

    def draw(self, max_tokens: int, min_tokens: int = 0, ignore_eos: bool = False) -> tuple[int, str]:
        if ignore_eos:
            return max_tokens, "length"
        natural = 1 + int(self.rng.expovariate(1.0 / self.mean))
        natural = max(natural, min(min_tokens, max_tokens))
        if natural < max_tokens:
            return natural, "stop"
        return max_tokens, "length"
