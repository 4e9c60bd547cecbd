#!/usr/bin/env bash
# The GPU check: servelab on a real GPU, in one pass that fits a 10-minute device lease (docs/gpu.md).
#
#   bash benchmarks/gpu/device_check.sh OUTDIR
#
# Run from the repository root on a machine with one NVIDIA GPU, PyTorch and transformers (the device
# machine's image); servelab's own dependencies and `transformers serve`'s (pydantic, orjson, fastapi,
# uvicorn, openai, ...) as wheels in .whl/ when the machine cannot reach an index. Steps, each bounded by
# `timeout` so one that hangs does not take the rest with it:
#   1. an NVML power log for the whole pass (benchmarks/gpu/power_log.py, 10 Hz)
#   2. `servelab status --json` and `servelab doctor --json` on real NVML, before any server: the idle GPU
#   3. a random-weight Llama of ~1 B parameters (benchmarks/gpu/build_model.py)
#   4. `transformers serve --device cuda`, started by hand; `servelab bench` at concurrency 1 and 8 with
#      the GPU's power sampled by servelab (NVML); `servelab runs show` of that run; status while serving
#   5. `servelab tune`: the same server one request at a time against continuous batching, ranked by
#      joules per output token; `servelab runs study` and `servelab report`
# Everything lands in OUTDIR/gpucheck.tar.gz (the store, logs, JSON) and OUTDIR/summary.txt.
set -u
OUTDIR=${1:?usage: device_check.sh OUTDIR}
ROOT=$(pwd)
W=/tmp/gpucheck
rm -rf "$W"
mkdir -p "$W" "$OUTDIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_CACHE=$W/hub SERVELAB_HOME=$W/home
mkdir -p "$HF_HUB_CACHE"
DEVICE=${GPUCHECK_DEVICE:-cuda}  # cpu: a rehearsal on a machine without a GPU, with a tiny model
TINY=; [ "$DEVICE" = cpu ] && TINY=--tiny
if [ -d .whl ] && [ "$DEVICE" != cpu ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$ROOT/src
else
  export PYTHONPATH=$ROOT/src
fi
PY=$(command -v "${GPUCHECK_PY:-python3}")  # servelab's interpreter
EPY=$(command -v "${GPUCHECK_ENGINE_PY:-$PY}")  # the one with torch and transformers
SL=("$PY" -m servelab --db "$W/servelab.db")
step() { echo "== $(date -u +%H:%M:%S) $*"; }
finish() {
  [ -n "${SRV:-}" ] && kill "$SRV" 2>/dev/null
  [ -n "${LOG:-}" ] && kill "$LOG" 2>/dev/null
  sleep 1
  rm -rf "$W/model"  # the weights are rebuilt from the script, not carried back
  tar -C "$W" -czf "$OUTDIR/gpucheck.tar.gz" . 2>/dev/null
}
trap finish EXIT

step "nvidia-smi"
nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit,memory.used,clocks.sm --format=csv | tee "$W/nvidia-smi.csv"
"$PY" benchmarks/gpu/power_log.py "$W/power.csv" 0.1 &
LOG=$!

step "status and doctor, no server running"
timeout 30 "${SL[@]}" status --json > "$W/status_idle.json" 2> "$W/status_idle.err"; echo "status rc=$?"
timeout 30 "${SL[@]}" doctor --json > "$W/doctor.json" 2> "$W/doctor.err"; echo "doctor rc=$?"
date +%s.%N > "$W/idle_window_start"
sleep 8
date +%s.%N > "$W/idle_window_end"

step "build the model"
timeout 120 "$EPY" benchmarks/gpu/build_model.py "$W/model" $TINY || exit 1
MODEL=$W/model

step "transformers serve, started by hand"
date +%s.%N > "$W/serve_launch"
"$EPY" -m transformers.cli.transformers serve --device "$DEVICE" --host 127.0.0.1 --port 8011 "$MODEL" > "$W/serve.log" 2>&1 &
SRV=$!
timeout 150 "${SL[@]}" wait-ready http://127.0.0.1:8011 --engine transformers --model "$MODEL" --pid "$SRV" --timeout 140 --json > "$W/wait_ready.json" 2>&1; echo "wait-ready rc=$?"
date +%s.%N > "$W/serve_ready"
timeout 30 "${SL[@]}" status --url http://127.0.0.1:8011 --json > "$W/status_serving.json" 2> "$W/status_serving.err"; echo "status rc=$?"

step "servelab bench"
timeout 150 "${SL[@]}" bench --url http://127.0.0.1:8011 --model "$MODEL" --api chat --concurrency 1,8 --num-requests 16 \
  --input-len 256 --output-len 64 --no-exact-length --tokenizer "$MODEL" --gpu h200-sxm --num-gpus 1 \
  --scrape-interval 0.5 --json > "$W/bench.json" 2> "$W/bench.err"; echo "bench rc=$?"
timeout 30 "${SL[@]}" runs show last --json > "$W/runs_show.json" 2> "$W/runs_show.err"; echo "runs show rc=$?"
kill "$SRV"; wait "$SRV" 2>/dev/null; SRV=
sleep 3

step "servelab tune"
cat > "$W/study.toml" <<EOF
verify_output = false
objective = "energy"

[study]
name = "h200-transformers"
description = "transformers serve on one H200, a random-weight 1 B Llama: one request at a time against continuous batching, ranked by joules per output token"

[model]
path = "$MODEL"

[host]
gpu = "h200-sxm"
num_gpus = 1

[engine]
name = "transformers"
python = "$EPY"
startup_timeout_s = 240
env = { HF_HUB_CACHE = "$HF_HUB_CACHE", HF_HUB_OFFLINE = "1", TRANSFORMERS_OFFLINE = "1", PYTHONPATH = "$PYTHONPATH" }
[engine.options]
device = "$DEVICE"

[[candidates]]
name = "serial"
baseline = true

[[candidates]]
name = "continuous-batching"
args = ["--continuous-batching"]

[workload]
api = "chat"
input_len = 256
output_len = 64
num_requests = 16
tokenizer = "$MODEL"

[load]
concurrency = [1, 8]
EOF
timeout 30 "${SL[@]}" tune "$W/study.toml" --dry-run --json > "$W/tune_dry.json" 2> "$W/tune_dry.err"; echo "tune --dry-run rc=$?"
timeout 240 "${SL[@]}" tune "$W/study.toml" --json > "$W/tune.json" 2> "$W/tune.err"; echo "tune rc=$?"
timeout 30 "${SL[@]}" runs study last --json > "$W/runs_study.json" 2> "$W/runs_study.err"; echo "runs study rc=$?"
timeout 30 "${SL[@]}" report last --json > "$W/report.json" 2> "$W/report.err"; echo "report rc=$?"
timeout 30 "${SL[@]}" report last --md "$W/report.md" > /dev/null 2> "$W/report_md.err"; echo "report --md rc=$?"
step "done"
ls -la "$W" | tee "$OUTDIR/summary.txt"
