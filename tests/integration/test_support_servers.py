"""Prove the test servers behave as specified before anything relies on them.

Deliberately independent of servelab.bench (being written): raw http.client,
sockets and asyncio only.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from tests.support import engines
from tests.support.fault_server import FAULT_KINDS, FaultServerHandle

FaultFactory = Callable[..., FaultServerHandle]


# -- tiny raw clients ---------------------------------------------------------------------------


def _hostport(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    return parts.hostname, parts.port


@dataclass
class Result:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    events: list[tuple[float, str]] = field(default_factory=list)  # (arrival perf_counter, data payload)
    t_sent: float = 0.0
    error: BaseException | None = None

    def json(self) -> Any:
        return json.loads(self.body)

    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(d) for _, d in self.events if d != "[DONE]"]


def request(
    url: str,
    path: str,
    body: Any = None,
    *,
    method: str = "POST",
    timeout: float = 30.0,
    stream: bool = False,
) -> Result:
    """One HTTP request; with stream=True, record each SSE `data:` line and its arrival time."""
    host, port = _hostport(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        t0 = time.perf_counter()
        conn.request(method, path, body=data, headers={"content-type": "application/json"} if data else {})
        resp = conn.getresponse()
        res = Result(status=resp.status, headers={k.lower(): v for k, v in resp.getheaders()}, t_sent=t0)
        if not stream or resp.status != 200:
            res.body = resp.read()
            return res
        try:
            while True:
                line = resp.readline()
                if not line:
                    break
                t = time.perf_counter()
                line = line.rstrip(b"\r\n")
                if line.startswith(b"data: "):
                    res.events.append((t, line[6:].decode()))
        except (http.client.HTTPException, OSError, ValueError) as e:
            res.error = e
        return res
    finally:
        conn.close()


def completion_body(
    max_tokens: int = 8, *, stream: bool = True, usage: bool = True, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "fault-model",
        "prompt": "one two three four five",
        "max_tokens": max_tokens,
    }
    body["stream"] = stream
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value}, summing over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def metrics(url: str) -> dict[str, float]:
    res = request(url, "/metrics", method="GET")
    assert res.status == 200
    return parse_metrics(res.body.decode())


# -- fault server: happy path ---------------------------------------------------------------------


def test_fault_server_streams_tokens_with_vllm_format_usage_and_exact_timing(
    fault_server_factory: FaultFactory,
) -> None:
    srv = fault_server_factory(token_interval_ms=20, ttft_ms=50)
    res = request(srv.url, "/v1/completions", completion_body(20, ignore_eos=True), stream=True)
    assert res.status == 200 and res.error is None
    assert res.headers["content-type"].startswith("text/event-stream")
    assert res.events[-1][1] == "[DONE]"
    chunks = res.chunks()
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
    assert len(tokens) == 20
    assert all(c["object"] == "text_completion" and c["model"] == "fault-model" for c in chunks)
    assert all(c["choices"][0]["text"].startswith(" ") for c in tokens)
    final, usage_chunk = chunks[-2], chunks[-1]
    assert final["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25}

    times = [t for (t, d) in res.events if '"finish_reason":null' in d]
    ttft = times[0] - res.t_sent
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 0.045 <= ttft <= 0.080, ttft
    assert abs(statistics.median(gaps) - 0.020) <= 0.0006, gaps  # within 3 %


def test_fault_server_holds_absolute_deadlines_through_a_stall_of_its_own_process(
    fault_server_factory: FaultFactory,
) -> None:
    """Token i leaves at ttft + i x interval however late the server ran before it: stopped for 80 ms
    mid-stream (SIGSTOP, as a busy machine does to it), it sends what fell due at once and the tail of
    the stream is back on its schedule. A server that slept each interval anew would carry the whole
    stall into every later token. The stall is the reference, measured in the same stream."""
    srv = fault_server_factory(token_interval_ms=20, ttft_ms=50)
    assert srv.proc is not None
    pid = srv.proc.pid

    def stall() -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(0.080)
        finally:
            os.kill(pid, signal.SIGCONT)

    timer = threading.Timer(0.100, stall)  # after token 2 or so: the stream ends at 0.43 s
    timer.start()
    try:
        res = request(srv.url, "/v1/completions", completion_body(20, ignore_eos=True), stream=True)
    finally:
        timer.join()
    times = [t for (t, d) in res.events if '"finish_reason":null' in d]
    assert len(times) == 20
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) >= 0.060, gaps  # the stall landed inside the stream
    # A busy machine only ever delays a read, so the lower envelope of each token's lateness against
    # its schedule is what the server kept: the earliest of the last five against the earliest of
    # the first five (the stall is over by token 12 even if the timer fires 100 ms late).
    late = [t - i * 0.020 for i, t in enumerate(times)]
    assert abs(min(late[-5:]) - min(late[:5])) <= 0.004, (late, max(gaps))


def test_fault_server_chat_stream_and_non_streaming(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(token_interval_ms=0)
    chat = {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a b c"}],
    }
    res = request(srv.url, "/v1/chat/completions", {**chat, "max_tokens": 4, "stream": True}, stream=True)
    chunks = res.chunks()
    assert res.events[-1][1] == "[DONE]"
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert len(contents) == 4 and all(contents)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)  # not requested

    full = request(srv.url, "/v1/chat/completions", {**chat, "max_completion_tokens": 3})
    body = full.json()
    assert body["object"] == "chat.completion"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert len(body["choices"][0]["message"]["content"].split()) == 3

    comp = request(srv.url, "/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 2}).json()
    assert comp["usage"]["prompt_tokens"] == 4 and comp["choices"][0]["finish_reason"] == "length"

    models = request(srv.url, "/v1/models", method="GET").json()
    assert models["data"][0]["id"] == "fault-model"
    assert request(srv.url, "/health", method="GET").status == 200
    assert request(srv.url, "/nope", method="GET").status == 404


def test_fault_server_eos_semantics(fault_server_factory: FaultFactory) -> None:
    """natural_len simulates EOS; ignore_eos disables it; min_tokens postpones it."""
    srv = fault_server_factory(token_interval_ms=0, natural_len=3)

    def run(**extra: Any) -> tuple[int, str]:
        chunks = request(srv.url, "/v1/completions", completion_body(10, **extra), stream=True).chunks()
        return chunks[-1]["usage"]["completion_tokens"], chunks[-2]["choices"][0]["finish_reason"]

    assert run() == (3, "stop")
    assert run(ignore_eos=True) == (10, "length")
    assert run(min_tokens=6) == (6, "stop")


def test_fault_server_keep_alive_and_close_delimited(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(token_interval_ms=0)
    host, port = _hostport(srv.url)
    conn = http.client.HTTPConnection(host, port, timeout=5)
    for _ in range(3):  # streamed (chunked) then plain responses on one connection
        conn.request("POST", "/v1/completions", body=json.dumps(completion_body(3)))
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read().endswith(b"data: [DONE]\n\n")
        conn.request("GET", "/health")
        assert conn.getresponse().read() == b""
    assert conn.sock is not None  # never reconnected
    conn.close()

    srv2 = fault_server_factory(token_interval_ms=0, close_delimited=True)
    res = request(srv2.url, "/v1/completions", completion_body(3), stream=True)
    assert res.headers["connection"] == "close" and "transfer-encoding" not in res.headers
    assert res.events[-1][1] == "[DONE]" and res.error is None


def test_fault_server_metrics_are_real_counts(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(token_interval_ms=20, max_num_seqs=1, in_process=True)
    before = metrics(srv.url)
    assert set(before) >= {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
    }
    socks = []
    host, port = _hostport(srv.url)
    body = json.dumps(completion_body(10)).encode()
    for _ in range(3):
        s = socket.create_connection((host, port))
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        socks.append(s)
    time.sleep(0.1)
    mid = metrics(srv.url)
    assert mid["vllm:num_requests_running"] == 1
    assert mid["vllm:num_requests_waiting"] == 2
    assert mid["vllm:kv_cache_usage_perc"] > 0
    for s in socks:
        s.settimeout(5)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            data += s.recv(65536)
        s.close()
    after = metrics(srv.url)
    assert after["vllm:generation_tokens_total"] == 30
    assert after["vllm:prompt_tokens_total"] == 15
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0


# -- fault server: faults -------------------------------------------------------------------------


def test_fault_http_errors(fault_server_factory: FaultFactory) -> None:
    srv500 = fault_server_factory(fault="http_500")
    res = request(srv500.url, "/v1/completions", completion_body())
    assert res.status == 500 and "error" in res.json()
    srv429 = fault_server_factory(fault="http_429")
    res = request(srv429.url, "/v1/completions", completion_body())
    assert res.status == 429 and res.headers["retry-after"] == "1"
    # Non-generation endpoints are never faulted.
    assert request(srv429.url, "/health", method="GET").status == 200


def test_fault_timeout_never_answers(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(fault="timeout")
    with pytest.raises(TimeoutError):
        request(srv.url, "/v1/completions", completion_body(), timeout=0.5)
    assert request(srv.url, "/health", method="GET").status == 200


def test_fault_drop_mid_stream(fault_server_factory: FaultFactory) -> None:
    """Raw socket: http.client.readline() treats a truncated chunked body as a clean EOF."""
    srv = fault_server_factory(fault="drop_mid_stream", drop_after_chunks=3, token_interval_ms=1)
    body = json.dumps(completion_body(10)).encode()
    data = b""
    with socket.create_connection(_hostport(srv.url), timeout=5) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert data.count(b"data: ") == 3
    assert b"[DONE]" not in data and not data.endswith(b"0\r\n\r\n")  # no terminating chunk


def test_fault_malformed_sse(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(fault="malformed_sse", token_interval_ms=0)
    res = request(srv.url, "/v1/completions", completion_body(6), stream=True)
    bad = []
    for _, data in res.events:
        try:
            json.loads(data)
        except ValueError:
            if data != "[DONE]":
                bad.append(data)
    assert len(bad) == 1
    assert res.events[-1][1] == "[DONE]"


def test_fault_die_exits_after_n_requests(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(fault="die", die_after=2, token_interval_ms=0)
    for _ in range(2):
        assert request(srv.url, "/v1/completions", completion_body(2)).status == 200
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        request(srv.url, "/v1/completions", completion_body(2))
    assert srv.proc is not None
    assert srv.proc.wait(5) == 1
    with pytest.raises(ConnectionRefusedError):
        request(srv.url, "/health", method="GET")


def test_fault_reject_extra_params_like_transformers_serve(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(fault="reject_extra_params", token_interval_ms=0)
    for extra in ({"ignore_eos": True}, {"min_tokens": 2}, {"stream_options": {"include_usage": True}}):
        res = request(srv.url, "/v1/completions", {"prompt": "x", "max_tokens": 2, **extra})
        assert res.status == 422
        assert "Unexpected fields in the request" in res.json()["detail"]
    assert request(srv.url, "/v1/completions", {"prompt": "x", "max_tokens": 2}).status == 200


def test_fault_no_usage_and_short_output(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(fault="no_usage", token_interval_ms=0)
    chunks = request(srv.url, "/v1/completions", completion_body(4), stream=True).chunks()
    assert all("usage" not in c for c in chunks) and len(chunks) == 5

    srv = fault_server_factory(fault="short_output", short_output_tokens=2, token_interval_ms=0)
    chunks = request(srv.url, "/v1/completions", completion_body(10, ignore_eos=True), stream=True).chunks()
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_fault_rate_is_seeded_and_proportional(fault_server_factory: FaultFactory) -> None:
    def statuses(seed: int) -> list[int]:
        srv = fault_server_factory(
            fault=["http_500", "http_429"], fault_rate=0.2, seed=seed, token_interval_ms=0
        )
        return [
            request(srv.url, "/v1/completions", completion_body(1, stream=False)).status for _ in range(200)
        ]

    a, b, c = statuses(1), statuses(1), statuses(2)
    assert a == b and a != c
    faulted = sum(s != 200 for s in a) / len(a)
    assert 0.1 <= faulted <= 0.3, faulted
    assert {500, 429} <= set(a)


def test_all_fault_kinds_are_covered() -> None:
    assert set(FAULT_KINDS) == {
        "http_500",
        "http_429",
        "timeout",
        "drop_mid_stream",
        "malformed_sse",
        "die",
        "reject_extra_params",
        "no_usage",
        "short_output",
    }


# -- fault server: scale --------------------------------------------------------------------------


async def _stream_raw(host: str, port: int, payload: bytes) -> tuple[int, float]:
    reader, writer = await asyncio.open_connection(host, port)
    t0 = time.perf_counter()
    writer.write(payload)
    data = bytearray()
    while not data.endswith(b"0\r\n\r\n"):
        chunk = await reader.read(65536)
        if not chunk:
            break
        data += chunk
    writer.close()
    return data.count(b'"finish_reason":null'), time.perf_counter() - t0


async def _many_streams(url: str, n: int, max_tokens: int) -> tuple[list[tuple[int, float]], float]:
    host, port = _hostport(url)
    body = json.dumps(completion_body(max_tokens, usage=False)).encode()
    payload = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(_stream_raw(host, port, payload) for _ in range(n)))
    return results, time.perf_counter() - t0


def test_fault_server_sustains_1024_concurrent_streams(fault_server_factory: FaultFactory) -> None:
    srv = fault_server_factory(token_interval_ms=20, cpu=0)
    light, _ = asyncio.run(_many_streams(srv.url, 8, 20))  # the same server, lightly loaded, just before
    results, wall = asyncio.run(_many_streams(srv.url, 1024, 20))
    assert [n for n, _ in results] == [20] * 1024
    # Ideal: 19 x 20 ms = 0.38 s per stream. Sustained: 1024 streams take at most 1.75x what 8 take on
    # this box now (an absolute 0.57 s failed on a loaded CI box where 8 streams alone took longer too).
    many, few = statistics.median(d for _, d in results), statistics.median(d for _, d in light)
    assert few >= 0.38 and many < 1.75 * few, (few, many)
    assert wall < 10 * few, (wall, few)
    assert metrics(srv.url)["vllm:generation_tokens_total"] == (1024 + 8) * 20


def test_fault_server_is_cheap_per_token(fault_server_factory: FaultFactory) -> None:
    """interval 0 = as fast as the client reads: the ceiling for client-overhead benchmarks."""
    srv = fault_server_factory(token_interval_ms=0, cpu=0)
    results, wall = asyncio.run(_many_streams(srv.url, 8, 5000))
    assert [n for n, _ in results] == [5000] * 8
    rate = 8 * 5000 / wall
    print(f"fault server: {rate:,.0f} tokens/s over 8 streams")
    assert rate > 20_000, rate


# -- engines ----------------------------------------------------------------------------------------


def test_missing_engines_venv_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVELAB_ENGINES_PYTHON", "/nonexistent/python")
    with pytest.raises(engines.EnginesNotInstalled, match=r"install-engines\.sh"):
        engines.engines_python()


# A server whose first start fails (as a start does when its port was taken, a worker died or the box was too
# busy), then serves: python -m http.server on the port it is given.
_FLAKY_SERVER = r"""
import http.server, pathlib, sys
flag, port, message = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if not flag.exists():
    flag.write_text("failed once")
    print(message, flush=True)
    sys.exit(3)
