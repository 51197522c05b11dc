#!/usr/bin/env bash
# zero.sh — data parallelism with ZeRO 0-3 and hybrid sharding, on CPU ranks.
#  1. test_zero on 2, 3 and 4 ranks: memory formulas, reduced gradient vs one process,
#     bitwise sharded AdamW, ring byte counts per group (see tests/mpi/test_zero.c);
#  2. layout equivalence of the real trainer against the single-rank run, same seed and
#     data, 12 steps, fp32: dp 2 and 4 x zero 0-3, hybrid 2 "nodes" x 2 (ranks_per_node 2,
#     shard_scope 'node') x zero 1-3: every step's loss within 1e-5 relative (measured:
#     <= 4e-9; only the order of the gradient sums differs);
#     bf16 and fp16 with zero 1 and 3, and bf16 hybrid zero 2, against the single rank of
#     the same precision within 1e-4 (only the fp32 gradient sums' order differs);
#  3. a checkpoint written under dp 2 / zero 1 resumes under dp 4 / zero 3 and continues
#     the same run (losses within 1e-5 of the straight run), and the data stream goes on;
#  4. bad layouts fail fast on every rank with one message and exit code 2, no hang.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
[ -x "$top_builddir/tests/mpi/test_zero" ] || skip "test_zero not built"
mpi_test_setup

for np in 2 3 4; do
  timeout 120 "$MPIRUN" -np $np "$top_builddir/tests/mpi/test_zero" >"$SCRATCH/tz$np.out" 2>&1
  rc=$?
  grep -E "FAIL|checks passed" "$SCRATCH/tz$np.out"
  check "test_zero on $np ranks" test $rc -eq 0
done

bytes_corpus computers science
C=(model.vocab_size=256 model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=2
  model.d_ff=160 model.seq_len=32 train.micro_batch=1 train.global_batch=8 run.max_steps=12
  run.log_every=100 run.eval_every=0 optim.lr=3e-3 optim.warmup_steps=3 optim.decay_steps=12
  "data.train=$SCRATCH/data/train_*.bin" checkpoint.resume=none checkpoint.every_steps=0)
run() { # run NAME NP overrides...
  local name=$1 np=$2; shift 2
  if [ "$np" = 1 ]; then "$TESSERA" /dev/null "${C[@]}" run.out_dir="$SCRATCH/$name" "$@"
  else timeout 120 "$MPIRUN" -np "$np" "$TESSERA" /dev/null "${C[@]}" run.out_dir="$SCRATCH/$name" "$@"
  fi >"$SCRATCH/$name.out" 2>&1
}

run ref 1 && run refb 1 train.precision=bf16
check "single-rank fp32 and bf16 references run" test $? -eq 0
for np in 2 4; do
  for st in 0 1 2 3; do
    run d${np}z$st $np parallel.zero_stage=$st
    check "dp $np zero $st runs" test $? -eq 0
    same_losses ref d${np}z$st 1e-5
    check "dp $np zero $st: 12 losses == single rank (rel 1e-5)" test $? -eq 0
  done
done
for st in 1 2 3; do
  run h$st 4 parallel.zero_stage=$st parallel.ranks_per_node=2 parallel.shard_scope=node
  check "hybrid 2 nodes x 2, zero $st runs" test $? -eq 0
  same_losses ref h$st 1e-5
  check "hybrid zero $st: losses == single rank (rel 1e-5)" test $? -eq 0
done
check "the hybrid run logs its layout and per-group traffic" \
  grep -q "comm per step .*dp_shard .*reduce_scatter.*dp_replicate .*all_reduce" "$SCRATCH/h3.out"
check "the hybrid run logs the dp_replicate groups across nodes" \
  grep -q "dp_replicate .*{0@n0,2@n1}" "$SCRATCH/h3.out"
run reff 1 train.precision=fp16
for st in 1 3; do
  run b$st 2 parallel.zero_stage=$st train.precision=bf16
  same_losses refb b$st 1e-4
  check "bf16 dp 2 zero $st: losses == bf16 single rank (rel 1e-4)" test $? -eq 0
  run f$st 2 parallel.zero_stage=$st train.precision=fp16
  same_losses reff f$st 1e-4
  check "fp16 dp 2 zero $st: losses == fp16 single rank (rel 1e-4)" test $? -eq 0
done
run hb 4 parallel.zero_stage=2 parallel.ranks_per_node=2 parallel.shard_scope=node \
  train.precision=bf16
same_losses refb hb 1e-4
check "bf16 hybrid 2 nodes x 2, zero 2: losses == bf16 single rank (rel 1e-4)" test $? -eq 0

# restart under another layout: 5 steps on dp 2 / zero 1, then resume on dp 4 / zero 3
run half 2 parallel.zero_stage=1 run.max_steps=5 checkpoint.resume=none
run half 4 parallel.zero_stage=3 run.max_steps=12 checkpoint.resume=auto
check "dp 4 / zero 3 resumed the dp 2 / zero 1 checkpoint of step 5" \
  grep -q "resumed from .*step_00000005.h5 at step 5" "$SCRATCH/half.out"
same_losses ref half 1e-5
check "the resumed run continues the single-rank losses (steps 1-12, rel 1e-5)" test $? -eq 0

# bad layouts: exit 2 on every rank, one message, no hang
timeout 60 "$MPIRUN" -np 3 "$TESSERA" /dev/null "${C[@]}" parallel.tp=2 run.out_dir="$SCRATCH/bad1" >"$SCRATCH/bad1.out" 2>&1
check "3 ranks with tp 2: exit code 2" test $? -eq 2
check "  ... one message naming the world size and tp" test "$(grep -c 'world size 3 is not a multiple of parallel.tp = 2' "$SCRATCH/bad1.out")" -eq 1
timeout 60 "$MPIRUN" -np 2 "$TESSERA" /dev/null "${C[@]}" train.global_batch=6 train.micro_batch=2 run.out_dir="$SCRATCH/bad2" >"$SCRATCH/bad2.out" 2>&1
check "global_batch 6 with micro_batch 2 on dp 2: exit code 2" test $? -eq 2
check "  ... the message names global_batch and micro_batch" grep -q "global_batch.*micro_batch" "$SCRATCH/bad2.out"
check "  ... printed once" test "$(grep -c 'global_batch' "$SCRATCH/bad2.out")" -eq 1
timeout 60 "$MPIRUN" -np 4 "$TESSERA" /dev/null "${C[@]}" parallel.ranks_per_node=3 run.out_dir="$SCRATCH/bad3" >"$SCRATCH/bad3.out" 2>&1
check "ranks_per_node 3 on 4 ranks: exit code 2" test $? -eq 2
for f in bad1 bad2 bad3; do echo "  $f: $(grep -m1 -v "^--\|^ \|^$\|^Primary\|^mpirun\|^a non\|^the job\|^  Process" "$SCRATCH/$f.out")"; done
finish
