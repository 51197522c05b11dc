#!/usr/bin/env bash
# newcomer.sh — stumbles a new user met, each checked as the user meets it:
#  (a) a clean stop through mpirun keeps exit 3: tools/tsr-mpirun turns SIGINT (Ctrl-C)
#      and SIGTERM into the SIGUSR1 Open MPI's mpirun forwards (on SIGINT and SIGTERM
#      mpirun ends the job itself and exits 1); every rank checkpoints and the wrapper
#      exits 3;
#  (b) checkpoint.resume given a directory says what it expected (it answered 'File
#      exists');
#  (c) after a resume, the memory line names the step it is at (it said 'step 1');
#  (d) the job script's advice runs as written from a source tree: `tessera plan llm70b
#      --nodes 64 --gpus-per-node 8` finds the deck by name from another directory, and
#      the checkpoint sizes the Slurm scripts quote are the planner's;
#  (e) MFU never shows above 1 from a GEMM probe that ran slow (a busy machine; here a
#      4x4 probe, TSR_GEMM_PROBE_N): the log says the figure is suspect, once, and the
#      fastest step's rate becomes the denominator.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers
C=(model.vocab_size=256 model.n_layer=2 model.d_model=32 model.n_head=4 model.n_kv_head=2
  model.d_ff=64 model.seq_len=16 train.micro_batch=1 train.global_batch=2 run.log_every=1000
  run.eval_every=0 "data.train=$SCRATCH/data/train_*.bin")
TSR_MPIRUN="$top_srcdir/tools/tsr-mpirun"

# ---- (a) SIGINT and SIGTERM through the wrapper: exit 3 ----
export MPIRUN OMPI_MCA_mpi_yield_when_idle=1
for sig in INT TERM; do
  # a background job of a script starts with SIGINT ignored (as a shell leaves it): the
  # wrapper is started with the default disposition, as from a terminal
  "$PYTHON_REF" -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$TSR_MPIRUN" -np 2 "$TESSERA" /dev/null "${C[@]}" \
    run.max_steps=1000000 checkpoint.resume=none run.out_dir="$SCRATCH/stop_$sig" \
    >"$SCRATCH/stop_$sig.out" 2>&1 &
  job=$!
  for _ in $(seq 300); do # until both ranks train
    grep -qs '"step":2,' "$SCRATCH/stop_$sig/metrics.jsonl" && break
    sleep 0.1
  done
  kill -"$sig" "$job"
  timeout 120 tail --pid=$job -f /dev/null
  wait $job
  rc=$?
  check "(a) SIG$sig to tsr-mpirun: exit 3, the requeue code (got $rc)" test $rc -eq 3
  check "(a) ... the ranks got SIGUSR1 and stopped with a checkpoint" sh -c \
    "grep -q 'signal 10 received: writing a checkpoint at step [0-9]* and stopping (exit 3)' '$SCRATCH/stop_$sig.out' &&
     grep -q 'stopped cleanly at step [0-9]* with its checkpoint written: exit 3' '$SCRATCH/stop_$sig.out'"
  check "(a) ... and it is the newest" sh -c "test -s '$SCRATCH/stop_$sig/ckpt/latest'"
done

# ---- (b) resume given a directory ----
launch -o dirres run.max_steps=2 checkpoint.resume="$SCRATCH"
check "(b) checkpoint.resume = a directory: exit 2 (got $?)" test $? -eq 2
check "(b) ... saying it is a directory, and what to give" grep -q \
  "resume = '$SCRATCH' is a directory: give a checkpoint file (such as $SCRATCH/step_NNNNNNNN.h5), 'auto'" \
  "$SCRATCH/dirres.out"

# ---- (c) the memory line after a resume ----
launch -o mem run.max_steps=3 checkpoint.every_steps=3 checkpoint.resume=none
launch -o mem -l mem2 run.max_steps=5 checkpoint.resume=auto
check "(c) resumed at step 3 (exit $?)" grep -q "resumed from .* at step 3" "$SCRATCH/mem2.out"
check "(c) ... its memory line names step 4, its first" grep -q \
  "^memory at step 4, most on any rank" "$SCRATCH/mem2.out"

# ---- (d) the job script's advice, from another directory ----
mkdir -p "$SCRATCH/elsewhere"
T=$(cd "$(dirname "$TESSERA")" && pwd)/$(basename "$TESSERA")
(cd "$SCRATCH/elsewhere" && "$T" plan llm70b --nodes 64 --gpus-per-node 8) \
  >"$SCRATCH/plan70.out" 2>&1
check "(d) tessera plan llm70b --nodes 64 --gpus-per-node 8, from elsewhere (exit $?)" \
  grep -q "^model    llama, 80 layers" "$SCRATCH/plan70.out"
for job in llm70b llm7b; do
  "$TESSERA" plan "$top_srcdir/input/$job.nml" $([ $job = llm70b ] && echo --nodes 64 --gpus-per-node 8) \
    >"$SCRATCH/plan_$job.out" 2>&1
  planned=$(sed -n 's/^  file  *\([0-9.]*\) GB .*/\1/p' "$SCRATCH/plan_$job.out")
  quoted=$(grep -o '[0-9.]* GB[ a-z]*(tessera plan)' "$top_srcdir/jobs/$job.slurm" | head -1 | cut -d' ' -f1)
  check "(d) jobs/$job.slurm quotes the planner's checkpoint: $quoted GB, planned ${planned:-?} GB" \
    "$PYTHON_REF" -c "import sys; sys.exit(0 if abs(float('$quoted') - float('${planned:-0}')) < 0.05 else 1)"
done
# ---- (e) a start-up GEMM probe slower than the training ----
TSR_GEMM_PROBE_N=4 launch -o mfu run.max_steps=4 run.log_every=1 checkpoint.resume=none \
  train.micro_batch=2 model.d_model=64 model.d_ff=128
check "(e) a probe slower than the steps: the run goes on (exit $?)" grep -q "^done: 4 steps" "$SCRATCH/mfu.out"
check "(e) ... the log says the probe's figure is suspect, once" test \
  "$(grep -c "^mfu: step [0-9]* ran at .* above the .* the GEMM probe measured at start-up .* suspect" "$SCRATCH/mfu.out")" -eq 1
check "(e) ... and no step's MFU is above 1" "$PYTHON_REF" -c 'import json, sys
m = [json.loads(l)["mfu"] for l in open(sys.argv[1]) if "\"loss\"" in l]
print("    MFU", m)
sys.exit(0 if len(m) == 4 and max(m) <= 1.0 else 1)' "$SCRATCH/mfu/metrics.jsonl"
finish
