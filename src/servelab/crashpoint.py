"""A test hook: `SERVELAB_TEST_CRASH_AT=STEP[#N]` makes servelab SIGKILL itself the Nth time (default the
first) it reaches STEP, so a test can leave the store exactly as a `kill -9` at that moment would.

Read here only. The steps of a study's trial, in order (docs/study.md, "Resume"): `launching` (the command
line is stored, nothing started), `launched` (the server runs, its pid is stored), `ready`, `verified`,
`level-started` (a level's bench run is open), `level-done` (the level is stored), `finished` (the trial's
outcome is stored, the server still runs), `teardown` (the server's group is stopped, the report not yet
stored) and `torn-down` (the teardown report is stored). Unset, `reached` costs one environment lookup.

`SERVELAB_TEST_STALL_AT=STEP:SECONDS` makes servelab block (synchronously, signals held off like any busy
loop) for SECONDS each time it reaches STEP, so a test can hold a step open long enough to act during it
without racing the machine's speed. The stalled steps: `prompt-built` (one prompt of a workload built).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

ENV = "SERVELAB_TEST_CRASH_AT"
STALL_ENV = "SERVELAB_TEST_STALL_AT"
_seen: Counter[str] = Counter()


def reached(step: str) -> None:
    """SIGKILL this process when `step` is the one `SERVELAB_TEST_CRASH_AT` names, at its Nth time."""
    want = os.environ.get(ENV)
    if not want:
        return
    name, _, nth = want.partition("#")
    if name != step:
        return
    _seen[step] += 1
    if _seen[step] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def stall(step: str) -> None:
    """Sleep without yielding when `step` is the one `SERVELAB_TEST_STALL_AT` names."""
    want = os.environ.get(STALL_ENV)
    if not want:
        return
    name, _, seconds = want.partition(":")
    if name == step:
        time.sleep(float(seconds or 1))
