#!/usr/bin/env bash
# startup_faults.sh — what goes wrong before the first step is found there, and said once
# (every run under a timeout: a hang is a failure):
#  - a stop signal during the start-up is a clean stop: SIGUSR1 or SIGTERM to ONE rank of
#    two while it pauses (TSR_FAULT start_sleep, src/core/fault.h) before MPI_Init, after the
#    deck is read, and before the resume reads its checkpoint: exit 3 (not 138/143, the
#    default action), the line "signal N (NAME) received ...: stopped before the first
#    step", no step trained and no checkpoint written;
#  - the data pre-flight, before the model and the backend are built: a named pipe among
#    the shards is refused at once (opening it would wait forever), a shard that is
#    broken on one rank only (each rank reads a directory of its own through mpirun's
#    -wdir, as a node-local copy would) gives one error in rank 0's tessera.log naming
#    the file, that rank and its host; a directory, a truncated header and a dangling link
#    in the glob name the file; every case exits 2 with no step trained;
#  - a checkpoint directory that one rank cannot write (its own -wdir has a file there) is
#    found before step 1 (exit 2).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.eval_every=0
  run.log_every=1000 "data.train=$SCRATCH/data/train_*.bin")
no_step() { ! grep -qs '"loss"' "$1/metrics.jsonl"; }

# ---- stop signals during the start-up ----
# early NAME SIG WHERE OUT [overrides]: the job paused at WHERE on both ranks, SIG to the
# first rank that says so; leaves the exit code in $rc
early() {
  local name=$1 sig=$2 where=$3 out=$4
  shift 4
  TSR_FAULT="start_sleep=4,start_where=$where" launch -n 2 run.out_dir="$out" "$@" \
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

launch -n 2 run.out_dir="$SCRATCH/e3" checkpoint.resume=none run.max_steps=2 >"$SCRATCH/e3a.out" 2>&1
check "two steps and their checkpoint, to resume from (exit $?)" grep -qx step_00000002.h5 "$SCRATCH/e3/ckpt/latest"
early resume USR1 resume "$SCRATCH/e3" run.max_steps=4
check "  ... SIGUSR1 before the resume: exit 3 (got $rc)" test $rc -eq 3
check "  ... the line says so" grep -q \
  "signal 10 (SIGUSR1) received while resuming: stopped before the first step" "$SCRATCH/resume.out"
check "  ... no step trained, latest still names step 2 and nothing newer was written" \
  sh -c "test \$(grep -c '\"loss\"' '$SCRATCH/e3/metrics.jsonl') -eq 2 &&
    grep -qx step_00000002.h5 '$SCRATCH/e3/ckpt/latest' && ! ls '$SCRATCH/e3/ckpt' | grep -q step_00000003"

# ---- the data pre-flight ----
# data_case NAME SETUP...: a copy of the shards in $SCRATCH/NAME with SETUP run there, two
# ranks on it; leaves the exit code in $rc and the output in $SCRATCH/NAME.out
data_case() {
  local name=$1 d="$SCRATCH/$1"
  shift
  mkdir -p "$d"
  cp "$SCRATCH"/data/*.bin "$d/"
  (cd "$d" && "$@")
  C[${#C[@]} - 1]="data.train=$d/train_*.bin"
  launch -t 60 -n 2 checkpoint.resume=none run.max_steps=2 run.out_dir="$d/out" >"$SCRATCH/$name.out" 2>&1
  rc=$?
  C[${#C[@]} - 1]="data.train=$SCRATCH/data/train_*.bin"
}
data_case fifo mkfifo train_zz.bin
check "a named pipe among the shards: exit 2 at once, no hang (got $rc)" test $rc -eq 2
check "  ... naming it" grep -q "error: '$SCRATCH/fifo/train_zz.bin' is not a regular file" "$SCRATCH/fifo.out"
data_case dir mkdir train_zz.bin
check "a directory among the shards: exit 2 (got $rc)" test $rc -eq 2
check "  ... naming it, once" test "$(grep -c "error: '$SCRATCH/dir/train_zz.bin' is not a regular file" "$SCRATCH/dir.out")" -eq 1
data_case short sh -c 'head -c 100 train_000.bin >train_zz.bin'
check "a truncated header: exit 2 (got $rc)" test $rc -eq 2
check "  ... naming the file and the size" \
  grep -q "error: token shard '$SCRATCH/short/train_zz.bin' is truncated: expected at least the 256-byte header, found 100 bytes" \
  "$SCRATCH/short.out"
data_case link ln -s gone.bin train_zz.bin
check "a dangling link in the glob: exit 2 (got $rc)" test $rc -eq 2
check "  ... naming it" grep -q "cannot open token shard '$SCRATCH/link/train_zz.bin': No such file" "$SCRATCH/link.out"
check "  ... and no step of any of them trained" sh -c \
  "! cat '$SCRATCH'/{fifo,dir,short,link}/out/metrics.jsonl 2>/dev/null | grep -q '\"loss\"'"

# one rank's view of the data differs: rank 0 works in $SCRATCH/w0, rank 1 in $SCRATCH/w1
# (mpirun -wdir), both read the relative glob data/train_*.bin
mkdir -p "$SCRATCH/w0/data" "$SCRATCH/w1/data"
cp "$SCRATCH"/data/*.bin "$SCRATCH/w0/data/"
cp "$SCRATCH"/data/*.bin "$SCRATCH/w1/data/"
head -c 300 "$SCRATCH/data/train_000.bin" >"$SCRATCH/w1/data/train_000.bin"
TSR_ABS="$(cd "$(dirname "$TESSERA")" && pwd)/tessera" # -wdir: not relative to here
two_dirs() {
  local D=("${C[@]:0:${#C[@]}-1}" "data.train=data/train_*.bin" checkpoint.resume=none run.max_steps=2 "$@")
  timeout 60 "$MPIRUN" -np 1 -wdir "$SCRATCH/w0" "$TSR_ABS" /dev/null "${D[@]}" : \
    -np 1 -wdir "$SCRATCH/w1" "$TSR_ABS" /dev/null "${D[@]}"
}
two_dirs run.out_dir="$SCRATCH/w/out" >"$SCRATCH/w.out" 2>&1
check "a shard broken on rank 1 only: exit 2 (got $?)" test $? -eq 2
grep "error:" "$SCRATCH/w/out/tessera.log" | sed 's/^/    /'
check "  ... rank 0's tessera.log names the file, the reason, the rank and its host" grep -qE \
  "error: token shard 'data/train_000.bin' is truncated: its header .* says [0-9]+ tokens .*found 300;.*\[on 1 of 2 ranks; the first is rank 1 on host $(hostname)\]" \
  "$SCRATCH/w/out/tessera.log"
check "  ... in one line" test "$(grep -c "error:" "$SCRATCH/w.out")" -eq 1
check "  ... before any step" no_step "$SCRATCH/w/out"

# ---- a checkpoint directory one rank cannot write ----
cp "$SCRATCH/data/train_000.bin" "$SCRATCH/w1/data/train_000.bin"
echo "not a directory" >"$SCRATCH/w1/ck"
two_dirs checkpoint.dir=ck run.out_dir="$SCRATCH/w/out2" >"$SCRATCH/w2.out" 2>&1
check "a checkpoint directory rank 1 cannot write: exit 2 before step 1 (got $?)" test $? -eq 2
check "  ... saying so" grep -q "\[rank 1\] error: checkpoint directory 'ck' is not writable from this rank" "$SCRATCH/w2.out"
check "  ... with no step trained" no_step "$SCRATCH/w/out2"
finish
