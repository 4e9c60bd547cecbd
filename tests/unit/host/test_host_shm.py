"""servelab.host.shm with real /dev/shm files and a real process that maps or holds one."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from servelab.host.shm import PATTERNS, SHM_DIR, holders, remove_orphaned, segments, snapshot

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


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to create a file owned by another user")
def test_other_users_segments_are_never_removed(shm_files: list[Path]) -> None:
    path = _make(shm_files, "nccl-")
    os.chown(path, 65534, 65534)
    out = remove_orphaned([s for s in segments() if s.name == path.name])
    assert out.foreign == [path.name] and out.removed == [] and path.exists()
