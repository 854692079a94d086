#!/usr/bin/env bash
# bench/gpu/gpu_wheels.sh — wheels for a GPU box with no network (the lent H200 image: Python 3.12, torch, transformers,
# tokenizers, safetensors, numpy, pyyaml, psutil, ninja, msgpack, einops... but no DeepSpeed). Run it here (PyPI
# reachable); carry .gpu_wheels/ to the box; bench/gpu/gpu_check.sh installs from it with --no-index.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=.gpu_wheels
PY=${PYTHON:-.venv/bin/python}
rm -rf "$DIR" && mkdir -p "$DIR"
DS_VERSION=$("$PY" -m pip show deepspeed | sed -n 's/^Version: //p')
# DeepSpeed ships an sdist only: build its pure-Python wheel (no ops compiled; they JIT-build on the GPU box)
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation "deepspeed==$DS_VERSION" -w "$DIR"
# its dependencies that the image lacks, as cp312 manylinux wheels, resolved together (pydantic pins its core)
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$DIR" hjson pydantic
printf '%s\n' "deepspeed==$DS_VERSION" hjson pydantic >"$DIR/requirements.txt"
du -sh "$DIR"
echo "ignore it in git: echo /$DIR/ >> .git/info/exclude"
