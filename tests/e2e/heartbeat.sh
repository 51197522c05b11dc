#!/usr/bin/env bash
# heartbeat.sh — a rank that stops answering is found within seconds and named
# (run.heartbeat_s; every run under a timeout: a hang is a failure):
#  - SIGSTOP of rank 2 of 4 in the middle of training (a frozen process: its own threads
#    stop too, so only its peers can tell): the job ends with exit code 4 within
#    heartbeat_s + a few seconds, and one line names rank 2, its host and its last step;
#    the time from the SIGSTOP to the end of the job is printed;
#  - the same for rank 0 of 2 (the rank every other one talks to): rank 1 names it;
#  - run.heartbeat_s = 0 turns it off: a frozen rank is waited for (the job still runs
#    after twice the timeout), and once continued the job goes on and stops cleanly;
#  - every rank stopped for 5 s with heartbeat_s = 2 and continued together: nobody is
#    accused, the job goes on;
#  - a healthy run with a heartbeat every 0.125 s has bitwise the losses of one without;
#  - the step watchdog (run.step_timeout_s) of a rank blocked in a collective names the
#    frozen rank it waits for, not only itself.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 run.eval_every=0 run.log_every=1000
  checkpoint.resume=none "data.train=$SCRATCH/data/train_*.bin")
HOST=$(hostname)

# pid_of OUT RANK: the process of rank RANK of the job writing to OUT
pid_of() {
  local p
  for p in $(pgrep -x tessera); do
    if tr '\0' ' ' 2>/dev/null </proc/"$p"/cmdline | grep -q "run.out_dir=$1 " &&
      tr '\0' '\n' 2>/dev/null </proc/"$p"/environ | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}
# start NAME NP OVERRIDES...: a long run in the background ($job), its steps under way
start() {
  local name=$1 np=$2
  shift 2
  launch -n "$np" -o "$name" run.max_steps=1000000 train.global_batch="$np" \
    checkpoint.every_steps=0 "$@" &
  job=$!
  for _ in $(seq 600); do grep -qs '"loss"' "$SCRATCH/$name/metrics.jsonl" && break; sleep 0.1; done
  sleep 1 # well into the loop
}
# freeze NAME RANK: SIGSTOP that rank; waits for the job; sets rc and took (seconds)
freeze() {
  local victim
  victim=$(pid_of "$SCRATCH/$1" "$2")
  check "$1: rank $2 found (process ${victim:-none})" test -n "$victim"
  local t0
  t0=$(date +%s.%N)
  [ -n "$victim" ] && kill -STOP "$victim"
  wait $job
  rc=$?
  took=$("$PYTHON_REF" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
    "$t0" "$(date +%s.%N)")
}

start stop2 4 run.heartbeat_s=3
freeze stop2 2
echo "    heartbeat_s = 3, 4 ranks, rank 2 stopped: the job ended $took s after the SIGSTOP"
check "a frozen rank 2 of 4 ends the job with exit code 4 (got $rc)" test $rc -eq 4
check "  ... within heartbeat_s + 7 s ($took s)" "$PYTHON_REF" -c "import sys; sys.exit(float(sys.argv[1]) > 10)" "$took"
grep "heartbeat: rank" "$SCRATCH/stop2.out" | sed 's/^/    /'
check "  ... one line naming rank 2, its host and what it was last doing" grep -qE \
  "^error: heartbeat: rank 2 \(host $HOST\) has not been heard from for [0-9.]+ s \(run.heartbeat_s = 3\): it died or stopped responding; its last heartbeat had it at step [1-9][0-9]*, " \
  "$SCRATCH/stop2.out"
check "  ... and only one" test "$(grep -c "heartbeat: rank" "$SCRATCH/stop2.out")" -eq 1
check "  ... written to tessera.log too" grep -q "error: heartbeat: rank 2 (host $HOST)" "$SCRATCH/stop2/tessera.log"

