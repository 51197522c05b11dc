#!/usr/bin/env bash
# pp.sh — pipeline parallelism end to end, against the single-rank run (same seed and
# data, 12 steps, fp32, 8 micro-batches per step; every step's loss within 1e-5
# relative — pipelining alone changes no summation order, so pp runs come out bitwise
# equal, and with tp or dp the difference is the all-reduce order, ~1e-7):
# pp 2 and 4 (1F1B), pp 2 GPipe, pp 2 interleaved (v = 2), pp 2 with recompute 'full',
# tp 2 x pp 2, dp 2 x pp 2 (zero 1), dp 2 x tp 2 x pp 2 (zero 3, 8 ranks), gpt2 on pp 2.
# Also: activation memory of 1F1B vs GPipe on stage 0 at m = 8 (slots kept, as logged);
# the bubble line; validation through the pipeline; restart from pp 2 on pp 1 x dp 2;
# tied embeddings across stages (the last stage's copy of embed.weight, its gradient
# summed with the first stage's): gpt2 tied on pp 2, pp 4 and dp 2 x tp 2 x pp 2 zero 3,
# and the copies stay equal (the checkpoint of each run resumes on one rank).  In bf16 and
# fp16 (against the single rank of the same precision): 1F1B, interleaved, GPipe with full
# recompute (1e-5), dp 2 x pp 2 with zero 1 and 3 (1e-4).  The zero-bubble zb_h1 (the
# backward split into B and W): pp 2 and 4, tp 2 x pp 2, dp 2 x pp 2 with zero 1 and 3, gpt2
# tied, bf16 and fp16, all against the single rank; bitwise resume under zb_h1; checkpoints
# crossing between zb_h1 and 1F1B.  The V-shaped zb_v (two chunks per stage, stage 0 holding
# the embedding and the head): pp 2, pp 4 (8 layers, m 8 and m 4 < 2 pp - 1), tp 2 x pp 2,
# dp 2 x pp 2 with zero 1 and 3, gpt2 tied (one embed.weight for both uses), bf16 and fp16;
# bitwise resume under zb_v; checkpoints crossing between zb_v and 1F1B.  The LM head fused
# with the loss in chunks (gpt2 tied and tp 2 x pp 2 under zb_h1, zb_v, interleaved) against
# the unfused head of one rank.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers science
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=4 model.d_model=64 model.n_head=4 model.n_kv_head=2
  model.d_ff=160 model.seq_len=32 train.micro_batch=1 train.global_batch=8 run.max_steps=12
  run.log_every=6 run.eval_every=12 run.eval_steps=2 optim.lr=3e-3 optim.warmup_steps=3
  optim.decay_steps=12 "data.train=$SCRATCH/data/train_*.bin" "data.valid=$SCRATCH/data/valid_*.bin"
  checkpoint.resume=none checkpoint.every_steps=0)
run() { launch -n "$2" -t 180 -o "$1" "${@:3}"; } # run NAME NP overrides...
case_() { # case_ DESCRIPTION REF NAME NP overrides...
  local what=$1 ref=$2 name=$3 np=$4; shift 4
  run "$name" "$np" "$@"
  local rc=$?
  check "$what: runs" test $rc -eq 0
  [ $rc -eq 0 ] || tail -5 "$SCRATCH/$name.out"
  same_losses "$ref" "$name" "${TOL:-1e-5}"
  check "$what: losses (and val loss) == single rank (rel ${TOL:-1e-5})" test $? -eq 0
}
run ref 1
run refg 1 model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.false.
run reft 1 model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true.
case_ "pp 2, 1F1B" ref pp2 2 parallel.pp=2
case_ "pp 4, 1F1B" ref pp4 4 parallel.pp=4
case_ "pp 2, GPipe" ref gpipe 2 parallel.pp=2 parallel.schedule=gpipe
case_ "pp 2, interleaved, 2 virtual stages" ref inter 2 parallel.pp=2 parallel.schedule=interleaved \
  parallel.virtual_stages=2
case_ "pp 2, recompute full" ref full 2 parallel.pp=2 train.recompute=full
case_ "tp 2 x pp 2" ref t2p2 4 parallel.tp=2 parallel.pp=2
case_ "dp 2 x pp 2, zero 1" ref d2p2 4 parallel.pp=2 parallel.zero_stage=1
case_ "dp 2 x tp 2 x pp 2, zero 3 (8 ranks)" ref d2t2p2 8 parallel.pp=2 parallel.tp=2 \
  parallel.zero_stage=3
