#!/usr/bin/env bash
# failures.sh — what happens when things go wrong on several ranks (every case under a
# timeout: a hang is a failure):
#  - one rank stops responding mid-step: the watchdog (run.step_timeout_s = 2) ends the
#    job with exit code 4 and names the rank, the step and the last collective;
#  - an error on one rank only during setup (rank 0 cannot open metrics.jsonl): every
#    rank exits 2, no hang;
#  - time-based checkpoints (every_minutes) on 3 ranks: rank 0's clock decides for all;
#  - SIGUSR1 to ONE rank (rank 1): all ranks stop at the same step boundary, write a
#    checkpoint, exit 3, and rank 0's log names the signal and says it stopped cleanly
#    after writing that step; the next run resumes from it and finishes;
#  - a pipeline with 4800 micro-batches per step (message tags stay in MPI's range).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=4 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 run.eval_every=0 run.log_every=1000
  "data.train=$SCRATCH/data/train_*.bin" checkpoint.resume=none)

start=$(date +%s)
TSR_FAULT=hang_step=3,hang_rank=1 launch -t 90 -n 2 -o dog train.global_batch=2 run.max_steps=10 \
  run.step_timeout_s=2
rc=$?
took=$(($(date +%s) - start))
check "a hung rank ends the job with exit code 4 (got $rc after $took s)" test $rc -eq 4
check "  ... within seconds, not the wall clock" test $took -lt 60
check "  ... and the watchdog names the stuck rank (1), the step and that it is outside MPI" \
  grep -q "\[rank 1\] watchdog: step 3 has been in a training step for [0-9]* s .*not inside any collective.*this rank is stuck" "$SCRATCH/dog.out"
check "  ... through MPI_Abort (MPI_THREAD_MULTIPLE is available)" \
  grep -q "this rank is stuck; aborting the job with MPI_Abort (exit code 4)" "$SCRATCH/dog.out"
grep -m1 watchdog "$SCRATCH/dog.out"

mkdir -p "$SCRATCH/bad/metrics.jsonl"
launch -t 60 -n 2 -o bad train.global_batch=2 run.max_steps=2
rc=$?
check "rank 0 alone cannot open metrics.jsonl: every rank exits 2 (got $rc)" test $rc -eq 2
grep -q "cannot open metrics file" "$SCRATCH/bad.out"
check "  ... with the reason" test $? -eq 0

# every_minutes = 1e-6 (60 us) is due at every step boundary after the first on any machine:
# the run is bound by its 8 steps, not by how fast the machine writes a checkpoint
launch -t 300 -n 3 -o min train.global_batch=3 run.max_steps=8 checkpoint.every_minutes=1e-6
check "time-based checkpoints on 3 ranks complete (exit $?)" test $? -eq 0
n=$(grep -c "checkpoint: wrote" "$SCRATCH/min.out")
check "  ... and write more than the final one ($n)" test "$n" -ge 2

launch -n 2 -o sig train.global_batch=2 run.max_steps=100000 &
job=$!
victim=
for _ in $(seq 100); do
  sleep 0.2
  for p in $(pgrep -x tessera); do
    tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | grep -q "$SCRATCH/sig" &&
      tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 &&
      victim=$p && break
  done
  [ -n "$victim" ] && grep -q "zero stage" "$SCRATCH/sig.out" && break
done
sleep 1
kill -USR1 "$victim" 2>/dev/null
wait $job
rc=$?
check "SIGUSR1 to one rank: the job checkpoints and exits 3 (got $rc)" test $rc -eq 3
step=$(sed -n 's/.*writing a checkpoint at step \([0-9]*\) and stopping.*/\1/p' "$SCRATCH/sig.out")
check "  ... at an agreed step ($step)" test -n "$step"
check "  ... rank 0 names the signal rank 1 got (10)" \
  grep -q "^signal 10 received: writing a checkpoint at step $step and stopping (exit 3)" "$SCRATCH/sig.out"
check "  ... and says it stopped after writing step $step" \
  grep -q "stopped cleanly at step $step with its checkpoint written: exit 3" "$SCRATCH/sig/tessera.log"
launch -n 2 -o sig -l sig2 train.global_batch=2 run.max_steps=$((step + 3)) checkpoint.resume=auto
check "the next run resumes from that step and finishes" grep -q "resumed from .*at step $step " "$SCRATCH/sig2.out"

launch -t 200 -n 4 -o tags parallel.pp=4 train.global_batch=4800 run.max_steps=1
check "pp 4 with 4800 micro-batches per step runs (exit $?)" test $? -eq 0
finish
