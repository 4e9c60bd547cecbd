"""The redaction rules (data/secrets.toml): flag/value pairs in both spellings, secret-looking environment
names, passwords inside URLs, and moving a launch's secrets from its argv into its environment."""

from __future__ import annotations

import pytest

from servelab.engines import registry
from servelab.engines.base import LaunchSpec, Settings
from servelab.errors import ConfigError
from servelab.redact import (
    MASK,
    externalize,
    is_secret_flag,
    is_secret_name,
    redact,
    redact_argv,
    redact_env,
    redact_text,
)


@pytest.mark.parametrize(
    "flag", ["--api-key", "--admin-api-key", "--hf-token", "-hft", "--token", "--hub-token"]
)
def test_secret_flags(flag: str) -> None:
    assert is_secret_flag(flag)


@pytest.mark.parametrize(
    "flag",
    ["--port", "--tokenizer", "--max-num-batched-tokens", "--return-tokens-as-token-ids", "--ssl-keyfile"],
)
def test_flags_that_are_not_secrets(flag: str) -> None:
    assert not is_secret_flag(flag)


def test_flag_value_pairs_and_the_equals_form() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "K1", "--api-key=K2", "--hf-token", "T", "--port", "8000"]
    assert redact_argv(argv) == [
        "vllm",
        "serve",
        "m",
        "--api-key",
        MASK,
        f"--api-key={MASK}",
        "--hf-token",
        MASK,
        "--port",
        "8000",
    ]
    # a switch whose name mentions tokens keeps the next flag
    assert redact_argv(["--return-tokens-as-token-ids", "--port", "1"]) == [
        "--return-tokens-as-token-ids",
        "--port",
        "1",
    ]
    # a list of strings anywhere in a stored document is read as an argv
    assert redact({"args": ["--api-key", "K"], "n": 1}) == {"args": ["--api-key", MASK], "n": 1}


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "VLLM_API_KEY",
        "MY_CREDENTIALS",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "api_key",
        "token",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "TOKENIZERS_PARALLELISM",
        "SSH_AUTH_SOCK",
        "PWD",
        "NCCL_DEBUG",
        "CUDA_VISIBLE_DEVICES",
        "key",
        "max_tokens",
    ],
)
def test_names_that_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


def test_environment_and_url_passwords() -> None:
    env = {"MY_CREDENTIALS": "c", "DB_URL": "postgres://u:PASS@h/db", "NCCL_DEBUG": "WARN", "EMPTY_TOKEN": ""}
    assert redact_env(env) == {
        "MY_CREDENTIALS": MASK,
        "DB_URL": f"postgres://u:{MASK}@h/db",
        "NCCL_DEBUG": "WARN",
        "EMPTY_TOKEN": "",
    }
    assert redact({"key": "tp_size", "env": env})["env"]["MY_CREDENTIALS"] == MASK
    assert redact({"key": "tp_size"}) == {"key": "tp_size"}  # the mismatch tables' "key" is data
    assert redact_text("see https://bob@h/x and https://h/x") == "see https://bob@h/x and https://h/x"


def test_free_text() -> None:
    text = "cmd --api-key K --hf-token=T MY_CREDENTIALS=c DB_URL=postgres://u:P@h/db --port 1 Bearer abcdefgh"
    assert redact_text(text) == (
        f"cmd --api-key {MASK} --hf-token={MASK} MY_CREDENTIALS={MASK} DB_URL=postgres://u:{MASK}@h/db "
        f"--port 1 Bearer {MASK}"
    )


def _launch(engine: str, *extra: str, model: str = "m", **options: object) -> LaunchSpec:
    return registry.get(engine).command(
        Settings(model=model, port=8123, extra_args=extra, env={"NCCL_DEBUG": "WARN"}, options=dict(options))
    )


def test_a_launch_gets_its_secrets_through_the_environment() -> None:
    moved = externalize(_launch("vllm", "--api-key", "K1", "--hf-token=T", "--max-num-seqs", "8"), "vllm")
    assert moved.api_key == "K1"
    assert moved.spec.env == {"NCCL_DEBUG": "WARN", "VLLM_API_KEY": "K1", "HF_TOKEN": "T"}
    assert not any(s in a for a in moved.spec.argv for s in ("K1", "api-key", "hf-token", "T"))
    assert moved.spec.argv[-2:] == ["--max-num-seqs", "8"]
    sim = externalize(_launch("sim", "--api-key=K2", model="GLM-5-NVFP4", gpu="h100-sxm", num_gpus=8), "sim")
    assert (
        sim.api_key == "K2"
        and sim.spec.env["SERVELAB_SIM_API_KEY"] == "K2"
        and "K2" not in " ".join(sim.spec.argv)
    )
    # a key set directly in the variable the engine reads is the one our requests send
    direct = LaunchSpec(["vllm", "serve", "m"], {"VLLM_API_KEY": "K3"}, "127.0.0.1", 1, "m")
    assert externalize(direct, "vllm").api_key == "K3"
    assert externalize(_launch("vllm"), "vllm").api_key is None


def test_a_secret_the_engine_only_takes_on_argv_is_refused() -> None:
    with pytest.raises(ConfigError, match="sglang takes `--api-key` only on its command line") as exc:
        externalize(_launch("sglang", "--api-key", "K"), "sglang")
    assert "K" not in exc.value.message.replace("--api-key", "")
    assert redact_text(exc.value.message) == exc.value.message  # the CLI prints it redacted: nothing lost
    with pytest.raises(ConfigError, match="URL with a password") as url:
        externalize(_launch("vllm", "--kv-transfer-url", "redis://u:SECRET@h"), "vllm")
    assert "SECRET" not in url.value.message
