"""Log one GPU's power, utilization, memory and SM clock through NVML, every INTERVAL seconds, until stopped.

    python3 benchmarks/gpu/power_log.py OUT.csv [INTERVAL]

An independent record beside servelab's own readings: the GPU check integrates this file over each
bench level's window and sets it against the joules servelab stored for that level. Columns:
epoch_s, power_w, util_pct, mem_used_mib, sm_mhz. Stops on SIGTERM or SIGINT, flushing every row.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType


def main(out: str, interval: float) -> int:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    stop = False

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open(out, "w", buffering=1) as f:
        f.write("epoch_s,power_w,util_pct,mem_used_mib,sm_mhz\n")
        next_t = time.time()
        while not stop:
            now = time.time()
            power = pynvml.nvmlDeviceGetPowerUsage(h) / 1000
            util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).used // 2**20
            sm = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            f.write(f"{now:.3f},{power:.1f},{util},{mem},{sm}\n")
            next_t += interval
            time.sleep(max(0.0, next_t - time.time()))
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.1))
