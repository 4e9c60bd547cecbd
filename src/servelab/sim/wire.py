"""OpenAI wire format as vLLM writes it: pre-built SSE chunk templates and the non-streaming body.

Shared by the simulator and the test fault server, so both stream byte-identical events. Token texts
must need no JSON escaping (the simulator's words are ` [a-z]+`), which is what lets a token event
be three concatenated byte strings instead of a JSON encode.
"""

from __future__ import annotations

import time

import orjson

from servelab.jsontypes import JsonObject
from servelab.sim.http import chunk

__all__ = ["DONE_EVENT", "MALFORMED_EVENT", "SseTemplates", "chunk", "completion_body"]

DONE_EVENT = b"data: [DONE]\n\n"
MALFORMED_EVENT = b'data: {"id": "broken", "choices": [{"text": oops}\n\n'


class SseTemplates:
    """The byte templates of one streamed completion (`/v1/completions`) or chat completion."""

    __slots__ = ("first", "head", "last", "post", "pre")

    def __init__(self, rid: int, chat: bool, model_json: bytes, created: int | None = None) -> None:
        when = str(int(time.time()) if created is None else created).encode()
        if chat:
            head = (
                b'data: {"id":"chatcmpl-%016x","object":"chat.completion.chunk","created":%s,"model":'
                % (rid, when)
                + model_json
                + b',"choices":'
            )
            self.pre = head + b'[{"index":0,"delta":{"content":"'
            self.post = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
            # vLLM opens a chat stream with the assistant role and empty content.
            self.first = (
                head + b'[{"index":0,"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]}\n\n'
            )
            self.last = head + b'[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"'
        else:
            head = (
                b'data: {"id":"cmpl-%016x","object":"text_completion","created":%s,"model":' % (rid, when)
                + model_json
                + b',"choices":'
            )
            self.pre = head + b'[{"index":0,"text":"'
            self.post = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self.first = b""
            self.last = head + b'[{"index":0,"text":"","logprobs":null,"finish_reason":"'
        self.head = head

    def token(self, word: bytes) -> bytes:
        """The event carrying one token's text."""
        return self.pre + word + self.post

    def finish(self, reason: str) -> bytes:
        """The event with the finish reason (and no text)."""
        return self.last + reason.encode() + b'","stop_reason":null}]}\n\n'

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """`stream_options.include_usage`: a last event with empty choices and the usage."""
        usage = b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
            prompt_tokens,
            prompt_tokens + completion_tokens,
            completion_tokens,
        )
        return self.head + b'[],"usage":' + usage + b"}\n\n"


def completion_body(
    rid: int,
    chat: bool,
    model: str,
    text: str,
    reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    with_usage: bool = True,
) -> bytes:
    """The JSON body of a non-streaming completion or chat completion."""
    choice: JsonObject
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []}}
        obj: JsonObject = {"id": f"chatcmpl-{rid:016x}", "object": "chat.completion"}
    else:
        choice = {"index": 0, "text": text}
        obj = {"id": f"cmpl-{rid:016x}", "object": "text_completion"}
    choice.update({"logprobs": None, "finish_reason": reason, "stop_reason": None})
    obj.update({"created": int(time.time()), "model": model, "choices": [choice]})
    if with_usage:
        obj["usage"] = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
    return orjson.dumps(obj)
