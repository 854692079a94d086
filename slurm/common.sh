# shellcheck shell=bash
# slurm/common.sh - the shared logic of the ElasticBERT Slurm batch scripts. SOURCE it (do not run it), after
# setting EB_ROOT to the repository root (each script finds it with the same three-line bootstrap, because Slurm runs a
# copy of the batch script from its spool directory, so `dirname "$0"` is not the repository there).
#
# Functions (all prefixed eb_):
#   eb_init               cd to EB_ROOT, set up the environment, install the preemption-signal traps. Call it first.
#   eb_rendezvous         export MASTER_ADDR (first host of the job) and MASTER_PORT (derived from the job id); in a
#                         multi-node job stop at once if MASTER_ADDR does not resolve or resolves to a loopback
#                         address (the other nodes could never reach it: torch would wait out its timeout).
#   eb_log_paths DIR      set EB_LOG_DIR (default DIR/logs), create it; append a line per event to
#                         EB_LOG_DIR/slurm_jobs.tsv (time, job, restart, event, detail).
#   eb_srun CMD...        srun one task per GPU (the job's --ntasks-per-node) on every node of THIS allocation, with
#                         torch.distributed's env contract: RANK=SLURM_PROCID WORLD_SIZE=SLURM_NTASKS
#                         LOCAL_RANK=SLURM_LOCALID, LOCAL_WORLD_SIZE, NODE_RANK=SLURM_NODEID (+ MASTER_ADDR/MASTER_PORT
#                         from eb_rendezvous); each task logs one "[eb-task] rank R/W ... host H" line. A job requeued
#                         onto fewer nodes keeps the task count of its first run in SLURM_NTASKS (Slurm 22.05): the
#                         step is then sized SLURM_JOB_NUM_NODES x --ntasks-per-node, and the trainer re-derives its
#                         layout (and converts the checkpoint) from the new WORLD_SIZE.
#                         A dead rank: its peers fail within seconds when their next collective finds the connection
#                         closed (gloo: "Connection closed by peer"); a rank that waits elsewhere (the rendezvous, a
#                         hung NCCL collective) is killed by srun EB_STEP_WAIT s after the first task ended (srun
#                         --wait), so a step never outlives a dead rank by more than EB_STEP_WAIT + KillWait.
#                         (--kill-on-bad-exit stays 0: with it, the first rank to exit 75 after a preemption save gets
#                         its peers killed, and the step's status would no longer say "saved, requeue me".)
#   eb_preflight CMD...   run CMD (`python -m pretrain preflight ARGS...`) once per node of the allocation (srun
#                         --ntasks-per-node=1, EB_TASKS_PER_NODE/EB_NUM_NODES/NODE_RANK in its environment) before the
#                         training launch; when it fails, stop the job (exit 1) with the failing node and its reason
#                         as the job's last line, before any rank starts. EB_PREFLIGHT=0 skips it.
#   eb_run_preemptible CMD...
#                         run `eb_srun CMD...` in the background and `wait` for it (so a trapped signal is handled at
#                         once), forward the preemption signal(s) to the step, and EXIT the batch script:
#                           step exit 0                -> exit 0 (finished; no requeue)
#                           step exit 75 (EX_TEMPFAIL) -> `scontrol requeue $SLURM_JOB_ID`, exit 0
#                              ("I saved a checkpoint because of preemption, please requeue me")
#                           other exit after a preemption signal was received -> requeue too (the trainer resumes
#                              from its last checkpoint), unless EB_REQUEUE_ON_SIGNAL=0
#                           any other exit code        -> exit with it (job FAILED, no requeue)
#   eb_log MSG / eb_die MSG
#   eb_submit_args USAGE ARGS...
#                         split the arguments of a script's `submit` at `--`: EB_SBATCH_OPTS (before), EB_JOB_ARGS
#                         (after); no `--`: stop with "usage: USAGE". (Login node: needs no eb_init.)
#   eb_sbatch SBATCH ARGS...  `sbatch --parsable ARGS...`, printing the job id alone (not "jobid;cluster").
#
# Environment knobs (all optional):
#   EB_ROOT               repository root (required before sourcing; see the scripts' bootstrap)
#   EB_VENV               virtualenv to use [EB_ROOT/.venv if it exists; otherwise the environment is left as is]
#   EB_PYTHON             python executable [python, i.e. the venv's]
#   DS_ACCELERATOR        [cuda if `nvidia-smi -L` works on the batch node, else cpu]
#   OMP_NUM_THREADS       [SLURM_CPUS_PER_TASK, else 1]
#   EB_SIGNALS            signals treated as "preemption is coming" and forwarded to the step [USR1]
#                         (match sbatch --signal=B:USR1@SECONDS; e.g. "USR1 TERM")
#   EB_REQUEUE_EXIT_CODE  the trainer's "saved, please requeue" exit code [75]
#   EB_REQUEUE_ON_SIGNAL  requeue after a preemption signal even if the step did not exit 75 [1]
#   EB_MAX_RESTARTS       do not requeue once SLURM_RESTART_COUNT reached this (stops requeue loops) [50]
#   EB_MASTER_ADDR / EB_MASTER_PORT   override the rendezvous (inherited MASTER_ADDR/PORT are ignored on purpose:
#                         sbatch exports the submitting shell's environment)
#   EB_STEP_WAIT          seconds srun waits after the first task ended before killing the rest (srun --wait): the
#                         longest a dead rank can leave the others waiting [120]
#   EB_RANK_LOGS          1: each rank writes EB_LOG_DIR/<job name>-<job id>-r<restart>-rank<N>.log instead of the
#                         job's output file (which then only gets these eb_log lines) [0: srun --label to the job log]
#   EB_SRUN_ARGS          extra srun options, whitespace-separated (e.g. "--cpu-bind=none")
#   EB_PREFLIGHT          0: skip the per-node preflight of eb_preflight [1]
#   EB_PEER_LOST_EXIT_CODE  the trainer's "a peer rank died" exit code [5]: a failed step's summary line names the
#                         first task that failed for another reason (srun's "NODE: task N: Killed")

