#!/bin/bash
# Resume issue 20's claim-2 arms (claim 1 is finished): two lanes at once, one core each, nice 19; finished units skip.
# Lane 1: G=1 (800 steps); lane 2: G=2 at equal wall time (1087 steps). Then the grouping report into the repo.
# Launch detached: setsid nohup bash resume_chain.sh > chain.out 2>&1 < /dev/null & disown
cd /work/exp_tree || exit 1
export OMP_NUM_THREADS=1
L=/work/exp_work/logs
grouping() { nice -n 19 /work/main/.venv/bin/python -m experiments.grouping --scale report --work-dir /work/exp_work/pretrain "$@"; }
grouping --only G1 --no-report >> $L/Q2_G1.log 2>&1 &
grouping --only G2_equal_time --no-report >> $L/Q4_G2time.log 2>&1 &
wait
grouping --output /work/main/docs/results/grouping >> $L/Q5_grouping_report.log 2>&1
