#!/usr/bin/env bash
# The flake check (docs/testing.md): the test command while another process keeps one core busy the
# whole time, as a shared CI box or a developer's build does. A test that passes only with a core to
# itself fails here. Usage: bash scripts/flake-check.sh [pytest args...]   (default: tests/integration)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# One CPU-bound process at normal priority, pinned nowhere: the scheduler shares it out like real load.
python3 -c 'while True: pass' &
BUSY=$!
trap 'kill "$BUSY" 2>/dev/null || true; wait "$BUSY" 2>/dev/null || true' EXIT
echo "[flake-check] pid $BUSY keeps one core busy while the tests run" >&2
if [ "$#" -eq 0 ]; then set -- tests/integration; fi
bash scripts/test.sh "$@"
