#!/usr/bin/env bash
# A real-engine demo: install servelab and the engines, serve a tiny model with real
# vLLM on the CPU, and measure it with `servelab bench` at three concurrency levels.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/install-engines.sh
PIDFILE="$ROOT/.cache/demo-vllm.pid"
PORT="$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
stop() { [ -f "$PIDFILE" ] && kill -TERM -- "-$(cat "$PIDFILE")" 2>/dev/null; rm -f "$PIDFILE"; }
trap stop EXIT
echo "starting vLLM (CPU) with a tiny Qwen3-MoE on port $PORT ..." >&2
URL="$(bash examples/serve_tiny_vllm.sh "$PORT" "$PIDFILE" "$ROOT/.cache/logs/demo-vllm.log")"
PIN=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN=(taskset -c 1); fi
"${PIN[@]}" .venv/bin/servelab bench --url "$URL" --model tiny-qwen3-moe --concurrency 1,4,16 \
    --num-requests 48 --input-len 128 --output-len 64 --tokenizer .cache/tiny-models/qwen3_moe \
    --slo 'ttft_ms<=500,tpot_ms<=50' "$@"
.venv/bin/servelab runs list --limit 3
