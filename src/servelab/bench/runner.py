"""`servelab bench` as a service: probe the server, build the workload, drive every level, store.

The CLI calls `run_bench`; tests call it too. Progress goes to an observer callback so the same
code serves a progress bar, a study loop, or nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from servelab import crashpoint
from servelab.bench import capacity as C
from servelab.bench import metrics as M
from servelab.bench import saturation as S
from servelab.bench import sessions as SE
from servelab.bench import traces as T
from servelab.bench import workload as W
from servelab.bench.client import Client, StreamResult
from servelab.bench.config import BenchConfig
from servelab.bench.load import LevelSpec, PreparedRequest, Watch, frozen_heap, run_level, warmup
from servelab.bench.scrape import LevelScrape, detect_engine, parse_prometheus, pick
from servelab.bench.telemetry import GpuSource, source_for
from servelab.errors import ConfigError, Interrupted, ServerError
from servelab.load import kind_of
from servelab.results import (
    CapacityProbe,
    CapacityResult,
    Clock,
    Host,
    Layout,
    Level,
    NetPath,
    RequestRecord,
    RunContext,
)
from servelab.store.bench import BenchRepo
from servelab.store.db import Store

Observer = Callable[[str, dict[str, Any]], None]


@dataclass
class Capabilities:
    """What the server accepted when probed; decides how requests are built."""

    exact_length: bool = True  # ignore_eos + min_tokens accepted
    stream_usage: bool = True  # stream_options.include_usage accepted
    usage_returned: bool = True
    served_models: list[str] = field(default_factory=list)
    engine: str | None = None


def _body(cfg: BenchConfig, caps: Capabilities, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": cfg.model, "max_tokens": max_tokens, "stream": True}
    if cfg.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if caps.stream_usage:
        body["stream_options"] = {"include_usage": True}
    if caps.exact_length and cfg.exact_output_len:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    return body


def _path(cfg: BenchConfig) -> str:
    return "/v1/chat/completions" if cfg.api == "chat" else "/v1/completions"


async def _probe_models(client: Client, cfg: BenchConfig) -> list[str]:
    res = await client.get("/v1/models", timeout_s=15)
    if res.error_kind == "connect_error" or res.status == 0:
        raise ServerError(f"cannot reach {cfg.url}: {res.error_message}")
    if res.status != 200:
        raise ServerError(
            f"{cfg.url}/v1/models answered HTTP {res.status}: {res.body[:200].decode('utf-8', 'replace')}"
        )
    try:
        data = orjson.loads(res.body)
        models = [m["id"] for m in data.get("data", [])]
        # vLLM and SGLang name each model's context length; other servers may not
        limits = [m.get("max_model_len") for m in data.get("data", []) if m["id"] == cfg.model]
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ServerError(f"{cfg.url}/v1/models did not return an OpenAI model list") from exc
    if limits and isinstance(limits[0], int) and not isinstance(limits[0], bool):
        _check_context(cfg, limits[0])
    return models


def _check_context(cfg: BenchConfig, max_model_len: int) -> None:
    """The typical request would be refused (HTTP 400) when the asked lengths exceed the server's
    context: say so before measuring, naming the options. ShareGPT lengths come from the data."""
    if cfg.workload == "sharegpt" or cfg.trace:  # lengths from the data
        return
    if cfg.workload == "sessions":
        # the last turn resends everything: the system prompt and every message and reply before it
        last = cfg.system_prompt_len + cfg.turns * (max(cfg.input_len, cfg.tool_result_len) + cfg.output_len)
        if last > max_model_len:
            raise ConfigError(
                f"a session's last turn can reach {last} tokens (--system-prompt-len + --turns × "
                f"(max(--input-len, --tool-result-len) + --output-len)), over the server's "
                f"max_model_len {max_model_len} for {cfg.model!r}",
                hint="ask for fewer --turns or shorter messages, or start the server with a longer context",
            )
        return
    prompt = cfg.input_len + (cfg.prefix_len if cfg.workload == "shared-prefix" else 0)
    need = prompt + cfg.output_len
    if need > max_model_len:
        names = "--input-len" + (" + --prefix-len" if cfg.workload == "shared-prefix" else "")
        raise ConfigError(
            f"{names} ({prompt}) + --output-len ({cfg.output_len}) = {need} tokens exceed the "
            f"server's max_model_len {max_model_len} for {cfg.model!r}",
            hint="ask for shorter prompts or outputs, or start the server with a longer context",
        )


async def probe(client: Client, cfg: BenchConfig, warnings: list[str]) -> Capabilities:
    """Find out what the server accepts: exact output lengths, streamed usage."""
    caps = Capabilities()
    caps.served_models = await _probe_models(client, cfg)
    if caps.served_models and cfg.model not in caps.served_models:
        raise ServerError(
            f"the server does not serve model {cfg.model!r}; it serves {', '.join(caps.served_models)}",
            hint="Pass one of the served names to --model.",
        )
    status, body = await _get(client, "/metrics")
    if status == 200:
        caps.engine = detect_engine(parse_prometheus(body.decode("utf-8", "replace")))
    for attempt in ("full", "no_exact", "no_usage"):
        if attempt == "no_exact":
            caps.exact_length = False
        if attempt == "no_usage":
            caps.stream_usage = False
        req = client.build_request(_path(cfg), _body(cfg, caps, "Hello there, how are you", 4))
        res = await _send_retrying(client, req, min(cfg.timeout_s, 120))
        if res.ok:
            break
        if res.error_kind in ("http_400", "http_422") and attempt != "no_usage":
            continue
        raise ServerError(
            f"a probe request failed ({res.error_kind}): {res.error_message}",
            hint=fault_hint(res.error_kind),
        )
    else:  # pragma: no cover - loop always breaks or raises
        pass
    if not caps.exact_length and cfg.exact_output_len:
        warnings.append(
            "the server rejected ignore_eos/min_tokens: output lengths cannot be forced; requests that "
            "stop early are reported as length mismatches"
        )
    if not caps.stream_usage:
        warnings.append(
            "the server rejected stream_options.include_usage: token counts come from the tokenizer "
            "(if given) or the number of streamed chunks"
        )
    caps.usage_returned = res.completion_tokens is not None
    if caps.stream_usage and not caps.usage_returned:
        warnings.append(
            "the server ignores stream_options.include_usage: token counts come from the tokenizer "
            "(if given) or the number of streamed chunks"
        )
    return caps


TRANSIENT = (
    "http_500",
    "http_502",
    "http_503",
    "http_429",
    "timeout",
    "disconnected",
    "malformed_sse",
    "incomplete",
    "server_error_event",
    "stalled",
)


async def _send_retrying(client: Client, req: bytes, timeout_s: float, tries: int = 4) -> StreamResult:
    """Probe requests retry transient faults: one unlucky answer must not decide the capabilities."""
    res = await client.send(req, timeout_s=timeout_s)
    for _ in range(tries - 1):
        if res.ok or res.error_kind not in TRANSIENT:
            break
        await asyncio.sleep(0.2)
        res = await client.send(req, timeout_s=timeout_s)
    return res


def fault_hint(kind: str | None) -> str | None:
    """Word each fault as what it is: a server that answers and then stalls is reachable, and a hint
    to check --url would send the user the wrong way."""
    if kind in ("stalled", "timeout"):
        return "the server took the request and then went silent: check its log for a stuck engine"
    if kind in ("disconnected", "http_500", "server_error_event"):
        return "the server answered, then failed the request: check its log (`servelab logs diagnose`)"
    return None  # unreachable, or a wrong URL/model: the default hint says what to check


async def direct_path(url: str, n: int = 5) -> NetPath:
    """The path's round trip to a server reached directly: the median of `n` TCP connects to its port
    (one SYN/SYN-ACK each, no request the server would count)."""
    parts = urlsplit(url)
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 80), 5.0
            )
        except (OSError, TimeoutError):
            continue
        times.append((time.perf_counter() - t0) * 1000.0)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return NetPath(via="direct", rtt_ms=round(statistics.median(times), 3) if times else None)


async def learn_context(client: Client, caps: Capabilities) -> RunContext:
    """What the server says it is: the simulator's `/servelab/info` names its host, layout and clock;
    a real engine's `/metrics` names the engine. Nothing here guesses: unknowns stay None."""
    status, body = await _get(client, "/servelab/info")
    if status == 200:
        try:
            info = orjson.loads(body)
        except orjson.JSONDecodeError:
            info = None
        if isinstance(info, dict):
            host, layout, clock = info.get("host") or {}, info.get("layout") or {}, info.get("clock") or {}
            try:
                return RunContext(
                    engine=info.get("engine") or caps.engine,
                    personality=info.get("personality"),
                    model_config=info.get("model_config") or info.get("model"),
                    host=Host(**host, source="server") if host else Host(),
                    layout=Layout(**layout),
                    quant=info.get("quant") or (info.get("effective") or {}).get("quantization"),
                    kv_dtype=info.get("kv_dtype") or (info.get("effective") or {}).get("kv_cache_dtype"),
                    clock=Clock(speed=float(clock.get("speed") or 1.0), source="server"),
                )
            except (TypeError, ValueError):
                pass  # not our simulator's shape: fall through to what /metrics told
    return RunContext(engine=caps.engine)


