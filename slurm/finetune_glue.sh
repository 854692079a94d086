#!/bin/bash
# slurm/finetune_glue.sh - fine-tune on GLUE: a Slurm job array over every (task, seed) combination, one GPU each.
#
#   MODEL=runs/elasticbert_base/hf DATA_DIR=../shared/data/glue bash slurm/finetune_glue.sh submit [SBATCH OPTIONS...] \
#       [-- FINETUNE ARGS...]                                       # sizes the array to TASKS x SEEDS itself
#   bash slurm/finetune_glue.sh list                               # array index -> task seed
#   MODEL=... DATA_DIR=... sbatch --array=0-39 slurm/finetune_glue.sh [FINETUNE ARGS...]   # the same, by hand
#   TASKS="rte mrpc" SEEDS="1 2 3" MODEL=... bash slurm/finetune_glue.sh submit -p gpu -- --exits all --method 2st
#   MODEL=... sbatch --array=7,12 slurm/finetune_glue.sh ...       # re-run two combinations (same TASKS/SEEDS)
#
# Array index i runs (as one srun task with RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR/MASTER_PORT set)
#   python -m finetune train --task T --seed S --output FT_OUT/T/seedS [--model MODEL] [--data-dir DATA_DIR] [ARGS...]
# with T = TASKS[i / #SEEDS], S = SEEDS[i % #SEEDS] (index = line of `list`).
# Env:
#   MODEL            --model (HF dir: our export, a BERT checkpoint...); or pass --model in ARGS
#   DATA_DIR         --data-dir (GLUE root); omitted when empty
#   FT_OUT           output root                    [runs/finetune_glue]
#   TASKS            GLUE tasks                     [cola sst2 mrpc stsb qqp mnli qnli rte]
#   SEEDS            seeds                          [1 2 3 4 5]
#   FINETUNE_MODULE  python module                  [finetune] (tests use a stand-in); + the knobs of slurm/common.sh
# Sizes: the #SBATCH lines are defaults (--array=0-39 fits the default 8 tasks x 5 seeds); sbatch options win.
# Preemption: Slurm sends SIGUSR1 to this script 300 s before the time limit (--signal=B:USR1@300); it is forwarded to
# the trainer, which finishes its optimizer step, saves a resume checkpoint in FT_OUT/T/seedS/resume and exits 75;
# the array task then requeues itself (`scontrol requeue`, SLURM_RESTART_COUNT+1) and the same command resumes it,
# ending with the weights and scores of an uninterrupted run. A finished combination exits 0 (no requeue); rerunning
# one that finished is refused by the trainer (pass --overwrite in ARGS to redo it). To preempt one by hand:
#   scancel -b -s USR1 JOBID_INDEX
# Output: %x-%A_%a.out in the submit directory; events (signal, requeue) in FT_OUT/T/seedS/logs/slurm_jobs.tsv.
#SBATCH --job-name=eb-finetune-glue
#SBATCH --array=0-39
#SBATCH --ntasks=1
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --time=12:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --open-mode=append
#SBATCH --output=%x-%A_%a.out
set -euo pipefail

# The repository (Slurm runs a copy of this file from its spool directory), then the shared logic of slurm/common.sh.
EB_ROOT=$(for d in "${EB_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-.}/.." "$(dirname "$0")/.."; do
  [ -f "$d/slurm/common.sh" ] && echo "$d" && break; done; true)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "${EB_ROOT:?slurm/common.sh not found: submit from the repository or set EB_ROOT}/slurm/common.sh"

read -ra tasks <<<"${TASKS:-cola sst2 mrpc stsb qqp mnli qnli rte}"
read -ra seeds <<<"${SEEDS:-1 2 3 4 5}"
n_combos=$((${#tasks[@]} * ${#seeds[@]}))
[ "$n_combos" -gt 0 ] || eb_die "TASKS and SEEDS must not be empty"

case "${1:-}" in
  list)
    for ((i = 0; i < n_combos; i++)); do echo "$i ${tasks[$((i / ${#seeds[@]}))]} ${seeds[$((i % ${#seeds[@]}))]}"; done
    exit 0
    ;;
  submit)
    shift
    sbatch_opts=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do sbatch_opts+=("$1"); shift; done
    [ "${1:-}" != -- ] || shift
    # TASKS/SEEDS reach the job through sbatch's default --export=ALL
    export TASKS="${tasks[*]}" SEEDS="${seeds[*]}"
    job_id=$(sbatch --parsable --array="0-$((n_combos - 1))" "${sbatch_opts[@]}" "$EB_ROOT/slurm/finetune_glue.sh" "$@")
    echo "${job_id%%;*}"
    exit 0
    ;;
esac

eb_init
[ -n "${SLURM_ARRAY_TASK_ID:-}" ] || eb_die "submit as an array: sbatch --array=0-$((n_combos - 1)) $0 (or: $0 submit)"
i=$SLURM_ARRAY_TASK_ID
[ "$i" -lt "$n_combos" ] || eb_die "array index $i >= ${#tasks[@]} tasks x ${#seeds[@]} seeds = $n_combos"
task=${tasks[$((i / ${#seeds[@]}))]}
seed=${seeds[$((i % ${#seeds[@]}))]}
eb_log "combination $i of $n_combos: task=$task seed=$seed"
out_dir=${FT_OUT:-runs/finetune_glue}/$task/seed$seed
ft_args=(train --task "$task" --seed "$seed" --output "$out_dir")
[ -z "${MODEL:-}" ] || ft_args+=(--model "$MODEL")
[ -z "${DATA_DIR:-}" ] || ft_args+=(--data-dir "$DATA_DIR")
eb_rendezvous
eb_log_paths "$out_dir"
eb_run_preemptible "$EB_PYTHON" -m "${FINETUNE_MODULE:-finetune}" "${ft_args[@]}" "$@"
