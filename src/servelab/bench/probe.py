"""What the server is, asked before anything is measured: what it accepts (`probe`: exact output
lengths, streamed usage, its models and context), what it says it is (`learn_context`), the path's round
trip (`direct_path`) and its tokens per word (`calibrate_tokens_per_word`); with them, how a request's
body is built (`request_body`)."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

from servelab.bench import workload as W
from servelab.bench.client import Client, StreamResult
from servelab.bench.config import BenchConfig
from servelab.bench.scrape import detect_engine, parse_prometheus
from servelab.errors import ConfigError, ServerError
from servelab.jsontypes import JsonObject
from servelab.results import (
    Clock,
    Host,
    Layout,
    NetPath,
    RunContext,
)


@dataclass
class Capabilities:
    """What the server accepted when probed; decides how requests are built."""

    exact_length: bool = True  # ignore_eos + min_tokens accepted
    stream_usage: bool = True  # stream_options.include_usage accepted
    usage_returned: bool = True
    served_models: list[str] = field(default_factory=list)
    engine: str | None = None
    max_model_len: int | None = None  # the model's context, as /v1/models states it (vLLM, SGLang)


def request_body(cfg: BenchConfig, caps: Capabilities, prompt: str, max_tokens: int) -> JsonObject:
    body: JsonObject = {"model": cfg.model, "max_tokens": max_tokens, "stream": True}
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


def request_path(cfg: BenchConfig) -> str:
    return "/v1/chat/completions" if cfg.api == "chat" else "/v1/completions"


async def _probe_models(client: Client, cfg: BenchConfig) -> tuple[list[str], int | None]:
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
        return models, limits[0]
    return models, None


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
    caps.served_models, caps.max_model_len = await _probe_models(client, cfg)
    if caps.served_models and cfg.model not in caps.served_models:
        raise ServerError(
            f"the server does not serve model {cfg.model!r}; it serves {', '.join(caps.served_models)}",
            hint="Pass one of the served names to --model.",
        )
    status, body = await fetch(client, "/metrics")
    if status == 200:
        caps.engine = detect_engine(parse_prometheus(body.decode("utf-8", "replace")))
    for attempt in ("full", "no_exact", "no_usage"):
        if attempt == "no_exact":
            caps.exact_length = False
        if attempt == "no_usage":
            caps.stream_usage = False
        req = client.build_request(request_path(cfg), request_body(cfg, caps, "Hello there, how are you", 4))
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
    status, body = await fetch(client, "/servelab/info")
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


async def fetch(client: Client, path: str) -> tuple[int, bytes]:
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
        res = await _send_retrying(
            client, client.build_request(request_path(cfg), request_body(cfg, caps, text, 1)), 120
        )
        if not res.ok or res.prompt_tokens is None:
            return None
        samples.append((n_words, res.prompt_tokens))
    return W.fit_tokens_per_word(samples)


# The prompt pool is bounded in tokens and in count: a level of ten million requests cycles through
# it (with a warning: repeats can hit a prefix cache) instead of building every prompt up front.
