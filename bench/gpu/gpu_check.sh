#!/usr/bin/env bash
# bench/gpu/gpu_check.sh OUTPUT_DIR [--fast | --full] [--cpu] [--list] — the one prepared script for a lent GPU.
#
#   --fast  (≤ 2 min on one modern GPU): `pretrain preflight` on this node; bf16 and fp16 DeepSpeed training at
#           ElasticBERT-base size (seq 128, micro-batch 32, accumulation 2) -> resume through the CLI, equal to an
#           uninterrupted run (all runs launched at once); the export loads; early exit agrees between CPU and GPU;
#           the trainer's optimizer step against the bare model step (bench/pretrain/trainer_overhead.py, bf16: the ratio,
#           host syncs per step from CUDA's sync debug mode, MFU); the one-file ONNX early-exit model on ONNX Runtime's
#           CUDA provider (bench/gpu/serving_cuda.py: answers equal the CPU provider's, wall ÷ FLOPs vs the full file).
#   --full  (the default, ≤ 4 min): the same, plus the compiled bf16 train -> resume, DeepSpeed's FusedAdam built
#           by the preflight for this GPU's arch (started in the background first) against torch's fused AdamW,
#           fp16 attention without flash, the overhead bench in fp16 too, and bench/gpu/gpu_bench.py (the model step's
#           MFU at seq 128/512, G=2 vs G=1, train.compile; early exit's wall ÷ FLOPs speed-up at batch 1 and 32).
#   --cpu   the same on the CPU at toy sizes, with this checkout's .venv (CI runs `--cpu --fast`).
#   --list  print the parts of the mode and exit.
#
# Ends with one table (OUTPUT_DIR/gpu_check.md, also printed): each check, pass/fail/skip and its seconds, the
# trainer-vs-model ratio (goal ≤ 1.10), host syncs per step, MFU. Exit 1 if a check failed or a part crashed.
# On a GPU box whose Python lacks DeepSpeed (the lent H200 image has none and no network), first run
# `bash bench/gpu/gpu_wheels.sh` here and carry .gpu_wheels/: this script installs from it, offline.
set -uo pipefail
OUT=${1:?usage: bench/gpu/gpu_check.sh OUTPUT_DIR [--fast | --full] [--cpu] [--list]}
shift
MODE=full
DEVICE=cuda
LIST=0
for arg in "$@"; do
  case "$arg" in
    --fast) MODE=fast ;;
    --full) MODE=full ;;
    --cpu) DEVICE=cpu ;;
    --list) LIST=1 ;;
    *) echo "gpu_check: unknown option $arg (want --fast, --full, --cpu, --list)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.." || exit 2
PARTS="corpus tests overhead onnx-cuda report"
[ "$MODE" = full ] && PARTS="corpus fused-adam-build tests overhead onnx-cuda model-bench report"
if [ "$LIST" = 1 ]; then
  echo "gpu_check $MODE on $DEVICE: $PARTS"
  exit 0
fi
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
: >"$OUT/parts.tsv"
if [ "$DEVICE" = cpu ]; then
  PY=${PYTHON:-.venv/bin/python}
  export EB_CHECK_DEVICE=cpu DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  OVERHEAD=(--sizes tiny --precisions bf16 --quick --device cpu --micro-batch 4 --seq 64)
  BENCH=(--device cpu --quick)
  ONNX_CUDA=(--device cpu --quick)
else
  PY=${PYTHON:-python3}
  unset EB_CHECK_DEVICE
  export DS_ACCELERATOR=cuda
  OVERHEAD=(--sizes base --precisions bf16 --device cuda --steps 6)
  [ "$MODE" = full ] && OVERHEAD=(--sizes base --precisions bf16 fp16 --device cuda --steps 8)
  BENCH=(--device cuda)
  ONNX_CUDA=(--device cuda)
  if [ -d .gpu_wheels ]; then
    "$PY" -m pip install -q --no-index --find-links .gpu_wheels -r .gpu_wheels/requirements.txt 2>&1 | tail -n 3
  fi
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1

part() { # part NAME COMMAND...: run it, log to OUT/NAME.log, record its seconds and exit code
  local name=$1 t0 code
  shift
  t0=$(date +%s)
  echo "== $name ($(($(date +%s) - START)) s in)"
  "$@" >"$OUT/$name.log" 2>&1
  code=$?
  tail -n 5 "$OUT/$name.log"
  printf '%s\t%s\t%s\n' "$name" "$(($(date +%s) - t0))" "$code" >>"$OUT/parts.tsv"
}

"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
part corpus "$PY" -c "import sys; from pathlib import Path; sys.path.insert(0, '.');
from bench.pretrain.trainer_overhead import synthetic_corpus; synthetic_corpus(Path('$OUT/corpus'))"
export EB_CHECK_CORPUS="$OUT/corpus/prepared"
if [ "$MODE" = full ] && [ "$DEVICE" = cuda ]; then
  # DeepSpeed's FusedAdam for this GPU's arch, built while the tests start (the preflight test then loads it)
  "$PY" -c "from common.deepspeed_import import quiet_deepspeed; from pretrain.ds_runtime import set_op_build_arch
print(set_op_build_arch()); quiet_deepspeed('cuda')
from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" \
    >"$OUT/fused-adam-build.log" 2>&1 &
fi
MARK="gpu and not gpu_full"
[ "$MODE" = full ] && MARK="gpu"
part tests "$PY" -m pytest -q -s -p no:cacheprovider -m "$MARK" tests/gpu/test_first_contact.py tests/gpu/test_gpu.py \
  --junitxml "$OUT/gpu_tests.xml"
part overhead "$PY" bench/pretrain/trainer_overhead.py "${OVERHEAD[@]}" --data "$EB_CHECK_CORPUS" --output "$OUT"
# the one-file early-exit model (issue 60) on ONNX Runtime's CUDA provider: answers equal the CPU's, speed vs the full
# file (bench/gpu/serving_cuda.py; needs onnxruntime-gpu on the box, else it reports "skipped")
part onnx-cuda "$PY" bench/gpu/serving_cuda.py "${ONNX_CUDA[@]}" --output "$OUT"
PARTS_ARG=(--parts)
if [ "$MODE" = full ]; then
  PARTS_ARG=(--parts model early_exit)
fi
wait
echo "== report ($(($(date +%s) - START)) s in)"
"$PY" bench/gpu/gpu_bench.py "${BENCH[@]}" "${PARTS_ARG[@]}" --mode "$MODE" --tests-junit "$OUT/gpu_tests.xml" \
  --overhead "$OUT/trainer_overhead.json" --timings "$OUT/parts.tsv" --output "$OUT" 2>&1 | tee "$OUT/report.log"
status=${PIPESTATUS[0]}
echo "gpu_check $MODE: $(($(date +%s) - START)) s, report in $OUT/gpu_check.md (exit $status)"
exit "$status"
