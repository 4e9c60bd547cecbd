#!/usr/bin/env bash
# Serve a tiny random-weight Qwen3-MoE with the real vLLM OpenAI server on the CPU.
# Builds the model locally (no download), starts vLLM pinned to core 0 (so a benchmark client on
# the other core does not fight it), waits for /health, and prints the URL on stdout.
# Usage: examples/serve_tiny_vllm.sh PORT PIDFILE LOGFILE
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT="${1:-8000}"
PIDFILE="${2:-$ROOT/.cache/tiny-vllm.pid}"
LOG="${3:-$ROOT/.cache/logs/tiny-vllm.log}"
PY="${SERVELAB_ENGINES_PYTHON:-$ROOT/.venv-engines/bin/python}"
MODEL_DIR="$ROOT/.cache/tiny-models/qwen3_moe"
mkdir -p "$(dirname "$LOG")" "$(dirname "$PIDFILE")"
[ -x "$PY" ] || { echo "engines venv missing: run scripts/install-engines.sh" >&2; exit 1; }
HF_HUB_OFFLINE=1 "$PY" "$ROOT/tests/support/tiny_models.py" --kind qwen3_moe --out "$MODEL_DIR" >&2
PIN=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN=(taskset -c 0); fi
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 HF_HUB_OFFLINE=1 setsid "${PIN[@]}" "$PY" \
    -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name tiny-qwen3-moe \
    --host 127.0.0.1 --port "$PORT" --max-model-len 4096 --dtype bfloat16 >"$LOG" 2>&1 &
echo $! >"$PIDFILE"
for _ in $(seq 1 200); do
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        echo "vLLM exited during start-up; last lines of $LOG:" >&2; tail -20 "$LOG" >&2; exit 1
    fi
    if "$ROOT/.venv/bin/python" -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2).status != 200)" 2>/dev/null; then
        echo "http://127.0.0.1:$PORT"
        exit 0
    fi
    sleep 1.5
done
echo "vLLM not ready after 300 s; see $LOG" >&2
exit 1