async def _get(client: Client, path: str) -> tuple[int, bytes]:
    res = await client.get(path)
    return res.status, res.body


async def calibrate_tokens_per_word(
    client: Client, cfg: BenchConfig, caps: Capabilities
) -> tuple[float, float] | None:
    """Fit prompt_tokens = overhead + slope·words from the server's own usage on two probe prompts."""
    if not caps.usage_returned:
        return None
    samples = []
    for n_words in (32, 256):
        text = " ".join(W._WORDS[(i * 7) % len(W._WORDS)] for i in range(n_words))
        res = await _send_retrying(client, client.build_request(_path(cfg), _body(cfg, caps, text, 1)), 120)
        if not res.ok or res.prompt_tokens is None:
            return None
        samples.append((n_words, res.prompt_tokens))
    return W.fit_tokens_per_word(samples)


# The prompt pool is bounded in tokens and in count: a level of ten million requests cycles through
# it (with a warning: repeats can hit a prefix cache) instead of building every prompt up front.
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


async def _prepare(
    client: Client, cfg: BenchConfig, caps: Capabilities, wl: W.Workload
) -> list[PreparedRequest]:
    path, out = _path(cfg), []
    for i, p in enumerate(wl.prompts):
        body = _body(cfg, caps, p.text, p.output_len)
        out.append(PreparedRequest(i, client.build_request(path, body), p.output_len, p.input_len, p.text))
        if i % 64 == 63:
            await asyncio.sleep(0)
    return out


