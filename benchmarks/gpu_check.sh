#!/usr/bin/env bash
# The prepared GPU check (issue 24): one command, every GPU code path, PASS/FAIL with figures, under 10 minutes.
#   benchmarks/gpu_check.sh            on a CUDA machine; writes $OUT/gpu_check.json when OUT is set
#   benchmarks/gpu_check.sh --dry-run  anywhere: every step resolved, parsed and printed, nothing executed
# Options: --only STEP..., --out DIR, --work-dir DIR (see benchmarks/gpu_check.py and docs/benchmarks.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
if [ ! -x "$PY" ]; then
  echo "gpu_check: no virtualenv python at $PY (run 'make .venv' first, or set PYTHON)" >&2
  exit 2
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PY" "$ROOT/benchmarks/gpu_check.py" "$@"
