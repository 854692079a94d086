#!/bin/bash
# slurm/pretrain_large.sh - pre-train ElasticBERT-large (24 layers): slurm/pretrain_base.sh with CONFIG defaulting to
# configs/elasticbert_large.yaml and RUN_DIR to runs/elasticbert_large. Everything else (env knobs, arguments,
# preemption/requeue) is documented in slurm/pretrain_base.sh.
#
#   sbatch slurm/pretrain_large.sh [TRAINER ARGS...]
#   sbatch --nodes=16 --time=48:00:00 slurm/pretrain_large.sh
#
# sbatch reads #SBATCH lines only from the submitted file, hence this header; the command line still wins.
#SBATCH --job-name=eb-pretrain-large
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --mem=0
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -euo pipefail

for EB_ROOT in "${EB_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-.}/.." "$(dirname "$0")/.."; do
  [ -f "$EB_ROOT/slurm/common.sh" ] && break
done
[ -f "$EB_ROOT/slurm/pretrain_base.sh" ] || { echo "slurm/ not found: submit from the repo or set EB_ROOT" >&2; exit 1; }
export EB_ROOT
export CONFIG=${CONFIG:-configs/elasticbert_large.yaml}
# exec keeps this process (the one Slurm signals with `--signal=B:...`/`scancel -b`), now running pretrain_base.sh
exec bash "$EB_ROOT/slurm/pretrain_base.sh" "$@"
