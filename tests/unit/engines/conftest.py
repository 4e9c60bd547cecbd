"""Real engine logs for the adapter tests live in tests/fixtures/logs (each file says where it comes from)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


@pytest.fixture
def log() -> Callable[[str], str]:
    """log("vllm_cpu_startup.log") -> the fixture's log text, without its provenance header."""

    def read(name: str) -> str:
        lines = (LOGS / name).read_text().splitlines(keepends=True)
        while lines and lines[0].startswith("# "):  # the provenance header is not part of the log
            lines.pop(0)
        return "".join(lines)

    return read
