"""The simulator's automatic prefix cache (vLLM's APC, SGLang's radix cache), in blocks of tokens.

A prompt is the simulator's tokens (whitespace words; for chat each word tagged with its message's
role, so the same words under another role are other tokens). Block i's hash chains block i-1's, so a
block hash names the whole prefix up to it, as in vLLM. A request admitted with its first k blocks
cached prefills only the rest (at least its last token is always computed, as vLLM does); the blocks
of its prompt enter the cache when its prefill ends, and those of prompt + reply when it finishes, so
the next turn of a conversation that resends the reply finds it cached. The cache holds at most as
many blocks as the KV cache has; the least recently used go first. Counters are in tokens, like
vLLM's `prefix_cache_queries` / `prefix_cache_hits`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


def prompt_tokens(prompt: Any, chat: bool) -> list[str]:
    """The simulator's tokens of a prompt (the same count `SimServer._prompt_tokens` gives)."""
    if chat:
        out: list[str] = []
        for m in prompt:
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            role = str(m.get("role", ""))
            out.extend(f"{role}\x1f{w}" for w in str(content or "").split())
        return out
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0].split()
    return [str(t) for t in prompt]


def output_tokens(words: Sequence[bytes], chat: bool) -> list[str]:
    """The reply's tokens as the next turn resends them (an assistant message, or appended text)."""
    return [("assistant\x1f" if chat else "") + w.decode().strip() for w in words]


def block_hashes(tokens: Sequence[str], block_size: int) -> list[bytes]:
    """The chained hash of every full block of `tokens`."""
    out: list[bytes] = []
    prev = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        data = "\x00".join(tokens[start : start + block_size]).encode()
        prev = hashlib.blake2b(prev + data, digest_size=16).digest()
        out.append(prev)
    return out


class PrefixCache:
    """Block hashes held by the KV cache, least recently used first out."""

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.capacity = max(capacity_blocks, 0)
        self.block_size = block_size
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of those, tokens found cached

    def lookup(self, hashes: Sequence[bytes], prompt_len: int) -> int:
        """Tokens of a `prompt_len`-token prompt found cached (its leading blocks; never all of it)."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += 1
        cached = min(n * self.block_size, max(prompt_len - 1, 0))
        self.queries += prompt_len
        self.hits += cached
        return cached

    def insert(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            if h in self._blocks:
                self._blocks.move_to_end(h)
            else:
                self._blocks[h] = None
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
