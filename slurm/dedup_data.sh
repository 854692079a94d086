#!/bin/bash
# slurm/dedup_data.sh - deduplicate and decontaminate the pre-training corpora before tokenize, as four Slurm jobs
# that each start only if the one before succeeded:
#   1. signatures  (job array: task j of J signs the work units u with u mod J = j)
#   2. clusters    (one job: LSH bands -> clusters -> each document's keeper; uses its --cpus-per-task workers)
#   3. write       (job array: kept documents, evaluation-set n-grams cut, -> OUT/text/<corpus>/*.jsonl.zst)
#   4. report      (one job: dedup_report.json/.md, checksums.json)
#
# Submit all four at once (prints the four job ids):
#   bash slurm/dedup_data.sh submit [SBATCH OPTIONS...] -- [NAME=]INPUT... --output OUT [DEDUP OPTIONS...]
#   DEDUP_TASKS=64 bash slurm/dedup_data.sh submit -p cpu -- wiki=/data/wiki books=/data/books \
#       owt=/data/owt 'c4=/data/c4/*.jsonl.zst' --output /data/dedup
# then tokenize OUT/text (or one corpus, OUT/text/NAME) with slurm/prep_data.sh.
# By hand, a stage is `sbatch [--array=0-63] slurm/dedup_data.sh stage STAGE ARGS...`; a task of an array runs
#   python -m data_prep dedup ARGS... --stage STAGE --num-tasks J --task-index j
# with J = SLURM_ARRAY_TASK_COUNT and j = this task's position in the array (DEDUP_NUM_TASKS=J with
# --array=5,17 re-runs chosen tasks). Every stage resumes: a requeued or re-run task redoes only its missing units.
#
# Relative paths are relative to the repository root (the job cd-s there). Sizes: the #SBATCH lines are defaults;
# sbatch options win. data_prep uses --workers = SLURM_CPUS_PER_TASK processes per task by default. Env:
#   DEDUP_TASKS       array size used by `submit` for stages 1 and 3 [32]
#   DEDUP_NUM_TASKS   J for a re-run of chosen array tasks [SLURM_ARRAY_TASK_COUNT]
#   DATA_PREP_MODULE  python module [data_prep]; + the knobs of slurm/common.sh.
#SBATCH --job-name=eb-dedup
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --output=%x-%j.out
set -euo pipefail

EB_ROOT=$(for d in "${EB_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-.}/.." "$(dirname "$0")/.."; do
  [ -f "$d/slurm/common.sh" ] && echo "$d" && break; done; true)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "${EB_ROOT:?slurm/common.sh not found: submit from the repository or set EB_ROOT}/slurm/common.sh"

# ---- submit: the four dependent jobs (runs on the login node; no eb_init there) -------------------------------------
if [ "${1:-}" = submit ]; then
  shift
  eb_submit_args "$0 submit [SBATCH OPTIONS...] -- [NAME=]INPUT... --output OUT [...]" "$@"
  set -- "${EB_JOB_ARGS[@]}"
  script=$EB_ROOT/slurm/dedup_data.sh
  array="0-$((${DEDUP_TASKS:-32} - 1))"
  dep=()
  ids=()
  for stage in signatures clusters write report; do
    opts=("${EB_SBATCH_OPTS[@]}" --job-name="eb-dedup-$stage" "${dep[@]}")
    case $stage in
      signatures | write) opts+=(--array="$array" --output=%x-%A_%a.out) ;;
      *) opts+=(--output=%x-%j.out) ;;
    esac
    id=$(eb_sbatch "${opts[@]}" "$script" stage "$stage" "$@")
    ids+=("$id")
    dep=(--dependency="afterok:$id" --kill-on-invalid-dep=yes)
  done
  echo "${ids[*]}"
  exit 0
fi

eb_init
DATA_PREP_MODULE=${DATA_PREP_MODULE:-data_prep}
if [ "${1:-}" != stage ] || [ $# -lt 3 ]; then
  eb_die "usage: $0 stage signatures|clusters|write|report ARGS... (or: $0 submit)"
fi
stage=$2
shift 2
case $stage in
  signatures | write)
    if [ -n "${SLURM_ARRAY_TASK_ID:-}" ] && [ -n "${DEDUP_NUM_TASKS:-}" ]; then # partial re-run: ids are indices
      num_tasks=$DEDUP_NUM_TASKS task_index=$SLURM_ARRAY_TASK_ID
    elif [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
      num_tasks=$SLURM_ARRAY_TASK_COUNT
      task_index=$(((SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-0}) / ${SLURM_ARRAY_TASK_STEP:-1}))
    else
      num_tasks=1 task_index=0
    fi
    eb_log "dedup $stage, task $task_index of $num_tasks: $EB_PYTHON -m $DATA_PREP_MODULE dedup $*"
    exec "$EB_PYTHON" -m "$DATA_PREP_MODULE" dedup "$@" --stage "$stage" --num-tasks "$num_tasks" \
      --task-index "$task_index"
    ;;
  clusters | report)
    eb_log "dedup $stage: $EB_PYTHON -m $DATA_PREP_MODULE dedup $*"
    exec "$EB_PYTHON" -m "$DATA_PREP_MODULE" dedup "$@" --stage "$stage" --num-tasks 1 --task-index 0
    ;;
  *) eb_die "unknown stage $stage (signatures, clusters, write, report)" ;;
esac