http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def _flaky(tmp_path: Path, message: str, *, always_fail: bool = False, **kw: Any) -> Any:
    flag = tmp_path / ("never" if always_fail else "failed-once")

    def cmd(p: int) -> list[str]:
        if always_fail:
            flag.unlink(missing_ok=True)  # every start is a first start
        return [sys.executable, "-c", _FLAKY_SERVER, str(flag), str(p), message]

    def ready(h: engines.ServerHandle) -> bool:
        return engines._http("127.0.0.1", h.port, "GET", "/", timeout=5)[0] == 200

    return engines._managed_server(
        kind="flaky",
        cmd_for_port=cmd,
        env=dict(os.environ),
        model="none",
        model_dir=tmp_path,
        host="127.0.0.1",
        port=None,
        ready=ready,
        startup_timeout=30,
        **kw,
    )


def test_a_failed_start_is_retried_whatever_the_cause(tmp_path: Path) -> None:
    with _flaky(tmp_path, "first start fails on purpose") as h:
        assert h.extra["attempts"] == 2
        assert "rc=3" in h.extra["failed_attempts"][0]
        assert engines._http("127.0.0.1", h.port, "GET", "/")[0] == 200
    assert h.proc.poll() is not None


def test_a_start_that_keeps_failing_gives_up_with_the_log_tail(tmp_path: Path) -> None:
    tag = f"every start fails {os.getpid()}"
    t0 = time.monotonic()
    with pytest.raises(engines.ServerStartError) as info, _flaky(tmp_path, tag, always_fail=True):
        pytest.fail("a server that always fails must not be yielded")
    message = str(info.value)
    assert "3 attempts" in message and message.count("rc=3") == 3, message
    assert tag in message  # the last log's tail
    assert time.monotonic() - t0 < 60


