#!/usr/bin/env bash
# Set up c2c in ./.venv (idempotent). Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $PY"
  "$PY" -m venv .venv
fi
# torch==2.13.0 is pinned in pyproject; a CPU wheel of it lies in /opt/wheels on these machines.
[ -d /opt/wheels ] && export PIP_FIND_LINKS="${PIP_FIND_LINKS:-/opt/wheels}"
# llama-cpp-python (the `llama` extra) is built from source, for this CPU family but not with
# -march=native (which died with an illegal instruction on these machines): the x86 SIMD levels
# are named instead. A cold build takes about 7 minutes on 2 cores; pip caches the wheel after.
# (AMX flags, GGML_AMX_*, need a CPU with AMX; set CMAKE_ARGS to build with them there.)
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
echo "== installing c2c and its pinned dependencies (llama-cpp-python from source: ~7 min the first time)"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-binary llama-cpp-python -e ".[test]"
echo "== c2c $(.venv/bin/python -c 'import c2c; print(c2c.__version__)') ready in .venv"
