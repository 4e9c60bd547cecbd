"""`verify_output`: does the server give right answers? Probes, repeats, concurrency, references."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import orjson

from servelab.bench.client import Client
from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject, JsonValue
from servelab.verify import garbage, hfref, known, simref
from servelab.verify.calls import Caller, Completion
from servelab.verify.compare import DEFAULT_TOLERANCE
from servelab.verify.determinism import judge_concurrent, judge_repeats
from servelab.verify.result import Check, VerifyResult

# Greedy probes: plain text any tokenizer handles; their answers feed determinism, garbage and references.
PROBES: tuple[str, ...] = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colors are",
)
REFERENCE_HINT = "use --reference auto, none, sim, or hf:PATH (a local Hugging Face model directory)"


@dataclass(frozen=True)
class Reference:
    """What the server's answers are compared with: nothing, the simulator's text, or transformers."""

    kind: str  # "auto" (resolved against the server) | "none" | "sim" | "hf"
    path: Path | None = None

    def __str__(self) -> str:
        return f"hf:{self.path}" if self.kind == "hf" else self.kind


def parse_reference(spec: str | None) -> Reference:
    if spec in (None, "", "auto"):
        return Reference("auto")
    if spec == "none":
        return Reference("none")
    if spec == "sim":
        return Reference("sim")
    if spec.startswith("hf:") and len(spec) > 3:
        return Reference("hf", hfref.check_model_dir(spec[3:]))
    raise ConfigError(f"unknown reference {spec!r}", hint=REFERENCE_HINT)


def resolve_known(spec: str | None, reference: Reference) -> known.AnswerSet | None:
    """`auto`: the default set only when there is no reference (a reference defines "right" itself,
    and the simulator and tiny test models know nothing); `none`; `default`; or a file."""
    if spec in (None, "auto"):
        return known.load(known.DEFAULT_SET) if reference.kind == "none" else None
    if spec == "none":
        return None
    return known.load(spec)


async def pick_reference(client: Client) -> tuple[Reference, str]:
    """`--reference auto`: the reference that fits the engine behind `client`, and why.

    servelab's simulator says what it is at `GET /servelab/info` (`"engine": "sim"`); its answers are a
    pure function of (model, prompt), so its own text is the reference (a real model's known answers
    would fail it 8 of 8). Any other server (vLLM, SGLang, ...) gets no reference, so `--known-answers
    auto` runs the default set: a real model's knowledge is the yardstick."""
    res = await client.get("/servelab/info")
    engine = None
    if res.status == 200:
        try:
            info = orjson.loads(res.body)
        except orjson.JSONDecodeError:
            info = None
        if isinstance(info, dict):
            engine = info.get("engine")
    if engine == "sim":
        return Reference("sim"), (
            "reference auto: sim, because GET /servelab/info says the server is servelab's simulator"
        )
    return Reference("none"), (
        "reference auto: none (the server is not servelab's simulator; GET /servelab/info answered "
        f"{res.status or 'nothing'}), so the known answers are the yardstick; pass --reference hf:PATH "
        "to compare with transformers on the same weights"
    )


