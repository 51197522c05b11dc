#!/usr/bin/env bash
# uneven.sh — uneven pipeline splits (parallel.stage_layers) end to end, against the
# single-rank run of the same 7-layer llama (same seed and data, fp32, 12 steps, 8
# micro-batches per step, one thread per rank): every step's loss (and the validation
# loss) within 1e-5 relative.  Splits: pp 2 as 4+3 and 3+4, pp 3 as 3+2+2 (1F1B); pp 2
# interleaved with 2 virtual stages as 2,2,2,1, pp 3 as 1,1,1,1,1,2 (6 micro-batches,
# against a one-rank run of 6); pp 2 'auto'; zb_v (the V: two chunks per
# stage) on pp 2 as 2,2,2,1 and on pp 3 as 1,2,1,1,1,1 and 'auto'.  A checkpoint written at
# step 6 on pp 2 split 3+4 resumes on one rank (an even layout) and continues the
# single-rank losses to 1e-5, as does one written under zb_v on pp 3; one written on one
# rank resumes on pp 3 split 2,3,2.  Bad
# lists (wrong count, wrong sum, a zero) and a 7-layer model without a split on pp 2 exit
# 2 naming the key; the 'auto' split is logged.  tessera plan takes 126 layers on pp 16
# with 'auto' (7 + 14 x 8 + 7) and names the fullest stage; without a split it refuses.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers science
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=7 model.d_model=64 model.n_head=4 model.n_kv_head=2
  model.d_ff=160 model.seq_len=32 train.micro_batch=1 train.global_batch=8 run.max_steps=12
  run.log_every=6 run.eval_every=12 run.eval_steps=2 optim.lr=3e-3 optim.warmup_steps=3
  optim.decay_steps=12 "data.train=$SCRATCH/data/train_*.bin" "data.valid=$SCRATCH/data/valid_*.bin"
  checkpoint.resume=none checkpoint.every_steps=0)
run() { launch -n "$2" -t 180 -o "$1" "${@:3}"; } # run NAME NP overrides...
case_() { # case_ DESCRIPTION NAME NP overrides...  (against the one-rank run $REF)
  local what=$1 name=$2 np=$3; shift 3
  run "$name" "$np" "$@"
  local rc=$?
  check "$what: runs" test $rc -eq 0
  [ $rc -eq 0 ] || tail -5 "$SCRATCH/$name.out"
  same_losses "${REF:-ref}" "$name" 1e-5
  check "$what: losses (and val loss) == single rank (rel 1e-5)" test $? -eq 0
}
run ref 1
case_ "pp 2, 1F1B, split 4+3" p43 2 parallel.pp=2 parallel.stage_layers=4,3
case_ "pp 2, 1F1B, split 3+4" p34 2 parallel.pp=2 parallel.stage_layers=3,4
case_ "pp 3, 1F1B, split 3+2+2" p322 3 parallel.pp=3 parallel.stage_layers=3,2,2
case_ "pp 2, interleaved v 2, split 2,2,2,1" inter 2 parallel.pp=2 parallel.schedule=interleaved \
  parallel.virtual_stages=2 parallel.stage_layers=2,2,2,1
# interleaving on 3 stages needs the micro-batches (here 6) divisible by pp
run ref6 1 train.global_batch=6
REF=ref6 case_ "pp 3, interleaved v 2, split 1,1,1,1,1,2 (m 6)" inter3 3 parallel.pp=3 \
  parallel.schedule=interleaved parallel.virtual_stages=2 parallel.stage_layers=1,1,1,1,1,2 \
  train.global_batch=6
case_ "pp 2, 'auto'" auto2 2 parallel.pp=2 parallel.stage_layers=auto
check "the log names the layers of every stage (auto: 4+3)" \
  grep -q "stage 0 holds layers 0..3, stage 1 layers 4..6" "$SCRATCH/auto2.out"
# zb_v: the V puts chunks s and 2 pp - 1 - s on stage s (the first and the last on stage 0)
V=(parallel.schedule=zb_v parallel.virtual_stages=2)
case_ "pp 2, zb_v, split 2,2,2,1" zv2 2 parallel.pp=2 "${V[@]}" parallel.stage_layers=2,2,2,1
check "  ... stage 0 holds the V's ends (layers 0..1 and 6), stage 1 its bend (2..5)" \
  grep -q "stage 0 holds layers 0..1 6, stage 1 layers 2..3 4..5" "$SCRATCH/zv2.out"
case_ "pp 3, zb_v, split 1,2,1,1,1,1" zv3 3 parallel.pp=3 "${V[@]}" \
  parallel.stage_layers=1,2,1,1,1,1
case_ "pp 3, zb_v, 'auto'" zv3a 3 parallel.pp=3 "${V[@]}" parallel.stage_layers=auto

