#!/bin/bash
# session 23: resume claim 1 arms one after another on one core (nice 19), then the claim-1 evaluation + report
cd /work/exp_tree
PY=/work/main/.venv/bin/python
export OMP_NUM_THREADS=1
nice -n 19 $PY -m experiments.pretrain_exits --scale report --work-dir /work/exp_work/pretrain --models G2_ge --pretrain-only >> /work/exp_work/logs/P1_G2.log 2>&1
nice -n 19 $PY -m experiments.pretrain_exits --scale report --work-dir /work/exp_work/pretrain --models last_only --pretrain-only >> /work/exp_work/logs/P2_last.log 2>&1
nice -n 19 $PY -m experiments.pretrain_exits --scale report --work-dir /work/exp_work/pretrain --output /work/exp_work/pretrain_exits_out >> /work/exp_work/logs/Q3_claim1.log 2>&1