eb_log() {
  printf '[eb-slurm %s job=%s restart=%s] %s\n' "$(date '+%F %T')" "${SLURM_JOB_ID:-none}" \
    "${SLURM_RESTART_COUNT:-0}" "$*" >&2
}
eb_die() {
  eb_log "ERROR: $*"
  exit 1
}

# ---- environment ----------------------------------------------------------------------------------------------------
eb_init() {
  if [ -z "${EB_ROOT:-}" ] || [ ! -f "$EB_ROOT/slurm/common.sh" ]; then
    eb_die "EB_ROOT='${EB_ROOT:-}' is not the repository"
  fi
  EB_ROOT=$(cd "$EB_ROOT" && pwd)
  export EB_ROOT
  cd "$EB_ROOT" || eb_die "cannot cd to $EB_ROOT"
  _eb_trap_signals # first: a signal may come while the rest is being set up

  if [ -n "${EB_VENV:-}" ]; then
    [ -x "$EB_VENV/bin/python" ] || eb_die "EB_VENV=$EB_VENV has no bin/python"
  elif [ -x "$EB_ROOT/.venv/bin/python" ]; then
    EB_VENV=$EB_ROOT/.venv
  fi
  if [ -n "${EB_VENV:-}" ]; then # what `source bin/activate` does, minus the prompt (and safe under set -u)
    export VIRTUAL_ENV=$EB_VENV
    export PATH="$EB_VENV/bin:$PATH"
  fi
  EB_PYTHON=${EB_PYTHON:-python}
  command -v "$EB_PYTHON" >/dev/null 2>&1 || eb_die "no '$EB_PYTHON' on PATH (set EB_VENV or EB_PYTHON)"

  if [ -z "${DS_ACCELERATOR:-}" ]; then # CUDA_VISIBLE_DEVICES is no proof of a GPU (GRES sets it regardless)
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DS_ACCELERATOR=cuda
    else DS_ACCELERATOR=cpu; fi
  fi
  export DS_ACCELERATOR
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
  # Slurm >= 22.05: srun no longer inherits the job's --cpus-per-task; pass it on explicitly.
  [ -z "${SLURM_CPUS_PER_TASK:-}" ] || export SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-$SLURM_CPUS_PER_TASK}
  export PYTHONUNBUFFERED=1
  export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
  eb_log "host=$(hostname) nodes=${SLURM_JOB_NODELIST:-?} tasks=${SLURM_NTASKS:-?} gpus/node=${SLURM_GPUS_ON_NODE:-0}" \
    "python=$(command -v "$EB_PYTHON") DS_ACCELERATOR=$DS_ACCELERATOR OMP_NUM_THREADS=$OMP_NUM_THREADS" \
    "commit=$(git -C "$EB_ROOT" rev-parse --short HEAD 2>/dev/null || echo none)"
}

