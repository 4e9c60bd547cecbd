"""What crosses the connection between servelab and its agent, besides plain JSON: the protocol's version,
the agent's module, errors (as their own servelab class, a diagnosis included) and bytes (base64).

Both halves read this module: the control side (servelab.host.transport) and the agent (servelab.agent),
which stands above every room whose operations it runs, so neither imports the other."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping

from servelab import errors
from servelab.errors import ServelabError
from servelab.jsontypes import JsonObject

PROTOCOL = 1  # the request/answer lines' version: both ends must speak the same one (and the same servelab)
AGENT_MODULE = "servelab.agent"  # what `python -m` runs on the remote (its argv, not an import here)
READ_MAX = 4 * 1024 * 1024  # bytes of a file in one answer (one JSON line)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode())


def error_payload(exc: BaseException) -> JsonObject:
    """An error as the agent sends it (JSON: `rebuild_error` reads it on the other end)."""
    if isinstance(exc, ServelabError):
        out: JsonObject = {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}
        diag = getattr(exc, "diagnosis", None)
        if dataclasses.is_dataclass(diag) and not isinstance(diag, type):
            out["diagnosis"] = dataclasses.asdict(diag)
        return out
    return {"type": "HostError", "message": f"the agent failed: {type(exc).__name__}: {exc}", "hint": ""}


def rebuild_error(payload: Mapping[str, object]) -> ServelabError:
    """The servelab error an agent reported, as its own class (a diagnosis included)."""
    cls = getattr(errors, str(payload.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, ServelabError)):
        cls = errors.HostError
    hint = payload.get("hint")
    exc = cls(str(payload.get("message") or "the agent failed"), hint=hint if isinstance(hint, str) else None)
    diag = payload.get("diagnosis")
    if isinstance(diag, dict):
        from servelab.engines.base import Diagnosis

        exc.diagnosis = Diagnosis(**{**diag, "tail": tuple(diag.get("tail") or ())})  # type: ignore[attr-defined]
    return exc
