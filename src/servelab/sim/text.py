"""The simulator's "reference weights": the text it generates, a pure function of model and prompt.

A real engine decoding greedily with fixed weights answers the same prompt with the same tokens;
the simulator does the same, so output checks (`servelab verify-output`) can compare what a server
streamed with what these weights say. Token i of the answer to (served model name, prompt) is

    seed  = blake2b(model + b"\\0" + prompt, digest_size=32)
    block = blake2b(seed + (i // 32).to_bytes(8, "little"), digest_size=64)
    token = WORDS[u16_le(block[2 * (i % 32):][:2]) % 512]

(`_indices` below), so the answer is prefix-stable: the first k tokens of an n-token answer are the
k-token answer, whatever `max_tokens` or the EOS draw cut it to. Sampling parameters (temperature,
seed) do not change it: the simulator always decodes greedily.

Chat requests use `prompt_text(messages)`, one `role: content` line per message. Token-id prompts
are their ids joined by spaces.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Mapping, Sequence
from typing import Any

GARBAGE_WORD = " !!!!!!!!"  # what the `garbage` fault streams instead of the reference text
_PER_DIGEST = 32  # 16-bit indices per 64-byte blake2b digest
_U16 = struct.Struct("<32H")


def _make_words(n: int = 512, seed: int = 7) -> list[bytes]:
    """Token texts: ' word' with [a-z] only, so they embed in JSON without escaping."""
    rng = random.Random(seed)
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    return [
        (" " + "".join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(1, 3)))).encode()
        for _ in range(n)
    ]


WORDS: list[bytes] = _make_words()  # the vocabulary; 512 divides 2**16, so indices are unbiased
NWORDS = len(WORDS)


def prompt_text(prompt: str | Sequence[Any]) -> str:
    """The canonical prompt text: a string as is; chat messages as `role: content` lines; a list of
    token ids as the ids joined by spaces; a 1-element list of strings as its string."""
    if isinstance(prompt, str):
        return prompt
    items = list(prompt)
    if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return " ".join(str(t) for t in items)
    if len(items) == 1 and isinstance(items[0], str):
        return items[0]
    lines = []
    for m in items:
        if not isinstance(m, Mapping):
            raise TypeError(f"expected chat messages (dicts), got {type(m).__name__}")
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        lines.append(f"{m.get('role', '')}: {content if content is not None else ''}")
    return "\n".join(lines)


def _indices(model: str, prompt: str | Sequence[Any], n: int) -> list[int]:
    seed = hashlib.blake2b(model.encode() + b"\0" + prompt_text(prompt).encode(), digest_size=32).digest()
    out: list[int] = []
    for block in range(-(-n // _PER_DIGEST)):
        d = hashlib.blake2b(seed + block.to_bytes(8, "little"), digest_size=64).digest()
        out.extend(_U16.unpack(d))
    return [i % NWORDS for i in out[:n]]


def greedy_tokens(model: str, prompt: str | Sequence[Any], n: int) -> list[bytes]:
    """The first n token texts (UTF-8 bytes, each ' word') the simulator answers `prompt` with."""
    if n <= 0:
        return []
    return [WORDS[i] for i in _indices(model, prompt, n)]


def greedy_words(model: str, prompt: str | Sequence[Any], n: int) -> list[str]:
    """The first n tokens (each ' word', leading space included) that the simulator serving `model`
    (its served model name) generates for `prompt` (a completion prompt or chat messages)."""
    return [w.decode() for w in greedy_tokens(model, prompt, n)]


def greedy_text(model: str, prompt: str | Sequence[Any], n: int) -> str:
    """`greedy_words` joined: exactly the `text` / `content` of an n-token answer."""
    return "".join(greedy_words(model, prompt, n))
