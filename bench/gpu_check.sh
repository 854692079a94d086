#!/usr/bin/env bash
# bench/gpu_check.sh OUTPUT_DIR [--cpu] — the one prepared script for a GPU at hand (≤ 8 min on one modern GPU).
#
#   0. tests/gpu/test_first_contact.py: `pretrain preflight` on this node, torch's fused AdamW vs FusedAdam, fp16
#      attention without flash (a V100's kernels)                      -> OUTPUT_DIR/first_contact.{log,xml}
#   1. the environment (torch, CUDA, device, bf16 support)            -> OUTPUT_DIR/gpu_check.json "environment"
#   2. pytest -m gpu tests/gpu: a bf16 and an fp16 DeepSpeed step on NCCL with 1 process, save -> load -> continue
#      equal to an uninterrupted run, early-exit predictions equal between CPU and GPU
#   3. bench/gpu_bench.py: the pre-training step at base size (seq 128 and 512, masked-only heads, MFU against the
#      device's peak, G=2 vs G=1, and train.compile's path at seq 128) and early exit's wall ÷ FLOPs speed-up at
#      batch 1 and 32
#   -> OUTPUT_DIR/gpu_check.json + gpu_check.md (+ the tests' junit XML and logs); exit 1 if a test failed.
#
# --cpu: the same on the CPU at toy sizes, with this checkout's .venv (CI's smoke test of the script itself).
# On a GPU box whose Python lacks DeepSpeed (the lent H200 image has none and no network), first run
# `bash bench/gpu_wheels.sh` here and carry .gpu_wheels/: this script installs from it, offline.
set -euo pipefail
OUT=${1:?usage: bench/gpu_check.sh OUTPUT_DIR [--cpu]}
MODE=${2:-gpu}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
START=$(date +%s)
if [ "$MODE" = --cpu ]; then
  PY=${PYTHON:-.venv/bin/python}
  export EB_CHECK_DEVICE=cpu DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  BENCH_ARGS=(--device cpu --quick)
else
  PY=${PYTHON:-python3}
  unset EB_CHECK_DEVICE
  export DS_ACCELERATOR=cuda
  BENCH_ARGS=(--device cuda)
  if [ -d .gpu_wheels ]; then
    "$PY" -m pip install -q --no-index --find-links .gpu_wheels -r .gpu_wheels/requirements.txt 2>&1 | tail -n 3
  fi
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
status=0
# 0. first contact: the node's preflight (GPUs, torch build, precision), the default optimizer's kernel, attention
#    without flash in fp16 (as on a V100) — first, so a broken build is named before anything else runs
"$PY" -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu/test_first_contact.py --junitxml "$OUT/first_contact.xml" \
  2>&1 | tee "$OUT/first_contact.log" || status=$?
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests/gpu --ignore tests/gpu/test_first_contact.py \
  --junitxml "$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log" || status=$?
"$PY" bench/gpu_bench.py "${BENCH_ARGS[@]}" --tests-junit "$OUT/first_contact.xml" "$OUT/gpu_tests.xml" --output "$OUT" 2>&1 \
  | tee "$OUT/gpu_bench.log" || status=$?
echo "gpu_check: $(($(date +%s) - START)) s, report in $OUT/gpu_check.md (exit $status)"
exit "$status"
