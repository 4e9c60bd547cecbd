"""The simulator's personalities as data: the loader, a third personality made of a TOML table only,
the architecture class from the HF config, and GET /servelab/info (servers run in-process)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
import pytest

from servelab.cli.sim import build_config
from servelab.sim.app import compose
from servelab.sim.personalities import (
    Personality,
    PersonalityError,
    builtin_personalities,
    get_personality,
    load_personalities,
    parse_engine_args,
    parse_personalities,
)
from servelab.sim.render import render_metrics
from servelab.sim.server import SimConfig, SimServer, effective
from servelab.sim.startup import architecture_class, context, hf_config

BASE: dict[str, Any] = {
    "model": "Qwen3-8B",
    "gpu": "h100-sxm",
    "num_gpus": 4,
    "tp": None,
    "pp": None,
    "ep": None,
    "dp": None,
    "quant": None,
    "personality": "vllm",
    "host": "127.0.0.1",
    "port": 0,
    "speed": 1.0,
    "seed": 0,
    "faults": (),
    "fault_rate": 1.0,
    "fast_start": True,
    "eos_mean": 256.0,
    "cpu": None,
}

# A made-up third engine: nothing but a table (it borrows SGLang's flag dialect).
THIRD = """
[fakeserve]
version = "9.9.9"
flags = "sglang"
default_port = 9999
owned_by = "fakeserve-org"
reuse_port = false
dead_message = "fakeserve: the worker is gone"
shutdown = ["fakeserve says goodbye"]
lines = [
  ["boot", "0", "@bind"],
  ["boot", "0", "fakeserve {version} loading {model} as {architecture}"],
  ["worker", "0", "@engine"],
  ["worker", "load", "weights in"],
  ["worker", "0", "@weights"],
  ["worker", "kv", "kv cache: {kv_tokens} tokens"],
  ["raw", "0", "FAKESERVE READY on {port}"],
  ["raw", "0", "@ready"],
]

[fakeserve.defaults]
max_running = 77
max_batched_tokens = [[0, 1000], [70, 3000], [200, 5000]]
mem_fraction = 0.5
max_model_len = 4096

[fakeserve.refusals]
prompt = "fakeserve: {prompt} tokens do not fit in {max_model_len}"
total = "fakeserve: {prompt} + {max_tokens} = {total} tokens do not fit in {max_model_len}"
total_may_equal = true

[fakeserve.startup]
compile_s = 3.0
compile_needs_cuda_graph = false
nsa_radix_crash_sm = []

[fakeserve.log]
stream = "stdout"
date = "%H:%M"
line = "<{level}> {role}| {text}"

[fakeserve.log.roles]
boot = "boot"
worker = "w{rank}"

[fakeserve.periodic]
who = "boot"
text = "tick {running}/{waiting}"

[fakeserve.processes]
gpu_process = "fake-worker-{rank}"
gpu_process_single = "fake-solo"
engine_core = "fake-core"
engine_core_role = "boot"

[fakeserve.routes]
"/fake/version" = "version"
"/fake/about" = "server_info"

[fakeserve.metrics]
labels = 'served="{model}"'
rows = [
  {name = "fake:running", type = "gauge", help = "Running.", value = "running"},
  {name = "fake:answer", type = "gauge", help = "A constant.", value = 42},
]

