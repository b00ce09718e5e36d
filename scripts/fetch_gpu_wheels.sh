#!/usr/bin/env bash
# Download (on a machine with PyPI access) the wheels scripts/gpu_check.sh needs on the GPU
# image, which has torch, pandas, jinja2, click, rich and nvidia-ml-py but not optuna.
# The GPU image runs Python 3.12 on x86_64; wheels/ is git-ignored and carried to the device
# (run: carry ["wheels"]). Only what the image lacks, without dependencies: optuna's others
# (numpy, packaging, pyyaml, tqdm) are there, and two versions of one package would shadow it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p wheels
python3 -m pip download -q --no-deps --dest wheels --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 \
  optuna alembic sqlalchemy greenlet mako colorlog
ls wheels