def test_retries_stop_when_the_start_budget_is_spent(tmp_path: Path) -> None:
    with (
        pytest.raises(engines.ServerStartError) as info,
        _flaky(tmp_path, "no budget", always_fail=True, budget_s=1.0),
    ):
        pytest.fail("unreachable")
    assert "(1 attempts)" in str(info.value) and "not tried" in str(info.value)


_TOKENIZER_CHECK = r"""
import json, random, sys
sys.path.insert(0, sys.argv[2])
from transformers import AutoTokenizer
from tiny_models import word_list
tok = AutoTokenizer.from_pretrained(sys.argv[1])
words = word_list()
rng = random.Random(0)
lengths = {n: len(tok(" " + " ".join(rng.choice(words) for _ in range(n)), add_special_tokens=False)["input_ids"])
           for n in (10, 100, 1000)}
ids = [rng.randrange(len(tok)) for _ in range(500)]  # what a random-weight model emits
roundtrip = tok(tok.decode(ids), add_special_tokens=False)["input_ids"] == ids
with_bos = tok("time year people")["input_ids"]
chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
print(json.dumps({"lengths": lengths, "roundtrip": roundtrip, "bos": with_bos[0] == tok.bos_token_id,
                  "n_bos": len(with_bos), "chat": chat, "eos": tok.eos_token, "vocab": len(tok)}))
"""


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen3", "llama", "glm_moe_dsa"])
def test_tiny_models_build_with_a_local_tokenizer(kind: str) -> None:
    model_dir = engines.build_tiny_model(kind)
    assert engines.build_tiny_model(kind) == model_dir  # idempotent (cached)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == kind
    out = subprocess.run(
        [
            str(engines.engines_python()),
            "-c",
            _TOKENIZER_CHECK,
            str(model_dir),
            str(engines.TINY_MODELS_SCRIPT.parent),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["lengths"] == {"10": 10, "100": 100, "1000": 1000}  # one token per word
    assert info["roundtrip"]  # any id sequence decodes/re-encodes to itself
    assert info["bos"] and info["n_bos"] == 4  # BOS + 3 words (common English words are in the vocab)
    assert info["chat"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert info["eos"] == "<|im_end|>" and 1000 < info["vocab"] <= 4096


@pytest.mark.integration
def test_vllm_serves_tiny_moe_with_usage(vllm_server: engines.ServerHandle) -> None:
    print(f"vLLM ready in {vllm_server.startup_s:.0f}s ({vllm_server.log_path})")
    body = {
        "model": vllm_server.model,
        "prompt": "bada kilo rumi",
        "max_tokens": 32,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    res = request(vllm_server.url, "/v1/completions", body, stream=True)
    assert res.status == 200 and res.error is None and res.events[-1][1] == "[DONE]"
    chunks = res.chunks()
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 32
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"

    chat = {"model": vllm_server.model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    reply = request(vllm_server.url, "/v1/chat/completions", chat).json()
    assert reply["usage"]["completion_tokens"] <= 4
    models = request(vllm_server.url, "/v1/models", method="GET").json()
    assert models["data"][0]["id"] == vllm_server.model
    names = parse_metrics(request(vllm_server.url, "/metrics", method="GET").body.decode())
    assert names["vllm:generation_tokens_total"] >= 32
    assert "vllm:kv_cache_usage_perc" in names and "vllm:num_requests_running" in names


_PLATFORM_CHECK = r"""
import importlib.util, json, sys
if len(sys.argv) > 1:  # load the shim by path and install its version alias, as its main() does
    spec = importlib.util.spec_from_file_location("vllm_cli", sys.argv[1])
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    shim._patch_version_lookup()
from vllm.platforms import resolve_current_platform_cls_qualname, vllm_version_matches_substr
print(json.dumps({"platform": resolve_current_platform_cls_qualname(), "cpu": vllm_version_matches_substr("cpu")}))
"""


def _platform_of(argv: list[str], env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in env.items() if k != "VLLM_TARGET_DEVICE"}  # detection, not the override
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env, check=False)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.integration
def test_vllm_picks_its_cpu_platform_through_the_shim_and_for_servelab_launches() -> None:
    """On an x86 CPU without AVX-512 (AMD EPYC Zen 2/3) vLLM's UnspecifiedPlatform imports the AVX-512
    `vllm._C` and dies with SIGILL. The shim's answer to `version("vllm")` is what vLLM's platform detection
    reads: it must say "cpu" even with VLLM_TARGET_DEVICE unset. servelab's own launch
    (`python -m vllm.entrypoints.openai.api_server`, the adapter's environment) must detect it as well."""
    from servelab.engines import registry
    from servelab.engines.base import Settings

    python = str(engines.engines_python())
    shim = _platform_of([python, "-c", _PLATFORM_CHECK, str(engines.VLLM_CLI_SHIM)], engines._engines_env())
    assert shim["platform"].endswith("CpuPlatform"), shim
    assert shim["cpu"] is True, shim
    spec = registry.get("vllm").command(
        Settings(model="tiny", port=8000, options={"cpu": True, "python": python})
    )
    assert spec.argv[:3] == [python, "-m", "vllm.entrypoints.openai.api_server"]
    own = _platform_of([spec.argv[0], "-c", _PLATFORM_CHECK], {**engines._engines_env(), **spec.env})
    assert own["platform"].endswith("CpuPlatform") and own["cpu"] is True, own
    # The CLI itself, end to end: it used to die with SIGILL (rc -4) while building its parser.
    proc = subprocess.run(
        [python, str(engines.VLLM_CLI_SHIM), "bench", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in engines._engines_env().items() if k != "VLLM_TARGET_DEVICE"},
        check=False,
    )
    assert proc.returncode == 0 and "usage: vllm bench serve" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.integration
def test_vllm_bench_serve_runs_against_tiny_vllm(vllm_server: engines.ServerHandle, tmp_path: Path) -> None:
    cmd = engines.vllm_bench_serve_cmd(
        vllm_server, result_dir=tmp_path, result_filename="bench.json", num_prompts=10, max_concurrency=4
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 10 and result["failed"] == 0
    assert result["total_output_tokens"] == 10 * 32


@pytest.mark.integration
def test_transformers_serve_serves_tiny_dense(transformers_server: engines.ServerHandle) -> None:
    print(f"transformers serve ready in {transformers_server.startup_s:.0f}s")
    base = {"model": transformers_server.model, "prompt": "bada kilo", "max_tokens": 5}
    res = request(transformers_server.url, "/v1/completions", {**base, "stream": True}, stream=True)
    assert res.status == 200 and res.error is None
    # transformers 5.19 quirks that clients must cope with (pinned here so an upgrade shows up):
    # no `data: [DONE]` terminator, and usage rides on the finish chunk (choices not empty).
    assert "[DONE]" not in [d for _, d in res.events]
    last = res.chunks()[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 5
    # stream_options is accepted (not 422) in 5.19; ignore_eos / min_tokens are rejected below.
    opts = {**base, "stream": True, "stream_options": {"include_usage": True}}
    assert request(transformers_server.url, "/v1/completions", opts, stream=True).status == 200
    chat = {
        "model": transformers_server.model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
    }
    assert request(transformers_server.url, "/v1/chat/completions", chat).status == 200
    for extra in ({"ignore_eos": True}, {"min_tokens": 2}):
        res = request(transformers_server.url, "/v1/completions", {**base, **extra})
        assert res.status == 422, extra
        assert "Unexpected fields" in res.json()["detail"]


@pytest.mark.integration
def test_transformers_serve_glm_moe_dsa_and_clean_teardown() -> None:
    """GLM-5's architecture (MLA + DSA indexer + MoE) runs under transformers serve;
    the process group is gone after the context exits."""
    model_dir = engines.build_tiny_model("glm_moe_dsa")
    with engines.transformers_server(model_dir) as srv:
        pgid = srv.proc.pid
        words = " ".join(
            random.Random(0).choice(["bada", "kilo", "rumi"]) for _ in range(200)
        )  # > index_topk
        res = request(srv.url, "/v1/completions", {"model": srv.model, "prompt": words, "max_tokens": 8})
        assert res.status == 200, res.body
        assert res.json()["usage"]["completion_tokens"] <= 8
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)
