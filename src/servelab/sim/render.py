"""What a personality writes: its log lines (`Logger`, in the engine's format, to the engine's stream) and
its `/metrics` text (`render_metrics`, with the engine's metric names), both read off its `Personality`."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from servelab.sim.personalities import Personality, get_personality


class Logger:
    """Prints lines in the engine's format to its stream (vLLM: stdout, SGLang: stderr)."""

    def __init__(self, personality: str | Personality, tp: int, stream: Any = None) -> None:
        self.p = get_personality(personality) if isinstance(personality, str) else personality
        self.tp = tp
        self.stream = stream or (sys.stdout if self.p.log.stream == "stdout" else sys.stderr)
        self.pid = os.getpid()
        self.engine_pid = self.pid + 1

    @staticmethod
    def vdate() -> str:
        """vLLM's timestamp ({date} in faults.toml)."""
        return time.strftime("%m-%d %H:%M:%S")

    @staticmethod
    def sdate() -> str:
        """SGLang's timestamp ({sdate} in faults.toml)."""
        return time.strftime("%Y-%m-%d %H:%M:%S")

    def lines(self, who: str, text: str, level: str = "INFO", src: str | None = None) -> list[str]:
        return self.p.log.format(
            who, text, level=level, src=src, pid=self.pid, engine_pid=self.engine_pid, tp=self.tp
        )

    def emit(self, who: str, text: str, level: str = "INFO", src: str | None = None) -> None:
        self.stream.write("\n".join(self.lines(who, text, level, src)) + "\n")
        self.stream.flush()

    def raw(self, lines: list[str], stream: Any = None) -> None:
        out = stream or sys.stderr
        out.write("\n".join(lines) + "\n")
        out.flush()


def render_metrics(personality: str | Personality, model: str, s: dict[str, float]) -> bytes:
    """Prometheus text with the engine's metric names; `s` holds the scheduler's numbers."""
    m = (get_personality(personality) if isinstance(personality, str) else personality).metrics
    lbl = "{" + m.labels.format(model=model) + "}"
    lines: list[str] = []
    for row in m.rows:
        lines += [f"# HELP {row.name} {row.help}", f"# TYPE {row.name} {row.type}"]
        if row.type == "histogram":
            n = float(s[f"{row.value}_count"])
            le = "{" + m.labels.format(model=model) + ',le="+Inf"}'
            lines += [
                f"{row.name}_bucket{le} {n}",
                f"{row.name}_sum{lbl} {float(s[f'{row.value}_sum'])}",
                f"{row.name}_count{lbl} {n}",
            ]
            continue
        v = s[row.value] if isinstance(row.value, str) else row.value
        lines.append(f"{row.name}{lbl} {float(v)}")
    if m.success is not None:
        sc = m.success
        lines += [f"# HELP {sc.name} {sc.help}", f"# TYPE {sc.name} counter"]
        for reason in ("stop", "length", "abort"):
            labels = sc.labels.format(reason=reason, model=model)
            lines.append(f"{sc.name}{{{labels}}} {float(s['success_' + reason])}")
    return ("\n".join(lines) + "\n").encode()