def _session_builder(client: Client, cfg: BenchConfig, caps: Capabilities) -> SE.BuildRequest:
    """A session turn's request: the usual body (exact lengths, usage) with the history as its
    messages (chat) or prompt (completions)."""
    path = _path(cfg)

    def build(history: str | list[dict[str, str]], max_tokens: int) -> bytes:
        body = _body(cfg, caps, "", max_tokens)
        body["messages" if cfg.api == "chat" else "prompt"] = history
        return client.build_request(path, body)

    return build


def _all_failed(level: Level) -> str | None:
    """Why a level measured nothing: every request failed (a server that died after ready answers
    every request with an error; that is not a measurement)."""
    s = level.wall
    if s.completed or not s.failed:
        return None
    kinds = ", ".join(f"{k}×{n}" for k, n in s.errors.items())
    example = next(iter(s.error_examples.values()), "")
    return f"every request of level {level.summary.label} failed ({kinds}): {example[:200]}"


class _RecordMaker:
    def __init__(self, counter: W.TokenCounter | None) -> None:
        self.counter = counter

    def __call__(
        self, idx: int, req: PreparedRequest, start_s: float, scheduled: float | None, res: StreamResult
    ) -> RequestRecord:
        rec = RequestRecord(
            idx=idx,
            prompt_idx=req.prompt_idx,
            start_s=start_s,
            ok=res.ok,
            scheduled_s=scheduled,
            itl_s=res.itl_s,
            requested_output_tokens=req.requested_output_tokens,
            error_kind=res.error_kind,
            error_message=res.error_message,
        )
        rec.input_tokens = res.prompt_tokens if res.prompt_tokens is not None else req.target_input_tokens
        if res.completion_tokens is not None:
            rec.output_tokens, rec.token_source = res.completion_tokens, "usage"
            if self.counter is not None and res.ok:
                rec.tokenizer_output_tokens = self.counter.count(res.text)
        elif self.counter is not None:
            rec.output_tokens, rec.token_source = self.counter.count(res.text), "tokenizer"
        else:
            rec.output_tokens, rec.token_source = res.chunks, "chunks"
        if res.ok and res.chunks == 0 and res.completion_tokens == 0:
            rec.ok, rec.error_kind, rec.error_message = (
                False,
                "empty_response",
                "the server streamed no tokens",
            )
        return rec


