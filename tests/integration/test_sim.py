"""`servelab sim` as a real process: readiness, logs, endpoints, faults, telemetry, bench fidelity."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

GLM = ["--model", "GLM-5-NVFP4", "--gpu", "rtx-pro-6000", "--num-gpus", "8", "--tp", "8"]
QWEN = ["--model", "Qwen3-8B", "--gpu", "h100-sxm"]


@dataclass
class Sim:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.out.read_text() + self.err.read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port_line(err: Path, proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for line in err.read_text().splitlines():
            if line.startswith("SIM-PORT "):
                return int(line.split()[1])
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def http(url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_healthy(sim: Sim, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            if http(sim.url + "/health", timeout=2)[0] == 200:
                return
        time.sleep(0.05)
    raise AssertionError("simulator never became healthy:\n" + sim.logs()[-3000:])


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, port: int = 0, speed: float = 50, fast: bool = True, wait: bool = True) -> Sim:
        out, err = tmp_path / f"sim{len(procs)}.out", tmp_path / f"sim{len(procs)}.err"
        cmd = [sys.executable, "-m", "servelab", "sim", "--port", str(port), "--speed", str(speed), *args]
        if fast:
            cmd.append("--fast-start")
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(cmd, stdout=o, stderr=e, start_new_session=True)
        procs.append(proc)
        sim = Sim(proc, out, err, port)
        if wait:
            got = _wait_port_line(err, proc, 30)
            assert got, "no SIM-PORT line:\n" + sim.logs()[-3000:]
            sim.port = got
            wait_healthy(sim)
        return sim

    yield start
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def run_bench(url: str, model: str, tmp_path: Path, *args: str, cpus: set[int] | None = None) -> dict:
    env = {**os.environ, "SERVELAB_HOME": str(tmp_path / "home")}
    res = subprocess.run(
        [sys.executable, "-m", "servelab", "bench", "--url", url, "--model", model, "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_vllm_personality_serves_and_logs(start_sim, tmp_path):
    sim = start_sim(*QWEN, "--personality", "vllm", "--max-num-seqs", "128")
    logs = sim.out.read_text()
    for needle in (
        "non-default args: {",
        "'max_num_seqs': 128",
        "Initializing a V1 LLM engine (v",
        "with config: model='Qwen3-8B'",
        "GPU KV cache size:",
        "Application startup complete.",
    ):
        assert needle in logs
    assert json.loads(http(sim.url + "/version")[1])["version"]
    assert json.loads(http(sim.url + "/v1/models")[1])["data"][0]["id"] == "Qwen3-8B"
    d = run_bench(
        sim.url,
        "Qwen3-8B",
        tmp_path,
        "--concurrency",
        "4",
        "--num-requests",
        "16",
        "--input-len",
        "64",
        "--output-len",
        "16",
    )
    s = d["levels"][0]["summary"]
    assert s["completed"] == 16 and s["failed"] == 0 and s["mean_output_tokens"] == 16
    assert d["capabilities"]["engine"] == "vllm"
    metrics = http(sim.url + "/metrics")[1].decode()
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen3-8B"}' in metrics
    gpus = json.loads(http(sim.url + "/servelab/gpus")[1])["gpus"]
    assert len(gpus) == 1 and gpus[0]["memory_used_mib"] > 60_000 and gpus[0]["processes"]


def test_eos_and_usage(start_sim):
    sim = start_sim(*QWEN, "--eos-mean", "4", "--seed", "3")
    lens = []
    for _ in range(5):
        code, body = http(sim.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 200})
        assert code == 200
        d = json.loads(body)
        lens.append((d["usage"]["completion_tokens"], d["choices"][0]["finish_reason"]))
    assert any(r == "stop" for _, r in lens)
    code, body = http(sim.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 50, "ignore_eos": True})
    assert json.loads(body)["usage"]["completion_tokens"] == 50
    code, body = http(
        sim.url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30, "min_tokens": 30},
    )
    assert json.loads(body)["usage"]["completion_tokens"] == 30


def _sse_text(raw: bytes) -> str:
    """The concatenated text of an SSE completion/chat stream."""
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                text += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return text


def test_output_is_the_greedy_reference(start_sim):
    """Same prompt, same tokens (streamed or not, whatever the request order): sim/text.py's function."""
    from servelab.sim.text import greedy_text

    sim = start_sim(*QWEN, "--served-model-name", "qwen-sim")
    url = sim.url + "/v1/completions"
    prompt = "Write one sentence about the sea."
    body = {"model": "qwen-sim", "prompt": prompt, "max_tokens": 12, "ignore_eos": True}
    http(url, {**body, "prompt": "another prompt first"})  # request ids must not matter
    d = json.loads(http(url, body)[1])
    assert d["choices"][0]["text"] == greedy_text("qwen-sim", prompt, 12)
    _, raw = http(url, {**body, "stream": True})
    assert _sse_text(raw) == greedy_text("qwen-sim", prompt, 12)
    msgs = [{"role": "user", "content": prompt}]
    chat = {"model": "qwen-sim", "messages": msgs, "max_tokens": 7, "ignore_eos": True}
    d = json.loads(http(sim.url + "/v1/chat/completions", chat)[1])
    assert d["choices"][0]["message"]["content"] == greedy_text("qwen-sim", msgs, 7)
    _, raw = http(sim.url + "/v1/chat/completions", {**chat, "stream": True})
    assert _sse_text(raw) == greedy_text("qwen-sim", msgs, 7)
    assert http(sim.url + "/v1/chat/completions", {**chat, "messages": ["hi"]})[0] == 400
    # A shorter answer is a prefix of the longer one (as an EOS draw cuts it); garbage is not it.
    d = json.loads(http(url, {**body, "max_tokens": 5})[1])
    assert greedy_text("qwen-sim", prompt, 12).startswith(d["choices"][0]["text"])
    assert len(d["choices"][0]["text"].split()) == 5
    sim2 = start_sim(*QWEN, "--served-model-name", "qwen-sim", "--fault", "garbage")
    d = json.loads(http(sim2.url + "/v1/completions", body)[1])
    assert d["choices"][0]["text"] != greedy_text("qwen-sim", prompt, 12)
    assert "!!!!" in d["choices"][0]["text"]


