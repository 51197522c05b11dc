#!/usr/bin/env bash
# cp.sh — context parallelism (parallel.cp, docs/context_parallel.md): each sequence cut
# into 2 cp chunks, rank r holding chunks r and 2 cp - 1 - r, the attention across the
# split by the ring (parallel.cp_comm = 'p2p') or by all-to-alls over heads ('a2a').
# Layout equivalence against the single-rank run (same seed and data, 8 steps, fp32, every
# step's loss within 1e-6 and gradient norm within 1e-5 relative: agree_runs, lib.sh):
# cp 2 and cp 4 both ways; GQA with the a2a's KV heads replicated (2 KV heads on cp 4) and
# one KV head under tp 2 x cp 2; cp 2 x tp 2 with sequence parallelism; cp 2 x pp 2 under
# 1f1b and zb_v; dp 2 x cp 2 with ZeRO-3; gpt2 (learned positions, tied head); document
# masking (both ways, llama and gpt2: positions restart at each document, and each ring
# block takes its rows' starts); bf16 and fp16 within the 16-bit tolerances of
# tests/mpi/tp.sh (2e-4, 1e-4).  Restarts: a cp 2 run stopped at step 4 and resumed on cp 2
# gives bitwise the losses of the run that never stopped; a cp 4 checkpoint resumes on 1
# rank and a 1-rank one on cp 2 (as above).  A long sequence: the tiny model at seq_len
# 4096 on cp 4 against 1 rank, its activations at most 0.35 of the one rank's and its
# memory within 10% of the plan the run prints.  The cp group's traffic per step equals
# the formulas (ring: cp - 1 hops of K|V forward, and of K|V plus cp of the fp32 dK|dV
# backward; a2a: (cp - 1) blocks of each all-to-all).  Bad layouts: exit 2 with the keys
# named.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
bytes_corpus computers science
# shellcheck disable=SC2034 # C: the settings launch (tests/lib.sh) starts the trainer with
C=(model.vocab_size=256 model.n_layer=2 model.d_model=64 model.n_head=4 model.n_kv_head=4
  model.d_ff=160 model.seq_len=32 train.micro_batch=2 train.global_batch=8 run.max_steps=8
  run.log_every=100 run.eval_every=0 optim.lr=3e-3 optim.warmup_steps=3 optim.decay_steps=8
  model.init_std=0.05 "data.train=$SCRATCH/data/train_*.bin" checkpoint.resume=none
  checkpoint.every_steps=0)
run() { launch -n "$2" -t 180 -o "$1" "${@:3}"; } # run NAME NP overrides...
case_() { # case_ DESCRIPTION REF NAME NP TOL overrides...
  local what=$1 ref=$2 name=$3 np=$4 tol=$5
  shift 5
  run "$name" "$np" "$@"
  local rc=$?
  check "$what: runs" test $rc -eq 0
  [ $rc -eq 0 ] || tail -5 "$SCRATCH/$name.out"
  agree_runs "$SCRATCH/$ref" "$SCRATCH/$name" "$tol" 8
  check "$what: losses and gradient norms == single rank (rel $tol)" test $? -eq 0
}
A=parallel.cp_comm=a2a
run ref 1
run ref2 1 model.n_kv_head=2
run ref1 1 model.n_kv_head=1
G=(model.arch=gpt2 model.tie_embeddings=.true.)
run refg 1 "${G[@]}"
case_ "cp 2, ring" ref c2 2 1e-6 parallel.cp=2
case_ "cp 4, ring" ref c4 4 1e-6 parallel.cp=4
case_ "cp 2, all-to-all" ref c2a 2 1e-6 parallel.cp=2 $A
case_ "cp 4, all-to-all" ref c4a 4 1e-6 parallel.cp=4 $A
case_ "cp 4, all-to-all, 2 KV heads (each on two cp ranks)" ref2 c4a_kv2 4 1e-6 parallel.cp=4 \
  $A model.n_kv_head=2
case_ "cp 2 x tp 2, sequence parallel, ring" ref2 c2t2sp 4 1e-6 parallel.cp=2 parallel.tp=2 \
  parallel.sequence_parallel=.true. model.n_kv_head=2
case_ "cp 2 x tp 2, one KV head, ring" ref1 c2t2kv1 4 1e-6 parallel.cp=2 parallel.tp=2 \
  model.n_kv_head=1
case_ "cp 2 x tp 2, one KV head, all-to-all" ref1 c2t2kv1a 4 1e-6 parallel.cp=2 parallel.tp=2 \
  model.n_kv_head=1 $A