# ---- rendezvous -----------------------------------------------------------------------------------------------------
eb_rendezvous() {
  if [ -z "${SLURM_JOB_ID:-}" ] || [ -z "${SLURM_JOB_NODELIST:-}" ]; then eb_die "eb_rendezvous: not in a Slurm job"; fi
  MASTER_ADDR=${EB_MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)}
  [ -n "$MASTER_ADDR" ] || eb_die "could not resolve the first host of '$SLURM_JOB_NODELIST'"
  # Same port on every restart of the job; different jobs (and array tasks: own job ids) get different ports.
  # 10000-29999 stays below Linux's ephemeral range (32768+).
  MASTER_PORT=${EB_MASTER_PORT:-$((10000 + SLURM_JOB_ID % 20000))}
  export MASTER_ADDR MASTER_PORT
  if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then _eb_check_master_reachable; fi
  eb_log "rendezvous MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
}
# The other nodes must reach MASTER_ADDR: a name that does not resolve, or resolves to 127.x / ::1 (a common
# /etc/hosts line for the node's own name), makes every rank wait for the rendezvous until the timeout.
_eb_check_master_reachable() {
  local addr
  addr=$(getent hosts "$MASTER_ADDR" 2>/dev/null | awk '{print $1; exit}') || true
  [ -n "$addr" ] || eb_die "MASTER_ADDR=$MASTER_ADDR does not resolve on $(hostname)" \
    "(set EB_MASTER_ADDR to its address)"
  case $addr in
    127.* | ::1)
      eb_die "MASTER_ADDR=$MASTER_ADDR resolves to the loopback address $addr on $(hostname): the other" \
        "${SLURM_JOB_NUM_NODES} nodes cannot reach it. Fix /etc/hosts there or set EB_MASTER_ADDR to an address" \
        "they can reach (and GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to its interface)"
      ;;
  esac
}

# ---- logs -----------------------------------------------------------------------------------------------------------
EB_LOG_DIR=${EB_LOG_DIR:-}
eb_log_paths() {
  EB_LOG_DIR=${EB_LOG_DIR:-$1/logs}
  mkdir -p "$EB_LOG_DIR"
  EB_LOG_DIR=$(cd "$EB_LOG_DIR" && pwd)
  export EB_LOG_DIR
  eb_log "logs: $EB_LOG_DIR (job output: $(_eb_job_output))"
}
_eb_job_output() { scontrol show job "${SLURM_JOB_ID:-0}" 2>/dev/null | sed -n 's/^ *StdOut=//p' | head -n1; }
# _eb_event EVENT DETAIL : one line in EB_LOG_DIR/slurm_jobs.tsv (if eb_log_paths was called)
_eb_event() {
  [ -n "$EB_LOG_DIR" ] || return 0
  printf '%s\t%s\t%s\t%s\t%s\n' "$(date '+%F %T')" "${SLURM_JOB_ID:-none}" "${SLURM_RESTART_COUNT:-0}" "$1" "${2:-}" \
    >>"$EB_LOG_DIR/slurm_jobs.tsv" || true
}

