"""What the machine calls a candidate: its label turned into a token safe for run markers, file names and
process environments.

A label is human text (any characters a study file can hold: `a/b`, `tp8-NCCL_P2P_DISABLE=1`, a newline).
Everything servelab derives from it for the machine goes through `token`: a readable slug plus a short
hash of the exact label, so the encoding is injective (`a/b`, `a_b` and `a?b` get three tokens) and holds
only `[A-Za-z0-9._-]` (never `=`, `/`, NUL or a newline, which markers and paths cannot carry).
"""

from __future__ import annotations

import hashlib
import re

# The SERVELAB_RUN markers' prefixes, spelled here only: a study's trial (`servelab-study:UID:TOKEN:REPEAT`,
# `run_marker`) and a deployed unit (`servelab-deploy:NAME`, `deploy_marker`).
STUDY_MARKER_PREFIX = "servelab-study"
DEPLOY_MARKER_PREFIX = "servelab-deploy:"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
SLUG_CHARS = 60  # the readable part; the hash keeps tokens of longer labels apart


def token(label: str) -> str:
    """`slug-hash`: the label's safe characters (others collapsed to `_`) and 10 hex digits of its
    SHA-256, so two labels never share a token even when their slugs agree."""
    slug = _UNSAFE.sub("_", label)[:SLUG_CHARS].strip("._-") or "c"
    digest = hashlib.sha256(label.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{slug}-{digest}"


def run_marker(prefix: str, uid: str, label: str, repeat: int, attempt: int = 0) -> str:
    """The SERVELAB_RUN value of one trial: `PREFIX:UID:TOKEN:REPEAT` (`PREFIX:UID:` finds a study's).
    A rerun on another node after a lost one adds `:ATTEMPT`: the lost attempt's teardown (on a node of
    the same machine, run late) ends the processes carrying its marker, never the rerun's."""
    return f"{prefix}:{uid}:{token(label)}:{repeat}" + (f":{attempt}" if attempt else "")


def study_markers(uid: str) -> str:
    """The prefix every run marker of study UID starts with (`servelab-study:UID:`): a sweep finds them."""
    return f"{STUDY_MARKER_PREFIX}:{uid}:"


def deploy_marker(name: str) -> str:
    """The SERVELAB_RUN value of deployed unit NAME (`servelab-deploy:NAME`)."""
    return DEPLOY_MARKER_PREFIX + name


def log_name(label: str, repeat: int, trial_id: int | None = None) -> str:
    """A trial's server log file name: one per candidate, repeat and trial (a retry never truncates the
    log of the trial before it)."""
    return f"{token(label)}-r{repeat}" + (f"-t{trial_id}" if trial_id is not None else "") + ".log"