case_ "cp 2 x pp 2, 1f1b" ref c2p2 4 1e-6 parallel.cp=2 parallel.pp=2 parallel.schedule=1f1b
run ref4l 1 model.n_layer=4
case_ "cp 2 x pp 2, zb_v (two chunks a stage)" ref4l c2zbv 4 1e-6 parallel.cp=2 parallel.pp=2 \
  parallel.schedule=zb_v parallel.virtual_stages=2 model.n_layer=4
case_ "dp 2 x cp 2, ZeRO-3, ring" ref d2c2z3 4 1e-6 parallel.cp=2 parallel.zero_stage=3
case_ "dp 2 x cp 2, ZeRO-3, all-to-all" ref d2c2z3a 4 1e-6 parallel.cp=2 parallel.zero_stage=3 $A
case_ "gpt2 (tied), cp 2, ring" refg c2g 2 1e-6 parallel.cp=2 "${G[@]}"
case_ "gpt2 (tied), cp 4, all-to-all" refg c4ga 4 1e-6 parallel.cp=4 "${G[@]}" $A
run refb 1 train.precision=bf16
case_ "bf16, cp 2, ring" refb c2b 2 2e-4 parallel.cp=2 train.precision=bf16
case_ "bf16, cp 4, all-to-all" refb c4ba 4 2e-4 parallel.cp=4 train.precision=bf16 $A
run reff 1 train.precision=fp16
case_ "fp16, cp 2, ring" reff c2f 2 1e-4 parallel.cp=2 train.precision=fp16
check "the grid logs the cp axis and its groups" \
  grep -q "grid: world 4 = tp 1 x cp 2 x dp 2 x pp 1" "$SCRATCH/d2c2z3.out"
check "ZeRO shards over dp x cp" grep -q "dp 2 x cp 2 = 4 ranks hold each parameter" \
  "$SCRATCH/d2c2z3.out"

# document masking (one document per line, 64-byte sequences of about two documents)
"$top_srcdir/tools/tsr-prepare" --out "$SCRATCH/docs" --tokenizer bytes --split-by lines \
  /usr/share/games/fortunes/computers /usr/share/games/fortunes/science >/dev/null ||
  { bad "tsr-prepare --split-by lines"; finish; }
D=("data.train=$SCRATCH/docs/train_*.bin" data.document_mask=.true. model.seq_len=64)
run refd 1 "${D[@]}" model.n_kv_head=2
run refdg 1 "${D[@]}" "${G[@]}"
case_ "document masking, cp 2, all-to-all" refd c2da 2 1e-6 "${D[@]}" model.n_kv_head=2 \
  parallel.cp=2 $A
case_ "document masking, gpt2, cp 4, all-to-all" refdg c4dga 4 1e-6 "${D[@]}" "${G[@]}" \
  parallel.cp=4 $A
case_ "document masking, cp 2, ring" refd c2d 2 1e-6 "${D[@]}" model.n_kv_head=2 parallel.cp=2
case_ "document masking, cp 4, ring" refd c4d 4 1e-6 "${D[@]}" model.n_kv_head=2 parallel.cp=4
case_ "document masking, gpt2, cp 2, ring" refdg c2dg 2 1e-6 "${D[@]}" "${G[@]}" parallel.cp=2

# restarts
run whole 2 parallel.cp=2
run half 2 parallel.cp=2 run.max_steps=4
run half 2 parallel.cp=2 checkpoint.resume=auto
check "cp 2 resumed its checkpoint of step 4" grep -q "resumed from .*step_00000004.h5 at step 4" \
  "$SCRATCH/half.out"
agree_runs "$SCRATCH/whole" "$SCRATCH/half" 0 8
check "  ... and the losses and gradient norms are bitwise those of the run that never stopped" \
  test $? -eq 0
run c4to1 4 parallel.cp=4 $A run.max_steps=4
run c4to1 1 checkpoint.resume=auto
check "1 rank resumed the cp 4 checkpoint of step 4" \
  grep -q "resumed from .*step_00000004.h5 at step 4" "$SCRATCH/c4to1.out"
agree_runs "$SCRATCH/ref" "$SCRATCH/c4to1" 1e-6 8
check "  ... and continues the single-rank losses" test $? -eq 0
run r1toc2 1 run.max_steps=4
run r1toc2 2 parallel.cp=2 checkpoint.resume=auto
check "cp 2 resumed the 1-rank checkpoint of step 4" \
  grep -q "resumed from .*step_00000004.h5 at step 4" "$SCRATCH/r1toc2.out"
agree_runs "$SCRATCH/ref" "$SCRATCH/r1toc2" 1e-6 8
check "  ... and continues the single-rank losses" test $? -eq 0

# a long sequence: 4096 tokens on cp 4
L=(model.seq_len=4096 model.n_kv_head=2 train.micro_batch=1 train.global_batch=1 run.max_steps=2
  optim.warmup_steps=1 optim.decay_steps=2)
