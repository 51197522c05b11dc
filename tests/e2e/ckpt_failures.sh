#!/usr/bin/env bash
# ckpt_failures.sh — checkpoints when things go wrong (every run under a timeout):
#  (a) kill -9 of one rank while a checkpoint is being written: the test hook
#      TSR_FAULT=ckpt_sleep=... (src/core/fault.h) makes every rank pause half-way through writing
#      step 4 with step_00000004.h5.tmp open; one rank is killed there.  The job dies
#      (nonzero), `latest` still names step 3, the next start (resume auto) resumes from
#      step 3 ignoring the partial .tmp, rewrites step 4 and finishes; its losses equal an
#      uninterrupted run's bitwise (same layout).
#  (b) a full file system (a 1.6 MB tmpfs; skipped where mounting is not allowed): the write of step 3 fails with an error naming the file, every rank exits
#      nonzero (each rank's exit code is recorded), no .tmp is left, steps 1 and 2 and
#      `latest` are intact, and a run resuming from that directory starts at step 2.
#  (c) a file-size limit (ulimit -f, set by prlimit) below the checkpoint's size: the save
#      is refused with a message naming the limit; and the resume's read uses the deck's
#      MPI-IO hints.
#  (d) a newest checkpoint that lacks a tensor is skipped like a damaged one (the resume
#      falls back to the one before), and a `latest` naming a file outside the checkpoint
#      directory is ignored.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
"$PYTHON_REF" -c "import h5py" 2>/dev/null || skip "no h5py in $PYTHON_REF"
bytes_corpus computers
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=4 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.log_every=1000
  run.eval_every=0 optim.warmup_steps=2 optim.decay_steps=8 "data.train=$SCRATCH/data/train_*.bin"
  checkpoint.every_steps=1 checkpoint.keep=0)
complete() { # complete FILE: opens and carries complete = 1
  "$PYTHON_REF" -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); sys.exit(0 if f.attrs['complete'] == 1 and 'model' in f else 1)" "$1" 2>/dev/null
}

# ---- (a) kill -9 mid-write ----
launch -n 2 -o ref run.max_steps=8 parallel.zero_stage=1 checkpoint.resume=none
check "(a) reference: 8 uninterrupted steps (exit $?)" test $? -eq 0
TSR_FAULT=ckpt_sleep=60,ckpt_step=4 launch -n 2 -o kill run.max_steps=8 parallel.zero_stage=1 \
  checkpoint.resume=none &
job=$!
victim=
for _ in $(seq 300); do
  sleep 0.1
  if [ -f "$SCRATCH/kill/ckpt/step_00000004.h5.tmp" ] && grep -q "fault injection: sleeping" "$SCRATCH/kill.out"; then
    for p in $(pgrep -x tessera); do
      tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | grep -q "$SCRATCH/kill" && victim=$p
    done
    break
  fi
done
check "(a) the step-4 write is under way (.tmp present) and a rank is found ($victim)" test -n "$victim"
[ -n "$victim" ] && kill -9 "$victim"
wait $job
rc=$?
check "(a) kill -9 of one rank mid-write ends the job, nonzero (got $rc)" test $rc -ne 0 -a $rc -ne 124
check "(a)   ... leaving the partial step_00000004.h5.tmp" test -f "$SCRATCH/kill/ckpt/step_00000004.h5.tmp"
check "(a)   ... no step_00000004.h5" test ! -e "$SCRATCH/kill/ckpt/step_00000004.h5"
check "(a)   ... and latest still names step 3" grep -qx "step_00000003.h5" "$SCRATCH/kill/ckpt/latest"
launch -n 2 -o kill -l kill2 run.max_steps=8 parallel.zero_stage=1 checkpoint.resume=auto
check "(a) the next start finishes (exit $?)" test $? -eq 0
check "(a)   ... resumed from the previous complete checkpoint (step 3)" \
  grep -q "resumed from .*step_00000003.h5 at step 3 " "$SCRATCH/kill2.out"
check "(a)   ... the partial .tmp was replaced by a complete step 4" \
  sh -c "test ! -e '$SCRATCH/kill/ckpt/step_00000004.h5.tmp' && test -f '$SCRATCH/kill/ckpt/step_00000004.h5'"
complete "$SCRATCH/kill/ckpt/step_00000004.h5"
check "(a)   ... which is complete" test $? -eq 0
same=1
for s in 1 2 3 4 5 6 7 8; do
  a=$(metric "$SCRATCH/ref/metrics.jsonl" $s loss 2>/dev/null)
  b=$(metric "$SCRATCH/kill/metrics.jsonl" $s loss 2>/dev/null)
  [ -n "$a" ] && [ "$a" != None ] && [ "$a" = "$b" ] || same=0
