"""A model's context length as an engine derives it from the model's `config.json`.

`ContextFacts` is what a config states about its length (the length keys present, the RoPE scaling);
`ContextRule` is how one engine turns those facts into its default context, stated as data (the
simulator's personalities, `data/sim/personalities.toml` `[<p>.context]`); `derive` applies a rule.

The rules were read off the engines' code:

- vLLM (`vllm/config/model.py`, `_get_and_verify_max_len`): the smallest of its length keys; a RoPE
  scaling other than `su`/`longrope`/`llama3` multiplies it by the scaling's `factor`, and YaRN starts from
  the scaling's `original_max_position_embeddings`; Gemma 3's length is already scaled; no key: 2048.
- SGLang (`sglang/srt/hf_transformers_utils.py`, `get_context_length`): the first of its
  keys in its order; a RoPE scaling's `factor` multiplies it unless the scaling names
  `original_max_position_embeddings` or is `llama3`; no key: 2048.

Both read the language model's config (`text_config` of a multimodal one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Every key either engine reads a length from (the rules say which, and in what order).
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


@dataclass(frozen=True)
class Rope:
    """A config's RoPE scaling (`rope_scaling`, or transformers 5's `rope_parameters`)."""

    rope_type: str  # "default", "yarn", "llama3", ... ("type" in older configs)
    factor: float | None = None
    original_max_position_embeddings: int | None = None


@dataclass(frozen=True)
class ContextFacts:
    """What a model's config says about its length: the length keys it states, its RoPE scaling."""

    lengths: tuple[tuple[str, int], ...] = ()
    rope: Rope | None = None
    model_type: str = ""

    def length(self, key: str) -> int | None:
        return next((v for k, v in self.lengths if k == key), None)


@dataclass(frozen=True)
class ContextRule:
    """How an engine derives its default context from `ContextFacts` (docs/sim.md, "Context length")."""

    keys: tuple[str, ...]  # the length keys it reads
    pick: str  # "smallest" (vLLM) | "first" (SGLang: the first present, in `keys`' order)
    unscaled_rope: tuple[str, ...]  # rope types whose factor is not applied
    unscaled_if_original: bool  # a scaling naming original_max_position_embeddings is not applied
    yarn_from_original: bool  # YaRN: original_max_position_embeddings × factor
    prescaled_model_types: tuple[str, ...]  # model types whose length is already scaled
    fallback: int  # no length key at all


PICKS = ("smallest", "first")


def facts_of(cfg: Mapping[str, object], model_type: str = "") -> ContextFacts:
    """The facts of a (text) config."""
    lengths = tuple(
        (k, int(v))
        for k in LENGTH_KEYS
        if isinstance(v := cfg.get(k), int | float) and not isinstance(v, bool)
    )
    return ContextFacts(lengths, _rope(cfg), model_type)


def _rope(cfg: Mapping[str, object]) -> Rope | None:
    raw = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(raw, Mapping):
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if not isinstance(kind, str):
        return None
    factor, original = raw.get("factor"), raw.get("original_max_position_embeddings")
    return Rope(
        kind,
        float(factor) if isinstance(factor, int | float) and not isinstance(factor, bool) else None,
        int(original) if isinstance(original, int) and not isinstance(original, bool) else None,
    )


def derive(rule: ContextRule, facts: ContextFacts) -> tuple[int, str]:
    """The engine's default context for a model, and how it was found (for the log and the docs)."""
    present = [(k, v) for k in rule.keys if (v := facts.length(k)) is not None]
    if not present:
        return rule.fallback, f"no length key in the config: {rule.fallback}"
    key, length = min(present, key=lambda kv: kv[1]) if rule.pick == "smallest" else present[0]
    how = f"{key}={length}"
    rope = facts.rope
    if rope is None or any(t in facts.model_type for t in rule.prescaled_model_types):
        return length, how
    if rope.rope_type in rule.unscaled_rope:
        return length, how
    if rule.unscaled_if_original and rope.original_max_position_embeddings is not None:
        return length, how
    factor = rope.factor if rope.factor is not None else 1.0
    base = length
    if rule.yarn_from_original and rope.rope_type == "yarn" and rope.original_max_position_embeddings:
        base = rope.original_max_position_embeddings
        how = f"rope_scaling.original_max_position_embeddings={base}"
    if factor == 1.0 and base == length:
        return length, how
    return int(base * factor), f"{how} × {rope.rope_type} factor {factor:g}"
