"""What a verification returns: named checks, each with a verdict, a severity and its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from servelab.jsontypes import JsonObject

Severity = Literal["error", "warning", "info"]


@dataclass
class Check:
    """One check's outcome. `ok` False with severity "error" fails the server; "warning" does not.

    `evidence` holds the facts a person needs to believe the verdict (prompts, outputs, positions).
    """

    name: str
    ok: bool
    severity: Severity = "info"
    detail: str = ""
    evidence: JsonObject = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return not self.ok and self.severity == "error"

    def to_dict(self) -> JsonObject:
        return {
            "name": self.name,
            "ok": self.ok,
            "severity": self.severity,
            "detail": self.detail,
            "evidence": self.evidence,
        }


@dataclass
class VerifyResult:
    """All checks against one server and model; `ok` unless some check failed with severity "error"."""

    url: str
    model: str
    api: str
    checks: list[Check] = field(default_factory=list)
    reference: str = "none"
    known_answers: str = "none"
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.failed]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and c.severity == "warning"]

    def to_dict(self) -> JsonObject:
        return {
            "ok": self.ok,
            "url": self.url,
            "model": self.model,
            "api": self.api,
            "reference": self.reference,
            "known_answers": self.known_answers,
            "failed": [c.name for c in self.failures],
            "warnings": [c.name for c in self.warnings],
            "notes": list(self.notes),
            "checks": [c.to_dict() for c in self.checks],
        }
