"""Build tiny random-weight models plus a locally trained tokenizer.

Run with the *engines* python (it needs torch/transformers/tokenizers)::

    .venv-engines/bin/python tests/support/tiny_models.py --kind qwen3_moe --out DIR

Why: CI has no network and no GPU, yet the benchmark client and the engine
integrations must be tested against real vLLM / transformers servers. A model
with 2 layers and hidden size 128 loads in seconds and streams thousands of
tokens per second on 2 CPU cores. The tokenizer is a whitespace WordLevel over
a generated vocabulary (chat-role names, common English words, ~2k synthetic
words), so every word is exactly one token: a prompt of N whitespace-separated words is exactly N tokens, and any
id sequence decodes to text that re-encodes to the same ids (vLLM's ``random``
dataset decodes random ids and re-encodes them; clients cross-check output
lengths by re-tokenizing the streamed text).

Deterministic (fixed seeds) and idempotent: a finished model directory holds a
marker file with the spec; a second run with the same spec is a no-op.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MARKER = ".servelab-tiny-model.json"
BUILDER_VERSION = 3  # bump when the build code changes in a way the spec below does not capture
SEED = 1234
NUM_WORDS = 2000  # synthetic words; the vocabulary is ~2.1k tokens
MAX_POSITIONS = 4096
UNK = "[UNK]"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # [UNK] is deliberately a plain token
BOS, EOS, PAD = "<|endoftext|>", "<|im_end|>", "<|endoftext|>"


def _words(text: str) -> list[str]:
    return text.split()


ROLE_WORDS = ["system", "user", "assistant", "tool"]
COMMON_WORDS = _words(
    """the a an and or of to in on for with is are was be it this that you i we they he she
    hello hi hey please thanks yes no what why how when where who which can could would should
    will do does did not all any some one two three four five six seven eight nine ten
    test tests model server token tokens prompt request response answer question say tell me
    write story short long fast slow good bad new old first last more less very
    time year people way day man thing woman life child world school state family student group
    country problem hand part place case week company system program work government number night
    point home water room mother area money fact month lot right study book eye job word business
    issue side kind head house service friend father power hour game line end member law car city
    community name president team minute idea kid body information back parent face others level
    office door health person art war history party result change morning reason research girl guy
    moment air teacher force education foot boy age policy music market sense nation plan college
    interest death experience effect class control care field development role effort rate heart
    drug show leader light voice wife police mind price report decision son view relationship town
    road arm difference value building action season society tax director position player record
    paper space ground form event official matter center couple site project activity star table
    need court oil situation cost industry figure street image phone data picture practice piece
    land product doctor wall patient worker news movie north love support technology step baby
    computer type attention film tree source organization hair window evidence population river
    summer garden stone signal engine cloud bridge letter winter island"""
)

# ChatML: what Qwen uses, and what vLLM/transformers serve apply for chat requests.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

KINDS: dict[str, dict[str, Any]] = {
    # For vLLM CPU: its attention backend needs head_dim >= 64.
    "qwen3_moe": {
        "config_class": "Qwen3MoeConfig",
        "model_class": "Qwen3MoeForCausalLM",
        "dtype": "bfloat16",
        "config": {
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 64,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "norm_topk_prob": True,
            "tie_word_embeddings": False,
        },
    },
    # Dense model for `transformers serve` (fp32: plain eager CPU kernels).
    "qwen3": {
        "config_class": "Qwen3Config",
        "model_class": "Qwen3ForCausalLM",
        "dtype": "float32",
        "config": {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 64,
            "tie_word_embeddings": True,
        },
    },
    "llama": {
        "config_class": "LlamaConfig",
        "model_class": "LlamaForCausalLM",
        "dtype": "float32",
        "config": {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 64,
            "tie_word_embeddings": True,
        },
    },
    # GLM-5's architecture (MLA + DeepSeek sparse attention indexer + MoE), shrunk.
    "glm_moe_dsa": {
        "config_class": "GlmMoeDsaConfig",
        "model_class": "GlmMoeDsaForCausalLM",
        "dtype": "float32",
        "config": {
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "n_shared_experts": 1,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_group": 1,
            "topk_group": 1,
            "kv_lora_rank": 32,
            "q_lora_rank": 64,
            "qk_rope_head_dim": 32,
            "qk_nope_head_dim": 32,
            "v_head_dim": 64,
            "head_dim": 32,
            "index_topk": 64,
            "index_head_dim": 32,
            "index_n_heads": 2,
            "first_k_dense_replace": 1,
            "mlp_layer_types": ["dense", "sparse"],
            "tie_word_embeddings": False,
        },
    },
}


def word_list(n: int = NUM_WORDS, seed: int = SEED) -> list[str]:
    """Distinct pronounceable lowercase words; shared with tests that build prompts."""
    rng = random.Random(seed)
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        w = "".join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(1, 3)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def spec_digest(kind: str) -> str:
    """Hash of everything that shapes the output, so a spec change forces a rebuild."""
    blob = json.dumps(
        {
            "v": BUILDER_VERSION,
            "kind": KINDS[kind],
            "vocab": vocabulary(),
            "specials": SPECIAL_TOKENS,
            "seed": SEED,
            "tpl": CHAT_TEMPLATE,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_built(out: Path, kind: str) -> bool:
    marker = out / MARKER
    if not marker.is_file():
        return False
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return data.get("kind") == kind and data.get("digest") == spec_digest(kind)


def vocabulary() -> list[str]:
    """Every non-special token: chat-role names, common English words, then synthetic words."""
    seen: set[str] = set()
    vocab: list[str] = []
    for w in [*ROLE_WORDS, *COMMON_WORDS, *word_list()]:
        if w not in seen:
            seen.add(w)
            vocab.append(w)
    return vocab


def build_tokenizer(out: Path) -> Any:
    """A whitespace WordLevel tokenizer over the generated vocabulary, adding a BOS.

    Why WordLevel and not BPE: every token is a whole word, so *any* id sequence
    decodes to text that re-encodes to exactly the same ids. A random-weight
    model emits arbitrary ids; with a BPE their text re-merges into different
    tokens, which breaks length cross-checks between `usage` and a local
    tokenizer. Any whitespace-separated chunk is one token (unknown ones map to
    [UNK], a *plain* token so that decoding keeps it and the round trip holds).
    A BOS is prepended like Llama's tokenizers do: a completions prompt of N
    words is N + 1 tokens on the server, which keeps token != word visible.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, UNK, *vocabulary()])}
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Registered as added tokens so they split out of "<|im_start|>user" (reuses their ids).
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, ids[BOS])]
    )
    # No decoder: tokenizers joins tokens with single spaces, the exact inverse.

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # transformers 5 writes chat_template.jinja; older readers (and vLLM's own
    # fallbacks) look in tokenizer_config.json, so put it there too.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return fast


