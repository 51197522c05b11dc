#!/usr/bin/env bash
# tp.sh — tensor parallelism, layout equivalence against the single-rank run (same seed
# and data, 12 steps, fp32, every step's loss within 1e-5 relative): tp 2, tp 4, GQA with
# n_kv_head < tp (1 KV head on tp 2, 2 KV heads on tp 4: KV heads replicated inside the tp
# group), gpt2 (biases, learned positions, tied vocab-parallel head) on tp 2, dp 2 x tp 2
# with zero 1 and with zero 3, gpt2's head fused with the loss in chunks (tp 2, and dp 2 x
# tp 2 zero 3) against the unfused head of one rank; a checkpoint written at tp 2 resumes
# at tp 1 x dp 2 and at tp 4, continuing the losses.  bf16 and fp16 storage (against the
# single rank of the same precision): tp 2, tp 4, dp 2 x tp 2 zero 3, sequence parallel
# (llama, gpt2, selective recompute), within 2e-4 (bf16) and 1e-4 (fp16), for the reason
# given below.
# Sequence parallelism (norms and the residual stream sharded over the tokens; all-gather
# before and reduce-scatter after the tp regions): tp 2, tp 4 with replicated KV heads,
# gpt2, selective recompute, dp 2 x tp 2 zero 3 — same losses; its activations take less
# memory than without it, and its tp traffic is reduce-scatter + all-gather.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers science
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=160
  model.seq_len=32 train.micro_batch=2 train.global_batch=8 run.max_steps=12 run.log_every=100
  run.eval_every=0 optim.lr=3e-3 optim.warmup_steps=3 optim.decay_steps=12 model.init_std=0.05
  "data.train=$SCRATCH/data/train_*.bin" checkpoint.resume=none checkpoint.every_steps=0)
run() { launch -n "$2" -o "$1" "${@:3}"; } # run NAME NP overrides...
case_() { # case_ DESCRIPTION REF NAME NP TOL overrides...
  local what=$1 ref=$2 name=$3 np=$4 tol=$5; shift 5
  run "$name" "$np" "$@"
  local rc=$?
  check "$what: runs" test $rc -eq 0
  [ $rc -eq 0 ] || tail -5 "$SCRATCH/$name.out"
  same_losses "$ref" "$name" "$tol"
  check "$what: losses == single rank (rel $tol)" test $? -eq 0
}
for kv in 4 2 1; do run ref$kv 1 model.n_kv_head=$kv; done
run refg 1 model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true.
run refb 1 model.n_kv_head=2 train.precision=bf16
run refgb 1 model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true. train.precision=bf16
case_ "tp 2 (4 heads, 4 KV heads)" ref4 tp2 2 1e-5 model.n_kv_head=4 parallel.tp=2
case_ "tp 4 (GQA 4:2, KV heads replicated in pairs)" ref2 tp4 4 1e-5 model.n_kv_head=2 parallel.tp=4
case_ "tp 2 with n_kv_head 1 < tp (MQA)" ref1 tp2kv1 2 1e-5 model.n_kv_head=1 parallel.tp=2
case_ "gpt2 tp 2 (tied vocab-parallel head)" refg tp2g 2 1e-5 model.arch=gpt2 model.n_kv_head=4 \
  model.tie_embeddings=.true. parallel.tp=2
case_ "dp 2 x tp 2, zero 1" ref2 d2t2z1 4 1e-5 model.n_kv_head=2 parallel.tp=2 parallel.zero_stage=1
case_ "dp 2 x tp 2, zero 3" ref2 d2t2z3 4 1e-5 model.n_kv_head=2 parallel.tp=2 parallel.zero_stage=3
# 16-bit storage: each rank's partial sums of a row-parallel GEMM (and of the column-
# parallel GEMMs' input gradients) travel in the storage type, so they are rounded once
# more than the single rank rounds its full sum: bf16 layouts with tp agree to 2e-4
# (measured up to 1.0e-4 on tp 4), fp16's 3 more mantissa bits to 1e-4 (measured 2.8e-5)
B16=(model.n_kv_head=2 train.precision=bf16)
F16=(model.n_kv_head=2 train.precision=fp16)
run reff 1 "${F16[@]}"
case_ "bf16 tp 2" refb tp2b 2 2e-4 "${B16[@]}" parallel.tp=2
case_ "bf16 tp 4 (KV heads replicated)" refb tp4b 4 2e-4 "${B16[@]}" parallel.tp=4
case_ "bf16 dp 2 x tp 2, zero 3" refb d2t2z3b 4 2e-4 "${B16[@]}" parallel.tp=2 parallel.zero_stage=3
case_ "fp16 tp 2" reff tp2f 2 1e-4 "${F16[@]}" parallel.tp=2
case_ "fp16 tp 4 (KV heads replicated)" reff tp4f 4 1e-4 "${F16[@]}" parallel.tp=4
check "the tp run logs per-group traffic including tp" grep -q "comm per step .*tp " "$SCRATCH/d2t2z1.out"
# The fused LM head and loss in chunks of 24 of the 64 tokens (the last ragged): the
# vocab-parallel statistics reduced chunk by chunk, against the unfused head of one rank
GU=(model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true.)
run refg0 1 "${GU[@]}" train.xent_chunk_tokens=0
case_ "gpt2 tp 2, fused head in chunks of 24, against the unfused head" refg0 tp2gc 2 1e-5 \
  "${GU[@]}" parallel.tp=2 train.xent_chunk_tokens=24
