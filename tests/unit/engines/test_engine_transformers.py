"""transformers serve adapter: argv, readiness rule, its (small) log."""

from __future__ import annotations

import pytest

from servelab.engines.base import Settings
from servelab.engines.transformers import ENGINE
from servelab.errors import ConfigError

# The first lines of a real `transformers serve` 5.19 log (tests/support/engines.transformers_server).
REAL_LOG = """[transformers] Loading /work/main/.cache/tiny-models/qwen3@main
INFO:     Started server process [1947]
INFO:     Waiting for application startup.
INFO:     Application startup complete.
INFO:     Uvicorn running on http://127.0.0.1:40049 (Press CTRL+C to quit)
"""


def test_command_matches_how_the_tests_start_it() -> None:
    spec = ENGINE.command(
        Settings(model="/m", port=9000, options={"python": "/e/bin/python", "device": "cpu"})
    )
    assert spec.argv == [
        "/e/bin/python", "-m", "transformers.cli.transformers", "serve", "--device", "cpu",
        "--host", "127.0.0.1", "--port", "9000", "/m",
    ]  # fmt: skip
    assert spec.served_model == "/m"


@pytest.mark.parametrize("bad", [{"tp": 2}, {"served_model_name": "other"}])
def test_impossible_settings(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ENGINE.command(Settings(model="/m", **bad))  # type: ignore[arg-type]


def test_readiness_needs_a_warmup_request() -> None:
    assert ENGINE.readiness.warmup_request is True
    assert ENGINE.readiness.check_models is False
    assert ENGINE.capabilities.metrics_path is None


def test_effective_and_requested() -> None:
    eff = ENGINE.effective_config(REAL_LOG)
    assert eff.effective == {
        "model": "/work/main/.cache/tiny-models/qwen3",
        "served_model_name": "/work/main/.cache/tiny-models/qwen3",
        "port": 40049,
    }
    req = ENGINE.requested(
        Settings(model="/work/main/.cache/tiny-models/qwen3", extra_args=("--dtype", "bfloat16"))
    )
    assert req == {
        "model": "/work/main/.cache/tiny-models/qwen3",
        "served_model_name": "/work/main/.cache/tiny-models/qwen3",
        "dtype": "bfloat16",
    }
