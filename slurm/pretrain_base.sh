#!/bin/bash
# slurm/pretrain_base.sh - pre-train ElasticBERT-base with DeepSpeed: 8 nodes x 8 GPUs, one task per GPU.
#
#   sbatch slurm/pretrain_base.sh [TRAINER ARGS...]          # from the repository root
#   sbatch --nodes=2 --time=2:00:00 -p gpu slurm/pretrain_base.sh --set train.train_steps=1000
#   RUN_DIR=runs/base-try2 DS_CONFIG=ds_configs/zero1_fp16.json sbatch slurm/pretrain_base.sh
#
# Sizes: every #SBATCH line below is a default; the same flag on the sbatch command line wins (--nodes,
#   --ntasks-per-node, --gpus-per-node: keep the last two equal, --cpus-per-task, --time, --partition, --signal ...).
# Env (sbatch exports the submitting shell's environment; relative paths are relative to the repository root):
#   CONFIG        model/training config                       [configs/elasticbert_base.yaml]
#   DS_CONFIG     DeepSpeed config overriding the one the run config names [empty: the run config decides]
#   RUN_DIR       the run directory (the trainer's --output): checkpoints/logs; keep it the same to resume
#                 [runs/<config file stem>]
#   PRETRAIN_MODULE  python module run as `python -m MODULE train ...` [pretrain] (tests use a stand-in)
#   + the knobs of slurm/common.sh (EB_VENV, EB_SIGNALS, EB_MAX_RESTARTS, EB_RANK_LOGS, ...).
# Extra arguments are passed to the trainer:
#   python -m pretrain train --config CONFIG --output RUN_DIR [--ds-config DS_CONFIG] [ARGS...]
# with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT in the environment of each task.
#
# Preemption: Slurm sends SIGUSR1 to this script 300 s before the time limit (--signal=B:USR1@300); it is forwarded to
# every rank. The trainer saves a checkpoint and exits 75; the job then requeues itself (`scontrol requeue`, same job
# id, SLURM_RESTART_COUNT+1) and resumes from RUN_DIR. Exit 0 = all steps done, no requeue. To preempt by hand:
#   scancel -b -s USR1 JOBID
# Output: %x-%j.out in the submit directory, appended to across restarts; events in RUN_DIR/logs/slurm_jobs.tsv.
# Several nodes: MASTER_ADDR is the first node (it must resolve to an address the others reach); a requeued job shrunk
# to fewer nodes resumes through the universal checkpoint; a dead rank fails the job (resubmit to resume). The
# details, and how to shrink a waiting job: docs/slurm.md, "Multi-node jobs".
#SBATCH --job-name=eb-pretrain-base
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -euo pipefail

# The repository (Slurm runs a copy of this file from its spool directory), then the shared logic of slurm/common.sh.
EB_ROOT=$(for d in "${EB_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-.}/.." "$(dirname "$0")/.."; do
  [ -f "$d/slurm/common.sh" ] && echo "$d" && break; done; true)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "${EB_ROOT:?slurm/common.sh not found: submit from the repository or set EB_ROOT}/slurm/common.sh"
eb_init

CONFIG=${CONFIG:-configs/elasticbert_base.yaml}
DS_CONFIG=${DS_CONFIG:-}
RUN_DIR=${RUN_DIR:-runs/$(basename "${CONFIG%.*}")}
PRETRAIN_MODULE=${PRETRAIN_MODULE:-pretrain}
[ -f "$CONFIG" ] || eb_die "config $CONFIG not found (relative to $EB_ROOT)"
[ -z "$DS_CONFIG" ] || [ -f "$DS_CONFIG" ] || eb_die "DeepSpeed config $DS_CONFIG not found (relative to $EB_ROOT)"
train_args=(train --config "$CONFIG" --output "$RUN_DIR")
[ -z "$DS_CONFIG" ] || train_args+=(--ds-config "$DS_CONFIG")

eb_rendezvous
eb_log_paths "$RUN_DIR"
# every node checked in seconds (GPUs, torch build, data, run directory, versions alike) before 64 ranks start
eb_preflight "$EB_PYTHON" -m "$PRETRAIN_MODULE" preflight "${train_args[@]:1}" "$@"
eb_run_preemptible "$EB_PYTHON" -m "$PRETRAIN_MODULE" "${train_args[@]}" "$@"
