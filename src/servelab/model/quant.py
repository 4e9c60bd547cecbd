"""Weight and KV-cache number formats: bytes per parameter, the tensor-core rate they run at, and
which parts of a checkpoint a quantization config leaves in BF16.

A checkpoint is rarely quantized uniformly (NVFP4 GLM-5 keeps attention in BF16, Kimi-K2.5 quantizes
only the routed experts to INT4), and decode time is bytes read, so the model tracks a format per part.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from servelab.errors import ConfigError

# Bytes per weight including block scales (NVFP4: FP8 scale per 16; MXFP4: E8M0 per 32; INT4 w4a16:
# BF16 scale per group of 32 by default). GGUF figures are llama.cpp's bits per weight / 8.
BYTES_PER_PARAM: dict[str, float] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "nvfp4": 0.5625,
    "mxfp4": 0.53125,
    "int4": 0.5625,
    "q8_0": 8.5 / 8,
    "q6_k": 6.5625 / 8,
    "q5_k_m": 5.69 / 8,
    "q5_k_s": 5.54 / 8,
    "q5_0": 5.5 / 8,
    "q4_k_m": 4.85 / 8,
    "q4_k_s": 4.58 / 8,
    "q4_0": 4.55 / 8,
    "iq4_xs": 4.25 / 8,
    "q3_k_m": 3.91 / 8,
    "q3_k_l": 4.27 / 8,
    "iq3_xxs": 3.06 / 8,
    "q2_k": 2.63 / 8,
    "iq2_xxs": 2.06 / 8,
    "iq1_s": 1.56 / 8,
}

# Which tensor-core rate a weight format's GEMMs run at (weight-only formats dequantize to BF16).
COMPUTE_DTYPE: dict[str, str] = {"fp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp8"}

KV_BYTES: dict[str, float] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "auto": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
}

ALIASES = {
    "fp4": "nvfp4",
    "w4a16": "int4",
    "awq": "int4",
    "gptq": "int4",
    "fp8_block": "fp8",
    "bfloat16": "bf16",
    "float16": "fp16",
    "none": "bf16",
    "": "bf16",
}

PARTS = ("attention", "dense_mlp", "experts", "shared_experts", "lm_head")


def normalize_format(name: str) -> str:
    """Canonical weight-format name; unknown names list the known ones."""
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in BYTES_PER_PARAM:
        raise ConfigError(
            f"unknown quantization {name!r}",
            hint="known: " + ", ".join(sorted(set(BYTES_PER_PARAM) | {"fp4", "w4a16"})),
        )
    return key


def normalize_kv(name: str) -> str:
    key = name.strip().lower()
    if key not in KV_BYTES:
        raise ConfigError(f"unknown KV-cache dtype {name!r}", hint="known: " + ", ".join(sorted(KV_BYTES)))
    return "bf16" if key in ("auto", "fp16") else ("fp8" if key.startswith("fp8") else key)


@dataclass(frozen=True)
class QuantScheme:
    """The weight format of each part of the model, and the KV-cache dtype."""

    attention: str = "bf16"
    dense_mlp: str = "bf16"
    experts: str = "bf16"
    shared_experts: str = "bf16"
    lm_head: str = "bf16"
    kv_dtype: str = "bf16"

    def bytes(self, part: str) -> float:
        return BYTES_PER_PARAM[getattr(self, part)]

    def compute(self, part: str) -> str:
        return COMPUTE_DTYPE.get(getattr(self, part), "bf16")

    @property
    def kv_bytes(self) -> float:
        return KV_BYTES[self.kv_dtype]

    @property
    def label(self) -> str:
        main = self.experts if self.experts != "bf16" else self.dense_mlp
        return f"{main} (kv {self.kv_dtype})"

    def with_weights(self, fmt: str, parts: tuple[str, ...] = PARTS[:-1]) -> QuantScheme:
        """All the named parts in one format (lm_head stays as it is unless named)."""
        fmt = normalize_format(fmt)
        return replace(self, **dict.fromkeys(parts, fmt))


def _probe_names(part: str, layer: int) -> list[str]:
    rel = {
        "attention": ["self_attn.o_proj", "self_attn.q_proj", "self_attn.kv_b_proj", "linear_attn.out_proj"],
        "dense_mlp": ["mlp.down_proj", "mlp.gate_proj"],
        "experts": ["mlp.experts.0.down_proj", "block_sparse_moe.experts.0.w2"],
        "shared_experts": ["mlp.shared_experts.down_proj", "mlp.shared_expert.down_proj"],
    }[part]
    return [f"{prefix}.layers.{layer}.{r}" for prefix in ("model", "model.language_model") for r in rel]


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")
    return f".{pattern}." in f".{name}." or name.endswith("." + pattern) or name == pattern


def _pattern_regex(pattern: str) -> str:
    """One exclusion pattern as a regex for `re.search`, with `_matches`' semantics."""
    if pattern.startswith("re:"):
        return f"^(?:{pattern[3:]})"
    if any(c in pattern for c in "*?["):
        return f"^(?:{fnmatch.translate(pattern)[4:-3]})(?:\\..*)?\\Z"
    return f"(?:^|\\.){re.escape(pattern)}(?:\\.|\\Z)"