[fakeserve.engine_dead]
prefix = "[fake] "
exit_code = 3
"""


def packaged_text() -> str:
    return resources.files("servelab.data").joinpath("sim/personalities.toml").read_text()


def cfg(personality: str = "vllm", argv: tuple[str, ...] = (), **kw: Any) -> SimConfig:
    c: SimConfig = build_config({**BASE, "personality": personality, **kw}, list(argv))
    return c


async def _http(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"{method} {path} HTTP/1.1\r\nHost: sim\r\nContent-Length: {len(body)}\r\n"
    writer.write(head.encode() + b"Content-Type: application/json\r\n\r\n" + body)
    await writer.drain()
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    data = await reader.readexactly(int(headers.get("content-length", "0")))
    writer.close()
    return status, data


def serve(c: SimConfig, requests: list[tuple[str, str, bytes]]) -> tuple[list[tuple[int, bytes]], str, int]:
    """Start a simulated server in this process, send the requests one by one, stop it.
    Returns the answers, what it logged, and its exit code."""

    async def go() -> tuple[list[tuple[int, bytes]], str, int]:
        log = io.StringIO()
        srv = compose(c, log_stream=log)
        task = asyncio.create_task(srv.main())
        for _ in range(2000):
            if srv.ready or task.done():
                break
            await asyncio.sleep(0.005)
        assert srv.ready, log.getvalue()
        out = [await _http(c.port, m, p, b) for m, p, b in requests]
        srv.stop()
        rc = await asyncio.wait_for(task, 10)
        return out, log.getvalue(), rc

    return asyncio.run(go())


# -- the loader ----------------------------------------------------------------------------------------


def test_builtin_personalities_are_typed():
    ps = builtin_personalities()
    assert list(ps) == ["vllm", "sglang"]
    v, s = ps["vllm"], ps["sglang"]
    assert isinstance(v, Personality) and v is get_personality("vllm")
    assert v.routes == {"/version": "version"}
    assert s.routes == {
        "/get_server_info": "server_info",
        "/server_info": "server_info",
        "/get_model_info": "model_info",
    }
    assert (v.owned_by, s.owned_by) == ("vllm", "sglang")
    assert (v.reuse_port, s.reuse_port) == (True, False)
    assert v.processes.on_gpu(0, 1) == "VLLM::EngineCore" and v.processes.on_gpu(3, 4) == "VLLM::Worker_TP3"
    assert (
        s.processes.on_gpu(0, 1) == "sglang::scheduler_TP0"
        and s.processes.engine_core == "sglang::scheduler_TP0"
    )
    assert (v.processes.engine_core_role, s.processes.engine_core_role) == ("engine", "main")
    assert v.compile_time(cuda_graph=True) == 25.0 and v.compile_time(cuda_graph=False) == 0.0
    assert s.compile_time(cuda_graph=True) == 0.0
    assert s.nsa_radix_crash_sm == (120,) and v.nsa_radix_crash_sm == ()
    assert (v.engine_dead.exit_code, s.engine_dead.exit_code) == (0, 1)
    assert v.defaults.max_running.pick(80) == 1024 and v.defaults.max_running.pick(48) == 256
    assert s.defaults.max_batched_tokens.pick(141) == 16384 and s.defaults.max_batched_tokens.pick(80) == 8192
    assert s.defaults.mem_fraction is None and v.defaults.mem_fraction == 0.9


def test_load_personalities_from_a_path(tmp_path: Path):
    path = tmp_path / "p.toml"
    path.write_text(packaged_text() + THIRD)
    ps = load_personalities(path)
    assert list(ps) == ["vllm", "sglang", "fakeserve"]
    assert ps["vllm"] == builtin_personalities()["vllm"]
    f = ps["fakeserve"]
    assert f.flags == "sglang" and f.default_port == 9999 and f.version == "9.9.9"
    assert f.defaults.max_running.pick(10) == 77
    assert [f.defaults.max_batched_tokens.pick(g) for g in (24, 80, 288)] == [1000, 3000, 5000]
    assert f.compile_time(cuda_graph=False) == 3.0
    assert f.log.format("worker", "hi", tp=2) == ["<INFO> w0| hi", "<INFO> w1| hi"]
    assert f.log.format("raw", "as is") == ["as is"]
    text = render_metrics(f, "m", {"running": 5}).decode()
    assert 'fake:running{served="m"} 5.0' in text and 'fake:answer{served="m"} 42.0' in text
    assert "vllm:" not in text and "sglang:" not in text


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('flags = "sglang"', 'flags = "tgi"', "unknown flag dialect 'tgi'"),
        ('"/fake/about" = "server_info"', '"/fake/about" = "nope"', "'/fake/about' -> 'nope'"),
        ('value = "running"}', 'value = "temperature"}', "'temperature' is not one of"),
        ('text = "tick {running}/{waiting}"', 'text = "tick {speed}"', "unknown placeholder(s) ['speed']"),
        ('["boot", "0", "@bind"]', '["nobody", "0", "@bind"]', "unknown role 'nobody'"),
        ('["worker", "load", "weights in"]', '["worker", "later", "weights in"]', "unknown delay 'later'"),
        ('owned_by = "fakeserve-org"\n', "", "fakeserve.owned_by: missing"),
        ("exit_code = 3", 'exit_code = "3"', "exit_code: expected an integer"),
    ],
)
def test_a_bad_personality_is_named(old: str, new: str, message: str):
    assert old in THIRD
    with pytest.raises(PersonalityError) as err:
        parse_personalities(THIRD.replace(old, new), "third.toml")
    assert message in str(err.value) and "third.toml" in str(err.value)


# -- a third personality runs: only its table differs --------------------------------------------------


def test_a_third_personality_needs_only_a_table(tmp_path: Path):
    path = tmp_path / "p.toml"
    path.write_text(packaged_text() + THIRD)
    fake = load_personalities(path)["fakeserve"]
    base = cfg("sglang", tp=2, num_gpus=3)
    args, _ = parse_engine_args(fake, ["--model-path", "Qwen3-8B", "--tp-size", "2"], sm=90, is_moe=False)
    c = dataclasses.replace(base, engine=args, persona=fake)
    assert effective(c).max_running == 77 and effective(c).mem_fraction == 0.5
    gen = orjson.dumps({"model": "Qwen3-8B", "prompt": "hello there", "max_tokens": 4})
    answers, log, rc = serve(
        c,
        [
            ("GET", "/v1/models", b""),
            ("GET", "/fake/version", b""),
            ("GET", "/fake/about", b""),
            ("GET", "/version", b""),
            ("GET", "/get_server_info", b""),
            ("GET", "/servelab/gpus", b""),
            ("GET", "/servelab/info", b""),
            ("POST", "/v1/completions", gen),
            ("GET", "/metrics", b""),
        ],
    )
    models, version, about, v_version, s_info, gpus, info, completion, metrics = answers
    assert orjson.loads(models[1])["data"][0]["owned_by"] == "fakeserve-org"
    assert orjson.loads(version[1]) == {"version": "9.9.9"}
    assert orjson.loads(about[1])["version"] == "9.9.9" and orjson.loads(about[1])["tp_size"] == 2
    assert v_version[0] == 404 and s_info[0] == 404  # the other engines' routes are theirs
    procs = [p["name"] for g in orjson.loads(gpus[1])["gpus"] for p in g["processes"]]
    assert procs == ["fake-worker-0", "fake-worker-1"]
    assert orjson.loads(info[1])["personality"] == "fakeserve"
    assert completion[0] == 200 and orjson.loads(completion[1])["usage"]["completion_tokens"] >= 1
    assert metrics[0] == 200 and b"fake:running" in metrics[1] and b"fake:answer" in metrics[1]
    lines = log.splitlines()
    assert "<INFO> boot| fakeserve 9.9.9 loading Qwen3-8B as Qwen3ForCausalLM" in lines
    assert "<INFO> w0| weights in" in lines and "<INFO> w1| weights in" in lines
    assert f"FAKESERVE READY on {c.port}" in lines
    assert lines[-1] == "fakeserve says goodbye" and rc == 0


# -- the architecture class comes from the HF config ------------------------------------------------------


def test_architecture_from_the_configs_own_field():
    assert architecture_class({"architectures": ["MyOwnForCausalLM"], "model_type": "llama"}, "llama") == (
        "MyOwnForCausalLM"
    )
    assert architecture_class({"model_type": "llama"}, "llama") == "LlamaForCausalLM"  # no field: mapping
    assert architecture_class(None, "brand_new") == "BrandNewForCausalLM"
    # Kimi K2.5's text model is a kimi_k2 (DeepSeek V3); the checkpoint's class is its own.
    assert hf_config("Kimi-K2.5") is not None
    srv_cfg = cfg("sglang", model="Kimi-K2.5", gpu="b200", num_gpus=8, tp=8)

    async def ctx() -> dict[str, Any]:
        return context(SimServer(srv_cfg, log_stream=io.StringIO()))

    assert asyncio.run(ctx())["architecture"] == "KimiK25ForConditionalGeneration"


def test_architecture_from_a_config_path(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"architectures": ["LocalForCausalLM"]}')
    assert hf_config(str(tmp_path)) == {"architectures": ["LocalForCausalLM"]}
    assert hf_config(str(tmp_path / "config.json")) == {"architectures": ["LocalForCausalLM"]}
    assert hf_config("no-such-model-anywhere") is None


# -- GET /servelab/info ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("personality", "speed", "argv"),
    [("vllm", 1.0, ("--served-model-name", "qwen")), ("sglang", 7.5, ("--served-model-name", "qwen"))],
)
def test_info_route(personality: str, speed: float, argv: tuple[str, ...]):
    c = cfg(personality, argv, speed=speed, tp=2, num_gpus=4, gpu="h100-sxm")
    answers, _, _ = serve(c, [("GET", "/servelab/info", b""), ("GET", "/servelab/state", b"")])
    (status, body), (_, state_body) = answers
    assert status == 200
    info, state = orjson.loads(body), orjson.loads(state_body)
    assert info["engine"] == "sim"
    assert info["personality"] == personality == state["personality"]
    assert info["model"] == "Qwen3-8B" and info["served_model_name"] == "qwen"
    assert info["host"] == {
        "gpu": "h100-sxm",
        "gpu_description": c.setup.host.gpu.description,
        "num_gpus": 4,
        "interconnect": c.setup.host.interconnect.name,
    }
    assert info["layout"] == {"tp": 2, "pp": 1, "ep": 1, "dp": 1}
    assert info["clock"]["speed"] == speed == state["speed"]
    assert info["engine_version"] == get_personality(personality).version
    assert info["effective"] == state["effective"]
    assert info["ready"] is True and info["dead"] is False
