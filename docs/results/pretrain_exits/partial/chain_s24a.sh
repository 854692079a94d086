#!/bin/bash
# session 24, core 1: arm (b) 600 -> 800, its claim-1 evaluation, then claim 2's G=1 arm (pre-train + probes)
cd /work/exp_tree
PY=/work/main/.venv/bin/python
export OMP_NUM_THREADS=1
L=/work/exp_work/logs
nice -n 19 $PY -m experiments.pretrain_exits --scale report --work-dir /work/exp_work/pretrain --models last_only --pretrain-only >> $L/P2_last.log 2>&1
nice -n 19 $PY -m experiments.pretrain_exits --scale report --work-dir /work/exp_work/pretrain --models last_only --no-report >> $L/E_last.log 2>&1
nice -n 19 $PY -m experiments.grouping --scale report --work-dir /work/exp_work/pretrain --only G1 --no-report >> $L/Q2_G1.log 2>&1
echo "chain a done $(date)" >> $L/chains.log
