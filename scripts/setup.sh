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
echo "== installing c2c and its pinned dependencies"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
echo "== c2c $(.venv/bin/python -c 'import c2c; print(c2c.__version__)') ready in .venv"
