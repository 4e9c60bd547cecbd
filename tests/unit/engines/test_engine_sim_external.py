"""The simulator adapter (argv, delegation, a real launch) and the external endpoint adapter."""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from tests.support.engines import free_port

from servelab.engines import registry
from servelab.engines.base import Settings
from servelab.engines.external import ENGINE as EXTERNAL
from servelab.engines.sim import ENGINE as SIM
from servelab.errors import ConfigError


def _sim_settings(**kw: object) -> Settings:
    base: dict[str, object] = {
        "model": "GLM-5-NVFP4",
        "tp": 8,
        "options": {
            "gpu": "rtx-pro-6000",
            "num_gpus": 8,
            "personality": "sglang",
            "fast_start": True,
            "seed": 3,
        },
        "extra_args": ("--moe-runner-backend", "flashinfer_trtllm", "--disable-radix-cache"),
    }
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


def test_sim_command() -> None:
    spec = SIM.command(
        _sim_settings(max_concurrency=64, options={"gpu": "h100-sxm", "num_gpus": 8, "faults": ["oom_init"]})
    )
    a = spec.argv
    assert a[:4] == [sys.executable, "-m", "servelab", "sim"]
    assert a[a.index("--gpu") + 1] == "h100-sxm" and a[a.index("--personality") + 1] == "vllm"
    assert a[a.index("--fault") + 1] == "oom_init"
    assert a[a.index("--max-num-seqs") + 1] == "64"  # vLLM spelling for the vLLM personality
    s = SIM.command(_sim_settings(max_concurrency=64))
    assert s.argv[s.argv.index("--max-running-requests") + 1] == "64" and "--fast-start" in s.argv
    with pytest.raises(ConfigError, match=r"options\.gpu"):
        SIM.command(Settings(model="m"))
    with pytest.raises(ConfigError, match="personality"):
        SIM.command(Settings(model="m", options={"gpu": "h100-sxm", "personality": "trt"}))


def test_sim_delegates_to_its_personality(log: Callable[[str], str]) -> None:
    assert SIM.requested(_sim_settings())["moe_runner_backend"] == "flashinfer_trtllm"
    assert (
        SIM.effective_config(log("sim_sglang_glm5_tp8.log")).effective["moe_runner_backend"]
        == "flashinfer_cutlass"
    )
    assert SIM.effective_config(log("sim_vllm_glm5_tp8.log")).effective["max_running_requests"] == 64


@pytest.mark.integration
def test_sim_adapter_argv_really_starts_a_ready_server(tmp_path: object) -> None:
    """The adapter's argv, run for real: /health turns 200 and the log parses to what was asked."""
    port = free_port()
    spec = SIM.command(_sim_settings(port=port, options={**_sim_settings().options, "speed": 50}))
    log_path = tmp_path / "sim.log"  # type: ignore[operator]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(spec.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", SIM.readiness.health_path or "/health")
                status = conn.getresponse().status
                conn.close()
                if status in SIM.readiness.ready_status:
                    break
            except OSError:
                pass  # not bound yet
            time.sleep(0.2)
        assert status == 200, log_path.read_text()  # type: ignore[union-attr]
        eff = SIM.effective_config(log_path.read_text())  # type: ignore[union-attr]
        req = SIM.requested(_sim_settings(port=port))
        assert eff.effective["port"] == port == req["port"]
        assert eff.effective["tp_size"] == req["tp_size"] == 8
        assert eff.effective["disable_radix_cache"] is True
        assert eff.effective["moe_runner_backend"] != req["moe_runner_backend"]  # SM120 fallback, caught
    finally:
        proc.terminate()
        proc.wait(10)


def test_external_returns_an_empty_argv() -> None:
    spec = EXTERNAL.command(
        Settings(model="m", served_model_name="served", options={"url": "https://10.1.2.3:8443/"})
    )
    assert spec.argv == [] and spec.external
    assert spec.url == "https://10.1.2.3:8443" and spec.served_model == "served"
    assert EXTERNAL.command(Settings(model="m", options={"url": "http://h"})).port == 80
    assert EXTERNAL.readiness.health_path is None and EXTERNAL.readiness.check_models


@pytest.mark.parametrize("url", [None, "10.0.0.1:8000", "ftp://x", "http://h:notaport"])
def test_external_bad_url(url: str | None) -> None:
    with pytest.raises(ConfigError):
        EXTERNAL.command(Settings(model="m", options={"url": url} if url else {}))


def test_registry_unknown_name_lists_the_known_ones() -> None:
    from servelab.errors import NotFoundError

    with pytest.raises(NotFoundError) as exc:
        registry.get("tensorrt")
    assert "vllm" in exc.value.hint and "sglang" in exc.value.hint and "llamacpp" in exc.value.hint


def test_every_builtin_is_an_engine() -> None:
    from servelab.engines.base import Engine

    assert registry.names() == ["external", "llamacpp", "sglang", "sim", "transformers", "vllm"]
    for name in registry.names():
        engine = registry.get(name)
        assert isinstance(engine, Engine) and engine.name == name
        assert engine.startup_timeout_s > 0
        assert isinstance(engine.info_paths(), tuple)
