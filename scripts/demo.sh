#!/usr/bin/env bash
# Set everything up, then run the main demo on the default model and store.
# Usage: bash scripts/demo.sh [c2c demo flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/c2c models pull Qwen2.5-Coder-0.5B-Instruct
exec .venv/bin/c2c demo "$@"
