#!/usr/bin/env bash
# Set everything up, then run the whole test suite on CPU.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# vLLM's CPU build in .venv-vllm for tests/vllm (the wheels are kept in ~/.cache/c2c/wheels: installed
# once, offline after). C2C_SKIP_VLLM=1 leaves it out; tests/vllm then skip, saying why.
if [ "${C2C_SKIP_VLLM:-0}" != 1 ]; then
  bash scripts/setup_vllm.sh
fi
if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing redis-server (the Redis store tests start their own instances)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "redis-server is missing: install it (e.g. sudo apt-get install redis-server) and rerun" >&2
    exit 1
  fi
fi
# Real zoo models used by tests marked `zoo` (pulled once into C2C_HOME, then reused). Qwen2.5-Coder-1.5B is read
# by the rendering invariant only (its tokenizer and template: tests/conversation/test_render.py), so that every
# zoo model's template is checked.
for m in Qwen2.5-Coder-0.5B-Instruct SmolLM2-135M-Instruct Gemma-3-270M Qwen2.5-Coder-1.5B-Instruct; do
  .venv/bin/c2c models pull "$m"
done
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
# pytest exit 5 means "no tests collected": a broken selection, never a pass.
if [ "$rc" = 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit $rc
