# shellcheck shell=bash
# jobs/lib.sh — what the Tessera batch scripts share (sourced, not run): start the srun
# step so that Slurm's warning signal reaches it, then turn the trainer's exit code into
# "done", "requeue" or "stop" and act on it.
#
# The decision itself (tsr_job_decide) is a pure function of its arguments so that
# tests/lint/jobs_lint.sh can check it without Slurm.  Everything that talks to Slurm is in
# tsr_job_finish and only runs inside a job.
#
# Exit codes of `tessera` (README.md): 0 done, 1 failure, 2 bad input, 3 stopped on
# SIGUSR1/SIGTERM after writing a checkpoint, 4 watchdog or heartbeat (a rank stalled or
# died).  srun returns the worst task's code, or 128+N when a task was killed by signal N.

# tsr_job_decide RC FAILURES MAX_RESTARTS — print what to do after a step ended with RC:
#   done     RC 0: the run reached max_steps.
#   requeue  RC 3: a checkpoint was written on the warning signal; always requeue, this is
#            the normal way a long run crosses wall-clock limits, so it is not counted.
#   stop     RC 2: bad deck, data or checkpoint; running it again would fail the same way.
#   requeue  any other RC (1 failure, 4 stall, 128+N killed) while FAILURES, the
#            failed attempts so far, is below MAX_RESTARTS; resume='auto' then restarts
#            from the newest complete checkpoint;
#   stop     once FAILURES reaches MAX_RESTARTS, so a broken run does not loop forever.
tsr_job_decide() {
  local rc=$1 failures=$2 max=$3
  case $rc in
    0) echo 'done' ;;
    3) echo requeue ;;
    2) echo stop ;;
    *) if [ "$failures" -lt "$max" ]; then echo requeue; else echo stop; fi ;;
  esac
}

# tsr_job_failed_node FILE — the node that srun's messages in FILE (the step's stderr)
# blame, or nothing.  A heuristic, in this order:
#   "srun: error: Node failure on NODE"             Slurm lost the node;
#   "... rank N (host NODE) has not been heard from ..."  the trainer's heartbeat, or the
#       watchdog of a rank waiting for it, named a rank that stopped answering;
#   "srun: error: NODE: task N: Exited with exit code C", the first one: the task that
#       ended on its own first (a rank that hit an error, or the watchdog of a rank that
#       found itself stuck).  Tasks merely "Killed" by srun afterwards are not evidence.
# It can be wrong: without the heartbeat (run.heartbeat_s = 0) a watchdog blocked waiting
# for a dead peer also exits by itself, and then names the waiting node, not the broken one.
tsr_job_failed_node() {
  local file=$1 node
  [ -r "$file" ] || return 0
  node=$(sed -n 's/^srun: error: Node failure on \([^ ,:]*\).*/\1/p' "$file" | head -n 1)
  if [ -z "$node" ]; then
    node=$(sed -nE 's/.*(heartbeat|waiting for a peer): rank [0-9]+ \(host ([^ )]+)\) has not been heard from.*/\2/p' \
      "$file" | head -n 1)
  fi
  if [ -z "$node" ]; then
    node=$(sed -n 's/^srun: error: \([^ :]*\): tasks\{0,1\} [0-9,-]*: Exited with exit code [1-9].*/\1/p' \
      "$file" | head -n 1)
  fi
  [ -n "$node" ] && echo "$node"
  return 0
}

tsr_job_log() { echo "$(date '+%F %T') [job ${SLURM_JOB_ID:-none}] $*"; }

