#!/usr/bin/env bash
# The GLM-5 deployment story on the simulator: GLM-5 NVFP4 on 8x RTX PRO 6000 (PCIe Blackwell, SM120),
# SGLang, comparing MoE runner backends and TP8 against TP4+PP2 with `servelab bench` sweeps at
# concurrency 1, 16, 64.
#
# The simulator's clock runs SPEED times faster than a real GPU box, and `servelab bench` measures
# wall time, so measured latencies are SPEED times shorter and throughput SPEED times higher. The table
# at the end is rescaled to model (real-GPU) time: latency x SPEED, throughput / SPEED.
#
#   scripts/demo_sim.sh            # SPEED=20 (about 2 minutes)
#   SPEED=10 scripts/demo_sim.sh   # slower, less timer jitter (event-loop timers have 1 ms resolution)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SPEED=${SPEED:-20}
OUT=${OUT:-$(mktemp -d -t servelab-demo-XXXX)}
export SERVELAB_HOME=${SERVELAB_HOME:-$OUT/home}
MODEL=GLM-5-NVFP4
COMMON=(--model "$MODEL" --gpu rtx-pro-6000 --num-gpus 8 --personality sglang --speed "$SPEED" --port 0
        --disable-radix-cache)   # NSA attention crashes at start on SM120 with the radix cache on
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start() {  # name, extra flags...
  local name=$1; shift
  setsid "$PY" -m servelab sim "${COMMON[@]}" "$@" >"$OUT/$name.log" 2>&1 &
  PIDS+=($!)
  echo "$name: starting (log $OUT/$name.log)" >&2
}
port_of() { grep -m1 '^SIM-PORT' "$OUT/$1.log" | awk '{print $2}'; }
wait_ready() {
  for _ in $(seq 1200); do
    local p; p=$(port_of "$1" || true)
    if [[ -n "$p" ]] && curl -sf "http://127.0.0.1:$p/health" >/dev/null; then echo "$p"; return; fi
    sleep 0.1
  done
  echo "$1 never became ready:" >&2; tail -20 "$OUT/$1.log" >&2; exit 1
}

start tp8-cutlass --tp 8 --moe-runner-backend flashinfer_cutlass
start tp8-trtllm  --tp 8 --moe-runner-backend flashinfer_trtllm
start tp4-pp2     --tp 4 --pp 2 --moe-runner-backend flashinfer_cutlass

for name in tp8-cutlass tp8-trtllm tp4-pp2; do
  port=$(wait_ready "$name")
  echo "== $name ready on port $port; effective: $(curl -s "http://127.0.0.1:$port/get_server_info" |
        "$PY" -c 'import json,sys; d=json.load(sys.stdin); print("tp_size=%s pp_size=%s moe_runner_backend=%s" % (d["tp_size"], d["pp_size"], d["moe_runner_backend"]))')" >&2
  grep -h "MoE runner backend" "$OUT/$name.log" >&2 || true
  "$PY" -m servelab bench --url "http://127.0.0.1:$port" --model "$MODEL" --concurrency 1,16,64 \
      --num-requests 128 --input-len 1024 --output-len 128 --json >"$OUT/$name.json"
done

"$PY" - "$OUT" "$SPEED" <<'PYEOF'
import json, sys
from pathlib import Path
from servelab.model.predict import Workload, evaluate, make_setup
out, speed = Path(sys.argv[1]), float(sys.argv[2])
layouts = {"tp8-cutlass": dict(tp=8), "tp8-trtllm": dict(tp=8), "tp4-pp2": dict(tp=4, pp=2)}
print(f"\nGLM-5 NVFP4 on 8x RTX PRO 6000, SGLang personality, ISL 1024 / OSL 128; "
      f"measured at --speed {speed:g}, shown in model (real-GPU) time")
print(f"{'config':12s} {'c':>3s} {'out tok/s':>10s} {'TTFT p50':>9s} {'(pred)':>8s} {'TPOT p50':>9s} {'(pred)':>8s}")
for name, kw in layouts.items():
    d = json.loads((out / f"{name}.json").read_text())
    setup = make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8, engine="sglang", **kw)
    for lv in d["levels"]:
        s = lv["summary"]
        c = int(s["value"])
        p = evaluate(setup, Workload(1024, 128, c))
        print(f"{name:12s} {c:3d} {s['output_throughput'] / speed:10.1f} {s['ttft_ms']['p50'] * speed:9.1f} "
              f"{p.ttft_ms:8.1f} {s['tpot_ms']['p50'] * speed:9.2f} {p.tpot_ms:8.2f}")
print("\ntp8-trtllm equals tp8-cutlass: on SM120 SGLang replaces flashinfer_trtllm with flashinfer_cutlass "
      "(see its log line above).")
PYEOF
