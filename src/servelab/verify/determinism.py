"""Greedy answers must repeat. Lone repeats are held to that strictly; answers under concurrency are not.

Why two severities: the same request sent alone, twice, runs the same kernels on the same batch shape
and must give the same tokens; when it does not, sampling is not greedy or something is broken (an
error). Sent among other requests, its batch shape changes, and most engines do not promise batch
invariance: different GEMM tilings round differently and a near-tie can flip. That is a known,
documented property (vLLM, SGLang without their deterministic modes), so it is a warning that says
where the texts part. Garbage under concurrency is still caught by the garbage check.

The first of the lone repeats warms the server (CUDA graphs captured lazily, prefix cache filled):
if only it differs from the later, identical ones, the finding is a warning too.
"""

from __future__ import annotations

from servelab.jsontypes import JsonObject, JsonValue
from servelab.verify.calls import Completion
from servelab.verify.compare import first_divergence
from servelab.verify.result import Check


def _brief(c: Completion) -> JsonObject:
    out: JsonObject = {"text": c.text[:200]}
    if c.token_ids is not None:
        out["token_ids"] = list(c.token_ids[:32])
    return out


def judge_repeats(repeats: list[Completion]) -> Check:
    """The same prompt sent alone several times (the first one also warms the server)."""
    prompt = repeats[0].prompt
    seqs = [r.tokens() for r in repeats]
    unit = "token ids" if all(r.token_ids is not None for r in repeats) else "words"
    ev: JsonObject = {
        "prompt": prompt,
        "runs": len(repeats),
        "compared": unit,
        "answers": [_brief(r) for r in repeats],
    }
    later = seqs[1:]
    for i in range(1, len(later)):
        d = first_divergence(later[0], later[i])
        if d is not None:
            ev["first_divergence"] = d
            return Check(
                "determinism",
                False,
                "error",
                f"the same greedy request, sent alone, answered differently on runs 2 and {i + 2} "
                f"(first difference at token {d}): sampling is not greedy, or the server is broken",
                ev,
            )
    d = first_divergence(seqs[0], seqs[1]) if len(seqs) > 1 else None
    if d is not None:
        ev["first_divergence"] = d
        return Check(
            "determinism",
            False,
            "warning",
            f"the first (cold) answer differs from the later identical ones at token {d}: a warm-up "
            "path (prefix cache, lazily captured graphs) rounds differently",
            ev,
        )
    return Check("determinism", True, "info", f"{len(repeats)} lone greedy repeats gave identical {unit}", ev)


def judge_concurrent(pairs: list[tuple[Completion, Completion]]) -> Check:
    """(lone answer, the same prompt's answer while other requests ran alongside) pairs."""
    diffs: list[JsonValue] = []
    where: list[int] = []
    for alone, busy in pairs:
        d = first_divergence(alone.tokens(), busy.tokens())
        if d is not None:
            where.append(d)
            diffs.append(
                {
                    "prompt": alone.prompt,
                    "first_divergence": d,
                    "alone": _brief(alone),
                    "concurrent": _brief(busy),
                }
            )
    ev: JsonObject = {"requests": len(pairs), "differing": len(diffs), "differences": diffs[:8]}
    if diffs:
        earliest = min(where)
        return Check(
            "batch_invariance",
            False,
            "warning",
            f"{len(diffs)} of {len(pairs)} answers sent concurrently differ from the same request sent alone "
            f"(earliest at token {earliest}): the engine is not batch-invariant; expected for most engines, "
            "but greedy results then depend on load",
            ev,
        )
    return Check(
        "batch_invariance",
        True,
        "info",
        f"{len(pairs)} answers sent concurrently match the same requests sent alone",
        ev,
    )