async def verify_output(
    url: str,
    model: str,
    *,
    api: str = "completions",
    reference: str | Reference | None = "auto",
    known_answers: str | None = "auto",
    api_key: str | None = None,
    reference_python: str | None = None,
    reference_dtype: str = "auto",
    max_tokens: int = 16,
    repeats: int = 3,
    concurrency: int = 8,
    tolerance: float = DEFAULT_TOLERANCE,
    prompts: list[str] | None = None,
    timeout_s: float = 120.0,
) -> VerifyResult:
    """Run every output check against one server; raises ServerError when it cannot be used at all.

    Checks: `requests` (all answered), `determinism` (lone repeats, error on mismatch),
    `batch_invariance` (concurrent vs lone, a warning), `garbage` (heuristics), `known_answers` and
    `reference` (when selected).
    """
    if api not in ("completions", "chat"):
        raise ConfigError(f"--api {api!r} is not completions or chat")
    if max_tokens < 1 or repeats < 2 or concurrency < 1:
        raise ConfigError("--max-tokens and --concurrency must be ≥ 1 and --repeats ≥ 2")
    ref = reference if isinstance(reference, Reference) else parse_reference(reference)
    python = hfref.resolve_python(reference_python) if ref.kind == "hf" else None
    try:
        client = Client(url, api_key=api_key, timeout_s=timeout_s)
    except ValueError as exc:
        raise ConfigError(
            str(exc), hint="--url takes the server's base URL, e.g. http://127.0.0.1:8000"
        ) from exc
    picked: str | None = None
    if ref.kind == "auto":
        ref, picked = await pick_reference(client)
    answer_set = resolve_known(known_answers, ref)
    probes = list(prompts or PROBES)
    result = VerifyResult(
        url, model, api, reference=str(ref), known_answers=answer_set.name if answer_set else "none"
    )
    if picked:
        result.notes.append(picked)
    caller = Caller(client, model, api, max_tokens)
    try:
        alone = [await caller.complete(p) for p in probes]
        reps = [alone[0]] + [await caller.complete(probes[0]) for _ in range(repeats - 1)]
        busy_prompts = [probes[i % len(probes)] for i in range(max(concurrency, 2))]
        busy = list(await asyncio.gather(*(caller.complete(p) for p in busy_prompts)))
        known_pairs: list[tuple[known.Item, Completion]] = []
        if answer_set is not None:
            for item, text in answer_set.prompts(api):
                known_pairs.append(
                    (item, await caller.complete(text, max(answer_set.max_tokens, max_tokens)))
                )
    finally:
        client.close()
    result.notes.extend(caller.notes)
    everything = (
        [("alone", c) for c in alone]
        + [("repeat", c) for c in reps[1:]]
        + [("concurrent", c) for c in busy]
        + [("known", c) for _, c in known_pairs]
    )
    result.checks.append(_requests_check(everything))
    # Failed requests are the `requests` check's finding; determinism compares only real answers.
    if len(reps_ok := [c for c in reps if c.ok]) >= 2:
        result.checks.append(judge_repeats(reps_ok))
    pairs = [(alone[i % len(probes)], b) for i, b in enumerate(busy)]
    result.checks.append(judge_concurrent([(a, b) for a, b in pairs if a.ok and b.ok]))
    if answer_set is not None:
        result.checks.append(known.judge(answer_set, known_pairs))
    ref_check: Check | None = None
    lone_ok = [c for c in alone if c.ok]
    if ref.kind == "sim":
        ref_check = simref.judge(model, lone_ok)
    elif ref.kind == "hf" and lone_ok:
        assert ref.path is not None and python is not None
        request = hfref.build_request(
            ref.path, lone_ok, chat=api == "chat", max_tokens=max_tokens, dtype=reference_dtype
        )
        data = await hfref.run_reference(python, request)
        ref_check = hfref.judge(lone_ok, data, tolerance=tolerance)
    result.checks.insert(1, _garbage_check(everything, ref_check, alone))
    if ref_check is not None:
        result.checks.append(ref_check)
    return result


def _requests_check(answers: list[tuple[str, Completion]]) -> Check:
    failed = [(phase, c) for phase, c in answers if not c.ok]
    errors: list[JsonValue] = [
        {"phase": phase, "prompt": c.prompt, "error": c.error} for phase, c in failed[:8]
    ]
    ev: JsonObject = {"sent": len(answers), "failed": len(failed), "errors": errors}
    if failed:
        return Check(
            "requests",
            False,
            "error",
            f"{len(failed)} of {len(answers)} greedy requests failed; first: {failed[0][1].error}",
            ev,
        )
    return Check("requests", True, "info", f"all {len(answers)} greedy requests answered", ev)


def _garbage_check(
    answers: list[tuple[str, Completion]], ref_check: Check | None, alone: list[Completion]
) -> Check:
    """Garbage findings over every answer; an answer the reference vouched for is the model's own
    behaviour (a tiny random model may loop on one token), so its findings become warnings."""
    vouched = {c.text for c in alone} if ref_check is not None and ref_check.ok else set()
    findings: list[JsonValue] = []
    found: list[tuple[str, Completion, garbage.Finding, str]] = []  # (phase, answer, finding, severity)
    bad_answers = 0
    for phase, c in answers:
        if not c.ok:
            continue
        severities = []
        for f in garbage.inspect(c.text, c.token_ids, c.finish_reason):
            item: JsonObject = {"phase": phase, "prompt": c.prompt, "answer": c.text[:200], **f.to_dict()}
            if f.severity == "error" and c.text in vouched:
                item["severity"] = "warning"
                item["note"] = "the reference gives the same answer"
            severity = "warning" if f.severity == "error" and c.text in vouched else f.severity
            severities.append(severity)
            found.append((phase, c, f, severity))
            findings.append(item)
        bad_answers += any(s == "error" for s in severities)
    ev: JsonObject = {"answers": len(answers), "findings": findings[:12], "count": len(findings)}
    errors = [(c, f) for _, c, f, severity in found if severity == "error"]
    if errors:
        c, first = errors[0]
        return Check(
            "garbage",
            False,
            "error",
            f"{bad_answers} of {len(answers)} answers look like garbage: {first.message} in the answer to "
            f"{c.prompt!r} ({c.text[:200][:60]!r}). {first.advice}",
            ev,
        )
    if found:
        phase, _, f, _ = found[0]
        return Check(
            "garbage",
            False,
            "warning",
            f"{len(found)} minor findings: {f.message} ({phase})",
            ev,
        )
    return Check("garbage", True, "info", f"no garbage signature in {len(answers)} answers", ev)
