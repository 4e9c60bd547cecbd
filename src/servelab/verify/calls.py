"""Greedy requests to the server under test, non-streaming, with token ids where the server gives them.

Named `calls` (not `http`/`requests`): reference.py in this folder runs as a script, and a module
here must not shadow a top-level one on its sys.path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson

from servelab.bench.client import Client
from servelab.errors import ServerError
from servelab.jsontypes import JsonObject, JsonValue

Prompt = str | list[JsonValue]  # a completion prompt, or chat messages (JSON objects, sent as given)

# Fields servers outside vLLM may reject; dropped (once, for the whole run) after a 4xx that names none of ours.
EXTRAS: JsonObject = {"seed": 0, "return_token_ids": True}


@dataclass
class Completion:
    """One greedy answer. `token_ids` only when the server returns them (vLLM: return_token_ids)."""

    prompt: Prompt
    text: str = ""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def tokens(self) -> list[int] | list[str]:
        """What determinism compares: token ids when known, else the whitespace-split text."""
        return self.token_ids if self.token_ids is not None else self.text.split()

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"prompt": self.prompt, "text": self.text, "finish_reason": self.finish_reason}
        if self.token_ids is not None:
            out["token_ids"] = list(self.token_ids)
        if self.error:
            out["error"] = self.error
        return out


def user_messages(text: str) -> list[JsonValue]:
    return [{"role": "user", "content": text}]


def parse_body(prompt: Prompt, body: bytes) -> Completion:
    """An OpenAI completions or chat completions JSON body → Completion (pure)."""
    try:
        obj = orjson.loads(body)
        choice = obj["choices"][0]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return Completion(prompt, error=f"unexpected response body: {body[:200]!r}")
    text = choice.get("text")
    if text is None:
        msg = choice.get("message") or {}
        # A reasoning model's answer may still be all reasoning when max_tokens ends it: judge that text.
        text = msg.get("content") or msg.get("reasoning_content") or msg.get("reasoning") or ""
    ids = choice.get("token_ids")
    prompt_ids = choice.get("prompt_token_ids") or obj.get("prompt_token_ids")
    usage = obj.get("usage") or {}
    return Completion(
        prompt,
        text=text,
        token_ids=[int(i) for i in ids] if isinstance(ids, list) else None,
        prompt_token_ids=[int(i) for i in prompt_ids] if isinstance(prompt_ids, list) else None,
        finish_reason=choice.get("finish_reason"),
        completion_tokens=usage.get("completion_tokens"),
    )


@dataclass
class Caller:
    """Sends greedy requests for one (server, model, api); learns once whether the extras are accepted."""

    client: Client
    model: str
    api: str = "completions"
    max_tokens: int = 16
    extras: JsonObject = field(default_factory=lambda: dict(EXTRAS))
    notes: list[str] = field(default_factory=list)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _probed: bool = False

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def normalize(self, prompt: Prompt) -> Prompt:
        """Chat requests carry messages: a plain string becomes one user message."""
        return user_messages(prompt) if self.api == "chat" and isinstance(prompt, str) else prompt

    def body(self, prompt: Prompt, max_tokens: int | None) -> JsonObject:
        key = "messages" if self.api == "chat" else "prompt"
        return {
            "model": self.model,
            key: self.normalize(prompt),
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": 0,
            "stream": False,
            **self.extras,
        }

    async def _send(self, prompt: Prompt, max_tokens: int | None) -> tuple[int, bytes, str | None]:
        res = await self.client.send(
            self.client.build_request(self.path, self.body(prompt, max_tokens)), mode="raw"
        )
        return res.status, res.body, res.error_kind and f"{res.error_kind}: {res.error_message}"

    async def complete(self, prompt: Prompt, max_tokens: int | None = None) -> Completion:
        """One greedy answer. The first call probes the server (and raises if it is unusable)."""
        if not self._probed:
            async with self._lock:
                if not self._probed:
                    done = await self._probe(prompt, max_tokens)
                    self._probed = True
                    return done
        status, body, err = await self._send(prompt, max_tokens)
        if status == 200:
            return parse_body(self.normalize(prompt), body)
        return Completion(
            self.normalize(prompt), error=err or f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}"
        )

    async def _probe(self, prompt: Prompt, max_tokens: int | None) -> Completion:
        """The first request: an unusable server raises here, each fault worded as what it is."""
        status, body, err = await self._send(prompt, max_tokens)
        if 400 <= status < 500 and status not in (401, 403, 404) and self.extras:
            dropped = ", ".join(sorted(self.extras))
            self.extras = {}
            status, body, err = await self._send(prompt, max_tokens)
            if status == 200:
                self.notes.append(f"the server rejected {dropped}; sent plain greedy requests instead")
        if err and not err.startswith("http_"):
            raise _transport_error(self.client.endpoint.host_header, err)
        if status in (401, 403):
            raise ServerError(
                f"the server refused the request (HTTP {status})",
                hint="pass --api-key (or set OPENAI_API_KEY) with a key the server accepts",
            )
        if status != 200:
            text = body[:300].decode("utf-8", "replace")
            raise ServerError(
                f"{self.path} for model {self.model!r} answered HTTP {status}: {text}",
                hint="check --model against `curl URL/v1/models`, and --api (completions or chat)",
            )
        return parse_body(self.normalize(prompt), body)


def _transport_error(host: str, err: str) -> ServerError:
    """Only a refused or failed connection is "cannot reach": a server that took the request and went
    silent, or dropped it, is reachable, and a hint to check --url would mislead."""
    kind = err.split(":", 1)[0]
    if kind == "connect_error":
        return ServerError(f"cannot reach {host}: {err}")
    if kind in ("timeout", "stalled"):
        return ServerError(
            f"{host} took the request but sent no complete answer within the timeout ({err})",
            hint="the server is up but stuck: check its log, or raise --timeout for a slow engine",
        )
    return ServerError(
        f"{host} failed the request ({err})",
        hint="the server is up but broke off the answer: check its log (`servelab logs diagnose`)",
    )