async def _sampler(
    client: Client, scrape: LevelScrape, interval: float, gpus: GpuSource | None = None
) -> None:
    """A `/metrics` sample (and the GPU telemetry with it) every `interval` seconds, on a fixed schedule
    (a slow scrape does not push the later ones back), each with the client-clock time it was taken."""
    due = time.perf_counter()
    while True:
        due += interval
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        status, body = await _get(client, "/metrics")
        if status == 200:
            at, reading = time.perf_counter(), None
            if gpus is not None:
                with contextlib.suppress(Exception):  # telemetry is a side view: never stop a level
                    reading = await gpus.read()
            # appended together, after the last await: a sampler stopped mid-read leaves no half sample
            scrape.samples.append(pick(parse_prometheus(body.decode("utf-8", "replace"))))
            scrape.sample_at.append(at)
            scrape.gpu_samples.append(reading)
        else:
            scrape.errors += 1


async def _snapshot(client: Client) -> dict[str, float] | None:
    status, body = await _get(client, "/metrics")
    return pick(parse_prometheus(body.decode("utf-8", "replace"))) if status == 200 else None


@dataclass
class BenchResult:
    """What `run_bench` measured; `levels` as the store's `Run` holds them (summary in the time base
    shown to users, wall-clock figures beside)."""

    run_id: int
    uid: str
    status: str
    levels: list[Level]
    warnings: list[str]
    workload: dict[str, Any]
    capabilities: dict[str, Any]
    context: RunContext