done
check "(a)   ... and every step's loss equals the uninterrupted run's bitwise" test $same -eq 1

# ---- (c) a file-size limit (ulimit -f) below the checkpoint's size ----
# Steps 1-2 are saved without a limit.  The resumed run pauses as it starts to save step 3
# and the test lowers rank 1's file-size limit to 500 kB there with prlimit (a limit
# set before the start would stop Open MPI's and PMIx's own shared-memory files instead).
# The checkpoint (~0.69 MB) does not fit: the save is refused before a file is created,
# with a message naming the limit, and steps 1-2 stay the newest.  SIGXFSZ is ignored by
# the trainer, so no rank is killed by it.  The hints are given on the resume: its load
# must log them as applied to the read.
launch -n 2 -o fsize -l fsize1 run.max_steps=2 checkpoint.resume=none
check "(c) two steps saved without a limit (exit $?)" test $? -eq 0
TSR_FAULT=ckpt_sleep=3,ckpt_step=3,ckpt_where=start launch -n 2 -o fsize -l fsize2 run.max_steps=4 \
  checkpoint.resume=auto "checkpoint.mpiio_hints='cb_nodes=1'" &
job=$!
limited=0
for _ in $(seq 300); do
  sleep 0.1
  if grep -q "fault injection: sleeping" "$SCRATCH/fsize2.out"; then
    for p in $(pgrep -x tessera); do
      if tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | grep -q "$SCRATCH/fsize" &&
        tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
        prlimit --pid "$p" --fsize=500000 && limited=$((limited + 1))
      fi
    done
    break
  fi
done
wait $job
rc=$?
check "(c) rank 1 got the 500 kB limit as the step-3 save starts ($limited)" test $limited -eq 1
check "(c)   ... the step-3 save fails, nonzero exit (got $rc; 153 would be SIGXFSZ)" \
  test $rc -ne 0 -a $rc -ne 124 -a $rc -ne 153
check "(c)   ... the resume read with the deck's MPI-IO hints" \
  grep -q "MPI-IO hints as the MPI-IO layer reports them: cb_nodes=1" "$SCRATCH/fsize2.out"
grep -m2 "error:" "$SCRATCH/fsize2.out" | sed 's/^/    /'
check "(c)   ... with an error naming the limit" grep -q "error: a checkpoint of this model needs at least 0.6 MB but rank 1 may not write files over 0.5 MB (its file-size limit, ulimit -f)" "$SCRATCH/fsize2.out"
check "(c)   ... and the step and the directory" \
  grep -q "error: checkpoint for step 3 was not written to .*step_00000003.h5.; earlier checkpoints" "$SCRATCH/fsize2.out"
check "(c)   ... no step_00000003.h5(.tmp) is left" sh -c "! ls '$SCRATCH/fsize/ckpt' | grep -q step_00000003"
check "(c)   ... latest still names step 2" grep -qx "step_00000002.h5" "$SCRATCH/fsize/ckpt/latest"
complete "$SCRATCH/fsize/ckpt/step_00000001.h5" && complete "$SCRATCH/fsize/ckpt/step_00000002.h5"
check "(c)   ... steps 1 and 2 are intact and complete" test $? -eq 0

# ---- (b) a full file system ----
FS="$SCRATCH/fs"
mkdir -p "$FS"
if ! mount -t tmpfs -o size=1600k tmpfs "$FS" 2>/dev/null; then
  echo "SKIP: (b) cannot mount a small tmpfs here (needs root)"
  finish
fi
trap 'umount "$SCRATCH/fs" 2>/dev/null; rm -rf "$SCRATCH"' EXIT
# The checkpoint of this model is ~0.65 MB: two fit in 1.6 MB, the third does not.
# full NAME overrides...: a run into $SCRATCH/NAME checkpointing into $FS, one line
# "rank R exit C" per rank in $SCRATCH/NAME.rc (launch -r); a hang is timeout's 124.
full() { launch -n 2 -r "$SCRATCH/$1.rc" -o "$1" checkpoint.dir="$FS" "${@:2}"; }
ranks_exit() { # ranks_exit RCFILE PATTERN: both ranks recorded an exit code matching PATTERN
  test "$(grep -c "^rank [01] exit $2\$" "$1" 2>/dev/null)" -eq 2
}
full full run.max_steps=4 checkpoint.resume=none
rc=$?
check "(b) out of space while writing step 3: the job ends, no hang (mpirun $rc)" test $rc -ne 124
cat "$SCRATCH/full.rc" 2>/dev/null | sed 's/^/    /'
check "(b)   ... every rank exits nonzero" ranks_exit "$SCRATCH/full.rc" "[1-9][0-9]*"
grep -m1 "step_00000003.h5" "$SCRATCH/full.out" | grep -i error | sed 's/^/    /'
check "(b)   ... with an error naming the file" grep -qi "error.*step_00000003.h5" "$SCRATCH/full.out"
check "(b)   ... and saying why (no space / file too large)" \
  grep -qiE "No space left on device|File too large|free there" "$SCRATCH/full.out"
