"""`--json` documents reach a slow reader whole, even when something left stdout non-blocking."""

from __future__ import annotations

import json
import subprocess
import sys
import time

WRITER = (
    "import os, sys\n"
    "os.set_blocking(sys.stdout.fileno(), False)\n"  # as an event loop or a child can leave it
    "from servelab.cli.output import emit\n"
    "emit({'x': 'a' * 1_000_000}, True)\n"
)


def test_a_large_document_reaches_a_lagging_pipe_reader_whole() -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)  # the reader lags: the 64 KiB pipe fills before anything is read
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert len(json.loads(out)["x"]) == 1_000_000


FLIPPER = (
    "import os, sys, threading\n"
    "fd = sys.stdout.fileno()\n"
    "def flip():\n"  # another holder of the pipe's write end turning it non-blocking again and again
    "    while True:\n"
    "        os.set_blocking(fd, False)\n"
    "threading.Thread(target=flip, daemon=True).start()\n"
    "from servelab.cli.output import emit\n"
    "emit({'x': 'a' * 1_000_000}, True)\n"
)


def test_a_document_arrives_whole_when_stdout_turns_non_blocking_during_the_write() -> None:
    """Setting stdout back to blocking once is not enough: another holder of the shared fd can flip it
    again mid-write (a `bench --find-capacity --json` arrived cut at 65,536 bytes with exit 0)."""
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", FLIPPER], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        time.sleep(0.5)  # the reader lags
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert len(json.loads(out)["x"]) == 1_000_000