start stop0 2 run.heartbeat_s=3
freeze stop0 0
echo "    heartbeat_s = 3, 2 ranks, rank 0 stopped: the job ended $took s after the SIGSTOP"
check "a frozen rank 0 of 2 ends the job with exit code 4 (got $rc)" test $rc -eq 4
check "  ... within heartbeat_s + 7 s ($took s)" "$PYTHON_REF" -c "import sys; sys.exit(float(sys.argv[1]) > 10)" "$took"
check "  ... rank 1 names rank 0 and its host" grep -qE \
  "^\[rank 1\] error: heartbeat: rank 0 \(host $HOST\) has not been heard from for [0-9.]+ s .*its last heartbeat had it at step [1-9]" \
  "$SCRATCH/stop0.out"

start off 2 run.heartbeat_s=0
victim=$(pid_of "$SCRATCH/off" 1)
check "heartbeat off: rank 1 found (process ${victim:-none})" test -n "$victim"
kill -STOP "$victim"
sleep 6
check "  ... a frozen rank does not end the job (still running after 6 s)" kill -0 $job
check "  ... no heartbeat was started" sh -c "! grep -q 'heartbeat:' '$SCRATCH/off.out'"
kill -CONT "$victim"
sleep 1
kill -USR1 "$victim"
wait $job
check "  ... continued, the job goes on and stops cleanly on SIGUSR1 (exit $?)" test $? -eq 3

# every rank stopped together for 5 s, then continued (a job suspended as a whole): the
# time a rank itself did not run is nobody's silence, the job goes on
start all 3 run.heartbeat_s=2
pids=$(for r in 0 1 2; do pid_of "$SCRATCH/all" $r; done)
check "all ranks stopped together: 3 processes found ($(echo $pids))" test "$(echo $pids | wc -w)" -eq 3
kill -STOP $pids
sleep 5
kill -CONT $pids
sleep 4
check "  ... continued, the job goes on (still running 4 s later)" kill -0 $job
kill -USR1 $pids
wait $job
check "  ... and stops cleanly on SIGUSR1 (exit $?)" test $? -eq 3
check "  ... with no heartbeat error" sh -c "! grep -q 'error: heartbeat' '$SCRATCH/all.out'"

# bitwise the same losses with the heartbeat beating every 0.125 s and without it
for hb in 0 0.5; do
  launch -n 4 -o "hb$hb" parallel.tp=2 train.global_batch=4 run.max_steps=300 run.eval_every=100 \
    "data.valid=$SCRATCH/data/valid_*.bin" checkpoint.every_steps=100 run.heartbeat_s=$hb
  check "300 steps on tp 2 x dp 2 with run.heartbeat_s = $hb (exit $?)" test $? -eq 0
done
check "  ... the heartbeat was on in the second" grep -q "heartbeat: every 0.12 s" "$SCRATCH/hb0.5.out"
check "  ... and every loss and val loss is bitwise the same" agree_runs "$SCRATCH/hb0" "$SCRATCH/hb0.5" 0 300

# the step watchdog names the rank it waits for (the heartbeat, 60 s, has not fired yet)
start dog 3 run.step_timeout_s=2 run.heartbeat_s=60
freeze dog 1
echo "    step_timeout_s = 2, 3 ranks, rank 1 stopped: the job ended $took s after the SIGSTOP"
check "a frozen rank 1 of 3 under the step watchdog: exit code 4 (got $rc)" test $rc -eq 4
grep -m1 "waiting for a peer" "$SCRATCH/dog.out" | sed 's/^/    /'
check "  ... a blocked rank's watchdog names rank 1 and its host" grep -qE \
  "^\[rank [02]\] watchdog: step [0-9]+ has been in a training step for [0-9]+ s \(run.step_timeout_s = 2\), blocked in .* waiting for a peer: rank 1 \(host $HOST\) has not been heard from for [0-9.]+ s; its last heartbeat had it at step [1-9]" \
  "$SCRATCH/dog.out"
finish