check "(b)   ... no step_00000003.h5(.tmp) is left" \
  sh -c "! ls '$FS' | grep -q step_00000003"
check "(b)   ... latest still names step 2" grep -qx "step_00000002.h5" "$FS/latest"
complete "$FS/step_00000001.h5" && complete "$FS/step_00000002.h5"
check "(b)   ... steps 1 and 2 are intact and complete" test $? -eq 0
# pre-flight: keep = 3 wants room for 4 checkpoints in a fresh directory of this tmpfs
mkdir -p "$FS/pre"
full pre run.max_steps=3 checkpoint.keep=3 checkpoint.resume=none checkpoint.dir="$FS/pre"
check "(b) pre-flight: too little room for keep + 1 checkpoints: both ranks exit 2 before step 1" \
  ranks_exit "$SCRATCH/pre.rc" 2
check "(b)   ... saying how much is free and needed" \
  grep -q "checkpoint directory '$FS/pre' has [0-9.]* MB free, but this run needs [0-9.]* MB: 4 more checkpoint" \
  "$SCRATCH/pre.out"
check "(b)   ... and trains no step" test ! -s "$SCRATCH/pre/metrics.jsonl" -o \
  "$(grep -c '"loss"' "$SCRATCH/pre/metrics.jsonl" 2>/dev/null)" = 0
rm -f "$FS/step_00000001.h5" # room to write again
full full2 run.max_steps=3 checkpoint.resume=auto
check "(b) with room made, a run resumes from that directory (both ranks exit 0)" \
  ranks_exit "$SCRATCH/full2.rc" 0
check "(b)   ... at step 2" grep -q "resumed from .*step_00000002.h5 at step 2 " "$SCRATCH/full2.out"

# ---- pre-flight: a checkpoint directory that cannot be made is found before step 1 ----
launch -t 60 -n 2 -o nodir run.max_steps=3 checkpoint.resume=none checkpoint.dir=/proc/no/such/dir
check "(d) an unwritable checkpoint directory: exit 2 before step 1 (got $?)" test $? -eq 2
check "(d)   ... naming it, with no step trained" \
  sh -c "grep -q \"cannot create .*/proc/no/such/dir\" '$SCRATCH/nodir.out' && ! grep -q '\"loss\"' '$SCRATCH/nodir/metrics.jsonl'"

# ---- (d) a newest checkpoint missing a tensor, and a `latest` pointing out of the dir ----
D="$SCRATCH/ref/ckpt"
cp "$D/step_00000008.h5" "$SCRATCH/step8.keep"
"$PYTHON_REF" -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); del f['model/final_norm.weight']" \
  "$D/step_00000008.h5"
launch -n 2 -o ref -l miss run.max_steps=9 parallel.zero_stage=1
check "(d) the newest checkpoint lacking a tensor: the resume falls back (exit $?)" test $? -eq 0
check "(d)   ... naming the missing tensor" \
  grep -q "step_00000008.h5' (named by 'latest') is unusable: /model/final_norm.weight is missing; falling back" \
  "$SCRATCH/miss.out"
check "(d)   ... to step 7" grep -q "resumed from .*step_00000007.h5 at step 7 " "$SCRATCH/miss.out"
cp "$SCRATCH/step8.keep" "$SCRATCH/outside.h5"
echo "../../outside.h5" >"$D/latest"
launch -n 2 -o ref -l out run.max_steps=10 parallel.zero_stage=1
check "(d) 'latest' naming a file outside the directory is ignored (exit $?)" test $? -eq 0
check "(d)   ... with a warning" grep -q "names '../../outside.h5', which is not a checkpoint file of this directory" \
  "$SCRATCH/out.out"
check "(d)   ... and the newest step file in the directory is used" \
  grep -q "resumed from .*ref/ckpt/step_00000009.h5 at step 9 " "$SCRATCH/out.out"
finish