_PROBE_LAYERS = (4, 5, 6, 7)
_LAYER = re.compile(r"layers\.(\d+)\.")


def _may_hit_probes(pattern: str) -> bool:
    """False for a pattern pinned to a layer the probes never name (`model.layers.12.mlp*`)."""
    if pattern.startswith("re:"):
        return True
    literal = (
        re.split(r"[*?\[]", pattern, maxsplit=1)[0] if any(c in pattern for c in "*?[") else pattern + "."
    )
    m = _LAYER.search(literal)
    return m is None or int(m.group(1)) in _PROBE_LAYERS


@lru_cache(maxsize=64)
def _exclusion_matcher(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """A checkpoint's exclusion patterns that can match a probe name, as one compiled regex (GLM-5 lists
    471, mostly pinned to single layers: matching them one by one took ~45 ms of a cold prediction)."""
    parts = [f"(?:{_pattern_regex(p)})" for p in patterns if _may_hit_probes(p)]
    return re.compile("|".join(parts) or "(?!)", re.S)


def _excluded(part: str, patterns: list[str]) -> bool:
    """A part stays unquantized when most of its probe layers match an exclusion pattern."""
    matcher = _exclusion_matcher(tuple(patterns))
    if part == "lm_head":
        return matcher.search("lm_head") is not None
    hits = sum(1 for layer in _PROBE_LAYERS if any(matcher.search(n) for n in _probe_names(part, layer)))
    return hits * 2 >= len(_PROBE_LAYERS)


def _scheme(fmt: str, excludes: list[str], kv: str, only_experts: bool = False) -> QuantScheme:
    values: dict[str, str] = {}
    for part in PARTS:
        if only_experts and part != "experts":
            values[part] = "bf16"
        elif part == "lm_head" and not excludes:
            values[part] = "bf16"  # lm_head is left in BF16 by every mainstream quantizer
        else:
            values[part] = "bf16" if _excluded(part, excludes) else fmt
    return QuantScheme(kv_dtype=kv, **values)


def _modelopt_format(algo: str) -> str:
    algo = (algo or "").upper()
    if "NVFP4" in algo or algo == "FP4":
        return "nvfp4"
    if "FP8" in algo:
        return "fp8"
    if "W4A16" in algo or "INT4" in algo:
        return "int4"
    if "W8A8" in algo or "INT8" in algo:
        return "int8"
    raise ConfigError(f"unsupported modelopt quant_algo {algo!r}", hint="pass --quant to set the format")


def _ct_format(groups: dict[str, Any]) -> str:
    for group in groups.values():
        w = group.get("weights") or {}
        bits, kind = w.get("num_bits"), w.get("type")
        if bits == 4 and kind == "float":
            return "nvfp4"
        if bits == 4:
            return "int4"
        if bits == 8 and kind == "float":
            return "fp8"
        if bits == 8:
            return "int8"
    raise ConfigError("unsupported compressed-tensors scheme", hint="pass --quant to set the format")


def scheme_from_config(config: dict[str, Any], hf_quant: dict[str, Any] | None = None) -> QuantScheme:
    """Read the weight formats from `hf_quant_config.json` or the config's `quantization_config`."""
    if hf_quant and "quantization" in hf_quant:
        q = hf_quant["quantization"]
        kv = "fp8" if "FP8" in str(q.get("kv_cache_quant_algo") or "").upper() else "bf16"
        return _scheme(_modelopt_format(q.get("quant_algo", "")), list(q.get("exclude_modules") or []), kv)
    qc = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if not qc:
        return QuantScheme()
    method = str(qc.get("quant_method", "")).lower()
    if method == "modelopt" or "quant_algo" in qc:
        kv = "fp8" if (qc.get("kv_cache_scheme") or {}).get("num_bits") == 8 else "bf16"
        algo = qc.get("quant_algo") or ""
        fmt = _modelopt_format(algo) if algo else _ct_format(qc.get("config_groups") or {})
        return _scheme(fmt, list(qc.get("ignore") or qc.get("exclude_modules") or []), kv)
    if method == "fp8":
        return _scheme(
            "fp8", list(qc.get("modules_to_not_convert") or qc.get("ignored_layers") or []), "bf16"
        )
    if method == "mxfp4":
        return _scheme("mxfp4", [], "bf16", only_experts=True)
    if method == "compressed-tensors":
        fmt = _ct_format(qc.get("config_groups") or {})
        kv = "fp8" if (qc.get("kv_cache_scheme") or {}).get("num_bits") == 8 else "bf16"
        return _scheme(fmt, list(qc.get("ignore") or []), kv)
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        return _scheme("int4" if qc.get("bits", 4) == 4 else "int8", [], "bf16")
    if method == "bitsandbytes":
        return _scheme("int4" if qc.get("load_in_4bit") else "int8", [], "bf16")
    raise ConfigError(f"unsupported quant_method {method!r} in the model config", hint="pass --quant")
