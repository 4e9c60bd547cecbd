#!/usr/bin/env bash
# The main job on a fresh machine: install servelab, then run the GLM-5 deployment study on the
# built-in simulator (no GPU needed): GLM-5 NVFP4 on 8x RTX PRO 6000 over PCIe Gen5, SGLang,
# comparing MoE runner backends, TP8 against TP4+PP2 and the allreduce-fusion flag, at concurrency
# 1 to 1,024 (examples/glm5-pcie.toml), two trials each, then the findings report. About 3 minutes on 2 cores (README.md).
#
#   bash scripts/demo.sh            # results in $SERVELAB_HOME (default: a fresh temporary directory)
#   bash scripts/demo.sh --json     # the study's result as JSON on stdout
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export SERVELAB_HOME="${SERVELAB_HOME:-$(mktemp -d -t servelab-demo-XXXX)}"
echo "servelab data: $SERVELAB_HOME" >&2
PIN=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN=(taskset -c 1); fi  # client away from the sim
"${PIN[@]}" .venv/bin/servelab tune examples/glm5-pcie.toml "$@"
# The findings document: one self-contained HTML file and Markdown with the plots beside it.
.venv/bin/servelab report glm5-pcie --html "$SERVELAB_HOME/glm5-pcie.html" --md "$SERVELAB_HOME/glm5-pcie.md" >/dev/null
echo "report: $SERVELAB_HOME/glm5-pcie.html (and .md); \`servelab ui\` browses the store" >&2