# restart across layouts: uneven -> even, even -> uneven
run half 2 parallel.pp=2 parallel.stage_layers=3,4 run.max_steps=6
run half 1 run.max_steps=12 checkpoint.resume=auto
check "one rank resumed the pp 2 (3+4) checkpoint of step 6" \
  grep -q "resumed from .*step_00000006.h5 at step 6" "$SCRATCH/half.out"
same_losses ref half 1e-5
check "  ... and continues the single-rank losses (rel 1e-5)" test $? -eq 0
run vhalf 3 parallel.pp=3 "${V[@]}" parallel.stage_layers=1,2,1,1,1,1 run.max_steps=6
run vhalf 1 run.max_steps=12 checkpoint.resume=auto
check "one rank resumed the pp 3 zb_v (1,2,1,1,1,1) checkpoint of step 6" \
  grep -q "resumed from .*step_00000006.h5 at step 6" "$SCRATCH/vhalf.out"
same_losses ref vhalf 1e-5
check "  ... and continues the single-rank losses (rel 1e-5)" test $? -eq 0
run back 1 run.max_steps=6
run back 3 parallel.pp=3 parallel.stage_layers=2,3,2 run.max_steps=12 checkpoint.resume=auto
check "pp 3 (2+3+2) resumed the one-rank checkpoint of step 6" \
  grep -q "resumed from .*step_00000006.h5 at step 6" "$SCRATCH/back.out"
same_losses ref back 1e-5
check "  ... and continues the single-rank losses (rel 1e-5)" test $? -eq 0

# bad input: exit 2 and the key named
bad_case() { # bad_case DESCRIPTION NP overrides...
  local what=$1 np=$2; shift 2
  run bad "$np" "$@"
  local rc=$?
  check "$what: exit 2 (got $rc)" test $rc -eq 2
  check "$what: names parallel.stage_layers at its place" \
    grep -q "^<command line>:arg[0-9]*:1: parallel.stage_layers = " "$SCRATCH/bad.out"
}
bad_case "3 counts on pp 2" 2 parallel.pp=2 parallel.stage_layers=3,2,2
bad_case "counts summing to 8" 2 parallel.pp=2 parallel.stage_layers=4,4
bad_case "a zero count" 3 parallel.pp=3 parallel.stage_layers=4,3,0
run bad 2 parallel.pp=2
rc=$?
check "7 layers on pp 2 without a split: exit 2 (got $rc), pointing at stage_layers" \
  test $rc -eq 2 -a -n "$(grep "parallel.pp = 2 does not divide model.n_layer = 7.*parallel.stage_layers" "$SCRATCH/bad.out")"
run bad 2 parallel.pp=2 parallel.schedule=zb_v parallel.stage_layers=2,2,2,1
rc=$?
check "zb_v without virtual_stages = 2: exit 2 (got $rc), naming the key" \
  test $rc -eq 2 -a -n "$(grep "parallel.schedule = 'zb_v' places two chunks on every stage" "$SCRATCH/bad.out")"
run bad 2 parallel.pp=2 "${V[@]}" parallel.stage_layers=2,2,2,1 train.recompute=full
rc=$?
check "zb_v with recompute 'full': exit 2 (got $rc)" \
  test $rc -eq 2 -a -n "$(grep "train.recompute = 'full'" "$SCRATCH/bad.out")"
# the planner: Llama 3 405B's depth (126 layers) on llm70b's widths over 16 stages
big=(--nodes 16 model.n_layer=126 parallel.pp=16 parallel.virtual_stages=1 parallel.schedule=1f1b)
"$TESSERA" plan "${top_srcdir:-.}/input/llm70b.nml" "${big[@]}" parallel.stage_layers=auto \
  >"$SCRATCH/plan.out" 2>&1
rc=$?
check "plan, 126 layers on pp 16 with 'auto': exit 0 (got $rc)" test $rc -eq 0
check "  ... 7 layers on the first and the last stage, 8 on the others" \
  grep -q "stage_layers 'auto': layers per chunk 7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7;" "$SCRATCH/plan.out"
check "  ... the fullest stage named (stage 1, 8 layers), and planned for memory" \
  grep -q "the fullest stage is 1 with 8 layers" "$SCRATCH/plan.out"
"$TESSERA" plan "${top_srcdir:-.}/input/llm70b.nml" "${big[@]}" >"$SCRATCH/plan.out" 2>&1
rc=$?
check "plan, 126 layers on pp 16 without a split: exit 2 (got $rc)" test $rc -eq 2
"$TESSERA" plan "${top_srcdir:-.}/input/llm70b.nml" "${big[@]}" parallel.stage_layers=auto \
  parallel.schedule=zb_v parallel.virtual_stages=2 train.recompute=none >"$SCRATCH/plan.out" 2>&1
rc=$?
check "plan, 126 layers on pp 16 under zb_v with 'auto': exit 0 (got $rc), V placement named" \
  test $rc -eq 0 -a -n "$(grep "zb_v: chunks s and 2 pp - 1 - s on stage s" "$SCRATCH/plan.out")"
finish
