"""The transformers reference runner: interpreter resolution, failures as errors, the verdict."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from servelab.errors import ConfigError, EngineError
from servelab.verify import hfref
from servelab.verify.calls import Completion


def test_reference_python_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as exc:
        hfref.resolve_python(tmp_path / "nope" / "python")
    assert "--reference-python" in exc.value.hint


def test_default_python_without_transformers_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # This interpreter without transformers, whether or not this venv has it: a None entry in sys.modules
    # is what Python itself uses to make a module unimportable (importlib.util.find_spec then answers None).
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match="cannot import transformers"):
        hfref.resolve_python(None)


def test_model_dir_needs_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a model directory"):
        hfref.check_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert hfref.check_model_dir(tmp_path) == tmp_path.resolve()


def test_a_reference_that_cannot_run_is_an_engine_error(tmp_path: Path) -> None:
    # This interpreter has no torch: the script itself reports the failure as JSON.
    req = {"model_dir": str(tmp_path), "max_tokens": 2, "items": [{"prompt": "x"}]}
    if importlib.util.find_spec("torch") is None:
        with pytest.raises(EngineError, match="ModuleNotFoundError"):
            asyncio.run(hfref.run_reference(sys.executable, req, timeout_s=60))
    else:  # pragma: no cover - a venv with torch: an empty directory fails to load instead
        with pytest.raises(EngineError, match="reference failed"):
            asyncio.run(hfref.run_reference(sys.executable, req, timeout_s=120))


def result(ids: list[int], forced: list[tuple[int, int, float]]) -> dict[str, Any]:
    return {
        "prompt_ids": [0, 4],
        "ids": ids,
        "text": " ".join(map(str, ids)),
        "tokens": [str(i) for i in ids],
        "engine_ids": [e for e, _, _ in forced],
        "engine_tokens": [str(e) for e, _, _ in forced],
        "retokenized": False,
        "forced": [
            {
                "pos": i,
                "engine_id": e,
                "ref_top_id": t,
                "gap": g,
                "rank": 0 if g == 0 else 3,
                "engine_text": str(e),
                "ref_top_text": str(t),
            }
            for i, (e, t, g) in enumerate(forced)
        ],
    }


def test_judge_pass_flip_and_fail() -> None:
    a = Completion("p", text="1 2", token_ids=[1, 2], prompt_token_ids=[0, 4])
    b = Completion("q", text="1 5", token_ids=[1, 5], prompt_token_ids=[0, 4])
    data = {
        "eos_ids": [9],
        "model_dir": "/m",
        "dtype": "bfloat16",
        "results": [result([1, 2], [(1, 1, 0.0), (2, 2, 0.0)]), result([1, 3], [(1, 1, 0.0), (5, 3, 0.01)])],
    }
    check = hfref.judge([a, b], data)
    assert check.ok and check.severity == "warning" and "positions 1" in check.detail
    data["results"][1] = result([1, 3], [(1, 1, 0.0), (5, 3, 0.7)])
    check = hfref.judge([a, b], data)
    assert check.failed
    assert "first divergence at token 1 of prompt 'q'" in check.detail and "0.700 nats" in check.detail
    assert check.evidence["prompts"][1]["first_rejected"]["pos"] == 1
