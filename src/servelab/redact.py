"""Redaction of secrets (API keys, bearer tokens) before anything is logged, stored or reported."""

from __future__ import annotations

import re
from typing import Any

# Key names whose values are secrets. `token` only as a whole word ("hf_token", "token"), so that
# "tokenizer" or "max_num_batched_tokens" keep their values.
_SECRET_KEYS = re.compile(r"(api[_-]?key|secret|password|passwd|authorization|(^|[_-])token$)", re.IGNORECASE)
_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{4,}"),
    re.compile(r"\b(sk-[A-Za-z0-9_-]{4})[A-Za-z0-9_-]+"),
    re.compile(r"\b(hf_[A-Za-z0-9]{2})[A-Za-z0-9]+"),
    re.compile(r"(?i)(--api-key[= ])\S+"),
    re.compile(r"(?i)((?:api[_-]?key|token|secret|password)\s*[=:]\s*['\"]?)[^\s'\",}]+"),
]
MASK = "***"


def redact_text(text: str) -> str:
    """Mask anything that looks like a secret in free text (log lines, argv, error messages)."""
    for pat in _PATTERNS:
        text = pat.sub(lambda m: m.group(1) + MASK, text)
    return text


def redact(obj: Any) -> Any:
    """Recursively mask secrets in dicts/lists/strings; values under secret-looking keys are masked whole."""
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            if isinstance(k, str) and _SECRET_KEYS.search(k) and isinstance(v, str) and v:
                out[k] = MASK
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list | tuple):
        return type(obj)(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
