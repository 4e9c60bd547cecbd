#!/usr/bin/env bash
# The test command: installs everything the tests need (project venv, real engines), then runs
# ruff and the whole test suite, integration tests with real vLLM-on-CPU and transformers serve
# included. Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/install-engines.sh
# Headless Chromium for the browser tests (tests/integration/test_*_browser.py): Debian's package, driven by
# Playwright as the system browser (never `playwright install`: no browser downloads).
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: /usr/bin/chromium is missing and installing it needs root:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends chromium" >&2
        exit 1
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
fi
# tests/unit/deploy verify generated units with systemd-analyze: install Debian's systemd when it is
# missing (as root, non-interactive, idempotent; the tests fail, never skip, without it).
if ! command -v systemd-analyze >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
# tests/support/sshd.py runs a real Debian sshd on 127.0.0.1 for the remote-host tests (and `ip netns` for
# the namespace one). /etc/ssh/sshd_not_to_be_run, written before the install, keeps the package from
# starting a system sshd on port 22 (Debian's unit and init script honour it): the tests start their own.
if [ ! -x /usr/sbin/sshd ] || ! command -v ip >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: /usr/sbin/sshd (or ip) is missing and installing it needs root:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends openssh-server iproute2" >&2
        exit 1
    fi
    mkdir -p /etc/ssh
    touch /etc/ssh/sshd_not_to_be_run
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server iproute2
    if [ -d /run/systemd/system ]; then
        systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
    fi
fi
# tests/support/postgres.py starts a throwaway PostgreSQL 15 cluster of its own (initdb and pg_ctl in a
# temporary directory, on a free port of 127.0.0.1) for the store's tests: install Debian's postgresql-15
# when it is missing. A policy-rc.d answering 101 keeps the install from starting any service, and the
# system cluster the package creates (15/main, port 5432) is dropped: nothing listens after the install.
if [ ! -x /usr/lib/postgresql/15/bin/initdb ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: /usr/lib/postgresql/15/bin/initdb is missing and installing it needs root:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends postgresql-15" >&2
        exit 1
    fi
    policy=/usr/sbin/policy-rc.d
    saved=""
    if [ -e "$policy" ]; then
        saved="$(mktemp)"
        cp -p "$policy" "$saved"
    fi
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql-15
    if [ -n "$saved" ]; then mv "$saved" "$policy"; else rm -f "$policy"; fi
    if command -v pg_dropcluster >/dev/null 2>&1 && [ -d /etc/postgresql/15/main ]; then
        pg_dropcluster --stop 15 main || true
    fi
    if [ -d /run/systemd/system ]; then
        systemctl disable --now postgresql.service >/dev/null 2>&1 || true
    fi
fi
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/ruff format --check src tests benchmarks examples scripts
.venv/bin/mypy --strict src
set +e
# Both cores (docs/testing.md): SERVELAB_TEST_WORKERS=0 runs in this one process. Tests sharing one server
# (vLLM, transformers serve, the Ray cluster) are grouped onto one worker by tests/conftest.py.
WORKERS="${SERVELAB_TEST_WORKERS:-2}"
XDIST=()
if [ "$WORKERS" != "0" ]; then XDIST=(-n "$WORKERS" --dist loadgroup); fi
.venv/bin/python -m pytest -q -p no:cacheprovider "${XDIST[@]}" --durations=30 "$@"  # the 30 slowest: where CI time goes
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$rc"