case_ "gpt2 untied (biases, learned positions) on pp 2" refg g2 2 model.arch=gpt2 \
  model.n_kv_head=4 model.tie_embeddings=.false. parallel.pp=2
# zero bubble (ZB-H1): the backward split into B and W, W delayed into the cool-down
case_ "pp 2, zb_h1" ref zb2 2 parallel.pp=2 parallel.schedule=zb_h1
case_ "pp 4, zb_h1" ref zb4 4 parallel.pp=4 parallel.schedule=zb_h1
case_ "tp 2 x pp 2, zb_h1" ref zbt2 4 parallel.tp=2 parallel.pp=2 parallel.schedule=zb_h1
case_ "dp 2 x pp 2, zero 1, zb_h1" ref zbd1 4 parallel.pp=2 parallel.zero_stage=1 \
  parallel.schedule=zb_h1
case_ "dp 2 x pp 2, zero 3, zb_h1" ref zbd3 4 parallel.pp=2 parallel.zero_stage=3 \
  parallel.schedule=zb_h1
case_ "gpt2 tied on pp 2, zb_h1" reft zbg 2 model.arch=gpt2 model.n_kv_head=4 \
  model.tie_embeddings=.true. parallel.pp=2 parallel.schedule=zb_h1
# the LM head fused with the loss in chunks of 12 of the 32 tokens (the last ragged),
# against the unfused head of one rank: its W pass computes the logits again (under tp
# with the vocab-parallel statistics reduced again)
run ref0 1 train.xent_chunk_tokens=0
run reft0 1 model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true. train.xent_chunk_tokens=0
case_ "gpt2 tied on pp 2, zb_h1, fused head in chunks of 12" reft0 zbgc 2 model.arch=gpt2 \
  model.n_kv_head=4 model.tie_embeddings=.true. parallel.pp=2 parallel.schedule=zb_h1 \
  train.xent_chunk_tokens=12
case_ "tp 2 x pp 2, zb_h1, fused head in chunks of 12" ref0 zbt2c 4 parallel.tp=2 parallel.pp=2 \
  parallel.schedule=zb_h1 train.xent_chunk_tokens=12
case_ "pp 2, interleaved, fused head in chunks of 12" ref0 interc 2 parallel.pp=2 \
  parallel.schedule=interleaved parallel.virtual_stages=2 train.xent_chunk_tokens=12

# 16-bit storage: the stages send the stored values themselves, so pipelining alone
# changes no rounding (1e-5: bitwise equal to the single rank of the same precision); dp
# changes the order of the fp32 gradient sums, which moves a stored 16-bit value now and
# then (1e-4, as in tests/mpi/zero.sh).  Layouts with tp are tests/mpi/tp.sh's: on this deck a
# rarely seen token's embedding is nearly all Adam noise, and bf16 tp's rounding moves one
# step's loss by 3e-3 (the next step agrees to 1e-4 again).
run refb 1 train.precision=bf16
run reff 1 train.precision=fp16
case_ "bf16 pp 2, 1F1B" refb pp2b 2 parallel.pp=2 train.precision=bf16
case_ "bf16 pp 2, interleaved" refb interb 2 parallel.pp=2 parallel.schedule=interleaved \
  parallel.virtual_stages=2 train.precision=bf16
case_ "fp16 pp 2, GPipe, recompute full" reff gpipef 2 parallel.pp=2 parallel.schedule=gpipe \
  train.recompute=full train.precision=fp16
TOL=1e-4 case_ "fp16 dp 2 x pp 2, zero 1" reff d2p2f 4 parallel.pp=2 parallel.zero_stage=1 \
  train.precision=fp16
TOL=1e-4 case_ "bf16 dp 2 x pp 2, zero 3" refb d2p2b 4 parallel.pp=2 parallel.zero_stage=3 \
  train.precision=bf16