# ---- launching --------------------------------------------------------------------------------------------------------
# _eb_srun_cmd CMD... : fill the array EB_SRUN_CMD with the srun command line (so that `"${EB_SRUN_CMD[@]}" &` makes
# $! the srun process itself: signals sent to $! reach srun, which forwards them to every task)
_eb_srun_cmd() {
  local args=(--kill-on-bad-exit=0 --wait="${EB_STEP_WAIT:-120}") extra=() nodes=${SLURM_JOB_NUM_NODES:-}
  local tpn=${SLURM_NTASKS_PER_NODE:-}
  read -ra extra <<<"${EB_SRUN_ARGS:-}"
  if [ -n "$tpn" ] && [ -n "$nodes" ] && [ "${SLURM_NTASKS:-0}" -gt $((nodes * tpn)) ]; then
    eb_log "SLURM_NTASKS=$SLURM_NTASKS is from an earlier run of this job; this one has $nodes node(s):" \
      "running $nodes x $tpn tasks"
    args+=(--nodes="$nodes" --ntasks-per-node="$tpn" --ntasks=$((nodes * tpn)))
  fi
  if [ "${EB_RANK_LOGS:-0}" = 1 ] && [ -n "$EB_LOG_DIR" ]; then
    local base="$EB_LOG_DIR/${SLURM_JOB_NAME:-job}-${SLURM_JOB_ID:-0}-r${SLURM_RESTART_COUNT:-0}-rank%t.log"
    args+=(--output="$base" --error="$base")
  else
    args+=(--label)
  fi
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ] && [ -n "${SLURM_NTASKS_PER_NODE:-}" ] &&
    [ "$SLURM_GPUS_ON_NODE" != "$SLURM_NTASKS_PER_NODE" ]; then
    eb_log "WARNING: $SLURM_GPUS_ON_NODE GPUs/node but $SLURM_NTASKS_PER_NODE tasks/node (want one task per GPU)"
  fi
  # The single-quoted program runs in each task, where srun has set SLURM_PROCID etc.
  # shellcheck disable=SC2016
  EB_SRUN_CMD=(srun "${args[@]}" "${extra[@]}" bash -c '
    export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID NODE_RANK=$SLURM_NODEID
    t=${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}
    export LOCAL_WORLD_SIZE=${t%%(*}
    echo "[eb-task] rank $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE node $NODE_RANK host $(hostname)" \
      "master $MASTER_ADDR:$MASTER_PORT" >&2
    exec "$@"' eb-task "$@")
}
eb_srun() {
  _eb_srun_cmd "$@"
  "${EB_SRUN_CMD[@]}"
}

# ---- preflight --------------------------------------------------------------------------------------------------------
eb_preflight() {
  if [ "${EB_PREFLIGHT:-1}" = 0 ]; then
    eb_log "preflight skipped (EB_PREFLIGHT=0)"
    return 0
  fi
  local nodes=${SLURM_JOB_NUM_NODES:-1} tpn=${SLURM_NTASKS_PER_NODE:-1} out rc=0 start=$SECONDS verdict
  tpn=${tpn%%(*}
  out=$(mktemp "${TMPDIR:-/tmp}/eb-preflight.XXXXXX")
  eb_log "preflight: once on each of $nodes node(s) ($tpn task(s) per node to follow)"
  _eb_event preflight-start "$nodes nodes"
  # shellcheck disable=SC2016  # expanded in each task
  srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --kill-on-bad-exit=0 --wait=60 --label \
    bash -c 'export NODE_RANK=$SLURM_NODEID EB_NUM_NODES=$1 EB_TASKS_PER_NODE=$2; shift 2; exec "$@"' \
    eb-preflight "$nodes" "$tpn" "$@" >"$out" 2>&1 || rc=$?
  cat "$out" >&2
  if [ "$rc" = 0 ]; then
    _eb_event preflight-ok "$((SECONDS - start)) s"
    eb_log "preflight passed on $nodes node(s) in $((SECONDS - start)) s"
    rm -f "$out"
    return 0
  fi
  # the job's verdict (node 0's line), else the first node that says why, else srun's own word
  verdict=$(sed -nE 's/^ *[0-9]+: (preflight FAILED.*)$/\1/p' "$out" | head -n1)
  [ -n "$verdict" ] || verdict=$(sed -nE 's/^ *[0-9]+: (preflight [^ ]+: FAILED.*)$/\1/p' "$out" | head -n1)
  if [ -z "$verdict" ]; then # the command itself refused (a config error): the first such task's lines, joined
    local task host
    task=$(sed -nE 's/^ *([0-9]+): .*[Ee]rror.*/\1/p' "$out" | head -n1)
    task=${task:-0}
    host=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | sed -n "$((task + 1))p")
    verdict="preflight FAILED on ${host:-node $task} (node $task): $(sed -nE "s/^ *$task: *//p" "$out" | tr '\n' ' ')"
  fi
  rm -f "$out"
  _eb_event preflight-failed "$verdict"
  eb_die "$verdict (after $((SECONDS - start)) s; no rank started; EB_PREFLIGHT=0 skips the check)"
}

# ---- preemption / requeue -------------------------------------------------------------------------------------------
EB_STEP_PID=""
EB_GOT_SIGNAL=""
_EB_WAIT_INTERRUPTED=0
_eb_on_signal() {
  EB_GOT_SIGNAL=$1
  _EB_WAIT_INTERRUPTED=1
  _eb_event signal "$1"
  if [ -n "$EB_STEP_PID" ] && kill -0 "$EB_STEP_PID" 2>/dev/null; then
    eb_log "got SIG$1: forwarding it to the job step (srun pid $EB_STEP_PID)"
    kill -s "$1" "$EB_STEP_PID" 2>/dev/null || true # srun passes it on to every task
  else
    eb_log "got SIG$1 while no step runs"
  fi
}
_eb_trap_signals() {
  local sig
  for sig in ${EB_SIGNALS:-USR1}; do
    # shellcheck disable=SC2064  # expand $sig now
    trap "_eb_on_signal $sig" "$sig"
  done
}
_eb_requeue() {
  local why=$1 max=${EB_MAX_RESTARTS:-50}
  if [ "${SLURM_RESTART_COUNT:-0}" -ge "$max" ]; then
    eb_log "NOT requeueing ($why): already restarted ${SLURM_RESTART_COUNT} times (EB_MAX_RESTARTS=$max)"
    _eb_event requeue-refused "$why"
    exit "${EB_REQUEUE_EXIT_CODE:-75}"
  fi
  eb_log "requeueing job $SLURM_JOB_ID: $why"
  # logged before asking: a granted requeue may end this script before scontrol even returns
  _eb_event requeue "$why"
  if scontrol requeue "$SLURM_JOB_ID"; then
    exit 0 # Slurm ends this instance and starts the job again (same id, SLURM_RESTART_COUNT+1)
  fi
  eb_log "ERROR: 'scontrol requeue $SLURM_JOB_ID' failed (submitted with --no-requeue? JobRequeue=0?)"
  _eb_event requeue-failed "$why"
  exit "${EB_REQUEUE_EXIT_CODE:-75}"
}

eb_run_preemptible() {
  local rc prev code=${EB_REQUEUE_EXIT_CODE:-75}
  [ -n "${SLURM_JOB_ID:-}" ] || eb_die "eb_run_preemptible: not inside a Slurm job"
  if [ -n "$EB_GOT_SIGNAL" ]; then _eb_requeue "SIG$EB_GOT_SIGNAL arrived before the step started"; fi
  _eb_event start "$*"
  eb_log "step: $*"
  local out offset # where srun's report of this step will start in the job output (appended to across restarts)
  out=$(_eb_job_output)
  offset=$(stat -c %s "$out" 2>/dev/null || echo 0)
  _eb_srun_cmd "$@"
  "${EB_SRUN_CMD[@]}" &
  EB_STEP_PID=$!
  rc=0
  while :; do
    _EB_WAIT_INTERRUPTED=0
    prev=$rc
    rc=0
    wait "$EB_STEP_PID" || rc=$?
    # `wait` returns 128+N when the trap for signal N interrupted it; the step still runs then: wait again.
    if [ "$_EB_WAIT_INTERRUPTED" = 1 ] && [ "$rc" -gt 128 ]; then continue; fi
    # (a step that ended exactly while the trap ran was already reaped: keep its status)
    if [ "$rc" = 127 ] && [ "$prev" -gt 128 ]; then rc=$prev; fi
    break
  done
  EB_STEP_PID=""
  _eb_event exit "$rc"
  if [ "$rc" = 0 ]; then
    eb_log "step finished (exit 0)"
    exit 0
  elif [ "$rc" = "$code" ]; then
    _eb_requeue "the trainer exited $code (saved a checkpoint for preemption)"
  elif [ -n "$EB_GOT_SIGNAL" ] && [ "${EB_REQUEUE_ON_SIGNAL:-1}" = 1 ]; then
    _eb_requeue "SIG$EB_GOT_SIGNAL received and the step exited $rc (resuming from the last checkpoint)"
  fi
  eb_log "step failed (exit $rc)$(_eb_first_failed_task "$out" "$offset")"
  exit "$rc"
}

# _eb_first_failed_task OUTPUT OFFSET: ": first to fail: NODE task N (REASON)" from srun's own report in the job
# output after byte OFFSET (its "srun: error: NODE: task N: REASON" lines, in the order the tasks ended), skipping
# the ranks that only exited because a peer was gone (EB_PEER_LOST_EXIT_CODE); "" when there is no such line.
_eb_first_failed_task() {
  local out=$1 offset=$2 lines first
  [ -n "$out" ] && [ -r "$out" ] || return 0
  lines=$(tail -c +"$((offset + 1))" "$out" 2>/dev/null | grep -E '^srun: error: [^:]+: tasks? [0-9]' || true)
  [ -n "$lines" ] || return 0
  first=$(grep -v -m1 "Exited with exit code ${EB_PEER_LOST_EXIT_CODE:-5}\$" <<<"$lines" || true)
  [ -n "$first" ] || first=$(head -n1 <<<"$lines")
  first=${first#srun: error: }
  printf ': first to fail: %s task %s (%s); %s task line(s) in all' "${first%%:*}" \
    "$(sed -E 's/^[^:]+: tasks? ([^:]+):.*/\1/' <<<"$first")" "${first##*: }" "$(wc -l <<<"$lines")"
}

# ---- submitting (a script's `submit`, on the login node) --------------------------------------------------------------
eb_submit_args() {
  local usage=$1
  shift
  EB_SBATCH_OPTS=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    EB_SBATCH_OPTS+=("$1")
    shift
  done
  [ "${1:-}" = -- ] || eb_die "usage: $usage"
  shift
  # shellcheck disable=SC2034  # read by the calling script
  EB_JOB_ARGS=("$@")
}
eb_sbatch() {
  local id
  id=$(sbatch --parsable "$@") || return
  echo "${id%%;*}" # --parsable prints "jobid[;cluster]"
}
