"""Greedy reference outputs from `transformers` on a local model directory (a standalone script).

Why standalone: torch and transformers are not servelab dependencies. servelab runs this file with an
interpreter that has them (``PY path/to/reference.py`` or ``PY -m servelab.verify.reference``), sends a
JSON request on stdin and reads one JSON object from stdout. It imports nothing from servelab.

Request::

    {"model_dir": "...", "dtype": "auto"|"float32"|"bfloat16"|"float16", "max_tokens": 16,
     "add_special_tokens": true, "chat": false, "top": 5,
     "items": [{"prompt": "..." | [messages], "engine_ids": [..] | null, "engine_text": ".." | null}]}

For every item it answers with the greedy continuation (ids and text, stopping at EOS like a server
does) and, when the engine's output is given, a teacher-forced score of it: at each position the
reference's top token, the engine token's rank and its log-probability gap to the top. The gap is
what tells a numerical near-tie (a bf16 argmax flip) from wrong weights.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

# Run by path, this file's directory (servelab/verify) would come first on sys.path and could shadow
# top-level modules; drop it.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


# The JSON this script reads and writes, as types for hfref and compare. Only for the type checker: the
# interpreter that runs this script may be older than servelab's (typing.NotRequired is 3.11).
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NotRequired, TypedDict

    class RequestItem(TypedDict):
        prompt: str | Sequence[object]  # a completion prompt, or chat messages
        engine_ids: list[int] | None
        engine_text: str | None
        prompt_ids: NotRequired[list[int]]

    class Request(TypedDict):
        model_dir: str
        dtype: NotRequired[str]
        max_tokens: int
        chat: NotRequired[bool]
        add_special_tokens: NotRequired[bool]
        top: NotRequired[int]
        items: list[RequestItem]

    class ForcedStep(TypedDict):
        """The reference's view of one engine token under teacher forcing."""

        pos: int
        engine_id: int
        ref_top_id: int
        gap: float  # log-probability of the reference's top token minus the engine token's
        rank: int
        engine_text: str
        ref_top_text: str
        top: NotRequired[list[list[float]]]  # [token id, log-probability] of the reference's top tokens

    class RefResult(TypedDict):
        """One request item's reference: its greedy ids and text, and the engine's answer scored."""

        prompt_ids: list[int]
        ids: list[int]
        text: str
        tokens: list[str]
        engine_ids: list[int] | None
        engine_tokens: list[str]
        retokenized: bool
        forced: list[ForcedStep]

    class Reply(TypedDict):
        ok: bool
        model_dir: str
        dtype: str
        eos_ids: list[int]
        versions: dict[str, str]
        results: list[RefResult]


def _eos_ids(model: Any, tok: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(int(e) for e in eos)
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    return ids


def _prompt_ids(tok: Any, prompt: Any, chat: bool, add_special_tokens: bool) -> list[int]:
    if chat:
        out = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "input_ids"):  # BatchEncoding in newer transformers
            out = out["input_ids"]
        return [int(i) for i in out]
    return [int(i) for i in tok(prompt, add_special_tokens=add_special_tokens)["input_ids"]]


def _greedy(torch: Any, model: Any, prompt_ids: list[int], max_tokens: int, eos: set[int]) -> list[int]:
    """Plain greedy decoding with the KV cache: argmax at every step, stop after an EOS token."""
    out: list[int] = []
    ids = torch.tensor([prompt_ids])
    past = None
    with torch.no_grad():
        for _ in range(max_tokens):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = int(res.logits[0, -1].float().argmax())
            out.append(nxt)
            if nxt in eos:
                break
            ids = torch.tensor([[nxt]])
    return out


def _score(
    torch: Any, model: Any, tok: Any, prompt_ids: list[int], engine_ids: list[int], top: int
) -> list[ForcedStep]:
    """Teacher forcing: the reference's view of every engine token, in one forward pass."""
    if not engine_ids:
        return []
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + engine_ids])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(engine_ids)], dim=-1)
    steps: list[ForcedStep] = []
    for pos, tid in enumerate(engine_ids):
        row = logp[pos]
        best = int(row.argmax())
        lp = float(row[tid]) if 0 <= tid < row.shape[0] else float("-inf")
        rank = int((row > lp).sum()) if lp != float("-inf") else int(row.shape[0])
        vals, idx = row.topk(min(top, row.shape[0]))
        steps.append(
            {
                "pos": pos,
                "engine_id": tid,
                "ref_top_id": best,
                "gap": float(row[best]) - lp,
                "rank": rank,
                "engine_text": tok.decode([tid]),
                "ref_top_text": tok.decode([best]),
                "top": [[int(i), float(v)] for v, i in zip(vals.tolist(), idx.tolist(), strict=True)],
            }
        )
    return steps


def run(req: Request) -> Reply:
    import torch
    import transformers

    torch.manual_seed(0)
    path = req["model_dir"]
    tok = transformers.AutoTokenizer.from_pretrained(path)
    dtype_name = req.get("dtype", "auto")
    dtype = "auto" if dtype_name == "auto" else getattr(torch, dtype_name)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    eos = _eos_ids(model, tok)
    chat = bool(req.get("chat"))
    add_special = bool(req.get("add_special_tokens", True))
    results: list[RefResult] = []
    for item in req["items"]:
        prompt_ids = item.get("prompt_ids") or _prompt_ids(tok, item["prompt"], chat, add_special)
        ids = _greedy(torch, model, prompt_ids, int(req["max_tokens"]), eos)
        text_ids = [i for i in ids if i not in eos]
        engine_ids = item.get("engine_ids")
        retokenized = False
        if engine_ids is None and item.get("engine_text") is not None:
            # No ids from the server: re-tokenize its text (exact for word-level vocabularies, close otherwise).
            engine_ids = [int(i) for i in tok(item["engine_text"], add_special_tokens=False)["input_ids"]]
            retokenized = True
        results.append(
            {
                "prompt_ids": prompt_ids,
                "ids": ids,
                "text": tok.decode(text_ids, skip_special_tokens=True),
                "tokens": [tok.decode([i], skip_special_tokens=False) for i in ids],
                "engine_ids": engine_ids,
                "engine_tokens": [tok.decode([i], skip_special_tokens=False) for i in engine_ids or []],
                "retokenized": retokenized,
                "forced": _score(torch, model, tok, prompt_ids, engine_ids, int(req.get("top", 5)))
                if engine_ids
                else [],
            }
        )
    return {
        "ok": True,
        "model_dir": path,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "eos_ids": sorted(eos),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "results": results,
    }


def main() -> int:
    try:
        req = json.loads(sys.stdin.read())
        out = run(req)
    except Exception as exc:  # reported as JSON: the caller turns it into a servelab error with a hint
        failure = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(failure) + "\n")
        return 1
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