run long1 1 "${L[@]}"
run long4 4 "${L[@]}" parallel.cp=4
agree_runs "$SCRATCH/long1" "$SCRATCH/long4" 1e-6 2
check "seq_len 4096 on cp 4: losses and gradient norms == single rank (rel 1e-6, 1e-5)" test $? -eq 0
act() { sed -n 's/.*; activations \([0-9.]*\) MB.*/\1/p' "$SCRATCH/$1.out" | head -1; }
a1=$(act long1) a4=$(act long4)
echo "    activations per rank at seq_len 4096: $a1 MB on one rank, $a4 MB on cp 4"
"$PYTHON_REF" -c "import sys; sys.exit(0 if $a4 <= 0.35 * $a1 else 1)"
check "  ... activations per rank at cp 4 at most 0.35 of one rank's ($a4 <= 0.35 x $a1 MB)" \
  test $? -eq 0
planned=$(sed -n 's/^memory at step.*in use \([0-9.]*\) MB,.*planned for this build[^:]*: \([0-9.]*\) MB in use.*/\1 \2/p' \
  "$SCRATCH/long4.out" | head -1)
echo "    cp 4 memory in use and planned (MB): $planned"
"$PYTHON_REF" -c "import sys; m, p = map(float, '$planned'.split()); sys.exit(0 if abs(p - m) <= 0.1 * m else 1)"
check "  ... its memory in use within 10% of the plan" test $? -eq 0

# the cp group's bytes per step (send, fp32 K|V of B T / cp rows, KV hd each; 2 layers,
# 4 micro-batches a step): ring = (cp - 1) K|V forward + (cp - 1) K|V and cp dK|dV backward
traffic() { # traffic NAME KIND: the cp group's MB per step of that kind
  sed -n "s/.*; cp [0-9.]* MB ([^)]*$2 \([0-9.]*\).*/\1/p" "$SCRATCH/$1.out" | head -1
}
formula() { # formula CP MODE: MB per step by the formula
  "$PYTHON_REF" - "$@" <<'PY'
import sys
cp, mode = int(sys.argv[1]), sys.argv[2]
B, T, H, KV, hd, L, k, esz = 2, 32, 4, 4, 16, 2, 4, 4
N = B * T // cp
if mode == "p2p":
    kv = N * 2 * KV * hd * esz
    per = (cp - 1) * kv + (cp - 1) * kv + cp * kv
else:
    Hc, KVc = H // cp, (KV // cp if KV >= cp else 1)
    W, w = (Hc + 2 * KVc) * hd, Hc * hd
    per = (cp - 1) * N * esz * (3 * W + 3 * w)
print(f"{per * L * k / 1e6:.3f}")
PY
}
for c in "c2 2 p2p send" "c4 4 p2p send" "c2a 2 a2a all_to_all" "c4a 4 a2a all_to_all"; do
  set -- $c
  got=$(traffic "$1" "$4") want=$(formula "$2" "$3")
  check "cp $2 $3: the cp group moves $got MB a step, the formula's $want MB" test "$got" = "$want"
done

# bad layouts
badcase() { # badcase DESCRIPTION NP PATTERN overrides...
  local what=$1 np=$2 pat=$3
  shift 3
  launch -n "$np" -l bad "$@"
  check "$what: exit 2" test $? -eq 2
  check "  ... naming the keys" grep -q "$pat" "$SCRATCH/bad.out"
}
badcase "seq_len 32 on cp 3" 3 \
  "model.seq_len = 32.* is not divisible by 2 \* parallel.cp = 3.* = 6" parallel.cp=3
printf '&model\n  seq_len = 32\n/\n&parallel\n  cp = 3\n/\n' >"$SCRATCH/cp3.nml"
timeout 120 "$MPIRUN" -np 3 "$TESSERA" "$SCRATCH/cp3.nml" "data.train=$SCRATCH/data/train_*.bin" \
  >"$SCRATCH/deck.out" 2>&1
check "the same in a deck: exit 2" test $? -eq 2
check "  ... at the deck's file:line:col of cp, naming where seq_len was set" grep -q \
  "cp3.nml:5:3: model.seq_len = 32 (set at .*cp3.nml:2:3) is not divisible by 2 \* parallel.cp = 3 = 6" \
  "$SCRATCH/deck.out"
badcase "cp 2 on 3 ranks" 3 "world size 3 is not a multiple of parallel.tp = 1 \* parallel.cp = 2" \
  parallel.cp=2
badcase "a2a with 4 heads on cp 8" 8 \
  "parallel.cp_comm = 'a2a'.* needs parallel.cp = 8.* to divide the query heads of a tp rank" \
  parallel.cp=8 $A model.seq_len=64
finish
