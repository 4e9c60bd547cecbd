#!/usr/bin/env bash
# The main job on a fresh machine: install servelab, then run the GLM-5 deployment study on the
# built-in simulator (no GPU needed): GLM-5 NVFP4 on 8x RTX PRO 6000 over PCIe, SGLang, MoE runner
# backends and TP8 against TP4+PP2, each measured with `servelab bench` at concurrency 1, 16, 64
# and set beside `servelab predict`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
exec bash scripts/demo_sim.sh "$@"
