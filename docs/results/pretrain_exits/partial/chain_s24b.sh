#!/bin/bash
# session 24, core 2: arm (a)'s claim-1 evaluation, then claim 2's equal-wall-time G=2 arm, then both reports
cd /work/exp_tree
PY=/work/main/.venv/bin/python
export OMP_NUM_THREADS=1
L=/work/exp_work/logs
nice -n 19 $PY -m experiments.pretrain_exits --scale report --work-dir /work/exp_work/pretrain --models G2_ge --no-report >> $L/E_G2.log 2>&1
nice -n 19 $PY -m experiments.grouping --scale report --work-dir /work/exp_work/pretrain --only G2_equal_time --no-report >> $L/Q4_G2time.log 2>&1
echo "chain b done $(date)" >> $L/chains.log
