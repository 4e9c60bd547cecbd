"""servelab.host.shm with real /dev/shm files and a real process that maps or holds one."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from servelab.host.shm import (
    PATTERNS,
    SHM_DIR,
    ShmLedger,
    held_by,
    holders,
    remove_orphaned,
    segments,
    snapshot,
)

# Maps the file (then closes the fd) or keeps the fd open without mapping, like NCCL and Python's
# SharedMemory do at different moments.
HOLDER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
if sys.argv[2] == "map":
    m = mmap.mmap(fd, 4096)
    os.close(fd)
print("up", flush=True)
time.sleep(120)
"""


@pytest.fixture
def shm_files() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for p in made:
        p.unlink(missing_ok=True)


def _make(files: list[Path], prefix: str) -> Path:
    path = SHM_DIR / f"{prefix}servelabtest_{uuid.uuid4().hex[:10]}"
    path.write_bytes(b"\0" * 4096)
    files.append(path)
    return path


def _holder(path: Path, how: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), how], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def test_patterns_cover_the_engines() -> None:
    assert {"nccl-*", "psm_*", "vllm_*", "sgl_*", "*-cpushm*"} <= set(PATTERNS)


def test_segments_match_names_and_find_owners(shm_files: list[Path]) -> None:
    mapped = _make(shm_files, "psm_")
    held = _make(shm_files, "nccl-")
    free = _make(shm_files, "sgl_")
    other = _make(shm_files, "unrelated_")
    p1, p2 = _holder(mapped, "map"), _holder(held, "fd")
    try:
        found = {s.name: s for s in segments()}
        assert other.name not in found
        assert found[mapped.name].owners == (p1.pid,)
        assert found[held.name].owners == (p2.pid,)
        assert found[free.name].owners == ()
        assert found[free.name].size == 4096 and found[free.name].uid == os.getuid()
        assert holders([str(mapped)]) == {str(mapped): [p1.pid]}
    finally:
        for p in (p1, p2):
            p.kill()
            p.wait()
    # Owners gone: nothing holds them any more.
    assert all(not s.owners for s in segments() if s.name in {mapped.name, held.name})


def test_remove_orphaned_removes_only_unheld_segments(shm_files: list[Path]) -> None:
    held = _make(shm_files, "vllm_")
    free = _make(shm_files, "psm_")
    proc = _holder(held, "map")
    try:
        mine = [s for s in segments() if s.name in {held.name, free.name}]
        out = remove_orphaned(mine)
        assert out.removed == [free.name]
        assert [(s.name, s.owners) for s in out.kept] == [(held.name, (proc.pid,))]
        assert not free.exists() and held.exists()
    finally:
        proc.kill()
        proc.wait()
    out = remove_orphaned([s for s in segments() if s.name == held.name])
    assert out.removed == [held.name] and not held.exists()


def test_snapshot_tells_new_segments_from_old(shm_files: list[Path]) -> None:
    old = _make(shm_files, "psm_")
    before = snapshot()
    new = _make(shm_files, "psm_")
    created = [s.name for s in segments() if s.key not in before]
    assert new.name in created and old.name not in created


def test_a_recreated_segment_is_not_removed_by_a_stale_view(shm_files: list[Path]) -> None:
    path = _make(shm_files, "psm_")
    stale = next(s for s in segments() if s.name == path.name)
    path.unlink()
    _make(shm_files, "psm_")  # another name; now re-create the first one
    path.write_bytes(b"x")
    shm_files.append(path)
    out = remove_orphaned([stale])
    assert out.removed == [] and path.exists()


def test_other_users_segments_are_never_removed(shm_files: list[Path]) -> None:
    """A segment whose owner is not the cleaning user is reported as foreign and left alone. The cleaning
    user is another uid here (no root needed to make the file and the cleaner differ)."""
    path = _make(shm_files, "nccl-")
    other = 65534 if os.getuid() != 65534 else 65533
    out = remove_orphaned([s for s in segments() if s.name == path.name], uid=other)
    assert out.foreign == [path.name] and out.removed == [] and path.exists()
    out = remove_orphaned([s for s in segments() if s.name == path.name])  # its owner may remove it
    assert out.removed == [path.name] and not path.exists()


# A named semaphore the way vLLM's API server makes one (multiprocessing, "spawn"), then, on request, a
# spawned worker that opens it by name, as vLLM's EngineCore does: that open fails once the name is gone.
SEM_CREATOR = """
import multiprocessing as mp, sys

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    print(lock._semlock.name, flush=True)
    sys.stdin.readline()
    worker = ctx.Process(target=repr, args=(lock,))
    worker.start()
    worker.join(60)
    print("worker", worker.exitcode, flush=True)
"""


def test_a_named_semaphore_is_held_by_its_creator_and_survives_a_sweep(tmp_path: Path) -> None:
    """glibc's sem_open maps the semaphore under a temporary name (`sem.XXXXXX (deleted)` in the
    creator's maps) before linking it to `sem.mp-...`: matched by path, the creator did not hold it and a
    sweep removed it under a starting worker. Matched by inode, it is held and stays."""
    script = tmp_path / "sem_creator.py"
    script.write_text(SEM_CREATOR)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        name = "sem." + proc.stdout.readline().strip().lstrip("/")
        assert name.startswith("sem.mp-")
        seg = next(s for s in segments() if s.name == name)
        assert seg.owners == (proc.pid,)
        assert seg.inode in held_by([proc.pid])
        # A sweep that judges it by holders alone, as preflight does for dead runs' leftovers (limited to
        # this segment: a test never touches segments it did not create).
        swept = remove_orphaned([seg])
        assert name not in swept.removed and (SHM_DIR / name).exists()
        assert (name, (proc.pid,)) in [(k.name, k.owners) for k in swept.kept]
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "worker 0"  # the worker opened it by name
    finally:
        proc.kill()
        proc.wait(10)


def test_the_ledger_removes_only_what_the_runs_processes_held(shm_files: list[Path]) -> None:
    """A run's cleanup removes the segments that its own processes held and that were new at launch:
    not an older one, not another job's (held by a process outside the run), not a new unheld one.
    (Names outside PATTERNS: other jobs on this box sweep those, which would race this test.)"""
    pats = ("slt_servelabtest_*",)
    older = _make(shm_files, "slt_")
    holder_old = _holder(older, "map")
    ledger = ShmLedger.start(pats)
    assert ledger.before == {(older.name, older.stat().st_ino)}
    ours_mapped, ours_open = _make(shm_files, "slt_"), _make(shm_files, "slt_")
    theirs, unheld = _make(shm_files, "slt_"), _make(shm_files, "slt_")
    mine = [_holder(ours_mapped, "map"), _holder(ours_open, "fd")]
    other = _holder(theirs, "map")
    try:
        added = ledger.record([p.pid for p in mine] + [holder_old.pid])
        assert {n for n, _ in added} == {ours_mapped.name, ours_open.name}
        assert ledger.cleanup().removed == []  # still held: nothing removed yet
        assert ours_mapped.exists() and ours_open.exists()
        for p in mine:
            p.kill()
            p.wait()
        out = ledger.cleanup()
        assert sorted(out.removed) == sorted([ours_mapped.name, ours_open.name])
        assert not ours_mapped.exists() and not ours_open.exists()
        assert older.exists() and theirs.exists() and unheld.exists()
        # Re-created under a recorded name by somebody else: another inode, not ours.
        ours_mapped.write_bytes(b"x")
        assert ledger.cleanup().removed == [] and ours_mapped.exists()
    finally:
        for p in (*mine, other, holder_old):
            p.kill()
            p.wait()
