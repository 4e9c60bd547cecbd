"""JSON as a type: what crosses a wire, a file or a front as JSON is typed `JsonObject`, not a dict of Any.

A reader of a `JsonObject` must narrow each value before it uses it (mypy sees `str | int | ... | None`),
so a key guessed at fails the type check instead of at run time. Data that a room reads by key belongs
in a typed model; this alias is for what is only passed through or written out (an engine's HTTP body,
a stored open document, a front's `--json`).
"""

from __future__ import annotations

from typing import TypeAlias

from pydantic import JsonValue

JsonObject: TypeAlias = dict[str, JsonValue]

__all__ = ["JsonObject", "JsonValue"]
