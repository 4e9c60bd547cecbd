"""Run reference.py with an interpreter that has torch + transformers, and judge the engine against it."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from servelab.errors import ConfigError, EngineError
from servelab.jsontypes import JsonObject, JsonValue
from servelab.verify.calls import Completion, Prompt
from servelab.verify.compare import DEFAULT_TOLERANCE, Verdict, verdict
from servelab.verify.result import Check

if TYPE_CHECKING:  # reference.py runs in another interpreter; its JSON's types only
    from servelab.verify.reference import Reply, Request, RequestItem

SCRIPT = Path(__file__).with_name("reference.py")
PYTHON_HINT = (
    "pass --reference-python PATH: a python with torch and transformers (e.g. the engine's venv/bin/python)"
)
DEFAULT_TIMEOUT_S = 900.0


def resolve_python(python: str | os.PathLike[str] | None) -> str:
    """The interpreter for the reference: the given one, else this one if it can import transformers."""
    if python:
        path = Path(python).expanduser()
        if not path.exists():
            raise ConfigError(f"--reference-python {path} does not exist", hint=PYTHON_HINT)
        return str(path)
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        return sys.executable
    raise ConfigError(
        f"{sys.executable} cannot import transformers and torch, which the hf reference needs",
        hint=PYTHON_HINT,
    )


def check_model_dir(path: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser().resolve()
    if not (p / "config.json").is_file():
        raise ConfigError(
            f"hf reference {p} is not a model directory (no config.json)",
            hint="use --reference hf:PATH with a local Hugging Face model directory (the served weights)",
        )
    return p


async def run_reference(python: str, request: Request, timeout_s: float = DEFAULT_TIMEOUT_S) -> Reply:
    """Run reference.py as a subprocess: JSON request on stdin, one JSON object on stdout (its `Reply`,
    once it says ok)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = await asyncio.create_subprocess_exec(
        python,
        str(SCRIPT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(request).encode()), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise EngineError(
            f"the transformers reference did not finish within {timeout_s:.0f}s",
            hint="use fewer/shorter prompts (--max-tokens) or a smaller model",
        ) from None
    try:
        data = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        data = {"ok": False, "error": err.decode(errors="replace")[-1500:] or f"exit code {proc.returncode}"}
    if not isinstance(data, dict):
        data = {"ok": False, "error": f"its last output line is not a JSON object: {str(data)[:200]}"}
    if not data.get("ok"):
        raise EngineError(
            f"the transformers reference failed: {data.get('error')}",
            hint=f"run it by hand: echo REQUEST_JSON | {python} {SCRIPT}; " + PYTHON_HINT,
        )
    return cast("Reply", data)  # its last line, a JSON object that says ok: reference.py's Reply


def build_request(
    model_dir: Path, answers: list[Completion], *, chat: bool, max_tokens: int, dtype: str = "auto"
) -> Request:
    items: list[RequestItem] = []
    for a in answers:
        item: RequestItem = {
            "prompt": a.prompt,
            "engine_ids": a.token_ids,
            "engine_text": None if a.token_ids is not None else a.text,
        }
        items.append(item)
    return {
        "model_dir": str(model_dir),
        "dtype": dtype,
        "max_tokens": max_tokens,
        "chat": chat,
        "add_special_tokens": True,
        "top": 5,
        "items": items,
    }


def judge(answers: list[Completion], data: Reply, *, tolerance: float = DEFAULT_TOLERANCE) -> Check:
    """The `reference` check from the engine's answers and reference.py's output (pure)."""
    eos = set(data.get("eos_ids") or [])
    per: list[JsonValue] = []
    verdicts: list[tuple[Verdict, Prompt]] = []
    for a, ref in zip(answers, data["results"], strict=True):
        engine_ids = ref.get("engine_ids") or []
        v = verdict(engine_ids, ref, eos, tolerance=tolerance, engine_prompt_ids=a.prompt_token_ids)
        verdicts.append((v, a.prompt))
        recorded: JsonObject = {
            **v.to_json(),
            "prompt": a.prompt,
            "engine_text": a.text,
            "reference_text": ref["text"],
            "retokenized": ref.get("retokenized", False),
        }
        per.append(recorded)
    failed = [(v, prompt) for v, prompt in verdicts if not v.ok]
    flips = [v for v, _ in verdicts if v.ok and v.first_divergence is not None]
    versions = data.get("versions")
    evidence: JsonObject = {
        "reference": data.get("model_dir"),
        "dtype": data.get("dtype"),
        "versions": None if versions is None else dict(versions),
        "tolerance_nats": tolerance,
        "prompts": per,
    }
    if failed:
        f, prompt = failed[0]
        return Check("reference", False, "error", _failure_detail(f, prompt, len(failed), len(per)), evidence)
    if flips:
        pos = ", ".join(str(v.first_divergence) for v in flips)
        return Check(
            "reference",
            True,
            "warning",
            f"{len(per)} prompts agree with the transformers reference under teacher forcing; {len(flips)} "
            f"greedy texts part at near-tied tokens (positions {pos}; largest gap "
            f"{max(v.max_gap for v in flips):.3f} nats ≤ {tolerance}): numerical noise, not wrong weights",
            evidence,
        )
    return Check(
        "reference",
        True,
        "info",
        f"all {len(per)} prompts match the transformers reference token for token",
        evidence,
    )


def _failure_detail(f: Verdict, prompt: Prompt, n_failed: int, n: int) -> str:
    head = f"{n_failed} of {n} prompts disagree with the transformers reference"
    if f.prompt_mismatch is not None:
        return (
            f"{head}: the server tokenized prompt {prompt!r} differently (first difference at prompt "
            f"token {f.prompt_mismatch.first_difference}): check BOS / chat template handling"
        )
    r = f.first_rejected
    assert r is not None  # a failed verdict with the prompt as the reference's has a rejected token
    return (
        f"{head}: first divergence at token {f.first_divergence} of prompt {prompt!r}; at token "
        f"{r.pos} the engine chose {r.engine.text or ''!r} (id {r.engine.id}) where the "
        f"reference's top is {r.reference.text or ''!r} (id {r.reference.id}), "
        f"{r.gap:.3f} nats below it (rank {r.rank})"
    )