# Where `make install` put the trainer: the installed copy of this file
# ($(pkgdatadir)/jobs/lib.sh) has the directory written in; in a source tree it stays a
# placeholder.
tsr_job_bindir='@tsr_bindir@'
# The directory this file is in (a batch script itself runs from Slurm's spool directory,
# but it sources this file from where it lies).
tsr_job_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# tsr_job_find_tessera — set TESSERA to the trainer this job runs, and say which:
#   $TESSERA when it is set;
#   else, for the installed scripts, the installed binary ($(bindir)/tessera);
#   else the source tree's src/tessera.
# The scripts of a source tree also look up deck names (DECK=llm7b) in that tree's input/
# (TESSERA_DATADIR, unless it is set), so that they run the decks they came with.
# Returns 1 with a message when the trainer is not there.
tsr_job_find_tessera() {
  local from=TESSERA top
  top=$(dirname "$tsr_job_dir")
  case $tsr_job_bindir in
    @*@) export TESSERA_DATADIR=${TESSERA_DATADIR:-$top} ;;
  esac
  if [ -z "${TESSERA:-}" ]; then
    case $tsr_job_bindir in
      @*@) TESSERA=$top/src/tessera from='the source tree' ;;
      *) TESSERA=$tsr_job_bindir/tessera from=installed ;;
    esac
  fi
  if [ ! -x "$TESSERA" ]; then
    tsr_job_log "error: no trainer at $TESSERA ($from): build it, or set TESSERA=/path/to/tessera"
    return 1
  fi
  tsr_job_log "trainer: $TESSERA ($from)"
}

# Set by the signal traps, read by tsr_job_run.
tsr_job_child=
tsr_job_signalled=0

tsr_job_forward() { # tsr_job_forward SIGNAL: pass it on to the running step
  tsr_job_signalled=1
  if [ -n "$tsr_job_child" ]; then
    tsr_job_log "got SIG$1: forwarding it to the step (pid $tsr_job_child); the trainer writes a checkpoint and exits with 3"
    kill -"$1" "$tsr_job_child" 2>/dev/null || true
  fi
}

# tsr_job_run ERRFILE COMMAND... — run COMMAND (the srun line) in the background with its
# stderr also copied to ERRFILE (rewritten by each attempt), forward SIGUSR1 and SIGTERM
# to it, wait for it and set TSR_JOB_RC to its exit status.
#
# Why in the background: bash runs a trap only between commands, so with srun in the
# foreground the warning signal would wait until the step had ended anyway.  `wait`
# returns early (status > 128) when a trapped signal arrives, so we wait again until
# the step itself has ended.  srun passes SIGUSR1 on to every task; on SIGTERM it ends
# the step itself, so SIGTERM only helps if the trainer manages to checkpoint before
# Slurm's KillWait runs out — the early SIGUSR1 from --signal is what makes it safe.
#
# With TSR_JOB_DRY_RUN=1 it prints COMMAND and ends the script with exit 0 instead: a check
# of what a job would run (the trainer found, the deck, the overrides), without Slurm.
tsr_job_run() {
  local errfile=$1 fd tee_pid
  shift
  if [ "${TSR_JOB_DRY_RUN:-0}" = 1 ]; then
    tsr_job_log "dry run (TSR_JOB_DRY_RUN=1), not started: $(printf '%q ' "$@")"
    exit 0
  fi
  # shellcheck disable=SC2034 # the job scripts read it
  TSR_JOB_RC=1
  tsr_job_signalled=0
  trap 'tsr_job_forward USR1' USR1
  trap 'tsr_job_forward TERM' TERM
  # tee gets its own descriptor so that we can wait for it to have written everything
  # before tsr_job_failed_node reads ERRFILE.
  exec {fd}> >(tee "$errfile" >&2)
  tee_pid=$!
  "$@" 2>&"$fd" &
  tsr_job_child=$!
  exec {fd}>&-
  while :; do
    wait "$tsr_job_child"
    # shellcheck disable=SC2034 # the job scripts read it
    TSR_JOB_RC=$?
    [ "$tsr_job_signalled" -eq 1 ] || break
    tsr_job_signalled=0 # wait was interrupted by the trap: the step is still running
  done
  tsr_job_child=
  trap - USR1 TERM
  wait "$tee_pid" 2>/dev/null || true
  # Slurm 22.05's srun returns 0 when no task could be started ("task 0 launch failed:
  # Unspecified error", seen when a step of the same id was still being cleaned up on a
  # node): that is not a finished run.
  if [ "$TSR_JOB_RC" -eq 0 ] && grep -q '^srun: error: task [0-9]* launch failed' "$errfile"; then
    tsr_job_log "srun returned 0, but tasks failed to launch (see above): counted as a failure"
    TSR_JOB_RC=1
  fi
}

