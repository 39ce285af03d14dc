#!/bin/sh
# Rebuild the committed cross-model maps (about 25 minutes per direction on one thread of this project's CPU).
set -e
cd "$(dirname "$0")/.."
export C2C_THREADS=1 OMP_NUM_THREADS=1
A=Qwen2.5-Coder-0.5B-Instruct
B=Qwen2.5-Coder-1.5B-Instruct
c2c map fit --source $A --target $B --tokens 32768 --threads 1 --out checkpoints/xmodel/$A--$B.c2cmap
c2c map fit --source $B --target $A --tokens 32768 --threads 1 --out checkpoints/xmodel/$B--$A.c2cmap
