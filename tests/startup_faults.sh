#!/usr/bin/env bash
# startup_faults.sh — what happens before the first step (every run under a timeout: a
# hang is a failure):
#  - a stop signal during the start-up is a clean stop: SIGUSR1 or SIGTERM to ONE rank of
#    two while it pauses (TSR_FAULT start_sleep, src/fault.h) before MPI_Init, after the
#    deck is read, and before the resume reads its checkpoint: exit 3 (not 138/143, the
#    default action), the line "signal N (NAME) received ...: stopped before the first
#    step", no step trained and no checkpoint written;
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.eval_every=0
  run.log_every=1000 "data.train=$SCRATCH/data/train_*.bin")
mpi() { timeout "$1" "$MPIRUN" -np "$2" "$TESSERA" /dev/null "${C[@]}" "${@:3}"; }

# ---- stop signals during the start-up ----
# early NAME SIG WHERE OUT [overrides]: the job paused at WHERE on both ranks, SIG to the
# first rank that says so; leaves the exit code in $rc
early() {
  local name=$1 sig=$2 where=$3 out=$4
  shift 4
  TSR_FAULT="start_sleep=4,start_where=$where" mpi 120 2 run.out_dir="$out" "$@" \
    >"$SCRATCH/$name.out" 2>&1 &
  local job=$! pid=
  for _ in $(seq 300); do
    pid=$(sed -n "s/^fault injection: process \([0-9]*\) sleeping .*($where)$/\1/p" \
      "$SCRATCH/$name.out" | head -1)
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] && kill -"$sig" "$pid"
  wait $job
  rc=$?
  check "$name: the start-up paused ($where) and got SIG$sig (process ${pid:-none})" test -n "$pid"
}

early mpi_init USR1 mpi_init "$SCRATCH/e1" checkpoint.resume=none run.max_steps=3
check "  ... SIGUSR1 before MPI_Init: exit 3, not the default action (got $rc)" test $rc -eq 3
check "  ... the line says so" grep -q \
  "signal 10 (SIGUSR1) received while starting: stopped before the first step of this run, without writing a checkpoint" \
  "$SCRATCH/mpi_init.out"
check "  ... no step trained, no checkpoint written" \
  sh -c "! grep -qs '\"loss\"' '$SCRATCH/e1/metrics.jsonl' && ! ls '$SCRATCH/e1/ckpt' 2>/dev/null | grep -q ."

early setup TERM setup "$SCRATCH/e2" checkpoint.resume=none run.max_steps=3
check "  ... SIGTERM after the deck is read: exit 3 (got $rc)" test $rc -eq 3
check "  ... the line says so, in tessera.log too" grep -q \
  "signal 15 (SIGTERM) received while starting: stopped before the first step" "$SCRATCH/e2/tessera.log"
check "  ... no step trained, no checkpoint written" \
  sh -c "! grep -qs '\"loss\"' '$SCRATCH/e2/metrics.jsonl' && ! ls '$SCRATCH/e2/ckpt' 2>/dev/null | grep -q ."

mpi 120 2 run.out_dir="$SCRATCH/e3" checkpoint.resume=none run.max_steps=2 >"$SCRATCH/e3a.out" 2>&1
check "two steps and their checkpoint, to resume from (exit $?)" grep -qx step_00000002.h5 "$SCRATCH/e3/ckpt/latest"
early resume USR1 resume "$SCRATCH/e3" run.max_steps=4
check "  ... SIGUSR1 before the resume: exit 3 (got $rc)" test $rc -eq 3
check "  ... the line says so" grep -q \
  "signal 10 (SIGUSR1) received while resuming: stopped before the first step" "$SCRATCH/resume.out"
check "  ... no step trained, latest still names step 2 and nothing newer was written" \
  sh -c "test \$(grep -c '\"loss\"' '$SCRATCH/e3/metrics.jsonl') -eq 2 &&
    grep -qx step_00000002.h5 '$SCRATCH/e3/ckpt/latest' && ! ls '$SCRATCH/e3/ckpt' | grep -q step_00000003"
finish