class BenchSession:
    """One stored run against one server, its levels chosen by the caller: `start` probes the server,
    builds the workload and creates the run; `run_level(spec)` measures one level of it; `drive(body)`
    runs `body` (which calls `run_level` as often as it likes: a fixed list, a capacity search) and
    finishes the run whatever happens (interrupted, failed, completed)."""

    def __init__(self, cfg: BenchConfig, store: Store, observe: Observer | None = None) -> None:
        self.cfg = cfg
        self.notify: Observer = observe or (lambda _e, _d: None)
        try:
            self.slo = M.parse_slo(cfg.slo)
        except ValueError as exc:
            raise ConfigError(f"--slo: {exc}") from exc
        self.counter = W.TokenCounter(cfg.tokenizer) if cfg.tokenizer else None
        self.trace = read_trace(cfg)
        try:
            self.client = Client(
                cfg.url,
                api_key=cfg.api_key,
                timeout_s=cfg.timeout_s,
                keep_text=self.counter is not None or cfg.workload == "sessions",  # a session resends replies
                idle_timeout_s=cfg.idle_timeout_s,
            )
        except ValueError as exc:
            raise ConfigError(
                str(exc), hint="--url takes the server's base URL, e.g. http://127.0.0.1:8000"
            ) from exc
        self.metrics_client = Client(cfg.url, api_key=cfg.api_key, timeout_s=10)
        self.warnings: list[str] = []
        if self.trace is not None and self.trace.skipped:
            self.warnings.append(
                f"{self.trace.skipped} rows of the trace have a zero length and are not replayed"
            )
        self.repo = BenchRepo(store)
        self.levels: list[Level] = []
        self.status = "completed"
        self.early_stop = False  # open-loop levels stop sending when clearly over-saturated
        self.run_id, self.uid = 0, ""

    def close(self) -> None:
        self.client.close()
        self.metrics_client.close()

    async def start(self, specs: list[LevelSpec], most: int | None = None) -> None:
        """Probe, build the workload (its pool sized for `specs`, the levels expected, and at most `most`
        prompts) and store the run."""
        cfg, counter, warnings = self.cfg, self.counter, self.warnings
        self.caps = caps = await probe(self.client, cfg, warnings)
        fit = None
        if counter is None:
            fit = await calibrate_tokens_per_word(self.client, cfg, caps)
            if fit is None and counter is None:
                warnings.append(
                    "no tokenizer and no usage from the server: input lengths are counted in words"
                )
        # Duration-bound levels cycle through a pool of prompts; a pool big enough that a repeat (and
        # with it a prefix-cache hit that would flatter TTFT) is rare, and a warning when it happens.
        count = cfg.num_requests or max(
            [spec.num_requests or 0 for spec in specs]
            + [
                2048 if cfg.duration_s else 0,
                int(max(spec.value for spec in specs) * (cfg.duration_s or 0) * 1.5),
            ]
        )
        if most is not None:
            count = min(count, most)
        # Sessions build their conversations per level (each turn waits for the reply before it);
        # every other workload is one pool of prepared requests.
        self.plans: list[SE.SessionPlan] = []
        if cfg.workload == "sessions":
            self.plans = [
                SE.plan_for_level(cfg, int(sp.value), li, counter, fit) for li, sp in enumerate(specs)
            ]
            self.wl = wl = SE.workload_of(self.plans, counter, fit is not None)
        else:
            self.wl = wl = await build_workload(
                cfg, counter, fit, pool_size(cfg, count), cfg.seed, self.trace
            )
        warm_wl = await build_workload(cfg, counter, fit, 16, cfg.seed + 104729)
        if cfg.workload == "sharegpt" or self.trace is not None:
            warm_wl = W.synthetic(16, W.LengthSpec(64), W.LengthSpec(16), cfg.seed + 104729, counter)
        self.prepared = await _prepare(self.client, cfg, caps, wl) if not self.plans else []
        self.warm = await _prepare(self.client, cfg, caps, warm_wl)
        context = (await learn_context(self.metrics_client, caps)).merged(cfg.context)
        if context.path.via is None:
            context = context.merged(RunContext(path=await direct_path(cfg.url)))
        self.context = context
        self.gpus = await source_for(self.metrics_client, cfg.url, context)
        config = (
            cfg.model_dump(exclude={"context"})
            | {
                "workload_info": wl.describe(),
                "capabilities": caps.__dict__,
                "tokens_per_word_fit": fit,
            }
            | ({"trace_info": T.describe(self.trace)} if self.trace is not None else {})
        )
        self.run_id, self.uid = self.repo.create_run(cfg.url, cfg.model, cfg.api, config, wl.hash, context)
        self.repo.set_run_info(self.run_id, warnings=warnings)
        self.notify(
            "run_started",
            {
                "uid": self.uid,
                "levels": len(specs),
                "workload": wl.describe(),
                "warnings": warnings,
                "time_base": context.clock.time_base,
            },
        )
        self.make = _RecordMaker(counter)

    async def run_level(self, spec: LevelSpec) -> Level:
        """Measure one more level of the run (stored as it goes); `self.status` turns `failed` when
        every request of it failed (nothing was measured, so the caller should stop)."""
        level = await _run_one_level(
            self.client,
            self.metrics_client,
            self.repo,
            self.run_id,
            len(self.levels),
            spec,
            self.cfg,
            self.prepared,
            self.warm,
            self.make,
            self.slo,
            self.notify,
            self.context.clock.speed,
            early_stop=self.early_stop,
            gpus=self.gpus,
            plan=self.plans[len(self.levels)] if self.plans else None,
            caps=self.caps,
        )
        self.levels.append(level)
        if level.saturation is not None and level.saturation.saturated:
            who = "the server" if level.saturation.server_saturated else "the client"
            self.warnings.append(
                f"level {spec.label}: {who} could not keep up, not a steady state (its latencies are a "
                f"growing queue's): " + "; ".join(level.saturation.reasons)
            )
        failure = _all_failed(level)
        if failure is not None:
            self.status = "failed"
            self.warnings.append(failure)
        return level

    async def drive(self, body: Callable[[BenchSession], Awaitable[None]]) -> BenchResult:
        """Run `body(self)` and finish the run: interrupted (Ctrl-C), failed (anything raised, or every
        request of a level failed) or completed."""
        levels_out, warnings, repo, run_id, uid = self.levels, self.warnings, self.repo, self.run_id, self.uid
        try:
            await body(self)
        except asyncio.CancelledError:
            repo.set_run_info(run_id, warnings=warnings)
            repo.finish_run(run_id, "interrupted", [lv.wall for lv in levels_out])
            raise Interrupted(
                f"benchmark interrupted; run {uid} keeps every request that had finished",
                hint=f"`servelab runs show {uid}` shows what was measured.",
                run_uid=uid,
            ) from None
        except BaseException:
            # Never leave a run `running`: whatever stopped it, the store says it failed.
            repo.set_run_info(run_id, warnings=warnings)
            repo.finish_run(run_id, "failed", [lv.wall for lv in levels_out])
            raise
        repeated = sum(lv.wall.prompts_repeated for lv in levels_out)
        if repeated:
            warnings.append(
                f"{repeated} requests reused a prompt of the pool of {len(self.prepared)} (at most {POOL_MAX:,} "
                f"prompts or {POOL_TOKENS:,} tokens are built): a server with prefix caching may answer "
                "those faster; give fewer --num-requests or a shorter --duration"
            )
        checks = [lv.wall.tokenizer_crosscheck for lv in levels_out if lv.wall.tokenizer_crosscheck]
        checked = sum(c.checked for c in checks)
        disagree = sum(c.disagree for c in checks)
        if disagree:
            warnings.append(
                f"for {disagree} of {checked} requests the tokenizer's count of the streamed text "
                "disagrees with the server's usage by more than one token: the server streams text "
                "that is not the generated tokens, or --tokenizer is not the server's tokenizer"
            )
        repo.set_run_info(run_id, warnings=warnings)
        repo.finish_run(run_id, self.status, [lv.wall for lv in levels_out])
        self.notify("run_finished", {"uid": uid, "status": self.status})
        return BenchResult(
            run_id,
            uid,
            self.status,
            levels_out,
            warnings,
            self.wl.describe(),
            self.caps.__dict__,
            self.context,
        )


