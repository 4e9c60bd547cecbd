"""Measure this host for the performance model: allreduce latency/bandwidth and memory bandwidth.

Runs as a standalone script (no servelab imports) so it can run under any interpreter that has torch:

    python commprobe.py [--ranks N] [--backend nccl|gloo] [--iters K]

It spawns N processes with torch.distributed (NCCL on GPUs; gloo runs the same code path on CPUs),
times allreduce over the message sizes decode and prefill use, times a device copy for memory
bandwidth, and prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any, Protocol

SIZES = [2 * 1024, 8 * 1024, 32 * 1024, 128 * 1024, 1024 * 1024, 8 * 1024 * 1024, 32 * 1024 * 1024]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Queue(Protocol):
    """What the workers need of torch.multiprocessing's Queue."""

    def put(self, obj: Any) -> None: ...


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
    membw = None
    if rank == 0:
        n = 256 * 1024 * 1024 if backend == "nccl" else 64 * 1024 * 1024
        a = torch.empty(n, dtype=torch.uint8, device=device)
        b = torch.empty_like(a)
        b.copy_(a)
        sync()
        t = time.perf_counter()
        for _ in range(5):
            b.copy_(a)
        sync()
        membw = 2 * n * 5 / (time.perf_counter() - t) / 1e9
        queue.put({"allreduce": results, "mem_bw_gbs": membw})
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=0)
    ap.add_argument("--backend", default="")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print(json.dumps({"error": "torch is not installed in " + sys.executable}))
        sys.exit(3)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    ranks = args.ranks or (torch.cuda.device_count() if backend == "nccl" else 2)
    gpu = torch.cuda.get_device_name(0) if backend == "nccl" else "cpu"
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
    print(json.dumps({"backend": backend, "ranks": ranks, "device": gpu, "torch": torch.__version__, **out}))


if __name__ == "__main__":
    main()
