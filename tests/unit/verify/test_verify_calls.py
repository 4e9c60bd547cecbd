"""Response parsing for completions and chat, with and without vLLM's token ids."""

from __future__ import annotations

import orjson

from servelab.bench.client import Client
from servelab.verify.calls import Caller, parse_body


def test_completions_body_with_token_ids() -> None:
    body = orjson.dumps(
        {
            "choices": [
                {"text": " Paris", "finish_reason": "length", "token_ids": [1, 2], "prompt_token_ids": [0, 7]}
            ],
            "usage": {"completion_tokens": 2},
        }
    )
    c = parse_body("The capital", body)
    assert c.ok and c.text == " Paris" and c.token_ids == [1, 2] and c.prompt_token_ids == [0, 7]
    assert c.finish_reason == "length" and c.completion_tokens == 2 and c.tokens() == [1, 2]


def test_chat_body_without_ids_compares_words() -> None:
    body = orjson.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": "Paris is"}, "finish_reason": "stop"}],
            "prompt_token_ids": [3, 4],
        }
    )
    c = parse_body([{"role": "user", "content": "q"}], body)
    assert c.text == "Paris is" and c.token_ids is None and c.tokens() == ["Paris", "is"]
    assert c.prompt_token_ids == [3, 4]


def test_bad_body_is_an_error_answer() -> None:
    c = parse_body("p", b"<html>oops")
    assert not c.ok and "unexpected response body" in (c.error or "")


def test_request_bodies() -> None:
    caller = Caller(Client("http://127.0.0.1:9"), "m", "chat", 12)
    body = caller.body("hi", None)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["max_tokens"] == 12
    assert body["temperature"] == 0 and body["stream"] is False and body["return_token_ids"] is True
    assert caller.path == "/v1/chat/completions"
    plain = Caller(Client("http://127.0.0.1:9"), "m", "completions", 12)
    assert plain.body("hi", 3)["prompt"] == "hi" and plain.body("hi", 3)["max_tokens"] == 3


def test_reasoning_only_answer_is_judged_by_its_reasoning() -> None:
    body = orjson.dumps(
        {
            "choices": [
                {
                    "message": {"content": None, "reasoning_content": "The user asks"},
                    "finish_reason": "length",
                }
            ]
        }
    )
    assert parse_body("q", body).text == "The user asks"