case_ "gpt2 dp 2 x tp 2 zero 3, fused head in chunks of 24" refg0 d2t2z3gc 4 1e-5 "${GU[@]}" \
  parallel.tp=2 parallel.zero_stage=3 train.xent_chunk_tokens=24

SP=parallel.sequence_parallel=.true.
case_ "sequence parallel, tp 2" ref2 sp2 2 1e-5 model.n_kv_head=2 parallel.tp=2 $SP
case_ "sequence parallel, tp 4 (KV heads replicated)" ref2 sp4 4 1e-5 model.n_kv_head=2 parallel.tp=4 $SP
case_ "sequence parallel, gpt2 tp 2" refg sp2g 2 1e-5 model.arch=gpt2 model.n_kv_head=4 \
  model.tie_embeddings=.true. parallel.tp=2 $SP
case_ "sequence parallel, tp 2, recompute selective" ref2 sp2s 2 1e-5 model.n_kv_head=2 parallel.tp=2 \
  $SP train.recompute=selective
case_ "sequence parallel, dp 2 x tp 2, zero 3" ref2 sp2z3 4 1e-5 model.n_kv_head=2 parallel.tp=2 $SP \
  parallel.zero_stage=3
case_ "bf16 sequence parallel, tp 2" refb sp2b 2 2e-4 "${B16[@]}" parallel.tp=2 $SP
case_ "fp16 sequence parallel, tp 2, recompute selective" reff sp2f 2 1e-4 "${F16[@]}" \
  parallel.tp=2 $SP train.recompute=selective
case_ "gpt2 bf16 sequence parallel, tp 2" refgb sp2gb 2 2e-4 model.arch=gpt2 model.n_kv_head=4 \
  model.tie_embeddings=.true. parallel.tp=2 $SP train.precision=bf16
check "sequence parallel moves tp data by reduce-scatter and all-gather" \
  grep -q "comm per step .*tp [0-9.]* MB (all_reduce [0-9.]*, reduce_scatter [0-9.]*, all_gather" "$SCRATCH/sp2.out"
run tp2x 2 model.n_kv_head=2 parallel.tp=2 run.max_steps=1 # same shapes as sp2, without SP
act() { sed -n 's/.*; activations \([0-9.]*\) MB.*/\1/p' "$SCRATCH/$1.out"; }
a_tp=$(act tp2x) a_sp=$(act sp2)
echo "    activations per rank at tp 2: $a_tp MB without, $a_sp MB with sequence parallelism"
"$PYTHON_REF" -c "import sys; sys.exit(0 if $a_sp < $a_tp else 1)"
check "sequence parallelism lowers activation memory ($a_sp < $a_tp MB)" test $? -eq 0

# restart across tensor-parallel layouts
run half 2 model.n_kv_head=2 parallel.tp=2 run.max_steps=6
run half 2 model.n_kv_head=2 parallel.tp=1 run.max_steps=12 checkpoint.resume=auto
check "tp 1 x dp 2 resumed the tp 2 checkpoint of step 6" grep -q "resumed from .*step_00000006.h5 at step 6" "$SCRATCH/half.out"
same_losses ref2 half 1e-5
check "  ... and continues the single-rank losses" test $? -eq 0
run q 2 model.n_kv_head=2 parallel.tp=2 run.max_steps=6
run q 4 model.n_kv_head=2 parallel.tp=4 run.max_steps=12 checkpoint.resume=auto
check "tp 4 resumed the tp 2 checkpoint of step 6" grep -q "resumed from .*step_00000006.h5 at step 6" "$SCRATCH/q.out"
same_losses ref2 q 1e-5
check "  ... and continues the single-rank losses" test $? -eq 0
finish
