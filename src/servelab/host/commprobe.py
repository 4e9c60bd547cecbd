"""Measure this host for the performance model: allreduce latency/bandwidth and memory bandwidth.

Runs as a standalone script (no servelab imports) so it can run under any interpreter that has torch:

    python commprobe.py [--ranks N] [--backend nccl|gloo] [--iters K]

It spawns N processes with torch.distributed (NCCL on GPUs; gloo runs the same code path on CPUs),
times allreduce over the message sizes decode and prefill use, times a device copy for memory
bandwidth, and prints one JSON object on stdout. On a CPU host (gloo) the memory copy (256 MiB, past
any L3) and a matmul (FP32/BF16 TFLOPS) run in the parent before the ranks start, on all the threads
torch uses, so `mem_bw_gbs` is the DRAM bandwidth an engine on these cores gets.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

SIZES = [2 * 1024, 8 * 1024, 32 * 1024, 128 * 1024, 1024 * 1024, 8 * 1024 * 1024, 32 * 1024 * 1024]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Queue(Protocol):
    """What the workers need of torch.multiprocessing's Queue."""

    def put(self, obj: Any) -> None: ...


def measure_memory(
    torch: Any, device: Any, nbytes: int, sync: Callable[[], None] | None = None, reps: int = 10
) -> dict[str, object]:
    """Memory bandwidth: a copy of `nbytes` (read + write), best of `reps` (the quietest moment of a
    shared machine). On a CPU the buffer is far larger than any L3, so it measures DRAM, with all the
    threads torch uses (every core the engine would get)."""
    a = torch.ones(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(reps):
        if sync:
            sync()
        t = time.perf_counter()
        b.copy_(a)
        if sync:
            sync()
        best = min(best, time.perf_counter() - t)
    return {
        "mem_bw_gbs": 2 * nbytes / best / 1e9,
        "mem_bw_method": f"copy of {nbytes // (1024 * 1024)} MiB, best of {reps}",
    }


def measure_matmul(torch: Any, reps: int = 5, n: int = 1024) -> dict[str, float]:
    """CPU matmul rate (TFLOPS) in FP32 and BF16: the compute peak the catalog's `tflops_bf16` stands for
    (BF16 without AVX512-BF16/AMX runs through FP32, or far slower in plain torch)."""
    out: dict[str, float] = {}
    for name in ("float32", "bfloat16"):
        dt = getattr(torch, name)
        x = torch.randn(n, n, dtype=dt)
        y = torch.randn(n, n, dtype=dt)
        x @ y
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            x @ y
            best = min(best, time.perf_counter() - t)
        out[f"matmul_tflops_{'fp32' if name == 'float32' else 'bf16'}"] = 2.0 * n**3 / best / 1e12
    return out


def _worker(rank: int, world: int, backend: str, iters: int, port: int, queue: _Queue) -> None:
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize(device)

    results = []
    for size in SIZES:
        x = torch.ones(size // 2, dtype=torch.bfloat16 if backend == "nccl" else torch.float16, device=device)
        for _ in range(3):
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync()
        results.append({"bytes": size, "us": (time.perf_counter() - t) / iters * 1e6})
    if rank == 0:
        out: dict[str, object] = {"allreduce": results}
        if backend == "nccl":  # GPU memory: measured here, on this rank's device
            out.update(measure_memory(torch, device, 256 * 1024 * 1024, sync))
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=0)
    ap.add_argument("--backend", default="")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # runs under the engines venv
        import torch.multiprocessing as mp  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        print(json.dumps({"error": "torch is not installed in " + sys.executable}))
        sys.exit(3)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    ranks = args.ranks or (torch.cuda.device_count() if backend == "nccl" else 2)
    gpu = torch.cuda.get_device_name(0) if backend == "nccl" else "cpu"
    host: dict[str, object] = {}
    if backend != "nccl":
        # CPU memory and FLOPs: measured here, before the ranks start, so they do not compete for cores
        host = {
            **measure_memory(torch, torch.device("cpu"), 256 * 1024 * 1024),
            **measure_matmul(torch),
            "cpu_threads": torch.get_num_threads(),
            "cpu_model": _cpu_model(),
        }
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, ranks, backend, args.iters, port, queue)) for r in range(ranks)
    ]
    for p in procs:
        p.start()
    out = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    doc = {"backend": backend, "ranks": ranks, "device": gpu, "torch": torch.__version__, **host, **out}
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
