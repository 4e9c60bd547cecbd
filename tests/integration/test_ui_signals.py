"""`servelab ui` stops on Ctrl-C and SIGTERM even when started with SIGINT ignored (what a background job of
a non-interactive shell inherits; Python then installs no KeyboardInterrupt handler of its own)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# exec keeps an ignored signal ignored: the ui starts as a background job of a script would.
_LAUNCH = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ui_stops_on_a_signal_even_when_sigint_was_ignored(sig: signal.Signals, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCH, sys.executable, "-m", "servelab", "ui", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "SERVELAB_HOME": str(tmp_path / "home")},
    )
    try:
        assert proc.stdout is not None
        url = json.loads(proc.stdout.readline())["url"]
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
        proc.send_signal(sig)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
