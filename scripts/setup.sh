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
# llama-cpp-python (the `llama` extra) is built from source once per set of x86 SIMD levels, named
# from what this CPU reports (/proc/cpuinfo), not with -march=native (which died with an illegal
# instruction on these machines). The wheel is kept per set of flags, so a machine with other SIMD
# levels (AVX2 only, or AVX-512) never reuses a build it cannot run: pip's own wheel cache keys a
# source build by its version alone. A cold build takes about 7 minutes on 2 cores.
# AMX stays off (ggml's GGML_AMX_* options default to OFF, and these args never turn them on): on
# an Intel Xeon of these machines an AMX build (-DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON
# -DGGML_AMX_BF16=ON on top of these flags) built and generated from a short prompt, then died with
# an illegal instruction on a 512-token prefill. To try it anyway, set CMAKE_ARGS yourself.
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -m)" = x86_64 ] && [ -r /proc/cpuinfo ]; then
  cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { case "$cpu_flags" in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) \
-DGGML_F16C=$(has f16c) -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512_vbmi) \
-DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16) \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
fi
export CMAKE_ARGS="${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
LLAMA_PIN=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
[ -n "$LLAMA_PIN" ] || { echo "setup: no llama-cpp-python==X.Y.Z pin found in pyproject.toml" >&2; exit 1; }
LLAMA_KEY=$(printf '%s|%s|%s' "$LLAMA_PIN" "$CMAKE_ARGS" "$(.venv/bin/python -c 'import sys; print(sys.version_info[:2])')" \
  | sha256sum | cut -c1-16)
LLAMA_WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/c2c/wheels/llama-cpp-$LLAMA_KEY"
if ! ls "$LLAMA_WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "== building llama-cpp-python $LLAMA_PIN for this CPU (once per set of SIMD flags: ~7 min)"
  echo "   CMAKE_ARGS=$CMAKE_ARGS"
  rm -rf "$LLAMA_WHEELS.tmp"
  .venv/bin/python -m pip wheel --quiet --disable-pip-version-check --no-deps --no-cache-dir \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_PIN" -w "$LLAMA_WHEELS.tmp"
  mv "$LLAMA_WHEELS.tmp" "$LLAMA_WHEELS"
fi
if [ "$(cat .venv/.llama-cpp-build 2>/dev/null)" != "$LLAMA_KEY" ]; then  # a build for other flags, or none
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    "$LLAMA_WHEELS"/llama_cpp_python-*.whl
  echo "$LLAMA_KEY" > .venv/.llama-cpp-build
fi
# the flags the installed build was made with (its key is their hash), for benchmarks to record
printf '%s\n' "$CMAKE_ARGS" > .venv/.llama-cpp-cmake-args
echo "== installing c2c and its pinned dependencies"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
echo "== c2c $(.venv/bin/python -c 'import c2c; print(c2c.__version__)') ready in .venv"
