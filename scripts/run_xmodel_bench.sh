#!/bin/sh
# Every run of benchmarks/xmodel_map.py behind benchmarks/results/xmodel_map.{json,md,png}, in order, niced on one
# thread (hours on this project's CPU; each run resumes from its records, so rerunning this script continues).
# no set -e: a run exits 1 while the acceptance is not yet met (e.g. before the 1024-token run), and the next runs go on
cd "$(dirname "$0")/.."
export C2C_THREADS=1 OMP_NUM_THREADS=1
PY=${PYTHON:-.venv/bin/python}
A=Qwen2.5-Coder-0.5B-Instruct
B=Qwen2.5-Coder-1.5B-Instruct
$PY benchmarks/xmodel_map.py --source $A --target $B --doc-tokens 256
$PY benchmarks/xmodel_map.py --source $A --target $B --doc-tokens 1024
$PY benchmarks/xmodel_map.py --source $A --target $B --doc-tokens 256 --calibrate
$PY benchmarks/xmodel_map.py --source $B --target $A --doc-tokens 256
$PY benchmarks/xmodel_map.py --source $B --target $A --doc-tokens 1024
$PY benchmarks/xmodel_map.py --source $B --target $A --doc-tokens 256 --calibrate
