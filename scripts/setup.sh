#!/usr/bin/env bash
# Create (or refresh) the project venv .venv with servelab and its test tools. Idempotent.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
quiet() { "$@" 2>&1 | { grep -v 'is ignored: it is neither' || true; }; return "${PIPESTATUS[0]}"; }
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    quiet .venv/bin/python -m pip install -q --upgrade pip
fi
quiet .venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/servelab --version
