"""Did what was asked for take effect? Requested vs effective configuration, key by key.

The GLM-5 story's costliest mistake was a flashinfer_trtllm experiment that never ran: the engine
silently replaced the backend and logged `moe_runner_backend='flashinfer_cutlass'`. Every requested key
the engine shows an effective value for is compared; a mismatch is reported with the log line that proves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from servelab.jsontypes import JsonObject

# Keys whose effective value may legitimately differ from a request of "auto"/None (the engine chooses).
_AUTO = {"auto", "none", "", "default"}


@dataclass(frozen=True)
class Mismatch:
    key: str
    requested: Any
    effective: Any
    evidence: str

    def to_dict(self) -> JsonObject:
        return asdict(self)

    def sentence(self) -> str:
        return f"requested {self.key}={self.requested!r} but the engine runs {self.key}={self.effective!r}"


def _norm(v: Any) -> bool | float | str | None:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return float(v)
    s = str(v).strip().strip("'\"").lower()
    if s in ("true", "false"):
        return s == "true"
    try:
        return float(s)
    except ValueError:
        return s.replace("-", "_")


def same(requested: Any, effective: Any) -> bool:
    r, e = _norm(requested), _norm(effective)
    if isinstance(r, float) and isinstance(e, float):
        return abs(r - e) <= 1e-9 * max(1.0, abs(r))
    return r == e


def compare(
    requested: Mapping[str, object], effective: Mapping[str, object], evidence: Mapping[str, str]
) -> tuple[list[Mismatch], list[str]]:
    """(mismatches, keys the engine did not show) for every requested key; "auto" requests always match."""
    mismatches: list[Mismatch] = []
    unconfirmed: list[str] = []
    for key, want in requested.items():
        if want is None or (isinstance(want, str) and want.lower() in _AUTO):
            continue
        if key not in effective:
            unconfirmed.append(key)
            continue
        if not same(want, effective[key]):
            mismatches.append(Mismatch(key, want, effective[key], evidence.get(key, "")))
    return mismatches, unconfirmed