# tsr_job_failures LEDGER — failed attempts of this job so far: every restart Slurm counted
# (SLURM_RESTART_COUNT, which also counts requeues after a node failure that Slurm did on
# its own) minus the checkpoint requeues recorded in LEDGER.
tsr_job_failures() {
  local ledger=$1 restarts=${SLURM_RESTART_COUNT:-0} ckpt=0 failures
  [ -r "$ledger" ] && ckpt=$(grep -c '^checkpoint' "$ledger")
  failures=$((restarts - ckpt))
  [ "$failures" -lt 0 ] && failures=0
  echo "$failures"
}

# tsr_job_finish RC OUT_DIR MAX_RESTARTS EXCLUDE_FAILED_NODE ERRFILE — act on the step's
# exit code, then exit the batch script.
tsr_job_finish() {
  local rc=$1 out=$2 max=$3 exclude=$4 errfile=$5
  local ledger="$out/slurm-$SLURM_JOB_ID.requeues" failures what node
  failures=$(tsr_job_failures "$ledger")
  what=$(tsr_job_decide "$rc" "$failures" "$max")
  tsr_job_log "step exit code $rc, restart ${SLURM_RESTART_COUNT:-0}, failed attempts $failures of $max: $what"
  case $what in
    done)
      tsr_job_log "training finished"
      exit 0 ;;
    stop)
      if [ "$rc" -eq 2 ]; then
        tsr_job_log "bad input (the message is above): fix the deck, data or checkpoint and sbatch again"
      else
        tsr_job_log "giving up after $failures failed attempts (MAX_RESTARTS=$max); resubmit to continue from the last checkpoint"
      fi
      exit "$rc" ;;
  esac
  local exclude_list=
  if [ "$rc" -eq 3 ]; then
    echo "checkpoint restart=${SLURM_RESTART_COUNT:-0}" >>"$ledger"
  else
    node=$(tsr_job_failed_node "$errfile")
    echo "failure restart=${SLURM_RESTART_COUNT:-0} rc=$rc node=${node:-unknown}" >>"$ledger"
    if [ -n "$node" ]; then
      echo "$node" >>"$out/failed_nodes"
      if [ "$exclude" -eq 1 ]; then
        exclude_list=$(sort -u "$out/failed_nodes" | paste -sd, -)
      else
        tsr_job_log "the failure points at $node (listed in $out/failed_nodes); not excluded (EXCLUDE_FAILED_NODE=0)"
      fi
    else
      tsr_job_log "no failed node identified; a dead node is left to Slurm (it is marked DOWN and not given to us again)"
    fi
  fi
  # A requeued job keeps its id and appends to the same output file (--open-mode=append);
  # Slurm holds it back for about two minutes (BeginTime) before it can start again.
  # Requeueing ends this attempt: Slurm sends SIGTERM to the script (and SIGKILL KillWait
  # seconds later, 30 by default).  Ignore the TERM, so that the exclusion below and the
  # log lines still happen.
  trap '' TERM
  if ! scontrol requeue "$SLURM_JOB_ID"; then
    tsr_job_log "scontrol requeue failed (job not requeueable, or cancelled): resubmit by hand"
    exit "$rc"
  fi
  tsr_job_log "requeued; it resumes from the newest complete checkpoint (checkpoint.resume='auto')"
  if [ -n "$exclude_list" ]; then
    # Slurm changes ExcNodeList only of a job that is not running (22.05: "Job is no
    # longer pending execution"), so this comes after the requeue, which makes it so.
    if scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$exclude_list"; then
      tsr_job_log "excluded $exclude_list from the next attempt"
    else
      tsr_job_log "Slurm would not exclude $exclude_list from the next attempt; the failed nodes are listed in $out/failed_nodes: pass them to sbatch --exclude if it fails again, and tell the admins"
    fi
  fi
  exit 0
}

# tsr_job_banner — where and how this attempt runs, at the top of every attempt's output.
tsr_job_banner() {
  tsr_job_log "start: restart ${SLURM_RESTART_COUNT:-0}, ${SLURM_JOB_NUM_NODES:-?} nodes (${SLURM_JOB_NODELIST:-?}), ${SLURM_NTASKS:-?} tasks"
}