def build_model(kind: str, out: Path, tokenizer: Any) -> None:
    import torch
    import transformers
    from transformers import GenerationConfig

    spec = KINDS[kind]
    torch.manual_seed(SEED)
    config_cls = getattr(transformers, spec["config_class"])
    model_cls = getattr(transformers, spec["model_class"])
    vocab = len(tokenizer)
    # Round up to a multiple of 64: some kernels like aligned vocab sizes.
    vocab = (vocab + 63) // 64 * 64
    config = config_cls(
        vocab_size=vocab,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        **spec["config"],
    )
    config.architectures = [spec["model_class"]]
    dtype = getattr(torch, spec["dtype"])
    model = model_cls(config).to(dtype)
    model.eval()
    model.config.dtype = spec["dtype"]
    model.save_pretrained(str(out), safe_serialization=True)
    gen = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    gen.save_pretrained(str(out))


def build(kind: str, out: Path, force: bool = False) -> Path:
    """Build `kind` into `out` atomically (temp dir + rename); no-op when already built."""
    if kind not in KINDS:
        raise SystemExit(f"unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    out = out.resolve()
    if not force and is_built(out, kind):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes 0700; the result should be readable like any model dir
    try:
        tokenizer = build_tokenizer(tmp)
        build_model(kind, tmp, tokenizer)
        (tmp / MARKER).write_text(
            json.dumps({"kind": kind, "digest": spec_digest(kind), "built_at": time.time()}) + "\n"
        )
        if out.exists():
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError:
            # A concurrent builder won the race; its result is identical.
            if not is_built(out, kind):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", required=True, choices=sorted(KINDS))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    already = is_built(args.out.resolve(), args.kind) and not args.force
    path = build(args.kind, args.out, force=args.force)
    state = "cached" if already else f"built in {time.monotonic() - t0:.1f}s"
    print(f"{args.kind}: {path} ({state})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