case_ "bf16 pp 2, zb_h1" refb zbb 2 parallel.pp=2 parallel.schedule=zb_h1 train.precision=bf16
case_ "fp16 pp 2, zb_h1" reff zbf 2 parallel.pp=2 parallel.schedule=zb_h1 train.precision=fp16
# zero bubble V (ZB-V): chunks s and 2 pp - 1 - s on stage s, the backward split into B and W
V=(parallel.schedule=zb_v parallel.virtual_stages=2)
case_ "pp 2, zb_v" ref zv2 2 parallel.pp=2 "${V[@]}"
case_ "tp 2 x pp 2, zb_v" ref zvt2 4 parallel.tp=2 parallel.pp=2 "${V[@]}"
case_ "dp 2 x pp 2, zero 1, zb_v" ref zvd1 4 parallel.pp=2 parallel.zero_stage=1 "${V[@]}"
case_ "dp 2 x pp 2, zero 3, zb_v" ref zvd3 4 parallel.pp=2 parallel.zero_stage=3 "${V[@]}"
case_ "gpt2 tied on pp 2, zb_v (embedding and head both on stage 0)" reft zvg 2 \
  model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true. parallel.pp=2 "${V[@]}"
case_ "gpt2 tied, dp 2 x pp 2, zero 3, zb_v" reft zvg3 4 model.arch=gpt2 model.n_kv_head=4 \
  model.tie_embeddings=.true. parallel.pp=2 parallel.zero_stage=3 "${V[@]}"
case_ "gpt2 tied, dp 2 x pp 2, zero 3, zb_v, fused head in chunks of 12" reft0 zvg3c 4 \
  model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true. parallel.pp=2 \
  parallel.zero_stage=3 "${V[@]}" train.xent_chunk_tokens=12
case_ "bf16 pp 2, zb_v" refb zvb 2 parallel.pp=2 "${V[@]}" train.precision=bf16
case_ "fp16 pp 2, zb_v" reff zvf 2 parallel.pp=2 "${V[@]}" train.precision=fp16
run ref8 1 model.n_layer=8
case_ "pp 4, zb_v (8 layers)" ref8 zv4 4 model.n_layer=8 parallel.pp=4 "${V[@]}"
run ref8m4 1 model.n_layer=8 train.global_batch=4
case_ "pp 4, zb_v, m 4 < 2 pp - 1" ref8m4 zv4m4 4 model.n_layer=8 train.global_batch=4 \
  parallel.pp=4 "${V[@]}"

slots() { sed -n 's/.*stage 0 keeps \([0-9]*\) activation slot(s): \([0-9.]*\) MB.*/\1 \2/p' "$SCRATCH/$1.out"; }
read -r s1 mb1 <<<"$(slots pp2)"
read -r sg mbg <<<"$(slots gpipe)"
echo "    stage 0 at m = 8, pp 2: 1F1B keeps $s1 activation slots ($mb1 MB), GPipe $sg ($mbg MB)"
check "1F1B keeps pp - stage = 2 micro-batches in flight on stage 0, GPipe all 8" \
  test "$s1" = 2 -a "$sg" = 8
"$PYTHON_REF" -c "import sys; sys.exit(0 if $mb1 < $mbg / 2 else 1)"
check "1F1B's stage-0 activation memory is well below GPipe's ($mb1 vs $mbg MB)" test $? -eq 0
check "the bubble is logged next to the theory" \
  grep -q "pipeline bubble (measured idle / step time, stages 0..3):.*theory 1f1b 0.273 (p 4, m 8, v 1)" "$SCRATCH/pp4.out"
check "interleaved theory is (p-1)/(v m + p - 1)" grep -q "theory interleaved 0.059 (p 2, m 8, v 2)" "$SCRATCH/inter.out"

run half 2 parallel.pp=2 run.max_steps=6
run half 2 parallel.pp=1 run.max_steps=12 checkpoint.resume=auto
check "pp 1 x dp 2 resumed the pp 2 checkpoint of step 6" grep -q "resumed from .*step_00000006.h5 at step 6" "$SCRATCH/half.out"
same_losses ref half 1e-5
check "  ... and continues the single-rank losses" test $? -eq 0