def test_sglang_readiness_and_logs(start_sim):
    sim = start_sim(*QWEN, "--personality", "sglang", speed=20, fast=False, wait=False)
    port = _wait_port_line(sim.err, sim.proc, 30)
    assert port
    sim.port = port
    assert http(sim.url + "/health")[0] == 503  # port open, not ready yet
    assert http(sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 503
    wait_healthy(sim, 60)
    logs = sim.err.read_text()
    for needle in (
        "server_args=ServerArgs(model_path='Qwen3-8B'",
        "Load weight end. type=Qwen3ForCausalLM",
        "KV Cache is allocated. #tokens:",
        "Capture cuda graph begin",
        "The server is fired up and ready to roll!",
    ):
        assert needle in logs
    info = json.loads(http(sim.url + "/get_server_info")[1])
    assert info["tp_size"] == 1 and info["max_total_num_tokens"] > 0
    assert json.loads(http(sim.url + "/server_info")[1])["tp_size"] == 1
    assert "sglang:num_running_reqs" in http(sim.url + "/metrics")[1].decode()


def test_vllm_port_closed_until_ready(start_sim):
    port = free_port()
    sim = start_sim(*QWEN, port=port, speed=20, fast=False, wait=False)
    time.sleep(0.5)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    wait_healthy(sim, 60)


def _bind(port: int, reuse_port: bool) -> socket.socket:
    s = socket.socket()
    if reuse_port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", port))
    return s


def test_vllm_shares_its_port_sglang_does_not(start_sim):
    """vLLM binds with SO_REUSEPORT (before its engine starts): a second vLLM on the same port starts
    silently and shares it; SGLang's uvicorn socket has SO_REUSEADDR only."""
    port = free_port()
    first = start_sim(*QWEN, port=port, speed=20, fast=False, wait=False)
    assert _wait_port_line(first.err, first.proc, 30) == port
    # Bound while the engine still starts: a plain server cannot take the port, a reuse-port one can.
    with pytest.raises(OSError):
        _bind(port, reuse_port=False).close()
    _bind(port, reuse_port=True).close()
    wait_healthy(first, 60)
    second = start_sim(*QWEN, port=port)  # no "address already in use": both serve port `port`
    assert second.port == port and first.proc.poll() is None and second.proc.poll() is None
    assert "address already in use" not in second.logs().lower()
    sg = start_sim(*QWEN, "--personality", "sglang")
    with pytest.raises(OSError):
        _bind(sg.port, reuse_port=True).close()
    clash = start_sim(*QWEN, "--personality", "sglang", port=port, wait=False)
    assert clash.proc.wait(30) == 1 and "address already in use" in clash.err.read_text()


def test_sm120_backend_replacement_and_nsa(start_sim):
    sim = start_sim(
        *GLM, "--personality", "sglang", "--moe-runner-backend", "flashinfer_trtllm", "--disable-radix-cache"
    )
    logs = sim.err.read_text()
    assert "Use flashinfer_cutlass as MoE runner backend on SM120" in logs
    assert "moe_runner_backend='flashinfer_cutlass'" in logs
    assert "tp_size=8" in logs
    assert json.loads(http(sim.url + "/get_server_info")[1])["moe_runner_backend"] == "flashinfer_cutlass"


def test_nsa_crash_without_disable_radix_cache(start_sim):
    sim = start_sim(*GLM, "--personality", "sglang", wait=False)
    assert sim.proc.wait(30) == 1
    assert "NSA attention on sm120 requires --disable-radix-cache" in sim.logs()


@pytest.mark.parametrize("personality", ["vllm", "sglang"])
def test_unknown_engine_flag(start_sim, personality):
    sim = start_sim(*QWEN, "--personality", personality, "--frobnicate", wait=False)
    assert sim.proc.wait(30) == 2
    prog = "vllm serve" if personality == "vllm" else "launch_server.py"
    assert f"{prog}: error: unrecognized arguments: --frobnicate" in sim.err.read_text()


@pytest.mark.parametrize(
    ("fault", "needle"),
    [
        ("cuda_init", "Error 802: system not yet initialized"),
        ("oom_init", "torch.OutOfMemoryError: CUDA out of memory"),
        ("worker_init", "WorkerProc initialization failed"),
        ("port_in_use", "address already in use"),
        ("nccl_shm", "Error while creating shared memory segment /dev/shm/nccl-"),
    ],
)
def test_startup_crashes(start_sim, fault, needle):
    sim = start_sim(*QWEN, "--fault", fault, wait=False)
    assert sim.proc.wait(30) == 1
    assert needle in sim.err.read_text()


def test_infeasible_layout_fails_like_oom(start_sim):
    sim = start_sim(
        "--model", "GLM-5-NVFP4", "--gpu", "rtx-pro-6000", "--num-gpus", "2", "--tp", "2", wait=False
    )
    assert sim.proc.wait(30) == 1
    assert "CUDA out of memory" in sim.err.read_text()


@pytest.mark.parametrize("fast", [True, False])
def test_slow_start(start_sim, fast):
    """`slow_start:S` holds readiness back by S model seconds (S / speed wall seconds) in the CUDA-graph
    phase, and the log reports the longer capture; it applies with --fast-start too."""
    t0 = time.monotonic()
    sim = start_sim(
        *QWEN, "--personality", "sglang", "--fault", "slow_start:100", speed=50, fast=fast, wait=False
    )
    port = _wait_port_line(sim.err, sim.proc, 30)
    assert port
    sim.port = port
    assert http(sim.url + "/health")[0] == 503  # up, but capturing CUDA graphs
    wait_healthy(sim, 60)
    assert time.monotonic() - t0 >= 100 / 50
    capture = next(ln for ln in sim.err.read_text().splitlines() if "Capture cuda graph end." in ln)
    assert float(capture.split("Time elapsed: ")[1].split(" s.")[0]) == pytest.approx(112.0)  # 12 + 100
    assert http(sim.url + "/v1/completions", {"prompt": "a", "max_tokens": 2})[0] == 200


def test_real_port_conflict(start_sim):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        sim = start_sim(*QWEN, port=s.getsockname()[1], wait=False)
        assert sim.proc.wait(30) == 1
    assert "address already in use" in sim.err.read_text()


def test_hang(start_sim):
    sim = start_sim(*QWEN, "--fault", "hang", wait=False)
    sim.port = _wait_port_line(sim.err, sim.proc, 30)
    with pytest.raises((TimeoutError, OSError)):
        http(sim.url + "/health", timeout=1.0)


def test_die_after_ready_vllm(start_sim):
    sim = start_sim(*QWEN, "--fault", "die_after_ready:1")
    assert http(sim.url + "/v1/completions", {"prompt": "a", "max_tokens": 3})[0] == 200
    code, body = http(sim.url + "/v1/completions", {"prompt": "a", "max_tokens": 3})
    assert code == 500 and b"EngineCore encountered an issue" in body
    assert "EngineDeadError" in sim.err.read_text()
    assert http(sim.url + "/health")[0] == 503


def test_die_after_ready_sglang_exits(start_sim):
    """SGLang kills its own process tree on a child's SIGQUIT: the request gets no answer at all (not
    vLLM's EngineCore error), and the server is gone at once."""
    sim = start_sim(*QWEN, "--personality", "sglang", "--fault", "die_after_ready:0")
    t0 = time.monotonic()
    with pytest.raises(OSError):  # the connection drops: no HTTP answer (urllib's HTTPError is not one)
        http(sim.url + "/v1/completions", {"prompt": "a", "max_tokens": 3}, timeout=5)
    assert sim.proc.wait(10) == 1
    assert time.monotonic() - t0 < 3
    err = sim.err.read_text()
    assert "Received sigquit from a child process" in err and "EngineCore" not in err


def test_worker_init_fails_in_each_engines_words(start_sim):
    from servelab.engines import signatures

    vllm = start_sim(*QWEN, "--fault", "worker_init", wait=False)
    sglang = start_sim(*QWEN, "--personality", "sglang", "--fault", "worker_init", wait=False)
    assert vllm.proc.wait(30) == 1 and sglang.proc.wait(30) == 1
    v, s = vllm.err.read_text(), sglang.err.read_text()
    assert "WorkerProc initialization failed" in v and "Scheduler hit an exception" not in v
    assert "Scheduler hit an exception" in s and "Received sigquit from a child process" in s
    assert "WorkerProc" not in s and "Engine core" not in s
    # the same root cause, read from each engine's own words
    assert signatures.diagnose(s, "sglang").klass == signatures.diagnose(v, "vllm").klass == "nccl_error"


def _stream(url: str, timeout: float = 3.0) -> bytes:
    body = json.dumps({"prompt": "a b", "max_tokens": 10, "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=timeout)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % len(body)
        + body
    )
    out = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            out += data
            if out.endswith(b"0\r\n\r\n"):
                break
    except TimeoutError:
        out += b"<timeout>"
    except ConnectionResetError:
        out += b"<reset>"
    finally:
        s.close()
    return out


def test_stream_faults(start_sim):
    sim = start_sim(*QWEN, "--fault", "stall_stream:3")
    out = _stream(sim.url, timeout=2.0)
    assert out.count(b'"text":') == 3 and out.endswith(b"<timeout>")
    sim = start_sim(*QWEN, "--fault", "drop_stream:2")
    out = _stream(sim.url)
    assert out.count(b'"text":') == 2 and b"[DONE]" not in out
    sim = start_sim(*QWEN, "--fault", "malformed_sse:1")
    out = _stream(sim.url)
    assert b'"text": oops' in out and b"[DONE]" in out
    sim = start_sim(*QWEN, "--fault", "garbage")
    out = _stream(sim.url)
    assert out.count(b"!!!!!!!!") == 10


def test_orphan_left_behind(start_sim):
    sim = start_sim(*QWEN, "--fault", "orphan")
    line = next(ln for ln in sim.out.read_text().splitlines() if "Started engine core process" in ln)
    child = int(line.rsplit("pid=", 1)[1])
    try:
        os.killpg(sim.proc.pid, signal.SIGKILL)
        sim.proc.wait(5)
        time.sleep(0.2)
        os.kill(child, 0)  # still alive: the orphan a teardown must find
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_allreduce_fusion_collapse_and_power(start_sim):
    sim = start_sim(
        *GLM,
        "--personality",
        "sglang",
        "--disable-radix-cache",
        "--enable-flashinfer-allreduce-fusion",
        speed=20,
    )
    assert json.loads(http(sim.url + "/servelab/state")[1])["allreduce_collapse"] is True
    idle = json.loads(http(sim.url + "/servelab/gpus")[1])["gpus"]
    assert all(g["power_w"] == pytest.approx(34, abs=1) for g in idle)
    t = time.monotonic()
    code, _ = http(
        sim.url + "/v1/completions", {"prompt": "a b", "max_tokens": 40, "ignore_eos": True}, timeout=30
    )
    assert code == 200
    # ~40 tokens × 8 × ~20 ms / speed 20
    assert time.monotonic() - t > 40 * 8 * 0.015 / 20
    gpus = json.loads(http(sim.url + "/servelab/gpus")[1])["gpus"]
    assert len(gpus) == 8 and all(80 < g["power_w"] <= 126 for g in gpus)


@pytest.mark.slow
def test_fidelity_at_speed_one(start_sim, tmp_path):
    """Measured with `servelab bench` at speed 1: median TTFT and TPOT within 5 % of `predict`."""
    from servelab.model.predict import Workload, evaluate, make_setup

    # The simulator on one core and the client on the others, as any latency measurement should be:
    # at speed 1 a step that starts late (because the client took the core) is a timing error.
    all_cpus = sorted(os.sched_getaffinity(0))
    pin = ["--cpu", str(all_cpus[0])] if len(all_cpus) >= 2 else []
    client_cpus = set(all_cpus[1:]) if len(all_cpus) >= 2 else None
    # Predict with the factors the simulator starts with (read just before it).
    setup = make_setup("Qwen3-8B", "h100-sxm", 1, engine="vllm")
    pred = {c: evaluate(setup, Workload(256, 32, c)) for c in (1, 16, 64)}
    sim = start_sim(*QWEN, *pin, speed=1)
    # Several waves per level at c=16 and c=64; c=1 needs few requests.
    for conc, n in ((1, 16), (16, 96), (64, 256)):
        d = run_bench(
            sim.url,
            "Qwen3-8B",
            tmp_path,
            "--concurrency",
            str(conc),
            "--num-requests",
            str(n),
            "--input-len",
            "256",
            "--output-len",
            "32",
            cpus=client_cpus,
        )
        lv = d["levels"][0]
        s = lv["summary"]
        p = pred[conc]
        assert s["failed"] == 0
        print(
            f"c={conc}: TTFT {s['ttft_ms']['p50']:.2f} vs {p.ttft_ms:.2f} ms, TPOT {s['tpot_ms']['p50']:.3f} vs {p.tpot_ms:.3f} ms"
        )
        # TTFT also holds the HTTP round trip and the box's scheduling, which the model does not predict:
        # 5 %, or 2.5 ms at c=1 where the whole TTFT is ~15 ms (a loaded 2-core box added 2.2 ms there)
        assert s["ttft_ms"]["p50"] == pytest.approx(p.ttft_ms, rel=0.05, abs=2.5), lv["label"]
        assert s["tpot_ms"]["p50"] == pytest.approx(p.tpot_ms, rel=0.05), lv["label"]


@pytest.mark.parametrize(
    ("personality", "needle"),
    [("sglang", "port={port},"), ("vllm", "API server 0 on http://127.0.0.1:{port}")],
)
def test_port_0_logs_the_bound_port_in_the_engine_log(tmp_path: Path, personality: str, needle: str) -> None:
    """`--port 0`: the engine's own log (server_args / non-default args) names the port it bound, not the
    engine's default, and not only the `SIM-PORT N` line on stderr."""
    from tests.support.simruns import start_sim

    sim = start_sim(
        tmp_path, "--model", "Qwen3-8B", "--gpu", "h100-sxm", "--num-gpus", "1", "--personality", personality
    )
    try:
        log = (tmp_path / "sim0.out").read_text() + sim.err.read_text()
    finally:
        sim.stop()
    assert needle.format(port=sim.port) in log, log[-3000:]
    assert "port=30000" not in log and "'port': 8000" not in log
