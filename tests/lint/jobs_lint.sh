#!/bin/bash
# jobs_lint.sh — the Slurm job scripts (jobs/*.slurm, jobs/lib.sh) parse and pass the
# `shellcheck -x` linter, and their requeue logic does what the scripts promise, checked without
# Slurm: the decision table, the failed-node heuristic, the failure count, signal
# forwarding to a stand-in step, and tsr_job_finish against a stand-in scontrol.
. "${top_srcdir:-.}/tests/lib.sh"
command -v shellcheck >/dev/null || skip "shellcheck not installed (apt-get install shellcheck)"
scratch
cd "$top_srcdir" || exit 1 # the scripts' `# shellcheck source=jobs/lib.sh` is relative to here

for f in jobs/*.slurm jobs/lib.sh; do
  check "bash -n $f" bash -n "$f"
  check "shellcheck -x $f" shellcheck -x "$f"
done

# shellcheck source=jobs/lib.sh
. jobs/lib.sh

decides() { # decides RC FAILURES MAX EXPECTED
  local got
  got=$(tsr_job_decide "$1" "$2" "$3")
  [ "$got" = "$4" ] || { echo "    tsr_job_decide $1 $2 $3 printed '$got', expected '$4'"; return 1; }
}
check "rc 0 -> done" decides 0 0 5 'done'
check "rc 3 -> requeue" decides 3 0 5 requeue
check "rc 3 -> requeue however many failures" decides 3 7 5 requeue
check "rc 2 -> stop (bad input)" decides 2 0 5 stop
check "rc 1 below MAX_RESTARTS -> requeue" decides 1 0 5 requeue
check "rc 4 (watchdog) below MAX_RESTARTS -> requeue" decides 4 4 5 requeue
check "rc 4 at MAX_RESTARTS -> stop" decides 4 5 5 stop
check "rc 137 (killed) -> requeue" decides 137 1 5 requeue
check "rc 1 with MAX_RESTARTS 0 -> stop" decides 1 0 0 stop

# The failed node from srun's messages.
cat >"$SCRATCH/exited.err" <<'ERR'
[rank 13] watchdog: step 7 has been in a training step for 901 s ... this rank is stuck; aborting the job (exit code 4)
srun: error: gpu017: tasks 8-12,14-15: Killed
srun: error: gpu018: task 13: Exited with exit code 4
srun: error: gpu019: task 20: Exited with exit code 4
ERR
printf '%s\n' 'srun: error: gpu017: tasks 8-15: Killed' 'srun: error: Node failure on gpu042' \
  'srun: error: gpu018: task 13: Exited with exit code 1' >"$SCRATCH/nodefail.err"
printf '%s\n' 'srun: error: gpu017: tasks 0-7: Killed' 'srun: error: gpu018: task 9: Exited with exit code 0' \
  >"$SCRATCH/killed.err"
check "failed node: first task that exited by itself" \
  test "$(tsr_job_failed_node "$SCRATCH/exited.err")" = gpu018
check "failed node: a node failure comes first" \
  test "$(tsr_job_failed_node "$SCRATCH/nodefail.err")" = gpu042
cat >"$SCRATCH/heartbeat.err" <<'ERR'
error: heartbeat: rank 21 (host gpu021) has not been heard from for 10.1 s (run.heartbeat_s = 10): it died or stopped responding; its last heartbeat had it at step 7, 2.0 s into a training step, inside all_reduce on group 'dp'; aborting the job with MPI_Abort (exit code 4)
srun: error: gpu017: tasks 1-7: Killed
srun: error: gpu016: task 0: Exited with exit code 4
ERR
check "failed node: the rank the heartbeat names, not the rank that reported it" \
  test "$(tsr_job_failed_node "$SCRATCH/heartbeat.err")" = gpu021
printf '%s\n' "[rank 3] watchdog: step 9 has been in a training step for 900 s (run.step_timeout_s = 600), blocked in all_reduce on group 'dp' waiting for a peer: rank 12 (host gpu019) has not been heard from for 899.5 s; its last heartbeat had it at step 9" \
  'srun: error: gpu016: task 3: Exited with exit code 4' >"$SCRATCH/waiting.err"
check "failed node: the peer a waiting watchdog names" \
  test "$(tsr_job_failed_node "$SCRATCH/waiting.err")" = gpu019
check "failed node: none when tasks were only killed" \
  test -z "$(tsr_job_failed_node "$SCRATCH/killed.err")"
check "failed node: none without a file" test -z "$(tsr_job_failed_node "$SCRATCH/absent")"

# Failed attempts = Slurm's restarts minus the checkpoint requeues in the ledger.
printf '%s\n' 'checkpoint restart=0' 'failure restart=1 rc=1 node=gpu018' 'checkpoint restart=2' \
  >"$SCRATCH/ledger"
check "failures: 3 restarts, 2 of them checkpoints -> 1" \
  test "$(SLURM_RESTART_COUNT=3 tsr_job_failures "$SCRATCH/ledger")" = 1
check "failures: no restart yet -> 0" \
  test "$(SLURM_RESTART_COUNT='' tsr_job_failures "$SCRATCH/absent")" = 0
check "failures: never negative" \
  test "$(SLURM_RESTART_COUNT=1 tsr_job_failures "$SCRATCH/ledger")" = 0

# tsr_job_run: SIGUSR1 to the batch shell reaches the step, whose exit code comes back.
cat >"$SCRATCH/step.sh" <<'STEP'
#!/bin/bash
trap 'echo "step got USR1" >&2; exit 3' USR1
echo "step ready" >&2
touch "$1"
for _ in $(seq 300); do sleep 0.1 & wait $!; done
exit 0
STEP
cat >"$SCRATCH/batch.sh" <<'BATCH'
. jobs/lib.sh
tsr_job_run "$1/step.err" bash "$1/step.sh" "$1/ready" 2>/dev/null
echo "$TSR_JOB_RC" >"$1/rc"
BATCH
bash "$SCRATCH/batch.sh" "$SCRATCH" >"$SCRATCH/batch.out" &
batch=$!
for _ in $(seq 100); do [ -e "$SCRATCH/ready" ] && break; sleep 0.1; done
kill -USR1 "$batch"
wait "$batch"
check "tsr_job_run: the step got the forwarded SIGUSR1" grep -q 'step got USR1' "$SCRATCH/step.err"
check "tsr_job_run: its exit code 3 comes back" test "$(cat "$SCRATCH/rc" 2>/dev/null)" = 3
# shellcheck disable=SC2016 # expanded by the inner bash
check "tsr_job_run: a plain exit code comes back" \
  bash -c '. jobs/lib.sh; tsr_job_run "$1/plain.err" bash -c "echo oops >&2; exit 4"; test "$TSR_JOB_RC" = 4 && grep -q oops "$1/plain.err"' \
  _ "$SCRATCH"

# shellcheck disable=SC2016 # expanded by the inner bash
check "tsr_job_run: srun's 0 after a failed task launch counts as a failure" \
  bash -c '. jobs/lib.sh; tsr_job_run "$1/launch.err" bash -c "echo \"srun: error: task 0 launch failed: Unspecified error\" >&2"; test "$TSR_JOB_RC" = 1' \
  _ "$SCRATCH"

# tsr_job_finish against a stand-in scontrol that logs its arguments.
mkdir -p "$SCRATCH/bin"
cat >"$SCRATCH/bin/scontrol" <<'SC'
#!/bin/bash
echo "$*" >>"$SCONTROL_LOG"
case $1 in update) exit "${SCONTROL_UPDATE_RC:-0}" ;; esac
exit 0
SC
chmod +x "$SCRATCH/bin/scontrol"
finish_case() { # finish_case NAME RC RESTARTS MAX EXCLUDE ERRFILE: sets FRC, FOUT=dir
  FOUT="$SCRATCH/$1"
  mkdir -p "$FOUT"
  SCONTROL_LOG="$FOUT/scontrol" PATH="$SCRATCH/bin:$PATH" SLURM_JOB_ID=42 SLURM_RESTART_COUNT=$3 \
    bash -c '. jobs/lib.sh; tsr_job_finish "$@"' _ "$2" "$FOUT" "$4" "$5" "$6" >"$FOUT/log" 2>&1
  FRC=$?
  touch "$FOUT/scontrol"
}
finish_case finished 0 0 5 1 /dev/null
check "finish rc 0: exit 0, no scontrol" test "$FRC" = 0 -a ! -s "$FOUT/scontrol"
finish_case bad 2 0 5 1 /dev/null
check "finish rc 2: exit 2, no requeue" test "$FRC" = 2 -a ! -s "$FOUT/scontrol"
finish_case ckpt 3 4 5 1 /dev/null
check "finish rc 3: requeued" grep -qx 'requeue 42' "$FOUT/scontrol"
check "finish rc 3: ledger says checkpoint" grep -q '^checkpoint restart=4' "$FOUT/slurm-42.requeues"
finish_case fail 4 0 5 1 "$SCRATCH/exited.err"
check "finish rc 4: requeued, then the node excluded (Slurm takes it only from a job not running)" \
  test "$(cat "$FOUT/scontrol")" = "requeue 42
update JobId=42 ExcNodeList=gpu018"
check "finish rc 4: node recorded" grep -qx gpu018 "$FOUT/failed_nodes"
SCONTROL_UPDATE_RC=1 finish_case refused 1 0 5 1 "$SCRATCH/exited.err"
check "finish: exclusion refused by Slurm still requeues" grep -qx 'requeue 42' "$FOUT/scontrol"
check "finish: and says so" grep -q 'would not exclude gpu018 ' "$FOUT/log"
# A node of an earlier failure is already listed: both are excluded, and a refusal names both.
mkdir -p "$SCRATCH/refused2" && echo gpu007 >"$SCRATCH/refused2/failed_nodes"
SCONTROL_UPDATE_RC=1 finish_case refused2 1 1 5 1 "$SCRATCH/exited.err"
check "finish: an earlier failed node is excluded too" grep -qx 'update JobId=42 ExcNodeList=gpu007,gpu018' "$FOUT/scontrol"
check "finish: a refusal names every node of the exclusion" grep -q 'would not exclude gpu007,gpu018 ' "$FOUT/log"
finish_case noexcl 1 0 5 0 "$SCRATCH/exited.err"
check "finish EXCLUDE_FAILED_NODE=0: no update" test "$(cat "$FOUT/scontrol")" = "requeue 42"
finish_case giveup 1 5 5 1 /dev/null
check "finish after MAX_RESTARTS failures: exit 1, no requeue" test "$FRC" = 1 -a ! -s "$FOUT/scontrol"

# Which trainer a job runs (tsr_job_find_tessera), on a copy of the scripts in a stand-in
# source tree; the installed copies are tests/e2e/install.sh's.
T=$SCRATCH/tree
mkdir -p "$T/jobs" "$T/src" "$SCRATCH/elsewhere"
cp jobs/lib.sh jobs/smoke.slurm "$T/jobs/"
printf '#!/bin/sh\nexit 0\n' >"$T/src/tessera"
chmod +x "$T/src/tessera"
found() { # found [VAR=value...]: "TESSERA TESSERA_DATADIR" after tsr_job_find_tessera
  # shellcheck disable=SC2016 # expanded by the inner bash
  env -u TESSERA -u TESSERA_DATADIR "$@" bash -c \
    '. "$1/jobs/lib.sh" && tsr_job_find_tessera >/dev/null && echo "$TESSERA $TESSERA_DATADIR"' _ "$T"
}
check "trainer: the source tree's src/tessera, deck names from its input/" \
  test "$(found)" = "$T/src/tessera $T"
check "trainer: \$TESSERA when set" test "$(found TESSERA=/bin/true)" = "/bin/true $T"
check "trainer: a TESSERA_DATADIR that is set is kept" \
  test "$(found TESSERA_DATADIR=/d)" = "$T/src/tessera /d"
check "trainer: none there is an error" \
  sh -c "! env -u TESSERA bash -c '. \"$T/jobs/lib.sh\"; TESSERA=$T/none tsr_job_find_tessera' >/dev/null"
# A dry run from another directory: lib.sh beside the script, the command printed, no srun.
mkdir -p "$SCRATCH/fake-bin"
printf '#!/bin/sh\ntouch "%s/srun-ran"\n' "$SCRATCH" >"$SCRATCH/fake-bin/srun"
chmod +x "$SCRATCH/fake-bin/srun"
(cd "$SCRATCH/elsewhere" && env -u TESSERA -u SLURM_SUBMIT_DIR PATH="$SCRATCH/fake-bin:$PATH" \
  TSR_JOB_DRY_RUN=1 bash "$T/jobs/smoke.slurm" >"$SCRATCH/dry.out" 2>&1)
rc=$?
check "dry run of smoke.slurm from elsewhere: exit 0 (got $rc), prints the step, starts nothing" \
  sh -c "[ $rc -eq 0 ] && grep -q 'not started: srun .* $T/src/tessera tiny ' '$SCRATCH/dry.out' && [ ! -e '$SCRATCH/srun-ran' ]"

finish