async def run_bench(cfg: BenchConfig, store: Store, observe: Observer | None = None) -> BenchResult:
    """Run every level of `cfg` against the server and store each request as it finishes."""
    session = BenchSession(cfg, store, observe)
    try:
        specs = cfg.level_specs(session.trace)
        await session.start(specs)

        async def fixed(s: BenchSession) -> None:
            for li, spec in enumerate(specs):
                await s.run_level(spec)
                if s.status == "failed":
                    # Nothing was measured; the levels after it would only repeat the failure.
                    skipped = len(specs) - li - 1
                    if skipped:
                        s.warnings[-1] += f"; the {skipped} later levels were not run"
                    break

        return await session.drive(fixed)
    finally:
        session.close()


CAPACITY_POOL = 1024


async def find_capacity(
    cfg: BenchConfig,
    store: Store,
    search: C.SearchSpec,
    slo: C.CapacitySLO,
    observe: Observer | None = None,
) -> tuple[BenchResult, CapacityResult]:
    """`bench --find-capacity`: probe loads chosen by `capacity.decide` as levels of one run, until the
    search stops; the result (stored with the run after every probe) gives the capacity and its curve."""
    session = BenchSession(cfg, store, observe)
    session.early_stop = True
    probes: list[CapacityProbe] = []
    found = C.result(search, slo, probes, "not started")
    try:
        # The pool is sized for the first probes (a prompt costs ~2 ms per 1k tokens to build, and the
        # search's highest load is not known ahead); larger probes cycle through it, with the warning.
        reach = min(search.highest, search.start * search.growth**2)
        await session.start([_spec(cfg, search.by, reach)], most=CAPACITY_POOL)
        speed = session.context.clock.speed

        async def searching(s: BenchSession) -> None:
            nonlocal found
            while True:
                decision = C.decide(search, probes, slo)
                if decision.load is None:
                    found = C.result(search, slo, probes, decision.reason, speed)
                    break
                s.notify("probe_started", {"load": decision.load, "why": decision.reason})
                level = await s.run_level(_spec(cfg, search.by, decision.load))
                records = s.repo.requests(s.repo.level_ids(s.run_id)[level.index])
                probe_ = C.verdict(decision.load, level.index, records, slo, speed, level.saturation)
                probes.append(probe_)
                found = C.result(search, slo, probes, "running", speed)
                s.repo.set_capacity(s.run_id, found)
                s.notify("probe_finished", probe_.model_dump(mode="json"))
                if s.status == "failed":
                    found = C.result(search, slo, probes, "every request of a probe failed", speed)
                    break
            s.repo.set_capacity(s.run_id, found)

        try:
            res = await session.drive(searching)
        except Interrupted:
            session.repo.set_capacity(session.run_id, C.result(search, slo, probes, "interrupted", speed))
            raise
        except BaseException as exc:
            why = f"failed: {type(exc).__name__}: {exc}"[:300]
            session.repo.set_capacity(session.run_id, C.result(search, slo, probes, why, speed))
            raise
        return res, found
    finally:
        session.close()


