#!/usr/bin/env bash
# Installs megatron-zaya and its dependencies into the current Python environment.
#   bash scripts/install.sh            # runtime only
#   bash scripts/install.sh test       # plus the test extras (pytest, transformers reference)
# GPU users: install your ROCm or CUDA build of torch first; this script never replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! $PY -c "import torch" 2>/dev/null; then
    echo "[install] no torch found: installing torch==2.13.0 (for the CPU-only build, install torch from https://download.pytorch.org/whl/cpu first)"
    $PY -m pip install -q "torch==2.13.0"
fi
extras=${1:-}
if [ -n "$extras" ]; then target=".[$extras]"; else target="."; fi
$PY -m pip install -q -e "$target"
