#!/bin/bash
# slurm/prep_data.sh - tokenize the pre-training corpus as a Slurm job array (J tasks, each takes its 1/J share of the
# data_prep units), then merge the shards with ONE dependent job that runs only if every array task succeeded.
#
# Submit both jobs at once (prints "<array job id> <finalize job id>"):
#   bash slurm/prep_data.sh submit [SBATCH OPTIONS...] -- INPUTS... --output OUT --tokenizer VOCAB [TOKENIZE OPTIONS...]
#   PREP_TASKS=64 bash slurm/prep_data.sh submit -p cpu -- data/raw/*.txt --output data/tok --tokenizer vocab.txt
# which is this pattern, by hand:
#   A=$(sbatch --parsable --array=0-31 slurm/prep_data.sh INPUTS... --output OUT --tokenizer VOCAB)
#   sbatch --dependency=afterok:$A --kill-on-invalid-dep=yes --job-name=eb-prep-finalize slurm/prep_data.sh finalize OUT
#
# In an array task it runs
#   python -m data_prep tokenize INPUTS... --output OUT --tokenizer VOCAB --num-tasks J --task-index j
# with J = SLURM_ARRAY_TASK_COUNT and j = this task's position in the array (0..J-1; --array=0-31 gives j = the
# task id). With PREP_NUM_TASKS set, J = PREP_NUM_TASKS and j = SLURM_ARRAY_TASK_ID, to re-run chosen tasks of a run:
#   PREP_NUM_TASKS=32 sbatch --array=5,17 slurm/prep_data.sh ...same args...
# Outside an array (plain sbatch or bash) it tokenizes everything in one task (J=1; data_prep then finalizes itself).
# data_prep uses --workers = SLURM_CPUS_PER_TASK processes per task by default.
#   `prep_data.sh finalize OUT [OPTIONS...]`  runs `python -m data_prep finalize OUT [OPTIONS...]`.
# A --max-unk-fraction F among the tokenize arguments of `submit` is passed to the finalize job too (both refuse a
# corpus whose [UNK] rate is above it: a vocabulary that does not fit the text; a task refuses after its first units).
#
# Relative paths are relative to the repository root (the job cd-s there). Sizes: the #SBATCH lines are defaults;
# sbatch options win (submit: options before `--`). Env:
#   PREP_TASKS        array size used by `submit` [32] (an explicit --array=... among the options wins)
#   PREP_NUM_TASKS    J for the tokenize tasks [SLURM_ARRAY_TASK_COUNT]
#   DATA_PREP_MODULE  python module [data_prep] (tests use a stand-in); + the knobs of slurm/common.sh.
# Output: %x-%j.out in the submit directory (`submit` names the array tasks %x-%A_%a.out).
#SBATCH --job-name=eb-prep-tokenize
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --output=%x-%j.out
set -euo pipefail

# The repository (Slurm runs a copy of this file from its spool directory), then the shared logic of slurm/common.sh.
EB_ROOT=$(for d in "${EB_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-.}/.." "$(dirname "$0")/.."; do
  [ -f "$d/slurm/common.sh" ] && echo "$d" && break; done; true)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "${EB_ROOT:?slurm/common.sh not found: submit from the repository or set EB_ROOT}/slurm/common.sh"

# ---- submit: the array + the dependent finalize job (runs on the login node; no eb_init there) ----------------------
if [ "${1:-}" = submit ]; then
  shift
  eb_submit_args "$0 submit [SBATCH OPTIONS...] -- INPUTS... --output OUT --tokenizer VOCAB [...]" "$@"
  set -- "${EB_JOB_ARGS[@]}"
  sbatch_opts=("${EB_SBATCH_OPTS[@]}")
  out=""
  fin_args=() # tokenize options that finalize must repeat
  args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[$i]} in
      --output) out=${args[$((i + 1))]:-} ;;
      --output=*) out=${args[$i]#--output=} ;;
      --max-unk-fraction) fin_args+=(--max-unk-fraction "${args[$((i + 1))]:-}") ;;
      --max-unk-fraction=*) fin_args+=("${args[$i]}") ;;
    esac
  done
  [ -n "$out" ] || eb_die "submit: the tokenize arguments need --output OUT"
  script=$EB_ROOT/slurm/prep_data.sh
  array_id=$(eb_sbatch --array="0-$((${PREP_TASKS:-32} - 1))" --output=%x-%A_%a.out "${sbatch_opts[@]}" \
    "$script" "$@")
  # The finalize job gets the same options (partition, account, ...) minus the array; output %x-%j.out.
  fin_opts=()
  for ((i = 0; i < ${#sbatch_opts[@]}; i++)); do
    case ${sbatch_opts[$i]} in
      --array | -a) i=$((i + 1)) ;; # and its value
      --array=* | -a?*) ;;
      *) fin_opts+=("${sbatch_opts[$i]}") ;;
    esac
  done
  fin_id=$(eb_sbatch "${fin_opts[@]}" --job-name=eb-prep-finalize --output=%x-%j.out \
    --dependency="afterok:$array_id" --kill-on-invalid-dep=yes "$script" finalize "$out" "${fin_args[@]}")
  echo "$array_id ${fin_id}"
  exit 0
fi

eb_init
DATA_PREP_MODULE=${DATA_PREP_MODULE:-data_prep}
if [ "${1:-}" = finalize ]; then
  shift
  [ $# -ge 1 ] || eb_die "usage: $0 finalize OUT [OPTIONS...]"
  eb_log "finalize: $EB_PYTHON -m $DATA_PREP_MODULE finalize $*"
  exec "$EB_PYTHON" -m "$DATA_PREP_MODULE" finalize "$@"
fi

[ $# -ge 1 ] || eb_die "usage: sbatch --array=0-31 $0 INPUTS... --output OUT --tokenizer VOCAB [...] (or: $0 submit)"
if [ -n "${SLURM_ARRAY_TASK_ID:-}" ] && [ -n "${PREP_NUM_TASKS:-}" ]; then # partial re-run: ids are indices
  num_tasks=$PREP_NUM_TASKS task_index=$SLURM_ARRAY_TASK_ID
elif [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then # position in the array (like data_prep's own SLURM_ARRAY_* reading)
  num_tasks=$SLURM_ARRAY_TASK_COUNT
  task_index=$(((SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-0}) / ${SLURM_ARRAY_TASK_STEP:-1}))
else
  num_tasks=1 task_index=0
fi
if [ "$task_index" -lt 0 ] || [ "$task_index" -ge "$num_tasks" ]; then
  eb_die "task index $task_index is outside 0..$((num_tasks - 1)) (PREP_NUM_TASKS=${PREP_NUM_TASKS:-unset})"
fi
eb_log "tokenize shard $task_index of $num_tasks: $EB_PYTHON -m $DATA_PREP_MODULE tokenize $*"
exec "$EB_PYTHON" -m "$DATA_PREP_MODULE" tokenize "$@" --num-tasks "$num_tasks" --task-index "$task_index"