def _spec(cfg: BenchConfig, by: str, load: float) -> LevelSpec:
    """A capacity probe's level: the run's sizing (requests, duration or requests per stream) at `load`."""
    return LevelSpec(
        by,
        load,
        cfg.level_requests(load) if by == "concurrency" else cfg.num_requests,
        cfg.duration_s,
        cfg.max_concurrency,
        cfg.arrival,
        cfg.burstiness,
    )


async def _run_one_level(
    client: Client,
    metrics_client: Client,
    repo: BenchRepo,
    run_id: int,
    li: int,
    spec: LevelSpec,
    cfg: BenchConfig,
    prepared: list[PreparedRequest],
    warm: list[PreparedRequest],
    make: _RecordMaker,
    slo: M.SLO | None,
    notify: Observer,
    speed: float = 1.0,
    early_stop: bool = False,
    gpus: GpuSource | None = None,
    plan: SE.SessionPlan | None = None,
    caps: Capabilities | None = None,
) -> Level:
    level_id = repo.create_level(run_id, li, spec.mode, spec.value, spec.max_concurrency)
    n_warm = cfg.warmup_count(spec)
    notify(
        "level_started",
        {
            "index": li,
            "label": spec.label,
            "num_requests": spec.num_requests,
            "duration_s": spec.duration_s,
            "warmup": n_warm,
        },
    )
    await warmup(client, warm, n_warm, int(spec.value) if kind_of(spec.mode).closed_loop else n_warm)
    scrape = LevelScrape()
    before = await _snapshot(metrics_client)
    scrape.available = before is not None
    scrape.before = before or {}
    sampler = (
        asyncio.get_running_loop().create_task(_sampler(metrics_client, scrape, cfg.scrape_interval_s, gpus))
        if scrape.available and cfg.scrape_interval_s > 0
        else None
    )
    done: list[RequestRecord] = []

    def on_record(rec: RequestRecord) -> None:
        repo.add_request(level_id, rec)
        done.append(rec)
        notify(
            "request_done",
            {
                "index": li,
                "done": len(done),
                "ok": rec.ok,
                "output_tokens": rec.output_tokens,
                "ttft_s": rec.ttft_s,
                "end_s": rec.end_s,
                "speed": speed,
            },
        )

    status = "completed"
    # the collector skips what exists before the level (see frozen_heap)
    with frozen_heap():
        t_start = time.perf_counter()
        try:
            if plan is not None:
                records, wall, monitor = await SE.run_sessions(
                    client,
                    plan,
                    cfg.api,
                    _session_builder(client, cfg, caps or Capabilities()),
                    make,
                    on_record,
                    speed=speed,
                    duration_s=cfg.duration_s,
                )
            else:
                watch = _watch(done) if early_stop and spec.mode == "rate" else None
                records, wall, monitor = await run_level(
                    client, prepared, spec, make, on_record, seed=cfg.seed + li, watch=watch
                )
        except asyncio.CancelledError:
            status = "interrupted"
            records, wall, monitor = done, time.perf_counter() - t_start, None
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
    if scrape.available:
        after = await _snapshot(metrics_client) if status == "completed" else None
        scrape.after = after or {}
    summary = M.summarize(records, slo, duration_s=None).model_copy(
        update={
            "prompts_repeated": max(0, len(records) - len(prepared)) if plan is None else 0,
            "mode": spec.mode,
            "value": spec.value,
            "label": spec.label,
            "wall_s": wall,
        }
    )
    client_stats = monitor.summary(summary.total_output_tokens, summary.itl_ms.p50) if monitor else {}
    server = scrape.summary()
    if plan is not None:
        summary = summary.model_copy(update={"sessions": SE.summarize_sessions(records, plan, server)})
    series = scrape.series(t_start, cfg.scrape_interval_s, gpus.name if gpus else None)
    repo.finish_level(level_id, status, summary, server, client_stats, series=series)
    saturation = None
    if not kind_of(spec.mode).closed_loop and plan is None and records:
        saturation = S.detect(
            records,
            S.asked_rate(spec.mode, spec.value, records),
            scrape.samples,
            cfg.scrape_interval_s,
            monitor.lateness if monitor else (),
            monitor.stopped_early if monitor else None,
        )
        repo.set_saturation(level_id, saturation)
    level = Level(
        index=li,
        status=status,
        mode=spec.mode,
        value=spec.value,
        summary=summary.in_gpu_time(speed),
        wall=summary,
        server_metrics=server,
        client=client_stats,
        saturation=saturation,
        series=series.in_gpu_time(speed),
        wall_series=series,
    )
    notify("level_finished", {"index": li, "label": spec.label, "status": status, "client": client_stats})
    if status != "completed":
        raise asyncio.CancelledError
    return level


def _watch(done: list[RequestRecord]) -> Watch:
    """An open loop's live over-saturation check on the records finished so far (`saturation.early_stop`)."""

    def check(sent: int, elapsed_s: float, window_s: float) -> str | None:
        return S.early_stop(done, sent, elapsed_s, window_s)

    return check
