"""Server logs are hostile text: nothing servelab prints from one may reach the terminal as a control
sequence (a log line could retitle the window, clear the screen, or hide what follows)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from servelab.cli.output import printable
from servelab.cli.tune import _Progress
from servelab.events import NotApplied, TrialFinished, TrialStarted

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m\r"


def test_printable_shows_every_control_character_and_keeps_text() -> None:
    assert printable("a\tb\nc" + HOSTILE) == "a\tb\nc\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\x0d"


def test_logs_diagnose_prints_no_escape_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "INFO starting\n"
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB{HOSTILE} evil\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "servelab", "logs", "diagnose", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "CUDA out of memory" in p.stdout and "\\x1b]0;pwned" in p.stdout
    assert not any(c in p.stdout for c in "\x1b\x07\x9b\r")


def test_logs_diagnose_of_a_directory_says_so(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "servelab", "logs", "diagnose", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "is a directory" in p.stderr and "does not exist" not in p.stderr


def test_tune_progress_prints_no_escape_from_a_diagnosis() -> None:
    buf = io.StringIO()
    printer = _Progress(quiet=False, console=Console(file=buf, width=200), live=False)
    printer(TrialStarted("tp1", 0))
    printer(
        TrialFinished(
            "tp1", "failed", {"diagnosis": {"class": "oom", "evidence": "CUDA out of memory" + HOSTILE}}
        )
    )
    printer(NotApplied("tp1", ["max_num_seqs: log says 8" + HOSTILE]))
    out = buf.getvalue()
    assert "CUDA out of memory\\x1b]0;pwned" in out and "log says 8\\x1b" in out
    assert not any(c in out for c in "\x1b\x07\x9b\r")