# zb_h1: a resume under zb_h1 repeats the uninterrupted zb_h1 run bitwise; a zb_h1
# checkpoint resumes under 1F1B and a 1F1B one under zb_h1
bitwise() { "$PYTHON_REF" -c '
import json, sys
l = lambda p: {d["step"]: d["loss"] for d in map(json.loads, open(p)) if "loss" in d}
a, b = l(sys.argv[1]), l(sys.argv[2])
s = [k for k in b if k > 6]
sys.exit(0 if len(s) == 6 and all(a[k] == b[k] for k in s) else 1)' "$SCRATCH/$1/metrics.jsonl" "$SCRATCH/$2/metrics.jsonl"; }
run zbr 2 parallel.pp=2 parallel.schedule=zb_h1 run.max_steps=6
run zbr 2 parallel.pp=2 parallel.schedule=zb_h1 run.max_steps=12 checkpoint.resume=auto
check "zb_h1 resumed at step 6" grep -q 'resumed from .*step_00000006.h5 at step 6' "$SCRATCH/zbr.out"
check "  ... repeats the uninterrupted zb_h1 run's steps 7-12 bitwise" bitwise zb2 zbr
run zbto1 2 parallel.pp=2 parallel.schedule=zb_h1 run.max_steps=6
run zbto1 2 parallel.pp=2 parallel.schedule=1f1b run.max_steps=12 checkpoint.resume=auto
same_losses ref zbto1 1e-5
check "a zb_h1 checkpoint resumes under 1F1B and continues the single-rank losses" test $? -eq 0
run oneto 2 parallel.pp=2 run.max_steps=6
run oneto 2 parallel.pp=2 parallel.schedule=zb_h1 run.max_steps=12 checkpoint.resume=auto
same_losses ref oneto 1e-5
check "a 1F1B checkpoint resumes under zb_h1 and continues the single-rank losses" test $? -eq 0
check "zb_h1 keeps min(m, pp) = 2 activation slots on stage 0 and logs its theory" \
  sh -c "grep -q 'stage 0 keeps 2 activation slot' '$SCRATCH/zb2.out' && grep -q 'theory zb_h1 0.040 (p 2, m 8, v 1)' '$SCRATCH/zb2.out'"
# the same for zb_v
run zvr 2 parallel.pp=2 "${V[@]}" run.max_steps=6
run zvr 2 parallel.pp=2 "${V[@]}" run.max_steps=12 checkpoint.resume=auto
check "zb_v resumed at step 6" grep -q 'resumed from .*step_00000006.h5 at step 6' "$SCRATCH/zvr.out"
check "  ... repeats the uninterrupted zb_v run's steps 7-12 bitwise" bitwise zv2 zvr
run zvto1 2 parallel.pp=2 "${V[@]}" run.max_steps=6
run zvto1 2 parallel.pp=2 parallel.schedule=1f1b run.max_steps=12 checkpoint.resume=auto
same_losses ref zvto1 1e-5
check "a zb_v checkpoint resumes under 1F1B and continues the single-rank losses" test $? -eq 0
run onetov 2 parallel.pp=2 run.max_steps=6
run onetov 2 parallel.pp=2 "${V[@]}" run.max_steps=12 checkpoint.resume=auto
same_losses ref onetov 1e-5
check "a 1F1B checkpoint resumes under zb_v and continues the single-rank losses" test $? -eq 0
check "zb_v logs its V split and its theory" \
  sh -c "grep -q 'stage 0 holds layers 0 3, stage 1 layers 1 2' '$SCRATCH/zv2.out' && grep -q 'theory zb_v 0.020 (p 2, m 8, v 2)' '$SCRATCH/zv2.out'"

T=(model.arch=gpt2 model.n_kv_head=4 model.tie_embeddings=.true.)
case_ "gpt2 tied embeddings on pp 2" reft tied2 2 "${T[@]}" parallel.pp=2
case_ "gpt2 tied embeddings on pp 4" reft tied4 4 "${T[@]}" parallel.pp=4
case_ "gpt2 tied, dp 2 x tp 2 x pp 2, zero 3" reft tied8 8 "${T[@]}" parallel.pp=2 parallel.tp=2 \
  parallel.zero_stage=3
# both copies must hold the same values: a checkpoint of step 12 holds only the first
# stage's; resuming it on one rank for one more step must give the loss the pp run's
# own copy gives (evaluated in the same resumed run on pp 2)
run tied2 1 "${T[@]}" run.max_steps=13 checkpoint.resume=auto
run tied2b 2 "${T[@]}" parallel.pp=2 run.max_steps=13 checkpoint.resume=none
check "a tied pp 2 checkpoint resumes on one rank" grep -q "resumed from .*step_00000012.h5 at step 12" "$SCRATCH/tied2.out"
same_losses tied2b tied2 1e-5
check "  ... and step 13 matches a pp 2 run straight through (the copies agree)" test $? -eq 0
finish
