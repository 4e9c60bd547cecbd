#!/usr/bin/env bash
# The test command: installs everything the tests need (project venv, real engines), then runs
# ruff and the whole test suite, integration tests with real vLLM-on-CPU and transformers serve
# included. Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/install-engines.sh
.venv/bin/ruff check src tests benchmarks examples
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$rc"
