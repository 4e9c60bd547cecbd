"""A random-weight Llama of about one billion parameters for the GPU check (benchmarks/gpu/device_check.sh).

    python3 benchmarks/gpu/build_model.py OUT [--tiny]

Why random weights: the device machine reaches no network, so no published checkpoint can be fetched,
and energy and latency depend on the shapes, not on what the weights say. The tokenizer is the tests'
whitespace one (tests/support/tiny_models.py), so every prompt word is one token. Built on the GPU in
bfloat16 (seconds), saved as safetensors. Big enough that a decode step reads ~2 GB of weights, so the
GPU's power moves with the load; small enough to build, save and load inside the check's minutes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.tiny_models import BOS, EOS, MAX_POSITIONS, PAD, build_tokenizer  # noqa: E402

SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": True,
}


TINY = {
    **SHAPE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}
TINY["num_key_value_heads"], TINY["head_dim"] = 1, 64


def main(out: Path, tiny: bool = False) -> int:
    import torch
    import transformers

    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    config = transformers.LlamaConfig(
        vocab_size=(len(tok) + 63) // 64 * 64,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.convert_tokens_to_ids(BOS),
        eos_token_id=tok.convert_tokens_to_ids(EOS),
        pad_token_id=tok.convert_tokens_to_ids(PAD),
        **(TINY if tiny else SHAPE),
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(1234)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(str(out), safe_serialization=True)
    transformers.GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    ).save_pretrained(str(out))
    params = sum(p.numel() for p in model.parameters())
    print(f"built {out}: {params / 1e9:.2f} B parameters on {device} in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--tiny"]):
        raise SystemExit("usage: build_model.py OUT [--tiny]  (--tiny: a rehearsal's model, CPU-sized)")
    sys.exit(main(Path(sys.argv[1]), tiny=sys.argv[2:] == ["--tiny"]))
