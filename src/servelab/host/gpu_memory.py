"""GPU memory in use per GPU, and waiting until it is back to what it was before a server started.

Why: a process can be gone while the driver still frees its memory (a second or two, more with
MPS or a stuck context); the next candidate launched too early then sees less free memory and either
fails or sizes its KV cache smaller, which silently changes the measurement.

A reader is any `() -> list[int] | None` returning MiB used per GPU (None: no GPUs on this host), so
tests inject one; the default reads `nvidia-smi` and reports "no GPUs" where there is none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from servelab.host.gpus import run_nvidia_smi
from servelab.jsontypes import JsonObject

GpuReader = Callable[[], list[int] | None]


def nvidia_smi_reader() -> list[int] | None:
    """MiB used per GPU from nvidia-smi (None: no nvidia-smi, or it found no GPU)."""
    text = run_nvidia_smi(["--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=20)
    if text is None:
        return None
    values = [int(float(v)) for v in text.split() if v.strip()]
    return values or None


@dataclass
class GpuMemoryReport:
    """Whether GPU memory returned to its baseline after a teardown."""

    status: str  # "no GPUs", "back to baseline", "not back" (timed out), "no baseline"
    baseline_mib: list[int] | None = None
    final_mib: list[int] | None = None
    waited_s: float = 0.0
    over_mib: list[int] = field(default_factory=list)  # per GPU: MiB still above baseline + tolerance

    @property
    def ok(self) -> bool:
        return self.status in ("no GPUs", "back to baseline")

    def to_dict(self) -> JsonObject:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def wait_for_baseline(
    baseline: list[int] | None,
    reader: GpuReader = nvidia_smi_reader,
    timeout_s: float = 60.0,
    tolerance_mib: int = 256,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> GpuMemoryReport:
    """Poll `reader` until every GPU uses at most its baseline + `tolerance_mib`, or time runs out."""
    t0 = clock()
    now = reader()
    if now is None:
        return GpuMemoryReport("no GPUs", baseline, None)
    if baseline is None or len(baseline) != len(now):
        return GpuMemoryReport("no baseline", baseline, now)
    while True:
        over = [max(0, u - b - tolerance_mib) for u, b in zip(now, baseline, strict=True)]
        if not any(over):
            return GpuMemoryReport("back to baseline", baseline, now, clock() - t0)
        if clock() - t0 >= timeout_s:
            return GpuMemoryReport("not back", baseline, now, clock() - t0, over)
        sleep(poll_s)
        now = reader() or now
